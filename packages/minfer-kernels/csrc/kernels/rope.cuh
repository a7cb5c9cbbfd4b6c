// The rotary position embedding of one pair of dimensions, shared by the RoPE kernel (rope.cu) and the
// QKV projection that rotates in its epilogue (gemv.cu), so both rotate bit for bit alike.
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

}  // namespace minfer
