// One-token GEMVs on the integer tensor cores, with the weights staged through shared memory by the copy
// engine (sm_90): the products of a decode step with many weights an SM (the output head, a 1B model's gate|up
// and ffn_down) whose weights are in a quantized format, with gemv.cu's epilogues (gemv_epilogues.cuh); and the
// same pipeline for F16 weights on the half-precision tensor cores (F16Rows, SplitX, slice_products_f16):
//
//     y = W norm(x)      W: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS or F16;
//                        norm: RMSNorm with its weight, or nothing
//     then the epilogue: store y (plus a residual: StoreRows<1, *>), or SwiGLU or GeGLU of a gate/up pair
//     (GemvGated)
//
// gemv.cu's launchers send a launch here when gemv_int8_prefers it; the result is the same function.
//
// Why. A one-token product reads each weight once, so its time is the time to stream W. gemv.cu's warps
// load their own few bytes of each block (2-byte loads: the 18-, 22- and 34-byte blocks allow no wider) and
// decode every weight to float32 for the CUDA cores: on a large product it is issue-bound (from DRAM, a Q4_0
// head streams at 1.1-1.3 TB/s where an F16 one, 16-byte loads and no decoding, reaches 3.8). Here the copy
// engine brings whole rows (or long slices of them) into shared memory (cp.async.bulk: one instruction for a
// chunk's consecutive rows or for each row, no registers held, up to MAX_STAGES stages in flight; it streams
// 4.5 TB/s on this GPU), starting before the previous kernel has finished (the weights do not depend on it),
// and the warps multiply them on the integer tensor cores: a 32-value block of 16 rows is one
// mma.sync.m16n8k32 (int8 times int8, int32 sums) whose A operand is the block's quants as stored, after at
// most a mask and a shift per 8 values (IQ4_NL's and IQ4_XS's: the int8 levels its nibbles index, looked up
// with byte permutes).
//
// The activations as integers, without losing float32's precision. x (times the norm weight) is cut into
// 32-value blocks like the weights; block b gets the scale d_b = max |x_j| / 127 and each value three int8
// parts, each the rounded remainder of the one before, times 128:
//     x_j / d_b = q1_j + q2_j / 128 + q3_j / 16384 + e_j,   |q1| <= 127, |q2|, |q3| <= 64, |e_j| <= 2^-15
// (the remainders are exact in float32), so x is kept to 2^-22 of its block's largest value. The three
// parts are three columns of the MMA's B operand (n = 8; the other five are zero): one MMA gives, for
// each of the tile's rows, the three dot products D_c = sum_j w_j q_c,j, exactly, and the block adds
//     s_w * d_b * (D_1 + D_2 / 128 + D_3 / 16384)
// to the row, s_w the weight block's scale. What a format adds to that:
//   - a zero point z (w = s (q - z): Q4_0's 8, Q5_0's 16, Q3_K's 4, Q6_K's 32) costs nothing: the MMA's
//     accumulator starts at -z * sum_j q_c,j (over the column's values: a half's, where B's columns are halves);
//   - an offset m (w = s q + m: Q4_1's and Q5_1's m, the K-quants' -dmin * min) adds m * sum_j x_j;
//   - scales of 16-value halves (Q2_K, Q3_K, Q6_K) split B instead of the block: each part's low 16 values and
//     its high 16 are columns of their own (six of the eight), so one MMA gives each half's sums apart, and each
//     lane's two columns lie in one half (slice_products); Q2_K's mins multiply the sums of x's halves.
// Against gemv.cu's exactly decoded weights times float32 x, the result moves by at most that 2^-22 of the
// block maximum per value: inside the float32 error bound the tests hold both kernels to.
//
// Work split. The rows of a launch (the epilogue's groups: a row, or two gate rows and their up rows) are cut
// into chunks of one or two tiles of 16 rows, and each row into slices of whole blocks, as long as a stage of
// shared memory allows (a whole row where it fits). An item is one slice of one chunk. The grid is one block an
// SM (at most one per chunk); block i takes chunks i, i + gridDim.x, ..., each slice after slice. Its PRODUCER
// warp issues each item's copies into a stage (the first stages' before the wait for the previous kernel) as
// soon as the stage's `empty` barrier says its consumers are done with it; its CONSUMERS warps wait on the
// stage's `full` barrier (the copies' bytes landed) and split the slice's steps (blocks, or the K-quants' pairs
// of blocks) among them, each warp taking every tile of the chunk for its steps (the x operands of a block loaded
// once for both tiles). At a chunk's last slice their sums meet in shared memory (the consumers' own barrier, no
// block-wide one) and warp 0's finishing lanes (one per group) hand them to the epilogue. Every consumer first
// quantizes its share of x into shared memory, applying the norm weight and gathering the sum of squares on the
// way (the norm is the scalar inv_rms, applied at the end, as in gemv.cu). In an mma.m16n8k32, lane (g, t) (g =
// lane / 4, t = lane % 4) holds row g's and row g + 8's values 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3: for the
// nibble formats exactly the low and the high nibbles of bytes 4t .. 4t + 3 of the block's quants, for Q8_0 bytes
// 4t .. and 16 + 4t .. .
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "bulk_copy.cuh"
#include "common.cuh"
#include "gemv_epilogues.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int TILE_ROWS = 16;                        // rows of one mma.m16n8k32
constexpr int MAX_TILES = 2;                         // tiles of a chunk: 2 where the rows give every block some
constexpr int MAX_SLOTS = TILE_ROWS * MAX_TILES;     // rows of a chunk, each with its slot in a stage
constexpr int CONSUMERS = 16;                        // warps that multiply, splitting each slice of a chunk
constexpr int PRODUCER = CONSUMERS;                  // the warp that issues the copies
constexpr int WARPS = CONSUMERS + 1;                 // warps per block; one block an SM
constexpr int MIN_STAGES = 2;                        // stages in flight per block: a chunk's next slice lands
constexpr int MAX_STAGES = 6;                        // while the consumers multiply the last
constexpr std::size_t STAGE_BUDGET = 160 * 1024;     // shared memory for a block's stages, where x leaves room
constexpr std::size_t STATIC_RESERVE = 8 * 1024;     // the kernel's static shared memory and the driver's
constexpr int PARTS = 3;                             // int8 parts per activation
constexpr int PART_SHIFT = 7;                        // log2 of PART_SCALE
constexpr int PART_SCALE = 1 << PART_SHIFT;          // a part is the remainder of the one before, times this
constexpr float Q1_MAX = 127.0f;                     // the first part's range
constexpr float SMALL_LARGEST = 0x1p-60f;            // below it a block's largest value is scaled up (quantize_x)
constexpr float ROUNDING_MAGIC = 0x1.8p23f;          // x + this rounds x to a whole number (|x| < 2^22)
constexpr int ROUNDING_MAGIC_BITS = 0x4B400000;      // its bits: those of x + it, less these, are that number
constexpr int PART_PADDING = 16;                     // bytes after each part's row in shared memory (see QuantizedX)
constexpr int COPY_ALIGNMENT = 16;                   // cp.async.bulk: addresses and sizes in 16-byte units
constexpr int WINDOW_SLACK = 2 * COPY_ALIGNMENT;     // a slot holds its slice plus the 16-byte units around it

// Reads of a slice staged in shared memory (a staged byte keeps its global address modulo 16, so a block keeps
// the boundary it has in the tensor: 2 bytes for the 18-, 22-, 34- and 110-byte blocks, 4 for the others).
__device__ __forceinline__ std::uint32_t shared_u16(const void* p) { return *static_cast<const unsigned short*>(p); }
__device__ __forceinline__ std::uint32_t shared_u32(const void* p) { return *static_cast<const unsigned int*>(p); }
__device__ __forceinline__ std::uint32_t shared_word(const std::uint8_t* p) {
    return shared_u16(p) | (shared_u16(p + 2) << 16);
}

// The bytes of x a storage block of a type covers: values and bytes of one block (32 values) or super-block
// (256), for the types this file reads; {0, 0} for the others.
struct StorageBlock {
    int values, bytes;
};
__host__ __device__ inline StorageBlock storage_block(int type) {
    switch (type) {
        case GGML_Q4_0: return {QK, int(sizeof(BlockQ4_0))};
        case GGML_Q4_1: return {QK, int(sizeof(BlockQ4_1))};
        case GGML_Q5_0: return {QK, int(sizeof(BlockQ5_0))};
        case GGML_Q5_1: return {QK, int(sizeof(BlockQ5_1))};
        case GGML_Q8_0: return {QK, int(sizeof(BlockQ8_0))};
        case GGML_IQ4_NL: return {QK, int(sizeof(BlockIQ4_NL))};
        case GGML_Q2_K: return {QK_K, int(sizeof(BlockQ2_K))};
        case GGML_Q3_K: return {QK_K, int(sizeof(BlockQ3_K))};
        case GGML_Q4_K: return {QK_K, int(sizeof(BlockQ4_K))};
        case GGML_Q5_K: return {QK_K, int(sizeof(BlockQ5_K))};
        case GGML_Q6_K: return {QK_K, int(sizeof(BlockQ6_K))};
        case GGML_IQ4_XS: return {QK_K, int(sizeof(BlockIQ4_XS))};
        case GGML_F16: return {QK, QK * int(sizeof(__half))};
        default: return {0, 0};
    }
}

// ---- Weight formats: one row's 32-value block as lane (g, t) needs it ----------------------------------------
//
// load: the lane's bytes of 32-value block `block` of a row staged in shared memory (counted from the staged
// slice's first value, which starts a storage block); quants: the two A-fragment words, values 4t .. 4t + 3
// (low) and 16 + 4t .. 16 + 4t + 3 (high) of the block as int8 (offset by the zero point ZERO); scale (and,
// per OFFSETS, offset): s and m of w = s * (q - ZERO) + m. Where HALF_SCALES, scale and offset are those of the
// 16-value half t % 2, the half whose sums lane t's columns of the MMA hold. A format whose blocks share bytes
// in pairs (STEP_BLOCKS = 2) reads a step of two blocks at once instead: load_pair gives the Raw of blocks
// block_of(step, 0) and block_of(step, 1).

enum class Offsets { NONE, BLOCK, HALVES };  // no m; one m for the block; one for each 16-value half

// The formats that decode their quants in load: their Raw holds the two A-fragment words, `low` and `high`.
struct DecodedInLoad {
    template <class Raw>
    __device__ static void quants(const Raw& w, std::uint32_t& low, std::uint32_t& high) {
        low = w.low;
        high = w.high;
    }
};

// ... and the scale and offset the lane needs: its block's (the 32-value sub-blocks of Q4_K and Q5_K) or its
// half's (the 16-value sub-blocks of Q2_K, Q3_K and Q6_K; an offset for Q2_K only).
struct ScaledInLoad : DecodedInLoad {
    struct Raw {
        std::uint32_t low, high;
        float scale, offset;
    };
    __device__ static float scale(const Raw& w) { return w.scale; }
    __device__ static float offset(const Raw& w) { return w.offset; }
};

struct Int8Q4_0 {
    static constexpr int ZERO = 8;
    static constexpr Offsets OFFSETS = Offsets::NONE;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 1;
    struct Raw {
        std::uint32_t qs, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + block;
        return {shared_word(b->qs + 4 * t), shared_u16(&b->d)};
    }
    __device__ static void quants(const Raw& w, std::uint32_t& low, std::uint32_t& high) {
        low = w.qs & 0x0F0F0F0Fu;
        high = (w.qs >> 4) & 0x0F0F0F0Fu;
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

struct Int8Q4_1 {  // 20-byte blocks keep a 4-byte boundary
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::BLOCK;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 1;
    struct Raw {
        std::uint32_t d_and_m, qs;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ4_1* b = reinterpret_cast<const BlockQ4_1*>(row) + block;
        return {shared_u32(b), shared_u32(b->qs + 4 * t)};
    }
    __device__ static void quants(const Raw& w, std::uint32_t& low, std::uint32_t& high) {
        low = w.qs & 0x0F0F0F0Fu;
        high = (w.qs >> 4) & 0x0F0F0F0Fu;
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d_and_m & 0xFFFFu); }
    __device__ static float offset(const Raw& w) { return half_bits_to_float(w.d_and_m >> 16); }
};

struct Int8Q5_0 : DecodedInLoad {
    static constexpr int ZERO = 16;
    static constexpr Offsets OFFSETS = Offsets::NONE;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 1;
    struct Raw {
        std::uint32_t low, high, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ5_0* b = reinterpret_cast<const BlockQ5_0*>(row) + block;
        const std::uint32_t qs = shared_word(b->qs + 4 * t), qh = shared_word(b->qh);
        return {(qs & 0x0F0F0F0Fu) | spread_fifth_bits(qh >> (4 * t)),
                ((qs >> 4) & 0x0F0F0F0Fu) | spread_fifth_bits(qh >> (16 + 4 * t)), shared_u16(&b->d)};
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

struct Int8Q5_1 : DecodedInLoad {  // 24-byte blocks keep a 4-byte boundary
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::BLOCK;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 1;
    struct Raw {
        std::uint32_t low, high, d_and_m;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ5_1* b = reinterpret_cast<const BlockQ5_1*>(row) + block;
        const std::uint32_t qs = shared_u32(b->qs + 4 * t), qh = shared_u32(b->qh);
        return {(qs & 0x0F0F0F0Fu) | spread_fifth_bits(qh >> (4 * t)),
                ((qs >> 4) & 0x0F0F0F0Fu) | spread_fifth_bits(qh >> (16 + 4 * t)), shared_u32(b)};
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d_and_m & 0xFFFFu); }
    __device__ static float offset(const Raw& w) { return half_bits_to_float(w.d_and_m >> 16); }
};

struct Int8IQ4_NL {  // the quants are the int8 levels the nibbles index
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::NONE;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 1;
    struct Raw {
        std::uint32_t qs, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockIQ4_NL* b = reinterpret_cast<const BlockIQ4_NL*>(row) + block;
        return {shared_word(b->qs + 4 * t), shared_u16(&b->d)};
    }
    __device__ static void quants(const Raw& w, std::uint32_t& low, std::uint32_t& high) {
        iq4_nl_levels(w.qs, low, high);
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

struct Int8Q8_0 : DecodedInLoad {
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::NONE;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 1;
    struct Raw {
        std::uint32_t low, high, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + block;
        const auto* qs = reinterpret_cast<const std::uint8_t*>(b->qs);
        return {shared_word(qs + 4 * t), shared_word(qs + 16 + 4 * t), shared_u16(&b->d)};
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

// The K-quants' steps are pairs of 32-value blocks that share their bytes: a load reads the pair's quants and
// scales once and hands each block its Raw. Step p of a row is pair p % 4 of super-block p / 4; block_of(p, k)
// is its block k (counted along the row, as x's blocks are).

// Blocks j = 2(p % 4) and j + 1 of a Q2_K super-block (values 32j .., in half h = j / 4, group r = j % 4;
// ggml_formats.cuh has the layout): bits 2r, 2r + 1 and 2r + 2, 2r + 3 of the same qs bytes 32h ..; block j's
// 16-value sub-blocks s = 2j and 2j + 1 have scale d * (scales[s] & 0xF) and min dmin * (scales[s] >> 4).
// 84-byte super-blocks keep a 4-byte boundary.
struct Int8Q2_K : ScaledInLoad {
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::HALVES;
    static constexpr bool HALF_SCALES = true;
    static constexpr int STEP_BLOCKS = 2;
    __device__ static int block_of(int step, int k) { return 2 * step + k; }
    __device__ static void load_pair(const std::uint8_t* row, int step, int t, Raw (&w)[2]) {
        const BlockQ2_K* b = reinterpret_cast<const BlockQ2_K*>(row) + step / 4;
        const int j = 2 * (step % 4), h = j / 4, r = j % 4;
        const std::uint8_t* qs = b->qs + 32 * h + 4 * t;
        const std::uint32_t low = shared_u32(qs), high = shared_u32(qs + 16), d_and_dmin = shared_u32(&b->d);
        const float d = half_bits_to_float(d_and_dmin & 0xFFFFu), dmin = half_bits_to_float(d_and_dmin >> 16);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const std::uint32_t scale_and_min = b->scales[2 * (j + k) + t % 2];
            w[k] = {(low >> (2 * (r + k))) & 0x03030303u, (high >> (2 * (r + k))) & 0x03030303u,
                    d * float(scale_and_min & 0xF), -dmin * float(scale_and_min >> 4)};
        }
    }
};

// Blocks j = 2(p % 4) and j + 1 of a Q3_K super-block: Q2_K's two low bits, the third bits 4h + r and 4h + r + 1
// of the same hmask bytes 0 .. above them (the 3-bit value is q + 4); block j's 16-value sub-blocks 2j and 2j + 1
// have scale d * q3_k_scale. 110-byte super-blocks keep a 2-byte boundary only.
struct Int8Q3_K : ScaledInLoad {
    static constexpr int ZERO = 4;
    static constexpr Offsets OFFSETS = Offsets::NONE;
    static constexpr bool HALF_SCALES = true;
    static constexpr int STEP_BLOCKS = 2;
    __device__ static int block_of(int step, int k) { return 2 * step + k; }
    __device__ static void load_pair(const std::uint8_t* row, int step, int t, Raw (&w)[2]) {
        const BlockQ3_K* b = reinterpret_cast<const BlockQ3_K*>(row) + step / 4;
        const int j = 2 * (step % 4), h = j / 4, r = j % 4;
        const std::uint8_t* qs = b->qs + 32 * h + 4 * t;
        const std::uint8_t* hmask = b->hmask + 4 * t;
        const std::uint32_t low_bits[2] = {shared_word(qs), shared_word(qs + 16)};
        const std::uint32_t third_bits[2] = {shared_word(hmask), shared_word(hmask + 16)};
        const float d = half_bits_to_float(shared_u16(&b->d));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const auto value = [&](int i) {
                return ((low_bits[i] >> (2 * (r + k))) & 0x03030303u) |
                       (((third_bits[i] >> (4 * h + r + k)) & 0x01010101u) << 2);
            };
            w[k] = {value(0), value(1), d * float(q3_k_scale(b->scales, 2 * (j + k) + t % 2)), 0.0f};
        }
    }
};

// Blocks j = 2(p % 4) and j + 1 of a Q4_K or Q5_K super-block (their first 16 bytes are alike): the low and the
// high nibbles of the same qs bytes 32(p % 4) .., with scales d * sc and mins dmin * m decoded for both at once
// (q4_k_scale_min_pair). 144- and 176-byte super-blocks keep a 16-byte boundary.
template <class Block>
__device__ __forceinline__ void load_q4_k_pair(const Block* b, int step, int t, ScaledInLoad::Raw (&w)[2]) {
    const int p = step % 4;
    const std::uint8_t* qs = b->qs + 32 * p + 4 * t;
    const std::uint32_t low = shared_u32(qs), high = shared_u32(qs + 16), d_and_dmin = shared_u32(b);
    const std::uint32_t words[3] = {shared_u32(b->scales), shared_u32(b->scales + 4), shared_u32(b->scales + 8)};
    std::uint32_t scales, mins;
    q4_k_scale_min_pair(words, p, scales, mins);
    const float d = half_bits_to_float(d_and_dmin & 0xFFFFu), dmin = half_bits_to_float(d_and_dmin >> 16);
#pragma unroll
    for (int k = 0; k < 2; ++k)
        w[k] = {(low >> (4 * k)) & 0x0F0F0F0Fu, (high >> (4 * k)) & 0x0F0F0F0Fu, d * float((scales >> (8 * k)) & 0xFFu),
                -dmin * float((mins >> (8 * k)) & 0xFFu)};
}

struct Int8Q4_K : ScaledInLoad {
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::BLOCK;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 2;
    __device__ static int block_of(int step, int k) { return 2 * step + k; }
    __device__ static void load_pair(const std::uint8_t* row, int step, int t, Raw (&w)[2]) {
        load_q4_k_pair(reinterpret_cast<const BlockQ4_K*>(row) + step / 4, step, t, w);
    }
};

// Q5_K: Q4_K's nibbles and scales, the fifth bit of value i of block j bit j of qh byte i (bits j and j + 1 of
// the same qh bytes for the pair).
struct Int8Q5_K : ScaledInLoad {
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::BLOCK;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 2;
    __device__ static int block_of(int step, int k) { return 2 * step + k; }
    __device__ static void load_pair(const std::uint8_t* row, int step, int t, Raw (&w)[2]) {
        const BlockQ5_K* b = reinterpret_cast<const BlockQ5_K*>(row) + step / 4;
        load_q4_k_pair(b, step, t, w);
        const int j = 2 * (step % 4);
        const std::uint32_t low = shared_u32(b->qh + 4 * t), high = shared_u32(b->qh + 16 + 4 * t);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            w[k].low |= ((low >> (j + k)) & 0x01010101u) << 4;
            w[k].high |= ((high >> (j + k)) & 0x01010101u) << 4;
        }
    }
};

// Blocks j and j + 2 of a Q6_K super-block (in half h = j / 4, quarters r = j % 4 < 2 and r + 2; step p is
// h = (p % 4) / 2, r = p % 2; ggml_formats.cuh has the layout): the low and the high nibbles of the same ql bytes
// 64h + 32r .., with bits 2r, 2r + 1 and 2r + 4, 2r + 5 of the same qh bytes 32h .. above them; block j's
// 16-value sub-blocks 2j and 2j + 1 have scale d * scales[s]. 210-byte super-blocks keep a 2-byte boundary only.
struct Int8Q6_K : ScaledInLoad {
    static constexpr int ZERO = 32;
    static constexpr Offsets OFFSETS = Offsets::NONE;
    static constexpr bool HALF_SCALES = true;
    static constexpr int STEP_BLOCKS = 2;
    __device__ static int block_of(int step, int k) { return 4 * (step / 2) + step % 2 + 2 * k; }
    __device__ static void load_pair(const std::uint8_t* row, int step, int t, Raw (&w)[2]) {
        const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + step / 4;
        const int h = (step % 4) / 2, r = step % 2, j = 4 * h + r;
        const std::uint8_t* ql = b->ql + 64 * h + 32 * r + 4 * t;
        const std::uint8_t* qh = b->qh + 32 * h + 4 * t;
        const std::uint32_t low_bits[2] = {shared_word(ql), shared_word(ql + 16)};
        const std::uint32_t high_bits[2] = {shared_word(qh), shared_word(qh + 16)};
        const float d = half_bits_to_float(shared_u16(&b->d));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const auto value = [&](int i) {
                return ((low_bits[i] >> (4 * k)) & 0x0F0F0F0Fu) |
                       (((high_bits[i] >> (2 * r + 4 * k)) & 0x03030303u) << 4);
            };
            w[k] = {value(0), value(1), d * float(b->scales[2 * (j + 2 * k) + t % 2]), 0.0f};
        }
    }
};

// Block j of an IQ4_XS super-block is its sub-block j, laid out as an IQ4_NL block (qs bytes 16j ..), with the
// scale d * iq4_xs_scale. 136-byte super-blocks keep an 8-byte boundary.
struct Int8IQ4_XS {
    static constexpr int ZERO = 0;
    static constexpr Offsets OFFSETS = Offsets::NONE;
    static constexpr bool HALF_SCALES = false;
    static constexpr int STEP_BLOCKS = 1;
    struct Raw {
        std::uint32_t qs;
        float scale;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockIQ4_XS* b = reinterpret_cast<const BlockIQ4_XS*>(row) + block / 8;
        const int j = block % 8;
        const std::uint32_t d_and_scales_h = shared_u32(b);
        const int scale = iq4_xs_scale(d_and_scales_h >> 16, b->scales_l[j / 2], j);
        return {shared_u32(b->qs + 16 * j + 4 * t), half_bits_to_float(d_and_scales_h & 0xFFFFu) * float(scale)};
    }
    __device__ static void quants(const Raw& w, std::uint32_t& low, std::uint32_t& high) {
        iq4_nl_levels(w.qs, low, high);
    }
    __device__ static float scale(const Raw& w) { return w.scale; }
};

// F16 rows, on the half-precision tensor cores instead (mma.m16n8k16, float32 sums; slice_products_f16): a row's
// values are the A operand as stored, so the format has nothing to decode, and x goes in as two f16 parts
// (SplitX) instead of three int8 ones.
struct F16Rows {
    static constexpr int STEP_BLOCKS = 1;
};

// ---- x, quantized into shared memory ---------------------------------------------------------------------

// Per 32-value block b of x: the sums of each part's values (the zero points' accumulator start; a fourth, 0,
// pads to 16 bytes), the same over each 16-value half in the order of B's columns where they are halves
// (slice_products: q1, q2 of the low half, of the high half, q3 of the low half, 0, of the high half, 0), the
// sums of the block's two halves (of the quantized values, in x's units: the offsets'), d_b; then the parts, one
// row of in_features int8 each. The padding after each part's row puts the words that lanes (0, t), (1, t) and
// (2, t) read at once into different banks.
struct QuantizedX {
    int* part_sums;       // [n_blocks][4]
    int* half_part_sums;  // [n_blocks][8]
    float2* half_sums;    // [n_blocks]
    float* scales;        // [n_blocks]
    std::int8_t* parts;   // [PARTS][part_stride]
    int part_stride;

    __host__ __device__ static std::size_t bytes(int in_features) {
        const std::size_t n_blocks = in_features / QK;
        return n_blocks * (12 * sizeof(int) + sizeof(float2) + sizeof(float)) +
               PARTS * std::size_t(in_features + PART_PADDING);
    }
    __device__ static QuantizedX in(std::uint8_t* shared, int in_features) {
        const int n_blocks = in_features / QK;
        QuantizedX q;
        q.part_sums = reinterpret_cast<int*>(shared);
        q.half_part_sums = q.part_sums + 4 * n_blocks;
        q.half_sums = reinterpret_cast<float2*>(q.half_part_sums + 8 * n_blocks);
        q.scales = reinterpret_cast<float*>(q.half_sums + n_blocks);
        q.parts = reinterpret_cast<std::int8_t*>(q.scales + n_blocks);
        q.part_stride = in_features + PART_PADDING;
        return q;
    }
};

// x for F16 rows (prepare_x): each 32-value block times the power of two that brings its largest magnitude into
// [1, 2), split into two f16 parts, hi = f16(x) and lo = f16(x - hi): f16's 11 bits twice keep x to ~2^-22 of
// that largest value (a lo below f16's normal range loses bits only under 2^-24 of it). The parts are B's columns
// 0 and 1 of the block's MMAs; `scales` holds each block's inverse power.
struct SplitX {
    __half* hi;     // [in_features]
    __half* lo;     // [in_features]
    float* scales;  // [n_blocks]

    __host__ __device__ static std::size_t bytes(int in_features) {
        return std::size_t(in_features) * 2 * sizeof(__half) + std::size_t(in_features / QK) * sizeof(float);
    }
    __device__ static SplitX in(std::uint8_t* shared, int in_features) {
        SplitX s;
        s.hi = reinterpret_cast<__half*>(shared);
        s.lo = s.hi + in_features;
        s.scales = reinterpret_cast<float*>(s.lo + in_features);
        return s;
    }
};

// The form x takes in shared memory for a format's products.
template <class Format>
using XOf = std::conditional_t<std::is_same_v<Format, F16Rows>, SplitX, QuantizedX>;

// The consumer warps' barrier (named barrier 1): the producer goes its own way.
__device__ __forceinline__ void sync_consumers() {
    asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * WARP_SIZE) : "memory");
}

// Named barrier 2, once a launch: the consumers wait (bar.sync) for each other's x and for the producer's
// arrival (bar.arrive, no wait) after it has initialized the stages' barriers, so the producer's copies, issued
// one row at a time, never hold the consumers back.
constexpr int BARRIERS_READY = 2;
__device__ __forceinline__ void announce_barriers() {
    asm volatile("bar.arrive %0, %1;" ::"n"(BARRIERS_READY), "r"(WARPS * WARP_SIZE) : "memory");
}
__device__ __forceinline__ void wait_for_x_and_barriers() {
    asm volatile("bar.sync %0, %1;" ::"n"(BARRIERS_READY), "r"(WARPS * WARP_SIZE) : "memory");
}

// d = a b + c over one 16 x 8 x 32 tile: A 16 x 32 int8 (row), B 32 x 8 int8 (column), int32 sums. Lane
// (g, t) holds a = {row g, k 4t..4t+3; row g+8, same k; row g, k 16+4t..; row g+8, same}, b = {k 4t..4t+3,
// k 16+4t..; column g}, c and d = {row g, columns 2t, 2t+1; row g+8, the same columns}.
__device__ __forceinline__ void mma_int8(int (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                                         int c0, int c1) {
#if MINFER_SM90
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c0), "r"(c1));
#else
    __trap();
    d[0] = d[1] = d[2] = d[3] = 0;
#endif
}

// d = a b + d over one 16 x 8 x 16 tile: A 16 x 16 f16 (row), B 16 x 8 f16 (column), float32 sums. Lane (g, t)
// holds a = {row g, k 2t, 2t+1; row g+8, the same k; row g, k 2t+8, 2t+9; row g+8, the same}, b = {k 2t, 2t+1;
// k 2t+8, 2t+9; column g}, d = {row g, columns 2t, 2t+1; row g+8, the same columns}.
__device__ __forceinline__ void mma_f16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if MINFER_SM90
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// ---- What a launch is -----------------------------------------------------------------------------------------

// The shape of a launch besides its epilogue (plan_launch chooses it).
struct Int8Launch {
    const float* x;
    const float* norm_weight;  // nullptr: no norm
    float eps;
    int in_features;
    int tiles;         // 16-row tiles of a chunk: 1 or 2
    int n_chunks;
    int slice_values;  // values of each row a stage holds: whole storage blocks of every type of the launch
    int n_slices;      // slices of a row
    int stages;        // stages in flight per block, MIN_STAGES .. MAX_STAGES
    int slot_stride;   // bytes of one row's slot in a stage: its slice and the 16-byte units around it
    bool contiguous;   // a chunk's rows are consecutive in one weight and a slice is a whole row: one copy
};

// Rows of a chunk, and the epilogue's groups in it.
__host__ __device__ inline int chunk_slots(int tiles) { return tiles * TILE_ROWS; }
template <class Epilogue>
__host__ __device__ int chunk_groups(int tiles) {
    return chunk_slots(tiles) / Epilogue::ROWS;
}

// Item `item` of this block: chunk blockIdx.x + (item / n_slices) gridDim.x, slice item % n_slices.
__device__ __forceinline__ int item_chunk(const Int8Launch& launch, int item) {
    return int(blockIdx.x) + (item / launch.n_slices) * int(gridDim.x);
}

// ---- The copies -------------------------------------------------------------------------------------------

__device__ __forceinline__ std::uintptr_t align_down(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) / COPY_ALIGNMENT * COPY_ALIGNMENT;
}

// The 16-byte units holding bytes begin .. end - 1 of a weight that ends at part_end: [start, stop), where stop
// stays inside the weight; the caller copies the bytes from stop to end itself (the weight's last few bytes).
struct Window {
    std::uintptr_t start, stop;
};
__device__ __forceinline__ Window window(const std::uint8_t* begin, const std::uint8_t* end, const std::uint8_t* part_end) {
    const std::uintptr_t start = align_down(begin);
    const std::uintptr_t whole_end = align_down(end + COPY_ALIGNMENT - 1);
    return {start, max(start, min(whole_end, align_down(part_end)))};
}

// The bytes of window `w` past its units, copied by this thread into `target` (which receives the window).
__device__ __forceinline__ void copy_tail(const Window& w, const std::uint8_t* end, std::uint8_t* target) {
    for (const std::uint8_t* p = reinterpret_cast<const std::uint8_t*>(w.stop); p < end; ++p)
        target[reinterpret_cast<std::uintptr_t>(p) - w.start] = *p;
}

// The producer warp brings one item into a stage: where the chunk's rows are consecutive and whole
// (launch.contiguous), lane 0 copies them as one window; otherwise lane s copies the slice of the chunk's row
// s into slot s. `offsets[s]`: where row s's slice begins in the stage (the copy engine moves whole 16-byte
// units: the units before and after it belong to the tensor too). The offsets and the bytes a copying lane adds
// itself reach the consumers with the stage's `full` barrier: the lanes' stores, the warp's __syncwarp, then
// lane 0's arrival, which releases them. That barrier expects every unit before any copy is issued.
template <class Epilogue>
__device__ void fetch_item(const Int8Launch& launch, const Epilogue& epilogue, int chunk, int slice,
                           std::uint8_t* stage, std::uint32_t* offsets, std::uint64_t* full, int lane) {
    const int slots = chunk_slots(launch.tiles), groups = chunk_groups<Epilogue>(launch.tiles);
    const int first_group = chunk * groups;
    if (launch.contiguous) {  // StoreRows<1, *>: group g is row g; slice 0 is the whole row
        const int valid = min(slots, epilogue.n_groups - first_group);
        const StorageBlock block = storage_block(epilogue.type(first_group));
        const int row_bytes = launch.in_features / block.values * block.bytes;
        const std::uint8_t* begin = epilogue.row(first_group, 0);
        const Window w = window(begin, begin + valid * row_bytes, epilogue.part_end(first_group, 0));
        const std::uint32_t lead = std::uint32_t(reinterpret_cast<std::uintptr_t>(begin) - w.start);
        if (lane < slots) offsets[lane] = lead + std::uint32_t(min(lane, valid - 1) * row_bytes);
        if (lane == 0) copy_tail(w, begin + valid * row_bytes, stage);
        __syncwarp();  // the warp's stores before the arrival that publishes them
        if (lane == 0) {
            expect_bytes(full, unsigned(w.stop - w.start));
            if (w.stop > w.start)
                copy_async(stage, reinterpret_cast<const std::uint8_t*>(w.start), unsigned(w.stop - w.start), full);
        }
        return;
    }
    Window w{0, 0};
    if (lane < slots) {
        const int group = min(first_group + lane / Epilogue::ROWS, epilogue.n_groups - 1);
        const int k = lane % Epilogue::ROWS;
        const StorageBlock block = storage_block(epilogue.type(group));
        const int first = slice * launch.slice_values;
        const int values = min(launch.slice_values, launch.in_features - first);
        const std::uint8_t* begin = epilogue.row(group, k) + first / block.values * block.bytes;
        const std::uint8_t* end = begin + values / block.values * block.bytes;
        w = window(begin, end, epilogue.part_end(group, k));
        offsets[lane] = std::uint32_t(lane * launch.slot_stride + (reinterpret_cast<std::uintptr_t>(begin) - w.start));
        copy_tail(w, end, stage + lane * launch.slot_stride);
    }
    __syncwarp();  // the warp's stores before the arrival that publishes them
    const unsigned units = unsigned(w.stop - w.start);
    unsigned total = units;
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(FULL_WARP, total, offset);
    if (lane == 0) expect_bytes(full, total);
    __syncwarp();
    if (units > 0)
        copy_async(stage + lane * launch.slot_stride, reinterpret_cast<const std::uint8_t*>(w.start), units, full);
}

// ---- x, quantized ------------------------------------------------------------------------------------------

// Visits x (times the norm weight) a float4 a lane and returns this lane's share of sum x^2 (the raw x, for the
// norm). Lane l of a warp takes values 4l .. 4l + 3 of a stretch of 128, so lanes 8b .. 8b + 7 hold 32-value
// block b of it; the consumer warps take stretches CONSUMERS apart, X_BATCH of them loaded before any is used
// (one memory round trip for x's 8192 values, not 32). For each stretch every lane of the warp calls
// visit(quad, value, largest, in_x): its float4's index, its four values, the largest magnitude of their block
// (the 8 lanes' maximum) and whether the float4 is in x (a whole 8-lane block is or is not, so a visit may
// shuffle within its 8 lanes before it leaves those that are not).
constexpr int X_BATCH = 4;

template <class Visit>
__device__ float visit_x(const Int8Launch& launch, int warp, int lane, const Visit& visit) {
    const float4* x = reinterpret_cast<const float4*>(launch.x);
    const float4* g = reinterpret_cast<const float4*>(launch.norm_weight);
    const int n_quads = launch.in_features / 4;  // whole blocks: a multiple of 8
    float squares = 0.0f;
    for (int base = warp * WARP_SIZE; base < n_quads; base += CONSUMERS * WARP_SIZE * X_BATCH) {
        float4 raw[X_BATCH], weight[X_BATCH];
#pragma unroll
        for (int b = 0; b < X_BATCH; ++b) {
            const int quad = base + b * CONSUMERS * WARP_SIZE + lane;
            raw[b] = quad < n_quads ? x[quad] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            weight[b] = g != nullptr && quad < n_quads ? g[quad] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        }
#pragma unroll
        for (int b = 0; b < X_BATCH; ++b) {
            // A stretch past x's end holds no block: the warp leaves (at 2048 values, three of its four stretches).
            if (base + b * CONSUMERS * WARP_SIZE >= n_quads) break;
            const int quad = base + b * CONSUMERS * WARP_SIZE + lane;
            const float4 v = raw[b];
            squares += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
            const float value[4] = {v.x * weight[b].x, v.y * weight[b].y, v.z * weight[b].z, v.w * weight[b].w};
            float largest = fmaxf(fmaxf(fabsf(value[0]), fabsf(value[1])), fmaxf(fabsf(value[2]), fabsf(value[3])));
#pragma unroll
            for (int offset = 1; offset < 8; offset *= 2)
                largest = fmaxf(largest, __shfl_xor_sync(FULL_WARP, largest, offset));
            visit(quad, value, largest, quad < n_quads);
        }
    }
    return squares;
}

// Quantizes x into `q` (QuantizedX) and returns this lane's share of sum x^2.
__device__ float prepare_x(const Int8Launch& launch, const QuantizedX& q, int warp, int lane) {
    return visit_x(launch, warp, lane, [&](int quad, const float (&value)[4], float largest, bool in_x) {
        // Each value as one integer, n = rint(value / largest * 127 * 128^2) (|n| < 2^22, so adding 1.5 * 2^23
        // to a float rounds it to a whole number: one fma), then cut into its parts: q1 = n / 128^2 rounded,
        // q2 = the rest / 128 rounded, q3 = the rest of that, so q1 * 128^2 + q2 * 128 + q3 = n exactly.
        // Integer adds and shifts, where rounding floats and converting them (three of each a value) go
        // through the conversion unit at a quarter of the float rate. One division a quad, not one a value;
        // where largest is tiny its quotient would overflow, so it and the values take the factor 2^64 first
        // (exact: a power of two). n is the rounding of value * to_n, within an ulp or two of the exact
        // quotient's, far below the third part's step.
        const float boost = largest < SMALL_LARGEST ? 0x1p64f : 1.0f;
        const float to_n = largest > 0.0f ? Q1_MAX * float(PART_SCALE * PART_SCALE) / (largest * boost) : 0.0f;
        int part[PARTS][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = __float_as_int(fmaf(value[i] * boost, to_n, ROUNDING_MAGIC)) - ROUNDING_MAGIC_BITS;
            const int q1 = (n + PART_SCALE * PART_SCALE / 2) >> (2 * PART_SHIFT);  // arithmetic shift: floor
            const int rest = n - q1 * (PART_SCALE * PART_SCALE);
            const int q2 = (rest + PART_SCALE / 2) >> PART_SHIFT;
            part[0][i] = q1;
            part[1][i] = q2;
            part[2][i] = rest - q2 * PART_SCALE;
        }
        // Each part's sum over this lane's 4 values, then over the 4 lanes of a 16-value half, then the block.
        // Parts 1 and 2 travel in one int (part 2 times 2^16): their sums stay within +-2048, so the low 16
        // bits, sign-extended, are part 1's sum and the rest, shifted down, part 2's.
        int half[PARTS], whole[PARTS];
        half[0] = part[0][0] + part[0][1] + part[0][2] + part[0][3];
        int half_12 = (part[1][0] + part[1][1] + part[1][2] + part[1][3]) +
                      (part[2][0] + part[2][1] + part[2][2] + part[2][3]) * 65536;
#pragma unroll
        for (int offset = 1; offset < 4; offset *= 2) {
            half[0] += __shfl_xor_sync(FULL_WARP, half[0], offset);
            half_12 += __shfl_xor_sync(FULL_WARP, half_12, offset);
        }
        whole[0] = half[0] + __shfl_xor_sync(FULL_WARP, half[0], 4);
        const int whole_12 = half_12 + __shfl_xor_sync(FULL_WARP, half_12, 4);
        half[1] = int(std::int16_t(half_12 & 0xFFFF));
        half[2] = (half_12 - half[1]) / 65536;
        whole[1] = int(std::int16_t(whole_12 & 0xFFFF));
        whole[2] = (whole_12 - whole[1]) / 65536;
        if (!in_x) return;  // a whole 8-lane block is past the end or not: no shuffle follows
#pragma unroll
        for (int c = 0; c < PARTS; ++c) {
            // Each part's low byte, in value order: values 0 and 1, 2 and 3, then the two pairs.
            const std::uint32_t packed = __byte_perm(__byte_perm(part[c][0], part[c][1], 0x0040),
                                                     __byte_perm(part[c][2], part[c][3], 0x0040), 0x5410);
            *reinterpret_cast<std::uint32_t*>(q.parts + c * q.part_stride + 4 * quad) = packed;
        }
        const int block = quad / 8;
        const float scale = largest * (1.0f / Q1_MAX);
        const float half_sum = scale * (float(half[0]) + float(half[1]) / PART_SCALE +
                                        float(half[2]) / (PART_SCALE * PART_SCALE));
        if (lane % 8 == 0) {
            q.scales[block] = scale;
            q.half_sums[block].x = half_sum;
            *reinterpret_cast<int4*>(q.part_sums + 4 * block) = make_int4(whole[0], whole[1], whole[2], 0);
        } else if (lane % 8 == 4) {
            q.half_sums[block].y = half_sum;
        }
        if (lane % 4 == 0) {  // lane 8b: the low half's sums, lane 8b + 4: the high half's
            int* sums = q.half_part_sums + 8 * block + (lane % 8) / 2;
            *reinterpret_cast<int2*>(sums) = make_int2(half[0], half[1]);
            *reinterpret_cast<int2*>(sums + 4) = make_int2(half[2], 0);
        }
    });
}

// Splits x into `s` (SplitX) and returns this lane's share of sum x^2: each value times its block's power of two
// 2^(127 - e), e the biased exponent of the block's largest magnitude (kept within 1 .. 253, so the power and its
// inverse are normal floats), which brings that largest value into [1, 2); hi its f16 rounding, lo the f16
// rounding of what hi leaves (packed conversions: two values an instruction).
__device__ float prepare_x(const Int8Launch& launch, const SplitX& s, int warp, int lane) {
    return visit_x(launch, warp, lane, [&](int quad, const float (&value)[4], float largest, bool in_x) {
        if (!in_x) return;
        const int e = min(max(__float_as_int(largest) >> 23, 1), 253);
        const float down = __int_as_float((254 - e) << 23);
        const float2 v01 = make_float2(value[0] * down, value[1] * down);
        const float2 v23 = make_float2(value[2] * down, value[3] * down);
        const __half2 hi01 = __float22half2_rn(v01), hi23 = __float22half2_rn(v23);
        const float2 back01 = __half22float2(hi01), back23 = __half22float2(hi23);
        const __half2 lo01 = __float22half2_rn(make_float2(v01.x - back01.x, v01.y - back01.y));
        const __half2 lo23 = __float22half2_rn(make_float2(v23.x - back23.x, v23.y - back23.y));
        *reinterpret_cast<__half2*>(s.hi + 4 * quad) = hi01;
        *reinterpret_cast<__half2*>(s.hi + 4 * quad + 2) = hi23;
        *reinterpret_cast<__half2*>(s.lo + 4 * quad) = lo01;
        *reinterpret_cast<__half2*>(s.lo + 4 * quad + 2) = lo23;
        if (lane % 8 == 0) s.scales[quad / 8] = __int_as_float(e << 23);  // 2^(e - 127): undoes the block's power
    });
}

// ---- The products -----------------------------------------------------------------------------------------

// A step of a format: its STEP_BLOCKS blocks' Raw (load_step), and where those blocks lie in the row (step_block).
template <class Format>
struct Step {
    typename Format::Raw block[Format::STEP_BLOCKS];
};
template <class Format>
__device__ __forceinline__ Step<Format> load_step(const std::uint8_t* row, int step, int t) {
    Step<Format> w;
    if constexpr (Format::STEP_BLOCKS == 1) {
        w.block[0] = Format::load(row, step, t);
    } else {
        Format::load_pair(row, step, t, w.block);
    }
    return w;
}
template <class Format>
__device__ __forceinline__ int step_block(int step, int k) {
    if constexpr (Format::STEP_BLOCKS == 1) {
        return step;
    } else {
        return Format::block_of(step, k);
    }
}

// What lane (g, t) brings of one x block to its MMAs: B's column g (b0: k 4t .. 4t + 3, b1: k 16 + 4t ..), the
// accumulator's start (the zero point's term), the lane's weight on its pair of columns, and the x sum its
// offsets multiply.
struct XBlock {
    std::uint32_t b0, b1;
    int zero0, zero1;
    float scale, offset_sum;
};

// The products of steps begin .. end - 1 of a staged slice (x block x_first + block for each of their blocks) for
// the chunk's `tiles` tiles, rows[tile][0] (tile row g) and rows[tile][1] (g + 8), added to sums[tile][0] and
// [1], each row's columns still spread over lanes t = 0..3 of group g. The x operands of a block are loaded once
// for both tiles.
//
// B's columns, and what lane t's accumulator pair (columns 2t and 2t + 1, combined as D_2t * 128 + D_2t+1) holds:
//   - one scale a block: columns 0, 1, 2 are the parts q1, q2, q3. Lane 0 holds q1 and q2 (weight 1 / 128 on
//     the pair), lane 1 q3 and a zero column (1 / 16384 / 128), lanes 2 and 3 zero columns.
//   - a scale a 16-value half (HALF_SCALES): columns 0, 1 are q1, q2 over the low half (the high half's values
//     zero), 2, 3 the same over the high half, 4 and 6 q3 over the low and the high half, 5 and 7 zero. Lane t
//     holds half t % 2: q1 and q2 (t < 2, weight 1 / 128) or q3 (t >= 2, 1 / 16384 / 128), with that half's scale.
// The offsets' x sums go to the lanes that hold q1: lane 0 the block's (or the low half's), lane 1 the high half's.
template <class Format>
__device__ __forceinline__ void slice_products(const std::uint8_t* const (&rows)[MAX_TILES][2], int tiles, int begin,
                                               int end, int x_first, const QuantizedX& q, int g, int t,
                                               float (&sums)[MAX_TILES][2]) {
    constexpr float Q1_Q2 = 1.0f / PART_SCALE, Q3 = 1.0f / (PART_SCALE * PART_SCALE * PART_SCALE);
    float column_weight;
    int part;
    bool low_half, high_half;  // the halves of the block whose values lane (g, t) puts in column g of B
    if constexpr (Format::HALF_SCALES) {
        column_weight = t < 2 ? Q1_Q2 : Q3;
        part = g < 4 ? g % 2 : 2;
        low_half = g == 0 || g == 1 || g == 4;
        high_half = g == 2 || g == 3 || g == 6;
    } else {
        column_weight = t == 0 ? Q1_Q2 : (t == 1 ? Q3 : 0.0f);
        part = min(g, PARTS - 1);
        low_half = high_half = g < PARTS;
    }
    const std::int8_t* part_row = q.parts + part * q.part_stride + 4 * t;
    const auto x_block = [&](int xb) {
        XBlock x;
        x.b0 = low_half ? *reinterpret_cast<const std::uint32_t*>(part_row + xb * QK) : 0u;
        x.b1 = high_half ? *reinterpret_cast<const std::uint32_t*>(part_row + xb * QK + 16) : 0u;
        // The sums of lane t's two columns (half_part_sums' order is the half columns').
        int2 part_sums = make_int2(0, 0);
        if constexpr (Format::ZERO != 0 && Format::HALF_SCALES) {
            part_sums = *reinterpret_cast<const int2*>(q.half_part_sums + 8 * xb + 2 * t);
        } else if constexpr (Format::ZERO != 0) {
            if (t < 2) part_sums = *reinterpret_cast<const int2*>(q.part_sums + 4 * xb + 2 * t);
        }
        x.zero0 = -Format::ZERO * part_sums.x;
        x.zero1 = -Format::ZERO * part_sums.y;
        x.scale = q.scales[xb] * column_weight;
        x.offset_sum = 0.0f;
        if constexpr (Format::OFFSETS == Offsets::BLOCK) {
            if (t == 0) x.offset_sum = q.half_sums[xb].x + q.half_sums[xb].y;
        } else if constexpr (Format::OFFSETS == Offsets::HALVES) {
            if (t < 2) x.offset_sum = t == 0 ? q.half_sums[xb].x : q.half_sums[xb].y;
        }
        return x;
    };
    // Two one-block steps a pass, so one block's loads are in flight while the other's MMA waits; a pair's loads
    // and decoding give its two MMAs that already.
    constexpr int UNROLL = Format::STEP_BLOCKS == 1 ? 2 : 1;
#pragma unroll UNROLL
    for (int step = begin; step < end; ++step) {
        XBlock x[Format::STEP_BLOCKS];
#pragma unroll
        for (int k = 0; k < Format::STEP_BLOCKS; ++k) x[k] = x_block(x_first + step_block<Format>(step, k));
#pragma unroll
        for (int tile = 0; tile < MAX_TILES; ++tile) {
            if (tile >= tiles) break;
            const Step<Format> w[2] = {load_step<Format>(rows[tile][0], step, t),
                                       load_step<Format>(rows[tile][1], step, t)};
#pragma unroll
            for (int k = 0; k < Format::STEP_BLOCKS; ++k) {
                std::uint32_t a[4];
                Format::quants(w[0].block[k], a[0], a[2]);
                Format::quants(w[1].block[k], a[1], a[3]);
                int d[4];
                mma_int8(d, a, x[k].b0, x[k].b1, x[k].zero0, x[k].zero1);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    // The sum times the weight's scale first: x's scale for the third part is 2^-21 of its block's,
                    // ~1e-38 for a block of ~1e-30, and times a small weight scale first it would fall among the
                    // subnormals and lose the part (docs/PERFORMANCE.md, session 56).
                    sums[tile][h] +=
                        float(d[2 * h] * PART_SCALE + d[2 * h + 1]) * Format::scale(w[h].block[k]) * x[k].scale;
                    if constexpr (Format::OFFSETS != Offsets::NONE)
                        sums[tile][h] += Format::offset(w[h].block[k]) * x[k].offset_sum;
                }
            }
        }
    }
}

// The products of steps begin .. end - 1 (32-value blocks) of a staged F16 slice, as slice_products' for the other
// formats. A block is two MMAs whose k are its 32 values, permuted alike in A and B so that lane t's are values
// 8t .. 8t + 7, one 16-byte load a row: 8t .. 8t + 3 the first MMA's k 2t, 2t + 1, 2t + 8, 2t + 9, and 8t + 4 ..
// 8t + 7 the second's. B's column 0 is x's hi part, column 1 its lo part, the others zero, so lane t = 0 of group
// g holds rows g's and g + 8's sums over hi and over lo; their sum times the block's power goes to sums[tile][h]
// (nothing on lanes t > 0, whose columns are zero).
__device__ __forceinline__ void slice_products_f16(const std::uint8_t* const (&rows)[MAX_TILES][2], int tiles,
                                                   int begin, int end, int x_first, const SplitX& s, int g, int t,
                                                   float (&sums)[MAX_TILES][2]) {
    const __half* column = g == 0 ? s.hi : s.lo;  // B's column g: hi, lo, then zeros
    constexpr int BLOCK_BYTES = QK * int(sizeof(__half));
#pragma unroll 2
    for (int step = begin; step < end; ++step) {
        const int xb = x_first + step;
        const uint4 b = g < 2 ? *reinterpret_cast<const uint4*>(column + xb * QK + 8 * t) : make_uint4(0u, 0u, 0u, 0u);
        const float power = s.scales[xb];
#pragma unroll
        for (int tile = 0; tile < MAX_TILES; ++tile) {
            if (tile >= tiles) break;
            const uint4 w0 = *reinterpret_cast<const uint4*>(rows[tile][0] + step * BLOCK_BYTES + 16 * t);
            const uint4 w1 = *reinterpret_cast<const uint4*>(rows[tile][1] + step * BLOCK_BYTES + 16 * t);
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const std::uint32_t first[4] = {w0.x, w1.x, w0.y, w1.y};
            mma_f16(d, first, b.x, b.y);
            const std::uint32_t second[4] = {w0.z, w1.z, w0.w, w1.w};
            mma_f16(d, second, b.z, b.w);
            sums[tile][0] += (d[0] + d[1]) * power;
            sums[tile][1] += (d[2] + d[3]) * power;
        }
    }
}

// ---- The kernel ---------------------------------------------------------------------------------------------

// Block: CONSUMERS warps that multiply (each slice of a chunk split among them) and the PRODUCER warp that keeps
// up to `stages` items in flight: a stage's `full` barrier completes when its bytes have landed, its `empty`
// barrier when every consumer warp is done with it. blockIdx.x: the first of the chunks the block takes,
// gridDim.x apart (the grid is what the GPU holds at once, so each block quantizes x once for its chunks).
template <class Format, class Epilogue>
__global__ void __launch_bounds__(WARPS * WARP_SIZE, 1) gemv_int8(Int8Launch launch, Epilogue epilogue) {
    extern __shared__ __align__(128) std::uint8_t shared[];
    __shared__ std::uint64_t full[MAX_STAGES], empty[MAX_STAGES];
    __shared__ std::uint32_t offsets[MAX_STAGES][MAX_SLOTS];
    __shared__ float warp_squares[CONSUMERS];
    __shared__ float warp_sums[2][CONSUMERS][MAX_SLOTS];  // two sets: a chunk's are read while the next's are written
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int groups = chunk_groups<Epilogue>(launch.tiles);
    const std::size_t stage_bytes = std::size_t(chunk_slots(launch.tiles)) * launch.slot_stride;
    const int my_items = ceil_div(launch.n_chunks - int(blockIdx.x), gridDim.x) * launch.n_slices;
    const auto fetch = [&](int item) {
        const int stage = item % launch.stages;
        fetch_item(launch, epilogue, item_chunk(launch, item), item % launch.n_slices, shared + stage * stage_bytes,
                   offsets[stage], &full[stage], lane);
    };

    if (warp == PRODUCER) {
        if (lane == 0) {
            for (int s = 0; s < launch.stages; ++s) {
                init_arrival(&full[s], 1);
                init_arrival(&empty[s], CONSUMERS);
            }
        }
        __syncwarp();
        announce_barriers();
        // W does not depend on the previous kernel: the first items are on their way before the wait.
        for (int item = 0; item < min(launch.stages, my_items); ++item) fetch(item);
        wait_for_previous_kernel();
        allow_next_kernel();
        // Each later item into its stage as soon as the consumers are done with it.
        for (int item = launch.stages; item < my_items; ++item) {
            wait_arrival(&empty[item % launch.stages], (item / launch.stages - 1) % 2);
            fetch(item);
        }
        return;
    }
    wait_for_previous_kernel();
    allow_next_kernel();

    const XOf<Format> q = XOf<Format>::in(shared + launch.stages * stage_bytes, launch.in_features);
    const float squares = warp_sum(prepare_x(launch, q, warp, lane));
    if (lane == 0) warp_squares[warp] = squares;
    wait_for_x_and_barriers();

    float inv_rms = 1.0f;
    if (launch.norm_weight != nullptr) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < CONSUMERS; ++w) total += warp_squares[w];
        inv_rms = 1.0f / sqrtf(total / float(launch.in_features) + launch.eps);
    }
    const int g = lane / 4, t = lane % 4;
    const bool finishes = warp == 0 && lane < groups;  // lane i of warp 0 finishes group i of each chunk
    typename Epilogue::Prepared prepared{};
    float sums[MAX_TILES][2] = {};
    for (int item = 0; item < my_items; ++item) {
        const int chunk = item_chunk(launch, item), slice = item % launch.n_slices, stage = item % launch.stages;
        const int group = chunk * groups + lane;  // the finishing lane's
        // Its epilogue's loads (residual, bias, position) go out now and are used at the chunk's last slice.
        if (slice == 0 && finishes && group < epilogue.n_groups) prepared = epilogue.prepare(group);
        wait_arrival(&full[stage], (item / launch.stages) % 2);

        const std::uint8_t* buffer = shared + stage * stage_bytes;
        const std::uint8_t* rows[MAX_TILES][2];
#pragma unroll
        for (int tile = 0; tile < MAX_TILES; ++tile) {
#pragma unroll
            for (int h = 0; h < 2; ++h) rows[tile][h] = buffer + offsets[stage][min(tile, launch.tiles - 1) * TILE_ROWS + g + 8 * h];
        }
        const int first = slice * launch.slice_values;
        // The slice's steps split among the consumers (a K-quant slice is whole super-blocks: whole pairs).
        const int n_steps = min(launch.slice_values, launch.in_features - first) / QK / Format::STEP_BLOCKS;
        const int begin = warp * n_steps / CONSUMERS, end = (warp + 1) * n_steps / CONSUMERS;
        if constexpr (std::is_same_v<Format, F16Rows>) {
            slice_products_f16(rows, launch.tiles, begin, end, first / QK, q, g, t, sums);
        } else {
            slice_products<Format>(rows, launch.tiles, begin, end, first / QK, q, g, t, sums);
        }
        __syncwarp();
        if (lane == 0) arrive(&empty[stage]);  // this warp is done with the stage

        if (slice == launch.n_slices - 1) {
            const int parity = (item / launch.n_slices) % 2;
#pragma unroll
            for (int tile = 0; tile < MAX_TILES; ++tile) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float sum = sums[tile][h];
                    sum += __shfl_xor_sync(FULL_WARP, sum, 1);
                    sum += __shfl_xor_sync(FULL_WARP, sum, 2);
                    if (t == 0 && tile < launch.tiles) warp_sums[parity][warp][tile * TILE_ROWS + g + 8 * h] = sum;
                    sums[tile][h] = 0.0f;
                }
            }
            sync_consumers();  // the chunk's sums are in
            if (finishes && group < epilogue.n_groups) {
                float result[Epilogue::ROWS];
#pragma unroll
                for (int k = 0; k < Epilogue::ROWS; ++k) {
                    float sum = 0.0f;
#pragma unroll
                    for (int w = 0; w < CONSUMERS; ++w) sum += warp_sums[parity][w][lane * Epilogue::ROWS + k];
                    result[k] = sum * inv_rms;
                }
                epilogue.finish(group, result, prepared);
            }
        }
    }
}

// ---- Launch ------------------------------------------------------------------------------------------------

template <class Epilogue>
using Int8Kernel = void (*)(Int8Launch, Epilogue);

// The kernel of one format, or nullptr for a type this file does not read.
template <class Epilogue>
Int8Kernel<Epilogue> kernel_for(int type) {
    switch (type) {
        case GGML_Q4_0: return gemv_int8<Int8Q4_0, Epilogue>;
        case GGML_Q4_1: return gemv_int8<Int8Q4_1, Epilogue>;
        case GGML_Q5_0: return gemv_int8<Int8Q5_0, Epilogue>;
        case GGML_Q5_1: return gemv_int8<Int8Q5_1, Epilogue>;
        case GGML_Q8_0: return gemv_int8<Int8Q8_0, Epilogue>;
        case GGML_IQ4_NL: return gemv_int8<Int8IQ4_NL, Epilogue>;
        case GGML_Q2_K: return gemv_int8<Int8Q2_K, Epilogue>;
        case GGML_Q3_K: return gemv_int8<Int8Q3_K, Epilogue>;
        case GGML_Q4_K: return gemv_int8<Int8Q4_K, Epilogue>;
        case GGML_Q5_K: return gemv_int8<Int8Q5_K, Epilogue>;
        case GGML_Q6_K: return gemv_int8<Int8Q6_K, Epilogue>;
        case GGML_IQ4_XS: return gemv_int8<Int8IQ4_XS, Epilogue>;
        case GGML_F16: return gemv_int8<F16Rows, Epilogue>;
        default: return nullptr;
    }
}

// Epilogues whose group g is row g of one weight: a chunk of whole rows is one stretch of it.
template <class Epilogue>
struct ConsecutiveRows : std::false_type {};
template <bool ADD_RESIDUAL>
struct ConsecutiveRows<StoreRows<1, ADD_RESIDUAL>> : std::true_type {};

// The weights of a launch.
struct LaunchWeights {
    WeightPart parts[2];
    int n_parts;
};
template <bool ADD_RESIDUAL>
LaunchWeights weights_of(const StoreRows<1, ADD_RESIDUAL>& e) {
    return {{e.weight}, 1};
}
template <GateActivation ACTIVATION>
LaunchWeights weights_of(const GemvGated<ACTIVATION>& e) {
    return {{e.gate, e.up}, 2};
}

// The kernel for a launch's weights (all of one type), or nullptr where this file has none.
template <class Epilogue>
Int8Kernel<Epilogue> kernel_of(const Epilogue&, const LaunchWeights& weights) {
    for (int p = 1; p < weights.n_parts; ++p)
        if (weights.parts[p].type != weights.parts[0].type) return nullptr;
    return kernel_for<Epilogue>(weights.parts[0].type);
}

int sm_count() {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        return 0;
    return count;
}

int shared_limit() {
    int device = 0, limit = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
        return 0;
    return limit;
}

std::size_t align_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Where this kernel streams a product's weights faster than gemv.cu's: where each SM's block has enough of them
// to fill its pipeline, PREFERRED_VALUES_PER_SM weights or more. Measured in a decode layer's chain on the H200
// (docs/PERFORMANCE.md, session 24), it wins at 127K an SM (Llama-3.2-1B's ffn_down, 8192 x 2048: 8.1 against
// 12.1 us in Q4_0) and above (1B's gate|up, 254K; the output heads, 1M), and loses at 66K (Qwen2.5-0.5B's
// gate|up, 2 x 4864 x 896: 6.7 against 5.5 us) and below (1B's q|k|v, 48K; attn_output, 32K), where one memory
// round trip per warp (gemv.cu) beats a pipeline of one or two items a block. The rule holds for every type: a
// Q6_K gate|up, once the exception, takes 14.3 against 20.9 us here at 1B (docs/PERFORMANCE.md, step 58).
constexpr double PREFERRED_VALUES_PER_SM = 96 * 1024;

// How a launch of these weights runs, or false where it cannot: the GPU (sm_90+, and the shared memory x
// needs), the types, their alignment (the copy engine reads from 16-byte boundaries) and the row length.
//   - tiles: two per chunk where the rows still make a chunk for every SM, else one;
//   - the budget: STAGE_BUDGET, or the block's whole shared memory past x (the room) where three stages of whole
//     rows fit in the room but not in STAGE_BUDGET: whole rows (one copy a row, or a chunk's in one) then beat
//     more stages of row slices (Llama-3.2-1B's Q6_K head 123 -> 75 us, its Q8_0 gate|up 17.2 -> 14.7 us: two
//     slices a row at 160 KB; docs/PERFORMANCE.md, session 43). Elsewhere the room is left to the kernels PDL
//     overlaps with this one;
//   - the slice: as many whole storage blocks (of every type in the launch) as make a stage of at most a third
//     of the budget (all of a row where it fits), balanced over the row's slices;
//   - stages: as many as the budget holds, MIN_STAGES .. MAX_STAGES;
//   - contiguous: StoreRows' chunks of whole rows, one stretch of the weight, come in one copy, unless the
//     rows' length is a multiple of 32 bytes (Q4_0 and Q4_K at 2048 values: 1152 bytes, 9 x 128): a fragment
//     load reads the same 16 bytes of 8 rows (lanes g = 0..7), which then sit at most 4 distinct 32-byte
//     positions apart modulo the 128 bytes of the 32 banks (8 rows on the same banks at 0 mod 128). Those rows
//     come one copy each, into slots an odd number of 16-byte units long: the 8 windows tile the banks.
//     (Rows of 8 mod 16 bytes, Qwen2.5-0.5B's 504-byte Q4_0 rows, share a bank pairwise; the single copy still
//     wins there. Measured in docs/PERFORMANCE.md, session 12.)
template <class Epilogue>
bool plan_launch(const Epilogue& epilogue, const LaunchWeights& weights, int in_features, Int8Launch& launch,
                 std::size_t& shared, int& blocks) {
    if (minfer_compute_capability() < 90 || !minfer_int8_gemv() || in_features <= 0) return false;
    int granule = QK;
    double bytes_per_value = 0.0;
    for (int p = 0; p < weights.n_parts; ++p) {
        const StorageBlock block = storage_block(weights.parts[p].type);
        if (block.values == 0 || in_features % block.values != 0 || !is_aligned(weights.parts[p].data, COPY_ALIGNMENT))
            return false;
        granule = std::max(granule, block.values);
        bytes_per_value = std::max(bytes_per_value, double(block.bytes) / block.values);
    }
    const int sms = sm_count(), limit = shared_limit();
    if (sms == 0) return false;
    const int total_slots = epilogue.n_groups * Epilogue::ROWS;
    const int tiles = ceil_div(total_slots, chunk_slots(MAX_TILES)) >= sms ? MAX_TILES : 1;
    const int slots = chunk_slots(tiles);
    // x's form in shared memory (the parts' types are one: kernel_of).
    const std::size_t x_bytes =
        weights.parts[0].type == GGML_F16 ? SplitX::bytes(in_features) : QuantizedX::bytes(in_features);
    if (x_bytes + STATIC_RESERVE >= std::size_t(limit)) return false;
    // A slot of a slice of `values` values: its bytes in the widest type and the units around them, an odd
    // number of 16-byte units (slots 16 mod 32 bytes apart: see contiguous below).
    const auto slot_stride = [&](int values) {
        const std::size_t units =
            align_up(std::size_t(values * bytes_per_value) + WINDOW_SLACK, COPY_ALIGNMENT) / COPY_ALIGNMENT;
        return int((units | 1) * COPY_ALIGNMENT);
    };
    const std::size_t room = std::size_t(limit) - x_bytes - STATIC_RESERVE;
    const std::size_t whole_rows_x3 = std::size_t(slots) * slot_stride(in_features) * 3;
    const std::size_t budget =
        whole_rows_x3 > STAGE_BUDGET && whole_rows_x3 <= room ? room : std::min(STAGE_BUDGET, room);
    const int max_slices = in_features / granule;
    int n_slices = 1;
    while (n_slices < max_slices &&
           std::size_t(slots) * slot_stride(ceil_div(in_features / granule, n_slices) * granule) * 3 > budget)
        ++n_slices;
    const int slice_values = ceil_div(in_features / granule, n_slices) * granule;
    n_slices = ceil_div(in_features, slice_values);
    const std::size_t stage_bytes = std::size_t(slots) * slot_stride(slice_values);
    const int stages = int(std::min<std::size_t>(MAX_STAGES, budget / stage_bytes));
    if (stages < MIN_STAGES) return false;
    shared = stages * stage_bytes + x_bytes;
    const int n_chunks = ceil_div(total_slots, slots);
    launch.in_features = in_features;
    launch.tiles = tiles;
    launch.n_chunks = n_chunks;
    launch.slice_values = slice_values;
    launch.n_slices = n_slices;
    launch.stages = stages;
    launch.slot_stride = slot_stride(slice_values);
    launch.contiguous = ConsecutiveRows<Epilogue>::value && n_slices == 1 &&
                        row_bytes(weights.parts[0].type, in_features) % (2 * COPY_ALIGNMENT) != 0;
    blocks = std::min(n_chunks, sms);
    return true;
}

}  // namespace

template <class Epilogue>
bool gemv_int8_takes(const Epilogue& epilogue, int in_features) {
    const LaunchWeights weights = weights_of(epilogue);
    Int8Launch launch{};
    std::size_t shared = 0;
    int blocks = 0;
    return kernel_of(epilogue, weights) != nullptr && plan_launch(epilogue, weights, in_features, launch, shared, blocks);
}

template <class Epilogue>
bool gemv_int8_prefers(const Epilogue& epilogue, int in_features) {
    const double values = double(epilogue.n_groups) * Epilogue::ROWS * in_features;
    return values >= PREFERRED_VALUES_PER_SM * sm_count() && gemv_int8_takes(epilogue, in_features);
}

template <class Epilogue>
cudaError_t launch_gemv_int8_epilogue(const Epilogue& epilogue, const float* x, const float* norm_weight, float eps,
                                      int in_features, cudaStream_t stream) {
    const LaunchWeights weights = weights_of(epilogue);
    const Int8Kernel<Epilogue> kernel = kernel_of(epilogue, weights);
    Int8Launch launch{x, norm_weight, eps};
    std::size_t shared = 0;
    int blocks = 0;
    if (kernel == nullptr || !plan_launch(epilogue, weights, in_features, launch, shared, blocks))
        return minfer_refuse("gemv_int8 does not take this launch (gemv_int8_takes is false)");
    const cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    if (error != cudaSuccess) return error;
    // grid.x: blocks (one an SM) that each take every gridDim.x-th chunk of 16 or 32 rows; block: CONSUMERS warps
    // splitting each slice of a chunk along the row, and the PRODUCER warp.
    return launch_overlapped(kernel, dim3(blocks), dim3(WARPS * WARP_SIZE), shared, stream, launch, epilogue);
}

// The epilogues gemv.cu sends here (gemv_epilogues.cuh declares the two functions).
using StoreRowsPlain = StoreRows<1, false>;
using StoreRowsAdding = StoreRows<1, true>;
using GemvSwiglu = GemvGated<GateActivation::SILU>;
using GemvGeglu = GemvGated<GateActivation::GELU_TANH>;
#define MINFER_GEMV_INT8_EPILOGUE(Epilogue)                                                                      \
    template bool gemv_int8_takes<Epilogue>(const Epilogue&, int);                                              \
    template bool gemv_int8_prefers<Epilogue>(const Epilogue&, int);                                            \
    template cudaError_t launch_gemv_int8_epilogue<Epilogue>(const Epilogue&, const float*, const float*, float, \
                                                             int, cudaStream_t);
MINFER_GEMV_INT8_EPILOGUE(StoreRowsPlain)
MINFER_GEMV_INT8_EPILOGUE(StoreRowsAdding)
MINFER_GEMV_INT8_EPILOGUE(GemvSwiglu)
MINFER_GEMV_INT8_EPILOGUE(GemvGeglu)
#undef MINFER_GEMV_INT8_EPILOGUE

}  // namespace minfer

using namespace minfer;

// The tensor-core path by itself (the tests' way to it): launch_gemv takes it wherever gemv_int8_takes.
extern "C" cudaError_t launch_gemv_int8(const void* weight, int type, const float* x, const float* norm_weight,
                                        float eps, const float* residual, float* y, int in_features, int out_features,
                                        cudaStream_t stream) {
    constexpr const char* REFUSAL =
        "type must be F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or IQ4_NL (rows of whole 32-value blocks) or Q2_K, Q3_K, "
        "Q4_K, Q5_K, Q6_K or IQ4_XS (rows of whole 256-value super-blocks), the weight 16-byte aligned, x's parts "
        "and two stages fitting shared memory, and the GPU sm_90 or newer";
    if (out_features <= 0) return minfer_refuse("out_features must be positive");
    if (row_bytes(type, in_features) < 0) return minfer_refuse(REFUSAL);
    const WeightPart part{static_cast<const std::uint8_t*>(weight), row_bytes(type, in_features), type, out_features};
    const auto launch = [&](const auto& epilogue) {
        if (!gemv_int8_takes(epilogue, in_features)) return minfer_refuse(REFUSAL);
        return launch_gemv_int8_epilogue(epilogue, x, norm_weight, eps, in_features, stream);
    };
    if (residual != nullptr) return launch(StoreRowsAdding{part, y, residual, out_features});
    return launch(StoreRowsPlain{part, y, nullptr, out_features});
}
