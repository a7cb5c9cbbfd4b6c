"""The tensor-core GEMM (prefill matrix products) against a float64 reference.

Weights are random, quantized with gguf.quants.quantize (the types it cannot encode, IQ4_NL, the K-quants
and IQ4_XS: random valid blocks, kernel_testing.random_blocks); the reference multiplies
gguf.quants.dequantize of those bytes by x in float64. Shapes are chosen to leave partial tiles everywhere:
token counts that are not multiples of the 64- or 128-token tiles, output features that are not multiples
of 64, and in_features = 32 * 37, whose odd number of 18-, 22- or 34-byte blocks puts every other weight row
on a 2-byte boundary. The super-block types need in_features in whole 256-value super-blocks; their shapes
play the same roles (256 * 5: an odd number of 110-byte Q3_K and 210-byte Q6_K blocks), plus 1024 -> 4864,
whose 512-token products take the 128 x 128 tiles.

Error bounds. The kernel rounds both operands to f16 (unit roundoff u = 2^-11) and sums in float32:
    elementwise  |y - y_ref| <= 2^-9 * sum_i |W[o,i] x[t,i]|: each product carries at most two f16
                 roundings (2u = 2^-10), plus float32 accumulation over at most 4864 terms (< 3e-4); 2^-9
                 leaves a factor ~1.5 of margin over that worst case;
    overall      ||y - y_ref|| / ||y_ref|| <= 1e-3: the roundings are independent and random (rms about
                 0.3u per operand), so the typical error is ~3e-4 of the output. This is the check that
                 catches a misplaced weight or token: one wrong product in a row of 896 moves that row by
                 ~2%, far beyond 1e-3, while it could hide inside the worst-case elementwise bound.
"""

from __future__ import annotations

import functools
import os
import secrets

import gguf
import numpy as np
import pytest
from kernel_testing import (
    SUPER_BLOCK_TYPES,
    assert_close,
    from_device,
    poisoned,
    randn,
    random_weights,
    requires_gpu,
)

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

ELEMENTWISE_RTOL = 2.0**-9
NORM_RTOL = 1e-3

_session_rng = np.random.default_rng(int(os.environ.get("MINFER_TEST_SEED") or secrets.randbits(32)))


@functools.lru_cache(maxsize=8)
def weights(ggml_type: mk.GGMLType, rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantized random weights, shared by the tests of one shape; fresh every session."""
    return random_weights(_session_rng, rows, n, ggml_type, scale=0.5)


# (in_features, out_features): Qwen2.5-0.5B's ffn_up and ffn_down, an odd block count with an output that
# fills no tile, and the smallest product (one K step, 33 outputs).
SHAPES = [(896, 4864), (4864, 896), (32 * 37, 1000), (32, 33)]
# The super-block types': ffn_down, ffn_up-like, an odd super-block count, one super-block (eight K steps).
SUPER_BLOCK_SHAPES = [(4864, 896), (1024, 4864), (256 * 5, 1000), (256, 33)]
GEMM_CASES = [(t, shape) for t in mk.GGMLType if t not in SUPER_BLOCK_TYPES for shape in SHAPES] + [
    (t, shape) for t in SUPER_BLOCK_TYPES for shape in SUPER_BLOCK_SHAPES
]
TOKENS = [16, 17, 33, 100, 512, 513]


def run_gemm(stream: mk.Stream, dev, ggml_type: mk.GGMLType, raw: np.ndarray, x: np.ndarray, out_features: int):
    n_tokens, in_features = x.shape
    y = poisoned((n_tokens, out_features), np.float32, stream)
    kernels.gemm(dev(raw), ggml_type, dev(x), y.ptr, in_features, out_features, n_tokens, stream.handle)
    return from_device(y, (n_tokens, out_features), np.float32, stream)


def assert_gemm_close(got: np.ndarray, values: np.ndarray, x: np.ndarray, what: str) -> None:
    w64, x64 = values.astype(np.float64), x.astype(np.float64)
    expected = x64 @ w64.T
    condition = np.abs(x64) @ np.abs(w64).T  # sum_i |W[o,i] x[t,i]|
    assert_close(got, expected, ELEMENTWISE_RTOL, scale=condition, what=what)
    relative = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert relative <= NORM_RTOL, f"{what}: ||y - y_ref|| / ||y_ref|| = {relative:.3g} > {NORM_RTOL:g}"


@pytest.mark.parametrize("n_tokens", TOKENS)
@pytest.mark.parametrize(("ggml_type", "shape"), GEMM_CASES, ids=lambda v: getattr(v, "name", None) or str(v))
def test_gemm_matches_float64(rng, stream, dev, ggml_type, shape, n_tokens):
    in_features, out_features = shape
    raw, values = weights(ggml_type, out_features, in_features)
    x = randn(rng, n_tokens, in_features)
    got = run_gemm(stream, dev, ggml_type, raw, x, out_features)
    assert_gemm_close(got, values, x, f"gemm {ggml_type.name} {in_features}->{out_features} x{n_tokens}")


def test_gemm_of_a_vocabulary_wide_weight(rng, stream, dev):
    """The lm_head shape (151936 outputs): over a thousand column tiles, the last one partial."""
    raw, values = weights(mk.GGMLType.Q8_0, 151936, 128)
    x = randn(rng, 33, 128)
    got = run_gemm(stream, dev, mk.GGMLType.Q8_0, raw, x, 151936)
    assert_gemm_close(got, values, x, "gemm Q8_0 128->151936 x33")


def test_gemm_agrees_with_matmul(rng, stream, dev):
    """The two kernels behind Op.MATMUL compute one function (within the GEMM's f16 rounding)."""
    raw, values = weights(mk.GGMLType.Q4_0, 4864, 896)
    x = randn(rng, 64, 896)
    by_gemm = run_gemm(stream, dev, mk.GGMLType.Q4_0, raw, x, 4864)
    y = poisoned((64, 4864), np.float32, stream)
    kernels.matmul(dev(raw), mk.GGMLType.Q4_0, dev(x), y.ptr, 896, 4864, 64, stream.handle)
    by_matmul = from_device(y, (64, 4864), np.float32, stream)
    assert_gemm_close(by_gemm, values, x, "gemm")
    condition = np.abs(x.astype(np.float64)) @ np.abs(values.astype(np.float64)).T
    assert_close(by_gemm, by_matmul, ELEMENTWISE_RTOL, scale=condition, what="gemm vs matmul")


# (type, in_features, the parts' out_features): Qwen2.5-0.5B's q|k|v (896 -> 896, 128, 128) in the types of
# the benchmark models and of the presets' fallbacks, two parts of which one fills no tile, and the super-block
# types' rows.
GROUP_CASES = [
    (mk.GGMLType.Q4_0, 896, (896, 128, 128)),
    (mk.GGMLType.Q8_0, 896, (896, 128, 128)),
    (mk.GGMLType.Q5_1, 896, (896, 128, 128)),
    (mk.GGMLType.IQ4_NL, 896, (896, 128, 128)),
    (mk.GGMLType.F16, 32 * 37, (1000, 33)),
    (mk.GGMLType.BF16, 32 * 37, (1000, 33)),
    (mk.GGMLType.Q4_K, 1024, (64, 200, 4864)),
    (mk.GGMLType.Q3_K, 1024, (64, 200, 4864)),
    (mk.GGMLType.Q6_K, 256 * 5, (33,)),
    (mk.GGMLType.IQ4_XS, 256 * 5, (33,)),
]


@pytest.mark.parametrize("n_tokens", [16, 100, 512])
@pytest.mark.parametrize(("ggml_type", "in_features", "parts"), GROUP_CASES, ids=str)
def test_gemm_group_equals_one_gemm_per_part(rng, stream, dev, ggml_type, in_features, parts, n_tokens):
    """Each part of a group is the product gemm computes alone, to the bit (the same blocks do the same
    steps), and close to the float64 reference."""
    x = randn(rng, n_tokens, in_features)
    x_dev = dev(x)
    raws, values = zip(*(weights(ggml_type, n, in_features) for n in parts), strict=True)
    outputs = [poisoned((n_tokens, n), np.float32, stream) for n in parts]
    arguments = []
    for index in range(3):
        present = index < len(parts)
        arguments += [dev(raws[index]), outputs[index].ptr, parts[index]] if present else [0, 0, 0]
    kernels.gemm_group(*arguments, ggml_type, x_dev, in_features, n_tokens, stream.handle)
    for raw, value, output, n in zip(raws, values, outputs, parts, strict=True):
        grouped = from_device(output, (n_tokens, n), np.float32, stream)
        alone = run_gemm(stream, dev, ggml_type, raw, x, n)
        assert np.array_equal(grouped, alone), f"part of {n} outputs differs from its own gemm"
        assert_gemm_close(grouped, value, x, f"gemm_group {ggml_type.name} part {in_features}->{n} x{n_tokens}")


def test_gemm_group_refuses_a_part_after_an_absent_one(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_gemm_group refused .*absent part has none after it"):
        kernels.gemm_group(p, p, 4, 0, 0, 0, p, p, 4, mk.GGMLType.Q4_0, p, 32, 16, h)
    with pytest.raises(ValueError, match=r"launch_gemm_group refused .*absent part has none after it"):
        kernels.gemm_group(p, p, 4, p, p, -1, 0, 0, 0, mk.GGMLType.Q4_0, p, 32, 16, h)
    mk.sync(h)


def test_gemm_refuses_what_it_cannot_compute(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_gemm refused .*multiple of 32"):
        kernels.gemm(p, mk.GGMLType.F32, p, p, 33, 4, 16, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*type must be"):
        kernels.gemm(p, int(gguf.GGMLQuantizationType.IQ2_XXS), p, p, 256, 4, 16, h)  # a type no kernel reads
    for super_block_type in SUPER_BLOCK_TYPES:
        with pytest.raises(ValueError, match=r"launch_gemm refused .*whole 256-value super-blocks"):
            kernels.gemm(p, super_block_type, p, p, 32 * 9, 4, 16, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*positive"):
        kernels.gemm(p, mk.GGMLType.Q4_0, p, p, 32, 4, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*x must be 16-byte aligned"):
        kernels.gemm(p, mk.GGMLType.Q4_0, p + 4, p, 32, 4, 16, h)
    for float_type in (mk.GGMLType.F32, mk.GGMLType.F16, mk.GGMLType.BF16):
        with pytest.raises(ValueError, match=r"launch_gemm refused .*weight must be 16-byte aligned"):
            kernels.gemm(p + 4, float_type, p, p, 32, 4, 16, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*4-byte aligned"):
        kernels.gemm(p + 2, mk.GGMLType.Q4_0, p, p, 32, 4, 16, h)
    mk.sync(h)  # nothing reached CUDA: nothing is pending
