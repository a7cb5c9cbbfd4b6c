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
BF16 weights multiply as bf16: W exact, x rounded to bf16 (u = 2^-9), so the elementwise bound is 2^-8 (2^-9 from
x's rounding plus the same float32 accumulation, a factor ~1.7 of margin) and the overall one 4e-3 (typical
~0.3 * 2^-9 ~ 6e-4 of the output, the same margin as f16's; a wrong product's ~2% still shows).
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
    gelu_tanh,
    poisoned,
    randn,
    random_weights,
    requires_gpu,
    silu,
)

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu


def elementwise_rtol(ggml_type: mk.GGMLType) -> float:
    return 2.0**-8 if ggml_type == mk.GGMLType.BF16 else 2.0**-9


def norm_rtol(ggml_type: mk.GGMLType) -> float:
    return 4e-3 if ggml_type == mk.GGMLType.BF16 else 1e-3


_session_rng = np.random.default_rng(int(os.environ.get("MINFER_TEST_SEED") or secrets.randbits(32)))


@functools.lru_cache(maxsize=8)
def weights(ggml_type: mk.GGMLType, rows: int, n: int, draw: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Quantized random weights, shared by the tests of one shape (`draw`: another weight of that shape, as up
    is to gate); fresh every session."""
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


@functools.cache
def multiprocessors() -> int:
    return mk.devices()[0].sm_count


def three_parts(parts: tuple[int, ...]) -> tuple[int, ...]:
    """A launch's out_features per part as the bindings take them: three, an absent part 0."""
    return (*parts, *[0] * (3 - len(parts)))


def splits(parts: tuple[int, ...], in_features: int, n_tokens: int) -> int:
    """The slices of K gemm_group cuts a launch of these parts (out_features each) into on this GPU."""
    return kernels.gemm_splits(*three_parts(parts), in_features, n_tokens, multiprocessors())


def workspace(stream: mk.Stream, ggml_type: mk.GGMLType, parts: tuple[int, ...], in_features: int, n_tokens: int):
    """(the workspace of a launch of these parts, poisoned: a rounded x, a slice's sums or a staged weight left
    unwritten shows; its bytes). Hold the buffer until the launch has run."""
    nbytes = kernels.gemm_workspace_bytes(ggml_type, *three_parts(parts), in_features, n_tokens, multiprocessors())
    return poisoned((nbytes // 4,), np.float32, stream), nbytes


def run_gemm(stream: mk.Stream, dev, ggml_type: mk.GGMLType, raw: np.ndarray, x: np.ndarray, out_features: int):
    n_tokens, in_features = x.shape
    y = poisoned((n_tokens, out_features), np.float32, stream)
    space, nbytes = workspace(stream, ggml_type, (out_features,), in_features, n_tokens)
    kernels.gemm(
        dev(raw), ggml_type, dev(x), None, None, y.ptr, in_features, out_features, n_tokens, space and space.ptr,
        nbytes, stream.handle,
    )  # fmt: skip
    return from_device(y, (n_tokens, out_features), np.float32, stream)


def assert_gemm_close(got: np.ndarray, values: np.ndarray, x: np.ndarray, ggml_type: mk.GGMLType, what: str) -> None:
    w64, x64 = values.astype(np.float64), x.astype(np.float64)
    expected = x64 @ w64.T
    condition = np.abs(x64) @ np.abs(w64).T  # sum_i |W[o,i] x[t,i]|
    assert_close(got, expected, elementwise_rtol(ggml_type), scale=condition, what=what)
    relative = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    bound = norm_rtol(ggml_type)
    assert relative <= bound, f"{what}: ||y - y_ref|| / ||y_ref|| = {relative:.3g} > {bound:g}"


@pytest.mark.parametrize("n_tokens", TOKENS)
@pytest.mark.parametrize(("ggml_type", "shape"), GEMM_CASES, ids=lambda v: getattr(v, "name", None) or str(v))
def test_gemm_matches_float64(rng, stream, dev, ggml_type, shape, n_tokens):
    in_features, out_features = shape
    raw, values = weights(ggml_type, out_features, in_features)
    x = randn(rng, n_tokens, in_features)
    got = run_gemm(stream, dev, ggml_type, raw, x, out_features)
    assert_gemm_close(got, values, x, ggml_type, f"gemm {ggml_type.name} {in_features}->{out_features} x{n_tokens}")


# The large tiles (on an H100 or H200, the warpgroup tiles) with a partial tile on both axes: 513 tokens (the
# fifth 128-token tile holds one) by 4904 output features (38 tiles of 128 and one of 40), for every type.
LARGE_PARTIAL_SHAPE = (1024, 4904)


@pytest.mark.parametrize("ggml_type", list(mk.GGMLType), ids=lambda t: t.name)
def test_large_tiles_with_partial_tiles_match_float64(rng, stream, dev, ggml_type):
    in_features, out_features = LARGE_PARTIAL_SHAPE
    raw, values = weights(ggml_type, out_features, in_features)
    x = randn(rng, 513, in_features)
    got = run_gemm(stream, dev, ggml_type, raw, x, out_features)
    assert_gemm_close(got, values, x, ggml_type, f"gemm {ggml_type.name} {in_features}->{out_features} x513")


# From 256 tokens on (gemm.cu: STAGED_MIN_TOKENS) the weights a tile would decode are decoded once into f16 rows
# of the workspace and multiplied as F16 weights: the product is the F16 launch's on the f16 rounding of their
# values (what the tiles' decoding stores), to the bit.
STAGED_CASES = [(t, shape) for t, shape in GEMM_CASES if t not in (mk.GGMLType.F16, mk.GGMLType.BF16)]


@pytest.mark.parametrize(("ggml_type", "shape"), STAGED_CASES, ids=lambda v: getattr(v, "name", None) or str(v))
def test_a_long_prompts_staged_weights_are_the_f16_product_of_their_values(rng, stream, dev, ggml_type, shape):
    in_features, out_features = shape
    raw, values = weights(ggml_type, out_features, in_features)
    x = randn(rng, 256, in_features)
    staged = run_gemm(stream, dev, ggml_type, raw, x, out_features)
    as_f16 = run_gemm(stream, dev, mk.GGMLType.F16, values.astype(np.float16), x, out_features)
    assert np.array_equal(staged, as_f16), f"gemm {ggml_type.name} {in_features}->{out_features} x256"


def test_gemm_of_a_vocabulary_wide_weight(rng, stream, dev):
    """The lm_head shape (151936 outputs): over a thousand column tiles, the last one partial."""
    raw, values = weights(mk.GGMLType.Q8_0, 151936, 128)
    x = randn(rng, 33, 128)
    got = run_gemm(stream, dev, mk.GGMLType.Q8_0, raw, x, 151936)
    assert_gemm_close(got, values, x, mk.GGMLType.Q8_0, "gemm Q8_0 128->151936 x33")


def test_gemm_agrees_with_matmul(rng, stream, dev):
    """The two kernels behind Op.MATMUL compute one function (within the GEMM's f16 rounding)."""
    raw, values = weights(mk.GGMLType.Q4_0, 4864, 896)
    x = randn(rng, 64, 896)
    by_gemm = run_gemm(stream, dev, mk.GGMLType.Q4_0, raw, x, 4864)
    y = poisoned((64, 4864), np.float32, stream)
    kernels.matmul(dev(raw), mk.GGMLType.Q4_0, dev(x), y.ptr, 896, 4864, 64, stream.handle)
    by_matmul = from_device(y, (64, 4864), np.float32, stream)
    assert_gemm_close(by_gemm, values, x, mk.GGMLType.Q4_0, "gemm")
    condition = np.abs(x.astype(np.float64)) @ np.abs(values.astype(np.float64)).T
    assert_close(by_gemm, by_matmul, elementwise_rtol(mk.GGMLType.Q4_0), scale=condition, what="gemm vs matmul")


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


def run_gemm_group(
    stream: mk.Stream, dev, ggml_type: mk.GGMLType, raws, x: np.ndarray, parts: tuple[int, ...], biases=(None,) * 3
):
    """Each part's y of one gemm_group launch of up to three weights (their GGUF bytes `raws`) by x, each part
    plus its bias where `biases` has one."""
    n_tokens, in_features = x.shape
    outputs = [poisoned((n_tokens, n), np.float32, stream) for n in parts]
    arguments = []
    for index in range(3):
        present = index < len(parts)
        bias = dev(biases[index]) if biases[index] is not None else None
        arguments += [dev(raws[index]), bias, outputs[index].ptr, parts[index]] if present else [None] * 3 + [0]
    space, nbytes = workspace(stream, ggml_type, parts, in_features, n_tokens)
    kernels.gemm_group(*arguments, ggml_type, dev(x), in_features, n_tokens, space and space.ptr, nbytes, stream.handle)
    return [from_device(output, (n_tokens, n), np.float32, stream) for output, n in zip(outputs, parts, strict=True)]


@pytest.mark.parametrize("n_tokens", [16, 100, 512])
@pytest.mark.parametrize(("ggml_type", "in_features", "parts"), GROUP_CASES, ids=str)
def test_gemm_group_equals_one_gemm_per_part(rng, stream, dev, ggml_type, in_features, parts, n_tokens):
    """Each part of a group is the product gemm computes alone, to the bit where both cut K into as many slices
    (the same blocks do the same steps and the slices add up in the same order), and close to the float64
    reference. (A group's tiles fill more of the GPU than one part's, so it may cut K into fewer slices; the
    sums then add up in another order.)"""
    x = randn(rng, n_tokens, in_features)
    raws, values = zip(*(weights(ggml_type, n, in_features) for n in parts), strict=True)
    grouped = run_gemm_group(stream, dev, ggml_type, raws, x, parts)
    for raw, value, part, n in zip(raws, values, grouped, parts, strict=True):
        alone = run_gemm(stream, dev, ggml_type, raw, x, n)
        if splits(parts, in_features, n_tokens) == splits((n,), in_features, n_tokens):
            assert np.array_equal(part, alone), f"part of {n} outputs differs from its own gemm"
        assert_gemm_close(part, value, x, ggml_type, f"gemm_group {ggml_type.name} part {in_features}->{n} x{n_tokens}")


# Products that cut K into slices on an H200 (132 SMs), in every type the tests above cover: Qwen2.5-0.5B's
# ffn_down (2 slices at 512 tokens, 8 at 128 and 17) and 33 outputs of its rows (8 slices), odd in tokens,
# tiles and outputs; and a group of three parts of those rows (7 slices at 128 tokens, 8 at 17, none at 512).
SPLIT_TOKENS = [17, 128, 512]
SPLIT_CASES = [(t, shape) for t in mk.GGMLType for shape in [(4864, 896), (4864, 33)]]
SPLIT_GROUP = (896, 128, 33)


@pytest.mark.parametrize("n_tokens", SPLIT_TOKENS)
@pytest.mark.parametrize(("ggml_type", "shape"), SPLIT_CASES, ids=lambda v: getattr(v, "name", None) or str(v))
def test_split_gemm_matches_float64_and_repeats_to_the_bit(rng, stream, dev, ggml_type, shape, n_tokens):
    """Slices of K added up in slice order by gemm_sum_splits: within the bounds of the unsplit product (only the
    float32 sums' order changes), and the same bits on every run (no atomics)."""
    in_features, out_features = shape
    raw, values = weights(ggml_type, out_features, in_features)
    x = randn(rng, n_tokens, in_features)
    got = run_gemm(stream, dev, ggml_type, raw, x, out_features)
    slices = splits((out_features,), in_features, n_tokens)
    what = f"gemm {ggml_type.name} {in_features}->{out_features} x{n_tokens} in {slices} slices"
    assert_gemm_close(got, values, x, ggml_type, what)
    assert np.array_equal(run_gemm(stream, dev, ggml_type, raw, x, out_features), got), f"{what}: a rerun differs"


@pytest.mark.parametrize("n_tokens", SPLIT_TOKENS)
@pytest.mark.parametrize("ggml_type", list(mk.GGMLType), ids=lambda t: t.name)
def test_split_gemm_group_of_three_parts(rng, stream, dev, ggml_type, n_tokens):
    """A group's slices keep each part's partial sums apart in the workspace and add them into each part's y."""
    in_features = 4864
    x = randn(rng, n_tokens, in_features)
    raws, values = zip(*(weights(ggml_type, n, in_features) for n in SPLIT_GROUP), strict=True)
    grouped = run_gemm_group(stream, dev, ggml_type, raws, x, SPLIT_GROUP)
    what = f"gemm_group {ggml_type.name} x{n_tokens} in {splits(SPLIT_GROUP, in_features, n_tokens)} slices"
    for value, part, n in zip(values, grouped, SPLIT_GROUP, strict=True):
        assert_gemm_close(part, value, x, ggml_type, f"{what}: part {in_features}->{n}")
    again = run_gemm_group(stream, dev, ggml_type, raws, x, SPLIT_GROUP)
    assert all(np.array_equal(a, b) for a, b in zip(again, grouped, strict=True)), f"{what}: a rerun differs"


def test_gemm_refuses_a_workspace_too_small(stream):
    """The workspace holds x rounded to 16 bits (every launch), then the slices' partial sums where K is cut: 33
    outputs of 4864-value rows at 128 tokens are two tiles, fewer than any GPU's block slots, so K is cut."""
    assert splits((33,), 4864, 128) > 1
    nbytes = kernels.gemm_workspace_bytes(mk.GGMLType.Q8_0, 33, 0, 0, 4864, 128, multiprocessors())
    assert nbytes > 128 * 4864 * 2, "the rounded x and the slices' partial sums"
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    for space, size in ((p, nbytes - 4), (None, nbytes), (p + 8, nbytes)):
        with pytest.raises(ValueError, match=r"launch_gemm refused .*workspace must hold gemm_workspace_bytes"):
            kernels.gemm(p, mk.GGMLType.Q8_0, p, None, None, p, 4864, 33, 128, space, size, h)
        with pytest.raises(ValueError, match=r"launch_gemm_group refused .*workspace must hold"):
            absent = (None, None, None, 0)
            kernels.gemm_group(p, None, p, 33, *absent, *absent, mk.GGMLType.Q8_0, p, 4864, 128, space, size, h)
    swiglu_bytes = kernels.gemm_swiglu_workspace_bytes(mk.GGMLType.Q4_0, 32, 4, 16)
    assert swiglu_bytes == 16 * 32 * 2, "the rounded x alone, in whole 256-byte units"
    for space, size in ((p, swiglu_bytes - 4), (None, swiglu_bytes), (p + 8, swiglu_bytes)):
        with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*workspace must hold"):
            kernels.gemm_swiglu(p, p, mk.GGMLType.Q4_0, p, p, 32, 4, 16, space, size, h)
    mk.sync(h)  # nothing reached CUDA: nothing is pending


# Epilogues, split and not: Qwen2.5-0.5B's ffn_down (K cut at 17 and at 512 tokens) and ffn_up (cut at 17
# tokens; at 512 the large tiles), ffn_up-like 1024 -> 4864 for the super-block types.
EPILOGUE_CASES = [(t, (4864, 896)) for t in mk.GGMLType] + [
    (t, (1024 if t in SUPER_BLOCK_TYPES else 896, 4864)) for t in mk.GGMLType
]


@pytest.mark.parametrize("n_tokens", [17, 512])
@pytest.mark.parametrize(("ggml_type", "shape"), EPILOGUE_CASES, ids=lambda v: getattr(v, "name", None) or str(v))
def test_gemm_epilogue_is_add_bias_then_add_to_the_bit(rng, stream, dev, ggml_type, shape, n_tokens):
    """gemm with a bias and a residual, in place into the residual (the runtime's fused node), is gemm,
    add_bias_f32 and add_f32 one after the other, to the bit: the epilogue adds in their order, once (after the
    slices' sum where K is cut)."""
    in_features, out_features = shape
    raw, _ = weights(ggml_type, out_features, in_features)
    x, bias = randn(rng, n_tokens, in_features), randn(rng, out_features)
    residual = randn(rng, n_tokens, out_features, scale=4.0)
    w_ptr, x_ptr, bias_ptr = dev(raw), dev(x), dev(bias)
    space, nbytes = workspace(stream, ggml_type, (out_features,), in_features, n_tokens)
    args = (in_features, out_features, n_tokens, space and space.ptr, nbytes, stream.handle)
    fused = mk.upload(residual, stream.handle)
    kernels.gemm(w_ptr, ggml_type, x_ptr, bias_ptr, fused.ptr, fused.ptr, *args)
    y, total = poisoned((n_tokens, out_features), np.float32, stream), mk.upload(residual, stream.handle)
    kernels.gemm(w_ptr, ggml_type, x_ptr, None, None, y.ptr, *args)
    kernels.add_bias_f32(y.ptr, bias_ptr, n_tokens, out_features, stream.handle)
    kernels.add_f32(total.ptr, y.ptr, total.ptr, n_tokens * out_features, stream.handle)
    got = from_device(fused, (n_tokens, out_features), np.float32, stream)
    expected = from_device(total, (n_tokens, out_features), np.float32, stream)
    slices = splits((out_features,), in_features, n_tokens)
    assert np.array_equal(got, expected), f"gemm {ggml_type.name} {shape} x{n_tokens} ({slices} slices): epilogue"


@pytest.mark.parametrize("n_tokens", [17, 512])
@pytest.mark.parametrize("ggml_type", list(mk.GGMLType), ids=lambda t: t.name)
def test_gemm_group_adds_each_parts_bias(rng, stream, dev, ggml_type, n_tokens):
    """Biases of the first and last of three parts (the middle one has none): each part is its product, then
    add_bias_f32, to the bit."""
    in_features = 4864
    x = randn(rng, n_tokens, in_features)
    raws, _ = zip(*(weights(ggml_type, n, in_features) for n in SPLIT_GROUP), strict=True)
    biases = (randn(rng, SPLIT_GROUP[0]), None, randn(rng, SPLIT_GROUP[2]))
    got = run_gemm_group(stream, dev, ggml_type, raws, x, SPLIT_GROUP, biases)
    products = run_gemm_group(stream, dev, ggml_type, raws, x, SPLIT_GROUP)
    for part, (product, bias) in enumerate(zip(products, biases, strict=True)):
        y = mk.upload(product, stream.handle)
        if bias is not None:
            kernels.add_bias_f32(y.ptr, dev(bias), n_tokens, bias.size, stream.handle)
        expected = from_device(y, product.shape, np.float32, stream)
        assert np.array_equal(got[part], expected), f"gemm_group {ggml_type.name} x{n_tokens}: part {part}"


# (in_features, d_ff): Qwen2.5-0.5B's gate|up (ffn_up-like 1024 -> 4864 for the super-block types), an odd
# block count with a d_ff that fills no tile (a paired tile holds 32 or 64 features), and the large tiles' partial
# one (LARGE_PARTIAL_SHAPE: at 512 tokens, 76 paired tiles of 64 features and one of 40).
SWIGLU_CASES = [
    (t, shape) for t in mk.GGMLType if t not in SUPER_BLOCK_TYPES for shape in [(896, 4864), (32 * 37, 1000)]
]
SWIGLU_CASES += [(t, shape) for t in SUPER_BLOCK_TYPES for shape in [(1024, 4864), (256 * 5, 1000)]]
SWIGLU_CASES += [(t, LARGE_PARTIAL_SHAPE) for t in mk.GGMLType]
# The prompt's gated GEMMs: the launcher, the elementwise kernel of the same activation, its float64 reference and
# the largest slope of that activation (silu' < 1.1, the tanh GELU's' < 1.13). The activation is the paired
# epilogue's alone, so gemm_geglu is checked on a type of each tile path: copied as the operand (F16, BF16),
# decoded in the tile (Q4_0, Q4_K) and, from 256 tokens, staged.
GATED = {
    "swiglu": (kernels.gemm_swiglu, kernels.swiglu_f32, silu, 1.1),
    "geglu": (kernels.gemm_geglu, kernels.geglu_f32, gelu_tanh, 1.13),
}
GEGLU_TYPES = {mk.GGMLType.F16, mk.GGMLType.BF16, mk.GGMLType.Q4_0, mk.GGMLType.Q4_K}
GATED_CASES = [("swiglu", t, shape) for t, shape in SWIGLU_CASES]
GATED_CASES += [("geglu", t, shape) for t, shape in SWIGLU_CASES if t in GEGLU_TYPES]


@pytest.mark.parametrize("n_tokens", [17, 100, 512])
@pytest.mark.parametrize(("gated", "ggml_type", "shape"), GATED_CASES, ids=lambda v: getattr(v, "name", None) or str(v))
def test_gemm_gated_is_the_gate_up_group_then_the_activation(rng, stream, dev, gated, ggml_type, shape, n_tokens):
    """gemm_swiglu (gemm_geglu) against the float64 SwiGLU (GeGLU) of the float64 products, and, where the gate|up
    group does not cut K (its sums then add up in the same order as the paired tiles'), against gemm_group then
    swiglu_f32 (geglu_f32) to the bit.

    Error bound: the products carry the GEMM's error, at most r sum_i |W[f,i] x[t,i]| (C_gate, C_up; r the
    elementwise bound, 2^-9 or BF16's 2^-8), and |act'| < slope, so |h - h_ref| <= r (slope C_gate |up| +
    |act(gate)| C_up + slope r C_gate C_up), the last term the product of the two errors, plus float32 roundings
    of the activation itself, a few units of 2^-24 |h| (within the r |h| added to the scale)."""
    launcher, elementwise, activation, slope = GATED[gated]
    in_features, d_ff = shape
    (gate_raw, gate), (up_raw, up) = (weights(ggml_type, d_ff, in_features, draw) for draw in range(2))
    x = randn(rng, n_tokens, in_features)
    gate_ptr, up_ptr, x_ptr = dev(gate_raw), dev(up_raw), dev(x)
    h = poisoned((n_tokens, d_ff), np.float32, stream)
    nbytes = kernels.gemm_swiglu_workspace_bytes(ggml_type, in_features, d_ff, n_tokens)
    space = poisoned((nbytes // 4,), np.float32, stream)
    launcher(gate_ptr, up_ptr, ggml_type, x_ptr, h.ptr, in_features, d_ff, n_tokens, space.ptr, nbytes, stream.handle)
    got = from_device(h, (n_tokens, d_ff), np.float32, stream)
    x64 = x.astype(np.float64)
    g64, u64 = x64 @ gate.astype(np.float64).T, x64 @ up.astype(np.float64).T
    condition_gate = np.abs(x64) @ np.abs(gate.astype(np.float64)).T
    condition_up = np.abs(x64) @ np.abs(up.astype(np.float64)).T
    expected = activation(g64) * u64
    rtol = elementwise_rtol(ggml_type)
    scale = slope * condition_gate * (np.abs(u64) + rtol * condition_up)
    scale += np.abs(activation(g64)) * condition_up + np.abs(expected)
    what = f"{launcher.__name__} {ggml_type.name} {in_features}->{d_ff} x{n_tokens}"
    assert_close(got, expected, rtol, scale=scale, what=what)
    if splits((d_ff, d_ff), in_features, n_tokens) == 1:
        gate_out, up_out = run_gemm_group(stream, dev, ggml_type, (gate_raw, up_raw), x, (d_ff, d_ff))
        out = mk.upload(gate_out, stream.handle)
        elementwise(out.ptr, dev(up_out), out.ptr, n_tokens, d_ff, d_ff, stream.handle)
        unfused = from_device(out, (n_tokens, d_ff), np.float32, stream)
        assert np.array_equal(got, unfused), f"{what}: differs from gemm_group then {elementwise.__name__}"


def test_gemm_swiglu_refuses_what_it_cannot_compute(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*multiple of 32"):
        kernels.gemm_swiglu(p, p, mk.GGMLType.F32, p, p, 33, 4, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*type must be"):
        kernels.gemm_swiglu(p, p, int(gguf.GGMLQuantizationType.IQ2_XXS), p, p, 256, 4, 16, None, 0, h)
    for d_ff, n_tokens in ((0, 16), (4, 0), (-4, 16)):
        with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*positive"):
            kernels.gemm_swiglu(p, p, mk.GGMLType.Q4_0, p, p, 32, d_ff, n_tokens, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*x must be 16-byte aligned"):
        kernels.gemm_swiglu(p, p, mk.GGMLType.Q4_0, p + 4, p, 32, 4, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*weight must be 16-byte aligned"):
        kernels.gemm_swiglu(p, p + 4, mk.GGMLType.F16, p, p, 32, 4, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*4-byte aligned"):
        kernels.gemm_swiglu(p + 2, p, mk.GGMLType.Q4_0, p, p, 32, 4, 16, None, 0, h)
    # gemm_geglu shares the checks; its refusals name it.
    with pytest.raises(ValueError, match=r"launch_gemm_geglu refused .*multiple of 32"):
        kernels.gemm_geglu(p, p, mk.GGMLType.F32, p, p, 33, 4, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm_geglu refused .*workspace must hold"):
        kernels.gemm_geglu(p, p, mk.GGMLType.Q4_0, p, p, 32, 4, 16, p, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemm_swiglu refused .*must not be null"):
        kernels.gemm_swiglu(p, None, mk.GGMLType.Q4_0, p, p, 32, 4, 16, None, 0, h)
    mk.sync(h)  # nothing reached CUDA: nothing is pending


def test_gemm_group_refuses_a_part_after_an_absent_one(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_gemm_group refused .*absent part has none after it"):
        kernels.gemm_group(p, None, p, 4, 0, None, 0, 0, p, None, p, 4, mk.GGMLType.Q4_0, p, 32, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm_group refused .*absent part has none after it"):
        kernels.gemm_group(p, None, p, 4, p, None, p, -1, 0, None, 0, 0, mk.GGMLType.Q4_0, p, 32, 16, None, 0, h)
    mk.sync(h)


def test_gemm_refuses_what_it_cannot_compute(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_gemm refused .*multiple of 32"):
        kernels.gemm(p, mk.GGMLType.F32, p, None, None, p, 33, 4, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*type must be"):
        no_kernel = int(gguf.GGMLQuantizationType.IQ2_XXS)
        kernels.gemm(p, no_kernel, p, None, None, p, 256, 4, 16, None, 0, h)
    for super_block_type in SUPER_BLOCK_TYPES:
        with pytest.raises(ValueError, match=r"launch_gemm refused .*whole 256-value super-blocks"):
            kernels.gemm(p, super_block_type, p, None, None, p, 32 * 9, 4, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*positive"):
        kernels.gemm(p, mk.GGMLType.Q4_0, p, None, None, p, 32, 4, 0, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*x must be 16-byte aligned"):
        kernels.gemm(p, mk.GGMLType.Q4_0, p + 4, None, None, p, 32, 4, 16, None, 0, h)
    for float_type in (mk.GGMLType.F32, mk.GGMLType.F16, mk.GGMLType.BF16):
        with pytest.raises(ValueError, match=r"launch_gemm refused .*weight must be 16-byte aligned"):
            kernels.gemm(p + 4, float_type, p, None, None, p, 32, 4, 16, None, 0, h)
    with pytest.raises(ValueError, match=r"launch_gemm refused .*4-byte aligned"):
        kernels.gemm(p + 2, mk.GGMLType.Q4_0, p, None, None, p, 32, 4, 16, None, 0, h)
    mk.sync(h)  # nothing reached CUDA: nothing is pending
