// Rotary position embedding (RoPE), in place on queries or keys laid out [n_tokens][n_heads * head_dim].
//
// Pair p (0 <= p < n_rot / 2) of every head of token t is rotated by positions[t] * inv_freq[p], scaled by
// mscale (rope.cuh: the angle, the table, and which two dimensions form a pair in each mode); the
// dimensions from n_rot up to head_dim are left as they are (partial rotary).
//
// Positions come from a device buffer, not from a kernel argument: the same launch (and so a captured
// graph) serves every decode step; the host only rewrites the positions.
//
// head_norm_rope_f32 is RoPE for the families that RMS-norm every head of q and k first (Qwen3, Gemma 3:
// attn_q_norm and attn_k_norm, weights one head long), for one token: q in place, and k in place in its row
// of the key cache, where gemv_qkv_rope_store (with n_rot 0, gemv.cu) stored it. Each head is
//     x[i] / sqrt(mean(x^2) + eps) * weight[i]     (rms_norm_f32's norm, norm.cu, over head_dim values)
// then rotated as rope_f32 rotates it. The weights are applied as the file stores them: for Gemma, llama.cpp's
// converter already wrote 1 + w, as the CPU reference (backends/cpu.py: rms_norm) reads them too.
#include "common.cuh"
#include "launchers.h"
#include "rope.cuh"

namespace minfer {
namespace {

constexpr int ROPE_THREADS = 256;

__global__ void rope_f32(float* x, const int* positions, int n_heads, int head_dim, int n_rot, const double* inv_freq,
                         float mscale, int mode) {
    const int token = blockIdx.y;
    const int half_rot = n_rot / 2;
    const int pair_index = blockIdx.x * blockDim.x + threadIdx.x;  // over (head, pair), pairs fastest
    if (pair_index >= n_heads * half_rot) return;
    const int head = pair_index / half_rot;
    const int p = pair_index % half_rot;

    const int first = mode == ROPE_NEOX ? p : 2 * p;
    const int second = mode == ROPE_NEOX ? p + half_rot : 2 * p + 1;

    float* head_x = x + (std::size_t(token) * n_heads + head) * head_dim;
    float a = head_x[first], b = head_x[second];
    rope_rotate(a, b, rope_angle(positions[token], inv_freq[p], mscale));
    head_x[first] = a;
    head_x[second] = b;
}

// head_norm_rope_f32: one warp per head. A lane holds the pairs lane, lane + 32, ... of its head (up to
// HEAD_NORM_PAIRS_PER_LANE: head_dim <= 256), both dimensions of each, so it norms and rotates them without
// exchanging values; the head's sum of squares is a warp_sum.
constexpr int HEAD_NORM_WARPS = 4;  // heads per block
constexpr int HEAD_NORM_PAIRS_PER_LANE = 4;
constexpr int HEAD_NORM_MAX_HEAD_DIM = 2 * WARP_SIZE * HEAD_NORM_PAIRS_PER_LANE;

__global__ void head_norm_rope_f32(float* q, float* k_cache, const float* q_norm, const float* k_norm,
                                   const int* positions, int n_heads, int n_kv_heads, int head_dim, int n_rot,
                                   const double* inv_freq, float mscale, int mode, float eps, int n_ctx) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int head = blockIdx.x * HEAD_NORM_WARPS + threadIdx.x / WARP_SIZE;  // q heads, then k heads
    const bool is_q = head < n_heads;
    const float* weight = is_q ? q_norm : k_norm;
    const int half_rot = n_rot / 2;
    const int n_pairs = head_dim / 2;

    // Pair p's two dimensions (rope_f32's in the rotated part, adjacent ones past it), their norm weights
    // and frequency: none of it depends on the previous kernel, so it is loaded before waiting for it.
    int first[HEAD_NORM_PAIRS_PER_LANE], second[HEAD_NORM_PAIRS_PER_LANE];
    float weight_first[HEAD_NORM_PAIRS_PER_LANE], weight_second[HEAD_NORM_PAIRS_PER_LANE];
    double frequency[HEAD_NORM_PAIRS_PER_LANE];
    const bool in_range = head < n_heads + n_kv_heads;
#pragma unroll
    for (int i = 0; i < HEAD_NORM_PAIRS_PER_LANE; ++i) {
        const int p = lane + i * WARP_SIZE;
        const bool neox = mode == ROPE_NEOX && p < half_rot;
        first[i] = neox ? p : 2 * p;
        second[i] = neox ? p + half_rot : 2 * p + 1;
        const bool held = in_range && p < n_pairs;
        weight_first[i] = held ? weight[first[i]] : 0.0f;
        weight_second[i] = held ? weight[second[i]] : 0.0f;
        frequency[i] = held && p < half_rot ? inv_freq[p] : 0.0;
    }
    wait_for_previous_kernel();
    allow_next_kernel();
    if (!in_range) return;  // a whole warp: the last block's heads past the end
    const int position = positions[0];
    if (position < 0 || position >= n_ctx) __trap();  // k's row would be another buffer's memory
    float* x = is_q ? q + std::size_t(head) * head_dim
                    : k_cache + (std::size_t(position) * n_kv_heads + (head - n_heads)) * head_dim;

    float a[HEAD_NORM_PAIRS_PER_LANE], b[HEAD_NORM_PAIRS_PER_LANE];
    float sum_of_squares = 0.0f;
#pragma unroll
    for (int i = 0; i < HEAD_NORM_PAIRS_PER_LANE; ++i) {
        const bool held = lane + i * WARP_SIZE < n_pairs;
        a[i] = held ? x[first[i]] : 0.0f;
        b[i] = held ? x[second[i]] : 0.0f;
        sum_of_squares += a[i] * a[i] + b[i] * b[i];
    }
    sum_of_squares = warp_sum(sum_of_squares);
    const float inv_rms = rsqrtf(sum_of_squares / float(head_dim) + eps);
#pragma unroll
    for (int i = 0; i < HEAD_NORM_PAIRS_PER_LANE; ++i) {
        const int p = lane + i * WARP_SIZE;
        if (p >= n_pairs) continue;
        float u = a[i] * inv_rms * weight_first[i], v = b[i] * inv_rms * weight_second[i];
        if (p < half_rot) rope_rotate(u, v, rope_angle(position, frequency[i], mscale));
        x[first[i]] = u;
        x[second[i]] = v;
    }
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_rope_f32(float* x, const int* positions, int n_tokens, int n_heads, int head_dim,
                                       int n_rot, const double* inv_freq, float mscale, int mode,
                                       cudaStream_t stream) {
    if (mode != ROPE_NORMAL && mode != ROPE_NEOX) return minfer_refuse("mode must be 0 (normal) or 2 (NeoX)");
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim)
        return minfer_refuse("n_rot must be even, positive and at most head_dim");
    // grid.x: ceil(n_heads * n_rot/2 / 256) blocks over the (head, pair) rotations of one token, one
    // thread per pair; grid.y: the token, so n_tokens <= 65535.
    const dim3 grid(ceil_div(n_heads * (n_rot / 2), ROPE_THREADS), n_tokens);
    rope_f32<<<grid, ROPE_THREADS, 0, stream>>>(x, positions, n_heads, head_dim, n_rot, inv_freq, mscale, mode);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_head_norm_rope_f32(float* q, float* k_cache, const float* q_norm, const float* k_norm,
                                                 const int* positions, int n_heads, int n_kv_heads, int head_dim,
                                                 int n_rot, const double* inv_freq, float mscale, int mode, float eps,
                                                 int n_ctx, cudaStream_t stream) {
    if (mode != ROPE_NORMAL && mode != ROPE_NEOX) return minfer_refuse("mode must be 0 (normal) or 2 (NeoX)");
    if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > HEAD_NORM_MAX_HEAD_DIM)
        return minfer_refuse("head_dim must be even, positive and at most 256");
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim)
        return minfer_refuse("n_rot must be even, positive and at most head_dim");
    if (n_heads <= 0 || n_kv_heads <= 0 || n_ctx <= 0) return minfer_refuse("head counts and n_ctx must be positive");
    // grid.x: blocks of HEAD_NORM_WARPS heads, the n_heads q heads then the n_kv_heads k heads; one warp per
    // head, whose lanes hold its pairs. Overlapped (common.cuh): the weights and frequencies load while the
    // QKV projection before it finishes.
    const dim3 grid(ceil_div(n_heads + n_kv_heads, HEAD_NORM_WARPS));
    return launch_overlapped(head_norm_rope_f32, grid, dim3(HEAD_NORM_WARPS * WARP_SIZE), 0, stream, q, k_cache,
                             q_norm, k_norm, positions, n_heads, n_kv_heads, head_dim, n_rot, inv_freq, mscale, mode,
                             eps, n_ctx);
}
