// The rotary position embedding of one pair of dimensions, shared by the RoPE kernel (rope.cu), the QKV
// projection that rotates in its epilogue (gemv.cu) and decode attention that norms and rotates q and the newest
// k itself (attention.cu, with head_norm_rope below, its angles computed here too), so all of them rotate bit for
// bit alike.
//
// Pair p (0 <= p < n_rot / 2) of a head at position `position` is rotated by the angle
//     theta = position * inv_freq[p],
// its cosine and sine multiplied by mscale. The host computes inv_freq (double, n_rot/2 values) and mscale
// once per model (minfer/models/rope.py): the plain freq_base^(-2p / n_rot), or that with the file's RoPE
// scaling (Llama 3's per-pair factors, linear, YaRN), so the kernels never see which kind it was. Which two
// dimensions form pair p is the caller's business (the mode, below).
//
// The angle is computed in double precision: positions reach 10^5 and a float32 product position *
// frequency is then off by up to ~10^-2 radians (the table itself is double for the same reason). It is
// reduced to [-pi, pi] in double too (|theta| < 2^31 here, so the error of the reduction stays below
// 10^-9), and only then handed to float32 sine and cosine, which are short and accurate on that interval:
// double-precision sincos is a long dependent chain, and in the fused QKV kernel it sat on every block's
// critical path. The rotation itself is float32.
#pragma once

#include "common.cuh"
#include "kv_cache.cuh"

namespace minfer {

// Which two dimensions of a head form pair p, as in llama.cpp:
//     normal (mode 0, llama.cpp's LLAMA rope type): dimensions (2p, 2p + 1), adjacent;
//     NeoX   (mode 2, GGML_ROPE_TYPE_NEOX, Qwen2 and others): dimensions (p, p + n_rot / 2), the halves.
constexpr int ROPE_NORMAL = 0;
constexpr int ROPE_NEOX = 2;

struct RopeAngle {
    float cos, sin;
};

// The angle of a pair at `position`, its frequency inv_freq read from the host's table.
__device__ __forceinline__ RopeAngle rope_angle(int position, double inv_freq, float mscale) {
    constexpr double TWO_PI = 6.283185307179586;
    const double theta = double(position) * inv_freq;
    const double turns = rint(theta * (1.0 / TWO_PI));
    const float reduced = float(fma(-turns, TWO_PI, theta));
    RopeAngle angle;
    sincosf(reduced, &angle.sin, &angle.cos);
    angle.sin *= mscale;
    angle.cos *= mscale;
    return angle;
}

__device__ __forceinline__ void rope_rotate(float& a, float& b, RopeAngle angle) {
    const float rotated_a = a * angle.cos - b * angle.sin;
    b = a * angle.sin + b * angle.cos;
    a = rotated_a;
}

// The families that RMS-norm every head of q and k before RoPE (Qwen3, Gemma 3: attn_q_norm and attn_k_norm,
// weights one head long): one warp turns one head x of HEAD_DIM values into y,
//     x[i] / sqrt(mean(x^2) + eps) * weight[i]     (rms_norm_f32's norm, norm.cu, over the head's values)
// rotated as rope_f32 rotates (pairs p < n_rot / 2, by angle[p]: rope_angle's at the head's position; the
// dimensions from n_rot on stay as they are), then times `scale` (decode attention's score scale on q; 1 on k,
// which changes no bit). The weights are applied as the file stores them: for Gemma, llama.cpp's converter
// already wrote 1 + w, as the CPU reference (backends/cpu.py: rms_norm) reads them too. A lane holds the pairs
// lane, lane + 32, ..., both dimensions of each (rope_f32's in the rotated part, adjacent ones past it), so it
// norms and rotates them without exchanging values; the head's sum of squares is a warp_sum. The weights and
// angles are the caller's table (decode: in shared memory, filled before it waits for the previous kernel), so
// what remains is x's loads, a warp_sum and y's stores: no other memory round trip once x is there. y may be x
// (in place: a lane stores only what it loaded itself, after the warp_sum that needs every load).
// x and y are float32 or a cache's f16 (kv_cache.cuh: widened as read, rounded once as written): decode norms the
// newest k row in place in the cache.
template <int HEAD_DIM, typename In, typename Out>
__device__ __forceinline__ void head_norm_rope(const In* x, Out* y, const float* weight, const RopeAngle* angle,
                                               float eps, int n_rot, int mode, float scale) {
    constexpr int N_PAIRS = HEAD_DIM / 2;
    constexpr int PAIRS_PER_LANE = ceil_div(N_PAIRS, WARP_SIZE);
    const int lane = threadIdx.x % WARP_SIZE;
    const int half_rot = n_rot / 2;
    int first[PAIRS_PER_LANE], second[PAIRS_PER_LANE];
    float a[PAIRS_PER_LANE], b[PAIRS_PER_LANE];
    float sum_of_squares = 0.0f;
#pragma unroll
    for (int i = 0; i < PAIRS_PER_LANE; ++i) {
        const int p = lane + i * WARP_SIZE;
        const bool neox = mode == ROPE_NEOX && p < half_rot;
        first[i] = neox ? p : 2 * p;
        second[i] = neox ? p + half_rot : 2 * p + 1;
        const bool held = p < N_PAIRS;
        a[i] = held ? widen(x[first[i]]) : 0.0f;
        b[i] = held ? widen(x[second[i]]) : 0.0f;
        sum_of_squares += a[i] * a[i] + b[i] * b[i];
    }
    sum_of_squares = warp_sum(sum_of_squares);
    const float inv_rms = rsqrtf(sum_of_squares / float(HEAD_DIM) + eps);
#pragma unroll
    for (int i = 0; i < PAIRS_PER_LANE; ++i) {
        const int p = lane + i * WARP_SIZE;
        if (p >= N_PAIRS) continue;
        float u = a[i] * inv_rms * weight[first[i]], v = b[i] * inv_rms * weight[second[i]];
        if (p < half_rot) rope_rotate(u, v, angle[p]);
        store_cache(y + first[i], u * scale);
        store_cache(y + second[i], v * scale);
    }
}

}  // namespace minfer
