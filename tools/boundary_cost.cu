// What a kernel boundary costs in a decode step's chain, against a barrier across the grid inside one kernel: the
// measurement behind issue 17's persistent kernel. docs/PERFORMANCE.md (session 46's timeline) has every kernel of
// a Qwen2.5-0.5B layer adding 4-6 us to the step whatever its bytes; a layer in fewer launches pays off only if a
// grid barrier costs less than a boundary.
//
//   nvcc -std=c++17 -arch=sm_90a -O2 -o /tmp/boundary_cost tools/boundary_cost.cu && /tmp/boundary_cost
//
// Each test runs STEPS steps; a step's every thread reads one float that the step before wrote (a different block's,
// so it comes through L2, as a kernel's x does) and writes one, its own. Microseconds a step:
//   launches, plain        a captured graph of STEPS launches (a boundary drains one grid before the next starts)
//   launches, overlapped   the same, launched with programmatic dependent launch: each kernel waits
//                          (griddepcontrol.wait) before its read and lets the next launch right after, as minfer's
//                          decode kernels do (common.cuh: launch_overlapped)
//   one kernel, barrier    one launch of STEPS phases, a barrier across the grid between two (a generation count in
//                          global memory; every block resident: one an SM, at most what the occupancy allows)
//   one kernel, counting   the same with the cheapest barrier there is: each block adds one to a count that only
//                          grows (a posted release, nothing to wait for) and waits until it holds every block's
//                          arrivals so far; no reset, no second trip
// at 1, 2 and 4 blocks an SM of 256 threads. The barrier's read of the step before is a plain load: the writes of
// the phase before are ordered before it by the barrier's release and acquire.
//
// The second table adds what a decode GEMV adds to that chain: weights. Each step's blocks also read their share of
// that step's bytes, a slice of a ring of four times L2 (so from DRAM, as a decode step's layers are), and fold it
// into what they write. The sizes are Qwen2.5-0.5B's four products of a layer in Q8_0: attn_output 0.85 MB, q|k|v
// 1.1, ffn_down 4.6, gate|up 9.3. Microseconds a step:
//   floor                  the bytes at the ring's read bandwidth (one kernel reading the whole ring)
//   plain                  launches, plain: the weights read with the rest
//   overlapped, after      launches overlapped, the weights read after the wait
//   overlapped, before     launches overlapped, the weights into L2 before the wait and the first vectors into
//                          registers, as minfer's GEMV does (gemv.cu, row 67 of docs/PERFORMANCE.md)
// A step that costs near the floor plus the boundary leaves nothing to win in a kernel; one that costs what
// session 46's timeline has a GEMV add (0.85 MB: 5.15 us) says the weights' latency is the machine's, not the
// kernel's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int THREADS = 256;
constexpr int STEPS = 2000;
constexpr int REPLAYS = 5;
constexpr int LINE_VECTORS = 8;   // 16-byte vectors a 128-byte line
constexpr int FIRST_VECTORS = 4;  // a thread's first vectors loaded into registers before the wait
constexpr int RING_PASSES = 20;   // reads of the whole ring that time its bandwidth

void check(cudaError_t result, const char* what) {
    if (result != cudaSuccess) {
        std::fprintf(stderr, "boundary_cost: %s: %s\n", what, cudaGetErrorString(result));
        std::exit(1);
    }
}

// The value a step's thread reads: the one the step before wrote a block further on (so another SM's, through L2).
__device__ __forceinline__ int source_index() { return (blockIdx.x + 1) % gridDim.x * blockDim.x + threadIdx.x; }

__global__ void step_plain(const float* in, float* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = in[source_index()] + 1.0f;
}

__global__ void step_overlapped(const float* in, float* out) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    out[blockIdx.x * blockDim.x + threadIdx.x] = in[source_index()] + 1.0f;
}

enum class Weights { plain, after_wait, before_wait };

// One step with weights: the block's `share` vectors of this step's slice (folded into the value written, times
// `zero`, so that no load is dead) beside the chain's read and write.
template <Weights WHEN>
__global__ void step_streaming(const float* in, float* out, const uint4* slice, int share, float zero) {
    const uint4* mine = slice + static_cast<long long>(blockIdx.x) * share;
    unsigned int folded = 0;
    uint4 first[FIRST_VECTORS];
    if constexpr (WHEN == Weights::before_wait) {
        for (int v = threadIdx.x * LINE_VECTORS; v < share; v += blockDim.x * LINE_VECTORS)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(mine + v));
#pragma unroll
        for (int k = 0; k < FIRST_VECTORS; ++k) {
            const int v = threadIdx.x + k * blockDim.x;
            first[k] = v < share ? mine[v] : make_uint4(0, 0, 0, 0);
        }
    }
    if constexpr (WHEN != Weights::plain) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;");
    }
    int v = threadIdx.x;
    if constexpr (WHEN == Weights::before_wait) {
#pragma unroll
        for (int k = 0; k < FIRST_VECTORS; ++k) folded ^= first[k].x ^ first[k].y ^ first[k].z ^ first[k].w;
        v += FIRST_VECTORS * blockDim.x;
    }
#pragma unroll 8  // up to 8 loads in flight a thread, as the GEMV's batches
    for (; v < share; v += blockDim.x) {
        const uint4 word = mine[v];
        folded ^= word.x ^ word.y ^ word.z ^ word.w;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = in[source_index()] + zero * static_cast<float>(folded);
}

// Reads `vectors` of `ring` once (grid-stride), folding them into `sink`: the ring's read bandwidth.
__global__ void read_ring(const uint4* ring, long long vectors, unsigned int* sink) {
    unsigned int folded = 0;
    for (long long v = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; v < vectors;
         v += static_cast<long long>(gridDim.x) * blockDim.x) {
        const uint4 word = ring[v];
        folded ^= word.x ^ word.y ^ word.z ^ word.w;
    }
    if (folded == 0x9e3779b9u) *sink = folded;  // never true of the zeroed ring: keeps the loads
}

// Every block's thread 0 arrives (release: the block's writes before it), the last to arrive resets the count and
// advances the generation; the others wait for the generation to move (acquire).
__device__ void grid_barrier(unsigned int* count, unsigned int* generation) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int seen;
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(generation) : "memory");
        unsigned int arrived;
        asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(arrived) : "l"(count) : "memory");
        if (arrived == gridDim.x - 1) {
            *count = 0;
            asm volatile("red.release.gpu.add.u32 [%0], 1;" ::"l"(generation) : "memory");
        } else {
            unsigned int now = seen;
            while (now == seen) asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(generation) : "memory");
        }
    }
    __syncthreads();
}

// Every block's thread 0 adds its arrival to `count` (zero at the launch, never reset) and waits until it holds
// `arrivals`, every block's arrival at every step so far.
__device__ void counting_grid_barrier(unsigned int* count, unsigned int arrivals) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned int now = 0;
        do {
            asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(count) : "memory");
        } while (now < arrivals);
    }
    __syncthreads();
}

template <bool COUNTING>
__global__ void steps_in_one_kernel(float* a, float* b, unsigned int* count, unsigned int* generation, int steps) {
    for (int step = 0; step < steps; ++step) {
        const float* in = step % 2 == 0 ? a : b;
        float* out = step % 2 == 0 ? b : a;
        out[blockIdx.x * blockDim.x + threadIdx.x] = in[source_index()] + 1.0f;
        if constexpr (COUNTING) {
            counting_grid_barrier(count, (step + 1) * gridDim.x);
        } else {
            grid_barrier(count, generation);
        }
    }
}

// The graph of STEPS launches, overlapped or plain: launch_step(config, step) launches step `step`.
template <class LaunchStep>
cudaGraphExec_t capture_chain(LaunchStep launch_step, bool overlapped, int blocks, cudaStream_t stream) {
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    for (int step = 0; step < STEPS; ++step) {
        cudaLaunchAttribute attribute{};
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config{};
        // grid.x: the blocks, each THREADS values of the chain (and its share of the step's weights).
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(THREADS);
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = overlapped ? 1 : 0;
        check(launch_step(config, step), "launch");
    }
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec;
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    check(cudaGraphDestroy(graph), "destroy graph");
    return exec;
}

// Microseconds each of the `runs` steps (or passes) that one call of `run` makes: its best of REPLAYS after one
// warm-up.
template <class Run>
double us_each(Run run, int runs, cudaStream_t stream) {
    cudaEvent_t start, end;
    check(cudaEventCreate(&start), "event");
    check(cudaEventCreate(&end), "event");
    run();
    double best = 1e30;
    for (int replay = 0; replay < REPLAYS; ++replay) {
        check(cudaEventRecord(start, stream), "record");
        run();
        check(cudaEventRecord(end, stream), "record");
        check(cudaEventSynchronize(end), "synchronize");
        float ms = 0.0f;
        check(cudaEventElapsedTime(&ms, start, end), "elapsed");
        best = std::min(best, ms * 1000.0 / runs);
    }
    check(cudaEventDestroy(start), "event");
    check(cudaEventDestroy(end), "event");
    return best;
}

// Qwen2.5-0.5B's products of a layer in Q8_0 (34 bytes a block of 32 weights): rows x columns.
struct Product {
    const char* name;
    long long rows, columns;
    long long bytes() const { return rows * columns / 32 * 34; }
};
constexpr Product PRODUCTS[] = {
    {"attn_output", 896, 896}, {"q|k|v", 896 + 128 + 128, 896}, {"ffn_down", 896, 4864}, {"gate|up", 2 * 4864, 896}};

// The first table: a boundary against a barrier, no weights.
void boundary_table(int sms, int resident, cudaStream_t stream) {
    std::printf("| blocks | launches, plain | launches, overlapped | one kernel, barrier | one kernel, counting |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: |\n");
    for (const int per_sm : {1, 2, 4}) {
        const int blocks = sms * per_sm;
        float *a, *b;
        unsigned int* sync;  // count, generation
        check(cudaMalloc(&a, sizeof(float) * blocks * THREADS), "malloc");
        check(cudaMalloc(&b, sizeof(float) * blocks * THREADS), "malloc");
        check(cudaMalloc(&sync, 2 * sizeof(unsigned int)), "malloc");
        check(cudaMemset(a, 0, sizeof(float) * blocks * THREADS), "memset");
        check(cudaMemset(sync, 0, 2 * sizeof(unsigned int)), "memset");
        const auto ping_pong = [&](void (*kernel)(const float*, float*)) {
            return [=](const cudaLaunchConfig_t& config, int step) {
                return cudaLaunchKernelEx(&config, kernel, step % 2 == 0 ? a : b, step % 2 == 0 ? b : a);
            };
        };
        const cudaGraphExec_t plain = capture_chain(ping_pong(step_plain), false, blocks, stream);
        const cudaGraphExec_t overlapped = capture_chain(ping_pong(step_overlapped), true, blocks, stream);
        const double plain_us = us_each([&] { check(cudaGraphLaunch(plain, stream), "graph"); }, STEPS, stream);
        const double overlapped_us =
            us_each([&] { check(cudaGraphLaunch(overlapped, stream), "graph"); }, STEPS, stream);
        std::printf("| %d (%d an SM) | %.2f | %.2f | ", blocks, per_sm, plain_us, overlapped_us);
        if (per_sm <= resident) {
            const auto barrier_us = [&](void (*kernel)(float*, float*, unsigned int*, unsigned int*, int)) {
                return us_each(
                    [&] {
                        check(cudaMemsetAsync(sync, 0, 2 * sizeof(unsigned int), stream), "memset");
                        // grid.x: every block resident (per_sm an SM, within the occupancy), each THREADS values.
                        kernel<<<blocks, THREADS, 0, stream>>>(a, b, sync, sync + 1, STEPS);
                        check(cudaGetLastError(), "launch");
                    },
                    STEPS, stream);
            };
            const double generation_us = barrier_us(steps_in_one_kernel<false>);
            std::printf("%.2f | %.2f |\n", generation_us, barrier_us(steps_in_one_kernel<true>));
        } else {
            std::printf("(not resident) | (not resident) |\n");
        }
        check(cudaGraphExecDestroy(plain), "destroy");
        check(cudaGraphExecDestroy(overlapped), "destroy");
        check(cudaFree(a), "free");
        check(cudaFree(b), "free");
        check(cudaFree(sync), "free");
    }
}

// The second table: the chain with each step's weights read from a ring of four times L2.
void weights_table(int sms, int l2_bytes, cudaStream_t stream) {
    const long long ring_vectors = 4LL * l2_bytes / sizeof(uint4);
    uint4* ring;
    unsigned int* sink;
    check(cudaMalloc(&ring, ring_vectors * sizeof(uint4)), "malloc");
    check(cudaMemset(ring, 0, ring_vectors * sizeof(uint4)), "memset");
    check(cudaMalloc(&sink, sizeof(unsigned int)), "malloc");
    const double ring_us = us_each(
        [&] {
            // grid.x: 4 blocks an SM walking the ring grid-stride, each thread a 16-byte vector a stride.
            for (int pass = 0; pass < RING_PASSES; ++pass)
                read_ring<<<sms * 4, THREADS, 0, stream>>>(ring, ring_vectors, sink);
            check(cudaGetLastError(), "launch");
        },
        RING_PASSES, stream);
    const double bytes_per_us = ring_vectors * sizeof(uint4) / ring_us;
    std::printf("\nwith weights: each step's blocks also read their share of the step's bytes (a ring of %.0f MB, "
                "read alone at %.2f TB/s), us a step (best of %d)\n",
                ring_vectors * sizeof(uint4) / 1e6, bytes_per_us / 1e6, REPLAYS);
    std::printf("| product (0.5B, Q8_0) | MB | blocks | floor | plain | overlapped, after the wait | "
                "overlapped, before the wait |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const Product& product : PRODUCTS) {
        for (const int per_sm : {1, 4}) {
            const int blocks = sms * per_sm;
            const int share = static_cast<int>((product.bytes() / sizeof(uint4) + blocks - 1) / blocks);
            const long long slice_vectors = static_cast<long long>(share) * blocks;
            const long long slices = std::max(1LL, ring_vectors / slice_vectors);
            float *a, *b;
            check(cudaMalloc(&a, sizeof(float) * blocks * THREADS), "malloc");
            check(cudaMalloc(&b, sizeof(float) * blocks * THREADS), "malloc");
            check(cudaMemset(a, 0, sizeof(float) * blocks * THREADS), "memset");
            const auto streaming = [&](void (*kernel)(const float*, float*, const uint4*, int, float)) {
                return [=](const cudaLaunchConfig_t& config, int step) {
                    const uint4* slice = ring + step % slices * slice_vectors;
                    return cudaLaunchKernelEx(&config, kernel, step % 2 == 0 ? a : b, step % 2 == 0 ? b : a, slice,
                                              share, 0.0f);
                };
            };
            const cudaGraphExec_t graphs[] = {
                capture_chain(streaming(step_streaming<Weights::plain>), false, blocks, stream),
                capture_chain(streaming(step_streaming<Weights::after_wait>), true, blocks, stream),
                capture_chain(streaming(step_streaming<Weights::before_wait>), true, blocks, stream)};
            std::printf("| %s | %.2f | %d (%d an SM) | %.2f |", product.name, product.bytes() / 1e6, blocks, per_sm,
                        product.bytes() / bytes_per_us);
            for (const cudaGraphExec_t graph : graphs) {
                std::printf(" %.2f |", us_each([&] { check(cudaGraphLaunch(graph, stream), "graph"); }, STEPS, stream));
                check(cudaGraphExecDestroy(graph), "destroy");
            }
            std::printf("\n");
            check(cudaFree(a), "free");
            check(cudaFree(b), "free");
        }
    }
    check(cudaFree(ring), "free");
    check(cudaFree(sink), "free");
}

}  // namespace

int main() {
    int device = 0, sms = 0, resident = 0, l2_bytes = 0;
    check(cudaGetDevice(&device), "device");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
    check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "L2 size");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, steps_in_one_kernel<false>, THREADS, 0),
          "occupancy");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, device), "properties");
    std::printf("boundary_cost on %s (%d SMs), %d steps a test, %d threads a block, us a step (best of %d)\n",
                properties.name, sms, STEPS, THREADS, REPLAYS);
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    boundary_table(sms, resident, stream);
    weights_table(sms, l2_bytes, stream);
    check(cudaStreamDestroy(stream), "stream");
    return 0;
}
