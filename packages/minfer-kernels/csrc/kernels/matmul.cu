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
// the warp-per-row kernel here serves one token only where gemv.cu cannot (F32/F16 rows of a length that
// is not a multiple of 8, unaligned float rows). For n_tokens > 1, each warp takes TOKENS_PER_WARP = 8
// tokens: a chunk of W is decoded once and used for 8 tokens, reading W 8 times less often than 8 GEMVs
// would. That is a correct, reasonable small-batch path; a tensor-core GEMM for long prompts is a later
// issue.
#include "common.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int ROWS_PER_BLOCK = 4;   // warps per block, one output row each
constexpr int TOKENS_PER_WARP = 8;  // tokens sharing one decoded chunk of W in the n_tokens > 1 path

// A weight format, as one lane sees it: a chunk of VALUES consecutive weights of a row, decoded as
//     w[j] = scale * q[j] + offset        (offset only where HAS_OFFSET: Q4_1's minimum)
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

extern "C" long long minfer_row_bytes(int type, long long n_values) { return row_bytes(type, n_values); }

extern "C" cudaError_t launch_matmul(const void* weight, int type, const float* x, float* y, int in_features,
                                     int out_features, int n_tokens, cudaStream_t stream) {
    const long long bytes = row_bytes(type, in_features);
    if (bytes < 0)
        return minfer_refuse(
            "type must be F32, F16, Q4_0, Q4_1 or Q8_0, and in_features a multiple of 32 for Q4_0/Q4_1/Q8_0");
    if (!is_aligned(weight, 4)) return minfer_refuse("weight must be 4-byte aligned");
    if (n_tokens == 1 && minfer_gemv_supports(type, weight, x, in_features))
        return launch_gemv(weight, type, x, nullptr, 0.0f, nullptr, y, in_features, out_features, stream);
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
        default:
            break;
    }
    if (!wide_x) return minfer_refuse("x must be 16-byte aligned for quantized weights");
    switch (type) {
        case GGML_Q4_0: return launch_format<Q4_0>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        case GGML_Q4_1: return launch_format<Q4_1>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
        default: return launch_format<Q8_0>(weight, bytes, x, y, in_features, out_features, n_tokens, stream);
    }
}
