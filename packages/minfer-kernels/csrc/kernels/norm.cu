// RMSNorm: out[r][i] = x[r][i] / sqrt(mean_i(x[r][i]^2) + eps) * weight[i]  (LLaMA's norm; no mean
// subtraction, no bias). rms_norm_add_f32 adds that norm into y instead (y[r][i] += ...): Gemma's norm of a
// block's output on its way into the residual stream, one launch where a norm and an add were two.
//
// One block per row: the row's sum of squares is a block-wide reduction (warp shuffles, then one value
// per warp through shared memory), after which every thread scales its own elements. out may alias x:
// each thread reads its elements, the reduction's barrier passes, then it writes the same elements.
//
// A decode step's norm is launched overlapped (common.cuh: launch_overlapped), as the GEMVs around it are
// (launch_norm, below): before waiting for the previous kernel, the block prefetches the weight's lines into L2
// (the weight depends on no kernel; x, y and out are written or read by the kernels around, so only after the
// wait), and the GEMV after it may start, and prefetch its own weights, while the norm still runs. Gemma 3's
// two post-block norms a layer were plain launches: tg128 +6-11% at Gemma 3 270M (docs/PERFORMANCE.md, session 39).
// A decode step's rms_norm_add_f32 (Gemma 3's two a layer, each a launch of one row) holds its row in registers
// instead (rms_norm_add_row_f32): the weight loaded before the wait, x and y together after it.
#include "common.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int NORM_THREADS = 256;
constexpr int LINE_BYTES = 128;

// What an overlapped norm does before touching an activation: bring the lines of weight[0, d) into L2, the
// block's threads striding over them (from the line holding weight[0], which need not start one), then wait for
// the previous kernel and let the next one launch.
__device__ __forceinline__ void prefetch_weight_then_wait(const float* weight, int d) {
    const char* first_line = reinterpret_cast<const char*>(
        reinterpret_cast<std::uintptr_t>(weight) & ~std::uintptr_t(LINE_BYTES - 1));
    const char* end = reinterpret_cast<const char*>(weight + d);
    for (const char* line = first_line + threadIdx.x * LINE_BYTES; line < end; line += blockDim.x * LINE_BYTES)
        prefetch_l2(line);
    wait_for_previous_kernel();
    allow_next_kernel();
}

// 1 / sqrt(mean(row^2) + eps), for every thread of the block (its threads stride over the row).
__device__ float row_inv_rms(const float* row, int d, float eps) {
    float sum_of_squares = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) sum_of_squares += row[i] * row[i];
    return rsqrtf(block_sum(sum_of_squares) / float(d) + eps);
}

// OVERLAPPED: launched with launch_overlapped (a decode step's norm; see launch_norm).
template <bool OVERLAPPED>
__global__ void rms_norm_f32(const float* x, const float* weight, float* out, int d, float eps) {
    const float* row = x + std::size_t(blockIdx.x) * d;
    float* out_row = out + std::size_t(blockIdx.x) * d;
    if constexpr (OVERLAPPED) prefetch_weight_then_wait(weight, d);
    const float inv_rms = row_inv_rms(row, d, eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) out_row[i] = row[i] * inv_rms * weight[i];
}

// A prompt's rows (and a row too long for rms_norm_add_row_f32), launched plainly. x must not alias y (both
// __restrict__: the compiler may move x's loads past the stores into y).
__global__ void rms_norm_add_f32(const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ y,
                                 int d, float eps) {
    const float* row = x + std::size_t(blockIdx.x) * d;
    float* y_row = y + std::size_t(blockIdx.x) * d;
    const float inv_rms = row_inv_rms(row, d, eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) y_row[i] += row[i] * inv_rms * weight[i];
}

// A decode step's rms_norm_add (one row, launched overlapped): each thread holds HELD values of the row in
// registers, a warp's lanes on consecutive values (i = threadIdx.x + k * blockDim.x). The weight's are loaded
// before the wait (no kernel writes the weight), x's and y's together after it, so one L2 round trip stands between
// the wait and the sum of squares and none after it, where a row strided as rms_norm_f32's is read x after the wait,
// then the weight (prefetched into L2 only) and y after the sum: a round trip less in each of Gemma 3's 36
// post-block norms a token. x must not alias y.
template <int HELD>
__global__ void __launch_bounds__(1024)
    rms_norm_add_row_f32(const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ y, int d,
                         float eps) {
    float held_weight[HELD], held_x[HELD], held_y[HELD];
#pragma unroll
    for (int k = 0; k < HELD; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        held_weight[k] = i < d ? weight[i] : 0.0f;
    }
    wait_for_previous_kernel();
    allow_next_kernel();
#pragma unroll
    for (int k = 0; k < HELD; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        held_x[k] = i < d ? x[i] : 0.0f;
        held_y[k] = i < d ? y[i] : 0.0f;
    }
    float sum_of_squares = 0.0f;
#pragma unroll
    for (int k = 0; k < HELD; ++k) sum_of_squares += held_x[k] * held_x[k];
    const float inv_rms = rsqrtf(block_sum(sum_of_squares) / float(d) + eps);
#pragma unroll
    for (int k = 0; k < HELD; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < d) y[i] = held_y[k] + held_x[k] * inv_rms * held_weight[k];
    }
}

// The most values rms_norm_add_row_f32 holds a thread: rows up to 8 x 1024 = 8192 values in a block of at most
// 1024 threads (its __launch_bounds__: 64 registers a thread; 8 values each of x, y and the weight take 43 to 52).
// Gemma 3's hidden sizes are 640 to 5376; a longer row's norm is launched plainly.
constexpr int MAX_HELD = 8;
constexpr int MAX_ROW_THREADS = 1024;

// A decode step's norm (one row; none is an invalid launch either way) is launched overlapped, between the GEMVs
// that are. A prompt's norm (a row a token, or a head) is launched plainly, and its kernel neither prefetches nor
// lets the next kernel start early, as before: overlapped, pp512 lost 1-3% at Qwen3-0.6B and Gemma 3 270M
// (docs/PERFORMANCE.md, session 39), its blocks started early waiting on SMs that the GEMM before it still needed.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_norm(void (*overlapped)(KernelArgs...), void (*plain)(KernelArgs...), int rows,
                        cudaStream_t stream, Args... args) {
    if (rows <= 1) return launch_overlapped(overlapped, dim3(rows), dim3(NORM_THREADS), 0, stream, args...);
    plain<<<rows, NORM_THREADS, 0, stream>>>(static_cast<KernelArgs>(args)...);
    return cudaGetLastError();
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_rms_norm_f32(const float* x, const float* weight, float* out, int rows, int d,
                                           float eps, cudaStream_t stream) {
    // grid.x: the row (token), one block of 256 threads each; the threads stride over the row's d values
    // (and, before the wait, over the weight's lines).
    return launch_norm(rms_norm_f32<true>, rms_norm_f32<false>, rows, stream, x, weight, out, d, eps);
}

extern "C" cudaError_t launch_rms_norm_add_f32(const float* x, const float* weight, float* y, int rows, int d,
                                               float eps, cudaStream_t stream) {
    if (x == y) return minfer_refuse("x must not alias y (the norm reads all of x before adding into y)");
    if (rows == 1 && d <= MAX_HELD * MAX_ROW_THREADS) {
        // grid: one block, the row; its threads (256, doubled up to 1024 while d passes MAX_HELD values a
        // thread) hold the row's values, the fewest a thread (a power of two) that cover d.
        int threads = NORM_THREADS;
        while (d > MAX_HELD * threads) threads *= 2;
        const int needed = (d + threads - 1) / threads;
        const auto launch = [&](auto kernel) {
            return launch_overlapped(kernel, dim3(1), dim3(threads), 0, stream, x, weight, y, d, eps);
        };
        if (needed <= 1) return launch(rms_norm_add_row_f32<1>);
        if (needed <= 2) return launch(rms_norm_add_row_f32<2>);
        if (needed <= 4) return launch(rms_norm_add_row_f32<4>);
        return launch(rms_norm_add_row_f32<MAX_HELD>);
    }
    // grid.x: the row (token), one block of 256 threads each; the threads stride over the row's d values.
    rms_norm_add_f32<<<rows, NORM_THREADS, 0, stream>>>(x, weight, y, d, eps);
    return cudaGetLastError();
}
