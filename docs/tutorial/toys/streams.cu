// Toy #3 of docs/tutorial/02-minimal-cuda.md: two kernels on the default stream run one after the other;
// on two streams they run side by side. Timed with CUDA events.
//
//   nvcc -arch=sm_90 -O2 -o streams streams.cu && ./streams
//
// The busy kernel is one block of 32 threads spinning for a fixed number of GPU clock cycles: two of them
// fit on the GPU at once, so two streams should take about half the time. Exits 1 on a CUDA error or when
// the two-stream phase is not clearly faster (speedup below 1.5).
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CHECK(call)                                                                                    \
    do {                                                                                               \
        const cudaError_t err_ = (call);                                                               \
        if (err_ != cudaSuccess) {                                                                     \
            std::printf("CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(err_),                   \
                        cudaGetErrorString(err_), __FILE__, __LINE__, #call);                          \
            return 1;                                                                                  \
        }                                                                                              \
    } while (0)

// Spins `cycles` clocks of its SM, then writes how long it spun, so the work cannot be optimized away.
__global__ void busy(long long* out, long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    if (threadIdx.x == 0) out[blockIdx.x] = clock64() - start;
}

int main(int argc, char** argv) {
    const long long cycles = argc > 1 ? std::atoll(argv[1]) : 40000000LL;  // ~20 ms at the H200's ~1.98 GHz
    long long* out = nullptr;
    CHECK(cudaMalloc(&out, 2 * sizeof(long long)));
    cudaStream_t first, second;
    CHECK(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));  // what minfer_kernels.Stream makes
    CHECK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
    cudaEvent_t begin, forked, joined, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&forked));
    CHECK(cudaEventCreate(&joined));
    CHECK(cudaEventCreate(&end));

    busy<<<1, 32>>>(out, 1000);  // warm-up: module load and first launch stay out of the timings
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    // Phase 1: both kernels on the legacy default stream (0): the second waits for the first.
    float serial_ms = 0.0f;
    CHECK(cudaEventRecord(begin, 0));
    busy<<<1, 32, 0, 0>>>(out, cycles);
    CHECK(cudaGetLastError());
    busy<<<1, 32, 0, 0>>>(out + 1, cycles);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(end, 0));
    CHECK(cudaEventSynchronize(end));
    CHECK(cudaEventElapsedTime(&serial_ms, begin, end));

    // Phase 2: one kernel per stream. Non-blocking streams do not wait for the default stream, so the
    // events fork the second stream off the first and join it back: begin -> both kernels -> end.
    float parallel_ms = 0.0f;
    CHECK(cudaEventRecord(begin, first));
    CHECK(cudaEventRecord(forked, first));
    CHECK(cudaStreamWaitEvent(second, forked, 0));
    busy<<<1, 32, 0, first>>>(out, cycles);
    CHECK(cudaGetLastError());
    busy<<<1, 32, 0, second>>>(out + 1, cycles);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(joined, second));
    CHECK(cudaStreamWaitEvent(first, joined, 0));
    CHECK(cudaEventRecord(end, first));
    CHECK(cudaEventSynchronize(end));
    CHECK(cudaEventElapsedTime(&parallel_ms, begin, end));

    const float speedup = serial_ms / parallel_ms;
    std::printf("busy kernel: 1 block x 32 threads, %lld cycles each\n", cycles);
    std::printf("default stream: %.2f ms (the second kernel waits for the first)\n", serial_ms);
    std::printf("two streams   : %.2f ms (side by side)\n", parallel_ms);
    std::printf("speedup %.2fx %s\n", speedup, speedup >= 1.5f ? "PASS" : "FAIL");

    CHECK(cudaEventDestroy(begin));
    CHECK(cudaEventDestroy(forked));
    CHECK(cudaEventDestroy(joined));
    CHECK(cudaEventDestroy(end));
    CHECK(cudaStreamDestroy(first));
    CHECK(cudaStreamDestroy(second));
    CHECK(cudaFree(out));
    return speedup >= 1.5f ? 0 : 1;
}
