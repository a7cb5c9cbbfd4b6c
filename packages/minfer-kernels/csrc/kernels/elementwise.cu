// Elementwise kernels over float32 activations: one thread per element.
//
// The shape every kernel here shares: a global index from the block and thread coordinates, a guard
// (the grid is a ceil-div, so the last block is partly idle), one load-compute-store. Consecutive threads
// touch consecutive floats, so each warp's accesses merge into 128-byte transactions.
//
// Outputs may alias inputs (out == a for a residual add, for example): each thread reads its element
// before it writes it and touches no other element, so no pointer here is declared __restrict__.
#include <cmath>

#include "common.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int BLOCK = 256;  // threads per block: 8 warps, a common default for memory-bound kernels

__global__ void add_f32(const float* a, const float* b, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] + b[i];
}

__global__ void mul_f32(const float* a, const float* b, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] * b[i];
}

__global__ void scale_f32(const float* x, float* out, float scale, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = x[i] * scale;
}

// In place: the graph decides when an op may overwrite its input (the alias rule); the kernel just does.
__global__ void silu_f32(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = silu(x[i]);
}

__global__ void gelu_f32(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = gelu_tanh(x[i]);
}

// Soft-capping keeps values in (-cap, cap) smoothly: Gemma's final logits.
__global__ void softcap_f32(float* x, float cap, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = cap * tanhf(x[i] / cap);
}

// out[r][i] = x[r][start + i]: a column range of each row of a fused projection's output (Phi-3's q|k|v,
// gate|up), as a contiguous [rows][width] activation.
__global__ void slice_f32(const float* x, float* out, int width, int in_stride, int start) {
    const int row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    out[std::size_t(row) * width + i] = x[std::size_t(row) * in_stride + start + i];
}

// out[r][i] = act(gate[r][i]) * up[r][i], the gated FFN activation (swiglu_f32: silu, geglu_f32: the tanh
// GELU). gate and up rows are `in_stride` floats apart, so one kernel serves two separate [rows][d] buffers
// (in_stride = d) and one fused gate|up projection output [rows][2d] (gate = base, up = base + d, in_stride =
// 2d).
template <GateActivation ACTIVATION>
__global__ void gated_f32(const float* gate, const float* up, float* out, int d, int in_stride) {
    const int row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const std::size_t in = std::size_t(row) * in_stride + i;
    out[std::size_t(row) * d + i] = activate<ACTIVATION>(gate[in]) * up[in];
}

template <GateActivation ACTIVATION>
cudaError_t launch_gated(const float* gate, const float* up, float* out, int rows, int d, int in_stride,
                         cudaStream_t stream) {
    // grid.x: ceil(d / 256) column blocks of a row; grid.y: the row (token), so rows <= 65535.
    const dim3 grid(ceil_div(d, BLOCK), rows);
    gated_f32<ACTIVATION><<<grid, BLOCK, 0, stream>>>(gate, up, out, d, in_stride);
    return cudaGetLastError();
}

// y[r][i] += bias[i]: every row (token) adds the same vector, which stays hot in L2 across blocks.
__global__ void add_bias_f32(float* y, const float* bias, int d) {
    const int row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    y[std::size_t(row) * d + i] += bias[i];
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_add_f32(const float* a, const float* b, float* out, int n, cudaStream_t stream) {
    // grid.x: ceil(n / 256) blocks; one thread per element.
    add_f32<<<ceil_div(n, BLOCK), BLOCK, 0, stream>>>(a, b, out, n);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_mul_f32(const float* a, const float* b, float* out, int n, cudaStream_t stream) {
    // grid.x: ceil(n / 256) blocks; one thread per element.
    mul_f32<<<ceil_div(n, BLOCK), BLOCK, 0, stream>>>(a, b, out, n);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_scale_f32(const float* x, float* out, float scale, int n, cudaStream_t stream) {
    // grid.x: ceil(n / 256) blocks; one thread per element.
    scale_f32<<<ceil_div(n, BLOCK), BLOCK, 0, stream>>>(x, out, scale, n);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_silu_f32(float* x, int n, cudaStream_t stream) {
    // grid.x: ceil(n / 256) blocks; one thread per element.
    silu_f32<<<ceil_div(n, BLOCK), BLOCK, 0, stream>>>(x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_gelu_f32(float* x, int n, cudaStream_t stream) {
    // grid.x: ceil(n / 256) blocks; one thread per element.
    gelu_f32<<<ceil_div(n, BLOCK), BLOCK, 0, stream>>>(x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_softcap_f32(float* x, float cap, int n, cudaStream_t stream) {
    if (!(cap > 0.0f) || !std::isfinite(cap)) return minfer_refuse("cap must be a positive finite number");
    // grid.x: ceil(n / 256) blocks; one thread per element.
    softcap_f32<<<ceil_div(n, BLOCK), BLOCK, 0, stream>>>(x, cap, n);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_slice_f32(const float* x, float* out, int rows, int width, int in_stride, int start,
                                        cudaStream_t stream) {
    if (start < 0 || width < 1 || start + width > in_stride)
        return minfer_refuse("columns start..start+width-1 must lie inside a row of in_stride values");
    // grid.x: ceil(width / 256) column blocks of a row; grid.y: the row (token), so rows <= 65535.
    const dim3 grid(ceil_div(width, BLOCK), rows);
    slice_f32<<<grid, BLOCK, 0, stream>>>(x, out, width, in_stride, start);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_swiglu_f32(const float* gate, const float* up, float* out, int rows, int d,
                                         int in_stride, cudaStream_t stream) {
    return launch_gated<GateActivation::SILU>(gate, up, out, rows, d, in_stride, stream);
}

extern "C" cudaError_t launch_geglu_f32(const float* gate, const float* up, float* out, int rows, int d,
                                        int in_stride, cudaStream_t stream) {
    return launch_gated<GateActivation::GELU_TANH>(gate, up, out, rows, d, in_stride, stream);
}

extern "C" cudaError_t launch_add_bias_f32(float* y, const float* bias, int rows, int d, cudaStream_t stream) {
    // grid.x: ceil(d / 256) column blocks of a row; grid.y: the row (token), so rows <= 65535.
    // `rows` is the ROW COUNT, not rows * d: the grid, not the kernel, encodes how many rows there are.
    const dim3 grid(ceil_div(d, BLOCK), rows);
    add_bias_f32<<<grid, BLOCK, 0, stream>>>(y, bias, d);
    return cudaGetLastError();
}
