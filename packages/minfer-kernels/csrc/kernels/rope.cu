// Rotary position embedding (RoPE), in place on queries or keys laid out [n_tokens][n_heads * head_dim].
//
// Pair p (0 <= p < n_rot / 2) of every head of token t is rotated by the angle
//     theta = positions[t] * freq_base^(-2p / n_rot)
// and the dimensions from n_rot up to head_dim are left as they are (partial rotary). Two conventions
// decide which two dimensions form pair p, both as in llama.cpp:
//     normal (mode 0, llama.cpp's LLAMA rope type): dimensions (2p, 2p + 1), adjacent;
//     NeoX   (mode 2, GGML_ROPE_TYPE_NEOX, Qwen2 and others): dimensions (p, p + n_rot / 2), the halves.
//
// Positions come from a device buffer, not from a kernel argument: the same launch (and so a captured
// graph) serves every decode step; the host only rewrites the positions.
//
// The angle is computed in double precision: positions reach 10^5 and a float32 product
// position * frequency is then off by up to ~10^-2 radians. The rotation itself is float32.
#include "common.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int ROPE_THREADS = 256;
constexpr int ROPE_NORMAL = 0;
constexpr int ROPE_NEOX = 2;

__global__ void rope_f32(float* x, const int* positions, int n_heads, int head_dim, int n_rot, double freq_base,
                         int mode) {
    const int token = blockIdx.y;
    const int half_rot = n_rot / 2;
    const int pair_index = blockIdx.x * blockDim.x + threadIdx.x;  // over (head, pair), pairs fastest
    if (pair_index >= n_heads * half_rot) return;
    const int head = pair_index / half_rot;
    const int p = pair_index % half_rot;

    const int first = mode == ROPE_NEOX ? p : 2 * p;
    const int second = mode == ROPE_NEOX ? p + half_rot : 2 * p + 1;

    const double theta = double(positions[token]) * pow(freq_base, -2.0 * p / n_rot);
    double sin_theta, cos_theta;
    sincos(theta, &sin_theta, &cos_theta);
    const float c = float(cos_theta), s = float(sin_theta);

    float* head_x = x + (std::size_t(token) * n_heads + head) * head_dim;
    const float a = head_x[first], b = head_x[second];
    head_x[first] = a * c - b * s;
    head_x[second] = a * s + b * c;
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_rope_f32(float* x, const int* positions, int n_tokens, int n_heads, int head_dim,
                                       int n_rot, float freq_base, int mode, cudaStream_t stream) {
    if (mode != ROPE_NORMAL && mode != ROPE_NEOX) return minfer_refuse("mode must be 0 (normal) or 2 (NeoX)");
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim)
        return minfer_refuse("n_rot must be even, positive and at most head_dim");
    // grid.x: ceil(n_heads * n_rot/2 / 256) blocks over the (head, pair) rotations of one token, one
    // thread per pair; grid.y: the token, so n_tokens <= 65535.
    const dim3 grid(ceil_div(n_heads * (n_rot / 2), ROPE_THREADS), n_tokens);
    rope_f32<<<grid, ROPE_THREADS, 0, stream>>>(x, positions, n_heads, head_dim, n_rot, double(freq_base), mode);
    return cudaGetLastError();
}
