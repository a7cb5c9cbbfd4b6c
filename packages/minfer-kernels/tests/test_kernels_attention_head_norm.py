"""Decode attention that norms and rotates q and the newest K row itself (Qwen3, Gemma 3), against float64.

The reference norms each head of q and of cache row kv_len - 1 (rms_norm, then rope at position kv_len - 1),
attends over the cache with that row replaced, and the row must come back normed and rotated in place, every
other row bit for bit (q in device memory too: it stays raw). Rows no query may see are NaN, as in
test_kernels_attention.py, so a block that reads past its split or before the window fails.

Error bounds: the K row 1e-5 relative to rope's scale of the normed head (the norm's 1e-5 carried through the
rotation, as the rope tests state); the output 5e-5 of max |V|: decode's float32 2e-5 plus the normed q's and
k's 1e-5 each moving the scores (normed heads are O(1) per value, the scores O(sqrt(head_dim)) at most).

In an f16 cache the newest row was stored raw, rounded to f16, and the kernel norms and rotates those f16 values
widened, in float32, and writes the row back rounded to f16 again: its reference is the float64 norm and rotation
of the widened raw row, and the row it writes is within 2^-10 of rope's scale of it (half an f16 ulp, 2^-11 of
the value, which is at most that scale, plus the float32 1e-5). The attention then reads the row as written: the
output's reference is over the cache holding that row, under the same 5e-5 (the row's f16 rounding is the row
check's, not the output's to tolerate).
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import (
    assert_close,
    attention,
    from_device,
    poisoned,
    randn,
    requires_gpu,
    rms_norm,
    rope,
    rope_inv_freq,
    to_device,
)
from test_kernels_attention import CACHE_DTYPES, F16, F32, bits

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

RTOL = 5e-5
RTOL_ROW = 1e-5
# An f16 row: raw k rounded to f16, normed, rounded again (attention.cu), against the norm of the widened raw row:
# one f16 rounding, 2^-11, of each value and the second of the pair's scale; a value normed below f16's normal range
# (2^-14) rounds to a subnormal, off by up to 2^-25 whatever its size, hence the floor under the scale.
RTOL_ROW_F16 = 2.0**-10
F16_SUBNORMAL_FLOOR = 2.0**-15
EPS = 1e-6
N_CTX = 4100

CASES = [
    # n_heads, n_kv_heads, head_dim, n_rot, mode, scaled (random per-pair factors, mscale 1.2)
    (16, 8, 128, 128, kernels.ROPE_NEOX, False),  # Qwen3-0.6B: groups of 2
    (4, 1, 256, 256, kernels.ROPE_NEOX, True),  # Gemma 3 270M: one KV head, a group of 4
    (8, 8, 64, 64, kernels.ROPE_NORMAL, False),  # no grouping, the llama pairs
    (32, 4, 128, 64, kernels.ROPE_NEOX, True),  # groups of 8, partial NeoX: dims 64..127 normed, not rotated
    (8, 2, 64, 48, kernels.ROPE_NORMAL, False),  # groups of 4, partial adjacent pairs
    (16, 1, 256, 128, kernels.ROPE_NORMAL, True),  # the largest group (16: two heads a warp), partial
]
# 512 ends a split exactly with 16 splits and with 64: 16 active splits of 32 rows at heads 128 and 256, 8 of 64 at
# head 64 (a split is at least a tile).
KV_LENS = [1, 33, 512, 2049, 4097]


def normed_rotated(x, weight, n_heads, head_dim, position, n_rot, inv_freq, mscale, mode):
    """(each head of the row x RMS-normed with `weight`, then rotated at `position`; rope's error scale)."""
    normed = rms_norm(x.reshape(n_heads, head_dim), weight, EPS).reshape(1, -1)
    return rope(normed, np.array([position]), n_heads, head_dim, n_rot, inv_freq, mscale, mode)


def run_normed_decode(rng, stream, dev, n_heads, n_kv_heads, head_dim, n_rot, mode, scaled, kv_len, n_splits, window,
                      cache_type=F32):  # fmt: skip
    kv_dim = n_kv_heads * head_dim
    visible_from = max(0, kv_len - window) if window else 0
    dtype = CACHE_DTYPES[cache_type]
    k_cache = np.full((N_CTX, kv_dim), np.nan, dtype)  # in f16: the raw rows rounded as the store rounds them
    v_cache = np.full_like(k_cache, np.nan)
    k_cache[visible_from:kv_len] = randn(rng, kv_len - visible_from, kv_dim, scale=3.0)
    v_cache[visible_from:kv_len] = randn(rng, kv_len - visible_from, kv_dim)
    q = randn(rng, 1, n_heads * head_dim, scale=3.0)
    q_norm, k_norm = randn(rng, head_dim), randn(rng, head_dim)
    inv_freq, mscale = rope_inv_freq(1e6, n_rot, rng if scaled else None), 1.2 if scaled else 1.0
    q_dev, k_dev = to_device(q, stream), to_device(k_cache, stream)
    out = poisoned((1, n_heads * head_dim), np.float32, stream)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(n_heads, head_dim, n_splits))
    kernels.attention_decode_f32(
        q_dev.ptr, k_dev.ptr, dev(v_cache), out.ptr, dev(np.array([kv_len], np.int32)), workspace.ptr, n_heads,
        n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), window, n_splits, dev(q_norm), dev(k_norm), EPS, n_rot,
        dev(inv_freq) if n_rot else None, mscale, mode, cache_type, stream.handle,
    )  # fmt: skip

    position = kv_len - 1
    rotation = (position, n_rot, inv_freq, mscale, mode)
    q_ref, _ = normed_rotated(q, q_norm, n_heads, head_dim, *rotation)
    k_row, k_scale = normed_rotated(k_cache[position], k_norm, n_kv_heads, head_dim, *rotation)  # f16 widened
    got_cache = from_device(k_dev, k_cache.shape, dtype, stream)
    if cache_type == F16:
        row_rtol, k_scale = RTOL_ROW_F16, np.maximum(k_scale, F16_SUBNORMAL_FLOOR)
    else:
        row_rtol = RTOL_ROW
    assert_close(got_cache[position : position + 1], k_row, row_rtol, scale=k_scale, what="the newest K row")
    others = np.arange(N_CTX) != position
    assert np.array_equal(bits(got_cache[others]), bits(k_cache[others])), "a row other than the newest changed"
    assert np.array_equal(from_device(q_dev, q.shape, np.float32, stream), q), "q in device memory changed"
    expected_cache = k_cache.astype(np.float64)
    # The newest row attention reads: in a float32 cache the reference's (the kernel's 1e-5 from it is within the
    # output bound); in f16 the kernel's as written (checked above: its rounding, up to 2^-11, would move the
    # scores past the output bound).
    expected_cache[position] = k_row[0] if cache_type == F32 else got_cache[position]
    expected = attention(q_ref, expected_cache, v_cache, [position], n_heads, n_kv_heads, head_dim, window=window)
    got = from_device(out, q.shape, np.float32, stream)
    scale = np.abs(v_cache[visible_from:kv_len].astype(np.float64)).max()
    assert_close(got, expected, RTOL, scale=scale, what=f"normed decode attention ({cache_type.name})")


@pytest.mark.parametrize("n_splits", [1, 16, 64])
@pytest.mark.parametrize("kv_len", KV_LENS)
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim", "n_rot", "mode", "scaled"), CASES)
def test_decode_attention_norms_and_rotates_q_and_the_newest_k(
    rng, stream, dev, n_heads, n_kv_heads, head_dim, n_rot, mode, scaled, kv_len, n_splits
):
    run_normed_decode(rng, stream, dev, n_heads, n_kv_heads, head_dim, n_rot, mode, scaled, kv_len, n_splits, 0)


@pytest.mark.parametrize("n_splits", [1, 16, 64])
@pytest.mark.parametrize(("kv_len", "window"), [(1, 512), (100, 512), (512, 512), (513, 512), (4097, 512), (2049, 33)])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim", "n_rot", "mode", "scaled"), CASES[:2])
def test_decode_attention_norms_the_newest_k_under_a_sliding_window(
    rng, stream, dev, n_heads, n_kv_heads, head_dim, n_rot, mode, scaled, kv_len, window, n_splits
):
    """The window moves the splits' first row, not the newest one: it stays in the last active split's block."""
    run_normed_decode(rng, stream, dev, n_heads, n_kv_heads, head_dim, n_rot, mode, scaled, kv_len, n_splits, window)


@pytest.mark.parametrize("n_splits", [1, 64])
@pytest.mark.parametrize("kv_len", [1, 33, 512, 4097])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim", "n_rot", "mode", "scaled"), CASES[:4])
def test_decode_attention_norms_the_newest_k_in_an_f16_cache(
    rng, stream, dev, n_heads, n_kv_heads, head_dim, n_rot, mode, scaled, kv_len, n_splits
):
    """Over f16 caches the newest row, stored raw in f16, comes back normed and rotated, rounded to f16 again."""
    heads = (n_heads, n_kv_heads, head_dim, n_rot, mode, scaled)
    run_normed_decode(rng, stream, dev, *heads, kv_len, n_splits, 0, F16)


def test_decode_attention_norms_nothing_when_n_rot_is_0(rng, stream, dev):
    """n_rot 0: the heads are normed and not rotated (inv_freq may then be None)."""
    run_normed_decode(rng, stream, dev, 16, 8, 128, 0, kernels.ROPE_NEOX, False, 300, 16, 0)


def test_normed_decode_attention_refuses_what_it_cannot_run(stream):
    p, h = mk.DeviceBuffer(1 << 12).ptr, stream.handle
    shape = (p, p, p, p, p, p, 4, 2, 64, 16, 0.125, 0, 4)
    refused = r"launch_attention_decode_f32 refused "
    with pytest.raises(ValueError, match=refused + ".*q_norm and k_norm go together"):
        kernels.attention_decode_f32(*shape, p, None, EPS, 64, p, 1.0, kernels.ROPE_NEOX, F32, h)
    with pytest.raises(ValueError, match=refused + ".*q_norm and k_norm go together"):
        kernels.attention_decode_f32(*shape, None, p, EPS, 64, p, 1.0, kernels.ROPE_NEOX, F32, h)
    with pytest.raises(ValueError, match=refused + ".*mode must be"):
        kernels.attention_decode_f32(*shape, p, p, EPS, 64, p, 1.0, 1, F32, h)
    for n_rot in (63, 96, -2):
        with pytest.raises(ValueError, match=refused + ".*n_rot must be even"):
            kernels.attention_decode_f32(*shape, p, p, EPS, n_rot, p, 1.0, kernels.ROPE_NEOX, F32, h)
    with pytest.raises(ValueError, match=refused + ".*inv_freq must be given"):
        kernels.attention_decode_f32(*shape, p, p, EPS, 64, None, 1.0, kernels.ROPE_NEOX, F32, h)
    mk.sync(h)  # nothing reached CUDA
