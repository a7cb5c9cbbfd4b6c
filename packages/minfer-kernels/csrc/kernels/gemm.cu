// Matrix products for many tokens on the tensor cores: y[t][o] = sum_i W[o][i] * x[t][i], the same function
// as launch_matmul (matmul.cu), for prefill.
//
// With n_tokens = M, out_features = N and in_features = K, this is a GEMM of M x N x K multiply-adds. At
// prefill sizes (M = 512, N = 4864, K = 896) it has far more arithmetic than memory traffic: 4.5 GFLOP over
// 2.5 MB of Q4_0 weights. The CUDA cores' float32 FMAs top out near 60 TFLOP/s on an H200; its tensor cores
// do 16-bit products with float32 sums an order of magnitude faster, so both operands go through f16:
//
//   - W, in its GGUF bytes (ggml_formats.cuh), is decoded to f16 on its way into shared memory:
//     f16(d * q), one rounding of the float32 weight gguf.quants decodes (relative error <= 2^-11);
//   - x, float32, is rounded to f16 once per launch, into the workspace (round_x: relative error <= 2^-11,
//     and f16's range: |x| beyond 65504 becomes infinite, which then shows in y rather than being hidden);
//   - the tensor cores multiply the f16 tiles and accumulate in float32 registers.
// Rounding x once rather than in every block: each token's row of x is read by every tile of output features
// (76 times at Qwen2.5-0.5B's gate|up), so 16-bit x halves those reads, a thread's registers staging them, and
// the conversions.
//
// BF16 weights go through bf16 instead (Operand): W's bytes are copied as they are (exact, no decode, and
// no f16 overflow of bfloat16's range), x is rounded to bf16 (relative error <= 2^-9: four times f16's, the
// price of bf16's range), and the tensor cores multiply bf16 — the arithmetic llama.cpp's own BF16 GEMM does
// (cuBLAS on bf16 operands, x converted to bf16). Decoding each weight to f16 instead cost a float conversion
// per pair of weights on top of x's, which made the narrow products 22-33% slower than F16's (H200).
//
// Work split. The block computes a BM x BN tile of y (BM tokens by BN output features), walking K in
// steps of 32 (one quantized block per weight row per step; for the K-quants and IQ4_XS, the 32-value slice
// of a 256-value super-block: one Q4_K, Q5_K or IQ4_XS sub-block, two Q2_K, Q3_K or Q6_K sub-blocks). Each
// step, the block's threads
//   1. load a later step's 32 columns of x and of W from global memory into registers (raw bytes),
//   2. multiply the current step's tiles, already in shared memory, on the tensor cores,
//   3. decode the registers to f16 and store them into the other shared-memory buffer,
// then meet at one barrier. The global loads of step 1 are in flight while step 2 computes: two
// shared-memory buffers and one or two register stages (multiply_staged_steps) hide part of the load latency.
// F16 and BF16 weights need no decoding, and neither does the rounded x: for them the step's bytes go straight
// from global to shared memory by sm_80's cp.async (async_copy.cuh), up to four stages of them, three steps
// of copies in flight while the tensor cores multiply (multiply_copied_steps).
//
// Split K. A narrow product's tiles can be too few for the GPU (ffn_down at 512 tokens: 112 64 x 64 tiles for
// an H200's 528 block slots), and each of them walks a long K bound by its loads' latency (152 steps). Then
// each tile's K is cut into slices (splits_for), one block each: a slice's block writes its partial tile into
// a workspace, and gemm_sum_splits adds the slices up in slice order, so the result does not depend on which
// block finished first.
//
// Launches. round_x, the tiles and the split sum are each launched overlapped (common.cuh, programmatic
// dependent launch): a kernel's blocks start while the kernel before it ends, instead of after the GPU has
// drained, and the tiles have their first step's weights in flight before they wait for x.
//
// Epilogues. y = residual + (sum + bias) as the whole sum is stored (gemm_sum_splits's store with split K).
// Paired (launch_gemm_swiglu, launch_gemm_geglu), the W tile holds gate and up rows in turns of 8 (tile_feature),
// so that a thread's accumulators hold both sums of its features, and the store is h = act(gate) * up (silu, or
// the tanh GELU: the launch's GateActivation).
//
// Each warp owns a WARP_M x WARP_N piece of the block tile, made of 16 x 8 accumulator fragments, and
// multiplies with mma.sync.m16n8k16 (f16 or bf16 in, float32 accumulate) fed by ldmatrix (mma.cuh). That
// instruction set exists from sm_80; sm_75 has the k8 half of it for f16 only (two m16n8k8 do one m16n8k16,
// with the same fragment layouts); older GPUs (sm_70/72, which some CUDA 12 toolkits still build), and sm_75
// for bf16, take a scalar path through the same shared-memory tiles. Every compiled architecture computes the
// same function.
//
// Warpgroups. On sm_90a (H100, H200: warpgroup_tiles_run) the copied formats' tiles are warpgroup tiles instead
// (WarpgroupTiles, 128 x 128, for LargeTiles; SmallWarpgroupTiles, 64 x 128, for SmallTiles): the same steps,
// stages, slices and epilogues, but each warpgroup multiplies with wgmma (wgmma.cuh), the tensor cores reading
// both tiles straight from shared memory, 64 x 128 x 16 an instruction, instead of each warp loading fragments by
// ldmatrix for 16 x 8 x 16 ones; the tiles' rows are stored in wgmma's 64-byte swizzle (tile_offset) rather than
// padded. bench/wgmma_probe.cu measured the instruction at 190-316 TFLOP/s on Llama-3.2-1B's prompt products,
// against ~120 for the whole mma.sync prompt.
//
// Staged weights. A prompt of STAGED_MIN_TOKENS tokens or more decodes the other formats' weights once, into f16
// rows of the workspace (stage_weights), and multiplies them as F16 weights (launch_staged): a decoding tile
// decodes its W blocks again for every tile of tokens, with registers and issue slots the products need.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "async_copy.cuh"
#include "common.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"
#include "mma.cuh"
#include "wgmma.cuh"

namespace minfer {
namespace {

constexpr int K_STEP = QK;              // columns of K per step: one 32-value block of every weight row
constexpr int TILE_PAD = 8;             // f16 padding per shared-memory row: keeps ldmatrix free of bank conflicts
constexpr int TILE_STRIDE = K_STEP + TILE_PAD;  // f16 per shared-memory row (80 bytes: 16-byte aligned rows)
constexpr int X_VECTORS_PER_ROW = K_STEP / 8;   // 16-byte loads covering one token's 32 rounded values of x

// The block tile (BM tokens x BN output features), its warps' layout (WARPS_M x WARPS_N warps), the
// blocks each SM should hold at once (which caps the registers per thread), how many register stages
// of loads the pipeline keeps, and who multiplies: each warp with mma.sync (its shared tiles' rows padded to
// TILE_STRIDE), or, WARPGROUPS, each warpgroup with wgmma (sm_90a; rows of K_STEP values in the 64-byte swizzle,
// wgmma.cuh).
template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int MIN_BLOCKS_PER_SM_, int REGISTER_STAGES_,
          bool WARPGROUPS_ = false>
struct TileShape {
    static constexpr int REGISTER_STAGES = REGISTER_STAGES_;  // steps of loads in flight: 1 or 2 (see pipeline_step)
    static constexpr bool WARPGROUPS = WARPGROUPS_;
    static constexpr int BM = BM_;
    static constexpr int BN = BN_;
    static constexpr int WARPS_M = WARPS_M_;
    static constexpr int WARPS_N = WARPS_N_;
    static constexpr int MIN_BLOCKS_PER_SM = MIN_BLOCKS_PER_SM_;
    static constexpr int THREADS = WARPS_M * WARPS_N * WARP_SIZE;
    static constexpr int WARP_M = BM / WARPS_M;   // tokens of one warp's piece of the tile
    static constexpr int WARP_N = BN / WARPS_N;   // output features of one warp's piece
    static constexpr int FRAGS_M = WARP_M / 16;   // 16-row accumulator fragments along M
    static constexpr int FRAGS_N = WARP_N / 8;    // 8-column accumulator fragments along N
    static constexpr int X_VECTORS_PER_THREAD = BM * X_VECTORS_PER_ROW / THREADS;
    static constexpr int W_PARTS_PER_THREAD = 2 * BN / THREADS;  // a part is half a block: 16 weights
    static constexpr int ROW_STRIDE = WARPGROUPS ? K_STEP : TILE_STRIDE;  // values from one tile row to the next
    static constexpr int X_TILE_VALUES = BM * ROW_STRIDE;
    static constexpr int W_TILE_VALUES = BN * ROW_STRIDE;
    // Shared-memory stages of the copied formats' pipeline (multiply_copied_steps): as many x-and-W stages as fit
    // the 64 KB of shared memory a block may have on the smallest GPU the kernel runs on (sm_75), at most four
    // (three steps of copies in flight): SmallTiles four (40 KB), LargeTiles three (60 KB, two blocks an SM on
    // an H200), the warpgroup tiles four (64 and 48 KB: their rows are not padded).
    static constexpr int STAGE_BYTES = (X_TILE_VALUES + W_TILE_VALUES) * 2;
    static constexpr int COPY_STAGES = 64 * 1024 / STAGE_BYTES < 4 ? 64 * 1024 / STAGE_BYTES : 4;
    static_assert(BM % (16 * WARPS_M) == 0 && BN % (16 * WARPS_N) == 0, "warp pieces are whole 16 x 16 fragments");
    static_assert(BM * X_VECTORS_PER_ROW % THREADS == 0, "the x tile splits evenly over the threads");
    static_assert(2 * BN % THREADS == 0, "the W tile's half blocks split evenly over the threads");
    static_assert(!WARPGROUPS || (BN == 128 && WARPS_N == 1 && WARPS_M % 4 == 0 && BM == 16 * WARPS_M),
                  "a warpgroup tile: warpgroups of 64 tokens x 128 features, a warp's piece 16 x 128 (wgmma.cuh)");
};

// 128 x 128, 8 warps of 64 x 32: the most reuse per byte loaded, for products that give every SM a tile.
// Two blocks per SM (128 registers per thread), so one block's loads overlap the other's products. Its register
// stages depend on the format (LargeTiles, below the formats).
template <int REGISTER_STAGES>
using LargeTileShape = TileShape<128, 128, 2, 4, 2, REGISTER_STAGES>;
// 64 x 64, 4 warps of 32 x 32: four times as many blocks, for narrow products (N = 896) and few tokens.
// Their blocks wait for their loads: two register stages, and four blocks per SM (128 registers a thread,
// which the 16-bit x leaves room for), whose slots split K fills (splits_for).
using SmallTiles = TileShape<64, 64, 2, 2, 4, 2>;
// The tiles multiplied by warpgroups (sm_90a, where the device is an H100 or H200: warpgroup_tiles_run), for the
// copied formats: the tensor cores read both operands from shared memory for 64 x 128 x 16 at once instead of a
// warp's ldmatrix and 16 x 8 x 16 at a time; warp w holds the accumulators of tokens 16 w .. 16 w + 15 (wgmma's
// layout). In place of LargeTiles, 128 x 128 (two warpgroups, two blocks an SM); in place of SmallTiles,
// 64 x 128 (one warpgroup), which take the launch's slices of K as SmallTiles would (splits_for) and make half as
// many tiles: the narrow products' blocks each multiply twice the features at the warpgroup's rate. Three blocks
// an SM (ptxas sm_90a: no spills). The decoding formats ran slower on them than on the warps' tiles (docs/
// PERFORMANCE.md row 40): their threads' decoding, not the products, bounds those tiles.
using WarpgroupTiles = TileShape<128, 128, 8, 1, 2, 1, true>;  // copied: no register stages to count
using SmallWarpgroupTiles = TileShape<64, 128, 4, 1, 3, 1, true>;

// Output features of one tile: BN, or paired (gemm_swiglu: a gate and an up row per feature) BN / 2.
template <class Tiles, bool PAIRED>
__host__ __device__ constexpr int features_per_tile() {
    return PAIRED ? Tiles::BN / 2 : Tiles::BN;
}

// ---- Weight formats: 16 weights of one row (half a step's 32 columns) decoded to f16 ----------------------
//
// A thread loads its part of a step's block into registers (`Raw`, step 1 above) and decodes it later
// (step 3) into 8 words of f16 pairs: two runs of 8 consecutive weights (words 0-3, 4-7), each one 16-byte
// store into shared memory. Run r of part p starts at column p * PART_STRIDE + r * RUN_STRIDE of the step.
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (and each IQ4_XS sub-block) keep value j in the low nibble (or byte) j
// and value j + 16 in the high nibble of byte j (or byte j + 16), so their part p is bytes 8p .. 8p + 7:
// columns 8p .. 8p + 7 and 16 + 8p .. 16 + 8p + 7. The float formats' and the K-quants' part p is simply
// columns 16p .. 16p + 15 (a K-quant keeps a step's 32 values in 32 consecutive bytes, a nibble or two bits of
// each, and Q3_K and Q5_K their high bits in a bit of each of 32 more).
//
// Each format's `load` takes the row, the step (its 32-value block of the row) and the part. It picks
// addresses and loads (joining two-byte words at most); all other work on the loaded bytes (unpacking
// Q4_K's 6-bit scales, choosing Q6_K's bits) waits for them, so it is left to `decode`, after the step's
// products.
//
// f16 bit tricks: the f16 with bits 0x6400 | n is 1024 + n exactly for n < 1024, so a byte or nibble moved
// into the low bits of 0x6400 becomes a float without a conversion instruction; subtracting 1024 (plus the
// format's zero point) is exact, and one multiplication by the scale rounds once. The K-quants' and IQ4_XS's
// weights are products of two scales and q (d * scale * q - dmin * min), which f16 arithmetic would round more
// than once: they are computed in float32 as gguf.quants does (the same float32 value), then rounded to f16
// once. The float32 twin of the trick: the float with bits 0x4B000000 | n is 2^23 + n exactly (n < 2^23).

__device__ __forceinline__ __half2 bits_to_half2(std::uint32_t bits) { return *reinterpret_cast<__half2*>(&bits); }

// Bytes 0, 1 (pair 0) or 2, 3 (pair 1) of `word` moved to bits 0-7 and 16-23: the two f16 lanes of a half2.
__device__ __forceinline__ std::uint32_t spread_byte_pair(std::uint32_t word, int pair) {
    return __byte_perm(word, 0, pair == 0 ? 0x4140 : 0x4342);
}

constexpr std::uint32_t F16_1024_PAIR = 0x64006400;  // the bits of half2(1024, 1024)
constexpr std::uint32_t LOW_NIBBLES = 0x000F000F;

// Two little-endian 2-byte words as one 4-byte word (for blocks that sit on a 2-byte boundary only).
__device__ __forceinline__ std::uint32_t join_words(const std::uint16_t* words) {
    return std::uint32_t(words[0]) | (std::uint32_t(words[1]) << 16);
}

struct Q4_0Tile {
    static constexpr int PART_STRIDE = 8;
    static constexpr int RUN_STRIDE = 16;
    struct Raw {
        std::uint16_t scale;
        std::uint32_t bytes[2];  // bytes 8p .. 8p + 7 of the nibbles
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 18-byte blocks: only 2-byte loads are aligned.
        const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[block];
        const std::uint16_t* words = reinterpret_cast<const std::uint16_t*>(b.qs) + 4 * part;
        return {*reinterpret_cast<const std::uint16_t*>(&b.d), {join_words(words), join_words(words + 2)}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        const __half2 scale = __half2half2(__ushort_as_half(raw.scale));
        const __half2 offset = __float2half2_rn(1024.0f + 8.0f);  // the f16 trick's 1024 and Q4_0's zero point 8
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const std::uint32_t spread = spread_byte_pair(raw.bytes[k / 2], k % 2);
            const __half2 low_q = bits_to_half2((spread & LOW_NIBBLES) | F16_1024_PAIR);
            const __half2 high_q = bits_to_half2(((spread >> 4) & LOW_NIBBLES) | F16_1024_PAIR);
            words[k] = half2_to_bits(__hmul2(__hsub2(low_q, offset), scale));
            words[4 + k] = half2_to_bits(__hmul2(__hsub2(high_q, offset), scale));
        }
    }
};

// The fifth bits of a Q5_0 pair built as spread_byte_pair builds it: bits 2k and 2k + 1 of `bits` moved to
// bits 4 and 20, above the two nibbles.
__device__ __forceinline__ std::uint32_t fifth_bit_pair(std::uint32_t bits, int k) {
    return ((bits >> (2 * k)) & 1) << 4 | ((bits >> (2 * k + 1)) & 1) << 20;
}

struct Q5_0Tile {
    static constexpr int PART_STRIDE = 8;
    static constexpr int RUN_STRIDE = 16;
    struct Raw {
        std::uint16_t scale;
        std::uint8_t fifth_bits[2];  // bytes p and 2 + p of qh: the fifth bits of values 8p .. and 16 + 8p ..
        std::uint32_t bytes[2];      // bytes 8p .. 8p + 7 of the nibbles
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 22-byte blocks: only 2-byte loads are aligned.
        const BlockQ5_0& b = reinterpret_cast<const BlockQ5_0*>(row)[block];
        const std::uint16_t* words = reinterpret_cast<const std::uint16_t*>(b.qs) + 4 * part;
        return {*reinterpret_cast<const std::uint16_t*>(&b.d),
                {b.qh[part], b.qh[2 + part]},
                {join_words(words), join_words(words + 2)}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        const __half2 scale = __half2half2(__ushort_as_half(raw.scale));
        const __half2 offset = __float2half2_rn(1024.0f + 16.0f);  // the f16 trick's 1024 and Q5_0's zero point 16
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const std::uint32_t spread = spread_byte_pair(raw.bytes[k / 2], k % 2);
            const std::uint32_t low = (spread & LOW_NIBBLES) | fifth_bit_pair(raw.fifth_bits[0], k);
            const std::uint32_t high = ((spread >> 4) & LOW_NIBBLES) | fifth_bit_pair(raw.fifth_bits[1], k);
            words[k] = half2_to_bits(__hmul2(__hsub2(bits_to_half2(low | F16_1024_PAIR), offset), scale));
            words[4 + k] = half2_to_bits(__hmul2(__hsub2(bits_to_half2(high | F16_1024_PAIR), offset), scale));
        }
    }
};

struct Q4_1Tile {
    static constexpr int PART_STRIDE = 8;
    static constexpr int RUN_STRIDE = 16;
    struct Raw {
        std::uint32_t scale_and_min;
        std::uint32_t bytes[2];
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 20-byte blocks keep the row's 4-byte alignment (the launcher checked the base).
        const BlockQ4_1& b = reinterpret_cast<const BlockQ4_1*>(row)[block];
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(b.qs) + 2 * part;
        return {*reinterpret_cast<const std::uint32_t*>(&b.d), {words[0], words[1]}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        const __half2 scale_and_min = bits_to_half2(raw.scale_and_min);
        const __half2 scale = __low2half2(scale_and_min);
        const __half2 minimum = __high2half2(scale_and_min);
        const __half2 offset = __float2half2_rn(1024.0f);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const std::uint32_t spread = spread_byte_pair(raw.bytes[k / 2], k % 2);
            const __half2 low_q = bits_to_half2((spread & LOW_NIBBLES) | F16_1024_PAIR);
            const __half2 high_q = bits_to_half2(((spread >> 4) & LOW_NIBBLES) | F16_1024_PAIR);
            words[k] = half2_to_bits(__hfma2(__hsub2(low_q, offset), scale, minimum));
            words[4 + k] = half2_to_bits(__hfma2(__hsub2(high_q, offset), scale, minimum));
        }
    }
};

struct Q5_1Tile {
    static constexpr int PART_STRIDE = 8;
    static constexpr int RUN_STRIDE = 16;
    struct Raw {
        std::uint32_t scale_and_min;
        std::uint8_t fifth_bits[2];  // bytes p and 2 + p of qh, as Q5_0Tile's
        std::uint32_t bytes[2];
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 24-byte blocks keep the row's 4-byte alignment (the launcher checked the base).
        const BlockQ5_1& b = reinterpret_cast<const BlockQ5_1*>(row)[block];
        const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(b.qs) + 2 * part;
        return {*reinterpret_cast<const std::uint32_t*>(&b.d), {b.qh[part], b.qh[2 + part]}, {words[0], words[1]}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        const __half2 scale_and_min = bits_to_half2(raw.scale_and_min);
        const __half2 scale = __low2half2(scale_and_min);
        const __half2 minimum = __high2half2(scale_and_min);
        const __half2 offset = __float2half2_rn(1024.0f);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const std::uint32_t spread = spread_byte_pair(raw.bytes[k / 2], k % 2);
            const std::uint32_t low = (spread & LOW_NIBBLES) | fifth_bit_pair(raw.fifth_bits[0], k);
            const std::uint32_t high = ((spread >> 4) & LOW_NIBBLES) | fifth_bit_pair(raw.fifth_bits[1], k);
            words[k] = half2_to_bits(__hfma2(__hsub2(bits_to_half2(low | F16_1024_PAIR), offset), scale, minimum));
            words[4 + k] =
                half2_to_bits(__hfma2(__hsub2(bits_to_half2(high | F16_1024_PAIR), offset), scale, minimum));
        }
    }
};

struct Q8_0Tile {
    static constexpr int PART_STRIDE = 8;
    static constexpr int RUN_STRIDE = 16;
    struct Raw {
        std::uint16_t scale;
        std::uint32_t bytes[4];  // bytes 8p .. 8p + 7, then 16 + 8p .. 16 + 8p + 7
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 34-byte blocks: only 2-byte loads are aligned.
        const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[block];
        const std::uint16_t* low = reinterpret_cast<const std::uint16_t*>(b.qs) + 4 * part;
        const std::uint16_t* high = low + 8;
        return {*reinterpret_cast<const std::uint16_t*>(&b.d),
                {join_words(low), join_words(low + 2), join_words(high), join_words(high + 2)}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        const __half2 scale = __half2half2(__ushort_as_half(raw.scale));
        const __half2 offset = __float2half2_rn(1024.0f + 128.0f);  // a signed byte b, xor 0x80, is b + 128
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const std::uint32_t spread = spread_byte_pair(raw.bytes[k / 2], k % 2) ^ 0x00800080;
            words[k] = half2_to_bits(__hmul2(__hsub2(bits_to_half2(spread | F16_1024_PAIR), offset), scale));
        }
    }
};

// d * level for the 8 int8 IQ4_NL levels of `levels` (iq4_nl_levels: bytes 0-3 of word 0, then of word 1),
// rounded to f16 once each: words[k] holds levels 2k and 2k + 1. A signed byte, xor 0x80, is level + 128.
__device__ __forceinline__ void scaled_levels(const std::uint32_t (&levels)[2], __half2 scale, std::uint32_t* words) {
    const __half2 offset = __float2half2_rn(1024.0f + 128.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const std::uint32_t spread = spread_byte_pair(levels[k / 2], k % 2) ^ 0x00800080;
        words[k] = half2_to_bits(__hmul2(__hsub2(bits_to_half2(spread | F16_1024_PAIR), offset), scale));
    }
}

// IQ4_NL: Q4_0's nibble layout, each nibble an index into IQ4_NL_VALUES.
struct IQ4_NLTile {
    static constexpr int PART_STRIDE = 8;
    static constexpr int RUN_STRIDE = 16;
    struct Raw {
        std::uint16_t scale;
        std::uint32_t bytes[2];  // bytes 8p .. 8p + 7 of the nibbles
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 18-byte blocks: only 2-byte loads are aligned.
        const BlockIQ4_NL& b = reinterpret_cast<const BlockIQ4_NL*>(row)[block];
        const std::uint16_t* words = reinterpret_cast<const std::uint16_t*>(b.qs) + 4 * part;
        return {*reinterpret_cast<const std::uint16_t*>(&b.d), {join_words(words), join_words(words + 2)}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        std::uint32_t low[2], high[2];  // the levels of columns 8p .. 8p + 7 and of 16 + the same
        iq4_nl_levels(raw.bytes[0], low[0], high[0]);
        iq4_nl_levels(raw.bytes[1], low[1], high[1]);
        const __half2 scale = __half2half2(__ushort_as_half(raw.scale));
        scaled_levels(low, scale, words);
        scaled_levels(high, scale, words + 4);
    }
};

// n < 2^23 as a float, through the float32 bit trick; minus `zero_point` (exact for small integers).
__device__ __forceinline__ float small_uint_to_float(std::uint32_t n, float zero_point) {
    return __uint_as_float(0x4B000000u | n) - (8388608.0f + zero_point);
}

// Step s of a Q2_K row is the slice c = s % 8 of super-block s / 8 (values 32c .. 32c + 31): bits 2(c % 4),
// 2(c % 4) + 1 of the qs bytes 32(c / 4) .. + 31 (the layout at BlockQ2_K), part p being sub-block 2c + p with
// its scale and min.
struct Q2_KTile {
    static constexpr int PART_STRIDE = 16;
    static constexpr int RUN_STRIDE = 8;
    struct Raw {
        std::uint32_t d_and_dmin;
        std::uint8_t scale_and_min;  // scales[2c + p]
        std::uint8_t shift;          // 2 (c % 4)
        std::uint32_t bytes[4];      // qs bytes 32(c / 4) + 16p .. + 15
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 84-byte blocks keep the row's 4-byte alignment (the launcher checked the base).
        const BlockQ2_K& b = reinterpret_cast<const BlockQ2_K*>(row)[block / 8];
        const int slice = block % 8;
        const std::uint32_t* q = reinterpret_cast<const std::uint32_t*>(b.qs + 32 * (slice / 4) + 16 * part);
        return {*reinterpret_cast<const std::uint32_t*>(&b.d),
                b.scales[2 * slice + part],
                static_cast<std::uint8_t>(2 * (slice % 4)),
                {q[0], q[1], q[2], q[3]}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        const float2 d_and_dmin = __half22float2(bits_to_half2(raw.d_and_dmin));
        // As Q4_K's: both products and scale * q are exact, so fmaf rounds once, to gguf.quants' float32.
        const float scale = d_and_dmin.x * float(raw.scale_and_min & 0xF);
        const float minimum = d_and_dmin.y * float(raw.scale_and_min >> 4);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const std::uint32_t pair = (spread_byte_pair(raw.bytes[n / 2], n % 2) >> raw.shift) & 0x00030003;
            words[n] = half2_to_bits(__floats2half2_rn(fmaf(scale, small_uint_to_float(pair & 0xFFFF, 0.0f), -minimum),
                                                       fmaf(scale, small_uint_to_float(pair >> 16, 0.0f), -minimum)));
        }
    }
};

// Step s of a Q3_K row is the slice c = s % 8 of super-block s / 8: Q2_K's two bits of each value, its third
// bit c of the hmask bytes 16p .. 16p + 15, part p being sub-block 2c + p with its 6-bit scale.
struct Q3_KTile {
    static constexpr int PART_STRIDE = 16;
    static constexpr int RUN_STRIDE = 8;
    struct Raw {
        std::uint16_t d;
        std::uint8_t scale_bytes[2];  // scales[s % 8] and scales[8 + s % 4] of sub-block s = 2c + p
        std::uint8_t sub_block;
        std::uint8_t slice;
        std::uint32_t low[4];   // qs bytes 32(c / 4) + 16p .. + 15
        std::uint32_t high[4];  // hmask bytes 16p .. 16p + 15
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 110-byte blocks: only 2-byte loads are aligned.
        const BlockQ3_K& b = reinterpret_cast<const BlockQ3_K*>(row)[block / 8];
        const int slice = block % 8;
        const int sub_block = 2 * slice + part;
        const std::uint16_t* low = reinterpret_cast<const std::uint16_t*>(b.qs + 32 * (slice / 4) + 16 * part);
        const std::uint16_t* high = reinterpret_cast<const std::uint16_t*>(b.hmask + 16 * part);
        return {*reinterpret_cast<const std::uint16_t*>(&b.d),
                {b.scales[sub_block % 8], b.scales[8 + sub_block % 4]},
                static_cast<std::uint8_t>(sub_block),
                static_cast<std::uint8_t>(slice),
                {join_words(low), join_words(low + 2), join_words(low + 4), join_words(low + 6)},
                {join_words(high), join_words(high + 2), join_words(high + 4), join_words(high + 6)}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        // d * scale is exact (11 x 6 significant bits), and so is its product with q - 4: one rounding, to f16.
        const float scale = __half2float(__ushort_as_half(raw.d)) *
                            float(q3_k_scale(raw.scale_bytes[0], raw.scale_bytes[1], raw.sub_block));
        const int low_shift = 2 * (raw.slice % 4);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const std::uint32_t low = (spread_byte_pair(raw.low[n / 2], n % 2) >> low_shift) & 0x00030003;
            const std::uint32_t high = (spread_byte_pair(raw.high[n / 2], n % 2) >> raw.slice) & 0x00010001;
            const std::uint32_t q = low | (high << 2);  // two values + 4, in bits 0-2 and 16-18
            words[n] = half2_to_bits(__floats2half2_rn(scale * small_uint_to_float(q & 0xFFFF, 4.0f),
                                                       scale * small_uint_to_float(q >> 16, 4.0f)));
        }
    }
};

// Step s of a Q4_K row is sub-block s % 8 of super-block s / 8: 32 nibbles of qs, one scale and one min.
struct Q4_KTile {
    static constexpr int PART_STRIDE = 16;
    static constexpr int RUN_STRIDE = 8;
    struct Raw {
        std::uint32_t d_and_dmin;
        std::uint8_t scale_bytes[3];  // scales[j], scales[j + 4], scales[j + 8], j = sub_block % 4
        std::uint8_t sub_block;
        std::uint32_t bytes[4];  // bytes 16p .. 16p + 15 of the sub-block's 32 bytes of qs
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 144-byte blocks keep the row's 4-byte alignment (the launcher checked the base).
        const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[block / 8];
        const int sub_block = block % 8;
        const int j = sub_block % 4;
        // Sub-blocks 2g and 2g + 1 share bytes 32g .. 32g + 31 of qs: the low nibbles, then the high.
        const std::uint32_t* q = reinterpret_cast<const std::uint32_t*>(b.qs + 32 * (sub_block / 2) + 16 * part);
        return {*reinterpret_cast<const std::uint32_t*>(&b.d),
                {b.scales[j], b.scales[j + 4], b.scales[j + 8]},
                static_cast<std::uint8_t>(sub_block),
                {q[0], q[1], q[2], q[3]}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        int sub_scale, sub_min;
        q4_k_scale_min(raw.scale_bytes[0], raw.scale_bytes[1], raw.scale_bytes[2], raw.sub_block >= 4, sub_scale,
                       sub_min);
        const float2 d_and_dmin = __half22float2(bits_to_half2(raw.d_and_dmin));
        // Both products are exact (11 x 6 significant bits), and so is scale * q (4 more): fmaf rounds
        // scale * q - minimum once, to the float32 gguf.quants computes.
        const float scale = d_and_dmin.x * float(sub_scale);
        const float minimum = d_and_dmin.y * float(sub_min);
        const int shift = 4 * (raw.sub_block % 2);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const std::uint32_t pair = (spread_byte_pair(raw.bytes[n / 2], n % 2) >> shift) & LOW_NIBBLES;
            words[n] = half2_to_bits(__floats2half2_rn(fmaf(scale, small_uint_to_float(pair & 0xFFFF, 0.0f), -minimum),
                                                       fmaf(scale, small_uint_to_float(pair >> 16, 0.0f), -minimum)));
        }
    }
};

// Step s of a Q5_K row is Q4_K's, each value with its fifth bit: bit s % 8 of the qh bytes 16p .. 16p + 15.
struct Q5_KTile {
    static constexpr int PART_STRIDE = 16;
    static constexpr int RUN_STRIDE = 8;
    struct Raw {
        std::uint32_t d_and_dmin;
        std::uint8_t scale_bytes[3];  // scales[j], scales[j + 4], scales[j + 8], j = sub_block % 4
        std::uint8_t sub_block;
        std::uint32_t bytes[4];  // bytes 16p .. 16p + 15 of the sub-block's 32 bytes of qs
        std::uint32_t fifth[4];  // qh bytes 16p .. 16p + 15
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 176-byte blocks keep the row's 4-byte alignment (the launcher checked the base).
        const BlockQ5_K& b = reinterpret_cast<const BlockQ5_K*>(row)[block / 8];
        const int sub_block = block % 8;
        const int j = sub_block % 4;
        const std::uint32_t* q = reinterpret_cast<const std::uint32_t*>(b.qs + 32 * (sub_block / 2) + 16 * part);
        const std::uint32_t* h = reinterpret_cast<const std::uint32_t*>(b.qh + 16 * part);
        return {*reinterpret_cast<const std::uint32_t*>(&b.d),
                {b.scales[j], b.scales[j + 4], b.scales[j + 8]},
                static_cast<std::uint8_t>(sub_block),
                {q[0], q[1], q[2], q[3]},
                {h[0], h[1], h[2], h[3]}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        int sub_scale, sub_min;
        q4_k_scale_min(raw.scale_bytes[0], raw.scale_bytes[1], raw.scale_bytes[2], raw.sub_block >= 4, sub_scale,
                       sub_min);
        const float2 d_and_dmin = __half22float2(bits_to_half2(raw.d_and_dmin));
        // As Q4_K's: scale * q is exact (11 x 6 x 5 significant bits), so fmaf rounds once.
        const float scale = d_and_dmin.x * float(sub_scale);
        const float minimum = d_and_dmin.y * float(sub_min);
        const int shift = 4 * (raw.sub_block % 2);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const std::uint32_t low = (spread_byte_pair(raw.bytes[n / 2], n % 2) >> shift) & LOW_NIBBLES;
            const std::uint32_t high = (spread_byte_pair(raw.fifth[n / 2], n % 2) >> raw.sub_block) & 0x00010001;
            const std::uint32_t pair = low | (high << 4);
            words[n] = half2_to_bits(__floats2half2_rn(fmaf(scale, small_uint_to_float(pair & 0xFFFF, 0.0f), -minimum),
                                                       fmaf(scale, small_uint_to_float(pair >> 16, 0.0f), -minimum)));
        }
    }
};

// Step s of a Q6_K row is group s % 4 of half (s / 4) % 2 of super-block s / 8 (the layout at BlockQ6_K):
// 32 low nibbles of ql, 32 bit pairs of qh, and two scales, one per part.
struct Q6_KTile {
    static constexpr int PART_STRIDE = 16;
    static constexpr int RUN_STRIDE = 8;
    struct Raw {
        std::uint16_t d;
        std::int8_t sub_scale;  // the scale of the part's 16 values
        std::uint8_t group;     // s % 4: which nibble of ql and which bit pair of qh hold the values
        std::uint32_t low[4];   // the 16 bytes of ql with the part's low four bits
        std::uint32_t high[4];  // the 16 bytes of qh with its top two bits
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 210-byte blocks: only 2-byte loads are aligned.
        const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[block / 8];
        const int h = block % 8 / 4;
        const int group = block % 4;
        const std::uint16_t* low = reinterpret_cast<const std::uint16_t*>(b.ql + 64 * h + 32 * (group % 2) + 16 * part);
        const std::uint16_t* high = reinterpret_cast<const std::uint16_t*>(b.qh + 32 * h + 16 * part);
        return {*reinterpret_cast<const std::uint16_t*>(&b.d),
                b.scales[8 * h + 2 * group + part],
                static_cast<std::uint8_t>(group),
                {join_words(low), join_words(low + 2), join_words(low + 4), join_words(low + 6)},
                {join_words(high), join_words(high + 2), join_words(high + 4), join_words(high + 6)}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        // d * scale is exact (11 x 8 significant bits); times q - 32 it rounds as gguf.quants rounds it.
        const float scale = __half2float(__ushort_as_half(raw.d)) * float(raw.sub_scale);
        const int low_shift = 4 * (raw.group / 2);
        const int high_shift = 2 * raw.group;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const std::uint32_t low = (spread_byte_pair(raw.low[n / 2], n % 2) >> low_shift) & LOW_NIBBLES;
            const std::uint32_t high = (spread_byte_pair(raw.high[n / 2], n % 2) >> high_shift) & 0x00030003;
            const std::uint32_t q = low | (high << 4);  // two 6-bit values, in bits 0-5 and 16-21
            words[n] = half2_to_bits(__floats2half2_rn(scale * small_uint_to_float(q & 0xFFFF, 32.0f),
                                                       scale * small_uint_to_float(q >> 16, 32.0f)));
        }
    }
};

// Step s of an IQ4_XS row is sub-block s % 8 of super-block s / 8: 16 bytes of nibbles laid out as an IQ4_NL
// block's, and the sub-block's 6-bit scale in place of its d.
struct IQ4_XSTile {
    static constexpr int PART_STRIDE = 8;
    static constexpr int RUN_STRIDE = 16;
    struct Raw {
        std::uint32_t d_and_scales_h;
        std::uint8_t scales_l;  // scales_l[sub_block / 2]
        std::uint8_t sub_block;
        std::uint32_t bytes[2];  // bytes 8p .. 8p + 7 of the sub-block's 16
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        // 136-byte blocks keep the row's 4-byte alignment (the launcher checked the base).
        const BlockIQ4_XS& b = reinterpret_cast<const BlockIQ4_XS*>(row)[block / 8];
        const int sub_block = block % 8;
        const std::uint32_t* q = reinterpret_cast<const std::uint32_t*>(b.qs + 16 * sub_block + 8 * part);
        return {*reinterpret_cast<const std::uint32_t*>(&b.d),
                b.scales_l[sub_block / 2],
                static_cast<std::uint8_t>(sub_block),
                {q[0], q[1]}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
        // d * scale * level is exact in float32 (11 x 6 x 7 significant bits): one rounding, to f16.
        const float scale = __half2float(__ushort_as_half(raw.d_and_scales_h & 0xFFFF)) *
                            float(iq4_xs_scale(raw.d_and_scales_h >> 16, raw.scales_l, raw.sub_block));
        std::uint32_t low[2], high[2];
        iq4_nl_levels(raw.bytes[0], low[0], high[0]);
        iq4_nl_levels(raw.bytes[1], low[1], high[1]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            // Levels as floats: a signed byte, xor 0x80, is level + 128.
            const std::uint32_t low_pair = spread_byte_pair(low[k / 2], k % 2) ^ 0x00800080;
            const std::uint32_t high_pair = spread_byte_pair(high[k / 2], k % 2) ^ 0x00800080;
            words[k] = half2_to_bits(__floats2half2_rn(scale * small_uint_to_float(low_pair & 0xFFFF, 128.0f),
                                                       scale * small_uint_to_float(low_pair >> 16, 128.0f)));
            words[4 + k] = half2_to_bits(__floats2half2_rn(scale * small_uint_to_float(high_pair & 0xFFFF, 128.0f),
                                                           scale * small_uint_to_float(high_pair >> 16, 128.0f)));
        }
    }
};

// f16 weights: nothing to decode, the rows' bytes are the tile (copied_as_operand). Rows of 32k f16 are 64-byte
// multiples; the launcher checked the base is 16-byte aligned, so every step of a row is four 16-byte copies.
struct F16Tile {};

// bfloat16 weights, copied as they are: the tensor cores multiply them as bf16 (OperandOf).
struct BF16Tile : F16Tile {};

struct F32Tile {
    static constexpr int PART_STRIDE = 16;
    static constexpr int RUN_STRIDE = 8;
    struct Raw {
        float4 values[4];
    };
    __device__ static Raw load(const std::uint8_t* row, int block, int part) {
        const float4* vectors = reinterpret_cast<const float4*>(row) + 8 * block + 4 * part;
        return {{vectors[0], vectors[1], vectors[2], vectors[3]}};
    }
    __device__ static void decode(const Raw& raw, std::uint32_t (&words)[8]) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            words[2 * k] = half2_to_bits(__floats2half2_rn(raw.values[k].x, raw.values[k].y));
            words[2 * k + 1] = half2_to_bits(__floats2half2_rn(raw.values[k].z, raw.values[k].w));
        }
    }
};

// The type the tensor cores multiply, in shared memory: f16 for every format but BF16 (see the header).
template <class Format>
struct OperandOf {
    using type = __half;
};
template <>
struct OperandOf<BF16Tile> {
    using type = __nv_bfloat16;
};
template <class Format>
using Operand = typename OperandOf<Format>::type;

// Formats whose bytes are the operand (F16, and BF16, an F16Tile too): their W tile is a copy
// of the rows' bytes, like x's, so both go to shared memory by cp.async (multiply_copied_steps), no register
// holding them on the way; the other formats' blocks are decoded through registers (multiply_staged_steps).
template <class Format>
constexpr bool copied_as_operand = std::is_base_of_v<F16Tile, Format>;

// LargeTiles' register stages: a second one fits the 128 registers where a thread's part of a block is at most
// 20 bytes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS: no spills, ptxas sm_90); the K-quants' and F32's
// parts would spill. The copied formats hold nothing in registers (their stages are COPY_STAGES).
template <class Format, bool COPIED = copied_as_operand<Format>>
struct LargeTileRegisterStages {
    static constexpr int value = sizeof(typename Format::Raw) <= 20 ? 2 : 1;
};
template <class Format>
struct LargeTileRegisterStages<Format, true> {
    static constexpr int value = 1;
};
template <class Format>
using LargeTiles = LargeTileShape<LargeTileRegisterStages<Format>::value>;

// Shared-memory stages of a block: the copied formats' COPY_STAGES, the decoded formats' two buffers
// (multiply_staged_steps); and their bytes, the kernel's dynamic shared memory.
template <class Tiles, class Format>
__host__ __device__ constexpr int shared_stages() {
    return copied_as_operand<Format> ? Tiles::COPY_STAGES : 2;
}

// (The warpgroup tiles' start on the swizzle's 512-byte period: room to move the stages up to it.)
template <class Tiles, class Format>
__host__ __device__ constexpr int tile_bytes() {
    return shared_stages<Tiles, Format>() * Tiles::STAGE_BYTES + (Tiles::WARPGROUPS ? SWIZZLE_ATOM_BYTES : 0);
}

// Where 16-byte chunk `chunk` (values 8 chunk .. 8 chunk + 7 of the step) of tile row `row` sits, in values from
// the tile's start: padded rows, or the warpgroup tiles' swizzled ones.
template <class Tiles>
__device__ __forceinline__ int tile_offset(int row, int chunk) {
    if constexpr (Tiles::WARPGROUPS)
        return row * K_STEP + swizzled_chunk(row, chunk) * 8;
    else
        return row * TILE_STRIDE + chunk * 8;
}

// Before the barrier after a thread's last writes to a stage: the warpgroups' tensor cores read it through the
// async proxy, which the writes must be ordered before (wgmma.cuh); mma.sync's ldmatrix needs only the barrier.
template <class Tiles>
__device__ __forceinline__ void tiles_written() {
#if defined(MINFER_WGMMA)
    if constexpr (Tiles::WARPGROUPS) shared_writes_to_async_proxy();
#endif
}

// Two floats rounded to the Operand pair of one 32-bit word of a shared-memory tile, the first in the low half.
template <class Op>
__device__ __forceinline__ std::uint32_t round_pair(float low, float high) {
    if constexpr (std::is_same_v<Op, __nv_bfloat16>) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
        return *reinterpret_cast<const std::uint32_t*>(&pair);
    } else {
        return half2_to_bits(__floats2half2_rn(low, high));
    }
}

// ---- One step's tiles: global -> registers -> Operand in shared memory -------------------------------------

// The registers one thread carries from step 1 (load) to step 3 (decode and store) of a K step.
template <class Tiles, class Format>
struct StepRegisters {
    uint4 x[Tiles::X_VECTORS_PER_THREAD];  // 8 rounded values each
    typename Format::Raw w[Tiles::W_PARTS_PER_THREAD];
};

// Where a block's steps come from: x rounded to the Operand (round_x), W (paired: the gate's, and the up's rows
// in up_weight), the block's first token and first row (paired: its first feature), and its slice's first step
// (step s of the block is step first_step + s of the rows).
struct StepSource {
    const std::uint16_t* x;  // [n_tokens][in_features] 16-bit values
    const std::uint8_t* weight;
    const std::uint8_t* up_weight;
    long long row_bytes;
    int in_features, n_tokens, out_features, first_token, first_row, first_step;
};

// Row r of the W tile is the product's weight row first_row + r; paired (gemm_swiglu), it holds gate and up
// rows in turns of 8, the accumulator fragments' width: rows 16k .. 16k + 7 are the gate's rows of features
// first_row + 8k .. first_row + 8k + 7 and rows 16k + 8 .. 16k + 15 the up's rows of the same features. A
// fragment of even index then holds gate sums and the next one the up sums of the same features, in the same
// registers of the same lanes: each thread has both sums of its features for the epilogue.
template <bool PAIRED>
__device__ __forceinline__ int tile_feature(int tile_row) {
    return PAIRED ? tile_row / 16 * 8 + tile_row % 8 : tile_row;
}

template <bool PAIRED>
__device__ __forceinline__ const std::uint8_t* tile_weight(const StepSource& source, int tile_row) {
    return PAIRED && tile_row / 8 % 2 == 1 ? source.up_weight : source.weight;
}

// x tile: BM tokens x 32 values; 16-byte vector i of the tile is token i / 4, values 8 (i % 4) ..., so
// consecutive threads read consecutive 16 bytes of a row (coalesced). W tile: BN rows x one block, two parts per
// block, consecutive threads walking down the rows. Tokens past n_tokens and rows past out_features are
// not read; they are stored as zeros.
template <class Tiles, class Format>
__device__ __forceinline__ void load_x_step(StepRegisters<Tiles, Format>& regs, const StepSource& source, int step) {
#pragma unroll
    for (int v = 0; v < Tiles::X_VECTORS_PER_THREAD; ++v) {
        const int i = threadIdx.x + v * Tiles::THREADS;
        const int token = source.first_token + i / X_VECTORS_PER_ROW;
        const int column = (source.first_step + step) * K_STEP + (i % X_VECTORS_PER_ROW) * 8;
        regs.x[v] = token < source.n_tokens
                        ? *reinterpret_cast<const uint4*>(source.x + std::size_t(token) * source.in_features + column)
                        : make_uint4(0, 0, 0, 0);
    }
}

template <bool PAIRED, class Tiles, class Format>
__device__ __forceinline__ void load_w_step(StepRegisters<Tiles, Format>& regs, const StepSource& source, int step) {
#pragma unroll
    for (int p = 0; p < Tiles::W_PARTS_PER_THREAD; ++p) {
        const int i = threadIdx.x + p * Tiles::THREADS;
        const int row = source.first_row + tile_feature<PAIRED>(i / 2);
        if (row < source.out_features)
            regs.w[p] = Format::load(tile_weight<PAIRED>(source, i / 2) + row * source.row_bytes,
                                     source.first_step + step, i % 2);
    }
}

template <bool PAIRED, class Tiles, class Format>
__device__ __forceinline__ void load_step(StepRegisters<Tiles, Format>& regs, const StepSource& source, int step) {
    load_x_step(regs, source, step);
    load_w_step<PAIRED>(regs, source, step);
}

template <bool PAIRED, class Tiles, class Format>
__device__ __forceinline__ void store_step(const StepRegisters<Tiles, Format>& regs, Operand<Format>* x_tile,
                                           Operand<Format>* w_tile, int rows_left) {
#pragma unroll
    for (int v = 0; v < Tiles::X_VECTORS_PER_THREAD; ++v) {
        const int i = threadIdx.x + v * Tiles::THREADS;
        *reinterpret_cast<uint4*>(x_tile + tile_offset<Tiles>(i / X_VECTORS_PER_ROW, i % X_VECTORS_PER_ROW)) =
            regs.x[v];
    }
#pragma unroll
    for (int p = 0; p < Tiles::W_PARTS_PER_THREAD; ++p) {
        const int i = threadIdx.x + p * Tiles::THREADS;
        const int row = i / 2;
        const int part = i % 2;
        std::uint32_t words[8] = {};  // rows past out_features multiply as zeros
        if (tile_feature<PAIRED>(row) < rows_left) Format::decode(regs.w[p], words);
        const int chunk = part * Format::PART_STRIDE / 8;
        *reinterpret_cast<uint4*>(w_tile + tile_offset<Tiles>(row, chunk)) =
            make_uint4(words[0], words[1], words[2], words[3]);
        *reinterpret_cast<uint4*>(w_tile + tile_offset<Tiles>(row, chunk + Format::RUN_STRIDE / 8)) =
            make_uint4(words[4], words[5], words[6], words[7]);
    }
}

// The copied formats' step: x's and W's 32 columns of each tile row straight into a shared-memory stage, 16 bytes
// (8 values) a copy, in the layout store_step writes (tile_offset); rows past
// n_tokens or out_features are filled with zeros. Copy c of a tile is row c / 4, values 8 (c % 4) onwards.
template <class Tiles, class Format>
__device__ __forceinline__ void copy_x_step(Operand<Format>* x_tile, const StepSource& source, int step) {
#pragma unroll
    for (int v = 0; v < Tiles::X_VECTORS_PER_THREAD; ++v) {
        const int i = threadIdx.x + v * Tiles::THREADS;
        const int token = source.first_token + i / X_VECTORS_PER_ROW;
        const bool valid = token < source.n_tokens;
        const int column = (source.first_step + step) * K_STEP + (i % X_VECTORS_PER_ROW) * 8;
        copy_16_async(x_tile + tile_offset<Tiles>(i / X_VECTORS_PER_ROW, i % X_VECTORS_PER_ROW),
                      source.x + std::size_t(valid ? token : 0) * source.in_features + column, valid);
    }
}

template <bool PAIRED, class Tiles, class Format>
__device__ __forceinline__ void copy_w_step(Operand<Format>* w_tile, const StepSource& source, int step) {
    constexpr int COPIES_PER_THREAD = Tiles::BN * X_VECTORS_PER_ROW / Tiles::THREADS;
    static_assert(Tiles::BN * X_VECTORS_PER_ROW % Tiles::THREADS == 0, "the W tile's copies split evenly");
#pragma unroll
    for (int c = 0; c < COPIES_PER_THREAD; ++c) {
        const int i = threadIdx.x + c * Tiles::THREADS;
        const int tile_row = i / X_VECTORS_PER_ROW;
        const int row = source.first_row + tile_feature<PAIRED>(tile_row);
        const bool valid = row < source.out_features;
        const std::uint8_t* bytes = tile_weight<PAIRED>(source, tile_row) + (valid ? row : 0) * source.row_bytes +
                                    (source.first_step + step) * K_STEP * 2 + (i % X_VECTORS_PER_ROW) * 16;
        copy_16_async(w_tile + tile_offset<Tiles>(tile_row, i % X_VECTORS_PER_ROW), bytes, valid);
    }
}

// ---- The tensor-core step: a warp's accumulators += its x rows (A) times its W rows (B) ---------------------
//
// acc[i][j] is the 16 x 8 fragment at rows warp_row + 16 i, columns warp_column + 8 j of the block tile.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750

template <class Tiles, class Op>
__device__ __forceinline__ void multiply_on_tensor_cores(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4],
                                                         const Op* x_tile, const Op* w_tile, int warp_row,
                                                         int warp_column) {
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int k = 0; k < K_STEP; k += 16) {
        // A fragments: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
        std::uint32_t a[Tiles::FRAGS_M][4];
#pragma unroll
        for (int i = 0; i < Tiles::FRAGS_M; ++i)
            load_matrix_x4(a[i], x_tile + (warp_row + 16 * i + lane % 16) * TILE_STRIDE + k + (lane / 16) * 8);
        // B fragments, two 8-column fragments per ldmatrix: (cols 0-7, k 0-7), (cols 0-7, k 8-15),
        // (cols 8-15, k 0-7), (cols 8-15, k 8-15), W's rows being B's columns.
        std::uint32_t b[Tiles::FRAGS_N][2];
#pragma unroll
        for (int j = 0; j < Tiles::FRAGS_N; j += 2) {
            std::uint32_t pair[4];
            const int column = warp_column + 8 * j + lane % 8 + (lane / 16) * 8;
            load_matrix_x4(pair, w_tile + column * TILE_STRIDE + k + ((lane / 8) % 2) * 8);
            b[j][0] = pair[0];
            b[j][1] = pair[1];
            b[j + 1][0] = pair[2];
            b[j + 1][1] = pair[3];
        }
#pragma unroll
        for (int i = 0; i < Tiles::FRAGS_M; ++i)
#pragma unroll
            for (int j = 0; j < Tiles::FRAGS_N; ++j) mma_16x8x16<Op>(acc[i][j], a[i], b[j]);
    }
}

#endif

template <class Op>
__device__ __forceinline__ float operand_to_float(Op value) {
    if constexpr (std::is_same_v<Op, __nv_bfloat16>) {
        return __bfloat162float(value);
    } else {
        return __half2float(value);
    }
}

// Where the tensor cores do not multiply Op (before sm_75; bf16 before sm_80): each lane computes its
// accumulator elements from the same shared-memory tiles, in the layout the tensor-core path uses, so the
// epilogue is the same.
template <class Tiles, class Op>
__device__ __forceinline__ void multiply_on_cuda_cores(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4],
                                                       const Op* x_tile, const Op* w_tile, int warp_row,
                                                       int warp_column) {
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int i = 0; i < Tiles::FRAGS_M; ++i)
#pragma unroll
        for (int j = 0; j < Tiles::FRAGS_N; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const Op* x_row = x_tile + (warp_row + 16 * i + lane / 4 + 8 * (e / 2)) * TILE_STRIDE;
                const Op* w_row = w_tile + (warp_column + 8 * j + 2 * (lane % 4) + e % 2) * TILE_STRIDE;
                float sum = 0.0f;
                for (int k = 0; k < K_STEP; ++k) sum += operand_to_float(x_row[k]) * operand_to_float(w_row[k]);
                acc[i][j][e] += sum;
            }
}

// The warpgroup tiles' step (sm_90a): warpgroup g multiplies the tile's tokens 64 g .. 64 g + 63 by all 128 rows
// of W, 16 values of K a wgmma, the two of a step in one group, which runs on while the threads store the next
// step (products_finished waits for it before the step's barrier, so the next step may overwrite any stage). The
// warp's [1][16][4] fragments are wgmma's 64 accumulators (wgmma.cuh).
#if defined(MINFER_WGMMA)
template <class Tiles, class Op>
__device__ __forceinline__ void multiply_on_warpgroups(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4],
                                                       const Op* x_tile, const Op* w_tile) {
    static_assert(Tiles::FRAGS_M * Tiles::FRAGS_N * 4 == 64, "a warp's fragments are one wgmma's accumulators");
    float(&d)[64] = reinterpret_cast<float(&)[64]>(acc);
    const unsigned x_rows = shared_address(x_tile + (threadIdx.x / 128) * 64 * K_STEP);
    const unsigned w_rows = shared_address(w_tile);
    warpgroup_arrive();
#pragma unroll
    for (int k = 0; k < K_STEP; k += 16)
        wgmma_64x128x16<Op>(d, swizzled_descriptor(x_rows + 2 * k), swizzled_descriptor(w_rows + 2 * k));
    warpgroup_commit();
}
#endif

// The end of a step's products: the warpgroups' wgmmas have finished (and the accumulators are the threads' again);
// mma.sync's finished when they returned.
template <class Tiles>
__device__ __forceinline__ void products_finished(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4]) {
#if defined(MINFER_WGMMA)
    if constexpr (Tiles::WARPGROUPS) warpgroup_wait(reinterpret_cast<float(&)[64]>(acc));
#endif
}

template <class Tiles, class Op>
__device__ __forceinline__ void multiply_step(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4], const Op* x_tile,
                                              const Op* w_tile, int warp_row, int warp_column) {
    if constexpr (Tiles::WARPGROUPS) {
        // Launched only where the device runs sm_90a code (warpgroup_tiles_run); a trap anywhere else.
#if defined(MINFER_WGMMA)
        multiply_on_warpgroups<Tiles>(acc, x_tile, w_tile);
#else
        __trap();
#endif
    } else if constexpr (tensor_cores_multiply<Op>()) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
        multiply_on_tensor_cores<Tiles>(acc, x_tile, w_tile, warp_row, warp_column);
#endif
    } else {
        multiply_on_cuda_cores<Tiles>(acc, x_tile, w_tile, warp_row, warp_column);
    }
}

// ---- The pipeline ----------------------------------------------------------------------------------------
//
// Step s of a block: load step s + AHEAD into `load_stage`, multiply the tiles of step s (shared buffer
// s % 2), decode `store_stage` (step s + 1) into the other buffer (last read in step s - 1, before the
// barrier that ended it) and meet the barrier. With one register stage (AHEAD = 1) both stages are the
// same registers and a load has one step of products to arrive in. With two (AHEAD = 2), the even steps'
// loads and the odd steps' alternate: at the start of step s the stage holding step s + 1 has its loads
// in flight and the other was stored at the end of step s - 1, so it takes step s + 2, and each load has
// two steps of products to arrive in.
template <class Tiles, int AHEAD, bool PAIRED, class Format>
__device__ __forceinline__ void pipeline_step(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4],
                                              StepRegisters<Tiles, Format>& load_stage,
                                              const StepRegisters<Tiles, Format>& store_stage,
                                              const StepSource& source,
                                              Operand<Format> (*x_tiles)[Tiles::X_TILE_VALUES],
                                              Operand<Format> (*w_tiles)[Tiles::W_TILE_VALUES], int step,
                                              int n_steps,
                                              int rows_left, int warp_row, int warp_column) {
    const int current = step % 2;
    if (step + AHEAD < n_steps) load_step<PAIRED>(load_stage, source, step + AHEAD);
    multiply_step<Tiles>(acc, x_tiles[current], w_tiles[current], warp_row, warp_column);
    if (step + 1 < n_steps) store_step<PAIRED>(store_stage, x_tiles[1 - current], w_tiles[1 - current], rows_left);
    __syncthreads();
}

// The decoded formats' steps, their blocks through registers. Two register stages: the even steps' loads and the
// odd steps'. At the start of step s, shared buffer s % 2 holds step s, the stage of s + 1 has its loads in
// flight and the stage of s is free (stored at the end of step s - 1). Step s then loads step s + 2 into the free
// stage, multiplies, stores step s + 1 into the other buffer (last read in step s - 1, before the barrier that
// ended it) and meets the barrier: a load has two steps of products to arrive in, not one. With one register
// stage, `even` serves every step. (On the warps' tiles only: launch_format gives the decoded formats no
// warpgroups.)
template <class Tiles, class Format, bool PAIRED>
__device__ __forceinline__ void multiply_staged_steps(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4],
                                                      const StepSource& source,
                                                      Operand<Format> (*x_tiles)[Tiles::X_TILE_VALUES],
                                                      Operand<Format> (*w_tiles)[Tiles::W_TILE_VALUES],
                                                      int n_steps, int rows_left, int warp_row, int warp_column) {
    static_assert(!Tiles::WARPGROUPS, "the decoded formats' tiles are the warps'");
    StepRegisters<Tiles, Format> even, odd;
    // The weights are no earlier kernel's output: step 0's are in flight while the kernel before (round_x)
    // finishes; x, and every store, wait for it (launch_overlapped).
    load_w_step<PAIRED>(even, source, 0);
    wait_for_previous_kernel();
    allow_next_kernel();
    load_x_step(even, source, 0);
    store_step<PAIRED>(even, x_tiles[0], w_tiles[0], rows_left);
    if constexpr (Tiles::REGISTER_STAGES == 1) {
        if (n_steps > 1) load_step<PAIRED>(even, source, 1);
        __syncthreads();
        for (int step = 0; step < n_steps; ++step)
            pipeline_step<Tiles, 1, PAIRED>(acc, even, even, source, x_tiles, w_tiles, step, n_steps, rows_left,
                                            warp_row, warp_column);
    } else {
        if (n_steps > 1) load_step<PAIRED>(odd, source, 1);
        __syncthreads();
        // Two steps per trip, so that each stage is a fixed set of registers.
        for (int step = 0; step < n_steps; step += 2) {
            pipeline_step<Tiles, 2, PAIRED>(acc, even, odd, source, x_tiles, w_tiles, step, n_steps, rows_left,
                                            warp_row, warp_column);
            if (step + 1 < n_steps)
                pipeline_step<Tiles, 2, PAIRED>(acc, odd, even, source, x_tiles, w_tiles, step + 1, n_steps,
                                                rows_left, warp_row, warp_column);
        }
    }
}

// The copied formats' steps: STAGES = Tiles::COPY_STAGES shared-memory stages, step s in stage s % STAGES, the
// copies of STAGES - 1 steps in flight (one commit group a step, empty past the last step, so that the wait's
// count is a count of steps). Step s waits for its own group (and, with warpgroups, for step s - 1's products),
// meets the barrier (after which every thread's copies of step s are visible, and every warp is done with step
// s - 1's stage), refills that stage with step s + STAGES - 1 and multiplies step s while the copies run.
template <class Tiles, class Format, bool PAIRED>
__device__ __forceinline__ void multiply_copied_steps(float (&acc)[Tiles::FRAGS_M][Tiles::FRAGS_N][4],
                                                      const StepSource& source,
                                                      Operand<Format> (*x_tiles)[Tiles::X_TILE_VALUES],
                                                      Operand<Format> (*w_tiles)[Tiles::W_TILE_VALUES],
                                                      int n_steps, int warp_row, int warp_column) {
    constexpr int STAGES = shared_stages<Tiles, Format>();
    // The weights are no earlier kernel's output: the first stages' copies run while the kernel before (round_x)
    // finishes; x's wait for it (launch_overlapped). They join step 0's group, which the first wait then covers.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        if (s < n_steps) copy_w_step<PAIRED, Tiles, Format>(w_tiles[s], source, s);
    wait_for_previous_kernel();
    allow_next_kernel();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_steps) copy_x_step<Tiles, Format>(x_tiles[s], source, s);
        commit_copies();
    }
    for (int step = 0; step < n_steps; ++step) {
        wait_for_copies<STAGES - 2>();
        products_finished<Tiles>(acc);  // step s - 1's warpgroup products ran while the thread waited for step s
        tiles_written<Tiles>();
        __syncthreads();
        const int refill = step + STAGES - 1;
        if (refill < n_steps) {
            copy_w_step<PAIRED, Tiles, Format>(w_tiles[refill % STAGES], source, refill);
            copy_x_step<Tiles, Format>(x_tiles[refill % STAGES], source, refill);
        }
        commit_copies();
        multiply_step<Tiles>(acc, x_tiles[step % STAGES], w_tiles[step % STAGES], warp_row, warp_column);
    }
    products_finished<Tiles>(acc);
}

// ---- The kernel -----------------------------------------------------------------------------------------

// The products of one launch: up to MAX_GEMM_PARTS weights of one type and row length that multiply the
// same x (a layer's q, k and v projections), each into its own y. Part p's tiles of output features are
// first_tile[p] .. first_tile[p + 1] - 1 of the grid's x axis, its outputs columns first_column[p] ..
// first_column[p + 1] - 1 of one token's outputs of every part in turn (gemm_sum_splits); an absent part's
// first_tile and first_column are past them all. One launch instead of three lets the narrow products' few
// blocks run side by side. When the launch splits K, part p's slices keep their sums in partial[p]:
// [splits][n_tokens][out_features] floats of the workspace. The epilogue (finish) adds part p's bias[p] and,
// in a launch of one part, the residual.
constexpr int MAX_GEMM_PARTS = 3;
struct GemmParts {
    const std::uint8_t* weight[MAX_GEMM_PARTS];
    const float* bias[MAX_GEMM_PARTS];  // nullptr: none
    float* y[MAX_GEMM_PARTS];
    float* partial[MAX_GEMM_PARTS];
    const float* residual;  // [n_tokens][out_features] of part 0, the only part; may be y itself; nullptr: none
    GateActivation activation;  // paired: the gate's
    int out_features[MAX_GEMM_PARTS];
    int first_tile[MAX_GEMM_PARTS];
    int first_column[MAX_GEMM_PARTS];
};

// The epilogue of output `index` (row-major in y, `column` in its row) of a product's whole sum:
// y = residual + (sum + bias), each absent term left out. That is the order of gemm, add_bias_f32 and
// add_f32 launched one after the other, so the folded epilogue gives their result to the bit.
__device__ __forceinline__ float finish(float sum, const float* bias, const float* residual, int column,
                                        std::size_t index) {
    if (bias != nullptr) sum += bias[column];
    return residual != nullptr ? residual[index] + sum : sum;
}

// The part a tile (or a column) belongs to, from the parts' first tiles (or columns), with selects: indexing
// the parameter arrays by a computed index would copy them to local memory.
__device__ __forceinline__ int part_of(int index, const int (&first)[MAX_GEMM_PARTS]) {
    return index >= first[2] ? 2 : (index >= first[1] ? 1 : 0);
}

template <typename T>
__device__ __forceinline__ T part_value(int part, const T (&values)[MAX_GEMM_PARTS]) {
    return part == 0 ? values[0] : (part == 1 ? values[1] : values[2]);
}

// Block: Tiles::THREADS threads; blockIdx.x the tile of output features (of all parts, in order),
// blockIdx.y the tile of tokens, blockIdx.z the slice of K: slice z of gridDim.z multiplies the contiguous
// steps z * n / gridDim.z .. (z + 1) * n / gridDim.z - 1 of the n steps of the rows. With one slice the block
// writes its tile of y, epilogue included; with more, its partial sums, which gemm_sum_splits adds up.
// PAIRED (gemm_swiglu): one part, weight[0] the gate and weight[1] the up, y[0] = h, out_features[0] = d_ff;
// a tile covers BN / 2 features (tile_feature), one slice.
template <class Tiles, class Format, bool PAIRED>
__global__ void __launch_bounds__(Tiles::THREADS, Tiles::MIN_BLOCKS_PER_SM)
    gemm_tensor_cores(GemmParts parts, long long row_bytes, const std::uint16_t* __restrict__ x, int in_features,
                      int n_tokens) {
    static_assert(!PAIRED || Tiles::FRAGS_N % 2 == 0, "paired fragments: a warp's gate and up fragments alternate");
    // The stages (tile_bytes<Tiles, Format>(), dynamic shared memory): every x tile, then every W tile; the
    // warpgroup tiles' from the first 512-byte boundary (the swizzle's period).
    extern __shared__ __align__(16) std::uint8_t stage_memory[];
    std::uint8_t* stages = stage_memory;
    if constexpr (Tiles::WARPGROUPS)
        stages += (SWIZZLE_ATOM_BYTES - shared_address(stage_memory) % SWIZZLE_ATOM_BYTES) % SWIZZLE_ATOM_BYTES;
    auto* x_tiles = reinterpret_cast<Operand<Format>(*)[Tiles::X_TILE_VALUES]>(stages);
    auto* w_tiles = reinterpret_cast<Operand<Format>(*)[Tiles::W_TILE_VALUES]>(
        stages + std::size_t(shared_stages<Tiles, Format>()) * Tiles::X_TILE_VALUES * sizeof(Operand<Format>));

    const int tile = blockIdx.x;
    const int part = part_of(tile, parts.first_tile);
    const std::uint8_t* weight = part_value(part, parts.weight);
    const int out_features = part_value(part, parts.out_features);
    const int first_row = (tile - part_value(part, parts.first_tile)) * features_per_tile<Tiles, PAIRED>();
    const int first_token = blockIdx.y * Tiles::BM;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp_row = (warp / Tiles::WARPS_N) * Tiles::WARP_M;
    const int warp_column = (warp % Tiles::WARPS_N) * Tiles::WARP_N;
    const int all_steps = in_features / K_STEP;
    const int slice = blockIdx.z;
    const int slices = gridDim.z;
    const int first_step = slice * all_steps / slices;
    const int n_steps = (slice + 1) * all_steps / slices - first_step;
    const int rows_left = out_features - first_row;

    float acc[Tiles::FRAGS_M][Tiles::FRAGS_N][4] = {};
    const StepSource source{x,           weight,    PAIRED ? parts.weight[1] : nullptr, row_bytes, in_features,
                            n_tokens,    out_features, first_token, first_row,   first_step};
    if constexpr (copied_as_operand<Format>)
        multiply_copied_steps<Tiles, Format, PAIRED>(acc, source, x_tiles, w_tiles, n_steps, warp_row, warp_column);
    else
        multiply_staged_steps<Tiles, Format, PAIRED>(acc, source, x_tiles, w_tiles, n_steps, rows_left, warp_row,
                                                     warp_column);

    if constexpr (PAIRED) {
        // h = act(gate) * up, act as swiglu_f32 or geglu_f32 computes it (common.cuh). Fragment j (even) and
        // j + 1 hold the gate and up sums of the features (warp_column + 8 j) / 2 + 2 (lane % 4) + e % 2 of the tile.
        float* h = parts.y[0];
#pragma unroll
        for (int i = 0; i < Tiles::FRAGS_M; ++i)
#pragma unroll
            for (int j = 0; j < Tiles::FRAGS_N; j += 2)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int token = first_token + warp_row + 16 * i + lane / 4 + 8 * (e / 2);
                    const int feature = first_row + (warp_column + 8 * j) / 2 + 2 * (lane % 4) + e % 2;
                    if (token < n_tokens && feature < out_features)
                        h[std::size_t(token) * out_features + feature] =
                            activate(parts.activation, acc[i][j][e]) * acc[i][j + 1][e];
                }
    } else {
        // One slice: y itself, through the epilogue. Several: this slice's [n_tokens][out_features] of the
        // part's partial sums, as they are (gemm_sum_splits applies the epilogue once, to their total).
        const bool whole = slices == 1;
        float* out = whole ? part_value(part, parts.y)
                           : part_value(part, parts.partial) + std::size_t(slice) * n_tokens * out_features;
        const float* bias = part_value(part, parts.bias);
        // Fragment element e of lane l sits at row l / 4 (+ 8 for e >= 2), column 2 (l % 4) + e % 2.
#pragma unroll
        for (int i = 0; i < Tiles::FRAGS_M; ++i)
#pragma unroll
            for (int j = 0; j < Tiles::FRAGS_N; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int token = first_token + warp_row + 16 * i + lane / 4 + 8 * (e / 2);
                    const int column = first_row + warp_column + 8 * j + 2 * (lane % 4) + e % 2;
                    const std::size_t index = std::size_t(token) * out_features + column;
                    if (token < n_tokens && column < out_features)
                        out[index] =
                            whole ? finish(acc[i][j][e], bias, parts.residual, column, index) : acc[i][j][e];
                }
    }
}

// x rounded to the Operand once per launch (see the header), into the workspace the GEMM then reads it from.
// Thread: 8 consecutive values (in_features is a multiple of 32, so they are one row's), value 8 i onwards of
// the [n_tokens][in_features] x.
template <class Op>
__global__ void round_x(const float* __restrict__ x, std::uint16_t* __restrict__ rounded, long long n_vectors) {
    wait_for_previous_kernel();
    allow_next_kernel();
    const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (i >= n_vectors) return;
    const float4 low = reinterpret_cast<const float4*>(x)[2 * i];
    const float4 high = reinterpret_cast<const float4*>(x)[2 * i + 1];
    reinterpret_cast<uint4*>(rounded)[i] = make_uint4(round_pair<Op>(low.x, low.y), round_pair<Op>(low.z, low.w),
                                                       round_pair<Op>(high.x, high.y), round_pair<Op>(high.z, high.w));
}

// The weights a staged launch decodes (launch_staged): part p's rows[p] rows of weight[p], staged one part
// after the other; rows 0: the part is absent.
struct StagedWeights {
    const std::uint8_t* weight[MAX_GEMM_PARTS];
    int rows[MAX_GEMM_PARTS];
};

// A long prompt's decoded weights, decoded once into f16 rows of the workspace: each half step of a row loaded
// and decoded as a tile's step does it (Format::load, Format::decode), so the rows hold the f16 values the tiles
// would have stored. Thread: half `half` of the 32-value step `step` of staged row `row` (i = (row * steps + step)
// * 2 + half), the rows of every part in turn.
template <class Format>
__global__ void stage_weights(StagedWeights weights, long long row_bytes, std::uint16_t* __restrict__ staged,
                              long long halves, int steps) {
    const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    const bool active = i < halves;
    const int half = static_cast<int>(i % 2);
    const int step = static_cast<int>(i / 2 % steps);
    const long long row = i / 2 / steps;
    typename Format::Raw raw{};
    if (active) {
        int part = 0;
        long long part_row = row;
        while (part + 1 < MAX_GEMM_PARTS && part_row >= weights.rows[part]) part_row -= weights.rows[part++];
        raw = Format::load(weights.weight[part] + part_row * row_bytes, step, half);
    }
    // The loads read weights, which no kernel writes; the stores go to the workspace, which the kernel before
    // may still be reading.
    wait_for_previous_kernel();
    allow_next_kernel();
    if (!active) return;
    std::uint32_t words[8];
    Format::decode(raw, words);
    std::uint16_t* run = staged + row * steps * K_STEP + step * K_STEP + half * Format::PART_STRIDE;
    *reinterpret_cast<uint4*>(run) = make_uint4(words[0], words[1], words[2], words[3]);
    *reinterpret_cast<uint4*>(run + Format::RUN_STRIDE) = make_uint4(words[4], words[5], words[6], words[7]);
}

// y = the sum of a split launch's slices, added in slice order, through the epilogue: the same additions in
// the same order on every run, so the result is deterministic (atomic adds into y would sum in whatever order
// the blocks end).
// Thread: output i of the launch's n_tokens x all_outputs, token i / all_outputs, column i % all_outputs of
// one token's outputs of every part in turn.
__global__ void gemm_sum_splits(GemmParts parts, int splits, int n_tokens, int all_outputs) {
    wait_for_previous_kernel();
    allow_next_kernel();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_tokens * all_outputs) return;
    const int token = i / all_outputs;
    const int part = part_of(i % all_outputs, parts.first_column);
    const int out_features = part_value(part, parts.out_features);
    const int column = i % all_outputs - part_value(part, parts.first_column);
    const std::size_t index = std::size_t(token) * out_features + column;
    const float* partial = part_value(part, parts.partial) + index;
    const std::size_t slice_floats = std::size_t(n_tokens) * out_features;
    float sum = partial[0];
    for (int slice = 1; slice < splits; ++slice) sum += partial[slice * slice_floats];
    part_value(part, parts.y)[index] = finish(sum, part_value(part, parts.bias), parts.residual, column, index);
}

// One launch's arguments, as launch_gemm or launch_gemm_group received them.
struct Products {
    const void* weight[MAX_GEMM_PARTS];
    const float* bias[MAX_GEMM_PARTS];
    float* y[MAX_GEMM_PARTS];
    int out_features[MAX_GEMM_PARTS];  // 0: the part is absent (and so are the ones after it)
    const float* residual;             // launch_gemm's; launch_gemm_group has none
    int type;
    const float* x;
    int in_features;
    int n_tokens;
    void* workspace;  // x rounded, the slices' partial sums, the staged weights (workspace_bytes)
    long long workspace_bytes;
    GateActivation activation = GateActivation::SILU;  // paired: the gate's (launch_gemm_swiglu, launch_gemm_geglu)
};

// Tiles of output features of the parts as Tiles cut them, part p's after part p - 1's.
template <class Tiles, bool PAIRED = false>
int feature_tiles(const int (&out_features)[MAX_GEMM_PARTS]) {
    int tiles = 0;
    for (const int n : out_features) tiles += ceil_div(n, features_per_tile<Tiles, PAIRED>());
    return tiles;
}

template <class Tiles, bool PAIRED = false>
long long tile_count(const int (&out_features)[MAX_GEMM_PARTS], int n_tokens) {
    return static_cast<long long>(feature_tiles<Tiles, PAIRED>(out_features)) * ceil_div(n_tokens, Tiles::BM);
}

// Large tiles when they alone give every SM a block (at 512 tokens: ffn_gate and ffn_up, 152 blocks);
// fewer, bigger tiles re-read x and W less often. Otherwise small tiles, four times as many blocks, so
// narrow products (N = 896: 112 blocks) and short prompts still spread over the GPU.
template <bool PAIRED = false>
bool large_tiles(const int (&out_features)[MAX_GEMM_PARTS], int n_tokens, int multiprocessors) {
    return tile_count<LargeTileShape<1>, PAIRED>(out_features, n_tokens) >= multiprocessors;  // any stage count
}

// At most this many slices of K: each adds a pass over the launch's outputs through the workspace, while
// the gain shrinks once the slices have filled the SMs' block slots.
constexpr int MAX_SPLITS = 8;
// At least this many steps per slice: a slice pays the pipeline's fill (two steps of loads before its first
// product) and a store of its whole tile, which a few steps of products would not repay.
constexpr int MIN_STEPS_PER_SPLIT = 8;

// The slices of K of a launch (its grid.z), the one rule the launcher and gemm_workspace_bytes share. Where
// the small tiles leave block slots (multiprocessors x SmallTiles::MIN_BLOCKS_PER_SM) empty, each tile's K
// is cut into as many slices as fill them: a narrow product's few blocks, each bound by its loads' latency
// over a long K (ffn_down at 512 tokens: 112 blocks for 528 slots, 152 steps each), become blocks that
// walk a slice each side by side. Large tiles fill the SMs already and never split.
int splits_for(const int (&out_features)[MAX_GEMM_PARTS], int in_features, int n_tokens, int multiprocessors) {
    if (large_tiles(out_features, n_tokens, multiprocessors)) return 1;
    const long long tiles = tile_count<SmallTiles>(out_features, n_tokens);
    const long long slots = static_cast<long long>(multiprocessors) * SmallTiles::MIN_BLOCKS_PER_SM;
    if (tiles <= 0 || tiles >= slots) return 1;
    const long long most = std::min(MAX_SPLITS, in_features / K_STEP / MIN_STEPS_PER_SPLIT);
    return static_cast<int>(std::max(std::min(slots / tiles, static_cast<long long>(most)), 1LL));
}

// Floats of the slices' partial sums a launch of `splits` slices needs: each part's [splits][n_tokens][out_features].
long long partial_floats(const int (&out_features)[MAX_GEMM_PARTS], int n_tokens, int splits) {
    if (splits == 1) return 0;
    long long outputs = 0;
    for (const int n : out_features) outputs += n;
    return static_cast<long long>(splits) * n_tokens * outputs;
}

// Bytes of the workspace's first part, x rounded to 16 bits ([n_tokens][in_features], round_x), in whole
// 256-byte units: the partial sums after it start aligned.
long long rounded_x_bytes(int in_features, int n_tokens) {
    return (static_cast<long long>(n_tokens) * in_features * 2 + 255) / 256 * 256;
}

// Staged weights. From STAGED_MIN_TOKENS tokens on, a launch whose weights a tile would decode (every format but
// F16 and BF16) decodes them once into f16 rows of the workspace (stage_weights) and multiplies those as F16
// weights: copied by cp.async, and on sm_90a by the warpgroup tiles, which the decoding tiles leave to the copied
// formats. A decoding tile decodes its W blocks once per tile of tokens (four times at 512 tokens), in the
// registers and issue slots the products need, and on the warpgroup tiles it ran 12-24% slower than on the warps'
// (H200, pp512, docs/PERFORMANCE.md row 40). Staging decodes each weight once: ~2.5 bytes of traffic a weight
// (~0.7 ps at 3.5 TB/s) against ~1.7 ps a weight of products at 256 tokens (3.4 at 512); measured (row 41): pp256
// +9-23%, pp512 +20-38% at Qwen2.5-0.5B's shapes, +60-100% at Llama-3.2-1B's. On the warps' tiles (GPUs without
// sm_90a) the F16 tiles also outrun the decoding ones (1.37x Q4_0's at 1B on an H200), but staging there is
// unmeasured.
constexpr int STAGED_MIN_TOKENS = 256;

bool stages_weights(int type, int n_tokens) {
    return n_tokens >= STAGED_MIN_TOKENS && type != GGML_F16 && type != GGML_BF16;
}

// Weight rows a launch stages of its part `part`: the part's out_features, and paired (gemm_swiglu: one part of
// out_features[0] features) the gate's (part 0) and the up's (part 1).
template <bool PAIRED>
int staged_part_rows(const int (&out_features)[MAX_GEMM_PARTS], int part) {
    if (PAIRED) return part < 2 ? out_features[0] : 0;
    return out_features[part];
}

// Weight rows a launch stages, all parts'.
template <bool PAIRED>
long long staged_rows(const int (&out_features)[MAX_GEMM_PARTS]) {
    long long rows = 0;
    for (int part = 0; part < MAX_GEMM_PARTS; ++part) rows += staged_part_rows<PAIRED>(out_features, part);
    return rows;
}

// Bytes of a launch's workspace before its staged weights: x rounded, then the slices' partial sums when the
// launch splits K, in whole 256-byte units (the staged rows after them start aligned).
long long unstaged_bytes(const int (&out_features)[MAX_GEMM_PARTS], int in_features, int n_tokens, int splits) {
    const long long partial_bytes = partial_floats(out_features, n_tokens, splits) * sizeof(float);
    return rounded_x_bytes(in_features, n_tokens) + (partial_bytes + 255) / 256 * 256;
}

// Bytes of a launch's workspace: x rounded, the slices' partial sums, then the staged weights (f16 rows).
template <bool PAIRED>
long long workspace_bytes(int type, const int (&out_features)[MAX_GEMM_PARTS], int in_features, int n_tokens,
                          int splits) {
    const long long staged = stages_weights(type, n_tokens) ? staged_rows<PAIRED>(out_features) * in_features * 2 : 0;
    return unstaged_bytes(out_features, in_features, n_tokens, splits) + staged;
}

template <class Tiles, class Format, bool PAIRED>
cudaError_t launch_tiles(const Products& p, int splits, cudaStream_t stream) {
    GemmParts parts{};
    parts.residual = p.residual;
    parts.activation = p.activation;
    int tiles = 0;
    int columns = 0;
    auto* rounded_x = static_cast<std::uint16_t*>(p.workspace);
    float* partial =
        reinterpret_cast<float*>(static_cast<std::uint8_t*>(p.workspace) + rounded_x_bytes(p.in_features, p.n_tokens));
    for (int i = 0; i < MAX_GEMM_PARTS; ++i) {
        const bool present = p.out_features[i] > 0;
        parts.weight[i] = static_cast<const std::uint8_t*>(p.weight[i]);
        parts.bias[i] = p.bias[i];
        parts.y[i] = p.y[i];
        parts.partial[i] = present && splits > 1 ? partial : nullptr;
        parts.out_features[i] = p.out_features[i];
        parts.first_tile[i] = present ? tiles : INT_MAX;
        parts.first_column[i] = present ? columns : INT_MAX;
        tiles += ceil_div(p.out_features[i], features_per_tile<Tiles, PAIRED>());
        columns += p.out_features[i];
        if (present && splits > 1) partial += std::size_t(splits) * p.n_tokens * p.out_features[i];
    }
    // grid.x: ceil(n_vectors / 256) blocks, a thread per 8 values of x.
    const long long n_vectors = static_cast<long long>(p.n_tokens) * p.in_features / 8;
    constexpr int ROUND_BLOCK = 256;
    if (const cudaError_t failed =
            launch_overlapped(round_x<Operand<Format>>, dim3(unsigned((n_vectors + ROUND_BLOCK - 1) / ROUND_BLOCK)),
                              dim3(ROUND_BLOCK), 0, stream, p.x, rounded_x, n_vectors);
        failed != cudaSuccess)
        return failed;
    // grid.x: the tiles of output features, BN each (paired: BN / 2), of every part in turn; grid.y:
    // ceil(n_tokens / BM) tiles of tokens; grid.z: the slices of K (splits_for). Blocks next to each other in x
    // share their x rows, which then stay in L2 while W streams past.
    const dim3 grid(tiles, ceil_div(p.n_tokens, Tiles::BM), splits);
    const long long weight_row_bytes = row_bytes(p.type, p.in_features);
    // Beyond 48 KB a kernel's dynamic shared memory needs the attribute (set before every launch: it is per
    // kernel, and cheap; gemv_int8 does the same inside captured graphs).
    constexpr int shared_bytes = tile_bytes<Tiles, Format>();
    const auto kernel = gemm_tensor_cores<Tiles, Format, PAIRED>;
    if (const cudaError_t failed =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
        failed != cudaSuccess)
        return failed;
    const cudaError_t multiplied = launch_overlapped(kernel, grid, dim3(Tiles::THREADS), shared_bytes, stream, parts,
                                                     weight_row_bytes, rounded_x, p.in_features, p.n_tokens);
    if (splits == 1 || multiplied != cudaSuccess) return multiplied;
    // grid.x: ceil(n_tokens * columns / 256) blocks, one thread per output of every part. A split launch
    // has fewer tiles than block slots, so its outputs (under slots x BM x BN) count within an int.
    constexpr int SUM_BLOCK = 256;
    return launch_overlapped(gemm_sum_splits, dim3(ceil_div(p.n_tokens * columns, SUM_BLOCK)), dim3(SUM_BLOCK), 0,
                             stream, parts, splits, p.n_tokens, columns);
}

// Whether the copied formats' tiles go to the warpgroups: the build has sm_90a code (MINFER_SM90A_SASS:
// MinferCuda.cmake compiles sm_90 as sm_90a) and the device is one it runs on, compute capability 9.0 (H100, H200).
cudaError_t warpgroup_tiles_run(bool& run) {
    run = false;
#if defined(MINFER_SM90A_SASS)
    int device = 0, major = 0, minor = 0;
    if (const cudaError_t failed = cudaGetDevice(&device); failed != cudaSuccess) return failed;
    if (const cudaError_t failed = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        failed != cudaSuccess)
        return failed;
    if (const cudaError_t failed = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        failed != cudaSuccess)
        return failed;
    run = major == 9 && minor == 0;
#endif
    return cudaSuccess;
}

// The products of p with its weights decoded into the workspace (stages_weights): stage_weights, then the F16
// launch of the staged rows.
template <class Format, bool PAIRED>
cudaError_t launch_staged(const Products& p, int multiprocessors, int splits, cudaStream_t stream);

// The copied formats' tiles: on the warpgroups where they run (warpgroup_tiles_run), else on the warps.
template <class Format, bool PAIRED>
cudaError_t launch_format(const Products& p, int multiprocessors, int splits, cudaStream_t stream) {
    const bool large = large_tiles<PAIRED>(p.out_features, p.n_tokens, multiprocessors);  // never split
    if constexpr (copied_as_operand<Format>) {
        bool warpgroups = false;
        if (const cudaError_t failed = warpgroup_tiles_run(warpgroups); failed != cudaSuccess) return failed;
        if (warpgroups && large) return launch_tiles<WarpgroupTiles, Format, PAIRED>(p, splits, stream);
        if (warpgroups) return launch_tiles<SmallWarpgroupTiles, Format, PAIRED>(p, splits, stream);
    } else if (stages_weights(p.type, p.n_tokens)) {
        return launch_staged<Format, PAIRED>(p, multiprocessors, splits, stream);
    }
    if (large) return launch_tiles<LargeTiles<Format>, Format, PAIRED>(p, splits, stream);
    return launch_tiles<SmallTiles, Format, PAIRED>(p, splits, stream);
}

template <class Format, bool PAIRED>
cudaError_t launch_staged(const Products& p, int multiprocessors, int splits, cudaStream_t stream) {
    auto* staged = reinterpret_cast<std::uint16_t*>(static_cast<std::uint8_t*>(p.workspace) +
                                                    unstaged_bytes(p.out_features, p.in_features, p.n_tokens, splits));
    StagedWeights weights{};
    Products f16 = p;
    f16.type = GGML_F16;
    long long first_row = 0;
    for (int i = 0; i < MAX_GEMM_PARTS; ++i) {
        weights.weight[i] = static_cast<const std::uint8_t*>(p.weight[i]);
        weights.rows[i] = staged_part_rows<PAIRED>(p.out_features, i);
        f16.weight[i] = weights.rows[i] > 0 ? staged + first_row * p.in_features : nullptr;
        first_row += weights.rows[i];
    }
    // grid.x: ceil(halves / 256) blocks, a thread per half step (16 weights) of every staged row.
    constexpr int STAGE_BLOCK = 256;
    const int steps = p.in_features / K_STEP;
    const long long halves = 2 * first_row * steps;
    if (const cudaError_t failed = launch_overlapped(
            stage_weights<Format>, dim3(unsigned((halves + STAGE_BLOCK - 1) / STAGE_BLOCK)), dim3(STAGE_BLOCK), 0,
            stream, weights, row_bytes(p.type, p.in_features), staged, halves, steps);
        failed != cudaSuccess)
        return failed;
    return launch_format<F16Tile, PAIRED>(f16, multiprocessors, splits, stream);
}

// The checks of every launch's arguments; cudaSuccess when they pass.
cudaError_t refuse_products(const Products& p) {
    if (row_bytes(p.type, p.in_features) < 0 || p.in_features % K_STEP != 0)
        return minfer_refuse(MINFER_TYPES_AND_ROWS ", in_features the row length and a multiple of 32");
    if (p.in_features <= 0 || p.out_features[0] <= 0 || p.n_tokens <= 0)
        return minfer_refuse("in_features, the first part's out_features and n_tokens must be positive");
    if (p.out_features[1] < 0 || p.out_features[2] < 0 || (p.out_features[1] == 0 && p.out_features[2] > 0))
        return minfer_refuse("a part's out_features is 0 (absent) or positive, and an absent part has none after it");
    if (!is_aligned(p.x, 16)) return minfer_refuse("x must be 16-byte aligned (float4 loads)");
    const bool float_weights = p.type == GGML_F32 || p.type == GGML_F16 || p.type == GGML_BF16;
    for (const void* weight : p.weight)
        if (!is_aligned(weight, float_weights ? 16 : 4))
            return minfer_refuse(
                "weight must be 16-byte aligned for F32/F16/BF16 (16-byte loads) and 4-byte aligned otherwise");
    return cudaSuccess;
}

template <bool PAIRED>
cudaError_t launch_type(const Products& p, int multiprocessors, int splits, cudaStream_t stream) {
    switch (p.type) {
        case GGML_F32: return launch_format<F32Tile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_F16: return launch_format<F16Tile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q4_0: return launch_format<Q4_0Tile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q4_1: return launch_format<Q4_1Tile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q5_0: return launch_format<Q5_0Tile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q5_1: return launch_format<Q5_1Tile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q8_0: return launch_format<Q8_0Tile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q2_K: return launch_format<Q2_KTile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q3_K: return launch_format<Q3_KTile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q4_K: return launch_format<Q4_KTile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q5_K: return launch_format<Q5_KTile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_Q6_K: return launch_format<Q6_KTile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_IQ4_NL: return launch_format<IQ4_NLTile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_IQ4_XS: return launch_format<IQ4_XSTile, PAIRED>(p, multiprocessors, splits, stream);
        case GGML_BF16: return launch_format<BF16Tile, PAIRED>(p, multiprocessors, splits, stream);
        default: return minfer_refuse("no GEMM kernel for this GGML type");
    }
}

// The workspace check of a launch of `splits` slices of K; cudaSuccess when it passes.
template <bool PAIRED>
cudaError_t refuse_workspace(const Products& p, int splits) {
    const long long needed = workspace_bytes<PAIRED>(p.type, p.out_features, p.in_features, p.n_tokens, splits);
    if (p.workspace == nullptr || p.workspace_bytes < needed || !is_aligned(p.workspace, 16))
        return minfer_refuse(
            "workspace must hold gemm_workspace_bytes(...) bytes (gemm_swiglu: gemm_swiglu_workspace_bytes(...)), "
            "16-byte aligned: x rounded to 16 bits, the slices' partial sums where K is split, the staged weights");
    return cudaSuccess;
}

// The checks and the launch behind launch_gemm and launch_gemm_group.
cudaError_t launch_products(const Products& p, cudaStream_t stream) {
    if (const cudaError_t refused = refuse_products(p); refused != cudaSuccess) return refused;
    int multiprocessors = 0;
    if (const cudaError_t failed = device_multiprocessors(multiprocessors); failed != cudaSuccess) return failed;
    const int splits = splits_for(p.out_features, p.in_features, p.n_tokens, multiprocessors);
    if (const cudaError_t refused = refuse_workspace<false>(p, splits); refused != cudaSuccess) return refused;
    return launch_type<false>(p, multiprocessors, splits, stream);
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" int gemm_splits(int out_features_0, int out_features_1, int out_features_2, int in_features,
                           int n_tokens, int multiprocessors) {
    const int out_features[MAX_GEMM_PARTS] = {std::max(out_features_0, 0), std::max(out_features_1, 0),
                                              std::max(out_features_2, 0)};
    return splits_for(out_features, in_features, n_tokens, multiprocessors);
}

extern "C" long long gemm_workspace_bytes(int type, int out_features_0, int out_features_1, int out_features_2,
                                          int in_features, int n_tokens, int multiprocessors) {
    const int out_features[MAX_GEMM_PARTS] = {std::max(out_features_0, 0), std::max(out_features_1, 0),
                                              std::max(out_features_2, 0)};
    return workspace_bytes<false>(type, out_features, in_features, n_tokens,
                                  splits_for(out_features, in_features, n_tokens, multiprocessors));
}

extern "C" long long gemm_swiglu_workspace_bytes(int type, int in_features, int d_ff, int n_tokens) {
    const int out_features[MAX_GEMM_PARTS] = {std::max(d_ff, 0), 0, 0};
    return workspace_bytes<true>(type, out_features, in_features, n_tokens, 1);
}

extern "C" cudaError_t launch_gemm_group(const void* weight_0, const float* bias_0, float* y_0, int out_features_0,
                                         const void* weight_1, const float* bias_1, float* y_1, int out_features_1,
                                         const void* weight_2, const float* bias_2, float* y_2, int out_features_2,
                                         int type, const float* x, int in_features, int n_tokens, void* workspace,
                                         long long workspace_bytes, cudaStream_t stream) {
    return launch_products({{weight_0, weight_1, weight_2},
                            {bias_0, bias_1, bias_2},
                            {y_0, y_1, y_2},
                            {out_features_0, out_features_1, out_features_2},
                            nullptr,
                            type,
                            x,
                            in_features,
                            n_tokens,
                            workspace,
                            workspace_bytes},
                           stream);
}

extern "C" cudaError_t launch_gemm(const void* weight, int type, const float* x, const float* bias,
                                   const float* residual, float* y, int in_features, int out_features, int n_tokens,
                                   void* workspace, long long workspace_bytes, cudaStream_t stream) {
    return launch_products({{weight, nullptr, nullptr},
                            {bias, nullptr, nullptr},
                            {y, nullptr, nullptr},
                            {out_features, 0, 0},
                            residual,
                            type,
                            x,
                            in_features,
                            n_tokens,
                            workspace,
                            workspace_bytes},
                           stream);
}

namespace {

// gemm_swiglu and gemm_geglu: one part of d_ff features whose rows are the gate's and the up's (the kernel's
// PAIRED tiles); never split: the epilogue needs both whole sums.
cudaError_t launch_gated(GateActivation activation, const void* gate, const void* up, int type, const float* x,
                         float* h, int in_features, int d_ff, int n_tokens, void* workspace, long long workspace_bytes,
                         cudaStream_t stream) {
    const Products paired{{gate, up, nullptr},
                          {nullptr, nullptr, nullptr},
                          {h, nullptr, nullptr},
                          {d_ff, 0, 0},
                          nullptr,
                          type,
                          x,
                          in_features,
                          n_tokens,
                          workspace,
                          workspace_bytes,
                          activation};
    if (const cudaError_t refused = refuse_products(paired); refused != cudaSuccess) return refused;
    if (gate == nullptr || up == nullptr || h == nullptr) return minfer_refuse("gate, up and h must not be null");
    if (const cudaError_t refused = refuse_workspace<true>(paired, 1); refused != cudaSuccess) return refused;
    int multiprocessors = 0;
    if (const cudaError_t failed = device_multiprocessors(multiprocessors); failed != cudaSuccess) return failed;
    return launch_type<true>(paired, multiprocessors, 1, stream);
}

}  // namespace

extern "C" cudaError_t launch_gemm_swiglu(const void* gate, const void* up, int type, const float* x, float* h,
                                          int in_features, int d_ff, int n_tokens, void* workspace,
                                          long long workspace_bytes, cudaStream_t stream) {
    return launch_gated(GateActivation::SILU, gate, up, type, x, h, in_features, d_ff, n_tokens, workspace,
                        workspace_bytes, stream);
}

extern "C" cudaError_t launch_gemm_geglu(const void* gate, const void* up, int type, const float* x, float* h,
                                         int in_features, int d_ff, int n_tokens, void* workspace,
                                         long long workspace_bytes, cudaStream_t stream) {
    return launch_gated(GateActivation::GELU_TANH, gate, up, type, x, h, in_features, d_ff, n_tokens, workspace,
                        workspace_bytes, stream);
}
