// Helpers shared by every kernel family: grid arithmetic, warp and block reductions, and the way a
// launcher refuses arguments its kernel cannot handle.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// A launcher that refuses its arguments (a type it has no kernel for, a size its kernel cannot split)
// calls this instead of launching. It leaves `reason` (a string literal) where the binding reads it
// and returns cudaErrorInvalidValue; the binding raises ValueError with the reason. Defined in
// csrc/runtime.cpp, which owns the error model.
extern "C" cudaError_t minfer_refuse(const char* reason);

namespace minfer {

constexpr int WARP_SIZE = 32;
constexpr unsigned FULL_WARP = 0xffffffffu;

// Number of blocks of `block` threads that cover `n` items: the last block may be partly idle, which is
// why every kernel guards its index.
__host__ __device__ constexpr int ceil_div(int n, int block) { return (n + block - 1) / block; }

// The shared-memory address (a 32-bit window offset) that PTX's shared-state instructions take, of a generic
// pointer into shared memory.
__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Sum of `value` over the 32 lanes of a warp; every lane gets the result. Butterfly (xor) shuffles: five
// register exchanges, no shared memory. The whole warp must call it.
__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(FULL_WARP, value, offset);
    return value;
}

// Sum of `value` over every thread of the block; every thread gets the result. Each warp reduces with
// shuffles, one value per warp goes through shared memory, and every warp reduces those. Contains
// __syncthreads(): every thread of the block must call it (no early return before it).
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float per_warp[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;

    value = warp_sum(value);
    __syncthreads();  // a previous call's readers are done with per_warp before it is overwritten
    if (lane == 0) per_warp[warp] = value;
    __syncthreads();
    value = lane < n_warps ? per_warp[lane] : 0.0f;
    value = warp_sum(value);  // every warp reduces the per-warp sums: no second broadcast needed
    return value;
}

// SiLU, the activation of the gated FFN: v / (1 + exp(-v)), the formula of the CPU reference.
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// GELU with the tanh approximation (transformers' gelu_pytorch_tanh, ggml's gelu), the activation of
// Gemma's gated FFN: 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), the formula of the CPU reference.
__device__ __forceinline__ float gelu_tanh(float v) {
    constexpr float SQRT_2_OVER_PI = 0.7978845608028654f;
    return 0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + 0.044715f * v * v * v)));
}

// The activation of a gated FFN's gate: SwiGLU's silu, GeGLU's tanh GELU (Gemma). Every gated kernel (the
// elementwise one, the one-token products, the prompt's GEMM) applies it through `activate`.
enum class GateActivation { SILU, GELU_TANH };

template <GateActivation ACTIVATION>
__device__ __forceinline__ float activate(float gate) {
    if constexpr (ACTIVATION == GateActivation::SILU) {
        return silu(gate);
    } else {
        return gelu_tanh(gate);
    }
}

// The same, the activation chosen per launch (a kernel argument: one instantiation serves both, and the branch
// is uniform over the grid).
__device__ __forceinline__ float activate(GateActivation activation, float gate) {
    return activation == GateActivation::SILU ? activate<GateActivation::SILU>(gate)
                                              : activate<GateActivation::GELU_TANH>(gate);
}

// Programmatic dependent launch (Hopper, sm_90+). A decode step is ~120 short kernels in a row, and
// between two of them the GPU drains one grid before it starts the next: a few microseconds each, a
// large part of a step. A kernel launched with launch_overlapped may start while the kernel before it
// on the stream is still running; it does what does not depend on that kernel (address arithmetic,
// prefetching weights into L2), then calls wait_for_previous_kernel(), which returns once the previous
// grid has finished and its writes are visible. So a kernel launched that way must call it before it
// reads anything an earlier kernel wrote and before it writes anything an earlier kernel may read.
// allow_next_kernel() lets the next overlapped kernel start launching; called right after the wait, at
// most two kernels are ever resident together. Older GPUs run both as no-ops, and launch_overlapped
// launches them plainly.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Hint: bring the 128-byte line holding `address` into L2 (weights, before wait_for_previous_kernel).
__device__ __forceinline__ void prefetch_l2(const void* address) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

// The current device's compute capability as 10 * major + minor (90 for an H200), 0 if it cannot be read.
// Defined in csrc/runtime.cpp.
extern "C" int minfer_compute_capability();

// Whether launch_overlapped asks for programmatic dependent launch on the current device: compute
// capability 9.0 or newer, and MINFER_NO_PDL unset or "0" (to measure what it is worth). Defined in
// csrc/runtime.cpp.
extern "C" bool minfer_programmatic_launch();

// Whether the one-token GEMVs may take the integer tensor cores (gemv_int8.cu) where they read the weights:
// MINFER_NO_INT8_GEMV unset or "0" at start, or what minfer_set_int8_gemv set since (the tests' way to the
// CUDA-core kernels on a GPU that has the other path). Defined in csrc/runtime.cpp.
extern "C" bool minfer_int8_gemv();

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to overlap the previous kernel on the
// stream (see wait_for_previous_kernel). Returns the launch's error, or else cudaGetLastError(), as every
// launcher does; either way it reads cudaGetLastError(), which clears it: a failed cudaLaunchKernelEx also
// leaves its error as the thread's last error, and left there the next launcher would report it again, as
// latched (its raise_if_latched), though this launch already reported it.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_overlapped(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t shared_bytes,
                              cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = minfer_programmatic_launch() ? 1 : 0;
    const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
    const cudaError_t last = cudaGetLastError();
    return launched != cudaSuccess ? launched : last;
}

// The current device's count of SMs, which the launchers that size their grids (and workspaces) by the GPU read.
inline cudaError_t device_multiprocessors(int& multiprocessors) {
    int device = 0;
    if (const cudaError_t failed = cudaGetDevice(&device); failed != cudaSuccess) return failed;
    return cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
}

inline bool is_aligned(const void* pointer, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

}  // namespace minfer
