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
// at 1, 2 and 4 blocks an SM of 256 threads. The barrier's read of the step before is a plain load: the writes of
// the phase before are ordered before it by the barrier's release and acquire.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int THREADS = 256;
constexpr int STEPS = 2000;
constexpr int REPLAYS = 5;

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

__global__ void steps_in_one_kernel(float* a, float* b, unsigned int* count, unsigned int* generation, int steps) {
    for (int step = 0; step < steps; ++step) {
        const float* in = step % 2 == 0 ? a : b;
        float* out = step % 2 == 0 ? b : a;
        out[blockIdx.x * blockDim.x + threadIdx.x] = in[source_index()] + 1.0f;
        grid_barrier(count, generation);
    }
}

// The graph of STEPS launches of `kernel`, ping-ponging between a and b, overlapped or plain.
cudaGraphExec_t capture_chain(void (*kernel)(const float*, float*), bool overlapped, int blocks, float* a, float* b,
                              cudaStream_t stream) {
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    for (int step = 0; step < STEPS; ++step) {
        cudaLaunchAttribute attribute{};
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(THREADS);
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = overlapped ? 1 : 0;
        const float* in = step % 2 == 0 ? a : b;
        float* out = step % 2 == 0 ? b : a;
        check(cudaLaunchKernelEx(&config, kernel, in, out), "launch");
    }
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec;
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    check(cudaGraphDestroy(graph), "destroy graph");
    return exec;
}

// Microseconds a step of `run` (which runs STEPS steps), its best of REPLAYS after one warm-up.
template <class Run>
double us_per_step(Run run, cudaStream_t stream) {
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
        best = std::min(best, ms * 1000.0 / STEPS);
    }
    check(cudaEventDestroy(start), "event");
    check(cudaEventDestroy(end), "event");
    return best;
}

}  // namespace

int main() {
    int device = 0, sms = 0, resident = 0;
    check(cudaGetDevice(&device), "device");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, steps_in_one_kernel, THREADS, 0), "occupancy");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, device), "properties");
    std::printf("boundary_cost on %s (%d SMs), %d steps a test, %d threads a block, us a step (best of %d)\n",
                properties.name, sms, STEPS, THREADS, REPLAYS);
    std::printf("| blocks | launches, plain | launches, overlapped | one kernel, barrier |\n");
    std::printf("| ---: | ---: | ---: | ---: |\n");

    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    for (const int per_sm : {1, 2, 4}) {
        const int blocks = sms * per_sm;
        float *a, *b;
        unsigned int* sync;  // count, generation
        check(cudaMalloc(&a, sizeof(float) * blocks * THREADS), "malloc");
        check(cudaMalloc(&b, sizeof(float) * blocks * THREADS), "malloc");
        check(cudaMalloc(&sync, 2 * sizeof(unsigned int)), "malloc");
        check(cudaMemset(a, 0, sizeof(float) * blocks * THREADS), "memset");
        check(cudaMemset(sync, 0, 2 * sizeof(unsigned int)), "memset");
        const cudaGraphExec_t plain = capture_chain(step_plain, false, blocks, a, b, stream);
        const cudaGraphExec_t overlapped = capture_chain(step_overlapped, true, blocks, a, b, stream);
        const double plain_us = us_per_step([&] { check(cudaGraphLaunch(plain, stream), "graph"); }, stream);
        const double overlapped_us =
            us_per_step([&] { check(cudaGraphLaunch(overlapped, stream), "graph"); }, stream);
        std::printf("| %d (%d an SM) | %.2f | %.2f | ", blocks, per_sm, plain_us, overlapped_us);
        if (per_sm <= resident) {
            // grid.x: every block resident (per_sm an SM, within the occupancy), each a slice of THREADS values.
            const double barrier_us = us_per_step(
                [&] {
                    steps_in_one_kernel<<<blocks, THREADS, 0, stream>>>(a, b, sync, sync + 1, STEPS);
                    check(cudaGetLastError(), "launch");
                },
                stream);
            std::printf("%.2f |\n", barrier_us);
        } else {
            std::printf("(not resident) |\n");
        }
        check(cudaGraphExecDestroy(plain), "destroy");
        check(cudaGraphExecDestroy(overlapped), "destroy");
        check(cudaFree(a), "free");
        check(cudaFree(b), "free");
        check(cudaFree(sync), "free");
    }
    check(cudaStreamDestroy(stream), "stream");
    return 0;
}
