"""The KV store and attention (decode and prefill) against a float64 reference.

Cache rows that no query may see are poisoned with NaN: a kernel that reads past its causal limit, or
before the start of its sliding window, produces NaN and fails. Error bounds, as multiples of max |V| (the
output is a convex combination of V rows):
- the float32 kernels: 2e-5 (float32 scores, expf and sums);
- prefill on the tensor cores (on_tensor_cores): against the reference over the f16 values the kernel
  multiplies (q * scale * log2(e), K and V, each rounded to f16 once), so the scores' rounding, which the
  exponential would amplify, is modelled instead of tolerated. What is left is P: each weight w <= 1 is
  rounded to f16 for P V, off by at most 2^-11 w (2^-25 below f16's normal range), over a float32
  denominator >= 1 of the unrounded weights: at most 2^-11 + n 2^-25 for n visible rows, so 2^-11 + 2^-13
  for the at most 4096 rows a query here sees; plus the float32 bound. A prefill split over the cache rows
  rounds each slice's weights against its own maximum, which the same bound covers, and merges the slices
  in float32.

A split launch's workspace starts as NaN: the kernel may not read what it did not write there (the runtime
shares that buffer with the GEMM's partial sums, so it never starts zeroed).

The caches are float32 or f16 (cache_type, CACHE_TYPES). The store rounds a float32 row to f16 to nearest even
(np.float16's bits, checked bit for bit); attention widens the f16 values exactly and sums in float32, so its
reference is the float64 one over the widened cache, under the same bounds. The tensor-core prefill multiplies
f16 values either way: over an f16 cache it gives the bits it gives over a float32 cache holding the same values.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from kernel_testing import assert_close, attention, from_device, poisoned, randn, requires_gpu, to_device

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

RTOL = 2e-5
RTOL_TENSOR_CORES = 2.0**-11 + 2.0**-13 + RTOL
N_CTX = 4100
F32, F16 = mk.GGMLType.F32, mk.GGMLType.F16
# The KV caches' element types, as the cache launchers' cache_type (a GGML type id) and as numpy stores them.
CACHE_DTYPES = {F32: np.float32, F16: np.float16}
CACHE_TYPES = pytest.mark.parametrize("cache_type", CACHE_DTYPES, ids=lambda t: t.name)

HEADS = [
    # n_heads, n_kv_heads, head_dim
    (14, 2, 64),  # Qwen2.5-0.5B
    (9, 3, 64),  # SmolLM2-135M
    (16, 8, 128),  # Qwen3-0.6B
    (8, 8, 128),  # no grouping
    (4, 1, 256),  # multi-query, the largest head
    (2, 2, 32),  # the smallest head
]


def on_tensor_cores(head_dim):
    """Whether launch_attention_prefill_f32 runs this head size on the tensor cores: its one choice, restated
    so that each path is held to its own bound (the wrong guess fails either way)."""
    return head_dim in (64, 128) and mk.devices()[0].compute_capability >= (8, 0)


def bits(array):
    """The array's bits as unsigned integers of its width: equal bits, not equal values (-0 is not 0)."""
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.itemsize}")


def cache_type_of(cache):
    """The cache_type of a host cache array (float32 or float16)."""
    return F16 if cache.dtype == np.float16 else F32


def random_cache(rng, n_kv_heads, head_dim, visible_rows, cache_type=F32):
    """K and V caches [N_CTX][n_kv_heads * head_dim] of cache_type's dtype: random rows below `visible_rows` (in
    f16: rounded from float32 as the store rounds them), NaN above."""
    dtype = CACHE_DTYPES[cache_type]
    k_cache = np.full((N_CTX, n_kv_heads * head_dim), np.nan, dtype)
    v_cache = np.full_like(k_cache, np.nan)
    k_cache[:visible_rows] = randn(rng, visible_rows, n_kv_heads * head_dim)
    v_cache[:visible_rows] = randn(rng, visible_rows, n_kv_heads * head_dim)
    return k_cache, v_cache


def max_abs(rows):
    """max |x| over cache rows (float32 or f16), as a float64 error scale."""
    return float(np.abs(rows.astype(np.float64)).max())


# float32 values whose rounding to f16 is a corner case (each with its negative too): ties to even (1 + 2^-11 down
# to 1, 1 + 3 * 2^-11 up to 1 + 2^-9, 2049 down to 2048, 2051 up to 2052), f16's largest value 65504, 65519 (just
# below the tie, down to 65504), 65520 (the tie, to inf), past its range (65536, 1e6, float32's largest: inf), the
# smallest subnormal 2^-24, the ties below and among the subnormals (2^-25 to 0, 3 * 2^-25 up to 2^-23,
# 5 * 2^-25 down to 2^-23), the tie 2^-14 - 2^-25 up into the normal range, an underflow (1e-10 to 0: -1e-10 to -0),
# and 0 (-0: its sign kept).
F16_CORNERS = np.array(
    [1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-23, 2049, 2051, 65504, 65519, 65520, 65536, 1e6,
     np.finfo(np.float32).max, 2**-24, 2**-25, 3 * 2**-25, 5 * 2**-25, 2**-14 - 2**-25, 1e-10, 0.0],
    np.float32,
)  # fmt: skip


def store_rows(rng, n_tokens, kv_dim):
    """Random float32 rows over f16's whole range and past it (subnormal, overflowing), F16_CORNERS and their
    negatives at random places among them."""
    rows = randn(rng, n_tokens, kv_dim) * np.exp2(rng.uniform(-30, 18, (n_tokens, kv_dim))).astype(np.float32)
    corners = np.concatenate([F16_CORNERS, -F16_CORNERS])
    rows.flat[rng.choice(rows.size, size=len(corners), replace=False)] = corners
    return rows


@CACHE_TYPES
@pytest.mark.parametrize(("n_tokens", "kv_dim"), [(1, 128), (33, 896), (7, 64)])
def test_kv_store_writes_rows_at_their_positions(rng, stream, dev, n_tokens, kv_dim, cache_type):
    """Each row goes to its position, float32 as it is, f16 as np.float16 rounds it (to nearest even, overflow to
    inf, subnormals, signed zeros): bit for bit. Every other row keeps its NaN poison."""
    dtype = CACHE_DTYPES[cache_type]
    k, v = store_rows(rng, n_tokens, kv_dim), store_rows(rng, n_tokens, kv_dim)
    positions = rng.choice(N_CTX, size=n_tokens, replace=False).astype(np.int32)
    positions[0] = N_CTX - 1
    k_cache = poisoned((N_CTX, kv_dim), dtype, stream)
    v_cache = poisoned((N_CTX, kv_dim), dtype, stream)
    kernels.kv_store_f32(
        dev(k),
        dev(v),
        k_cache.ptr,
        v_cache.ptr,
        dev(positions),
        n_tokens,
        kv_dim,
        N_CTX,
        cache_type,
        stream.handle,
    )
    for cache, rows in ((k_cache, k), (v_cache, v)):
        got = from_device(cache, (N_CTX, kv_dim), dtype, stream)
        with np.errstate(over="ignore"):  # numpy warns where f16 overflows to inf, as it should
            expected = rows.astype(dtype)
        assert np.array_equal(bits(got[positions]), bits(expected)), "a stored row's bits differ"
        untouched = np.ones(N_CTX, bool)
        untouched[positions] = False
        assert np.isnan(got[untouched]).all(), "a row no token was stored at changed"


@CACHE_TYPES
@pytest.mark.parametrize("n_splits", [1, 7, 32])
@pytest.mark.parametrize("kv_len", [1, 33, 65, 129, 896, 4097])  # 65, 129: a tile and one row at heads 64, 32
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS)
def test_decode_attention(rng, stream, dev, n_heads, n_kv_heads, head_dim, kv_len, n_splits, cache_type):
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, kv_len, cache_type)
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
        *kernels.NO_HEAD_NORM,
        cache_type,
        stream.handle,
    )
    got = from_device(out, q.shape, np.float32, stream)
    expected = attention(q, k_cache, v_cache, [kv_len - 1], n_heads, n_kv_heads, head_dim)  # f16 widened exactly
    assert_close(got, expected, RTOL, scale=max_abs(v_cache[:kv_len]), what=f"decode attention ({cache_type.name})")


@CACHE_TYPES
@pytest.mark.parametrize("kv_len", [1, 100, 2049])
@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "head_dim"),
    [(32, 2, 96), (16, 1, 160), (5, 1, 192), (3, 1, 224)],  # the largest group, head sizes not powers of 2
)
def test_decode_attention_odd_head_sizes(rng, stream, dev, n_heads, n_kv_heads, head_dim, kv_len, cache_type):
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, kv_len, cache_type)
    q = randn(rng, 1, n_heads * head_dim, scale=2.0)
    out = poisoned((1, n_heads * head_dim), np.float32, stream)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(n_heads, head_dim, 64))
    kernels.attention_decode_f32(
        dev(q), dev(k_cache), dev(v_cache), out.ptr, dev(np.array([kv_len], np.int32)), workspace.ptr,
        n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, 64, *kernels.NO_HEAD_NORM, cache_type,
        stream.handle,
    )  # fmt: skip
    got = from_device(out, q.shape, np.float32, stream)
    expected = attention(q, k_cache, v_cache, [kv_len - 1], n_heads, n_kv_heads, head_dim)
    assert_close(got, expected, RTOL, scale=max_abs(v_cache[:kv_len]), what=f"decode attention ({cache_type.name})")


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
            n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, n_splits, *kernels.NO_HEAD_NORM, F32,
            stream.handle,
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


@functools.cache
def multiprocessors() -> int:
    return mk.devices()[0].sm_count


def prefill_splits(n_tokens, n_heads, head_dim, max_rows):
    """The slices of the cache rows attention_prefill_f32 cuts a launch into on this GPU (1: none)."""
    return kernels.attention_prefill_splits(n_tokens, n_heads, head_dim, max_rows, multiprocessors())


def run_prefill(stream, q, k_dev, v_dev, positions_dev, n_tokens, n_heads, n_kv_heads, head_dim, window, max_rows,
                workspace=None, cache_type=F32):  # fmt: skip
    """attention_prefill_f32's output for device inputs (caches of cache_type); its workspace poisoned (NaN: the
    kernel must not read what it did not write) unless one is given, to be reused."""
    nbytes = kernels.attention_prefill_workspace_bytes(n_tokens, n_heads, head_dim, max_rows, multiprocessors())
    if workspace is None and nbytes:
        workspace = poisoned((nbytes // 4,), np.float32, stream)
    shape = (n_tokens, n_heads * head_dim)
    out = poisoned(shape, np.float32, stream)
    kernels.attention_prefill_f32(
        q.ptr, k_dev.ptr, v_dev.ptr, out.ptr, positions_dev.ptr, n_tokens, n_heads, n_kv_heads, head_dim, N_CTX,
        max_rows, 1 / np.sqrt(head_dim), window, None if workspace is None else workspace.ptr, nbytes, cache_type,
        stream.handle,
    )  # fmt: skip
    return from_device(out, shape, np.float32, stream)


def check_prefill(rng, stream, positions, n_heads, n_kv_heads, head_dim, k_cache, v_cache, window=0, max_rows=None):
    """Prefill random queries at `positions` and compare with the reference of the kernel that runs, over caches of
    the arrays' type (float32 or f16). max_rows: the bound the launch splits the cache rows by, the largest
    position + 1 unless given. Over an f16 cache on the tensor cores, the output must also be the one a float32
    cache holding the same values gives, bit for bit. Returns the output and the device inputs, for a rerun."""
    n_tokens = len(positions)
    max_rows = int(positions.max()) + 1 if max_rows is None else max_rows
    cache_type = cache_type_of(k_cache)
    q = randn(rng, n_tokens, n_heads * head_dim, scale=2.0)
    inputs = [to_device(a, stream) for a in (q, k_cache, v_cache, positions)]
    shape = (n_tokens, n_heads, n_kv_heads, head_dim, window, max_rows)
    got = run_prefill(stream, *inputs, *shape, cache_type=cache_type)
    f16 = on_tensor_cores(head_dim)
    expected = attention(q, k_cache, v_cache, positions, n_heads, n_kv_heads, head_dim, window=window, f16_operands=f16)
    first_seen = max(0, int(positions.min()) - window + 1) if window else 0
    visible = v_cache[first_seen : positions.max() + 1]
    splits = prefill_splits(n_tokens, n_heads, head_dim, max_rows) if f16 else 1
    cores = "tensor" if f16 else "CUDA"
    what = f"prefill attention over an {cache_type.name} cache on the {cores} cores in {splits} slices"
    assert_close(got, expected, RTOL_TENSOR_CORES if f16 else RTOL, scale=max_abs(visible), what=what)
    if cache_type == F16 and f16:
        q_dev, _, _, positions_dev = inputs
        k32, v32 = (to_device(cache.astype(np.float32), stream) for cache in (k_cache, v_cache))
        as_f32 = run_prefill(stream, q_dev, k32, v32, positions_dev, *shape, cache_type=F32)
        assert np.array_equal(bits(got), bits(as_f32)), f"{what}: not the bits of a float32 cache of the same values"
    return got, inputs


@CACHE_TYPES
@pytest.mark.parametrize("positions_of", PREFILL_POSITIONS.values(), ids=PREFILL_POSITIONS.keys())
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS)
def test_prefill_attention_is_causal_by_position(rng, stream, n_heads, n_kv_heads, head_dim, positions_of, cache_type):
    positions = positions_of(rng).astype(np.int32)
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, int(positions.max()) + 1, cache_type)
    check_prefill(rng, stream, positions, n_heads, n_kv_heads, head_dim, k_cache, v_cache)


@CACHE_TYPES
@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "head_dim"),
    [(14, 2, 64), (16, 8, 128), (6, 2, 96), (5, 1, 160), (4, 1, 256)],  # and head sizes that are not powers of 2
)
def test_prefill_attention_over_a_long_prompt(rng, stream, n_heads, n_kv_heads, head_dim, cache_type):
    """A 600-token prompt after 40 cached rows: many K/V tiles per block, a partial last query tile."""
    positions = (40 + np.arange(600)).astype(np.int32)
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, 640, cache_type)
    check_prefill(rng, stream, positions, n_heads, n_kv_heads, head_dim, k_cache, v_cache)


@pytest.mark.parametrize("window", [1, 20, 64, 100, 4096])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS)
def test_prefill_attention_sees_only_its_window(rng, stream, n_heads, n_kv_heads, head_dim, window):
    """150 tokens after 300 cached rows, each query seeing its last `window` rows: its own row alone, windows
    shorter and longer than a block's queries, and one longer than any query's past (every row). The rows
    before the first query's window are NaN, so a kernel that reads one fails."""
    positions = (300 + np.arange(150)).astype(np.int32)
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, 450)
    first_seen = max(0, 300 - window + 1)
    k_cache[:first_seen] = np.nan
    v_cache[:first_seen] = np.nan
    check_prefill(rng, stream, positions, n_heads, n_kv_heads, head_dim, k_cache, v_cache, window)


# Split over the cache: 2048 cached rows, then a prompt (llama-bench's pp512 at depth 2048, and a shorter one
# whose few query tiles leave more block slots to fill), GQA as Qwen2.5-0.5B (14/2) and Llama 3.2 1B (32/8) in
# both head sizes the tensor cores take; no window, and one of 700 rows, shorter than any query's past.
@CACHE_TYPES
@pytest.mark.parametrize("window", [0, 700])
@pytest.mark.parametrize("n_tokens", [128, 512])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), [(14, 2, 64), (32, 8, 64), (14, 2, 128), (32, 8, 128)])
def test_prefill_attention_split_over_a_long_cache(
    rng, stream, n_heads, n_kv_heads, head_dim, n_tokens, window, cache_type
):
    positions = (2048 + np.arange(n_tokens)).astype(np.int32)
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, 2048 + n_tokens, cache_type)
    if window:
        k_cache[: 2048 - window + 1] = np.nan
        v_cache[: 2048 - window + 1] = np.nan
    check_prefill(rng, stream, positions, n_heads, n_kv_heads, head_dim, k_cache, v_cache, window)


def test_prefill_attention_far_below_max_rows_leaves_slices_empty(rng, stream):
    """max_rows N_CTX (the runtime's bound) for queries at 100..227: the launch has a slice per 256 rows of
    N_CTX, as many as the block slots hold, but each query tile sees 228 rows at most, so every slice past the
    first is empty and the merge must take nothing from it (its workspace is NaN)."""
    n_heads, n_kv_heads, head_dim = 14, 2, 64
    positions = (100 + np.arange(128)).astype(np.int32)
    if on_tensor_cores(head_dim):
        assert prefill_splits(len(positions), n_heads, head_dim, N_CTX) > 1
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, 228)
    check_prefill(rng, stream, positions, n_heads, n_kv_heads, head_dim, k_cache, v_cache, max_rows=N_CTX)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_split_prefill_attention_repeats_to_the_bit(rng, stream, head_dim):
    """The slices merge in slice order, with no atomics: a rerun into the workspace the first run left behind
    gives the same bits. 64 queries on 14 heads after 2048 rows: 14 query tiles, split on any GPU."""
    n_heads, n_kv_heads = 14, 2
    positions = (2048 + np.arange(64)).astype(np.int32)
    max_rows = 2048 + 64
    if on_tensor_cores(head_dim):
        assert prefill_splits(len(positions), n_heads, head_dim, max_rows) > 1
    k_cache, v_cache = random_cache(rng, n_kv_heads, head_dim, max_rows)
    got, inputs = check_prefill(rng, stream, positions, n_heads, n_kv_heads, head_dim, k_cache, v_cache)
    nbytes = kernels.attention_prefill_workspace_bytes(len(positions), n_heads, head_dim, max_rows, multiprocessors())
    workspace = poisoned((max(nbytes, 16) // 4,), np.float32, stream)
    for _ in range(2):  # into a NaN workspace, then into what that run left there
        again = run_prefill(stream, *inputs, len(positions), n_heads, n_kv_heads, head_dim, 0, max_rows, workspace)
        assert np.array_equal(again, got), "a rerun of the split prefill attention differs"


def test_prefill_attention_refuses_misaligned_buffers(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match="16-byte aligned"):
        kernels.attention_prefill_f32(p + 4, p, p, p, p, 1, 2, 2, 64, 16, 16, 0.125, 0, None, 0, F32, h)
    with pytest.raises(ValueError, match="n_tokens must be positive"):
        kernels.attention_prefill_f32(p, p, p, p, p, 0, 2, 2, 64, 16, 16, 0.125, 0, None, 0, F32, h)
    for max_rows in (0, 17):
        with pytest.raises(ValueError, match="max_rows must be between 1 and n_ctx"):
            kernels.attention_prefill_f32(p, p, p, p, p, 1, 2, 2, 64, 16, max_rows, 0.125, 0, None, 0, F32, h)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_attention_refuses_a_workspace_too_small_for_its_slices(stream, head_dim):
    """64 queries on 14 heads with 4096 rows to see: 14 query tiles, fewer than any GPU's block slots, so the
    launch splits the cache rows and needs its workspace."""
    if not on_tensor_cores(head_dim):
        pytest.skip("the float32 kernel does not split the cache rows")
    n_tokens, n_heads, max_rows = 64, 14, 4096
    assert prefill_splits(n_tokens, n_heads, head_dim, max_rows) > 1
    nbytes = kernels.attention_prefill_workspace_bytes(n_tokens, n_heads, head_dim, max_rows, multiprocessors())
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    for space, size in ((p, nbytes - 4), (None, nbytes), (p + 8, nbytes)):
        with pytest.raises(ValueError, match=r"refused .*workspace must hold attention_prefill_workspace_bytes"):
            kernels.attention_prefill_f32(p, p, p, p, p, n_tokens, n_heads, 2, head_dim, N_CTX, max_rows, 0.125, 0,
                                          space, size, F32, h)  # fmt: skip
    mk.sync(h)  # nothing reached CUDA: nothing is pending


def test_decode_and_prefill_agree_on_the_last_token(rng, stream):
    """The float32 decode and prefill kernels compute the same function (a head size the tensor cores do not
    take: their prefill is held to its own reference above)."""
    n_heads, n_kv_heads, head_dim, kv_len = 12, 2, 96, 500
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
        n_heads, n_kv_heads, head_dim, N_CTX, 1 / np.sqrt(head_dim), 0, 16, *kernels.NO_HEAD_NORM, F32, stream.handle,
    )  # fmt: skip
    kernels.attention_prefill_f32(
        q_dev.ptr, k_dev.ptr, v_dev.ptr, by_prefill.ptr, position_dev.ptr, 1,
        n_heads, n_kv_heads, head_dim, N_CTX, kv_len, 1 / np.sqrt(head_dim), 0, None, 0, F32, stream.handle,
    )  # fmt: skip
    decode = from_device(by_decode, q.shape, np.float32, stream)
    prefill = from_device(by_prefill, q.shape, np.float32, stream)
    assert_close(decode, prefill, RTOL, scale=np.abs(v_cache[:kv_len]).max())
