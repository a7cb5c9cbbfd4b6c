"""RMSNorm and RoPE against numpy float64.

Error bounds:
    rms_norm   1e-5 relative to |reference| (a float32 sum of d squares, rsqrtf, two products); rms_norm_add
               the same, relative to |y| + |norm| (the add's one float32 rounding is far below it); after a
               GEMV (both launches overlapped), the same against the norm of the x the GEMV left
    rope       1e-6 relative to max(mscale, 1) (|a| + |b|) of the rotated pair (cos/sin rounded to float32
               and scaled, then two products and a sum); dimensions past n_rot must come back bit for bit
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import (
    assert_close,
    from_device,
    poisoned,
    randn,
    random_weights,
    requires_gpu,
    rms_norm,
    rope,
    rope_inv_freq,
    to_device,
)

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

EPS = 1e-6


@pytest.mark.parametrize(("rows", "d"), [(1, 896), (33, 4097), (3, 4864), (2, 151936), (5, 1), (7, 33)])
def test_rms_norm(rng, stream, dev, rows, d):
    x, weight = randn(rng, rows, d, scale=2.0), randn(rng, d)
    out = poisoned((rows, d), np.float32, stream)
    kernels.rms_norm_f32(dev(x), dev(weight), out.ptr, rows, d, EPS, stream.handle)
    assert_close(from_device(out, (rows, d), np.float32, stream), rms_norm(x, weight, EPS), 1e-5, what="rms_norm")


def test_rms_norm_in_place(rng, stream, dev):
    x, weight = randn(rng, 4, 896), randn(rng, 896)
    buffer = to_device(x, stream)
    kernels.rms_norm_f32(buffer.ptr, dev(weight), buffer.ptr, 4, 896, EPS, stream.handle)
    assert_close(from_device(buffer, (4, 896), np.float32, stream), rms_norm(x, weight, EPS), 1e-5)


# One row is a decode step's launch, held in registers up to 8192 values (1 to 8 a thread, 256 to 1024 threads),
# then plain; more rows are a prompt's.
@pytest.mark.parametrize(
    ("rows", "d"),
    [(1, 1), (1, 33), (1, 640), (1, 1152), (1, 2049), (1, 5376), (1, 8192), (1, 8193), (33, 4097), (7, 33), (5, 1)],
)
def test_rms_norm_add(rng, stream, dev, rows, d):
    x, weight, y = randn(rng, rows, d, scale=2.0), randn(rng, d), randn(rng, rows, d)
    buffer = to_device(y, stream)
    kernels.rms_norm_add_f32(dev(x), dev(weight), buffer.ptr, rows, d, EPS, stream.handle)
    normed = rms_norm(x, weight, EPS)
    # Relative to the two terms, not to their sum, which can cancel to near zero.
    got = from_device(buffer, (rows, d), np.float32, stream)
    assert_close(got, y + normed, 1e-5, scale=np.abs(y) + np.abs(normed), what="rms_norm_add")


def test_rms_norm_add_refuses_x_aliasing_y(stream, dev):
    buffer = to_device(np.ones((2, 8), np.float32), stream)
    with pytest.raises(ValueError, match="launch_rms_norm_add_f32 refused its arguments: x must not alias y"):
        kernels.rms_norm_add_f32(buffer.ptr, dev(np.ones(8, np.float32)), buffer.ptr, 2, 8, EPS, stream.handle)


# Gemma 3 270M's attn_output: 1024 values in, its hidden size (640) out.
ATTN_OUTPUT = (1024, 640)
# ~0.5 ms at 2 GHz: the host has queued the GEMV and the norm long before the GPU reaches them, so they start
# back to back, as in a decode step.
BUSY_CYCLES = 1_000_000


@pytest.mark.parametrize("add", [False, True], ids=["rms_norm", "rms_norm_add"])
def test_a_norm_waits_for_the_gemv_that_writes_its_x(rng, stream, dev, add):
    """On one stream: a busy kernel, a Q4_0 GEMV writing x into a NaN-filled buffer, then a norm of that x (both
    overlapped launches: the norm may start while the GEMV runs, and only its wait orders its reads of x after
    the GEMV's writes); 20 times, x NaN again each time. A norm that read x before its wait would see NaN, or
    an x other than the one the GEMV left."""
    in_features, d = ATTN_OUTPUT
    raw, _ = random_weights(rng, d, in_features, mk.GGMLType.Q4_0, scale=0.5)
    norm_weight = randn(rng, d)
    weight, norm_weight_ptr = dev(raw), dev(norm_weight)
    norm = kernels.rms_norm_add_f32 if add else kernels.rms_norm_f32
    busy = mk.DeviceBuffer(8)
    for attempt in range(20):
        h, residual = randn(rng, in_features), randn(rng, d)
        # Every upload before the busy kernel: the GEMV and the norm are the only launches queued behind it.
        h_ptr, x = dev(h), poisoned(d, np.float32, stream)
        out = to_device(residual, stream) if add else poisoned(d, np.float32, stream)
        kernels.toy_busy(busy.ptr, BUSY_CYCLES, 1, stream.handle)
        kernels.gemv(weight, mk.GGMLType.Q4_0, h_ptr, 0, EPS, 0, x.ptr, in_features, d, stream.handle)
        norm(x.ptr, norm_weight_ptr, out.ptr, 1, d, EPS, stream.handle)
        got = from_device(out, d, np.float32, stream)
        written = mk.download(x, d, np.float32, stream.handle)
        assert np.isfinite(written).all(), f"attempt {attempt}: the GEMV left NaN in x"
        normed = rms_norm(written, norm_weight, EPS)
        what = f"attempt {attempt}: {norm.__name__} after the GEMV"
        if add:
            assert_close(got, residual + normed, 1e-5, scale=np.abs(residual) + np.abs(normed), what=what)
        else:
            assert_close(got, normed, 1e-5, what=what)


ROPE_CASES = [
    # n_tokens, n_heads, head_dim, n_rot, freq_base, mode, scaled (random per-pair factors, mscale 1.2)
    (1, 14, 64, 64, 1e6, kernels.ROPE_NEOX, False),  # Qwen2.5 queries, one decode token
    (33, 2, 64, 64, 1e6, kernels.ROPE_NEOX, True),  # Qwen2.5 keys, a prompt, YaRN-like table
    (33, 9, 64, 64, 1e4, kernels.ROPE_NORMAL, False),  # SmolLM2 (llama rope)
    (17, 8, 64, 64, 5e5, kernels.ROPE_NORMAL, True),  # Llama 3.2 with its rope_freqs factors
    (7, 4, 128, 96, 1e4, kernels.ROPE_NORMAL, False),  # partial rotary: dims 96..127 untouched
    (5, 3, 80, 32, 1e4, kernels.ROPE_NEOX, True),  # partial NeoX
    (200, 8, 256, 256, 1e6, kernels.ROPE_NEOX, False),
]


@pytest.mark.parametrize(("n_tokens", "n_heads", "head_dim", "n_rot", "freq_base", "mode", "scaled"), ROPE_CASES)
def test_rope(rng, stream, dev, n_tokens, n_heads, head_dim, n_rot, freq_base, mode, scaled):
    x = randn(rng, n_tokens, n_heads * head_dim)
    positions = rng.choice(100_000, size=n_tokens, replace=False).astype(np.int32)
    inv_freq, mscale = rope_inv_freq(freq_base, n_rot, rng if scaled else None), 1.2 if scaled else 1.0
    buffer = to_device(x, stream)
    kernels.rope_f32(
        buffer.ptr, dev(positions), n_tokens, n_heads, head_dim, n_rot, dev(inv_freq), mscale, mode, stream.handle
    )
    got = from_device(buffer, x.shape, np.float32, stream)
    expected, scale = rope(x, positions, n_heads, head_dim, n_rot, inv_freq, mscale, mode)
    assert_close(got, expected, 1e-6, scale=scale, what="rope")
    untouched = got.reshape(n_tokens, n_heads, head_dim)[:, :, n_rot:]
    assert np.array_equal(untouched, x.reshape(n_tokens, n_heads, head_dim)[:, :, n_rot:])


def test_rope_normal_and_neox_pair_different_dimensions(rng, stream, dev):
    x = randn(rng, 1, 64)
    positions = to_device(np.array([1000], np.int32), stream)
    inv_freq = dev(rope_inv_freq(1e4, 64))
    results = {}
    for mode in (kernels.ROPE_NORMAL, kernels.ROPE_NEOX):
        buffer = to_device(x, stream)
        kernels.rope_f32(buffer.ptr, positions.ptr, 1, 1, 64, 64, inv_freq, 1.0, mode, stream.handle)
        results[mode] = from_device(buffer, x.shape, np.float32, stream)
    assert not np.allclose(results[kernels.ROPE_NORMAL], results[kernels.ROPE_NEOX])
