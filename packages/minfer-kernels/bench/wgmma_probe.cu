// Does Hopper's warpgroup MMA pay for the prompt GEMM? The premise of a wgmma prefill GEMM, measured alone
// (issue 17; docs/PERFORMANCE.md, session 20): today's GEMM (gemm.cu) multiplies with mma.sync, one warp's 16 x 8
// fragments at a time, 32 values of K between two barriers, and reaches ~95 TFLOP/s on an H200 at Qwen2.5-0.5B's
// gate|up (F16, 512 tokens), about a fifth of what the tensor cores do through wgmma. This probe multiplies f16
// x [M][K] by f16 W [N][K] (both K-major, as the GGUF rows and the rounded x are) into float32 y [M][N] with
// wgmma.mma_async m64n128k16: a block of two warpgroups computes a 128 x 128 tile, its operands copied by
// cp.async into STAGES shared-memory stages of 64 values of K, in the 128-byte swizzle wgmma reads, and checks
// every y against a plain float32 kernel on the same f16 inputs.
//
//   cd packages/minfer-kernels/bench
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_probe wgmma_probe.cu
//   /tmp/wgmma_probe     # per product and IN_FLIGHT (0, 1): µs, TFLOP/s, max error against the reference
// (wgmma exists on sm_90a only: the arch-specific target, not plain sm_90.)
//
// The products are the prompt's at Qwen2.5-0.5B's and Llama-3.2-1B's shapes, 512 tokens. If wgmma here runs them
// several times faster than gemm.cu's mma.sync tiles (bench_kernels.py's `gemm F16 ... x512` rows), the prompt
// GEMM's next form is this one, its W tile written by the formats' decode instead of copied.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"

namespace {

constexpr int BM = 128;                    // tokens of a block's tile: two warpgroups of 64 rows
constexpr int BN = 128;                    // output features of the tile: wgmma's n = 128
constexpr int BK = 64;                     // values of K a stage: one 128-byte swizzled row of f16
constexpr int STAGES = 4;                  // shared-memory stages: three of them in flight
constexpr int THREADS = 256;               // two warpgroups, which also issue the copies
constexpr int ROW_BYTES = BK * 2;          // 128
constexpr int TILE_BYTES = BM * ROW_BYTES;  // 16 KB of x, and as much of W (BN = BM)
constexpr int STAGE_BYTES = 2 * TILE_BYTES;
constexpr int SHARED_BYTES = STAGES * STAGE_BYTES + 1024;  // + room to align the stages to 1024 bytes
constexpr int REPETITIONS = 20;

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, in flight until the group's wait (sm_80's cp.async).
__device__ __forceinline__ void copy_16_async(unsigned shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared), "l"(global) : "memory");
}

// One tile (128 rows x 64 values) of a K-major matrix into a stage, in the 128-byte swizzle: the 16-byte chunk c
// of row r goes to chunk c ^ (r % 8) of that row (rows 128 bytes apart, 8-row atoms of 1024 bytes). Thread t
// copies chunks t, t + 256, ... of the tile's 1024 (row chunk / 8, chunk chunk % 8).
__device__ __forceinline__ void copy_tile(unsigned tile, const __half* matrix, int first_row, int k0, int k_total) {
#pragma unroll
    for (int i = 0; i < BM * 8 / THREADS; ++i) {
        const int chunk = threadIdx.x + i * THREADS;
        const int row = chunk / 8;
        const int c = chunk % 8;
        copy_16_async(tile + row * ROW_BYTES + ((c ^ (row % 8)) << 4),
                      matrix + static_cast<std::size_t>(first_row + row) * k_total + k0 + c * 8);
    }
}

// The shared-memory matrix descriptor of wgmma (PTX ISA, "Matrix Descriptor Format"): the start address, the
// leading-dimension byte offset (unused by a K-major swizzled operand: 1), the stride byte offset (1024: from one
// 8-row atom to the next), all in 16-byte units, and the layout, 1 = 128-byte swizzle. The start must be 1024-byte
// aligned for the swizzle to line up (base offset 0); a step of 16 values of K inside the row is +32 bytes.
__device__ __forceinline__ std::uint64_t descriptor(unsigned address) {
    std::uint64_t d = 0;
    d |= static_cast<std::uint64_t>((address >> 4) & 0x3FFF);
    d |= static_cast<std::uint64_t>(1) << 16;
    d |= static_cast<std::uint64_t>(1024 >> 4) << 32;
    d |= static_cast<std::uint64_t>(1) << 62;
    return d;
}

// d (64 x 128 float32, this warpgroup's) += A (64 x 16 f16, descriptor a) * B (16 x 128 f16, descriptor b: W's
// 128 rows, K-major), scale-d 1 (accumulate).
__device__ __forceinline__ void wgmma_64x128x16(float (&d)[64], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
}

// y = x W^T. Block: 256 threads (warpgroup g = threadIdx.x / 128 computes rows 64 g .. 64 g + 63 of the tile);
// grid.x the tiles of output features (N / 128), grid.y the tiles of tokens (M / 128). IN_FLIGHT: the wgmma groups
// a warpgroup leaves running when it goes on to the next step (0: each step's products finish before the next
// step's copies are issued; 1: they overlap the next step's wait and copies, the copies then one step less ahead).
template <int IN_FLIGHT>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_wgmma(const __half* __restrict__ x, const __half* __restrict__ w, float* __restrict__ y, int m, int n,
               int k) {
    constexpr int AHEAD = STAGES - 1 - IN_FLIGHT;  // steps whose copies are in flight while one is multiplied
    extern __shared__ std::uint8_t shared[];
    const unsigned base = (shared_address(shared) + 1023) & ~1023u;
    const int first_token = blockIdx.y * BM;
    const int first_feature = blockIdx.x * BN;
    const int group = threadIdx.x / 128;
    const int steps = k / BK;
    float d[64] = {};

    for (int s = 0; s < AHEAD; ++s) {
        if (s < steps) {
            copy_tile(base + s * STAGE_BYTES, x, first_token, s * BK, k);
            copy_tile(base + s * STAGE_BYTES + TILE_BYTES, w, first_feature, s * BK, k);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD - 1) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the copies, visible to wgmma's reads
        __syncthreads();
        // Into the stage of step - 1 - IN_FLIGHT, whose wgmmas every warpgroup waited for before the barrier.
        const int refill = step + AHEAD;
        if (refill < steps) {
            const unsigned stage = base + (refill % STAGES) * STAGE_BYTES;
            copy_tile(stage, x, first_token, refill * BK, k);
            copy_tile(stage + TILE_BYTES, w, first_feature, refill * BK, k);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        const unsigned stage = base + (step % STAGES) * STAGE_BYTES;
        const std::uint64_t a = descriptor(stage + group * 64 * ROW_BYTES);
        const std::uint64_t b = descriptor(stage + TILE_BYTES);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) wgmma_64x128x16(d, a + 2 * kk, b + 2 * kk);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(IN_FLIGHT) : "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

    // Accumulator j of lane l in warp w of the warpgroup: row 16 (w % 4) + l / 4 + 8 ((j / 2) % 2), column
    // 8 (j / 4) + 2 (l % 4) + j % 2 (mma.m16n8's C fragment, once per 8 columns).
    const int warp = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < 64; ++j) {
        const int row = first_token + group * 64 + warp * 16 + lane / 4 + 8 * ((j / 2) % 2);
        const int column = first_feature + 8 * (j / 4) + 2 * (lane % 4) + j % 2;
        y[static_cast<std::size_t>(row) * n + column] = d[j];
    }
}

// The reference: one thread per output, float32 sums of the same f16 products.
__global__ void gemm_reference(const __half* x, const __half* w, float* y, int m, int n, int k) {
    const int column = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y;
    if (column >= n) return;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i)
        sum += __half2float(x[static_cast<std::size_t>(row) * k + i]) *
               __half2float(w[static_cast<std::size_t>(column) * k + i]);
    y[static_cast<std::size_t>(row) * n + column] = sum;
}

struct Product {
    const char* name;
    int m, n, k;
};

template <int IN_FLIGHT>
void measure(const Product& p) {
    std::vector<__half> hx(static_cast<std::size_t>(p.m) * p.k), hw(static_cast<std::size_t>(p.n) * p.k);
    std::uint32_t state = 12345;
    auto uniform = [&state] {
        state = state * 1664525u + 1013904223u;
        return (state >> 8) * (1.0f / 16777216.0f) - 0.5f;
    };
    for (auto& v : hx) v = __float2half(uniform());
    for (auto& v : hw) v = __float2half(uniform() * 0.1f);
    __half *x = nullptr, *w = nullptr;
    float *y = nullptr, *reference = nullptr;
    CHECK(cudaMalloc(&x, hx.size() * sizeof(__half)));
    CHECK(cudaMalloc(&w, hw.size() * sizeof(__half)));
    CHECK(cudaMalloc(&y, static_cast<std::size_t>(p.m) * p.n * sizeof(float)));
    CHECK(cudaMalloc(&reference, static_cast<std::size_t>(p.m) * p.n * sizeof(float)));
    CHECK(cudaMemcpy(x, hx.data(), hx.size() * sizeof(__half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(w, hw.data(), hw.size() * sizeof(__half), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(y, 0xFF, static_cast<std::size_t>(p.m) * p.n * sizeof(float)));  // NaN: a missed output shows

    const dim3 grid(p.n / BN, p.m / BM);
    CHECK(cudaFuncSetAttribute(gemm_wgmma<IN_FLIGHT>, cudaFuncAttributeMaxDynamicSharedMemorySize, SHARED_BYTES));
    gemm_wgmma<IN_FLIGHT><<<grid, THREADS, SHARED_BYTES>>>(x, w, y, p.m, p.n, p.k);
    CHECK(cudaGetLastError());
    gemm_reference<<<dim3((p.n + 255) / 256, p.m), 256>>>(x, w, reference, p.m, p.n, p.k);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> got(static_cast<std::size_t>(p.m) * p.n), want(got.size());
    CHECK(cudaMemcpy(got.data(), y, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(want.data(), reference, want.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
        worst = std::isnan(got[i]) ? INFINITY : std::max(worst, error);
        scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    }

    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start));
    for (int r = 0; r < REPETITIONS; ++r)
        gemm_wgmma<IN_FLIGHT><<<grid, THREADS, SHARED_BYTES>>>(x, w, y, p.m, p.n, p.k);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    const double us = 1000.0 * ms / REPETITIONS;
    const double tflops = 2.0 * p.m * p.n * p.k / (us * 1e-6) / 1e12;
    std::printf("%-34s %5d x %5d x %5d  in flight %d  %8.2f us  %6.1f TFLOP/s  max error %.2e of max |y| %.2e%s\n",
                p.name, p.m, p.n, p.k, IN_FLIGHT, us, tflops, worst, scale, worst <= 1e-3 * scale ? "" : "  WRONG");
    CHECK(cudaFree(x));
    CHECK(cudaFree(w));
    CHECK(cudaFree(y));
    CHECK(cudaFree(reference));
}

}  // namespace

int main() {
    const Product products[] = {
        {"qwen2.5-0.5b gate (one of gate|up)", 512, 4864, 896},
        {"qwen2.5-0.5b ffn_down", 512, 896, 4864},
        {"qwen2.5-0.5b attn_output", 512, 896, 896},
        {"llama3.2-1b gate (one of gate|up)", 512, 8192, 2048},
        {"llama3.2-1b ffn_down", 512, 2048, 8192},
        {"llama3.2-1b attn_output", 512, 2048, 2048},
    };
    for (const Product& p : products) {
        measure<0>(p);
        measure<1>(p);
    }
    return 0;
}
