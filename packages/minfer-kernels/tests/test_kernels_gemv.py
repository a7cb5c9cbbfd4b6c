"""One-token GEMVs with their fused prologue and epilogues (gemv.cu), against numpy float64.

Weights are random, quantized with gguf.quants.quantize; the reference multiplies gguf.quants.dequantize
of the same bytes in float64. Error bounds, as in test_kernels_embed_matmul.py: every decoded weight is
exact in float32, so |y - y_ref| <= rtol * sum_i |W[o,i] h[i]| (the condition of the float32 dot
product), with MATMUL_RTOL per type; with the RMSNorm prologue h itself carries ~1e-6 of relative error,
so the bound is 2e-5 there. The epilogues are checked on their own terms: SwiGLU against silu(g) * u of
the float64 products, RoPE against the float64 rotation (1e-5 of |a| + |b| of the pair, bias included),
the KV cache rows at positions[0] written and every other row left bit for bit as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import (
    assert_close,
    from_device,
    poisoned,
    quantize,
    randn,
    requires_gpu,
    rms_norm,
    rope,
    silu,
    to_device,
)
from test_kernels_embed_matmul import MATMUL_RTOL, weights

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

EPS = 1e-6
NORM_RTOL = 2e-5
ALL_TYPES = list(mk.GGMLType)
QUANTIZED = (mk.GGMLType.Q4_0, mk.GGMLType.Q4_1, mk.GGMLType.Q8_0)

# (in_features, out_features): one block (32), a partial last warp step (896 = 3.5 steps of 256), a row
# longer than 8 warps' steps (4864), the vocabulary (151936 rows, 8 per block; narrow rows, as in the
# matmul tests, whose cached weights these share), an odd row count on either side of 16384.
SHAPES = [(32, 1), (896, 33), (896, 4864), (4864, 896), (128, 151936), (1024, 4097), (64, 16411)]


def references(values: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W h, sum_i |W[o,i] h[i]|) in float64."""
    w64, h64 = values.astype(np.float64), h.astype(np.float64)
    return w64 @ h64, np.abs(w64) @ np.abs(h64)


@pytest.mark.parametrize("norm", [False, True], ids=["plain", "rms_norm"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.name)
def test_gemv(rng, stream, dev, ggml_type, shape, norm):
    in_features, out_features = shape
    raw, values = weights(ggml_type, out_features, in_features)
    x, norm_weight = randn(rng, in_features, scale=2.0), randn(rng, in_features)
    y = poisoned(out_features, np.float32, stream)
    norm_ptr = dev(norm_weight) if norm else 0
    kernels.gemv(dev(raw), ggml_type, dev(x), norm_ptr, EPS, 0, y.ptr, in_features, out_features, stream.handle)
    h = rms_norm(x, norm_weight, EPS) if norm else x
    expected, condition = references(values, h)
    rtol = NORM_RTOL if norm else MATMUL_RTOL[ggml_type]
    got = from_device(y, out_features, np.float32, stream)
    assert_close(got, expected, rtol, scale=condition, what=f"gemv {ggml_type.name} {shape}")


@pytest.mark.parametrize("ggml_type", QUANTIZED, ids=lambda t: t.name)
def test_gemv_adds_the_residual_in_place(rng, stream, dev, ggml_type):
    raw, values = quantize(randn(rng, 896, 4864, scale=0.5), ggml_type)
    x, residual = randn(rng, 4864), randn(rng, 896, scale=3.0)
    y = to_device(residual, stream)  # y is the residual: the add happens in place
    kernels.gemv(dev(raw), ggml_type, dev(x), 0, EPS, y.ptr, y.ptr, 4864, 896, stream.handle)
    product, condition = references(values, x)
    expected = residual.astype(np.float64) + product
    got = from_device(y, 896, np.float32, stream)
    assert_close(got, expected, MATMUL_RTOL[ggml_type], scale=condition + np.abs(residual), what="residual")


def test_gemv_adds_a_separate_residual(rng, stream, dev):
    raw, values = quantize(randn(rng, 33, 896, scale=0.5), mk.GGMLType.Q8_0)
    x, residual = randn(rng, 896), randn(rng, 33)
    y = poisoned(33, np.float32, stream)
    kernels.gemv(dev(raw), mk.GGMLType.Q8_0, dev(x), 0, EPS, dev(residual), y.ptr, 896, 33, stream.handle)
    product, condition = references(values, x)
    got = from_device(y, 33, np.float32, stream)
    assert_close(got, residual + product, 1e-5, scale=condition + np.abs(residual))


@pytest.mark.parametrize("d_ff", [1, 33, 4864])
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.name)
def test_gemv_swiglu(rng, stream, dev, ggml_type, d_ff):
    raw, values = quantize(randn(rng, 2 * d_ff, 896, scale=0.05), ggml_type)  # gate rows, then up rows
    x, norm_weight = randn(rng, 896), randn(rng, 896)
    out = poisoned(d_ff, np.float32, stream)
    kernels.gemv_swiglu(dev(raw), ggml_type, dev(x), dev(norm_weight), EPS, out.ptr, 896, d_ff, stream.handle)
    products, condition = references(values, rms_norm(x, norm_weight, EPS))
    gate, up = products[:d_ff], products[d_ff:]
    expected = silu(gate) * up
    # |d(silu(g) u)| <= 1.1 |u| |dg| + |silu(g)| |du|, each product within NORM_RTOL of its condition
    scale = 1.1 * np.abs(up) * condition[:d_ff] + np.abs(silu(gate)) * condition[d_ff:] + np.abs(expected)
    got = from_device(out, d_ff, np.float32, stream)
    assert_close(got, expected, NORM_RTOL, scale=scale, what=f"swiglu {ggml_type.name}")


QKV_CASES = [
    # n_heads, n_kv_heads, head_dim, n_rot, freq_base, mode, bias
    (14, 2, 64, 64, 1e6, kernels.ROPE_NEOX, True),  # Qwen2.5-0.5B
    (9, 3, 64, 64, 1e4, kernels.ROPE_NORMAL, False),  # SmolLM2 (llama rope, no bias)
    (4, 4, 128, 96, 1e4, kernels.ROPE_NORMAL, True),  # partial rotary
    (3, 1, 80, 32, 1e4, kernels.ROPE_NEOX, False),  # partial NeoX
]


@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim", "n_rot", "freq_base", "mode", "bias"), QKV_CASES)
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.name)
def test_gemv_qkv_rope_store(rng, stream, dev, ggml_type, n_heads, n_kv_heads, head_dim, n_rot, freq_base, mode, bias):
    d, n_ctx = 896, 37
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    raw, values = quantize(randn(rng, q_dim + 2 * kv_dim, d, scale=0.5), ggml_type)
    x, norm_weight, bias_values = randn(rng, d), randn(rng, d), randn(rng, q_dim + 2 * kv_dim)
    position = int(rng.integers(0, n_ctx))
    caches = [randn(rng, n_ctx, kv_dim) for _ in range(2)]
    k_cache, v_cache = (to_device(cache, stream) for cache in caches)
    q = poisoned(q_dim, np.float32, stream)
    kernels.gemv_qkv_rope_store(
        dev(raw), ggml_type, dev(x), dev(norm_weight), EPS, dev(bias_values) if bias else 0, q.ptr, k_cache.ptr,
        v_cache.ptr, dev(np.array([position], np.int32)), d, n_heads, n_kv_heads, head_dim, n_rot, freq_base,
        mode, n_ctx, stream.handle,
    )  # fmt: skip

    products, condition = references(values, rms_norm(x, norm_weight, EPS))
    if bias:
        products += bias_values
        condition += np.abs(bias_values)
    cut = [q_dim, q_dim + kv_dim]
    (q_in, k_in, v_ref), (q_cond, k_cond, v_cond) = np.split(products, cut), np.split(condition, cut)

    def rotated(values, conditions, heads):
        # A rotated value's error is at most its pair's two product errors plus the rotation's rounding:
        # rope()'s scale of the conditions is that pair sum, its scale of the values |a| + |b|.
        reference, value_scale = rope(values[None], np.array([position]), heads, head_dim, n_rot, freq_base, mode)
        _, condition_scale = rope(conditions[None], np.array([position]), heads, head_dim, n_rot, freq_base, mode)
        return reference[0], condition_scale[0] + value_scale[0]

    q_ref, q_scale = rotated(q_in, q_cond, n_heads)
    k_ref, k_scale = rotated(k_in, k_cond, n_kv_heads)
    assert_close(from_device(q, q_dim, np.float32, stream), q_ref, NORM_RTOL, scale=q_scale, what="q")
    got_k, got_v = (from_device(c, (n_ctx, kv_dim), np.float32, stream) for c in (k_cache, v_cache))
    assert_close(got_k[position], k_ref, NORM_RTOL, scale=k_scale, what="k row")
    assert_close(got_v[position], v_ref, NORM_RTOL, scale=v_cond, what="v row")
    others = np.arange(n_ctx) != position
    assert np.array_equal(got_k[others], caches[0][others]) and np.array_equal(got_v[others], caches[1][others])


def test_gemv_refuses_what_it_cannot_read(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_gemv refused .*multiple of 8"):
        kernels.gemv(p, mk.GGMLType.F16, p, 0, EPS, 0, p, 33, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemv refused .*16-byte aligned"):
        kernels.gemv(p, mk.GGMLType.Q4_0, p + 4, 0, EPS, 0, p, 32, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemv_qkv_rope_store refused .*n_rot"):
        kernels.gemv_qkv_rope_store(p, mk.GGMLType.Q8_0, p, 0, EPS, 0, p, p, p, p, 32, 2, 1, 64, 66, 1e4, 0, 8, h)
