"""Embedding lookup and matrix products, reading weights in their GGUF byte layout.

Tables and weights are random, quantized with gguf.quants.quantize (for the types it cannot encode, IQ4_NL,
the K-quants and IQ4_XS: random valid blocks, kernel_testing.random_blocks, every bit of their quants and
sub-block scales random); the reference is computed from gguf.quants.dequantize of those same bytes, so the
kernels are checked against GGUF's own decoder.

Error bounds:
    embed_rows   exact: bit-identical to gguf.quants.dequantize for every type
    matmul       |y - y_ref| <= rtol * sum_i |W[o,i] x[t,i]| (the condition of a float32 dot product),
                 rtol per type below: every decoded weight is exact in float32, so what remains is the
                 float32 accumulation of up to 4864 products (Q4_1 and Q5_1 add m * sum(x), a second
                 product, and so do Q2_K, Q4_K and Q5_K with -dmin * min * sum(x); the other super-block
                 formats' (d * scale) * q, factored as (d * scale) * sum(q x), moves each product by at most
                 one float32 rounding).
"""

from __future__ import annotations

import functools
import os
import secrets

import numpy as np
import pytest
from kernel_testing import (
    BLOCK_TYPES,
    SUPER_BLOCK_TYPES,
    assert_close,
    from_device,
    poisoned,
    randn,
    random_weights,
    requires_gpu,
    to_device,
)

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

FLOATS = (mk.GGMLType.F32, mk.GGMLType.F16, mk.GGMLType.BF16)

MATMUL_RTOL = {
    mk.GGMLType.F32: 1e-5,
    mk.GGMLType.F16: 1e-5,
    mk.GGMLType.BF16: 1e-5,
    mk.GGMLType.Q4_0: 1e-5,
    mk.GGMLType.Q4_1: 5e-5,
    mk.GGMLType.Q5_0: 1e-5,
    mk.GGMLType.Q5_1: 5e-5,
    mk.GGMLType.Q8_0: 1e-5,
    mk.GGMLType.IQ4_NL: 1e-5,
    mk.GGMLType.Q2_K: 5e-5,
    mk.GGMLType.Q3_K: 1e-5,
    mk.GGMLType.Q4_K: 5e-5,
    mk.GGMLType.Q5_K: 5e-5,
    mk.GGMLType.Q6_K: 1e-5,
    mk.GGMLType.IQ4_XS: 1e-5,
}

_session_rng = np.random.default_rng(int(os.environ.get("MINFER_TEST_SEED") or secrets.randbits(32)))


@functools.lru_cache(maxsize=8)
def weights(ggml_type: mk.GGMLType, rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantized random weights, cached across the parametrized tests that share a shape (quantizing
    151936 rows takes seconds); fresh every session."""
    return random_weights(_session_rng, rows, n, ggml_type, scale=0.5)


def case_id(value) -> str:
    """A test id part: a type's name, the names of a tuple of types joined, or the value."""
    if isinstance(value, tuple):
        return "-".join(case_id(v) for v in value)
    return getattr(value, "name", None) or str(value)


# (n_rows, d): the vocabulary-sized table is a narrow one, so every row index up to 151935 is exercised;
# the super-block types' rows are whole 256-value super-blocks, so theirs are the same tables at widths they allow
EMBED_SHAPES = [(151936, 64), (4097, 896), (33, 32)]
SUPER_BLOCK_EMBED_SHAPES = [(151936, 256), (4097, 4864), (33, 256)]
EMBED_CASES = [(t, shape) for t in FLOATS + BLOCK_TYPES for shape in EMBED_SHAPES] + [
    (t, shape) for t in SUPER_BLOCK_TYPES for shape in SUPER_BLOCK_EMBED_SHAPES
]


@pytest.mark.parametrize("n_tokens", [1, 33])
@pytest.mark.parametrize(("ggml_type", "shape"), EMBED_CASES, ids=case_id)
def test_embed_rows_are_bit_exact(rng, stream, dev, ggml_type, shape, n_tokens):
    n_rows, d = shape
    raw, values = weights(ggml_type, n_rows, d)
    ids = rng.integers(0, n_rows, n_tokens, dtype=np.int32)
    ids[0] = n_rows - 1  # the last row, whose bytes end the table
    out = poisoned((n_tokens, d), np.float32, stream)
    table = to_device(raw, stream)
    kernels.embed_rows(table.ptr, ggml_type, dev(ids), out.ptr, n_tokens, d, n_rows, stream.handle)
    got = from_device(out, (n_tokens, d), np.float32, stream)
    assert np.array_equal(got, values[ids]), f"{ggml_type.name}: differs from gguf.quants.dequantize"


@pytest.mark.parametrize("ggml_type", FLOATS, ids=lambda t: t.name)
def test_embed_rows_of_odd_width_float_tables(rng, stream, dev, ggml_type):
    raw, values = weights(ggml_type, 100, 33)
    ids = rng.integers(0, 100, 5, dtype=np.int32)
    out = poisoned((5, 33), np.float32, stream)
    kernels.embed_rows(dev(raw), ggml_type, dev(ids), out.ptr, 5, 33, 100, stream.handle)
    assert np.array_equal(from_device(out, (5, 33), np.float32, stream), values[ids])


# (in_features, out_features)
FLOAT_SHAPES = [(1, 1), (33, 33), (896, 4097), (4864, 896), (128, 151936), (4097, 5)]
QUANTIZED_SHAPES = [(32, 1), (896, 33), (896, 4864), (4864, 896), (128, 151936), (1024, 4097)]
# the super-block types' counterparts: one super-block, an odd number of them (every other 110-byte Q3_K and
# 210-byte Q6_K row on a 2-byte boundary), ffn_up-like, ffn_down, the vocabulary, and an odd row count
SUPER_BLOCK_SHAPES = [(256, 1), (1280, 33), (1024, 4864), (4864, 896), (256, 151936), (1024, 4097)]
MATMUL_CASES = (
    [(t, shape) for t in FLOATS for shape in FLOAT_SHAPES]
    + [(t, shape) for t in BLOCK_TYPES for shape in QUANTIZED_SHAPES]
    + [(t, shape) for t in SUPER_BLOCK_TYPES for shape in SUPER_BLOCK_SHAPES]
)


@pytest.mark.parametrize("n_tokens", [1, 8, 33])
@pytest.mark.parametrize(("ggml_type", "shape"), MATMUL_CASES, ids=case_id)
def test_matmul(rng, stream, dev, ggml_type, shape, n_tokens):
    in_features, out_features = shape
    raw, values = weights(ggml_type, out_features, in_features)
    x = randn(rng, n_tokens, in_features)
    y = poisoned((n_tokens, out_features), np.float32, stream)
    kernels.matmul(
        dev(raw),
        ggml_type,
        dev(x),
        y.ptr,
        in_features,
        out_features,
        n_tokens,
        stream.handle,
    )
    got = from_device(y, (n_tokens, out_features), np.float32, stream)
    w64, x64 = values.astype(np.float64), x.astype(np.float64)
    expected = x64 @ w64.T
    condition = np.abs(x64) @ np.abs(w64).T  # sum_i |W[o,i] x[t,i]|
    assert_close(got, expected, MATMUL_RTOL[ggml_type], scale=condition, what=f"matmul {ggml_type.name}")


def test_matmul_reads_unaligned_float_rows(rng, stream, dev):
    """F32 weights from an odd offset of a buffer: the kernel falls back to scalar loads."""
    raw, values = weights(mk.GGMLType.F32, 33, 896)
    x = randn(rng, 3, 896)
    device_w = mk.DeviceBuffer(raw.nbytes + 4)
    device_w.copy_from_host(raw, stream.handle, offset=4)
    y = poisoned((3, 33), np.float32, stream)
    kernels.matmul(device_w.ptr + 4, mk.GGMLType.F32, dev(x), y.ptr, 896, 33, 3, stream.handle)
    expected = x.astype(np.float64) @ values.astype(np.float64).T
    condition = np.abs(x.astype(np.float64)) @ np.abs(values.astype(np.float64)).T
    assert_close(from_device(y, (3, 33), np.float32, stream), expected, 1e-5, scale=condition)


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES + SUPER_BLOCK_TYPES, ids=lambda t: t.name)
def test_rows_must_be_whole_blocks(stream, ggml_type):
    """A row length that splits into no whole number of the type's blocks is refused by every launcher that
    reads weights, before anything reaches CUDA, with the rule for that type: 3.5 blocks, a multiple of 8
    and of 16 (gemv's and gemm's own steps), so only the block is wrong."""
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    super_block = ggml_type in SUPER_BLOCK_TYPES
    n = 7 * (128 if super_block else 16)  # 896 or 112 values
    blocks = "256-value super-blocks" if super_block else "32-value blocks"
    rule = rf"{ggml_type.name}[^(]*\(rows of whole {blocks}\)"  # the type's name, then its block
    with pytest.raises(ValueError, match=rf"launch_embed_rows refused .*{rule}"):
        kernels.embed_rows(p, ggml_type, p, p, 1, n, 4, h)
    with pytest.raises(ValueError, match=rf"launch_matmul refused .*{rule}"):
        kernels.matmul(p, ggml_type, p, p, n, 4, 8, h)
    with pytest.raises(ValueError, match=rf"launch_gemv refused .*{rule}"):
        kernels.gemv(p, ggml_type, p, 0, 1e-6, 0, p, n, 4, h)
    with pytest.raises(ValueError, match=rf"launch_gemm refused .*{rule}"):
        kernels.gemm(p, ggml_type, p, None, None, p, n, 4, 16, None, 0, h)
    mk.sync(h)  # nothing reached CUDA: nothing is pending
