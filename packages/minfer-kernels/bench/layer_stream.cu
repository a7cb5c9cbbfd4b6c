// The premise of a persistent decode step, measured alone (issue 17; docs/PERFORMANCE.md, session 14's Next):
// can one launch stream a whole decode step's weights, phase after phase (a phase = one of today's kernels: qkv,
// attention, attn_output, gate|up, ffn_down, ..., the head), near the copy engine's bandwidth when every phase
// must wait for the previous one to finish everywhere (a grid barrier), as the math requires?
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/layer_stream packages/minfer-kernels/bench/layer_stream.cu
//   /tmp/layer_stream            # one table per shape: µs a step and TB/s for each way of streaming it
//
// Nothing here computes: each way reads every byte of the step once (summing words into a sink so that nothing
// is optimised away), so the table is the floor each structure puts under a decode step.
//   kernels        one launch per phase, captured in a CUDA graph (today's structure without PDL)
//   kernels+pdl    the same with programmatic dependent launch: a phase's bytes prefetched into L2 before it
//                  waits for the previous kernel (today's structure)
//   stream         one persistent launch (a block an SM: a producer warp issuing cp.async.bulk copies into a
//                  ring of shared-memory stages, consumer warps reading them), no barrier between phases:
//                  the ceiling
//   stream+sync    the same with a grid barrier after each phase that holds every warp, the producer too: the
//                  next phase's copies start only when the whole grid is done with this one
//   stream+ahead   a grid barrier after each phase for the consumers only; the producer keeps copying the next
//                  phases' bytes into free stages meanwhile (what a persistent decode kernel would do)
//   gemv chain     kernels+pdl, each phase a GEMV's dependent chain after the wait: read the previous phase's
//                  output as x (the whole vector), its sum of squares (a norm), each row's dot with x, a warp
//                  sum, one float stored per row, which the next phase reads: today's decode kernels' shape
//                  with nothing else (no formats, no epilogues), so the table shows what the chain itself costs
// If stream+ahead comes near stream, a persistent step costs about its bytes' time plus the barriers, not
// today's per-launch gaps. If the gemv chain is far above kernels+pdl, the dependent chain inside a kernel,
// not the launch boundary, is what a faster decode step has to shorten.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../csrc/kernels/bulk_copy.cuh"
#include "../csrc/kernels/common.cuh"
#include "check.cuh"

namespace {

using minfer::arrive, minfer::copy_async, minfer::expect_bytes, minfer::init_arrival, minfer::wait_arrival;

constexpr int CONSUMERS = 8;
constexpr int WARPS = CONSUMERS + 1;  // the producer is warp CONSUMERS
constexpr int STAGES = 8;
constexpr int STAGE_BYTES = 16 * 1024;
constexpr int REPETITIONS = 20;

// ---- The phases of one decode step: where each phase's bytes start, and how a block's share is cut --------

struct Phase {
    std::size_t offset, bytes;  // both multiples of 16
};

struct Step {
    const std::uint8_t* weights;
    const Phase* phases;
    int n_phases;
};

// Block b's chunks of a phase: the phase cut into pieces of at most STAGE_BYTES (multiples of 16), as many as
// keep every block busy; block b takes pieces b, b + gridDim.x, ...
__host__ __device__ std::size_t chunk_bytes(std::size_t phase_bytes, int blocks) {
    std::size_t chunk = (phase_bytes + blocks - 1) / blocks;
    chunk = (chunk + 15) / 16 * 16;
    return chunk < STAGE_BYTES ? (chunk < 16 ? 16 : chunk) : STAGE_BYTES;
}

// ---- Grid-wide synchronisation -------------------------------------------------------------------------

// The consumer warps' barrier (named barrier 1): the producer goes its own way.
__device__ __forceinline__ void sync_consumers() {
    asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
}

// A grid barrier among the blocks' consumer warps: thread 0 of each block counts its block in, then waits for
// every block of this phase. `arrived` only grows (a phase's target is (phase + 1) * gridDim.x).
__device__ void grid_barrier(unsigned* arrived, int phase) {
    sync_consumers();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1u);
        const unsigned target = (phase + 1) * gridDim.x;
        unsigned seen = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
        } while (seen < target);
    }
    sync_consumers();
}

enum class Barriers { NONE, ALL, CONSUMERS_ONLY };

// The persistent launch. Block: CONSUMERS warps and the producer warp; blockIdx.x: which chunks of each phase
// (b, b + gridDim.x, ...). Grid: one block an SM, all resident (a cooperative launch).
template <Barriers BARRIERS>
__global__ void __launch_bounds__(WARPS * 32, 1) stream_step(Step step, unsigned* arrived, unsigned* sink) {
    extern __shared__ __align__(128) std::uint8_t stages[];
    __shared__ std::uint64_t full[STAGES], empty[STAGES];
    __shared__ volatile int phases_done;  // ALL: the producer waits for the grid to finish a phase
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            init_arrival(&full[s], 1);
            init_arrival(&empty[s], CONSUMERS);
        }
        phases_done = 0;
    }
    __syncthreads();

    if (warp == CONSUMERS) {
        if (lane != 0) return;
        int item = 0;
        for (int p = 0; p < step.n_phases; ++p) {
            if (BARRIERS == Barriers::ALL) {
                while (phases_done < p) {
                }
            }
            const Phase phase = step.phases[p];
            const std::size_t chunk = chunk_bytes(phase.bytes, gridDim.x);
            for (std::size_t begin = blockIdx.x * chunk; begin < phase.bytes; begin += gridDim.x * chunk, ++item) {
                const int stage = item % STAGES;
                if (item >= STAGES) wait_arrival(&empty[stage], (item / STAGES - 1) % 2);
                const unsigned bytes = unsigned(phase.bytes - begin < chunk ? phase.bytes - begin : chunk);
                expect_bytes(&full[stage], bytes);
                copy_async(stages + stage * STAGE_BYTES, step.weights + phase.offset + begin, bytes, &full[stage]);
            }
        }
        return;
    }

    unsigned sum = 0;
    int item = 0;
    for (int p = 0; p < step.n_phases; ++p) {
        const Phase phase = step.phases[p];
        const std::size_t chunk = chunk_bytes(phase.bytes, gridDim.x);
        for (std::size_t begin = blockIdx.x * chunk; begin < phase.bytes; begin += gridDim.x * chunk, ++item) {
            const int stage = item % STAGES;
            wait_arrival(&full[stage], (item / STAGES) % 2);
            const unsigned bytes = unsigned(phase.bytes - begin < chunk ? phase.bytes - begin : chunk);
            const uint4* words = reinterpret_cast<const uint4*>(stages + stage * STAGE_BYTES);
            for (unsigned i = warp * 32 + lane; i < bytes / 16; i += CONSUMERS * 32) {
                const uint4 w = words[i];
                sum += w.x ^ w.y ^ w.z ^ w.w;
            }
            __syncwarp();
            if (lane == 0) arrive(&empty[stage]);
        }
        if (BARRIERS != Barriers::NONE) {
            grid_barrier(arrived, p);
            if (BARRIERS == Barriers::ALL && threadIdx.x == 0) phases_done = p + 1;
        }
    }
    if (sum == 0x12345678u) *sink = sum;  // never true in practice; keeps the reads
}

// One phase as its own kernel: blockIdx.x strides over the phase's 16-byte words. With PDL, the block first
// prefetches its words into L2, then waits for the previous kernel, then reads them (today's decode kernels).
template <bool PDL>
__global__ void stream_phase(const uint4* words, std::size_t n_words, unsigned* sink) {
    const std::size_t first = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
    if (PDL) {
        for (std::size_t i = first * 8; i < n_words; i += stride * 8)  // one 128-byte line per 8 words
            asm volatile("prefetch.global.L2 [%0];" ::"l"(words + i));
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;");
    }
    unsigned sum = 0;
    for (std::size_t i = first; i < n_words; i += stride) {
        const uint4 w = __ldcs(words + i);
        sum += w.x ^ w.y ^ w.z ^ w.w;
    }
    if (sum == 0x12345678u) *sink = sum;
}

// One phase as a GEMV: rows of row_words 16-byte words (a row's `in` values, the first `in` of the previous
// phase's output), y[row] = (sum of the row's words as floats times x) / rms(x). Block: 256 threads, a warp a row
// at a time; blockIdx.x strides over the rows (row = blockIdx.x * 8 + warp, then + gridDim.x * 8). The weights
// are prefetched into L2 before the wait, as today's gemv does; x, its norm, the dots and the stores follow it.
__global__ void gemv_phase(const uint4* words, int rows, int row_words, const float* x, int in, float* y) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int first_row = blockIdx.x * 8 + warp, row_stride = gridDim.x * 8;
    for (int row = first_row; row < rows; row += row_stride)
        for (int i = lane * 8; i < row_words; i += 32 * 8)  // one 128-byte line per 8 words
            asm volatile("prefetch.global.L2 [%0];" ::"l"(words + std::size_t(row) * row_words + i));
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    float squares = 0.0f;
    for (int i = lane; i < in; i += 32) squares += x[i] * x[i];
    const float inv_rms = rsqrtf(minfer::warp_sum(squares) / float(in) + 1e-6f);
    for (int row = first_row; row < rows; row += row_stride) {
        float dot = 0.0f;
        for (int i = lane; i < row_words; i += 32) {
            const uint4 w = words[std::size_t(row) * row_words + i];
            const float xi = x[(4 * i) % in];
            dot += (__uint_as_float(w.x & 0x3F7FFFFFu) + __uint_as_float(w.y & 0x3F7FFFFFu) +
                    __uint_as_float(w.z & 0x3F7FFFFFu) + __uint_as_float(w.w & 0x3F7FFFFFu)) * xi;
        }
        dot = minfer::warp_sum(dot);
        if (lane == 0) y[row] = dot * inv_rms;
    }
}

// ---- Host ----------------------------------------------------------------------------------------------------

// A phase as the gemv chain runs it: its rows and their length in values (Q4_0).
struct Gemv {
    int rows, in;
};

struct Shape {
    const char* name;
    std::vector<std::size_t> layer_phases;  // bytes of each phase of a layer, in order
    int layers;
    std::size_t head;
    std::vector<Gemv> layer_gemvs;  // the same phases as products (attention: a small one), and the head's
    Gemv head_gemv;
};

std::size_t q4_0_bytes(std::size_t rows, std::size_t columns) { return rows * (columns / 32) * 18; }

std::vector<Phase> phases_of(const Shape& shape) {
    std::vector<Phase> phases;
    std::size_t offset = 0;
    const auto add = [&](std::size_t bytes) {
        bytes = (bytes + 15) / 16 * 16;
        phases.push_back({offset, bytes});
        offset += bytes;
    };
    for (int l = 0; l < shape.layers; ++l)
        for (std::size_t bytes : shape.layer_phases) add(bytes);
    add(shape.head);
    return phases;
}

template <class Launch>
float time_us(Launch launch, cudaStream_t stream) {
    launch();
    CHECK(cudaStreamSynchronize(stream));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < REPETITIONS; ++r) launch();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1000.0f / REPETITIONS;
}

// A launch of 256-thread blocks on `stream`; with `pdl`, allowed to start before the previous kernel ends (its
// attribute kept in `attribute`, which must outlive the launch call).
cudaLaunchConfig_t launch_config(unsigned blocks, bool pdl, cudaStream_t stream, cudaLaunchAttribute& attribute) {
    cudaLaunchConfig_t config = {};
    config.gridDim = blocks;
    config.blockDim = 256;
    config.stream = stream;
    attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = pdl ? 1 : 0;
    return config;
}

// µs a replay of the CUDA graph of what `enqueue` launches on `stream`.
template <class Enqueue>
float time_graph(Enqueue enqueue, cudaStream_t stream) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    enqueue();
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const float us = time_us([&] { CHECK(cudaGraphLaunch(exec, stream)); }, stream);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    return us;
}

void measure(const Shape& shape, int sms, cudaStream_t stream) {
    const std::vector<Phase> phases = phases_of(shape);
    const std::size_t total = phases.back().offset + phases.back().bytes;
    std::uint8_t* weights = nullptr;
    Phase* device_phases = nullptr;
    unsigned *arrived = nullptr, *sink = nullptr;
    CHECK(cudaMalloc(&weights, total));
    CHECK(cudaMemset(weights, 1, total));
    CHECK(cudaMalloc(&device_phases, phases.size() * sizeof(Phase)));
    CHECK(cudaMemcpy(device_phases, phases.data(), phases.size() * sizeof(Phase), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
    CHECK(cudaMalloc(&sink, sizeof(unsigned)));
    std::uint8_t* copy = nullptr;
    CHECK(cudaMalloc(&copy, total));

    std::printf("\n%s: %d phases, %.1f MB a step, %d SMs\n\n", shape.name, int(phases.size()), total / 1e6, sms);
    std::printf("| way | µs a step | TB/s |\n| --- | ---: | ---: |\n");
    const auto report = [&](const char* way, float us) {
        std::printf("| %s | %.1f | %.2f |\n", way, us, total / us / 1e6);
    };

    report("cudaMemcpy device to device (bytes read)", time_us([&] {
               CHECK(cudaMemcpyAsync(copy, weights, total, cudaMemcpyDeviceToDevice, stream));
           }, stream));

    for (const bool pdl : {false, true}) {
        const float us = time_graph([&] {
            for (const Phase& phase : phases) {
                const std::size_t n_words = phase.bytes / 16;
                const unsigned blocks = unsigned(std::min<std::size_t>((n_words + 255) / 256, std::size_t(sms) * 8));
                cudaLaunchAttribute attribute;
                const cudaLaunchConfig_t config = launch_config(blocks, pdl, stream, attribute);
                const uint4* words = reinterpret_cast<const uint4*>(weights + phase.offset);
                if (pdl) {
                    CHECK(cudaLaunchKernelEx(&config, stream_phase<true>, words, n_words, sink));
                } else {
                    CHECK(cudaLaunchKernelEx(&config, stream_phase<false>, words, n_words, sink));
                }
            }
        }, stream);
        report(pdl ? "kernels+pdl (a launch a phase, graph)" : "kernels (a launch a phase, graph)", us);
    }

    const Step step{weights, device_phases, int(phases.size())};
    const int smem_bytes = STAGES * STAGE_BYTES;
    const auto persistent = [&](const char* way, auto kernel) {
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
        report(way, time_us([&] {
                   CHECK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), stream));
                   void* args[] = {const_cast<Step*>(&step), &arrived, &sink};
                   CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), sms, WARPS * 32, args,
                                                     smem_bytes, stream));
               }, stream));
    };
    persistent("stream (one launch, no barriers)", stream_step<Barriers::NONE>);
    persistent("stream+sync (a grid barrier a phase, producer held)", stream_step<Barriers::ALL>);
    persistent("stream+ahead (a grid barrier a phase, producer ahead)", stream_step<Barriers::CONSUMERS_ONLY>);

    // The gemv chain: a launch a phase with PDL, x and y alternating between two vectors (phase p reads the first
    // `in` floats of phase p - 1's output), each phase's weights Q4_0-sized rows of whole 16-byte words.
    std::vector<Gemv> gemvs;
    for (int l = 0; l < shape.layers; ++l)
        gemvs.insert(gemvs.end(), shape.layer_gemvs.begin(), shape.layer_gemvs.end());
    gemvs.push_back(shape.head_gemv);
    std::size_t chain_bytes = 0;
    int longest = 0;
    for (const Gemv& g : gemvs) {
        chain_bytes += std::size_t(g.rows) * ((q4_0_bytes(1, g.in) + 15) / 16) * 16;
        longest = std::max({longest, g.rows, g.in});
    }
    std::uint8_t* chain_weights = nullptr;
    float* vectors[2] = {nullptr, nullptr};
    CHECK(cudaMalloc(&chain_weights, chain_bytes));
    CHECK(cudaMemset(chain_weights, 0x3C, chain_bytes));
    for (float*& v : vectors) {
        CHECK(cudaMalloc(&v, longest * sizeof(float)));
        CHECK(cudaMemset(v, 0x3C, longest * sizeof(float)));  // 0x3C3C3C3C: 0.0115f
    }
    const float chain_us = time_graph([&] {
        std::size_t offset = 0;
        for (std::size_t p = 0; p < gemvs.size(); ++p) {
            const Gemv g = gemvs[p];
            const int row_words = int((q4_0_bytes(1, g.in) + 15) / 16);
            cudaLaunchAttribute attribute;
            // 8 rows a block at a time
            const cudaLaunchConfig_t config =
                launch_config(unsigned(std::min((g.rows + 7) / 8, sms * 4)), true, stream, attribute);
            CHECK(cudaLaunchKernelEx(&config, gemv_phase, reinterpret_cast<const uint4*>(chain_weights + offset),
                                     g.rows, row_words, static_cast<const float*>(vectors[p % 2]), g.in,
                                     vectors[1 - p % 2]));
            offset += std::size_t(g.rows) * row_words * 16;
        }
    }, stream);
    report("gemv chain (a launch a phase, graph, PDL)", chain_us);
    for (float* v : vectors) CHECK(cudaFree(v));
    CHECK(cudaFree(chain_weights));

    CHECK(cudaFree(copy));
    CHECK(cudaFree(sink));
    CHECK(cudaFree(arrived));
    CHECK(cudaFree(device_phases));
    CHECK(cudaFree(weights));
}

}  // namespace

int main() {
    int device = 0, sms = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    // Q4_0 decode steps; the attention phase reads a short cache (one 4 KiB piece).
    const Shape qwen{"Qwen2.5-0.5B Q4_0",
                     {q4_0_bytes(1152, 896), 4096, q4_0_bytes(896, 896), q4_0_bytes(9728, 896), q4_0_bytes(896, 4864)},
                     24,
                     q4_0_bytes(151936, 896),
                     {{1152, 896}, {16, 896}, {896, 896}, {9728, 896}, {896, 4864}},
                     {151936, 896}};
    const Shape llama{"Llama-3.2-1B Q4_0",
                      {q4_0_bytes(3072, 2048), 4096, q4_0_bytes(2048, 2048), q4_0_bytes(16384, 2048),
                       q4_0_bytes(2048, 8192)},
                      16,
                      q4_0_bytes(128256, 2048),
                      {{3072, 2048}, {16, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}},
                      {128256, 2048}};
    measure(qwen, sms, stream);
    measure(llama, sms, stream);
    CHECK(cudaStreamDestroy(stream));
    return 0;
}
