// Toy #2 of docs/tutorial/02-minimal-cuda.md: a SiLU kernel checked against a CPU reference.
//
//   nvcc -arch=sm_90 -O2 -o silu silu.cu && ./silu && ./silu 896
//
// n = 4864 is Qwen2.5-0.5B's FFN width (19 blocks of 256, none idle), n = 896 its hidden size (4 blocks,
// 128 idle threads). Exits 1 on a CUDA error or when the kernel disagrees with the reference.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

// Every CUDA call is checked: on failure, name the call and the error, and stop.
#define CHECK(call)                                                                                    \
    do {                                                                                               \
        const cudaError_t err_ = (call);                                                               \
        if (err_ != cudaSuccess) {                                                                     \
            std::printf("CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(err_),                   \
                        cudaGetErrorString(err_), __FILE__, __LINE__, #call);                          \
            return 1;                                                                                  \
        }                                                                                              \
    } while (0)

constexpr int BLOCK = 256;  // threads per block, as packages/minfer-kernels/csrc/kernels/elementwise.cu uses

// In place, like minfer's silu_f32: one thread per element, behind the guard.
__global__ void silu(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;  // the global 1-D index
    if (i >= n) return;                                   // the grid is a ceil-div: the last block is partly idle
    x[i] = x[i] / (1.0f + expf(-x[i]));
}

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 4864;
    if (n < 2) {
        std::printf("usage: %s [n >= 2]\n", argv[0]);
        return 2;
    }
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; ++i) x[i] = -8.0f + 16.0f * float(i) / float(n - 1);  // -8 .. 8

    float* device = nullptr;
    CHECK(cudaMalloc(&device, n * sizeof(float)));
    CHECK(cudaMemcpy(device, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));

    const int grid = (n + BLOCK - 1) / BLOCK;  // ceil-div
    std::printf("n=%d block=%d grid=%d: %d threads, %d idle\n", n, BLOCK, grid, grid * BLOCK, grid * BLOCK - n);
    silu<<<grid, BLOCK>>>(device, n);
    CHECK(cudaGetLastError());       // a launch error surfaces here, at once
    CHECK(cudaDeviceSynchronize());  // an error while the kernel ran surfaces here, later
    CHECK(cudaMemcpy(y.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(device));

    // The reference in double: the kernel's error is then its own (expf and the rounded divide).
    double max_error = 0.0;
    int worst = 0;
    for (int i = 0; i < n; ++i) {
        const double reference = double(x[i]) / (1.0 + std::exp(-double(x[i])));
        const double error = std::fabs(double(y[i]) - reference) / std::fmax(std::fabs(reference), 1e-30);
        if (error > max_error) {
            max_error = error;
            worst = i;
        }
    }
    // 1e-6 relative: the bound packages/minfer-kernels/tests/test_kernels_elementwise.py holds silu_f32 to.
    const bool pass = max_error <= 1e-6;
    std::printf("worst at x=%.6f: gpu=%.7f | max relative error %.3e (bound 1e-6) %s\n", x[worst], y[worst],
                max_error, pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
