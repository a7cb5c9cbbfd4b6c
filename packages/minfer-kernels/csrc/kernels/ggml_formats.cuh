// The GGUF weight formats the kernels read directly, byte for byte as they sit in the file.
//
// A weight with GGUF shape [in, out] is `out` rows of `in` values. A row is stored as consecutive blocks:
//
//   type   id  values/block  bytes/block  layout of one block                       value j of the block
//   F32     0        1            4       float                                      x
//   F16     1        1            2       half                                       x
//   BF16   30        1            2       the top 16 bits of a float                 x
//   Q4_0    2       32           18       half d; uint8 qs[16]                       d * (nibble_j - 8)
//   Q4_1    3       32           20       half d; half m; uint8 qs[16]               d * nibble_j + m
//   Q5_0    6       32           22       half d; uint8 qh[4]; uint8 qs[16]          d * ((nibble_j | bit_j << 4) - 16)
//   Q5_1    7       32           24       half d; half m; uint8 qh[4]; uint8 qs[16]  d * (nibble_j | bit_j << 4) + m
//   Q8_0    8       32           34       half d; int8 qs[32]                        d * qs[j]
//   IQ4_NL 20       32           18       half d; uint8 qs[16]                       d * IQ4_NL_VALUES[nibble_j]
//   Q2_K   10      256           84       BlockQ2_K below                            (d * scale) * q - dmin * min
//   Q3_K   11      256          110       BlockQ3_K below                            (d * scale) * q
//   Q4_K   12      256          144       BlockQ4_K below                            (d * scale) * q - dmin * min
//   Q5_K   13      256          176       BlockQ5_K below                            (d * scale) * q - dmin * min
//   Q6_K   14      256          210       BlockQ6_K below                            (d * scale) * (q - 32)
//   IQ4_XS 23      256          136       BlockIQ4_XS below                          (d * scale) * IQ4_NL_VALUES[q]
//
// where nibble_j is the low nibble of qs[j] for j < 16 and the high nibble of qs[j - 16] for j >= 16, and
// bit_j is bit j of qh read as a little-endian 32-bit word. The K-quants and IQ4_XS split a 256-value
// super-block into sub-blocks with scales (and mins) of their own, described at their structs. The 18-, 22-,
// 34-, 110- and 210-byte blocks put every block on a 2-byte boundary only, which decides how wide a load
// can be (see matmul.cu); the 20-, 24-, 84-, 136-, 144- and 176-byte blocks keep a 4-byte one.
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
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q2_K = 10,
    GGML_Q3_K = 11,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23,
    GGML_BF16 = 30,
};

constexpr int QK = 32;     // values per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL
constexpr int QK_K = 256;  // values per super-block of the K-quants and IQ4_XS

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
struct BlockQ5_1 {
    __half d;
    __half m;
    std::uint8_t qh[4];  // bit j: the fifth bit of value j
    std::uint8_t qs[QK / 2];
};
struct BlockQ8_0 {
    __half d;
    std::int8_t qs[QK];
};
struct BlockIQ4_NL {
    __half d;
    std::uint8_t qs[QK / 2];  // nibble_j indexes IQ4_NL_VALUES
};
// Q2_K: in half h (values 128h .. 128h + 127), group g < 4 and i < 32, value 128h + 32g + i is bits 2g, 2g + 1
// of qs[32h + i]; sub-block s = value / 16 (16 values) has scale scales[s] & 0xF and min scales[s] >> 4.
struct BlockQ2_K {
    std::uint8_t scales[QK_K / 16];
    std::uint8_t qs[QK_K / 4];
    __half d;     // scale of the sub-block scales
    __half dmin;  // scale of the sub-block mins
};
// Q3_K: value v = 128h + 32g + i (as in Q2_K) is q = (bits 2g, 2g + 1 of qs[32h + i]) - 4 * (1 - bit v / 32 of
// hmask[i]), in -4..3; sub-block s = v / 16 has the scale q3_k_scale(scales, s) (6 bits, signed around 32).
struct BlockQ3_K {
    std::uint8_t hmask[QK_K / 8];
    std::uint8_t qs[QK_K / 4];
    std::uint8_t scales[12];
    __half d;
};
// Q4_K: value 64g + i (g < 4, i < 32) is the low nibble of qs[32g + i], value 64g + 32 + i its high nibble;
// sub-block s = (value / 32) has scale and min q4_k_scale_min(scales, s).
struct BlockQ4_K {
    __half d;     // scale of the sub-block scales
    __half dmin;  // scale of the sub-block mins
    std::uint8_t scales[12];
    std::uint8_t qs[QK_K / 2];
};
// Q5_K: Q4_K's layout and scales, each value with a fifth bit: bit s of qh[i] for value 32s + i (s < 8, i < 32).
struct BlockQ5_K {
    __half d;
    __half dmin;
    std::uint8_t scales[12];
    std::uint8_t qh[QK_K / 8];
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
// IQ4_XS: 8 sub-blocks of 32 values, sub-block s laid out as an IQ4_NL block (its 16 bytes qs[16s ..]), with
// d * iq4_xs_scale(scales_h, scales_l[s / 2], s) (6 bits, signed around 32) in place of the IQ4_NL block's d.
struct BlockIQ4_XS {
    __half d;
    std::uint16_t scales_h;            // bits 2s, 2s + 1: the top two bits of sub-block s's scale
    std::uint8_t scales_l[QK_K / 64];  // nibble s % 2 of byte s / 2: its low four bits
    std::uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes in GGUF");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes in GGUF");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes in GGUF");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block is 24 bytes in GGUF");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes in GGUF");
static_assert(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block is 18 bytes in GGUF");
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block is 84 bytes in GGUF");
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block is 110 bytes in GGUF");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes in GGUF");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes in GGUF");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes in GGUF");
static_assert(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block is 136 bytes in GGUF");

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

// The same rule for the two neighbouring sub-blocks 2p and 2p + 1 (p < 4) at once, their 12 scale bytes held as 3
// little-endian words: their scales in bytes 0 and 1 of `scales`, their mins in bytes 0 and 1 of `mins` (bytes 2
// and 3 zero). Sub-blocks 2p and 2p + 1 read neighbouring bytes (j = 2(p % 2) and j + 1), so each byte-wise step
// of q4_k_scale_min is one operation on the pair's 16 bits (a lane of gemv.cu decodes its two sub-blocks so, as
// llama.cpp's vec_dot_q4_K_q8_1 does, instead of a byte at a time).
__host__ __device__ __forceinline__ void q4_k_scale_min_pair(const std::uint32_t (&words)[3], int p,
                                                             std::uint32_t& scales, std::uint32_t& mins) {
    const int shift = 16 * (p % 2);
    const std::uint32_t first = (words[0] >> shift) & 0xFFFFu;
    const std::uint32_t second = (words[1] >> shift) & 0xFFFFu;
    const std::uint32_t third = (words[2] >> shift) & 0xFFFFu;
    // Both forms, then a select: the halves of a warp take different ones, and a branch would run both in turn.
    const bool last_four = p >= 2;
    scales = last_four ? (third & 0x0F0Fu) | ((first & 0xC0C0u) >> 2) : first & 0x3F3Fu;
    mins = last_four ? ((third >> 4) & 0x0F0Fu) | ((second & 0xC0C0u) >> 2) : second & 0x3F3Fu;
}

// The 6-bit scale of sub-block s < 16 of a Q3_K super-block, minus its zero point 32: the low four bits are
// nibble s / 8 of scales[s % 8], the top two bits pair s / 4 of scales[8 + s % 4] (ggml's dequantize_row_q3_K
// unpacks all sixteen at once the same way). This form takes the two bytes sub-block s reads:
// low_byte = scales[s % 8], high_byte = scales[8 + s % 4].
__host__ __device__ __forceinline__ int q3_k_scale(std::uint8_t low_byte, std::uint8_t high_byte, int s) {
    return (((low_byte >> (4 * (s / 8))) & 0xF) | (((high_byte >> (2 * (s / 4))) & 3) << 4)) - 32;
}

__host__ __device__ __forceinline__ int q3_k_scale(const std::uint8_t* scales, int s) {
    return q3_k_scale(scales[s % 8], scales[8 + s % 4], s);
}

// The same rule for sub-blocks s and s + 2 at once (s % 4 < 2: they read bytes s % 4 and s % 4 + 2 of the same two
// words, with the same shifts): `low_word` = scales[s % 8 - s % 4 .. + 3], `high_word` = scales[8 .. 11] as
// little-endian words. Their scales plus 32 (6 bits, unsigned) come back in bytes 0 and 2, bytes 1 and 3 zero.
__host__ __device__ __forceinline__ std::uint32_t q3_k_scale_pair(std::uint32_t low_word, std::uint32_t high_word,
                                                                  int s) {
    const int byte_shift = 8 * (s % 4);
    return ((low_word >> (byte_shift + 4 * (s / 8))) & 0x000F000Fu) |
           (((high_word >> (byte_shift + 2 * (s / 4))) & 0x00030003u) << 4);
}

// The 6-bit scale of sub-block s < 8 of an IQ4_XS super-block, minus its zero point 32, from scales_h and the
// byte scales_l[s / 2].
__host__ __device__ __forceinline__ int iq4_xs_scale(std::uint32_t scales_h, std::uint8_t scales_l_byte, int s) {
    return (((scales_l_byte >> (4 * (s % 2))) & 0xF) | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
}

// IQ4_NL_VALUES, ggml's kvalues_iq4nl: the 16 levels of IQ4_NL's and IQ4_XS's nibbles,
//     -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
// as int8 bytes, 4 to a little-endian word: entry k is byte k % 4 of IQ4_NL_WORD_<k / 4>.
constexpr std::uint32_t IQ4_NL_WORD_0 = 0xBFAD9881u;
constexpr std::uint32_t IQ4_NL_WORD_1 = 0xF6EADDCFu;
constexpr std::uint32_t IQ4_NL_WORD_2 = 0x26190D01u;
constexpr std::uint32_t IQ4_NL_WORD_3 = 0x71594535u;

// The IQ4_NL levels of the 8 nibbles of `word`, found with byte permutes (no memory is read, and the lanes of
// a warp may look up different entries at no cost): `low` gets the int8 levels of the low nibbles of bytes
// 0..3, `high` those of their high nibbles. A __byte_perm picks byte (selector nibble & 7) of its 8 input
// bytes, so each nibble picks its entry both among entries 0..7 and among 8..15, and its bit 3 chooses.
__device__ __forceinline__ void iq4_nl_levels(std::uint32_t word, std::uint32_t& low, std::uint32_t& high) {
    std::uint32_t picked[2];  // bytes 2i, 2i + 1 of word: their levels in the order low, high, low, high
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const std::uint32_t nibbles = word >> (16 * i);
        const std::uint32_t first_eight = __byte_perm(IQ4_NL_WORD_0, IQ4_NL_WORD_1, nibbles);
        const std::uint32_t last_eight = __byte_perm(IQ4_NL_WORD_2, IQ4_NL_WORD_3, nibbles);
        picked[i] = __byte_perm(first_eight, last_eight, 0x3210u | ((nibbles & 0x8888u) >> 1));
    }
    low = __byte_perm(picked[0], picked[1], 0x6420u);
    high = __byte_perm(picked[0], picked[1], 0x7531u);
}

// IQ4_NL_VALUES[k] for one nibble k (the embedding lookup).
__device__ __forceinline__ int iq4_nl_value(int k) {
    const bool first_eight = k < 8;
    const std::uint32_t entry = __byte_perm(first_eight ? IQ4_NL_WORD_0 : IQ4_NL_WORD_2,
                                            first_eight ? IQ4_NL_WORD_1 : IQ4_NL_WORD_3, k);
    return static_cast<std::int8_t>(entry & 0xFF);
}

// The formats above by name: the one list of the types the kernels read (every family reads each of them;
// module.cpp exports it as kernels.TYPES, from which Python builds minfer_kernels.GGMLType).
struct KernelType {
    const char* name;
    int id;
};
inline constexpr KernelType KERNEL_TYPES[] = {
    {"F32", GGML_F32},       {"F16", GGML_F16},       {"Q4_0", GGML_Q4_0},     {"Q4_1", GGML_Q4_1},
    {"Q5_0", GGML_Q5_0},     {"Q5_1", GGML_Q5_1},     {"Q8_0", GGML_Q8_0},     {"Q2_K", GGML_Q2_K},
    {"Q3_K", GGML_Q3_K},     {"Q4_K", GGML_Q4_K},     {"Q5_K", GGML_Q5_K},     {"Q6_K", GGML_Q6_K},
    {"IQ4_NL", GGML_IQ4_NL}, {"IQ4_XS", GGML_IQ4_XS}, {"BF16", GGML_BF16},
};

// KERNEL_TYPES by the row lengths they allow, as a launcher says it when it refuses a type or a row length
// (a string literal, for minfer_refuse).
#define MINFER_TYPES_AND_ROWS                                                                      \
    "type must be F32, F16 or BF16 (rows of any length); Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or IQ4_NL (rows of " \
    "whole 32-value blocks); or Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS (rows of whole 256-value super-blocks)"

template <class Block, int VALUES>
constexpr long long blocks_bytes(long long n) {
    return n % VALUES == 0 ? n / VALUES * static_cast<long long>(sizeof(Block)) : -1;
}

// Bytes of one row of `n` values, or -1 when the type is not one of KERNEL_TYPES or `n` does not split
// into whole blocks.
inline long long row_bytes(int type, long long n) {
    switch (type) {
        case GGML_F32: return n * 4;
        case GGML_F16:
        case GGML_BF16: return n * 2;
        case GGML_Q4_0: return blocks_bytes<BlockQ4_0, QK>(n);
        case GGML_Q4_1: return blocks_bytes<BlockQ4_1, QK>(n);
        case GGML_Q5_0: return blocks_bytes<BlockQ5_0, QK>(n);
        case GGML_Q5_1: return blocks_bytes<BlockQ5_1, QK>(n);
        case GGML_Q8_0: return blocks_bytes<BlockQ8_0, QK>(n);
        case GGML_IQ4_NL: return blocks_bytes<BlockIQ4_NL, QK>(n);
        case GGML_Q2_K: return blocks_bytes<BlockQ2_K, QK_K>(n);
        case GGML_Q3_K: return blocks_bytes<BlockQ3_K, QK_K>(n);
        case GGML_Q4_K: return blocks_bytes<BlockQ4_K, QK_K>(n);
        case GGML_Q5_K: return blocks_bytes<BlockQ5_K, QK_K>(n);
        case GGML_Q6_K: return blocks_bytes<BlockQ6_K, QK_K>(n);
        case GGML_IQ4_XS: return blocks_bytes<BlockIQ4_XS, QK_K>(n);
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

// A bfloat16 is the top half of a float32's bits: the float is exact.
__device__ __forceinline__ float bf16_bits_to_float(std::uint32_t bits) {
    return __uint_as_float(bits << 16);
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_BF16>(const std::uint8_t* row, int i) {
    return bf16_bits_to_float(reinterpret_cast<const std::uint16_t*>(row)[i]);
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

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q5_1>(const std::uint8_t* row, int i) {
    const BlockQ5_1& block = reinterpret_cast<const BlockQ5_1*>(row)[i / QK];
    const int j = i % QK;
    const int fifth_bit = (block.qh[j / 8] >> (j % 8)) & 1;
    const float scaled = __fmul_rn(__half2float(block.d), float(nibble(block.qs, j) | (fifth_bit << 4)));
    return __fadd_rn(scaled, __half2float(block.m));
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_IQ4_NL>(const std::uint8_t* row, int i) {
    const BlockIQ4_NL& block = reinterpret_cast<const BlockIQ4_NL*>(row)[i / QK];
    return __fmul_rn(__half2float(block.d), float(iq4_nl_value(nibble(block.qs, i % QK))));
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

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q2_K>(const std::uint8_t* row, int i) {
    const BlockQ2_K& block = reinterpret_cast<const BlockQ2_K*>(row)[i / QK_K];
    const int j = i % QK_K;
    const int q = (block.qs[32 * (j / 128) + j % 32] >> (2 * (j % 128 / 32))) & 3;
    const int scale_and_min = block.scales[j / 16];
    const float scale = __fmul_rn(__half2float(block.d), float(scale_and_min & 0xF));
    const float min = __fmul_rn(__half2float(block.dmin), float(scale_and_min >> 4));
    return __fsub_rn(__fmul_rn(scale, float(q)), min);
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q3_K>(const std::uint8_t* row, int i) {
    const BlockQ3_K& block = reinterpret_cast<const BlockQ3_K*>(row)[i / QK_K];
    const int j = i % QK_K;
    const int low = (block.qs[32 * (j / 128) + j % 32] >> (2 * (j % 128 / 32))) & 3;
    const int high = (block.hmask[j % 32] >> (j / 32)) & 1;
    const float scale = __fmul_rn(__half2float(block.d), float(q3_k_scale(block.scales, j / 16)));
    return __fmul_rn(scale, float((low | (high << 2)) - 4));
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_Q5_K>(const std::uint8_t* row, int i) {
    const BlockQ5_K& block = reinterpret_cast<const BlockQ5_K*>(row)[i / QK_K];
    const int j = i % QK_K;
    const int sub_block = j / 32;
    int scale, min;
    q4_k_scale_min(block.scales, sub_block, scale, min);
    const std::uint8_t byte = block.qs[32 * (sub_block / 2) + j % 32];
    const int low = sub_block % 2 == 0 ? (byte & 0xF) : (byte >> 4);
    const int q = low | (((block.qh[j % 32] >> sub_block) & 1) << 4);
    const float scaled = __fmul_rn(__fmul_rn(__half2float(block.d), float(scale)), float(q));
    return __fsub_rn(scaled, __fmul_rn(__half2float(block.dmin), float(min)));
}

template <>
__device__ __forceinline__ float dequantize_value<GGML_IQ4_XS>(const std::uint8_t* row, int i) {
    const BlockIQ4_XS& block = reinterpret_cast<const BlockIQ4_XS*>(row)[i / QK_K];
    const int j = i % QK_K;
    const int sub_block = j / 32;
    const int scale = iq4_xs_scale(block.scales_h, block.scales_l[sub_block / 2], sub_block);
    const int level = iq4_nl_value(nibble(block.qs + 16 * sub_block, j % 32));
    return __fmul_rn(__fmul_rn(__half2float(block.d), float(scale)), float(level));
}

}  // namespace minfer
