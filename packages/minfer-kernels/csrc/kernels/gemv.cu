// Matrix-vector products for one token (decode), with the work around them fused in:
//
//     y = W norm(x)      norm: RMSNorm with its weight, or nothing
//     then one epilogue: store y (plus a residual), SwiGLU of a gate|up pair, or bias + RoPE + KV-cache store
//
// W is read in its GGUF byte layout (ggml_formats.cuh), as in matmul.cu. At one token every weight is
// used exactly once, so the kernel's job is to stream W at memory bandwidth; and because a decode step is
// ~100 such launches, folding the small ops around a GEMV into it (the norm before, the add, activation,
// rotation and store after) removes whole launches from every layer.
//
// Work split. A block computes ROWS rows of W; the epilogue decides which rows they are (consecutive
// rows, a gate row and its up row, the two dimensions of a RoPE pair). The block's warps split the row
// length: the row is cut into steps of 256 values and warp w takes steps w, w + n_warps, ... In one step
// lane l takes 8 values of each of the block's rows. It loads the 8 matching activations once and uses
// them for all ROWS rows, and the 32 lanes of a warp cover 256 consecutive values, so the warp's loads of
// one row are one contiguous stretch (8 quantized blocks, 144 bytes of Q4_0): coalesced. A step's loads
// for all ROWS rows are independent, so they are all in flight before the first one is used.
//
// Decoding without integer-to-float conversions (a quarter-rate instruction): a 4-bit or 8-bit value is
// OR-ed into the low mantissa bits of the half 1024.0 (bits 0x6400), which gives the half 1024 + value
// exactly; one half2 subtraction removes 1024 (and the format's zero point), still exactly, since every
// number involved is an integer below 2048; the half-to-float conversion is exact and cheap. The decoded
// weights are therefore exactly gguf.quants' values, and the float32 products and sums are as accurate
// as matmul.cu's.
//
// Partial sums: each lane keeps one per row, a warp shuffle reduction sums the lanes, shared memory sums
// the warps, and thread 0 runs the epilogue with the block's ROWS sums.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "common.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"
#include "rope.cuh"

namespace minfer {
namespace {

constexpr int VALUES_PER_LANE = 8;
constexpr int STEP_VALUES = WARP_SIZE * VALUES_PER_LANE;  // 256 values of a row per warp step
constexpr int BLOCKS_PER_STEP = STEP_VALUES / QK;         // 8 quantized blocks per warp step
constexpr int GEMV_MAX_WARPS = 8;

// The 8 activations lane l multiplies with its 8 weights of every row in one step, as two runs of 4
// consecutive values (where they sit depends on the format: gemv_activation_offset), and their sum.
struct Activations {
    float v[VALUES_PER_LANE];
    float sum;
};

__device__ __forceinline__ __half2 as_half2(std::uint32_t bits) {
    __half2 h;
    memcpy(&h, &bits, sizeof h);
    return h;
}

// Half-precision constants as bit patterns, pairs of them as one word (a half2 built with
// __float2half2_rn would be converted at run time, in every step):
constexpr std::uint32_t HALF2_1024 = 0x64006400u;  // 1024.0, 1024.0
constexpr std::uint32_t HALF2_1032 = 0x64086408u;  // 1024 + 8: Q4_0's zero point 8 removed too
constexpr std::uint32_t HALF2_1152 = 0x64806480u;  // 1024 + 128: the +128 byte bias removed too

// Two 4-bit values at bits [0, 4) and [16, 20) of `bits`, minus the format's zero point, as exact floats
// (the 1024.0 trick of the header comment: one LOP3 and one HSUB2 for two values). `zero_plus_1024` is
// the half2 bit pattern of 1024 + zero point.
__device__ __forceinline__ float2 nibble_pair(std::uint32_t bits, std::uint32_t zero_plus_1024) {
    return __half22float2(__hsub2(as_half2((bits & 0x000F000Fu) | HALF2_1024), as_half2(zero_plus_1024)));
}

// sum_j nibble_j * a.v[j] - zero * sum_j a.v[j] for the 8 nibbles of `word`: the 4 bytes qs[4s .. 4s + 3]
// of a Q4 block, whose low nibbles are values 4s .. 4s + 3 (run 0) and high nibbles 16 + 4s .. (run 1).
__device__ __forceinline__ float nibble_dot(std::uint32_t word, std::uint32_t zero_plus_1024, const Activations& a) {
    const float2 low_02 = nibble_pair(word, zero_plus_1024);         // low nibbles of bytes 0 and 2
    const float2 low_13 = nibble_pair(word >> 8, zero_plus_1024);    // low nibbles of bytes 1 and 3
    const float2 high_02 = nibble_pair(word >> 4, zero_plus_1024);   // high nibbles of bytes 0 and 2
    const float2 high_13 = nibble_pair(word >> 12, zero_plus_1024);  // high nibbles of bytes 1 and 3
    return low_02.x * a.v[0] + low_13.x * a.v[1] + low_02.y * a.v[2] + low_13.y * a.v[3] + high_02.x * a.v[4] +
           high_13.x * a.v[5] + high_02.y * a.v[6] + high_13.y * a.v[7];
}

// Two signed bytes of `word` (picked by a __byte_perm selector) as exact floats: the bytes were biased by
// +128 (XOR 0x80) to make them unsigned, placed under the half exponent 0x64, and 1024 + 128 subtracted.
__device__ __forceinline__ float2 int8_pair(std::uint32_t biased_word, unsigned selector) {
    const std::uint32_t halves = __byte_perm(biased_word, 0x64646464u, selector);  // bytes 4-7: 0x64
    return __half22float2(__hsub2(as_half2(halves), as_half2(HALF2_1152)));
}

// sum_j q_j * v[j] over the 4 signed bytes of `word`, v[0..3] in byte order.
__device__ __forceinline__ float int8_dot(std::uint32_t word, const float* v) {
    const std::uint32_t biased = word ^ 0x80808080u;
    const float2 bytes_01 = int8_pair(biased, 0x4140);  // result bytes: byte 0, 0x64, byte 1, 0x64
    const float2 bytes_23 = int8_pair(biased, 0x4342);  // result bytes: byte 2, 0x64, byte 3, 0x64
    return bytes_01.x * v[0] + bytes_01.y * v[1] + bytes_23.x * v[2] + bytes_23.y * v[3];
}

// Two 2-byte loads as one word: the 18- and 34-byte blocks keep their bytes on a 2-byte boundary only.
// __ldcs (evict-first): each weight is read once per token, so it should not push the activations out.
__device__ __forceinline__ std::uint32_t load_word_2aligned(const std::uint8_t* bytes) {
    const auto* halves = reinterpret_cast<const unsigned short*>(bytes);
    return std::uint32_t(__ldcs(halves)) | (std::uint32_t(__ldcs(halves + 1)) << 16);
}

// A weight format, as the GEMV sees it: `dot` returns sum_j w_j * a.v[j] over lane l's 8 weights of one
// row in one step. NIBBLES formats give lane l the 8 values of bytes 4(l % 4) .. 4(l % 4) + 3 of block
// l / 4 (two runs of 4, 16 apart); the others give it 8 consecutive values, 8l .. 8l + 7.

struct GemvF32 {
    static constexpr bool NIBBLES = false;
    __device__ static float dot(const std::uint8_t* row, int step, int lane, const Activations& a) {
        const float4* w = reinterpret_cast<const float4*>(row) + (step * STEP_VALUES + lane * VALUES_PER_LANE) / 4;
        const float4 w0 = __ldcs(w), w1 = __ldcs(w + 1);
        return w0.x * a.v[0] + w0.y * a.v[1] + w0.z * a.v[2] + w0.w * a.v[3] + w1.x * a.v[4] + w1.y * a.v[5] +
               w1.z * a.v[6] + w1.w * a.v[7];
    }
};

struct GemvF16 {
    static constexpr bool NIBBLES = false;
    __device__ static float dot(const std::uint8_t* row, int step, int lane, const Activations& a) {
        const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(row) + step * WARP_SIZE + lane);  // 8 halves
        const float2 w01 = __half22float2(as_half2(raw.x)), w23 = __half22float2(as_half2(raw.y));
        const float2 w45 = __half22float2(as_half2(raw.z)), w67 = __half22float2(as_half2(raw.w));
        return w01.x * a.v[0] + w01.y * a.v[1] + w23.x * a.v[2] + w23.y * a.v[3] + w45.x * a.v[4] + w45.y * a.v[5] +
               w67.x * a.v[6] + w67.y * a.v[7];
    }
};

struct GemvQ4_0 {  // w = d * (nibble - 8)
    static constexpr bool NIBBLES = true;
    __device__ static float dot(const std::uint8_t* row, int step, int lane, const Activations& a) {
        const BlockQ4_0* block = reinterpret_cast<const BlockQ4_0*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        const float d = __half2float(__ushort_as_half(__ldcs(reinterpret_cast<const unsigned short*>(&block->d))));
        const std::uint32_t word = load_word_2aligned(block->qs + 4 * (lane % 4));
        return d * nibble_dot(word, HALF2_1032, a);
    }
};

struct GemvQ4_1 {  // w = d * nibble + m
    static constexpr bool NIBBLES = true;
    __device__ static float dot(const std::uint8_t* row, int step, int lane, const Activations& a) {
        // 20-byte blocks keep a 4-byte boundary: d and m in one 4-byte load, the 4 bytes of nibbles in one.
        const BlockQ4_1* block = reinterpret_cast<const BlockQ4_1*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        const float2 d_and_m = __half22float2(as_half2(__ldcs(reinterpret_cast<const unsigned int*>(block))));
        const std::uint32_t word = __ldcs(reinterpret_cast<const unsigned int*>(block->qs) + lane % 4);
        return d_and_m.x * nibble_dot(word, HALF2_1024, a) + d_and_m.y * a.sum;
    }
};

struct GemvQ8_0 {  // w = d * q, q a signed byte
    static constexpr bool NIBBLES = false;
    __device__ static float dot(const std::uint8_t* row, int step, int lane, const Activations& a) {
        const BlockQ8_0* block = reinterpret_cast<const BlockQ8_0*>(row) + step * BLOCKS_PER_STEP + lane / 4;
        const float d = __half2float(__ushort_as_half(__ldcs(reinterpret_cast<const unsigned short*>(&block->d))));
        const auto* qs = reinterpret_cast<const std::uint8_t*>(block->qs) + 8 * (lane % 4);
        const std::uint32_t low = load_word_2aligned(qs), high = load_word_2aligned(qs + 4);
        return d * (int8_dot(low, a.v) + int8_dot(high, a.v + 4));
    }
};

// Offset, within a step, of the first of 4 consecutive activations of lane `lane`'s run `run` (0 or 1).
template <class Format>
__device__ __forceinline__ int gemv_activation_offset(int lane, int run) {
    if constexpr (Format::NIBBLES) return (lane / 4) * QK + (lane % 4) * 4 + run * (QK / 2);
    return lane * VALUES_PER_LANE + run * 4;
}

// 1 / sqrt(mean(x^2) + eps) over the n values of x, as every thread of the block sees it. Contains
// __syncthreads() (block_sum): every thread of the block must call it.
__device__ __forceinline__ float block_inv_rms(const float* x, int n, float eps) {
    float sum_of_squares = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x * 4; i < n; i += blockDim.x * 4) {
        const float4 v = *reinterpret_cast<const float4*>(x + i);
        sum_of_squares += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    sum_of_squares = block_sum(sum_of_squares);
    return 1.0f / sqrtf(sum_of_squares / float(n) + eps);
}

// Lane `lane`'s activations of step `step`: x, or x * inv_rms * norm_weight (the RMSNorm, in the order
// the CPU reference multiplies) when there is a norm weight.
template <class Format>
__device__ __forceinline__ Activations load_activations(const float* x, const float* norm_weight, float inv_rms,
                                                        int step, int lane) {
    Activations a;
    a.sum = 0.0f;
#pragma unroll
    for (int run = 0; run < 2; ++run) {
        const int i = step * STEP_VALUES + gemv_activation_offset<Format>(lane, run);
        float4 v = *reinterpret_cast<const float4*>(x + i);
        if (norm_weight != nullptr) {
            const float4 g = *reinterpret_cast<const float4*>(norm_weight + i);
            v = make_float4(v.x * inv_rms * g.x, v.y * inv_rms * g.y, v.z * inv_rms * g.z, v.w * inv_rms * g.w);
        }
        a.v[4 * run] = v.x;
        a.v[4 * run + 1] = v.y;
        a.v[4 * run + 2] = v.z;
        a.v[4 * run + 3] = v.w;
        a.sum += (v.x + v.y) + (v.z + v.w);
    }
    return a;
}

// The epilogues. Each says which rows of W block b computes (weight_row(b, k), k < ROWS; always a valid
// row, so no lane ever needs a bounds check) and what becomes of their ROWS dot products (finish, run by
// one thread).

// y[row] = (W x)[row] (+ residual[row]) for ROWS consecutive rows. y may be residual itself (the add in
// place): each element is read and then written by the same thread, so neither pointer is __restrict__.
template <int ROWS_PER_BLOCK>
struct StoreRows {
    static constexpr int ROWS = ROWS_PER_BLOCK;
    float* y;
    const float* residual;  // nullptr: nothing to add
    int out_features;

    __device__ int weight_row(int block, int k) const { return min(block * ROWS + k, out_features - 1); }

    __device__ void finish(int block, const float (&sums)[ROWS]) const {
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
            const int row = block * ROWS + k;
            if (row < out_features) y[row] = residual != nullptr ? residual[row] + sums[k] : sums[k];
        }
    }
};

// out[i] = silu(gate_i) * up_i, where W stacks the d_ff gate rows and then the d_ff up rows, so gate_i is
// row i and up_i is row d_ff + i. A block computes OUTPUTS consecutive outputs: their gate rows, then
// their up rows (8 rows: the per-block work of the norm and the reductions is spread over as many rows as
// in the 8-row blocks of a long GEMV, which the microbenchmark showed twice as fast per byte as 4 rows).
struct GateUpSwiglu {
    static constexpr int OUTPUTS = 4;
    static constexpr int ROWS = 2 * OUTPUTS;
    float* out;
    int d_ff;

    __device__ int weight_row(int block, int k) const {
        return min(block * OUTPUTS + k % OUTPUTS, d_ff - 1) + (k / OUTPUTS) * d_ff;
    }

    __device__ void finish(int block, const float (&sums)[ROWS]) const {
#pragma unroll
        for (int o = 0; o < OUTPUTS; ++o) {
            const int i = block * OUTPUTS + o;
            if (i < d_ff) out[i] = silu(sums[o]) * sums[OUTPUTS + o];
        }
    }
};

// The attention projections of one token: W stacks the rows of Wq, Wk and Wv (n_heads, n_kv_heads and
// n_kv_heads heads of head_dim rows). A block computes one pair of dimensions of one head: the two
// dimensions RoPE rotates together (rope.cuh) for q and k heads, two adjacent dimensions otherwise. Its
// epilogue adds the bias, rotates q and k pairs by the position, and writes q to `q`, k and v to row
// `position` of the caches. The position is read from device memory, so a captured graph serves every
// step; one outside the cache would write another buffer's memory, so the kernel traps instead.
struct QkvRopeStore {
    static constexpr int ROWS = 2;
    const float* bias;  // [q_dim + 2 * kv_dim], or nullptr
    float* q;           // [n_heads * head_dim]
    float* k_cache;     // [n_ctx][n_kv_heads * head_dim]
    float* v_cache;
    const int* positions;  // positions[0]: where this token's k and v go
    int n_heads, n_kv_heads, head_dim, n_rot, mode, n_ctx;
    double freq_base;

    struct Pair {
        int first_row, second_row;  // rows of W (and of the q|k|v vector)
        int rope_pair;              // the RoPE pair index p, or -1 for a pair that is not rotated
    };

    __device__ Pair pair(int block) const {
        const int pairs_per_head = head_dim / 2;
        const int head = block / pairs_per_head;  // q heads, then k heads, then v heads
        const int p = block % pairs_per_head;
        const bool rotated = head < n_heads + n_kv_heads && p < n_rot / 2;
        const bool neox = rotated && mode == ROPE_NEOX;
        const int first = neox ? p : 2 * p;
        const int second = neox ? p + n_rot / 2 : 2 * p + 1;
        return {head * head_dim + first, head * head_dim + second, rotated ? p : -1};
    }

    __device__ int weight_row(int block, int k) const {
        const Pair rows = pair(block);
        return k == 0 ? rows.first_row : rows.second_row;
    }

    __device__ void finish(int block, const float (&sums)[ROWS]) const {
        const Pair rows = pair(block);
        const int position = positions[0];
        if (position < 0 || position >= n_ctx) __trap();
        float a = sums[0], b = sums[1];
        if (bias != nullptr) {
            a += bias[rows.first_row];
            b += bias[rows.second_row];
        }
        if (rows.rope_pair >= 0) rope_rotate(a, b, position, rows.rope_pair, n_rot, freq_base);
        const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
        float* target;  // where row 0 of the q|k|v vector would be
        if (rows.first_row < q_dim) {
            target = q;
        } else if (rows.first_row < q_dim + kv_dim) {
            target = k_cache + std::size_t(position) * kv_dim - q_dim;
        } else {
            target = v_cache + std::size_t(position) * kv_dim - (q_dim + kv_dim);
        }
        target[rows.first_row] = a;
        target[rows.second_row] = b;
    }
};

// Block: 32 * n_warps threads; blockIdx.x is the epilogue's block index (which ROWS rows of W).
template <class Format, class Epilogue>
__global__ void __launch_bounds__(GEMV_MAX_WARPS * WARP_SIZE)
    gemv(const std::uint8_t* __restrict__ weight, long long row_bytes, const float* __restrict__ x,
         const float* __restrict__ norm_weight, float eps, int in_features, Epilogue epilogue) {
    constexpr int ROWS = Epilogue::ROWS;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n_warps = blockDim.x / WARP_SIZE;

    const std::uint8_t* rows[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) rows[k] = weight + std::size_t(epilogue.weight_row(blockIdx.x, k)) * row_bytes;

    // The norm's scale: a block-wide reduction, so the test is uniform over the block (every thread calls).
    const float inv_rms = norm_weight != nullptr ? block_inv_rms(x, in_features, eps) : 1.0f;

    float partial[ROWS] = {};
    const int n_steps = ceil_div(in_features, STEP_VALUES);
    for (int step = warp; step < n_steps; step += n_warps) {
        // Only a row's last step can be partial, so a lane past the end is done with the row.
        if (step * STEP_VALUES + lane * VALUES_PER_LANE >= in_features) break;
        const Activations a = load_activations<Format>(x, norm_weight, inv_rms, step, lane);
#pragma unroll
        for (int k = 0; k < ROWS; ++k) partial[k] += Format::dot(rows[k], step, lane, a);
    }

    __shared__ float warp_sums[GEMV_MAX_WARPS][ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
        const float sum = warp_sum(partial[k]);  // the lanes that left the loop early rejoin here
        if (lane == 0) warp_sums[warp][k] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float sums[ROWS];
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
            sums[k] = 0.0f;
            for (int w = 0; w < n_warps; ++w) sums[k] += warp_sums[w][k];
        }
        epilogue.finish(blockIdx.x, sums);
    }
}

// Rows of at least this many rows take 8 rows per block (the activations serve 8 rows); fewer take 2, so
// that a 896-row projection still spreads over 448 blocks.
constexpr int MANY_ROWS = 16384;

template <class Epilogue>
cudaError_t launch_epilogue(int type, const void* weight, const float* x, const float* norm_weight, float eps,
                            int in_features, int n_blocks, const Epilogue& epilogue, cudaStream_t stream) {
    const auto* w = static_cast<const std::uint8_t*>(weight);
    const long long bytes = row_bytes(type, in_features);
    // grid.x: the epilogue's blocks, each ROWS rows of W; block: one warp per 256-value step of a row, at
    // most 8 warps (a longer row gives each warp several steps).
    const int threads = std::max(1, std::min(GEMV_MAX_WARPS, ceil_div(in_features, STEP_VALUES))) * WARP_SIZE;
    switch (type) {
        case GGML_F32:
            gemv<GemvF32, Epilogue><<<n_blocks, threads, 0, stream>>>(w, bytes, x, norm_weight, eps, in_features, epilogue);
            break;
        case GGML_F16:
            gemv<GemvF16, Epilogue><<<n_blocks, threads, 0, stream>>>(w, bytes, x, norm_weight, eps, in_features, epilogue);
            break;
        case GGML_Q4_0:
            gemv<GemvQ4_0, Epilogue><<<n_blocks, threads, 0, stream>>>(w, bytes, x, norm_weight, eps, in_features, epilogue);
            break;
        case GGML_Q4_1:
            gemv<GemvQ4_1, Epilogue><<<n_blocks, threads, 0, stream>>>(w, bytes, x, norm_weight, eps, in_features, epilogue);
            break;
        default:
            gemv<GemvQ8_0, Epilogue><<<n_blocks, threads, 0, stream>>>(w, bytes, x, norm_weight, eps, in_features, epilogue);
            break;
    }
    return cudaGetLastError();
}

// The alignment each format's loads need from the weight's base address (the row lengths keep it).
std::size_t weight_alignment(int type) {
    switch (type) {
        case GGML_F32:
        case GGML_F16: return 16;
        case GGML_Q4_1: return 4;
        default: return 2;
    }
}

// The preconditions every GEMV launcher shares; nullptr when they hold, else the reason.
const char* gemv_refusal(int type, const void* weight, const float* x, const float* norm_weight, int in_features) {
    if (row_bytes(type, in_features) < 0 || in_features % VALUES_PER_LANE != 0 || in_features <= 0)
        return "type must be F32, F16, Q4_0, Q4_1 or Q8_0, and in_features a positive multiple of 8 (of 32 for "
               "Q4_0/Q4_1/Q8_0)";
    if (!is_aligned(weight, weight_alignment(type)))
        return "weight must be 16-byte aligned (F32, F16), 4-byte (Q4_1) or 2-byte (Q4_0, Q8_0)";
    if (!is_aligned(x, 16) || (norm_weight != nullptr && !is_aligned(norm_weight, 16)))
        return "x and norm_weight must be 16-byte aligned";
    return nullptr;
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" bool minfer_gemv_supports(int type, const void* weight, const float* x, int in_features) {
    return gemv_refusal(type, weight, x, nullptr, in_features) == nullptr;
}

extern "C" cudaError_t launch_gemv(const void* weight, int type, const float* x, const float* norm_weight, float eps,
                                   const float* residual, float* y, int in_features, int out_features,
                                   cudaStream_t stream) {
    if (const char* reason = gemv_refusal(type, weight, x, norm_weight, in_features)) return minfer_refuse(reason);
    if (out_features <= 0) return minfer_refuse("out_features must be positive");
    if (out_features >= MANY_ROWS) {
        const StoreRows<8> epilogue{y, residual, out_features};
        return launch_epilogue(type, weight, x, norm_weight, eps, in_features, ceil_div(out_features, 8), epilogue,
                               stream);
    }
    const StoreRows<2> epilogue{y, residual, out_features};
    return launch_epilogue(type, weight, x, norm_weight, eps, in_features, ceil_div(out_features, 2), epilogue,
                           stream);
}

extern "C" cudaError_t launch_gemv_swiglu(const void* weight, int type, const float* x, const float* norm_weight,
                                          float eps, float* out, int in_features, int d_ff, cudaStream_t stream) {
    if (const char* reason = gemv_refusal(type, weight, x, norm_weight, in_features)) return minfer_refuse(reason);
    if (d_ff <= 0) return minfer_refuse("d_ff must be positive");
    const GateUpSwiglu epilogue{out, d_ff};
    return launch_epilogue(type, weight, x, norm_weight, eps, in_features, ceil_div(d_ff, GateUpSwiglu::OUTPUTS),
                           epilogue, stream);
}

extern "C" cudaError_t launch_gemv_qkv_rope_store(const void* weight, int type, const float* x,
                                                  const float* norm_weight, float eps, const float* bias, float* q,
                                                  float* k_cache, float* v_cache, const int* positions,
                                                  int in_features, int n_heads, int n_kv_heads, int head_dim,
                                                  int n_rot, float freq_base, int mode, int n_ctx,
                                                  cudaStream_t stream) {
    if (const char* reason = gemv_refusal(type, weight, x, norm_weight, in_features)) return minfer_refuse(reason);
    if (mode != ROPE_NORMAL && mode != ROPE_NEOX) return minfer_refuse("mode must be 0 (normal) or 2 (NeoX)");
    if (head_dim <= 0 || head_dim % 2 != 0 || n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim)
        return minfer_refuse("head_dim must be even, and n_rot even, positive and at most head_dim");
    if (n_heads <= 0 || n_kv_heads <= 0 || n_ctx <= 0) return minfer_refuse("head counts and n_ctx must be positive");
    const QkvRopeStore epilogue{bias, q, k_cache, v_cache, positions, n_heads, n_kv_heads, head_dim,
                                n_rot, mode, n_ctx, double(freq_base)};
    const int n_pairs = (n_heads + 2 * n_kv_heads) * head_dim / 2;
    return launch_epilogue(type, weight, x, norm_weight, eps, in_features, n_pairs, epilogue, stream);
}
