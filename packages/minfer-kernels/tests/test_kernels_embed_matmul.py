"""Embedding lookup and matrix products, reading weights in their GGUF byte layout.

Tables and weights are random, quantized with gguf.quants.quantize (for Q4_K and Q6_K, which it cannot
encode: random valid super-blocks, kernel_testing.random_k_quant); the reference is computed from
gguf.quants.dequantize of those same bytes, so the kernels are checked against GGUF's own decoder.

Error bounds:
    embed_rows   exact: bit-identical to gguf.quants.dequantize for every type
    matmul       |y - y_ref| <= rtol * sum_i |W[o,i] x[t,i]| (the condition of a float32 dot product),
                 rtol per type below: every decoded weight is exact in float32, so what remains is the
                 float32 accumulation of up to 4864 products (Q4_1 adds m * sum(x), a second product, and
                 so does Q4_K with -dmin * min * sum(x); Q6_K's (d * scale) * q, factored as
                 (d * scale) * sum(q x), moves each product by at most one float32 rounding).
"""

from __future__ import annotations

import functools
import os
import secrets

import numpy as np
import pytest
from kernel_testing import K_QUANTS, assert_close, from_device, poisoned, randn, random_weights, requires_gpu, to_device

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

QUANTIZED = (mk.GGMLType.Q4_0, mk.GGMLType.Q4_1, mk.GGMLType.Q5_0, mk.GGMLType.Q8_0)  # 32-value blocks
FLOATS = (mk.GGMLType.F32, mk.GGMLType.F16)

MATMUL_RTOL = {
    mk.GGMLType.F32: 1e-5,
    mk.GGMLType.F16: 1e-5,
    mk.GGMLType.Q4_0: 1e-5,
    mk.GGMLType.Q4_1: 5e-5,
    mk.GGMLType.Q5_0: 1e-5,
    mk.GGMLType.Q8_0: 1e-5,
    mk.GGMLType.Q4_K: 5e-5,
    mk.GGMLType.Q6_K: 1e-5,
}

_session_rng = np.random.default_rng(int(os.environ.get("MINFER_TEST_SEED") or secrets.randbits(32)))


@functools.lru_cache(maxsize=8)
def weights(ggml_type: mk.GGMLType, rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantized random weights, cached across the parametrized tests that share a shape (quantizing
    151936 rows takes seconds); fresh every session."""
    return random_weights(_session_rng, rows, n, ggml_type, scale=0.5)


def case_id(value) -> str:
    return getattr(value, "name", None) or str(value)


# (n_rows, d): the vocabulary-sized table is a narrow one, so every row index up to 151935 is exercised;
# the K-quants' rows are whole 256-value super-blocks, so theirs are the same tables at widths they allow
EMBED_SHAPES = [(151936, 64), (4097, 896), (33, 32)]
K_QUANT_EMBED_SHAPES = [(151936, 256), (4097, 4864), (33, 256)]
EMBED_CASES = [(t, shape) for t in FLOATS + QUANTIZED for shape in EMBED_SHAPES] + [
    (t, shape) for t in K_QUANTS for shape in K_QUANT_EMBED_SHAPES
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
# the K-quants' counterparts: one super-block, an odd number of them (every other 210-byte Q6_K row on a
# 2-byte boundary), ffn_up-like, ffn_down, the vocabulary, and an odd row count
K_QUANT_SHAPES = [(256, 1), (1280, 33), (1024, 4864), (4864, 896), (256, 151936), (1024, 4097)]
MATMUL_CASES = (
    [(t, shape) for t in FLOATS for shape in FLOAT_SHAPES]
    + [(t, shape) for t in QUANTIZED for shape in QUANTIZED_SHAPES]
    + [(t, shape) for t in K_QUANTS for shape in K_QUANT_SHAPES]
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


@pytest.mark.parametrize("ggml_type", K_QUANTS, ids=lambda t: t.name)
def test_k_quant_rows_must_be_whole_super_blocks(stream, ggml_type):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_embed_rows refused .*of 256 for Q4_K/Q6_K"):
        kernels.embed_rows(p, ggml_type, p, p, 1, 128, 4, h)
    with pytest.raises(ValueError, match=r"launch_matmul refused .*of 256 for Q4_K/Q6_K"):
        kernels.matmul(p, ggml_type, p, p, 896, 4, 8, h)
    mk.sync(h)  # nothing reached CUDA: nothing is pending
