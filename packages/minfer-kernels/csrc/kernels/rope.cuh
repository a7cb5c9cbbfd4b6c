// The rotary position embedding of one pair of dimensions, shared by the RoPE kernel (rope.cu) and the
// QKV projection that rotates in its epilogue (gemv.cu), so both rotate bit for bit alike.
//
// Pair p (0 <= p < n_rot / 2) of a head at position `position` is rotated by the angle
//     theta = position * freq_base^(-2p / n_rot).
// Which two dimensions form pair p is the caller's business (the mode, below). The angle is computed in
// double precision: positions reach 10^5 and a float32 product position * frequency is then off by up to
// ~10^-2 radians. The rotation itself is float32.
#pragma once

namespace minfer {

// Which two dimensions of a head form pair p, as in llama.cpp:
//     normal (mode 0, llama.cpp's LLAMA rope type): dimensions (2p, 2p + 1), adjacent;
//     NeoX   (mode 2, GGML_ROPE_TYPE_NEOX, Qwen2 and others): dimensions (p, p + n_rot / 2), the halves.
constexpr int ROPE_NORMAL = 0;
constexpr int ROPE_NEOX = 2;

__device__ __forceinline__ void rope_rotate(float& a, float& b, int position, int p, int n_rot, double freq_base) {
    const double theta = double(position) * pow(freq_base, -2.0 * p / n_rot);
    double sin_theta, cos_theta;
    sincos(theta, &sin_theta, &cos_theta);
    const float c = float(cos_theta), s = float(sin_theta);
    const float rotated_a = a * c - b * s;
    b = a * s + b * c;
    a = rotated_a;
}

}  // namespace minfer
