// Matrix-vector products for one token (decode), with the work around them fused in:
//
//     y = W norm(x)      norm: RMSNorm with its weight, or nothing
//     then one epilogue: store y (plus a residual), SwiGLU or GeGLU of a gate/up pair, or bias + RoPE +
//     KV-cache store
//
// W is read in its GGUF byte layout (ggml_formats.cuh), as in matmul.cu. At one token every weight is
// used exactly once, so the kernel's job is to stream W at memory bandwidth; and because a decode step is
// a chain of short launches (122 on Qwen2.5-0.5B: `minfer graph --tokens 1 --backend cuda`), folding the
// small ops around a GEMV into it (the norm before, the add, activation, rotation and store after) removes
// whole launches from every layer.
//
// Work split. The rows of W are cut into groups of ROWS rows (the epilogue says which rows: consecutive
// ones, a gate row and its up row, the two dimensions of a RoPE pair). A group belongs to one warp, or for
// long rows to a few warps of one block that split the row and add up through shared memory. A row is
// walked in steps of 256 values; in a step lane l takes a chunk of 8 values of each of the group's rows
// (where the 8 sit depends on the format: two runs of 4, see each format's activation_offset), loads the 8
// matching activations once and uses them for all ROWS rows. The 32 lanes of a warp cover one step of a
// row: one contiguous stretch of its bytes, so the loads are coalesced. A lane loads the weights of up to
// 4 steps before it uses any (`Raw`, batch), so a warp has its whole short row in flight at once: a GEMV
// over 896-value rows costs one memory round trip, not four. Where that batch is the warp's whole share of a
// row of up to two rows' groups, its activations go out a step ahead of the dots that use them (X_AHEAD,
// where the registers cost no wave: launch_format), which keeps their round trips behind the step before.
//
// The norm costs no extra pass. RMSNorm scales x by one number, inv_rms = 1 / sqrt(mean(x^2) + eps), so
//     W (x * inv_rms * g) = inv_rms * (W (x * g)):
// the lanes multiply by x * g, add up x^2 on the way (they read every value of x exactly once per group),
// and the group scales its sums by inv_rms at the end. No block-wide reduction before the product.
//
// A launch over parts of different types picks the format per group at run time (uniform across the
// group): llama-quantize's mixes (Q4_K_M, Q5_K_M, Q3_K_M, IQ4_XS, ...) store attn_q and attn_k in one type
// and attn_v in another, and the fused QKV projection still is one kernel, compiled for the mix's two formats
// (FormatPair) or, for any other mix, all of them (FormatPerGroup). Launches of one type are compiled for it.
//
// Decoding without integer-to-float conversions (a quarter-rate instruction): a 2- to 8-bit value is
// OR-ed into the low mantissa bits of the half 1024.0 (bits 0x6400), which gives the half 1024 + value
// exactly; one half2 subtraction removes 1024 (and the format's zero point), still exactly, since every
// number involved is an integer below 2048; the half-to-float conversion is exact and cheap. (IQ4_NL's and
// IQ4_XS's nibbles are first looked up as their int8 levels, iq4_nl_levels; a bfloat16 is the top of a float
// already.) The decoded weights are therefore exactly gguf.quants' values, and the products and sums are
// float32.
//
// Launches are overlapped (common.cuh: launch_overlapped): before waiting for the previous kernel, a
// group prefetches its rows of W into L2 and loads its first batch of them into registers (weights do not
// depend on it); after the wait x's loads stand before the first dots, and only L2 hits after them.
//
// Every launcher first offers its launch to gemv_int8.cu (int8_launch): on sm_90+ the products of many weights
// an SM (the output head, a 1B model's gate|up and ffn_down) in a quantized format run there, on the integer
// tensor cores, with the same epilogue (gemv_epilogues.cuh); everything else runs here.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "gemv_epilogues.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int VALUES_PER_LANE = 8;
constexpr int STEP_VALUES = WARP_SIZE * VALUES_PER_LANE;  // 256 values of a row per warp step
constexpr int BLOCKS_PER_STEP = STEP_VALUES / QK;         // 8 blocks of 32 per step (one K-quant super-block)
constexpr int GEMV_MAX_WARPS = 8;                         // warps of a block, whatever the split
constexpr int GROUPS_PER_BLOCK = 4;                       // warps (groups) per block when a warp owns a group
constexpr int STEPS_PER_WARP = 4;                         // a split row gives each warp about this many steps
constexpr int RAW_BUDGET = 32;  // registers a lane may hold for loaded, not yet used weights (see batch_steps)
constexpr int LINE_BYTES = 128;

// The 8 activations lane l multiplies with its 8 weights of every row in one step: run 0 is v[0..3],
// run 1 is v[4..7] (4 consecutive values each), with each run's sum (the formats with an offset or a min
// need it) and the sum of squares of the raw x values (the norm).
struct Activations {
    float v[VALUES_PER_LANE];
    float run_sum[2];
    float x_squares;
};

__device__ __forceinline__ __half2 as_half2(std::uint32_t bits) {
    __half2 h;
    memcpy(&h, &bits, sizeof h);
    return h;
}

// Half-precision constants as bit patterns, pairs of them as one word (a half2 built with
// __float2half2_rn would be converted at run time, in every step):
constexpr std::uint32_t HALF2_1024 = 0x64006400u;  // 1024.0, 1024.0
constexpr std::uint32_t HALF2_1028 = 0x64046404u;  // 1024 + 4: Q3_K's zero point
constexpr std::uint32_t HALF2_1032 = 0x64086408u;  // 1024 + 8: Q4_0's zero point 8 removed too
constexpr std::uint32_t HALF2_1040 = 0x64106410u;  // 1024 + 16: Q5_0's zero point
constexpr std::uint32_t HALF2_1056 = 0x64206420u;  // 1024 + 32: Q6_K's zero point
constexpr std::uint32_t HALF2_1152 = 0x64806480u;  // 1024 + 128: the +128 bias of Q8_0's and IQ4's bytes

// Two 4-bit values at bits [0, 4) and [16, 20) of `bits`, minus the format's zero point, as exact floats
// (one LOP3 and one HSUB2 for two values). `zero_plus_1024` is the half2 bit pattern of 1024 + zero point.
__device__ __forceinline__ float2 nibble_pair(std::uint32_t bits, std::uint32_t zero_plus_1024) {
    return __half22float2(__hsub2(as_half2((bits & 0x000F000Fu) | HALF2_1024), as_half2(zero_plus_1024)));
}

// The two runs of a word of 4 nibble bytes: run 0 = sum_j (low nibble of byte j - zero) * v[j], run 1 =
// sum_j (high nibble of byte j - zero) * v[4 + j].
__device__ __forceinline__ float2 nibble_dots(std::uint32_t word, std::uint32_t zero_plus_1024, const float* v) {
    const float2 low_02 = nibble_pair(word, zero_plus_1024);         // low nibbles of bytes 0 and 2
    const float2 low_13 = nibble_pair(word >> 8, zero_plus_1024);    // low nibbles of bytes 1 and 3
    const float2 high_02 = nibble_pair(word >> 4, zero_plus_1024);   // high nibbles of bytes 0 and 2
    const float2 high_13 = nibble_pair(word >> 12, zero_plus_1024);  // high nibbles of bytes 1 and 3
    return make_float2(low_02.x * v[0] + low_13.x * v[1] + low_02.y * v[2] + low_13.y * v[3],
                       high_02.x * v[4] + high_13.x * v[5] + high_02.y * v[6] + high_13.y * v[7]);
}

// Two unsigned bytes of `word` minus the format's zero point, as exact floats: the __byte_perm `selector` (0x4140:
// bytes 0 and 1, 0x4342: bytes 2 and 3, 0x4240: bytes 0 and 2) puts each under the half exponent byte 0x64
// (1024 + byte).
__device__ __forceinline__ float2 byte_pair(std::uint32_t word, std::uint32_t selector, std::uint32_t zero_plus_1024) {
    return __half22float2(__hsub2(as_half2(__byte_perm(word, 0x64646464u, selector)), as_half2(zero_plus_1024)));
}

// sum_j (byte_j - zero) * v[j] over the 4 unsigned bytes of `word`.
__device__ __forceinline__ float byte_dot(std::uint32_t word, std::uint32_t zero_plus_1024, const float* v) {
    const float2 bytes_01 = byte_pair(word, 0x4140u, zero_plus_1024);
    const float2 bytes_23 = byte_pair(word, 0x4342u, zero_plus_1024);
    return bytes_01.x * v[0] + bytes_01.y * v[1] + bytes_23.x * v[2] + bytes_23.y * v[3];
}

// sum_j q_j * v[j] over the 4 signed bytes q_j of `word` (Q8_0's quants, IQ4_NL's levels): XOR 0x80 turns
// each into the unsigned q + 128, which byte_dot takes back off.
__device__ __forceinline__ float signed_byte_dot(std::uint32_t word, const float* v) {
    return byte_dot(word ^ 0x80808080u, HALF2_1152, v);
}

// Loads that read each weight once: __ldcs (evict-first) keeps them from pushing x out of the caches.
__device__ __forceinline__ unsigned short load_u16(const void* p) {
    return __ldcs(static_cast<const unsigned short*>(p));
}
__device__ __forceinline__ std::uint32_t load_u32(const void* p) {
    return __ldcs(static_cast<const unsigned int*>(p));
}
// Two 2-byte loads as one word: the 18-, 22-, 34- and 210-byte blocks keep their bytes on a 2-byte boundary.
__device__ __forceinline__ std::uint32_t load_word_2aligned(const std::uint8_t* bytes) {
    return std::uint32_t(load_u16(bytes)) | (std::uint32_t(load_u16(bytes + 2)) << 16);
}

// ---- Weight formats --------------------------------------------------------------------------------------
//
// Each format says, for lane l of a step: where its two runs of 4 activations sit in the step
// (activation_offset), which bytes it loads (load -> Raw, issued before any is used) and how they
// combine with the activations (dot: sum_j w_j * a.v[j] over the 8 weights). RAW_WORDS is the size of Raw
// in registers. Steps are 256 values: 8 blocks of 32, or one super-block (the K-quants, IQ4_XS).

// The block formats with nibbles: lane l takes bytes 4(l % 4) .. 4(l % 4) + 3 of block l / 4 of the step,
// whose low nibbles are values 4(l % 4) + 0..3 of the block (run 0) and high nibbles 16 + the same (run 1).
__device__ __forceinline__ int nibble_block_offset(int lane, int run) {
    return (lane / 4) * QK + (lane % 4) * 4 + run * (QK / 2);
}

struct GemvF32 {
    struct Raw {
        float4 low, high;
    };
    static constexpr int RAW_WORDS = 8;
    __device__ static int activation_offset(int lane, int run) { return lane * VALUES_PER_LANE + run * 4; }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        const float4* w = reinterpret_cast<const float4*>(row) + (step * STEP_VALUES + lane * VALUES_PER_LANE) / 4;
        return {__ldcs(w), __ldcs(w + 1)};
    }
    __device__ static float dot(const Raw& w, const Activations& a) {
        return w.low.x * a.v[0] + w.low.y * a.v[1] + w.low.z * a.v[2] + w.low.w * a.v[3] + w.high.x * a.v[4] +
               w.high.y * a.v[5] + w.high.z * a.v[6] + w.high.w * a.v[7];
    }
};

struct GemvF16 {
    using Raw = uint4;  // 8 halves
    static constexpr int RAW_WORDS = 4;
    __device__ static int activation_offset(int lane, int run) { return lane * VALUES_PER_LANE + run * 4; }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        return __ldcs(reinterpret_cast<const uint4*>(row) + step * WARP_SIZE + lane);
    }
    __device__ static float dot(const Raw& w, const Activations& a) {
        const float2 w01 = __half22float2(as_half2(w.x)), w23 = __half22float2(as_half2(w.y));
        const float2 w45 = __half22float2(as_half2(w.z)), w67 = __half22float2(as_half2(w.w));
        return w01.x * a.v[0] + w01.y * a.v[1] + w23.x * a.v[2] + w23.y * a.v[3] + w45.x * a.v[4] + w45.y * a.v[5] +
               w67.x * a.v[6] + w67.y * a.v[7];
    }
};

struct GemvBF16 {
    using Raw = uint4;  // 8 bfloat16
    static constexpr int RAW_WORDS = 4;
    __device__ static int activation_offset(int lane, int run) { return lane * VALUES_PER_LANE + run * 4; }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        return __ldcs(reinterpret_cast<const uint4*>(row) + step * WARP_SIZE + lane);
    }
    // Word k holds values 2k (its low half) and 2k + 1 (its high half), as exact floats.
    __device__ static float pair_dot(std::uint32_t word, float first, float second) {
        return bf16_bits_to_float(word & 0xFFFFu) * first + __uint_as_float(word & 0xFFFF0000u) * second;
    }
    __device__ static float dot(const Raw& w, const Activations& a) {
        return pair_dot(w.x, a.v[0], a.v[1]) + pair_dot(w.y, a.v[2], a.v[3]) + pair_dot(w.z, a.v[4], a.v[5]) +
               pair_dot(w.w, a.v[6], a.v[7]);
    }
};

struct GemvQ4_0 {  // w = d * (nibble - 8)
    struct Raw {
        unsigned short d;
        std::uint32_t qs;
    };
    static constexpr int RAW_WORDS = 2;
    __device__ static int activation_offset(int lane, int run) { return nibble_block_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        const BlockQ4_0* block = reinterpret_cast<const BlockQ4_0*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        return {load_u16(&block->d), load_word_2aligned(block->qs + 4 * (lane % 4))};
    }
    __device__ static float dot(const Raw& w, const Activations& a) {
        const float2 runs = nibble_dots(w.qs, HALF2_1032, a.v);
        return half_bits_to_float(w.d) * (runs.x + runs.y);
    }
};

struct GemvQ4_1 {  // w = d * nibble + m; 20-byte blocks keep a 4-byte boundary
    struct Raw {
        std::uint32_t d_and_m, qs;
    };
    static constexpr int RAW_WORDS = 2;
    __device__ static int activation_offset(int lane, int run) { return nibble_block_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        const BlockQ4_1* block = reinterpret_cast<const BlockQ4_1*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        return {load_u32(block), load_u32(block->qs + 4 * (lane % 4))};
    }
    __device__ static float dot(const Raw& w, const Activations& a) {
        const float2 d_and_m = __half22float2(as_half2(w.d_and_m));
        const float2 runs = nibble_dots(w.qs, HALF2_1024, a.v);
        return d_and_m.x * (runs.x + runs.y) + d_and_m.y * (a.run_sum[0] + a.run_sum[1]);
    }
};

struct GemvQ5_0 {  // w = d * (nibble + 16 * fifth bit - 16)
    struct Raw {
        unsigned short d;
        std::uint32_t qh, qs;
    };
    static constexpr int RAW_WORDS = 3;
    __device__ static int activation_offset(int lane, int run) { return nibble_block_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        const BlockQ5_0* block = reinterpret_cast<const BlockQ5_0*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        return {load_u16(&block->d), load_word_2aligned(block->qh), load_word_2aligned(block->qs + 4 * (lane % 4))};
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const int first = 4 * (lane % 4);  // this lane's values first .. first + 3 and 16 + the same
        const std::uint32_t low = (w.qs & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> first);
        const std::uint32_t high = ((w.qs >> 4) & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> (16 + first));
        return half_bits_to_float(w.d) * (byte_dot(low, HALF2_1040, a.v) + byte_dot(high, HALF2_1040, a.v + 4));
    }
};

struct GemvQ5_1 {  // w = d * (nibble + 16 * fifth bit) + m; 24-byte blocks keep a 4-byte boundary
    struct Raw {
        std::uint32_t d_and_m, qh, qs;
    };
    static constexpr int RAW_WORDS = 3;
    __device__ static int activation_offset(int lane, int run) { return nibble_block_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        const BlockQ5_1* block = reinterpret_cast<const BlockQ5_1*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        return {load_u32(block), load_u32(block->qh), load_u32(block->qs + 4 * (lane % 4))};
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const int first = 4 * (lane % 4);  // this lane's values first .. first + 3 and 16 + the same
        const std::uint32_t low = (w.qs & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> first);
        const std::uint32_t high = ((w.qs >> 4) & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> (16 + first));
        const float2 d_and_m = __half22float2(as_half2(w.d_and_m));
        return d_and_m.x * (byte_dot(low, HALF2_1024, a.v) + byte_dot(high, HALF2_1024, a.v + 4)) +
               d_and_m.y * (a.run_sum[0] + a.run_sum[1]);
    }
};

struct GemvQ8_0 {  // w = d * q, q a signed byte; lane l takes values 8l .. 8l + 7 of the step
    struct Raw {
        unsigned short d;
        std::uint32_t low, high;
    };
    static constexpr int RAW_WORDS = 3;
    __device__ static int activation_offset(int lane, int run) { return lane * VALUES_PER_LANE + run * 4; }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        const BlockQ8_0* block = reinterpret_cast<const BlockQ8_0*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        const auto* qs = reinterpret_cast<const std::uint8_t*>(block->qs) + 8 * (lane % 4);
        return {load_u16(&block->d), load_word_2aligned(qs), load_word_2aligned(qs + 4)};
    }
    __device__ static float dot(const Raw& w, const Activations& a) {
        return half_bits_to_float(w.d) * (signed_byte_dot(w.low, a.v) + signed_byte_dot(w.high, a.v + 4));
    }
};

struct GemvIQ4_NL {  // w = d * IQ4_NL_VALUES[nibble]; the nibbles placed as Q4_0's
    struct Raw {
        unsigned short d;
        std::uint32_t qs;
    };
    static constexpr int RAW_WORDS = 2;
    __device__ static int activation_offset(int lane, int run) { return nibble_block_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        const BlockIQ4_NL* block = reinterpret_cast<const BlockIQ4_NL*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        return {load_u16(&block->d), load_word_2aligned(block->qs + 4 * (lane % 4))};
    }
    __device__ static float dot(const Raw& w, const Activations& a) {
        std::uint32_t low, high;
        iq4_nl_levels(w.qs, low, high);
        return half_bits_to_float(w.d) * (signed_byte_dot(low, a.v) + signed_byte_dot(high, a.v + 4));
    }
};

// Q2_K and Q3_K, one super-block per step. Lane l: half h = l / 16 of the super-block, p = (l % 16) / 8 and
// i = 4 (l % 8). The qs bytes 32h + i .. + 3 hold, at bits 4p, 4p + 1, values 128h + 64p + i + 0..3 (run 0)
// and, at bits 4p + 2, 4p + 3, values 128h + 64p + 32 + i + 0..3 (run 1): groups 2p and 2p + 1 of the half
// (the layouts at BlockQ2_K and BlockQ3_K), and sub-blocks 8h + 4p + i / 16 and that + 2.
__device__ __forceinline__ int two_bit_activation_offset(int lane, int run) {
    return 128 * (lane / 16) + 64 * ((lane % 16) / 8) + 4 * (lane % 8) + 32 * run;
}

// w = d * scale_s * q - dmin * min_s, the sub-block's scale and min the nibbles of scales[s].
struct GemvQ2_K {
    struct Raw {
        std::uint32_t scales;  // scales[8h + 4p .. + 3]: this lane's sub-blocks are bytes i / 16 and i / 16 + 2
        std::uint32_t qs;
        std::uint32_t d_and_dmin;
    };
    static constexpr int RAW_WORDS = 3;
    __device__ static int activation_offset(int lane, int run) { return two_bit_activation_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        // 84-byte super-blocks keep the weight's 4-byte boundary: every word here is a 4-byte load.
        const BlockQ2_K* block = reinterpret_cast<const BlockQ2_K*>(row) + step;
        const int h = lane / 16, p = (lane % 16) / 8, i = 4 * (lane % 8);
        return {load_u32(block->scales + 8 * h + 4 * p), load_u32(block->qs + 32 * h + i), load_u32(&block->d)};
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const int p = (lane % 16) / 8, s = (lane % 8) / 4;  // s = i / 16
        const std::uint32_t q0 = (w.qs >> (4 * p)) & 0x03030303u;
        const std::uint32_t q1 = (w.qs >> (4 * p + 2)) & 0x03030303u;
        const std::uint32_t scale_and_min0 = (w.scales >> (8 * s)) & 0xFFu;
        const std::uint32_t scale_and_min1 = (w.scales >> (8 * s + 16)) & 0xFFu;
        const float2 d_and_dmin = __half22float2(as_half2(w.d_and_dmin));
        return d_and_dmin.x * (float(scale_and_min0 & 0xF) * byte_dot(q0, HALF2_1024, a.v) +
                               float(scale_and_min1 & 0xF) * byte_dot(q1, HALF2_1024, a.v + 4)) -
               d_and_dmin.y * (float(scale_and_min0 >> 4) * a.run_sum[0] + float(scale_and_min1 >> 4) * a.run_sum[1]);
    }
};

// w = d * scale_s * (q - 4): q's low two bits as Q2_K's, its third bit bit 4h + 2p (run 0) or 4h + 2p + 1
// (run 1) of the hmask bytes i .. i + 3; scale_s from q3_k_scale.
struct GemvQ3_K {
    struct Raw {
        std::uint32_t hmask, qs;
        std::uint32_t low_scales;   // scales[4p .. 4p + 3]: the low bits of its sub-blocks in bytes i / 16, i / 16 + 2
        std::uint32_t high_scales;  // scales[8 .. 11]: their top bits, in the same bytes
        unsigned short d;
    };
    static constexpr int RAW_WORDS = 5;
    __device__ static int activation_offset(int lane, int run) { return two_bit_activation_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        // 110-byte super-blocks: only a 2-byte boundary.
        const BlockQ3_K* block = reinterpret_cast<const BlockQ3_K*>(row) + step;
        const int h = lane / 16, p = (lane % 16) / 8, i = 4 * (lane % 8);
        return {load_word_2aligned(block->hmask + i), load_word_2aligned(block->qs + 32 * h + i),
                load_word_2aligned(block->scales + 4 * p), load_word_2aligned(block->scales + 8), load_u16(&block->d)};
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const int h = lane / 16, p = (lane % 16) / 8, s = (lane % 8) / 4;
        const int bit = 4 * h + 2 * p;  // run 0's hmask bit; run 1's is the next
        const std::uint32_t q0 = ((w.qs >> (4 * p)) & 0x03030303u) | (((w.hmask >> bit) & 0x01010101u) << 2);
        const std::uint32_t q1 = ((w.qs >> (4 * p + 2)) & 0x03030303u) | (((w.hmask >> (bit + 1)) & 0x01010101u) << 2);
        // Sub-blocks 8h + 4p + s (run 0) and that + 2 (run 1): both scales at once, bytes 0 and 2 of one word, made
        // exact floats through the half 1024 (minus 1024 + 32, their zero point) instead of two integer conversions.
        const std::uint32_t scale_pair = q3_k_scale_pair(w.low_scales, w.high_scales, 8 * h + 4 * p + s);
        const float2 scale = byte_pair(scale_pair, 0x4240u, HALF2_1056);
        return half_bits_to_float(w.d) *
               (scale.x * byte_dot(q0, HALF2_1028, a.v) + scale.y * byte_dot(q1, HALF2_1028, a.v + 4));
    }
};

// The K-quant header (Q4_K's and Q5_K's first 16 bytes: d and dmin, then the 12 scale bytes) held a word a lane:
// lane l loads word l % 4, and each lane gathers the four from its quad (shuffles within 4 lanes) once the loads
// are back. Every lane needs all four words, but holding them from load to use cost a step 4 registers a row:
// with RAW_BUDGET 32, a gate|up group (4 rows) of Q4_K loaded one step a batch (Q4_0's 4), so a 1024-value row
// took four round trips to memory; one word a lane lets it load 4 steps a batch, like Q4_0. A step's lanes are all
// valid or all not (K-quant rows are whole super-blocks), so the quad's shuffles always find their partners.
struct KQuantHeader {
    std::uint32_t d_and_dmin;
    std::uint32_t scales[3];

    __device__ static std::uint32_t load(const std::uint8_t* block, int lane) {
        return load_u32(block + 4 * (lane % 4));
    }
    __device__ static KQuantHeader gather(std::uint32_t word) {
        return {__shfl_sync(FULL_WARP, word, 0, 4),
                {__shfl_sync(FULL_WARP, word, 1, 4), __shfl_sync(FULL_WARP, word, 2, 4),
                 __shfl_sync(FULL_WARP, word, 3, 4)}};
    }
};

// Q4_K, one super-block per step. Lane l takes bytes 4(l % 8) .. + 3 of the 32-byte group g = l / 8 of
// qs: low nibbles are values 64g + 4(l % 8) + 0..3 (sub-block 2g, run 0), high nibbles the same + 32
// (sub-block 2g + 1, run 1). w = d * scale_s * q - dmin * min_s.
struct GemvQ4_K {
    struct Raw {
        std::uint32_t header;  // word lane % 4 of the header (KQuantHeader)
        std::uint32_t qs;
    };
    static constexpr int RAW_WORDS = 2;
    __device__ static int activation_offset(int lane, int run) { return 64 * (lane / 8) + 4 * (lane % 8) + 32 * run; }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        // 144-byte super-blocks keep the tensor's 16-byte boundary: every word here is a 4-byte load.
        const BlockQ4_K* block = reinterpret_cast<const BlockQ4_K*>(row) + step;
        return {KQuantHeader::load(reinterpret_cast<const std::uint8_t*>(block), lane),
                load_u32(block->qs + 32 * (lane / 8) + 4 * (lane % 8))};
    }
    // The scales (x: run 0, y: run 1) and mins of the lane's sub-blocks 2(l / 8) and 2(l / 8) + 1, exact floats:
    // both decoded at once (q4_k_scale_min_pair), about a third of the instructions of two q4_k_scale_min.
    __device__ static void sub_block_scales(const std::uint32_t (&scales)[3], int lane, float2& scale, float2& min) {
        std::uint32_t scale_bytes, min_bytes;
        q4_k_scale_min_pair(scales, lane / 8, scale_bytes, min_bytes);
        scale = byte_pair(scale_bytes, 0x4140u, HALF2_1024);
        min = byte_pair(min_bytes, 0x4140u, HALF2_1024);
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const KQuantHeader header = KQuantHeader::gather(w.header);
        float2 scale, min;
        sub_block_scales(header.scales, lane, scale, min);
        const float2 d_and_dmin = __half22float2(as_half2(header.d_and_dmin));
        const float2 runs = nibble_dots(w.qs, HALF2_1024, a.v);
        return d_and_dmin.x * (scale.x * runs.x + scale.y * runs.y) -
               d_and_dmin.y * (min.x * a.run_sum[0] + min.y * a.run_sum[1]);
    }
};

// Q5_K: Q4_K's lanes and scales, and the fifth bits of the lane's values: bits 2g (run 0) and 2g + 1 (run 1)
// of the qh bytes 4(l % 8) .. + 3. w = d * scale_s * q - dmin * min_s.
struct GemvQ5_K {
    struct Raw {
        std::uint32_t header;  // word lane % 4 of the header (KQuantHeader)
        std::uint32_t qh, qs;
    };
    static constexpr int RAW_WORDS = 3;
    __device__ static int activation_offset(int lane, int run) { return GemvQ4_K::activation_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        // 176-byte super-blocks keep the weight's 4-byte boundary: every word here is a 4-byte load.
        const BlockQ5_K* block = reinterpret_cast<const BlockQ5_K*>(row) + step;
        return {KQuantHeader::load(reinterpret_cast<const std::uint8_t*>(block), lane),
                load_u32(block->qh + 4 * (lane % 8)),
                load_u32(block->qs + 32 * (lane / 8) + 4 * (lane % 8))};
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const int s = 2 * (lane / 8);  // sub-blocks s (run 0) and s + 1 (run 1)
        const KQuantHeader header = KQuantHeader::gather(w.header);
        float2 scale, min;
        GemvQ4_K::sub_block_scales(header.scales, lane, scale, min);
        const std::uint32_t q0 = (w.qs & 0x0F0F0F0Fu) | (((w.qh >> s) & 0x01010101u) << 4);
        const std::uint32_t q1 = ((w.qs >> 4) & 0x0F0F0F0Fu) | (((w.qh >> (s + 1)) & 0x01010101u) << 4);
        const float2 d_and_dmin = __half22float2(as_half2(header.d_and_dmin));
        return d_and_dmin.x * (scale.x * byte_dot(q0, HALF2_1024, a.v) + scale.y * byte_dot(q1, HALF2_1024, a.v + 4)) -
               d_and_dmin.y * (min.x * a.run_sum[0] + min.y * a.run_sum[1]);
    }
};

// Q6_K, one super-block per step. Lane l: half h = l / 16 of the super-block, then j = l % 16: for j < 8
// the ql bytes i .. i + 3 (i = 4j) give values 128h + i + 0..3 (low nibbles, qh bits 0-1, run 0) and
// 128h + 64 + i + 0..3 (high nibbles, qh bits 4-5, run 1); for j >= 8 the ql bytes 32 + i .. (i = 4(j - 8))
// give 128h + 32 + i + 0..3 (qh bits 2-3) and 128h + 96 + i + 0..3 (qh bits 6-7). ggml_formats.cuh has the
// layout. w = d * scale * (q - 32).
struct GemvQ6_K {
    struct Raw {
        std::uint32_t ql, qh;
        int scale0, scale1;
        unsigned short d;
    };
    static constexpr int RAW_WORDS = 5;
    __device__ static int activation_offset(int lane, int run) {
        return 128 * (lane / 16) + 32 * ((lane % 16) / 8) + 4 * (lane % 8) + 64 * run;
    }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        // 210-byte super-blocks: only a 2-byte boundary.
        const BlockQ6_K* block = reinterpret_cast<const BlockQ6_K*>(row) + step;
        const int h = lane / 16, upper = (lane % 16) / 8, i = 4 * (lane % 8);
        const int scale = 8 * h + i / 16 + 2 * upper;  // run 0's scale; run 1's is 4 further
        return {load_word_2aligned(block->ql + 64 * h + 32 * upper + i), load_word_2aligned(block->qh + 32 * h + i),
                __ldcs(block->scales + scale), __ldcs(block->scales + scale + 4), load_u16(&block->d)};
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const int shift = 2 * ((lane % 16) / 8);  // qh bits of run 0: shift, shift + 1; of run 1: 4 more
        const std::uint32_t q0 = (w.ql & 0x0F0F0F0Fu) | (((w.qh >> shift) & 0x03030303u) << 4);
        const std::uint32_t q1 = ((w.ql >> 4) & 0x0F0F0F0Fu) | (((w.qh >> (shift + 4)) & 0x03030303u) << 4);
        return half_bits_to_float(w.d) *
               (float(w.scale0) * byte_dot(q0, HALF2_1056, a.v) + float(w.scale1) * byte_dot(q1, HALF2_1056, a.v + 4));
    }
};

// IQ4_XS, one super-block per step: its 8 sub-blocks are laid out as 8 IQ4_NL blocks, so lane l takes bytes
// 4(l % 4) .. + 3 of sub-block l / 4 as GemvIQ4_NL does, with the sub-block's scale in place of the block's d.
// w = d * scale_s * IQ4_NL_VALUES[nibble].
struct GemvIQ4_XS {
    struct Raw {
        std::uint32_t d_and_scales_h, scales_l, qs;
    };
    static constexpr int RAW_WORDS = 3;
    __device__ static int activation_offset(int lane, int run) { return nibble_block_offset(lane, run); }
    __device__ static Raw load(const std::uint8_t* row, int step, int lane) {
        // 136-byte super-blocks keep the weight's 4-byte boundary: every word here is a 4-byte load.
        const BlockIQ4_XS* block = reinterpret_cast<const BlockIQ4_XS*>(row) + step;
        return {load_u32(block), load_u32(block->scales_l), load_u32(block->qs + 16 * (lane / 4) + 4 * (lane % 4))};
    }
    __device__ static float dot(const Raw& w, const Activations& a, int lane) {
        const int s = lane / 4;
        const int scale = iq4_xs_scale(w.d_and_scales_h >> 16, std::uint8_t(w.scales_l >> (8 * (s / 2))), s);
        std::uint32_t low, high;
        iq4_nl_levels(w.qs, low, high);
        return half_bits_to_float(w.d_and_scales_h & 0xFFFFu) * float(scale) *
               (signed_byte_dot(low, a.v) + signed_byte_dot(high, a.v + 4));
    }
};

// Formats whose dot also needs the lane (which sub-block or which bits) get it; the others ignore it.
template <class Format>
__device__ __forceinline__ float format_dot(const typename Format::Raw& w, const Activations& a, int lane) {
    if constexpr (std::is_same_v<Format, GemvQ5_0> || std::is_same_v<Format, GemvQ5_1> ||
                  std::is_same_v<Format, GemvQ2_K> || std::is_same_v<Format, GemvQ3_K> ||
                  std::is_same_v<Format, GemvQ4_K> || std::is_same_v<Format, GemvQ5_K> ||
                  std::is_same_v<Format, GemvQ6_K> || std::is_same_v<Format, GemvIQ4_XS>) {
        return Format::dot(w, a, lane);
    } else {
        return Format::dot(w, a);
    }
}

// x's squares in a run of 4 values, for the norm's mean.
__device__ __forceinline__ float run_squares(const float4& x) {
    return (x.x * x.x + x.y * x.y) + (x.z * x.z + x.w * x.w);
}

// Run `run` of a step's activations: its 4 values v and their sum.
__device__ __forceinline__ void set_run(Activations& a, int run, const float4& v) {
    a.v[4 * run] = v.x;
    a.v[4 * run + 1] = v.y;
    a.v[4 * run + 2] = v.z;
    a.v[4 * run + 3] = v.w;
    a.run_sum[run] = (v.x + v.y) + (v.z + v.w);
}

// Lane `lane`'s activations of step `step`: x * norm_weight (the norm's inv_rms comes at the end), or x, from x's
// two runs (4 consecutive values each, where the format's activation_offset puts them), each loaded where it is
// used.
template <class Format>
__device__ __forceinline__ Activations load_activations(const float* x, const float* norm_weight, int step, int lane) {
    Activations a;
    a.x_squares = 0.0f;
#pragma unroll
    for (int run = 0; run < 2; ++run) {
        const int i = step * STEP_VALUES + Format::activation_offset(lane, run);
        float4 v = *reinterpret_cast<const float4*>(x + i);
        a.x_squares += run_squares(v);
        if (norm_weight != nullptr) {
            const float4 g = *reinterpret_cast<const float4*>(norm_weight + i);
            v = make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
        }
        set_run(a, run, v);
    }
    return a;
}

// The same runs loaded a step before their activations are needed (gemv_group's X_AHEAD): load_activations cut
// in two, its loads, then its math in the same order. load_activations keeps its own order so that the kernels
// without X_AHEAD compile as they did before X_AHEAD (cuobjdump, sm_90a: 151 of 151 the same SASS); passing the
// runs in as lambdas, or a helper that loaded g before squaring x, moved 33 and 71 of them.
struct ActivationLoads {
    float4 x[2];
    float4 g[2];

    template <class Format>
    __device__ __forceinline__ static ActivationLoads load(const float* x, const float* norm_weight, int step,
                                                           int lane) {
        ActivationLoads loads{};
#pragma unroll
        for (int run = 0; run < 2; ++run) {
            const int i = step * STEP_VALUES + Format::activation_offset(lane, run);
            loads.x[run] = *reinterpret_cast<const float4*>(x + i);
            if (norm_weight != nullptr) loads.g[run] = *reinterpret_cast<const float4*>(norm_weight + i);
        }
        return loads;
    }

    __device__ __forceinline__ Activations activations(bool normed) const {
        Activations a;
        a.x_squares = 0.0f;
#pragma unroll
        for (int run = 0; run < 2; ++run) {
            float4 v = x[run];
            a.x_squares += run_squares(v);
            if (normed) v = make_float4(v.x * g[run].x, v.y * g[run].y, v.z * g[run].z, v.w * g[run].w);
            set_run(a, run, v);
        }
        return a;
    }
};

// Steps a lane loads before it uses any: as many as fit RAW_BUDGET registers for the group's `rows` rows of
// `raw_words` words a step, 1 to 4.
__host__ __device__ constexpr int batch_steps(int rows, int raw_words) {
    const int fit = RAW_BUDGET / (rows * raw_words);
    return fit < 1 ? 1 : (fit > 4 ? 4 : fit);
}

// What the kernel knows besides the epilogue.
struct GemvInput {
    const float* x;
    const float* norm_weight;  // nullptr: no norm
    float eps;
    int in_features;
    int warps_per_group;  // 1: a warp owns a group; more: they split its rows and meet in shared memory
};

// One group's ROWS dot products, scaled by the norm, handed to the epilogue. Every warp of the group calls
// it (the same Format: the group's type); with several warps per group it contains __syncthreads(), and
// then the block is that one group.
template <class Format, bool X_AHEAD, class Epilogue>
__device__ __forceinline__ void gemv_group(const GemvInput& in, const Epilogue& epilogue, int group,
                                           int warp_in_group, int lane) {
    constexpr int ROWS = Epilogue::ROWS;
    constexpr int BATCH = batch_steps(ROWS, Format::RAW_WORDS);
    const std::uint8_t* rows[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) rows[k] = epilogue.row(group, k);

    const int n_steps = ceil_div(in.in_features, STEP_VALUES);
    const int stride = in.warps_per_group;
    typename Format::Raw raw[BATCH][ROWS];
    bool valid[BATCH];
    const auto load_batch = [&](int first) {  // the weights of BATCH steps from `first`, into raw
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int step = first + b * stride;
            // Only a row's last step can be partial: a lane past the end of the row sits it out.
            valid[b] = step < n_steps && step * STEP_VALUES + lane * VALUES_PER_LANE < in.in_features;
            if (valid[b]) {
#pragma unroll
                for (int k = 0; k < ROWS; ++k) raw[b][k] = Format::load(rows[k], step, lane);
            }
        }
    };

    // W does not depend on the previous kernel: before waiting for that kernel, the group's rows go into L2
    // and its first batch into registers, so that after the wait only x's loads stand before the first dots.
    const long long row_bytes = epilogue.row_bytes(group);
    const int group_threads = in.warps_per_group * WARP_SIZE;
    for (long long offset = (warp_in_group * WARP_SIZE + lane) * LINE_BYTES; offset < row_bytes;
         offset += group_threads * LINE_BYTES) {
#pragma unroll
        for (int k = 0; k < ROWS; ++k) prefetch_l2(rows[k] + offset);
    }
    load_batch(warp_in_group);
    wait_for_previous_kernel();
    allow_next_kernel();
    // The thread that finishes prepares its epilogue (the position, biases, residuals, the RoPE frequency)
    // now: its loads go out beside x's, instead of following the reduction. (Only loads: what would wait for
    // one, the q|k|v epilogue's position check, is in finish.)
    const bool finishes = warp_in_group == 0 && lane == 0;
    typename Epilogue::Prepared prepared{};
    if (finishes) prepared = epilogue.prepare(group);

    float partial[ROWS] = {};
    float x_squares = 0.0f;
    for (int first = warp_in_group; first < n_steps; first += BATCH * stride) {
        if (first != warp_in_group) load_batch(first);
        // X_AHEAD: x's loads run a step ahead of the dots, so a step's come back while the step before
        // multiplies, where loading each right before its dots waits for L2 once a step (docs/PERFORMANCE.md,
        // sessions 33, 46 and 49; launch_format says where). A step is valid only where every step before it
        // is, so a valid step's loads went out a step earlier.
        ActivationLoads ahead{};
        if constexpr (X_AHEAD) {
            if (valid[0]) ahead = ActivationLoads::load<Format>(in.x, in.norm_weight, first, lane);
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            if (!valid[b]) continue;
            Activations a;
            if constexpr (X_AHEAD) {
                const ActivationLoads loads = ahead;
                if (b + 1 < BATCH && valid[b + 1])
                    ahead = ActivationLoads::load<Format>(in.x, in.norm_weight, first + (b + 1) * stride, lane);
                a = loads.activations(in.norm_weight != nullptr);
            } else {
                a = load_activations<Format>(in.x, in.norm_weight, first + b * stride, lane);
            }
            x_squares += a.x_squares;
#pragma unroll
            for (int k = 0; k < ROWS; ++k) partial[k] += format_dot<Format>(raw[b][k], a, lane);
        }
    }

    float sums[ROWS + 1];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) sums[k] = warp_sum(partial[k]);  // lanes that sat steps out rejoin here
    sums[ROWS] = warp_sum(x_squares);
    if (in.warps_per_group > 1) {
        __shared__ float warp_sums[GEMV_MAX_WARPS][ROWS + 1];
        if (lane == 0) {
#pragma unroll
            for (int k = 0; k <= ROWS; ++k) warp_sums[warp_in_group][k] = sums[k];
        }
        __syncthreads();
        if (warp_in_group != 0) return;
#pragma unroll
        for (int k = 0; k <= ROWS; ++k) {
            sums[k] = 0.0f;
            for (int w = 0; w < in.warps_per_group; ++w) sums[k] += warp_sums[w][k];
        }
    }
    if (!finishes) return;
    if (in.norm_weight != nullptr) {
        const float inv_rms = 1.0f / sqrtf(sums[ROWS] / float(in.in_features) + in.eps);
#pragma unroll
        for (int k = 0; k < ROWS; ++k) sums[k] *= inv_rms;
    }
    float result[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) result[k] = sums[k];
    epilogue.finish(group, result, prepared);
}

// The format of a launch whose groups differ in type (a QKV projection over parts of different types):
// each group reads its type at run time. Every other launch is compiled for its one format, so its
// registers are what that format needs, not the most any format needs.
struct FormatPerGroup {};

// The two-type QKV launches of the presets' mixes (q and k in one type, v in one with more bits: for Q4_K_M,
// Q5_0 and Q8_0 where rows are not whole super-blocks, Q4_K and Q6_K where they are; launch_gemv_qkv_rope_store
// lists them): a group picks one of two formats. Two paths compile like one format's, where FormatPerGroup's
// switch over every format cost ~50% (ncu, Qwen2.5-0.5B Q4_K_M, when there were eight formats: 12.0 µs against
// 7.9 for an all-Q5_0 layer).
template <class QkFormat, int QK_TYPE, class VFormat>
struct FormatPair {
    using Qk = QkFormat;
    using V = VFormat;
    static constexpr int QK_GGML_TYPE = QK_TYPE;
};
template <class Format>
struct IsFormatPair : std::false_type {};
template <class QkFormat, int QK_TYPE, class VFormat>
struct IsFormatPair<FormatPair<QkFormat, QK_TYPE, VFormat>> : std::true_type {};

// The words a step of Format loads, for planning a launch: a pair's q and k format's (most of its rows); with
// a type per group, F32's (the widest: the fewest steps a batch, so the most batches for a warp alone).
template <class Format>
constexpr int planned_raw_words() {
    if constexpr (IsFormatPair<Format>::value) {
        return Format::Qk::RAW_WORDS;
    } else if constexpr (std::is_same_v<Format, FormatPerGroup>) {
        return GemvF32::RAW_WORDS;
    } else {
        return Format::RAW_WORDS;
    }
}

// Block: GROUPS_PER_BLOCK warps that own a group each, or warps_per_group warps sharing one group;
// blockIdx.x: which groups.
template <class Format, class Epilogue, bool X_AHEAD>
__global__ void __launch_bounds__(GEMV_MAX_WARPS * WARP_SIZE) gemv(GemvInput in, Epilogue epilogue) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int groups_per_block = blockDim.x / WARP_SIZE / in.warps_per_group;
    const int group = blockIdx.x * groups_per_block + warp / in.warps_per_group;
    const int warp_in_group = warp % in.warps_per_group;
    if (group >= epilogue.n_groups) {
        // Only in a block of single-warp groups (no barrier), whose last block may be partly past the end.
        wait_for_previous_kernel();
        allow_next_kernel();
        return;
    }
    if constexpr (IsFormatPair<Format>::value) {
        if (epilogue.type(group) == Format::QK_GGML_TYPE) {
            gemv_group<typename Format::Qk, X_AHEAD>(in, epilogue, group, warp_in_group, lane);
        } else {
            gemv_group<typename Format::V, X_AHEAD>(in, epilogue, group, warp_in_group, lane);
        }
    } else if constexpr (!std::is_same_v<Format, FormatPerGroup>) {
        gemv_group<Format, X_AHEAD>(in, epilogue, group, warp_in_group, lane);
    } else {
        switch (epilogue.type(group)) {
            case GGML_F32: gemv_group<GemvF32, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_F16: gemv_group<GemvF16, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q4_0: gemv_group<GemvQ4_0, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q4_1: gemv_group<GemvQ4_1, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q5_0: gemv_group<GemvQ5_0, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q5_1: gemv_group<GemvQ5_1, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q8_0: gemv_group<GemvQ8_0, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q2_K: gemv_group<GemvQ2_K, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q3_K: gemv_group<GemvQ3_K, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q4_K: gemv_group<GemvQ4_K, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q5_K: gemv_group<GemvQ5_K, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_Q6_K: gemv_group<GemvQ6_K, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_IQ4_NL: gemv_group<GemvIQ4_NL, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            case GGML_IQ4_XS: gemv_group<GemvIQ4_XS, X_AHEAD>(in, epilogue, group, warp_in_group, lane); break;
            default:  // GGML_BF16: the launchers checked the type
                gemv_group<GemvBF16, X_AHEAD>(in, epilogue, group, warp_in_group, lane);
                break;
        }
    }
}

// ---- Launch ------------------------------------------------------------------------------------------------

// The rounds ("waves") in which the GPU runs `blocks` blocks of `threads` threads of `kernel`: as many of them as
// fit an SM at once (its registers, warps and block slots; these kernels' shared memory is a few floats) on every
// SM, then the next as many.
template <class Kernel>
cudaError_t waves_of(Kernel kernel, int blocks, int threads, int& waves) {
    int multiprocessors = 0, per_multiprocessor = 0;
    if (const cudaError_t failed = device_multiprocessors(multiprocessors); failed != cudaSuccess) return failed;
    const cudaError_t fit = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, threads, 0);
    if (fit != cudaSuccess) return fit;
    waves = ceil_div(blocks, std::max(1, per_multiprocessor * multiprocessors));
    return cudaSuccess;
}

template <class Format, class Epilogue>
cudaError_t launch_format(const GemvInput& input, const Epilogue& epilogue, cudaStream_t stream) {
    // Rows of up to ~4 steps (896 values: 4) belong to one warp each; longer rows (4864 values: 19 steps)
    // are split over up to 8 warps of a block, each taking about STEPS_PER_WARP steps, in one batch where
    // RAW_BUDGET holds them (Q3_K's and Q6_K's 5 words a step take two; a budget of 48 that made it one was
    // slower: docs/PERFORMANCE.md, step 25; Q4_K and Q5_K share their header, KQuantHeader). Unless a warp a
    // group costs fewer round trips: a launch costs about its waves times the batches a warp loads one after
    // another, and a split that takes two waves repeats every round trip of the first, where a warp walking the
    // whole row adds only its extra batches (Llama-3.2-1B's q|k|v in Q4_K when a step held 5 words, 93
    // registers: 1536 blocks of two warps of 2 batches, 10 an SM on an H100, two waves, 4; 384 blocks of four
    // single-warp groups of 3 batches, one wave, 3). A long row keeps its split (ffn_down's 32 steps: 8 batches
    // or more for one warp against a few waves of one or two).
    constexpr int BATCH = batch_steps(Epilogue::ROWS, planned_raw_words<Format>());
    const int n_steps = ceil_div(input.in_features, STEP_VALUES);
    GemvInput in = input;
    in.warps_per_group = std::min(GEMV_MAX_WARPS, ceil_div(n_steps, STEPS_PER_WARP));
    if (in.warps_per_group > 1) {
        int split_waves = 0, single_waves = 0;
        if (const cudaError_t failed = waves_of(gemv<Format, Epilogue, false>, epilogue.n_groups,
                                                in.warps_per_group * WARP_SIZE, split_waves);
            failed != cudaSuccess)
            return failed;
        if (const cudaError_t failed = waves_of(gemv<Format, Epilogue, false>,
                                                ceil_div(epilogue.n_groups, GROUPS_PER_BLOCK),
                                                GROUPS_PER_BLOCK * WARP_SIZE, single_waves);
            failed != cudaSuccess)
            return failed;
        const int split_trips = split_waves * ceil_div(ceil_div(n_steps, in.warps_per_group), BATCH);
        const int single_trips = single_waves * ceil_div(n_steps, BATCH);
        if (single_trips < split_trips) in.warps_per_group = 1;
    }
    const int groups_per_block = in.warps_per_group == 1 ? GROUPS_PER_BLOCK : 1;
    // grid.x: blocks of groups_per_block groups (each ROWS rows of W); block: 32 threads per warp, a warp
    // per group or warps_per_group warps on one group.
    const int blocks = ceil_div(epilogue.n_groups, groups_per_block);
    const int threads = groups_per_block * in.warps_per_group * WARP_SIZE;
    // x a step ahead (gemv_group's X_AHEAD) where it is free: in groups of up to two rows whose warps each load
    // their steps in one batch, and only where its registers (+4 to +31) cost the launch no wave. There a
    // launch is one round trip for weights and x together; a warp walking several batches gains only inside
    // each, and a launch of many waves pays for the registers in blocks (docs/PERFORMANCE.md, session 49, row
    // 81: Qwen2.5-0.5B's q|k|v 4-18% and attn_output 5-15% faster alone; with x ahead in every group of up to
    // two rows, row 79, Llama-3.2-1B's q|k|v was 24-42% and its ffn_down 6-39% slower). Four rows (gate|up)
    // hold 4 x 16 words of weights: never.
    if constexpr (Epilogue::ROWS <= 2) {
        if (ceil_div(n_steps, in.warps_per_group) <= BATCH) {
            int plain_waves = 0, ahead_waves = 0;
            if (const cudaError_t failed = waves_of(gemv<Format, Epilogue, false>, blocks, threads, plain_waves);
                failed != cudaSuccess)
                return failed;
            if (const cudaError_t failed = waves_of(gemv<Format, Epilogue, true>, blocks, threads, ahead_waves);
                failed != cudaSuccess)
                return failed;
            if (ahead_waves <= plain_waves)
                return launch_overlapped(gemv<Format, Epilogue, true>, dim3(blocks), dim3(threads), 0, stream, in,
                                         epilogue);
        }
    }
    return launch_overlapped(gemv<Format, Epilogue, false>, dim3(blocks), dim3(threads), 0, stream, in, epilogue);
}

// The launch for weights of one type (`type`, checked by the launcher).
template <class Epilogue>
cudaError_t launch_epilogue(int type, const GemvInput& in, const Epilogue& epilogue, cudaStream_t stream) {
    switch (type) {
        case GGML_F32: return launch_format<GemvF32>(in, epilogue, stream);
        case GGML_F16: return launch_format<GemvF16>(in, epilogue, stream);
        case GGML_Q4_0: return launch_format<GemvQ4_0>(in, epilogue, stream);
        case GGML_Q4_1: return launch_format<GemvQ4_1>(in, epilogue, stream);
        case GGML_Q5_0: return launch_format<GemvQ5_0>(in, epilogue, stream);
        case GGML_Q5_1: return launch_format<GemvQ5_1>(in, epilogue, stream);
        case GGML_Q8_0: return launch_format<GemvQ8_0>(in, epilogue, stream);
        case GGML_Q2_K: return launch_format<GemvQ2_K>(in, epilogue, stream);
        case GGML_Q3_K: return launch_format<GemvQ3_K>(in, epilogue, stream);
        case GGML_Q4_K: return launch_format<GemvQ4_K>(in, epilogue, stream);
        case GGML_Q5_K: return launch_format<GemvQ5_K>(in, epilogue, stream);
        case GGML_Q6_K: return launch_format<GemvQ6_K>(in, epilogue, stream);
        case GGML_IQ4_NL: return launch_format<GemvIQ4_NL>(in, epilogue, stream);
        case GGML_IQ4_XS: return launch_format<GemvIQ4_XS>(in, epilogue, stream);
        default: return launch_format<GemvBF16>(in, epilogue, stream);  // the launchers checked the type
    }
}

// A QKV launch over q and k of one format and v of another.
template <class QkFormat, int QK_TYPE, class VFormat>
cudaError_t launch_pair(const GemvInput& in, const GemvQkvRopeStore& epilogue, cudaStream_t stream) {
    return launch_format<FormatPair<QkFormat, QK_TYPE, VFormat>>(in, epilogue, stream);
}

// The alignment each format's loads need from the weight's base address (the row lengths keep it), or 0 for
// a type this file has no format for.
std::size_t weight_alignment(int type) {
    switch (type) {
        case GGML_F32:
        case GGML_F16:
        case GGML_BF16: return 16;
        case GGML_Q4_1:
        case GGML_Q5_1:
        case GGML_Q2_K:
        case GGML_Q4_K:
        case GGML_Q5_K:
        case GGML_IQ4_XS: return 4;
        case GGML_Q4_0:
        case GGML_Q5_0:
        case GGML_Q8_0:
        case GGML_Q3_K:
        case GGML_Q6_K:
        case GGML_IQ4_NL: return 2;
        default: return 0;
    }
}

// The checks on one weight; nullptr when they hold, else the reason.
const char* weight_refusal(int type, const void* weight, int in_features) {
    if (weight_alignment(type) == 0 || row_bytes(type, in_features) < 0 || in_features % VALUES_PER_LANE != 0 ||
        in_features <= 0)
        return MINFER_TYPES_AND_ROWS ", in_features the row length, positive and a multiple of 8";
    if (!is_aligned(weight, weight_alignment(type)))
        return "weight must be 16-byte aligned (F32, F16, BF16), 4-byte (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, IQ4_XS) or "
               "2-byte (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K, IQ4_NL)";
    return nullptr;
}

const char* input_refusal(const float* x, const float* norm_weight) {
    if (!is_aligned(x, 16) || (norm_weight != nullptr && !is_aligned(norm_weight, 16)))
        return "x and norm_weight must be 16-byte aligned";
    return nullptr;
}

WeightPart weight_part(const void* weight, int type, int in_features, int n_rows) {
    return {static_cast<const std::uint8_t*>(weight), row_bytes(type, in_features), type, n_rows};
}

// A launch that gemv_int8.cu prefers (sm_90+, its types, 16-byte aligned weights, rows of whole blocks, and
// rows enough for every SM) runs there, on the tensor cores: true, with the launch's result.
template <class Epilogue>
bool int8_launch(const Epilogue& epilogue, const GemvInput& in, cudaStream_t stream, cudaError_t& result) {
    if (!gemv_int8_prefers(epilogue, in.in_features)) return false;
    result = launch_gemv_int8_epilogue(epilogue, in.x, in.norm_weight, in.eps, in.in_features, stream);
    return true;
}

// The gate/up launchers, gemv_swiglu and gemv_geglu: one kernel each, differing in the gate's activation.
template <GateActivation ACTIVATION>
cudaError_t launch_gated(const void* gate, const void* up, int type, const float* x, const float* norm_weight,
                         float eps, float* out, int in_features, int d_ff, cudaStream_t stream) {
    if (const char* reason = weight_refusal(type, gate, in_features)) return minfer_refuse(reason);
    if (const char* reason = weight_refusal(type, up, in_features)) return minfer_refuse(reason);
    if (const char* reason = input_refusal(x, norm_weight)) return minfer_refuse(reason);
    if (d_ff <= 0) return minfer_refuse("d_ff must be positive");
    const GemvInput in{x, norm_weight, eps, in_features, 1};
    using Epilogue = GemvGated<ACTIVATION>;
    const Epilogue epilogue{weight_part(gate, type, in_features, d_ff), weight_part(up, type, in_features, d_ff), out,
                            ceil_div(d_ff, Epilogue::OUTPUTS)};
    cudaError_t result = cudaSuccess;
    if (int8_launch(epilogue, in, stream, result)) return result;
    return launch_epilogue(type, in, epilogue, stream);
}

// Output heads (151936 rows) that gemv_int8.cu does not take: 4 rows per group (the activations a lane loads
// serve 4 rows).
constexpr int MANY_ROWS = 16384;

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_gemv(const void* weight, int type, const float* x, const float* norm_weight, float eps,
                                   const float* residual, float* y, int in_features, int out_features,
                                   cudaStream_t stream) {
    if (const char* reason = weight_refusal(type, weight, in_features)) return minfer_refuse(reason);
    if (const char* reason = input_refusal(x, norm_weight)) return minfer_refuse(reason);
    if (out_features <= 0) return minfer_refuse("out_features must be positive");
    const GemvInput in{x, norm_weight, eps, in_features, 1};
    const WeightPart part = weight_part(weight, type, in_features, out_features);
    cudaError_t result = cudaSuccess;
    if (residual != nullptr ? int8_launch(StoreRows<1, true>{part, y, residual, out_features}, in, stream, result)
                            : int8_launch(StoreRows<1, false>{part, y, nullptr, out_features}, in, stream, result))
        return result;
    // Rows split over warps (ffn_down) take 2 rows per group, so its 896 rows still make few enough blocks
    // for one wave; short rows take 1 row per warp, except the output head's 4.
    const int rows = ceil_div(in_features, STEP_VALUES) > STEPS_PER_WARP ? 2 : (out_features >= MANY_ROWS ? 4 : 1);
    if (residual != nullptr) {
        switch (rows) {
            case 1: return launch_epilogue(type, in, StoreRows<1, true>{part, y, residual, out_features}, stream);
            case 2: return launch_epilogue(type, in, StoreRows<2, true>{part, y, residual, ceil_div(out_features, 2)}, stream);
            default: return launch_epilogue(type, in, StoreRows<4, true>{part, y, residual, ceil_div(out_features, 4)}, stream);
        }
    }
    switch (rows) {
        case 1: return launch_epilogue(type, in, StoreRows<1, false>{part, y, nullptr, out_features}, stream);
        case 2: return launch_epilogue(type, in, StoreRows<2, false>{part, y, nullptr, ceil_div(out_features, 2)}, stream);
        default: return launch_epilogue(type, in, StoreRows<4, false>{part, y, nullptr, ceil_div(out_features, 4)}, stream);
    }
}

extern "C" cudaError_t launch_gemv_swiglu(const void* gate, const void* up, int type, const float* x,
                                          const float* norm_weight, float eps, float* out, int in_features, int d_ff,
                                          cudaStream_t stream) {
    return launch_gated<GateActivation::SILU>(gate, up, type, x, norm_weight, eps, out, in_features, d_ff, stream);
}

extern "C" cudaError_t launch_gemv_geglu(const void* gate, const void* up, int type, const float* x,
                                         const float* norm_weight, float eps, float* out, int in_features, int d_ff,
                                         cudaStream_t stream) {
    return launch_gated<GateActivation::GELU_TANH>(gate, up, type, x, norm_weight, eps, out, in_features, d_ff,
                                                   stream);
}

extern "C" cudaError_t launch_gemv_qkv_rope_store(const void* wq, int q_type, const void* wk, int k_type,
                                                  const void* wv, int v_type, const float* x,
                                                  const float* norm_weight, float eps, const float* bq,
                                                  const float* bk, const float* bv, float* q, void* k_cache,
                                                  void* v_cache, const int* positions, int in_features,
                                                  int n_heads, int n_kv_heads, int head_dim, int n_rot,
                                                  const double* inv_freq, float mscale, int mode, int n_ctx,
                                                  int cache_type, cudaStream_t stream) {
    for (const auto& [weight, type] : {std::pair<const void*, int>{wq, q_type}, {wk, k_type}, {wv, v_type}})
        if (const char* reason = weight_refusal(type, weight, in_features)) return minfer_refuse(reason);
    if (const char* reason = input_refusal(x, norm_weight)) return minfer_refuse(reason);
    if (mode != ROPE_NORMAL && mode != ROPE_NEOX) return minfer_refuse("mode must be 0 (normal) or 2 (NeoX)");
    if (head_dim <= 0 || head_dim % 2 != 0 || n_rot < 0 || n_rot % 2 != 0 || n_rot > head_dim)
        return minfer_refuse("head_dim must be even, and n_rot even, 0 (no rotation) to head_dim");
    if (n_rot > 0 && inv_freq == nullptr) return minfer_refuse("inv_freq must be given when n_rot is not 0");
    if (n_heads <= 0 || n_kv_heads <= 0 || n_ctx <= 0) return minfer_refuse("head counts and n_ctx must be positive");
    if (cache_type != CACHE_F32 && cache_type != CACHE_F16) return refuse_cache_type();
    const int q_rows = n_heads * head_dim, kv_rows = n_kv_heads * head_dim;
    GemvQkvRopeStore epilogue{};
    epilogue.q_weight = weight_part(wq, q_type, in_features, q_rows);
    epilogue.k_weight = weight_part(wk, k_type, in_features, kv_rows);
    epilogue.v_weight = weight_part(wv, v_type, in_features, kv_rows);
    epilogue.q_bias = bq;
    epilogue.k_bias = bk;
    epilogue.v_bias = bv;
    epilogue.q = q;
    epilogue.k_cache = k_cache;
    epilogue.v_cache = v_cache;
    epilogue.cache_type = cache_type;
    epilogue.positions = positions;
    epilogue.n_heads = n_heads;
    epilogue.n_kv_heads = n_kv_heads;
    epilogue.head_dim = head_dim;
    epilogue.n_rot = n_rot;
    epilogue.mode = mode;
    epilogue.n_ctx = n_ctx;
    epilogue.inv_freq = inv_freq;
    epilogue.mscale = mscale;
    epilogue.n_groups = (q_rows + 2 * kv_rows) / 2;
    const GemvInput in{x, norm_weight, eps, in_features, 1};
    if (q_type == k_type && k_type == v_type) return launch_epilogue(q_type, in, epilogue, stream);
    // The mixes llama-quantize's presets make (llama_tensor_get_type: attn_v with more bits than attn_q and
    // attn_k), each a FormatPair. Rows of whole super-blocks (Llama-3.2-1B's 2048): Q2_K and Q2_K_S, Q3_K_M
    // and Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_M, IQ4_NL and IQ4_XS with grouped-query attention. Rows that are not
    // (Qwen2.5-0.5B's 896), where Q2_K and Q3_K fall back to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0,
    // IQ4_XS to IQ4_NL: the same presets' mixes after the fallback.
    const auto mix = [q_type, k_type, v_type](int qk, int v) { return q_type == qk && k_type == qk && v_type == v; };
    if (mix(GGML_Q2_K, GGML_Q3_K)) return launch_pair<GemvQ2_K, GGML_Q2_K, GemvQ3_K>(in, epilogue, stream);
    if (mix(GGML_Q2_K, GGML_Q4_K)) return launch_pair<GemvQ2_K, GGML_Q2_K, GemvQ4_K>(in, epilogue, stream);
    if (mix(GGML_Q3_K, GGML_Q4_K)) return launch_pair<GemvQ3_K, GGML_Q3_K, GemvQ4_K>(in, epilogue, stream);
    if (mix(GGML_Q3_K, GGML_Q5_K)) return launch_pair<GemvQ3_K, GGML_Q3_K, GemvQ5_K>(in, epilogue, stream);
    if (mix(GGML_Q4_K, GGML_Q5_K)) return launch_pair<GemvQ4_K, GGML_Q4_K, GemvQ5_K>(in, epilogue, stream);
    if (mix(GGML_Q4_K, GGML_Q6_K)) return launch_pair<GemvQ4_K, GGML_Q4_K, GemvQ6_K>(in, epilogue, stream);
    if (mix(GGML_Q5_K, GGML_Q6_K)) return launch_pair<GemvQ5_K, GGML_Q5_K, GemvQ6_K>(in, epilogue, stream);
    if (mix(GGML_IQ4_NL, GGML_Q5_K)) return launch_pair<GemvIQ4_NL, GGML_IQ4_NL, GemvQ5_K>(in, epilogue, stream);
    if (mix(GGML_IQ4_XS, GGML_Q5_K)) return launch_pair<GemvIQ4_XS, GGML_IQ4_XS, GemvQ5_K>(in, epilogue, stream);
    if (mix(GGML_Q4_0, GGML_Q5_0)) return launch_pair<GemvQ4_0, GGML_Q4_0, GemvQ5_0>(in, epilogue, stream);
    if (mix(GGML_Q4_0, GGML_Q5_1)) return launch_pair<GemvQ4_0, GGML_Q4_0, GemvQ5_1>(in, epilogue, stream);
    if (mix(GGML_Q5_0, GGML_Q5_1)) return launch_pair<GemvQ5_0, GGML_Q5_0, GemvQ5_1>(in, epilogue, stream);
    if (mix(GGML_Q5_0, GGML_Q8_0)) return launch_pair<GemvQ5_0, GGML_Q5_0, GemvQ8_0>(in, epilogue, stream);
    if (mix(GGML_Q5_1, GGML_Q8_0)) return launch_pair<GemvQ5_1, GGML_Q5_1, GemvQ8_0>(in, epilogue, stream);
    if (mix(GGML_IQ4_NL, GGML_Q5_1)) return launch_pair<GemvIQ4_NL, GGML_IQ4_NL, GemvQ5_1>(in, epilogue, stream);
    return launch_format<FormatPerGroup>(in, epilogue, stream);
}
