// Matrix products with weights in their GGUF layout: y[t][o] = sum_i W[o][i] * x[t][i].
//
// W is out_features rows of in_features values, each row in the bytes of its format (ggml_formats.cuh),
// read straight from the buffer the GGUF bytes were uploaded to: no dequantized copy of W ever exists.
// Each lane decodes the chunk of W it is working on into registers and uses it at once.
//
// The work split is one warp per output row. The 32 lanes walk the row's chunks (lane c takes chunks
// c, c + 32, ...), so at every step a warp's loads cover one contiguous stretch of the row: coalesced.
// Each lane keeps a partial dot product; a warp shuffle reduction sums the 32 partials at the end.
//
// Decode (n_tokens == 1) is a matrix-vector product (GEMV): every weight is read once, and the kernel is
// bound by memory bandwidth. launch_matmul hands it to gemv.cu, whose kernel is built for exactly that;
// the warp-per-row kernel here serves one token only where gemv.cu refuses (F32/F16/BF16 rows of a length
// that is not a multiple of 8, unaligned float rows, a type gemv.cu has no kernel for). For n_tokens > 1, each
// warp takes TOKENS_PER_WARP = 8 tokens: a chunk of W is decoded once and used for 8 tokens, reading W 8
// times less often than 8 GEMVs would. That is a correct, reasonable small-batch path; from 16 tokens on,
// the runtime takes the tensor-core GEMM (gemm.cu) instead.
#include "common.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"

#include <iterator>

namespace minfer {
namespace {

constexpr int ROWS_PER_BLOCK = 4;   // warps per block, one output row each
constexpr int TOKENS_PER_WARP = 8;  // tokens sharing one decoded chunk of W in the n_tokens > 1 path

// A weight format, as one lane sees it: a chunk of VALUES consecutive weights of a row, decoded as
//     w[j] = scale * q[j] + offset        (offset only where HAS_OFFSET: Q4_1's and Q5_1's m, the -dmin * min
//                                          of Q2_K, Q4_K and Q5_K)
// so that a chunk's dot product factors into sum_j w[j] x[j] = scale * sum_j q[j] x[j] + offset * sum_j x[j]:
// the block scale is applied once per chunk, not once per weight.

struct F32x1 {  // any in_features
    static constexpr int VALUES = 1;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        q[0] = reinterpret_cast<const float*>(row)[chunk];
        scale = 1.0f;
        offset = 0.0f;
    }
};

struct F32x4 {  // in_features % 4 == 0: one 16-byte load per chunk
    static constexpr int VALUES = 4;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const float4 v = reinterpret_cast<const float4*>(row)[chunk];
        q[0] = v.x;
        q[1] = v.y;
        q[2] = v.z;
        q[3] = v.w;
        scale = 1.0f;
        offset = 0.0f;
    }
};

struct F16x1 {  // any in_features
    static constexpr int VALUES = 1;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        q[0] = __half2float(reinterpret_cast<const __half*>(row)[chunk]);
        scale = 1.0f;
        offset = 0.0f;
    }
};

struct F16x8 {  // in_features % 8 == 0: eight halves in one 16-byte load
    static constexpr int VALUES = 8;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const uint4 raw = reinterpret_cast<const uint4*>(row)[chunk];
        const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 pair = __half22float2(pairs[k]);
            q[2 * k] = pair.x;
            q[2 * k + 1] = pair.y;
        }
        scale = 1.0f;
        offset = 0.0f;
    }
};

struct BF16x1 {  // any in_features
    static constexpr int VALUES = 1;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        q[0] = bf16_bits_to_float(reinterpret_cast<const std::uint16_t*>(row)[chunk]);
        scale = 1.0f;
        offset = 0.0f;
    }
};

struct BF16x8 {  // in_features % 8 == 0: eight bfloat16 in one 16-byte load
    static constexpr int VALUES = 8;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const uint4 raw = reinterpret_cast<const uint4*>(row)[chunk];
        const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            q[2 * k] = bf16_bits_to_float(words[k] & 0xFFFF);  // value 2k: the low half of word k
            q[2 * k + 1] = bf16_bits_to_float(words[k] >> 16);
        }
        scale = 1.0f;
        offset = 0.0f;
    }
};

struct Q4_0 {  // one 18-byte block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ4_0& block = reinterpret_cast<const BlockQ4_0*>(row)[chunk];
        scale = __half2float(block.d);
        offset = 0.0f;
        // The 16 bytes of nibbles as 8 two-byte words: an 18-byte block stride leaves the nibbles on a
        // 2-byte boundary, so no wider load is legal. Byte 2k is the low half of word k (little endian).
        const std::uint16_t* words = reinterpret_cast<const std::uint16_t*>(block.qs);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned word = words[k];
            q[2 * k] = float(int(word & 0xF) - 8);              // low nibble of byte 2k:      value 2k
            q[2 * k + 1] = float(int((word >> 8) & 0xF) - 8);   // low nibble of byte 2k + 1:  value 2k + 1
            q[2 * k + 16] = float(int((word >> 4) & 0xF) - 8);  // high nibble of byte 2k:     value 2k + 16
            q[2 * k + 17] = float(int(word >> 12) - 8);         // high nibble of byte 2k + 1: value 2k + 17
        }
    }
};

struct Q4_1 {  // one 20-byte block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = true;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ4_1& block = reinterpret_cast<const BlockQ4_1*>(row)[chunk];
        // 20-byte blocks keep a 4-byte boundary: d and m in one 4-byte load, the nibbles in four.
        const float2 d_and_m = __half22float2(*reinterpret_cast<const __half2*>(&block.d));
        scale = d_and_m.x;
        offset = d_and_m.y;
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(block.qs);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const std::uint32_t word = words[k];
#pragma unroll
            for (int byte = 0; byte < 4; ++byte) {
                q[4 * k + byte] = float((word >> (8 * byte)) & 0xF);           // low nibble:  value 4k + byte
                q[4 * k + byte + 16] = float((word >> (8 * byte + 4)) & 0xF);  // high nibble: value + 16
            }
        }
    }
};

struct Q8_0 {  // one 34-byte block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ8_0& block = reinterpret_cast<const BlockQ8_0*>(row)[chunk];
        scale = __half2float(block.d);
        offset = 0.0f;
        // 32 signed bytes as 16 two-byte words (a 34-byte stride: 2-byte boundary, as for Q4_0).
        const std::uint16_t* words = reinterpret_cast<const std::uint16_t*>(block.qs);
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const unsigned word = words[k];
            q[2 * k] = float(std::int8_t(word & 0xFF));
            q[2 * k + 1] = float(std::int8_t(word >> 8));
        }
    }
};

struct Q5_0 {  // one 22-byte block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ5_0& block = reinterpret_cast<const BlockQ5_0*>(row)[chunk];
        scale = __half2float(block.d);
        offset = 0.0f;
        // A 22-byte stride leaves the block on a 2-byte boundary, as for Q4_0: the fifth bits as two
        // two-byte words (bit j of the 32-bit word is value j's), the nibbles as eight.
        const std::uint16_t* fifth_words = reinterpret_cast<const std::uint16_t*>(block.qh);
        const std::uint32_t fifth = fifth_words[0] | (std::uint32_t(fifth_words[1]) << 16);
        const std::uint16_t* words = reinterpret_cast<const std::uint16_t*>(block.qs);
        // Value j: its nibble (placed as in Q4_0) | bit j of `fifth` << 4, minus Q5_0's zero point 16.
        const auto value = [fifth](unsigned low_bits, int j) {
            return float(int(low_bits | ((fifth >> j) & 1) << 4) - 16);
        };
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned word = words[k];
            q[2 * k] = value(word & 0xF, 2 * k);
            q[2 * k + 1] = value((word >> 8) & 0xF, 2 * k + 1);
            q[2 * k + 16] = value((word >> 4) & 0xF, 2 * k + 16);
            q[2 * k + 17] = value(word >> 12, 2 * k + 17);
        }
    }
};

struct Q5_1 {  // one 24-byte block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = true;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ5_1& block = reinterpret_cast<const BlockQ5_1*>(row)[chunk];
        // 24-byte blocks keep a 4-byte boundary: d and m in one load, the fifth bits in one, the nibbles in four.
        const float2 d_and_m = __half22float2(*reinterpret_cast<const __half2*>(&block.d));
        scale = d_and_m.x;
        offset = d_and_m.y;
        const std::uint32_t fifth = *reinterpret_cast<const std::uint32_t*>(block.qh);
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(block.qs);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const std::uint32_t word = words[k];
#pragma unroll
            for (int byte = 0; byte < 4; ++byte) {
                const int j = 4 * k + byte;  // the low nibble is value j, the high nibble value j + 16
                q[j] = float(((word >> (8 * byte)) & 0xF) | ((fifth >> j) & 1) << 4);
                q[j + 16] = float(((word >> (8 * byte + 4)) & 0xF) | ((fifth >> (j + 16)) & 1) << 4);
            }
        }
    }
};

// Four int8 IQ4_NL levels (iq4_nl_levels) as floats, into q[first .. first + 3].
__device__ __forceinline__ void levels_to_floats(std::uint32_t levels, float* q) {
#pragma unroll
    for (int byte = 0; byte < 4; ++byte) q[byte] = float(std::int8_t(levels >> (8 * byte)));
}

struct IQ4_NL {  // one 18-byte block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockIQ4_NL& block = reinterpret_cast<const BlockIQ4_NL*>(row)[chunk];
        scale = __half2float(block.d);
        offset = 0.0f;
        // An 18-byte stride, as Q4_0's: the nibbles as eight two-byte words, joined in pairs.
        const std::uint16_t* words = reinterpret_cast<const std::uint16_t*>(block.qs);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            std::uint32_t low, high;  // the levels of values 4k .. 4k + 3 and of 16 + the same
            iq4_nl_levels(words[2 * k] | (std::uint32_t(words[2 * k + 1]) << 16), low, high);
            levels_to_floats(low, q + 4 * k);
            levels_to_floats(high, q + 16 + 4 * k);
        }
    }
};

struct Q2_K {  // one 16-value sub-block (one scale and min) of an 84-byte super-block per chunk
    static constexpr int VALUES = QK_K / 16;
    static constexpr bool HAS_OFFSET = true;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ2_K& block = reinterpret_cast<const BlockQ2_K*>(row)[chunk / 16];
        const int sub_block = chunk % 16;
        const int h = sub_block / 8;                 // the half of the super-block (layout at BlockQ2_K)
        const int shift = 2 * (sub_block % 8 / 2);  // the bits of the half's group
        const int first = 16 * (sub_block % 2);     // the sub-block's first value within its group
        // 84-byte blocks keep the row's 4-byte alignment: d and dmin in one load, the 16 bytes in four.
        const float2 d_and_dmin = __half22float2(*reinterpret_cast<const __half2*>(&block.d));
        const int scale_and_min = block.scales[sub_block];
        scale = d_and_dmin.x * float(scale_and_min & 0xF);
        offset = -(d_and_dmin.y * float(scale_and_min >> 4));  // w = scale * q - dmin * min
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(block.qs + 32 * h + first);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const std::uint32_t word = words[k] >> shift;
#pragma unroll
            for (int byte = 0; byte < 4; ++byte) q[4 * k + byte] = float((word >> (8 * byte)) & 3);
        }
    }
};

struct Q3_K {  // one 16-value sub-block (one scale) of a 110-byte super-block per chunk
    static constexpr int VALUES = QK_K / 16;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ3_K& block = reinterpret_cast<const BlockQ3_K*>(row)[chunk / 16];
        const int sub_block = chunk % 16;
        const int h = sub_block / 8;           // the half of the super-block (layout at BlockQ3_K)
        const int group = sub_block % 8 / 2;  // which of the half's four 32-value groups
        const int first = 16 * (sub_block % 2);
        scale = __half2float(block.d) * float(q3_k_scale(block.scales, sub_block));
        offset = 0.0f;
        // 110-byte blocks: 2-byte boundary only. 16 bytes of qs (two bits each) and 16 of hmask (one bit each,
        // bit 4h + group), as eight two-byte words each.
        const std::uint16_t* low_words = reinterpret_cast<const std::uint16_t*>(block.qs + 32 * h + first);
        const std::uint16_t* high_words = reinterpret_cast<const std::uint16_t*>(block.hmask + first);
        const int low_shift = 2 * group;
        const int high_shift = 4 * h + group;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned low = low_words[k] >> low_shift;
            const unsigned high = high_words[k] >> high_shift;
            q[2 * k] = float(int((low & 3) | ((high & 1) << 2)) - 4);
            q[2 * k + 1] = float(int(((low >> 8) & 3) | (((high >> 8) & 1) << 2)) - 4);
        }
    }
};

struct Q4_K {  // one 32-value sub-block of a 144-byte super-block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = true;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ4_K& block = reinterpret_cast<const BlockQ4_K*>(row)[chunk / 8];
        const int sub_block = chunk % 8;
        int sub_scale, sub_min;
        q4_k_scale_min(block.scales, sub_block, sub_scale, sub_min);
        // 144-byte blocks keep the row's 4-byte alignment: d and dmin in one load, the nibbles in eight.
        const float2 d_and_dmin = __half22float2(*reinterpret_cast<const __half2*>(&block.d));
        scale = d_and_dmin.x * float(sub_scale);
        offset = -(d_and_dmin.y * float(sub_min));  // w = scale * q - dmin * min
        // Sub-blocks 2g and 2g + 1 share bytes 32g .. 32g + 31 of qs: the low nibbles, then the high.
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(block.qs + 32 * (sub_block / 2));
        const int shift = 4 * (sub_block % 2);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const std::uint32_t word = words[k] >> shift;
#pragma unroll
            for (int byte = 0; byte < 4; ++byte) q[4 * k + byte] = float((word >> (8 * byte)) & 0xF);
        }
    }
};

struct Q5_K {  // one 32-value sub-block of a 176-byte super-block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = true;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ5_K& block = reinterpret_cast<const BlockQ5_K*>(row)[chunk / 8];
        const int sub_block = chunk % 8;
        int sub_scale, sub_min;
        q4_k_scale_min(block.scales, sub_block, sub_scale, sub_min);
        // 176-byte blocks keep the row's 4-byte alignment, as Q4_K's.
        const float2 d_and_dmin = __half22float2(*reinterpret_cast<const __half2*>(&block.d));
        scale = d_and_dmin.x * float(sub_scale);
        offset = -(d_and_dmin.y * float(sub_min));
        // Q4_K's nibbles, and the fifth bits: bit sub_block of qh[0 .. 31].
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(block.qs + 32 * (sub_block / 2));
        const std::uint32_t* fifth_words = reinterpret_cast<const std::uint32_t*>(block.qh);
        const int shift = 4 * (sub_block % 2);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const std::uint32_t word = words[k] >> shift;
            const std::uint32_t fifth = fifth_words[k] >> sub_block;
#pragma unroll
            for (int byte = 0; byte < 4; ++byte)
                q[4 * k + byte] = float(((word >> (8 * byte)) & 0xF) | ((fifth >> (8 * byte)) & 1) << 4);
        }
    }
};

struct Q6_K {  // one 16-value sub-block (one scale) of a 210-byte super-block per chunk
    static constexpr int VALUES = QK_K / 16;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockQ6_K& block = reinterpret_cast<const BlockQ6_K*>(row)[chunk / 16];
        const int sub_block = chunk % 16;
        const int h = sub_block / 8;             // the half of the super-block (layout at BlockQ6_K)
        const int group = sub_block % 8 / 2;     // which of the half's four 32-value groups
        const int first = 16 * (sub_block % 2);  // the sub-block's first value within its group
        scale = __half2float(block.d) * float(block.scales[sub_block]);
        offset = 0.0f;
        // 210-byte blocks: 2-byte boundary only. 16 bytes of ql (the low four bits) and 16 of qh (two bits
        // each), as eight two-byte words each.
        const std::uint16_t* low_words =
            reinterpret_cast<const std::uint16_t*>(block.ql + 64 * h + 32 * (group % 2) + first);
        const std::uint16_t* high_words = reinterpret_cast<const std::uint16_t*>(block.qh + 32 * h + first);
        const int low_shift = 4 * (group / 2);
        const int high_shift = 2 * group;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned low = low_words[k] >> low_shift;
            const unsigned high = high_words[k] >> high_shift;
            q[2 * k] = float(int((low & 0xF) | ((high & 3) << 4)) - 32);
            q[2 * k + 1] = float(int(((low >> 8) & 0xF) | (((high >> 8) & 3) << 4)) - 32);
        }
    }
};

struct IQ4_XS {  // one 32-value sub-block of a 136-byte super-block per chunk
    static constexpr int VALUES = QK;
    static constexpr bool HAS_OFFSET = false;
    __device__ static void load(const std::uint8_t* row, int chunk, float (&q)[VALUES], float& scale,
                                float& offset) {
        const BlockIQ4_XS& block = reinterpret_cast<const BlockIQ4_XS*>(row)[chunk / 8];
        const int sub_block = chunk % 8;
        scale = __half2float(block.d) * float(iq4_xs_scale(block.scales_h, block.scales_l[sub_block / 2], sub_block));
        offset = 0.0f;
        // 136-byte blocks keep the row's 4-byte alignment: the sub-block's 16 bytes, an IQ4_NL block's, in four.
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(block.qs + 16 * sub_block);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            std::uint32_t low, high;
            iq4_nl_levels(words[k], low, high);
            levels_to_floats(low, q + 4 * k);
            levels_to_floats(high, q + 16 + 4 * k);
        }
    }
};

// VALUES consecutive activations: 16-byte loads when the chunk allows (the launcher checked alignment).
template <int VALUES>
__device__ __forceinline__ void load_activations(const float* x, float (&v)[VALUES]) {
    if constexpr (VALUES % 4 == 0) {
#pragma unroll
        for (int k = 0; k < VALUES / 4; ++k) {
            const float4 four = reinterpret_cast<const float4*>(x)[k];
            v[4 * k] = four.x;
            v[4 * k + 1] = four.y;
            v[4 * k + 2] = four.z;
            v[4 * k + 3] = four.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < VALUES; ++k) v[k] = x[k];
    }
}

// Block: (32, ROWS_PER_BLOCK) threads, threadIdx.x the lane, threadIdx.y the warp (= the output row).
template <class Format, int TOKENS>
__global__ void __launch_bounds__(ROWS_PER_BLOCK * WARP_SIZE)
    matmul_warp_per_row(const std::uint8_t* __restrict__ weight, long long row_bytes, const float* __restrict__ x,
                        float* __restrict__ y, int in_features, int out_features, int n_tokens) {
    const int lane = threadIdx.x;
    const int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
    const int first_token = blockIdx.y * TOKENS;
    if (row >= out_features) return;  // the whole warp leaves together, so the shuffles below stay complete
    const int tokens = min(TOKENS, n_tokens - first_token);
    const std::uint8_t* weight_row = weight + row * row_bytes;
    const int n_chunks = in_features / Format::VALUES;

    float partial[TOKENS] = {};
    for (int chunk = lane; chunk < n_chunks; chunk += WARP_SIZE) {
        float q[Format::VALUES];
        float scale, offset;
        Format::load(weight_row, chunk, q, scale, offset);
#pragma unroll
        for (int t = 0; t < TOKENS; ++t) {
            if (t >= tokens) break;
            float xs[Format::VALUES];
            load_activations<Format::VALUES>(
                x + std::size_t(first_token + t) * in_features + std::size_t(chunk) * Format::VALUES, xs);
            float q_dot_x = 0.0f, sum_x = 0.0f;
#pragma unroll
            for (int j = 0; j < Format::VALUES; ++j) {
                q_dot_x += q[j] * xs[j];
                if (Format::HAS_OFFSET) sum_x += xs[j];
            }
            partial[t] += Format::HAS_OFFSET ? scale * q_dot_x + offset * sum_x : scale * q_dot_x;
        }
    }
#pragma unroll
    for (int t = 0; t < TOKENS; ++t) {
        if (t >= tokens) break;  // `tokens` is the same for the whole warp: every lane shuffles or none
        const float sum = warp_sum(partial[t]);
        if (lane == 0) y[std::size_t(first_token + t) * out_features + row] = sum;
    }
}

template <class Format>
cudaError_t launch_format(const void* weight, long long row_bytes, const float* x, float* y, int in_features,
                          int out_features, int n_tokens, cudaStream_t stream) {
    const auto* w = static_cast<const std::uint8_t*>(weight);
    const dim3 block(WARP_SIZE, ROWS_PER_BLOCK);
    if (n_tokens == 1) {
        // GEMV. grid.x: ceil(out_features / 4) blocks of 4 warps, one warp per output row.
        const dim3 grid(ceil_div(out_features, ROWS_PER_BLOCK));
        matmul_warp_per_row<Format, 1>
            <<<grid, block, 0, stream>>>(w, row_bytes, x, y, in_features, out_features, n_tokens);
    } else {
        // grid.x: ceil(out_features / 4) blocks of 4 warps, one warp per output row;
        // grid.y: ceil(n_tokens / 8) groups of 8 tokens, which each warp handles together.
        const dim3 grid(ceil_div(out_features, ROWS_PER_BLOCK), ceil_div(n_tokens, TOKENS_PER_WARP));
        matmul_warp_per_row<Format, TOKENS_PER_WARP>
            <<<grid, block, 0, stream>>>(w, row_bytes, x, y, in_features, out_features, n_tokens);
    }
    return cudaGetLastError();
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" int minfer_kernel_type_count() { return static_cast<int>(std::size(KERNEL_TYPES)); }
extern "C" const char* minfer_kernel_type_name(int index) { return KERNEL_TYPES[index].name; }
extern "C" int minfer_kernel_type_id(int index) { return KERNEL_TYPES[index].id; }
extern "C" long long minfer_row_bytes(int type, long long n_values) { return row_bytes(type, n_values); }

extern "C" cudaError_t launch_matmul(const void* weight, int type, const float* x, float* y, int in_features,
                                     int out_features, int n_tokens, cudaStream_t stream) {
    const long long bytes = row_bytes(type, in_features);
    if (bytes < 0) return minfer_refuse(MINFER_TYPES_AND_ROWS ", in_features the row length");
    if (!is_aligned(weight, 4)) return minfer_refuse("weight must be 4-byte aligned");
    // The 16-byte loads need 16-byte aligned rows: an aligned base and a row length that keeps it.
    const bool wide_x = is_aligned(x, 16);
    const bool wide_w = is_aligned(weight, 16);
    switch (type) {
        case GGML_F32:
            if (wide_x && wide_w && in_features % 4 == 0)
                return launch_format<F32x4>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
            return launch_format<F32x1>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_F16:
            if (wide_x && wide_w && in_features % 8 == 0)
                return launch_format<F16x8>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
            return launch_format<F16x1>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_BF16:
            if (wide_x && wide_w && in_features % 8 == 0)
                return launch_format<BF16x8>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
            return launch_format<BF16x1>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        default:
            break;
    }
    if (!wide_x) return minfer_refuse("x must be 16-byte aligned for quantized weights");
    switch (type) {
        case GGML_Q4_0: return launch_format<Q4_0>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q4_1: return launch_format<Q4_1>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q5_0: return launch_format<Q5_0>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q5_1: return launch_format<Q5_1>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q8_0: return launch_format<Q8_0>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q2_K: return launch_format<Q2_K>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q3_K: return launch_format<Q3_K>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q4_K: return launch_format<Q4_K>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q5_K: return launch_format<Q5_K>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q6_K: return launch_format<Q6_K>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_IQ4_NL:
            return launch_format<IQ4_NL>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_IQ4_XS:
            return launch_format<IQ4_XS>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        default: return minfer_refuse("no matmul kernel for this GGML type");
    }
}
