// One-token GEMVs over many rows, the output head above all (151936 rows for Qwen2.5-0.5B's vocabulary), on
// the integer tensor cores, with the weights staged through shared memory by the copy engine (sm_90):
//
//     y = W norm(x) (+ residual)      W: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL or Q6_K; norm: RMSNorm with its
//                                     weight, or nothing
//
// launch_gemv (gemv.cu) sends its launches here when the output has at least MANY_ROWS rows and the GPU
// has what this kernel needs (minfer_gemv_int8_takes); it computes the same function as gemv.cu's kernel.
//
// Why. gemv.cu reads each lane's few bytes of a block with 2-byte loads (the 18-, 22- and 34-byte blocks
// allow no wider ones) and decodes every weight to float32 for the CUDA cores: at the head's 136 million
// weights it moves 1.3 TB/s (Q4_0) to 2.2 TB/s (Q8_0), where an F16 head, read with 16-byte loads and no
// decoding, streams at 3.9 TB/s. Here, a block of WARPS warps has the copy engine bring CHUNK_ROWS whole rows
// at a time into shared memory (cp.async.bulk: one contiguous stretch of the tensor, no registers held,
// STAGES chunks in flight), and multiplies them on the integer tensor cores: a 32-value block of 16 rows is
// one mma.sync.m16n8k32 (int8 times int8, int32 sums) whose A operand is the block's quants as they are
// stored, after at most a mask and a shift per 8 values (IQ4_NL's: the int8 levels its nibbles index, looked
// up with byte permutes). Q6_K, the output head llama-quantize gives every K-quant preset where the rows are
// whole super-blocks, is a 32-value block too once its halves are apart: each 16 values have their own scale,
// so a block is two MMAs, each with the other half's quants zeroed (HALF_SCALES), and its 6-bit q - 32 is an
// int8 after a bit flip and a sign extension. The other super-block formats (Q2_K .. Q5_K, IQ4_XS) stay on
// gemv.cu's kernel: their mins have no place in this product, and their heads are rare.
//
// The activations as integers, without losing float32's precision. x (times the norm weight) is cut into
// 32-value blocks like the weights; block b gets the scale d_b = max |x_j| / 127 and each value three int8
// parts, each the rounded remainder of the one before, times 128:
//     x_j / d_b = q1_j + q2_j / 128 + q3_j / 16384 + e_j,   |q1| <= 127, |q2|, |q3| <= 64, |e_j| <= 2^-15
// (the remainders are exact in float32), so x is kept to 2^-22 of its block's largest value. The three
// parts are three columns of the MMA's B operand (n = 8; the other five are zero): one MMA gives, for
// each of the tile's rows, the three dot products D_c = sum_j w_j q_c,j, exactly, and the block adds
//     d_w * d_b * (D_1 + D_2 / 128 + D_3 / 16384)     (+ m * sum_j x_j for Q4_1's and Q5_1's offset m)
// to the row. A format's zero point z (w = d * (q - z)) costs nothing: the MMA's accumulator starts at
// -z * sum_j q_c,j. Against gemv.cu's exactly decoded weights times float32 x, the result moves by at most
// that 2^-22 of the block maximum per value: inside the float32 error bound the tests hold both kernels to.
//
// Work split. The grid is as many blocks as the GPU holds at once; block i takes chunks i, i + gridDim.x,
// ... of CHUNK_ROWS rows. Its warps first quantize all of x into shared memory (a warp per 32-value block
// at a time: one redux.sync for its maximum, one per part for the part sums), applying the norm weight and
// gathering the sum of squares on the way (the norm is the scalar inv_rms, applied at the end, as in
// gemv.cu). Each chunk is then split along the row: warp w multiplies blocks w n / WARPS .. (w + 1) n / WARPS
// - 1 of the n of every row of the chunk, and the warps' sums meet in shared memory. In an mma.m16n8k32, lane
// (g, t) (g = lane / 4, t = lane % 4) holds row g's and row g + 8's values 4t .. 4t + 3 and 16 + 4t ..
// 16 + 4t + 3: for the nibble formats exactly the low and the high nibbles of bytes 4t .. 4t + 3 of the
// block's quants, for Q8_0 bytes 4t .. and 16 + 4t .. . The first STAGES copies are issued before waiting
// for the previous kernel (the weights do not depend on it); each later one as soon as its buffer is free.
#include <cuda_fp16.h>

#include <cstdint>

#include "common.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int TILE_ROWS = 16;                  // rows of one mma.m16n8k32
constexpr int CHUNK_ROWS = 32;                 // rows a block brings into shared memory at a time
constexpr int TILES = CHUNK_ROWS / TILE_ROWS;  // tiles of a chunk
constexpr int WARPS = 8;                       // warps per block, sharing each chunk along the row
constexpr int STAGES = 3;                      // chunks in flight per block
constexpr int PARTS = 3;                       // int8 parts per activation
constexpr int PART_SCALE = 128;                // a part is the remainder of the one before, times this
constexpr float Q1_MAX = 127.0f;               // the first part's range
constexpr int PART_PADDING = 16;               // bytes after each part's row in shared memory (see QuantizedX)
constexpr int COPY_ALIGNMENT = 16;             // cp.async.bulk: addresses and sizes in 16-byte units

// Reads of a chunk staged in shared memory: the blocks keep their bytes on a 2-byte boundary (Q4_1's and
// Q5_1's on a 4-byte one).
__device__ __forceinline__ std::uint32_t shared_u16(const void* p) { return *static_cast<const unsigned short*>(p); }
__device__ __forceinline__ std::uint32_t shared_u32(const void* p) { return *static_cast<const unsigned int*>(p); }
__device__ __forceinline__ std::uint32_t shared_word(const std::uint8_t* p) {
    return shared_u16(p) | (shared_u16(p + 2) << 16);
}

// ---- Weight formats: one row's block as lane (g, t) needs it ------------------------------------------------
//
// load: the lane's bytes of block `block` of a row staged in shared memory; quants: the two A-fragment
// words, values 4t .. 4t + 3 (low) and 16 + 4t .. 16 + 4t + 3 (high) of the block as int8 (offset by the
// zero point ZERO); scale (and, where HAS_OFFSET, offset): d and m of w = d * (q - ZERO) + m. Where
// HALF_SCALES, scale is that of the low 16 values and scale_high that of the high 16.

struct Int8Q4_0 {
    static constexpr int ZERO = 8;
    static constexpr bool HAS_OFFSET = false;
    static constexpr bool HALF_SCALES = false;
    struct Raw {
        std::uint32_t qs, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + block;
        return {shared_word(b->qs + 4 * t), shared_u16(&b->d)};
    }
    __device__ static void quants(const Raw& w, int, std::uint32_t& low, std::uint32_t& high) {
        low = w.qs & 0x0F0F0F0Fu;
        high = (w.qs >> 4) & 0x0F0F0F0Fu;
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

struct Int8Q4_1 {  // 20-byte blocks keep a 4-byte boundary
    static constexpr int ZERO = 0;
    static constexpr bool HAS_OFFSET = true;
    static constexpr bool HALF_SCALES = false;
    struct Raw {
        std::uint32_t d_and_m, qs;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ4_1* b = reinterpret_cast<const BlockQ4_1*>(row) + block;
        return {shared_u32(b), shared_u32(b->qs + 4 * t)};
    }
    __device__ static void quants(const Raw& w, int, std::uint32_t& low, std::uint32_t& high) {
        low = w.qs & 0x0F0F0F0Fu;
        high = (w.qs >> 4) & 0x0F0F0F0Fu;
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d_and_m & 0xFFFFu); }
    __device__ static float offset(const Raw& w) { return half_bits_to_float(w.d_and_m >> 16); }
};

struct Int8Q5_0 {
    static constexpr int ZERO = 16;
    static constexpr bool HAS_OFFSET = false;
    static constexpr bool HALF_SCALES = false;
    struct Raw {
        std::uint32_t qs, qh, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ5_0* b = reinterpret_cast<const BlockQ5_0*>(row) + block;
        return {shared_word(b->qs + 4 * t), shared_word(b->qh), shared_u16(&b->d)};
    }
    __device__ static void quants(const Raw& w, int t, std::uint32_t& low, std::uint32_t& high) {
        low = (w.qs & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> (4 * t));
        high = ((w.qs >> 4) & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> (16 + 4 * t));
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

struct Int8Q5_1 {  // 24-byte blocks keep a 4-byte boundary
    static constexpr int ZERO = 0;
    static constexpr bool HAS_OFFSET = true;
    static constexpr bool HALF_SCALES = false;
    struct Raw {
        std::uint32_t d_and_m, qh, qs;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ5_1* b = reinterpret_cast<const BlockQ5_1*>(row) + block;
        return {shared_u32(b), shared_u32(b->qh), shared_u32(b->qs + 4 * t)};
    }
    __device__ static void quants(const Raw& w, int t, std::uint32_t& low, std::uint32_t& high) {
        low = (w.qs & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> (4 * t));
        high = ((w.qs >> 4) & 0x0F0F0F0Fu) | spread_fifth_bits(w.qh >> (16 + 4 * t));
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d_and_m & 0xFFFFu); }
    __device__ static float offset(const Raw& w) { return half_bits_to_float(w.d_and_m >> 16); }
};

struct Int8IQ4_NL {  // the quants are the int8 levels the nibbles index
    static constexpr int ZERO = 0;
    static constexpr bool HAS_OFFSET = false;
    static constexpr bool HALF_SCALES = false;
    struct Raw {
        std::uint32_t qs, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockIQ4_NL* b = reinterpret_cast<const BlockIQ4_NL*>(row) + block;
        return {shared_word(b->qs + 4 * t), shared_u16(&b->d)};
    }
    __device__ static void quants(const Raw& w, int, std::uint32_t& low, std::uint32_t& high) {
        iq4_nl_levels(w.qs, low, high);
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

struct Int8Q8_0 {
    static constexpr int ZERO = 0;
    static constexpr bool HAS_OFFSET = false;
    static constexpr bool HALF_SCALES = false;
    struct Raw {
        std::uint32_t low, high, d;
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + block;
        const auto* qs = reinterpret_cast<const std::uint8_t*>(b->qs);
        return {shared_word(qs + 4 * t), shared_word(qs + 16 + 4 * t), shared_u16(&b->d)};
    }
    __device__ static void quants(const Raw& w, int, std::uint32_t& low, std::uint32_t& high) {
        low = w.low;
        high = w.high;
    }
    __device__ static float scale(const Raw& w) { return half_bits_to_float(w.d); }
};

// Block j of a super-block (values 32j .. 32j + 31, in half h = j / 4, quarter r = j % 4; ggml_formats.cuh
// has the layout): the low nibbles (r < 2) or high nibbles of ql bytes 64h + 32(r % 2) .., with bits 2r and
// 2r + 1 of qh bytes 32h .. above them, scales 2j and 2j + 1 for its two halves. 210-byte super-blocks keep a
// 2-byte boundary only.
struct Int8Q6_K {
    static constexpr int ZERO = 0;  // q - 32 is made a signed byte in load, not subtracted in the MMA
    static constexpr bool HAS_OFFSET = false;
    static constexpr bool HALF_SCALES = true;
    struct Raw {
        std::uint32_t low, high;
        float scale_low, scale_high;
    };
    // The 6-bit values q of a word's bytes as the signed bytes q - 32: flipping bit 5 gives q - 32 in 6 bits,
    // whose sign bit 5 then fills bits 6 and 7 (0x20 * 6 = 0xC0: no carry reaches the next byte).
    __device__ static std::uint32_t centred(std::uint32_t q) {
        const std::uint32_t x = q ^ 0x20202020u;
        return x | ((x & 0x20202020u) * 6u);
    }
    __device__ static Raw load(const std::uint8_t* row, int block, int t) {
        const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + block / 8;
        const int j = block % 8, h = j / 4, r = j % 4;
        const std::uint8_t* ql = b->ql + 64 * h + 32 * (r % 2) + 4 * t;
        const std::uint8_t* qh = b->qh + 32 * h + 4 * t;
        const int nibble_shift = 4 * (r / 2), high_shift = 2 * r;
        const auto value = [&](int offset) {
            return centred(((shared_word(ql + offset) >> nibble_shift) & 0x0F0F0F0Fu) |
                           (((shared_word(qh + offset) >> high_shift) & 0x03030303u) << 4));
        };
        const float d = half_bits_to_float(shared_u16(&b->d));
        return {value(0), value(16), d * float(b->scales[2 * j]), d * float(b->scales[2 * j + 1])};
    }
    __device__ static void quants(const Raw& w, int, std::uint32_t& low, std::uint32_t& high) {
        low = w.low;
        high = w.high;
    }
    __device__ static float scale(const Raw& w) { return w.scale_low; }
    __device__ static float scale_high(const Raw& w) { return w.scale_high; }
};

// ---- x, quantized into shared memory ---------------------------------------------------------------------

// Per 32-value block b of x: the accumulator start of each part's column (-ZERO * sum_j q_c,j; a fourth,
// always 0, pads to 16 bytes), d_b, the block's sum of (quantized) values; then the parts, one row of
// in_features int8 each. The padding after each part's row puts the words that lanes (0, t), (1, t) and
// (2, t) read at once into different banks.
struct QuantizedX {
    int* zero_terms;   // [n_blocks][4]
    float* scales;     // [n_blocks]
    float* sums;       // [n_blocks]
    std::int8_t* parts;  // [PARTS][part_stride]
    int part_stride;

    __host__ __device__ static std::size_t bytes(int in_features) {
        const std::size_t n_blocks = in_features / QK;
        return n_blocks * (4 * sizeof(int) + 2 * sizeof(float)) + PARTS * std::size_t(in_features + PART_PADDING);
    }
    __device__ static QuantizedX in(std::uint8_t* shared, int in_features) {
        const int n_blocks = in_features / QK;
        QuantizedX q;
        q.zero_terms = reinterpret_cast<int*>(shared);
        q.scales = reinterpret_cast<float*>(q.zero_terms + 4 * n_blocks);
        q.sums = q.scales + n_blocks;
        q.parts = reinterpret_cast<std::int8_t*>(q.sums + n_blocks);
        q.part_stride = in_features + PART_PADDING;
        return q;
    }
};

struct Int8GemvInput {
    const std::uint8_t* weight;
    long long row_bytes;
    int n_rows;
    const float* x;
    const float* norm_weight;  // nullptr: no norm
    float eps;
    int in_features;
    const float* residual;  // nullptr: none; may be y itself (each element read, then written, by one thread)
    float* y;
};

// Shared memory of a launch: STAGES chunk buffers, then x quantized.
__host__ __device__ inline std::size_t chunk_bytes(long long row_bytes) { return CHUNK_ROWS * std::size_t(row_bytes); }
inline std::size_t shared_bytes(int type, int in_features) {
    return STAGES * chunk_bytes(row_bytes(type, in_features)) + QuantizedX::bytes(in_features);
}

// ---- The sm_90 instructions ---------------------------------------------------------------------------------
//
// Each wrapper compiles to its instruction on sm_90+ and to a trap elsewhere: the kernel is compiled for every
// architecture of the fat binary, and minfer_gemv_int8_takes launches it only on sm_90+.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MINFER_SM90 1
__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#else
#define MINFER_SM90 0
#endif

// The copy engine's side of a chunk buffer: an mbarrier that completes when the chunk's bytes have landed.
// Made visible to the copy engine by the fence, and to the other threads by a __syncthreads that follows.
__device__ __forceinline__ void init_arrival(std::uint64_t* barrier) {
#if MINFER_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(barrier)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void wait_arrival(std::uint64_t* barrier, unsigned parity) {
#if MINFER_SM90
    unsigned done = 0;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(shared_address(barrier)), "r"(parity)
            : "memory");
    } while (!done);
#else
    __trap();
#endif
}

// Rows chunk * CHUNK_ROWS .. of W (one stretch of memory) into `buffer`, `arrival` completing when they are
// there. Run by one thread. The stretch's whole 16-byte units go through the copy engine; a last chunk whose
// size is not a multiple of 16 has its last few bytes copied by this thread (read by the others only after a
// __syncthreads that follows).
__device__ void fetch_chunk(const Int8GemvInput& in, int chunk, std::uint8_t* buffer, std::uint64_t* arrival) {
    const int rows = min(CHUNK_ROWS, in.n_rows - chunk * CHUNK_ROWS);
    const unsigned bytes = unsigned(rows * in.row_bytes);
    const unsigned copied = bytes / COPY_ALIGNMENT * COPY_ALIGNMENT;
    const std::uint8_t* source = in.weight + std::size_t(chunk) * chunk_bytes(in.row_bytes);
#if MINFER_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(arrival)), "r"(copied)
                 : "memory");
    if (copied > 0) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                shared_address(buffer)),
            "l"(source), "r"(copied), "r"(shared_address(arrival))
            : "memory");
    }
#else
    __trap();
#endif
    for (unsigned i = copied; i < bytes; ++i) buffer[i] = source[i];
}

// The largest of the 32 lanes' non-negative `value`s, every lane getting it: one redux.sync over their bits
// (non-negative floats order as their bits do).
__device__ __forceinline__ float warp_max_of_non_negative(float value) {
#if MINFER_SM90
    return __uint_as_float(__reduce_max_sync(FULL_WARP, __float_as_uint(value)));
#else
    __trap();
    return value;
#endif
}

// The sum of the 32 lanes' `value`s, every lane getting it: one redux.sync.
__device__ __forceinline__ int warp_sum_int(int value) {
#if MINFER_SM90
    return __reduce_add_sync(FULL_WARP, value);
#else
    __trap();
    return value;
#endif
}

// Quantizes x (times the norm weight) into `q`, warp `warp` taking blocks warp, warp + WARPS, ...; returns
// this lane's share of sum x^2 (the raw x, for the norm).
template <int ZERO>
__device__ float quantize_x(const Int8GemvInput& in, const QuantizedX& q, int warp, int lane) {
    float x_squares = 0.0f;
    const int n_blocks = in.in_features / QK;
    for (int block = warp; block < n_blocks; block += WARPS) {
        const int i = block * QK + lane;
        const float raw = in.x[i];
        x_squares += raw * raw;
        const float value = in.norm_weight != nullptr ? raw * in.norm_weight[i] : raw;
        const float largest = warp_max_of_non_negative(fabsf(value));
        // value / largest first: 127 / largest overflows when largest is subnormal.
        const float scaled = largest > 0.0f ? value / largest * Q1_MAX : 0.0f;
        const float q1 = rintf(scaled);
        const float remainder = (scaled - q1) * PART_SCALE;  // exact: q1 is within 0.5 of scaled
        const float q2 = rintf(remainder);
        const float q3 = rintf((remainder - q2) * PART_SCALE);
        const int part[PARTS] = {int(q1), int(q2), int(q3)};
        int part_sum[PARTS];
#pragma unroll
        for (int c = 0; c < PARTS; ++c) {
            q.parts[c * q.part_stride + i] = std::int8_t(part[c]);
            part_sum[c] = warp_sum_int(part[c]);
        }
        if (lane == 0) {
            const float scale = largest / Q1_MAX;
            q.scales[block] = scale;
            q.sums[block] = scale * (float(part_sum[0]) + float(part_sum[1]) / PART_SCALE +
                                     float(part_sum[2]) / (PART_SCALE * PART_SCALE));
            *reinterpret_cast<int4*>(q.zero_terms + 4 * block) =
                make_int4(-ZERO * part_sum[0], -ZERO * part_sum[1], -ZERO * part_sum[2], 0);
        }
    }
    return x_squares;
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

// The products of blocks begin .. end - 1 of the chunk's rows (staged at `chunk`), added to `sums` (tile,
// row g or g + 8), each row's columns still spread over lanes t = 0..3 of group g. Rows past the end of W
// read the chunk's last row.
template <class Format>
__device__ __forceinline__ void chunk_products(const std::uint8_t* chunk, long long row_bytes, int rows, int begin,
                                               int end, const QuantizedX& q, int lane, float (&sums)[TILES][2]) {
    const int g = lane / 4, t = lane % 4;
    const std::uint8_t* row[TILES][2];
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile) {
#pragma unroll
        for (int h = 0; h < 2; ++h) row[tile][h] = chunk + min(tile * TILE_ROWS + g + 8 * h, rows - 1) * row_bytes;
    }
    // Lane t's accumulator pair holds columns 2t and 2t + 1, combined as D_2t * 128 + D_2t+1: for t = 0 the
    // parts q1 and q2 (weight 1 / 128 on the pair), for t = 1 q3 and a zero column (1 / 16384 / 128), for
    // t = 2, 3 zero columns.
    const float column_weight =
        t == 0 ? 1.0f / PART_SCALE : (t == 1 ? 1.0f / (PART_SCALE * PART_SCALE * PART_SCALE) : 0.0f);
    const bool holds_part = g < PARTS;  // lane (g, t) holds column g of B: part g, or a zero column
    const std::int8_t* part_row = q.parts + min(g, PARTS - 1) * q.part_stride + 4 * t;
    for (int block = begin; block < end; ++block) {
        const std::uint32_t b0 = holds_part ? *reinterpret_cast<const std::uint32_t*>(part_row + block * QK) : 0u;
        const std::uint32_t b1 = holds_part ? *reinterpret_cast<const std::uint32_t*>(part_row + block * QK + 16) : 0u;
        const int2 zero = t < 2 ? *reinterpret_cast<const int2*>(q.zero_terms + 4 * block + 2 * t) : make_int2(0, 0);
        const float lane_scale = q.scales[block] * column_weight;
        const float lane_sum = Format::HAS_OFFSET && t == 0 ? q.sums[block] : 0.0f;
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile) {
            const typename Format::Raw w[2] = {Format::load(row[tile][0], block, t), Format::load(row[tile][1], block, t)};
            std::uint32_t a[4];
            Format::quants(w[0], t, a[0], a[2]);
            Format::quants(w[1], t, a[1], a[3]);
            int d[4];
            if constexpr (Format::HALF_SCALES) {
                // One MMA per 16-value half, the other half's quants zeroed: each sum gets its own scale.
                static_assert(Format::ZERO == 0, "both halves' MMAs would count the zero term");
                const std::uint32_t low_half[4] = {a[0], a[1], 0u, 0u}, high_half[4] = {0u, 0u, a[2], a[3]};
                int d_high[4];
                mma_int8(d, low_half, b0, b1, zero.x, zero.y);
                mma_int8(d_high, high_half, b0, b1, zero.x, zero.y);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    sums[tile][h] += (float(d[2 * h] * PART_SCALE + d[2 * h + 1]) * Format::scale(w[h]) +
                                      float(d_high[2 * h] * PART_SCALE + d_high[2 * h + 1]) * Format::scale_high(w[h])) *
                                     lane_scale;
                }
            } else {
                mma_int8(d, a, b0, b1, zero.x, zero.y);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    sums[tile][h] += float(d[2 * h] * PART_SCALE + d[2 * h + 1]) * (Format::scale(w[h]) * lane_scale);
                    if constexpr (Format::HAS_OFFSET) sums[tile][h] += Format::offset(w[h]) * lane_sum;
                }
            }
        }
    }
}


// Block: WARPS warps; blockIdx.x: the first of the chunks of CHUNK_ROWS rows the block takes, gridDim.x
// apart (the grid is what the GPU holds at once, so each block quantizes x once for many chunks).
template <class Format, bool ADD_RESIDUAL>
__global__ void __launch_bounds__(WARPS * WARP_SIZE) gemv_int8(Int8GemvInput in) {
    extern __shared__ __align__(128) std::uint8_t shared[];
    __shared__ std::uint64_t arrival[STAGES];
    __shared__ float warp_squares[WARPS];
    __shared__ float warp_sums[2][WARPS][CHUNK_ROWS];  // two sets: a chunk's are read while the next's are written
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const std::size_t stage_bytes = chunk_bytes(in.row_bytes);
    const int n_chunks = ceil_div(in.n_rows, CHUNK_ROWS);
    const int my_chunks = ceil_div(n_chunks - int(blockIdx.x), gridDim.x);  // the grid has at most n_chunks blocks

    // W does not depend on the previous kernel: its first chunks are on their way before the wait.
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) init_arrival(&arrival[s]);
        for (int k = 0; k < min(STAGES, my_chunks); ++k)
            fetch_chunk(in, blockIdx.x + k * gridDim.x, shared + k * stage_bytes, &arrival[k]);
    }
    wait_for_previous_kernel();
    allow_next_kernel();

    const QuantizedX q = QuantizedX::in(shared + STAGES * stage_bytes, in.in_features);
    const float x_squares = warp_sum(quantize_x<Format::ZERO>(in, q, warp, lane));
    if (lane == 0) warp_squares[warp] = x_squares;
    __syncthreads();  // also orders the mbarrier initialization before any wait on it
    float inv_rms = 1.0f;
    if (in.norm_weight != nullptr) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) total += warp_squares[w];
        inv_rms = 1.0f / sqrtf(total / float(in.in_features) + in.eps);
    }

    const int n_blocks = in.in_features / QK;
    const int begin = warp * n_blocks / WARPS, end = (warp + 1) * n_blocks / WARPS;
    const int g = lane / 4, t = lane % 4;
    for (int k = 0; k < my_chunks; ++k) {
        const int chunk = blockIdx.x + k * gridDim.x, stage = k % STAGES;
        const int rows = min(CHUNK_ROWS, in.n_rows - chunk * CHUNK_ROWS);
        wait_arrival(&arrival[stage], (k / STAGES) % 2);
        float sums[TILES][2] = {};
        chunk_products<Format>(shared + stage * stage_bytes, in.row_bytes, rows, begin, end, q, lane, sums);
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float sum = sums[tile][h];
                sum += __shfl_xor_sync(FULL_WARP, sum, 1);
                sum += __shfl_xor_sync(FULL_WARP, sum, 2);
                if (t == 0) warp_sums[k % 2][warp][tile * TILE_ROWS + g + 8 * h] = sum;
            }
        }
        __syncthreads();  // the chunk's buffer is free, its warps' sums are in
        if (threadIdx.x == 0 && k + STAGES < my_chunks)
            fetch_chunk(in, chunk + STAGES * gridDim.x, shared + stage * stage_bytes, &arrival[stage]);
        if (threadIdx.x < rows) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) sum += warp_sums[k % 2][w][threadIdx.x];
            const int row = chunk * CHUNK_ROWS + threadIdx.x;
            sum *= inv_rms;
            if constexpr (ADD_RESIDUAL) sum += in.residual[row];
            in.y[row] = sum;
        }
    }
}

// The launch of one format and epilogue: a grid of what the GPU holds at once, at most one block per chunk.
template <class Format, bool ADD_RESIDUAL>
cudaError_t launch_kernel(const Int8GemvInput& in, std::size_t shared, cudaStream_t stream) {
    const auto kernel = gemv_int8<Format, ADD_RESIDUAL>;
    const int threads = WARPS * WARP_SIZE;
    int device = 0, sm_count = 0, blocks_per_sm = 0;
    cudaError_t error = cudaGetDevice(&device);
    if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
    if (error == cudaSuccess)
        error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    if (error == cudaSuccess) error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, shared);
    if (error != cudaSuccess) return error;
    // grid.x: blocks that each take every gridDim.x-th chunk of CHUNK_ROWS rows; block: WARPS warps sharing a
    // chunk along the row.
    const int blocks = min(ceil_div(in.n_rows, CHUNK_ROWS), max(1, sm_count * blocks_per_sm));
    return launch_overlapped(kernel, dim3(blocks), dim3(threads), shared, stream, in);
}

template <class Format>
cudaError_t launch_format(const Int8GemvInput& in, std::size_t shared, cudaStream_t stream) {
    if (in.residual != nullptr) return launch_kernel<Format, true>(in, shared, stream);
    return launch_kernel<Format, false>(in, shared, stream);
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" bool minfer_gemv_int8_takes(int type, const void* weight, int in_features) {
    const bool format = type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q5_0 || type == GGML_Q5_1 ||
                        type == GGML_Q8_0 || type == GGML_IQ4_NL || type == GGML_Q6_K;
    const int row_values = type == GGML_Q6_K ? QK_K : QK;
    if (!format || in_features <= 0 || in_features % row_values != 0 || !is_aligned(weight, COPY_ALIGNMENT))
        return false;
    int device = 0, limit = 0;
    return minfer_compute_capability() >= 90 && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
           shared_bytes(type, in_features) <= std::size_t(limit);
}

extern "C" cudaError_t launch_gemv_int8(const void* weight, int type, const float* x, const float* norm_weight,
                                        float eps, const float* residual, float* y, int in_features, int out_features,
                                        cudaStream_t stream) {
    if (!minfer_gemv_int8_takes(type, weight, in_features))
        return minfer_refuse("type must be Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL or Q6_K, the weight 16-byte "
                             "aligned, in_features whole blocks of 32 (super-blocks of 256 for Q6_K) whose chunks "
                             "fit shared memory, and the GPU sm_90 or newer");
    if (out_features <= 0) return minfer_refuse("out_features must be positive");
    const Int8GemvInput in{static_cast<const std::uint8_t*>(weight), row_bytes(type, in_features), out_features, x,
                           norm_weight, eps, in_features, residual, y};
    const std::size_t shared = shared_bytes(type, in_features);
    switch (type) {
        case GGML_Q4_0: return launch_format<Int8Q4_0>(in, shared, stream);
        case GGML_Q4_1: return launch_format<Int8Q4_1>(in, shared, stream);
        case GGML_Q5_0: return launch_format<Int8Q5_0>(in, shared, stream);
        case GGML_Q5_1: return launch_format<Int8Q5_1>(in, shared, stream);
        case GGML_IQ4_NL: return launch_format<Int8IQ4_NL>(in, shared, stream);
        case GGML_Q6_K: return launch_format<Int8Q6_K>(in, shared, stream);
        default: return launch_format<Int8Q8_0>(in, shared, stream);
    }
}
