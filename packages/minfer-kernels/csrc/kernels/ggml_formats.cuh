// The GGUF weight formats the kernels read directly, byte for byte as they sit in the file.
//
// A weight with GGUF shape [in, out] is `out` rows of `in` values. A row is stored as consecutive blocks:
//
//   type   id  values/block  bytes/block  layout of one block                  value j of the block
//   F32     0        1            4       float                                 x
//   F16     1        1            2       half                                  x
//   Q4_0    2       32           18       half d; uint8 qs[16]                  d * (nibble_j - 8)
//   Q4_1    3       32           20       half d; half m; uint8 qs[16]          d * nibble_j + m
//   Q8_0    8       32           34       half d; int8 qs[32]                   d * qs[j]
//
// where nibble_j is the low nibble of qs[j] for j < 16 and the high nibble of qs[j - 16] for j >= 16.
// The 18- and 34-byte blocks put every block on a 2-byte boundary only, which decides how wide a load
// can be (see matmul.cu).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace minfer {

// GGML type ids, as in a GGUF file's tensor info.
enum GgmlType : int { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8 };

constexpr int QK = 32;  // values per block of the quantized formats

struct BlockQ4_0 {
    __half d;
    std::uint8_t qs[QK / 2];
};
struct BlockQ4_1 {
    __half d;
    __half m;
    std::uint8_t qs[QK / 2];
};
struct BlockQ8_0 {
    __half d;
    std::int8_t qs[QK];
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes in GGUF");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes in GGUF");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes in GGUF");

// Bytes of one row of `n` values, or -1 when the type is not one of the five above or `n` does not
// split into whole blocks.
inline long long row_bytes(int type, long long n) {
    switch (type) {
        case GGML_F32: return n * 4;
        case GGML_F16: return n * 2;
        case GGML_Q4_0: return n % QK == 0 ? n / QK * static_cast<long long>(sizeof(BlockQ4_0)) : -1;
        case GGML_Q4_1: return n % QK == 0 ? n / QK * static_cast<long long>(sizeof(BlockQ4_1)) : -1;
        case GGML_Q8_0: return n % QK == 0 ? n / QK * static_cast<long long>(sizeof(BlockQ8_0)) : -1;
        default: return -1;
    }
}

// Value i of a row, one at a time (the embedding lookup). The arithmetic is spelled out with the _rn
// intrinsics so the compiler cannot fuse d * q + m into one FMA: the result is then bit-identical to
// gguf.quants.dequantize, which rounds the product and the sum separately.
template <int TYPE>
__device__ float dequantize_value(const std::uint8_t* row, int i);

template <>
__device__ __forceinline__ float dequantize_value<GGML_F32>(const std::uint8_t* row, int i) {
    return reinterpret_cast<const float*>(row)[i];
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_F16>(const std::uint8_t* row, int i) {
    return __half2float(reinterpret_cast<const __half*>(row)[i]);
}

__device__ __forceinline__ int nibble(const std::uint8_t* qs, int j) {
    return j < QK / 2 ? (qs[j] & 0xF) : (qs[j - QK / 2] >> 4);
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q4_0>(const std::uint8_t* row, int i) {
    const BlockQ4_0& block = reinterpret_cast<const BlockQ4_0*>(row)[i / QK];
    return __fmul_rn(__half2float(block.d), float(nibble(block.qs, i % QK) - 8));
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q4_1>(const std::uint8_t* row, int i) {
    const BlockQ4_1& block = reinterpret_cast<const BlockQ4_1*>(row)[i / QK];
    const float scaled = __fmul_rn(__half2float(block.d), float(nibble(block.qs, i % QK)));
    return __fadd_rn(scaled, __half2float(block.m));
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q8_0>(const std::uint8_t* row, int i) {
    const BlockQ8_0& block = reinterpret_cast<const BlockQ8_0*>(row)[i / QK];
    return __fmul_rn(__half2float(block.d), float(block.qs[i % QK]));
}

}  // namespace minfer
