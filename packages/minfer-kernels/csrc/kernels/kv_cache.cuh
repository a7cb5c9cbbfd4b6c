// The KV cache's element types, and the one rounding between them: what every kernel that writes or reads a
// cache row (attention.cu's store, decode and prefill; gemv_epilogues.cuh's q|k|v store) goes through.
//
// A cache is float32 or f16 (llama.cpp's default, half the bytes a row), named by its GGML type id as the
// launchers take it (0 F32, 1 F16). A value goes into an f16 cache rounded to nearest, ties to even
// (__float2half_rn: the bits numpy's np.float16 writes, so the CPU backend stores the same cache). The CUDA-core
// kernels (decode, the float32 prefill) read it widened to float32 exactly, and every sum over cache rows stays
// float32; the tensor-core prefill (attention_prefill_tensor_cores) takes an f16 row as the f16 operand it is,
// where it rounds a float32 row to f16.
#pragma once

#include <cuda_fp16.h>

#include "common.cuh"

namespace minfer {

constexpr int CACHE_F32 = 0;  // GGML_TYPE_F32
constexpr int CACHE_F16 = 1;  // GGML_TYPE_F16

__device__ __forceinline__ float widen(float value) { return value; }
__device__ __forceinline__ float widen(__half value) { return __half2float(value); }

__device__ __forceinline__ void store_cache(float* at, float value) { *at = value; }
__device__ __forceinline__ void store_cache(__half* at, float value) { *at = __float2half_rn(value); }

// Four consecutive values of a cache row, quad `quad` of it (row 16-byte aligned in float32, 8-byte in f16),
// widened to float32: one 16-byte load in float32, one 8-byte load in f16.
__device__ __forceinline__ float4 load_cache_quad(const float* row, int quad) {
    return reinterpret_cast<const float4*>(row)[quad];
}
__device__ __forceinline__ float4 load_cache_quad(const __half* row, int quad) {
    const uint2 bits = reinterpret_cast<const uint2*>(row)[quad];
    const float2 low = __half22float2(*reinterpret_cast<const __half2*>(&bits.x));
    const float2 high = __half22float2(*reinterpret_cast<const __half2*>(&bits.y));
    return make_float4(low.x, low.y, high.x, high.y);
}

// What every launcher answers a cache type id that is neither.
inline cudaError_t refuse_cache_type() {
    return minfer_refuse("cache_type must be 0 (F32) or 1 (F16), a GGML type id");
}

// launch(T{}) with T the element type of `cache_type` (float or __half): a launcher's one generic lambda
// instantiates its kernel for both; any other type id is refused.
template <class Launch>
cudaError_t with_cache_type(int cache_type, Launch&& launch) {
    if (cache_type == CACHE_F32) return launch(float{});
    if (cache_type == CACHE_F16) return launch(__half{});
    return refuse_cache_type();
}

}  // namespace minfer
