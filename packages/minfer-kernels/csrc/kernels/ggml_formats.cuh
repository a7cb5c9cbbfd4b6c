// The GGUF weight formats the kernels read directly, byte for byte as they sit in the file.
//
// A weight with GGUF shape [in, out] is `out` rows of `in` values. A row is stored as consecutive blocks:
//
//   type   id  values/block  bytes/block  layout of one block                  value j of the block
//   F32     0        1            4       float                                 x
//   F16     1        1            2       half                                  x
//   Q4_0    2       32           18       half d; uint8 qs[16]                  d * (nibble_j - 8)
//   Q4_1    3       32           20       half d; half m; uint8 qs[16]          d * nibble_j + m
//   Q5_0    6       32           22       half d; uint8 qh[4]; uint8 qs[16]     d * ((nibble_j | bit_j << 4) - 16)
//   Q8_0    8       32           34       half d; int8 qs[32]                   d * qs[j]
//   Q4_K   12      256          144       BlockQ4_K below                       (d * scale) * q - dmin * min
//   Q6_K   14      256          210       BlockQ6_K below                       (d * scale) * (q - 32)
//
// where nibble_j is the low nibble of qs[j] for j < 16 and the high nibble of qs[j - 16] for j >= 16, and
// bit_j is bit j of qh read as a little-endian 32-bit word. The K-quants split a 256-value super-block into
// sub-blocks with 6- or 8-bit scales of their own, described at their structs. The 18-, 22-, 34- and
// 210-byte blocks put every block on a 2-byte boundary only, which decides how wide a load can be (see
// matmul.cu).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace minfer {

// GGML type ids, as in a GGUF file's tensor info.
enum GgmlType : int {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q6_K = 14,
};

constexpr int QK = 32;     // values per block of Q4_0, Q4_1, Q5_0, Q8_0
constexpr int QK_K = 256;  // values per super-block of the K-quants

struct BlockQ4_0 {
    __half d;
    std::uint8_t qs[QK / 2];
};
struct BlockQ4_1 {
    __half d;
    __half m;
    std::uint8_t qs[QK / 2];
};
struct BlockQ5_0 {
    __half d;
    std::uint8_t qh[4];  // bit j: the fifth bit of value j
    std::uint8_t qs[QK / 2];
};
struct BlockQ8_0 {
    __half d;
    std::int8_t qs[QK];
};
// Q4_K: value 64g + i (g < 4, i < 32) is the low nibble of qs[32g + i], value 64g + 32 + i its high nibble;
// sub-block s = (value / 32) has scale and min q4_k_scale_min(scales, s).
struct BlockQ4_K {
    __half d;     // scale of the sub-block scales
    __half dmin;  // scale of the sub-block mins
    std::uint8_t scales[12];
    std::uint8_t qs[QK_K / 2];
};
// Q6_K: in half h (values 128h .. 128h + 127), for i < 32 and with ql = ql + 64h, qh = qh + 32h:
//   value 128h + i      = (low nibble of ql[i])       | (bits 0-1 of qh[i]) << 4,  scale scales[8h + i/16]
//   value 128h + 32 + i = (low nibble of ql[32 + i])  | (bits 2-3 of qh[i]) << 4,  scale scales[8h + i/16 + 2]
//   value 128h + 64 + i = (high nibble of ql[i])      | (bits 4-5 of qh[i]) << 4,  scale scales[8h + i/16 + 4]
//   value 128h + 96 + i = (high nibble of ql[32 + i]) | (bits 6-7 of qh[i]) << 4,  scale scales[8h + i/16 + 6]
// each minus 32 (6-bit values, signed around 32).
struct BlockQ6_K {
    std::uint8_t ql[QK_K / 2];
    std::uint8_t qh[QK_K / 4];
    std::int8_t scales[QK_K / 16];
    __half d;
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes in GGUF");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes in GGUF");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes in GGUF");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes in GGUF");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes in GGUF");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes in GGUF");

// Scale and min (6 bits each) of sub-block s < 8 of a Q4_K super-block, ggml's get_scale_min_k4: the
// first four sub-blocks keep theirs in the low 6 bits of scales[s] and scales[s + 4]; the last four in the
// nibbles of scales[s + 4] with their top two bits in the spare top bits of scales[s - 4] and scales[s].
// This form takes the only three bytes sub-block s reads, with j = s % 4: first = scales[j],
// second = scales[j + 4], third = scales[j + 8] (a kernel that carries them in registers, gemm.cu).
__host__ __device__ __forceinline__ void q4_k_scale_min(std::uint8_t first, std::uint8_t second, std::uint8_t third,
                                                        bool last_four, int& scale, int& min) {
    if (!last_four) {
        scale = first & 63;
        min = second & 63;
    } else {
        scale = (third & 0xF) | ((first >> 6) << 4);
        min = (third >> 4) | ((second >> 6) << 4);
    }
}

__host__ __device__ __forceinline__ void q4_k_scale_min(const std::uint8_t* scales, int s, int& scale, int& min) {
    const int j = s % 4;
    q4_k_scale_min(scales[j], scales[j + 4], scales[j + 8], s >= 4, scale, min);
}

// The formats above by name: the one list of the types the kernels read (every family reads each of them;
// module.cpp exports it as kernels.TYPES, from which Python builds minfer_kernels.GGMLType).
struct KernelType {
    const char* name;
    int id;
};
inline constexpr KernelType KERNEL_TYPES[] = {
    {"F32", GGML_F32},   {"F16", GGML_F16},   {"Q4_0", GGML_Q4_0}, {"Q4_1", GGML_Q4_1},
    {"Q5_0", GGML_Q5_0}, {"Q8_0", GGML_Q8_0}, {"Q4_K", GGML_Q4_K}, {"Q6_K", GGML_Q6_K},
};

// Bytes of one row of `n` values, or -1 when the type is not one of KERNEL_TYPES or `n` does not split
// into whole blocks.
inline long long row_bytes(int type, long long n) {
    switch (type) {
        case GGML_F32: return n * 4;
        case GGML_F16: return n * 2;
        case GGML_Q4_0: return n % QK == 0 ? n / QK * static_cast<long long>(sizeof(BlockQ4_0)) : -1;
        case GGML_Q4_1: return n % QK == 0 ? n / QK * static_cast<long long>(sizeof(BlockQ4_1)) : -1;
        case GGML_Q5_0: return n % QK == 0 ? n / QK * static_cast<long long>(sizeof(BlockQ5_0)) : -1;
        case GGML_Q8_0: return n % QK == 0 ? n / QK * static_cast<long long>(sizeof(BlockQ8_0)) : -1;
        case GGML_Q4_K: return n % QK_K == 0 ? n / QK_K * static_cast<long long>(sizeof(BlockQ4_K)) : -1;
        case GGML_Q6_K: return n % QK_K == 0 ? n / QK_K * static_cast<long long>(sizeof(BlockQ6_K)) : -1;
        default: return -1;
    }
}

// ---- Bit manipulations shared by the one-token GEMVs (gemv.cu, gemv_int8.cu) -------------------------------

__device__ __forceinline__ float half_bits_to_float(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }

// Bit i of the 4-bit `bits` moved to bit 4 of byte i: the fifth bits of 4 Q5_0 values, ready to OR onto
// their nibbles. (The multiplication copies the nibble to bit offsets 0, 7, 14 and 21, so that bit i of
// copy i lands on bit 8i.)
__device__ __forceinline__ std::uint32_t spread_fifth_bits(std::uint32_t bits) {
    return (((bits & 0xFu) * 0x00204081u) & 0x01010101u) << 4;
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

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q5_0>(const std::uint8_t* row, int i) {
    const BlockQ5_0& block = reinterpret_cast<const BlockQ5_0*>(row)[i / QK];
    const int j = i % QK;
    const int fifth_bit = (block.qh[j / 8] >> (j % 8)) & 1;
    return __fmul_rn(__half2float(block.d), float((nibble(block.qs, j) | (fifth_bit << 4)) - 16));
}

// The K-quants, in gguf.quants' order of operations: the sub-block's scale (and min) times d first, each
// product rounded to float32, then times q (and the min subtracted), rounded again.
template <>
__device__ __forceinline__ float dequantize_value<GGML_Q4_K>(const std::uint8_t* row, int i) {
    const BlockQ4_K& block = reinterpret_cast<const BlockQ4_K*>(row)[i / QK_K];
    const int j = i % QK_K;
    const int sub_block = j / 32;
    int scale, min;
    q4_k_scale_min(block.scales, sub_block, scale, min);
    const std::uint8_t byte = block.qs[32 * (sub_block / 2) + j % 32];
    const int q = sub_block % 2 == 0 ? (byte & 0xF) : (byte >> 4);
    const float scaled = __fmul_rn(__fmul_rn(__half2float(block.d), float(scale)), float(q));
    return __fsub_rn(scaled, __fmul_rn(__half2float(block.dmin), float(min)));
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q6_K>(const std::uint8_t* row, int i) {
    const BlockQ6_K& block = reinterpret_cast<const BlockQ6_K*>(row)[i / QK_K];
    const int j = i % QK_K;
    const int h = j / 128;           // the half of the super-block, as in the layout at BlockQ6_K
    const int group = j % 128 / 32;  // which of the half's four 32-value groups
    const int k = j % 32;
    const int low = (block.ql[64 * h + 32 * (group % 2) + k] >> (4 * (group / 2))) & 0xF;
    const int high = (block.qh[32 * h + k] >> (2 * group)) & 3;
    const float scale = __fmul_rn(__half2float(block.d), float(block.scales[j / 16]));
    return __fmul_rn(scale, float((low | (high << 4)) - 32));
}

}  // namespace minfer
