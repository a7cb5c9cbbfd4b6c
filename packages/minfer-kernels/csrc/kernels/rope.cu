// Rotary position embedding (RoPE), in place on queries or keys laid out [n_tokens][n_heads * head_dim].
//
// Pair p (0 <= p < n_rot / 2) of every head of token t is rotated by positions[t] * inv_freq[p], scaled by
// mscale (rope.cuh: the angle, the table, and which two dimensions form a pair in each mode); the
// dimensions from n_rot up to head_dim are left as they are (partial rotary).
//
// Positions come from a device buffer, not from a kernel argument: the same launch (and so a captured
// graph) serves every decode step; the host only rewrites the positions.
//
// The families that RMS-norm every head of q and k first (Qwen3, Gemma 3) rotate a decode step's q and k in
// decode attention (attention.cu), which norms and rotates them with rope.cuh's head_norm_rope; a prompt's
// heads are normed by rms_norm_f32 and rotated here.
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
