"""The numpy backend's ops against loop-by-loop float64 definitions, on random inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minfer.backends.cpu import attention, rms_norm, rope_inplace


def test_rms_norm_matches_definition():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 33)).astype(np.float32)
    w = rng.standard_normal(33).astype(np.float32)
    out = np.full_like(x, np.nan)
    rms_norm(x, w, 1e-5, out)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_rotates_the_right_pairs(neox):
    rng = np.random.default_rng(2)
    n_heads, head_dim, rope_dim, mscale = 3, 16, 12, 1.25
    inv_freq = rng.uniform(1e-4, 1.0, rope_dim // 2)  # any table: RoPE scaling only changes its values
    positions = np.array([0, 5, 17], dtype=np.int32)
    x = rng.standard_normal((3, n_heads * head_dim)).astype(np.float32)
    got = x.copy()
    rope_inplace(got, positions, n_heads, head_dim, rope_dim, inv_freq, mscale, neox)
    expected = x.astype(np.float64).reshape(3, n_heads, head_dim).copy()
    for t, pos in enumerate(positions):
        for h in range(n_heads):
            row = expected[t, h].copy()
            for i in range(rope_dim // 2):
                angle = pos * inv_freq[i]
                cos, sin = mscale * math.cos(angle), mscale * math.sin(angle)
                a, b = (i, i + rope_dim // 2) if neox else (2 * i, 2 * i + 1)
                expected[t, h, a] = row[a] * cos - row[b] * sin
                expected[t, h, b] = row[a] * sin + row[b] * cos
    np.testing.assert_allclose(got, expected.reshape(3, -1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(
        got.reshape(3, n_heads, head_dim)[..., rope_dim:], x.reshape(3, n_heads, head_dim)[..., rope_dim:]
    )


@pytest.mark.parametrize(("window", "scale"), [(0, None), (4, None), (1, 0.3), (50, 0.05)])
def test_attention_is_causal_by_position_with_grouped_heads(window, scale):
    rng = np.random.default_rng(3)
    n_heads, n_kv_heads, head_dim, n_ctx = 6, 2, 8, 20
    cache_k = rng.standard_normal((n_ctx, n_kv_heads * head_dim)).astype(np.float32)
    cache_v = rng.standard_normal((n_ctx, n_kv_heads * head_dim)).astype(np.float32)
    positions = np.array([9, 10, 11], dtype=np.int32)
    kv_len = 12
    scale = 1 / math.sqrt(head_dim) if scale is None else scale
    q = rng.standard_normal((3, n_heads * head_dim)).astype(np.float32)
    out = np.full((3, n_heads * head_dim), np.nan, dtype=np.float32)
    attention(q, cache_k, cache_v, positions, kv_len, n_heads, n_kv_heads, head_dim, scale, window, out)
    expected = np.zeros((3, n_heads, head_dim))
    for t, pos in enumerate(positions):
        first = max(0, pos - window + 1) if window else 0  # a sliding window: the last `window` rows
        for h in range(n_heads):
            kv = h // (n_heads // n_kv_heads)
            qh = q[t, h * head_dim : (h + 1) * head_dim].astype(np.float64)
            keys = cache_k[first : pos + 1, kv * head_dim : (kv + 1) * head_dim].astype(np.float64)
            values = cache_v[first : pos + 1, kv * head_dim : (kv + 1) * head_dim].astype(np.float64)
            scores = keys @ qh * scale
            p = np.exp(scores - scores.max())
            expected[t, h] = (p / p.sum()) @ values
    np.testing.assert_allclose(out, expected.reshape(3, -1), rtol=1e-5, atol=1e-5)


def test_rms_norm_of_every_head_when_the_weight_is_one_head_long():
    """qwen3's and gemma3's q/k norm: the same RMSNorm, over each run of len(weight) values."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4 * 16)).astype(np.float32)
    weight = rng.standard_normal(16).astype(np.float32)
    out = np.empty_like(x)
    rms_norm(x, weight, 1e-6, out)
    heads = x.reshape(3, 4, 16).astype(np.float64)
    expected = heads / np.sqrt(np.mean(heads**2, axis=-1, keepdims=True) + 1e-6) * weight
    np.testing.assert_allclose(out, expected.reshape(3, -1), rtol=1e-5, atol=1e-6)
