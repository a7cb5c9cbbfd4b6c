"""The KV store and attention (decode and prefill) against a float64 reference.

Cache rows that no query may see are poisoned with NaN: a kernel that reads past its causal limit, or
before the start of its sliding window, produces NaN and fails. Error bound: |out - ref| <= 2e-5 * max |V|
(the output is a convex combination of V rows; float32 scores, expf and sums).
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import assert_close, attention, from_device, poisoned, randn, requires_gpu, to_device

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

RTOL = 2e-5
N_CTX = 4100

HEADS = [
    # n_heads, n_kv_heads, head_dim
    (14, 2, 64),  # Qwen2.5-0.5B
    (9, 3, 64),  # SmolLM2-135M
    (8, 8, 128),  # no grouping
    (4, 1, 256),  # multi-query, the largest head
    (2, 2, 32),  # the smallest head
]


def random_cache(rng, n_kv_heads, head_dim, visible_rows):
    """K and V caches [N_CTX][n_kv_heads * head_dim]: random rows below `visible_rows`, NaN above."""
    k_cache = np.full((N_CTX, n_kv_heads * head_dim), np.nan, np.float32)
    v_cache = np.full_like(k_cache, np.nan)
    k_cache[:visible_rows] = randn(rng, visible_rows, n_kv_heads * head_dim)
    v_cache[:visible_rows] = randn(rng, visible_rows, n_kv_heads * head_dim)
    return k_cache, v_cache


@pytest.mark.parametrize(("n_tokens", "kv_dim"), [(1, 128), (33, 896), (7, 64)])
def test_kv_store_writes_rows_at_their_positions(rng, stream, dev, n_tokens, kv_dim):
    k, v = randn(rng, n_tokens, kv_dim), randn(rng, n_tokens, kv_dim)
    positions = rng.choice(N_CTX, size=n_tokens, replace=False).astype(np.int32)
    positions[0] = N_CTX - 1
    k_cache = poisoned((N_CTX, kv_dim), np.float32, stream)
    v_cache = poisoned((N_CTX, kv_dim), np.float32, stream)
    kernels.kv_store_f32(
        dev(k),
        dev(v),
        k_cache.ptr,
        v_cache.ptr,
        dev(positions),
        n_tokens,
        kv_dim,
        N_CTX,
        stream.handle,
    )
    for cache, rows in ((k_cache, k), (v_cache, v)):
        got = from_device(cache, (N_CTX, kv_dim), np.float32, stream)
        assert np.array_equal(got[positions], rows)
        untouched = np.ones(N_CTX, bool)
        untouched[positions] = False
        assert np.isnan(got[untouched]).all(), "a row no token was stored at changed"


@pytest.mark.parametrize("n_splits", [1, 7, 32])
@pytest.mark.parametrize("kv_len", [1, 33, 896, 4097])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS)
def test_decode_attention(rng, stream, dev, n_heads, n_kv_heads, head_dim, kv_len, n_splits):
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, kv_len)
    q = randn(rng, 1, n_heads * head_dim, scale=2.0)
    out = poisoned((1, n_heads * head_dim), np.float32, stream)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(n_heads, head_dim, n_splits))
    kernels.attention_decode_f32(
        dev(q),
        dev(k_cache),
        dev(v_cache),
        out.ptr,
        dev(np.array([kv_len], np.int32)),
        workspace.ptr,
        n_heads,
        n_kv_heads,
        head_dim,
        N_CTX,
        1 / np.sqrt(head_dim),
        0,
        n_splits,
        stream.handle,
    )
    got = from_device(out, q.shape, np.float32, stream)
    expected = attention(q, k_cache, v_cache, [kv_len - 1], n_heads, n_kv_heads, head_dim)
    assert_close(got, expected, RTOL, scale=np.abs(v_cache[:kv_len]).max(), what="decode attention")


@pytest.mark.parametrize("kv_len", [1, 100, 2049])
@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "head_dim"),
    [(32, 2, 96), (16, 1, 160), (5, 1, 192), (3, 1, 224)],  # the largest group, head sizes not powers of 2
)
def test_decode_attention_odd_head_sizes(rng, stream, dev, n_heads, n_kv_heads, head_dim, kv_len):
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, kv_len)
    q = randn(rng, 1, n_heads * head_dim, scale=2.0)
    out = poisoned((1, n_heads * head_dim), np.float32, stream)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(n_heads, head_dim, 64))
    kernels.attention_decode_f32(
        dev(q), dev(k_cache), dev(v_cache), out.ptr, dev(np.array([kv_len], np.int32)), workspace.ptr,
        n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, 64, stream.handle,
    )  # fmt: skip
    got = from_device(out, q.shape, np.float32, stream)
    expected = attention(q, k_cache, v_cache, [kv_len - 1], n_heads, n_kv_heads, head_dim)
    assert_close(got, expected, RTOL, scale=np.abs(v_cache[:kv_len]).max(), what="decode attention")


def test_decode_attention_reuses_its_workspace(rng, stream, dev):
    """Decode steps share one workspace: the merging block resets its counter for the next launch, whatever
    the number of splits that launch needs (a graph replays the same workspace every step)."""
    n_heads, n_kv_heads, head_dim, n_splits = 14, 2, 64, 64
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, 4000)
    k_dev, v_dev = dev(k_cache), dev(v_cache)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(n_heads, head_dim, n_splits))
    for kv_len in (4000, 300, 1, 2500, 2500, 65):
        q = randn(rng, 1, n_heads * head_dim, scale=2.0)
        out = poisoned(q.shape, np.float32, stream)
        kernels.attention_decode_f32(
            dev(q), k_dev, v_dev, out.ptr, dev(np.array([kv_len], np.int32)), workspace.ptr,
            n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, n_splits, stream.handle,
        )  # fmt: skip
        got = from_device(out, q.shape, np.float32, stream)
        expected = attention(q, k_cache, v_cache, [kv_len - 1], n_heads, n_kv_heads, head_dim)
        assert_close(got, expected, RTOL, scale=np.abs(v_cache[:kv_len]).max(), what=f"decode at kv_len {kv_len}")


PREFILL_POSITIONS = {
    "prompt": lambda rng: np.arange(33),
    "one token": lambda rng: np.array([0]),
    "second turn": lambda rng: 50 + np.arange(200),  # rows 0..49 hold an earlier turn
    "long context": lambda rng: 4000 + np.arange(33),
    "scattered": lambda rng: np.sort(rng.choice(3000, size=40, replace=False)),
}


@pytest.mark.parametrize("positions_of", PREFILL_POSITIONS.values(), ids=PREFILL_POSITIONS.keys())
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS)
def test_prefill_attention_is_causal_by_position(rng, stream, dev, n_heads, n_kv_heads, head_dim, positions_of):
    positions = positions_of(rng).astype(np.int32)
    n_tokens = len(positions)
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, int(positions.max()) + 1)
    q = randn(rng, n_tokens, n_heads * head_dim, scale=2.0)
    out = poisoned(q.shape, np.float32, stream)
    kernels.attention_prefill_f32(
        dev(q),
        dev(k_cache),
        dev(v_cache),
        out.ptr,
        dev(positions),
        n_tokens,
        n_heads,
        n_kv_heads,
        head_dim,
        N_CTX,
        1 / np.sqrt(head_dim),
        0,
        stream.handle,
    )
    got = from_device(out, q.shape, np.float32, stream)
    expected = attention(q, k_cache, v_cache, positions, n_heads, n_kv_heads, head_dim)
    visible = v_cache[: positions.max() + 1]
    assert_close(got, expected, RTOL, scale=np.abs(visible).max(), what="prefill attention")


@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "head_dim"),
    [(14, 2, 64), (6, 2, 96), (5, 1, 160), (4, 1, 256)],  # Qwen2.5-0.5B, and head sizes that are not powers of 2
)
def test_prefill_attention_over_a_long_prompt(rng, stream, dev, n_heads, n_kv_heads, head_dim):
    """A 600-token prompt after 40 cached rows: many K/V tiles per block, a partial last query tile."""
    positions = (40 + np.arange(600)).astype(np.int32)
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, 640)
    q = randn(rng, 600, n_heads * head_dim, scale=2.0)
    out = poisoned(q.shape, np.float32, stream)
    kernels.attention_prefill_f32(
        dev(q), dev(k_cache), dev(v_cache), out.ptr, dev(positions), 600,
        n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, stream.handle,
    )  # fmt: skip
    got = from_device(out, q.shape, np.float32, stream)
    expected = attention(q, k_cache, v_cache, positions, n_heads, n_kv_heads, head_dim)
    assert_close(got, expected, RTOL, scale=np.abs(v_cache[:640]).max(), what="prefill attention")


def test_prefill_attention_refuses_misaligned_buffers(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p = buffer.ptr
    with pytest.raises(ValueError, match="16-byte aligned"):
        kernels.attention_prefill_f32(p + 4, p, p, p, p, 1, 2, 2, 64, 16, 0.125, 0, stream.handle)
    with pytest.raises(ValueError, match="n_tokens must be positive"):
        kernels.attention_prefill_f32(p, p, p, p, p, 0, 2, 2, 64, 16, 0.125, 0, stream.handle)


def test_decode_and_prefill_agree_on_the_last_token(rng, stream):
    n_heads, n_kv_heads, head_dim, kv_len = 14, 2, 64, 500
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, kv_len)
    q = randn(rng, 1, n_heads * head_dim)
    q_dev, k_dev, v_dev = to_device(q, stream), to_device(k_cache, stream), to_device(v_cache, stream)
    by_decode = poisoned(q.shape, np.float32, stream)
    by_prefill = poisoned(q.shape, np.float32, stream)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(n_heads, head_dim, 16))
    kv_len_dev = to_device(np.array([kv_len], np.int32), stream)
    position_dev = to_device(np.array([kv_len - 1], np.int32), stream)
    kernels.attention_decode_f32(
        q_dev.ptr, k_dev.ptr, v_dev.ptr, by_decode.ptr, kv_len_dev.ptr, workspace.ptr,
        n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, 16, stream.handle,
    )  # fmt: skip
    kernels.attention_prefill_f32(
        q_dev.ptr, k_dev.ptr, v_dev.ptr, by_prefill.ptr, position_dev.ptr, 1,
        n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, stream.handle,
    )  # fmt: skip
    decode = from_device(by_decode, q.shape, np.float32, stream)
    prefill = from_device(by_prefill, q.shape, np.float32, stream)
    assert_close(decode, prefill, RTOL, scale=np.abs(v_cache[:kv_len]).max())
