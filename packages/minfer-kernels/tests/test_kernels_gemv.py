"""One-token GEMVs with their fused prologue and epilogues, against numpy float64, on both of their kernels:
gemv.cu's on the CUDA cores and gemv_int8.cu's on the integer tensor cores (sm_90+, the quantized types), which
the launchers take wherever it reads the weights (the `path` parameter: mk.set_int8_gemv).

Weights are random, quantized with gguf.quants.quantize (random valid blocks for the types it cannot
encode, kernel_testing.random_blocks); the reference multiplies gguf.quants.dequantize of the same bytes in
float64. Error bounds, as in test_kernels_embed_matmul.py: every decoded weight is exact in float32, so
|y - y_ref| <= rtol * sum_i |W[o,i] h[i]| (the condition of the float32 dot product), with MATMUL_RTOL per
type; with the RMSNorm prologue h itself carries ~1e-6 of relative error, so the bound is 2e-5 there. The
epilogues are checked on their own terms: SwiGLU and GeGLU against silu(g) * u and gelu(g) * u of the float64
products, RoPE against
the float64 rotation (1e-5 of |a| + |b| of the pair, bias included), the KV cache rows at positions[0]
written and every other row left bit for bit as it was. Into f16 caches, k and v are rounded once (to nearest
even) from the float32 values a launch into float32 caches stores: np.float16 of those, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from kernel_testing import (
    HALF_SCALES,
    SUPER_BLOCK_TYPES,
    assert_close,
    from_device,
    gelu_tanh,
    poisoned,
    quantize,
    randn,
    random_blocks,
    random_weights,
    requires_gpu,
    rms_norm,
    rope,
    rope_inv_freq,
    silu,
    to_device,
)
from test_kernels_attention import CACHE_DTYPES, F16, F32, bits
from test_kernels_embed_matmul import MATMUL_RTOL, case_id, weights

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

EPS = 1e-6
NORM_RTOL = 2e-5
ALL_TYPES = list(mk.GGMLType)
FLOATS = (mk.GGMLType.F32, mk.GGMLType.F16, mk.GGMLType.BF16)
QUANTIZED = [t for t in ALL_TYPES if t not in FLOATS]

requires_sm90 = pytest.mark.skipif(
    mk.device_count() == 0 or mk.devices()[0].compute_capability < (9, 0),
    reason="gemv_int8 needs sm_90 or newer (the copy engine's cp.async.bulk)",
)

# gemv_int8.cu reads the quantized types and F16 (on the half-precision tensor cores); F32 and BF16 have gemv.cu's
# kernel alone.
INT8_TYPES = (*QUANTIZED, mk.GGMLType.F16)


def with_paths(cases: list, types_of: Callable[[tuple], tuple]) -> list:
    """Each case once per setting of the launchers' choice, the setting last (the `path` fixture's parameter):
    the CUDA cores alone, and (sm_90+, where gemv_int8.cu reads every type of the case) the integer tensor cores
    allowed, which gemv and gemv_swiglu/geglu take for products of many weights an SM (gemv_int8_prefers)."""
    params = []
    for case in cases:
        params.append(pytest.param(*case, "cuda_cores"))
        if all(t in INT8_TYPES for t in types_of(case)):
            params.append(pytest.param(*case, "int8", marks=requires_sm90))
    return params


@pytest.fixture
def path(request):
    """Sets which kernel the one-token launchers may take for the test (`path` parametrized by the test), and
    puts the process's setting back after it."""
    previous = mk.set_int8_gemv(request.param == "int8")
    yield request.param
    mk.set_int8_gemv(previous)


# (in_features, out_features): one block (32), a partial last warp step (896 = 3.5 steps of 256), a row
# split over several warps (4864), the vocabulary (151936 rows, 4 per warp; narrow rows, as in the
# matmul tests, whose cached weights these share), an odd row count on either side of 16384.
SHAPES = [(32, 1), (896, 33), (896, 4864), (4864, 896), (128, 151936), (1024, 4097), (64, 16411)]
# The same situations in whole super-blocks: one, split rows, an odd count past 16384.
SUPER_BLOCK_SHAPES = [(256, 1), (4864, 896), (1024, 4097), (512, 16411)]
# Rows the tensor-core path stages in slices: Llama-3.2-1B's ffn_down (8192 values), and rows whose bytes are no
# multiple of 16 (Qwen2.5-0.5B's 896: Q4_0's 504 bytes; Q6_K's 210-byte super-blocks) that its copies widen.
INT8_SHAPES = [(8192, 40), (896, 300)]
INT8_SUPER_BLOCK_SHAPES = [(8192, 40), (4864, 70)]
TYPE_SHAPES = [
    (t, shape) for t in ALL_TYPES for shape in (SUPER_BLOCK_SHAPES if t in SUPER_BLOCK_TYPES else SHAPES)
] + [
    (t, shape) for t in INT8_TYPES for shape in (INT8_SUPER_BLOCK_SHAPES if t in SUPER_BLOCK_TYPES else INT8_SHAPES)
]  # fmt: skip
TYPE_SHAPE_PATHS = with_paths(TYPE_SHAPES, lambda case: case[:1])


def width(ggml_type: mk.GGMLType) -> int:
    """A row length the type reads: Qwen2.5-0.5B's 896, or 1024 for the super-block types."""
    return 1024 if ggml_type in SUPER_BLOCK_TYPES else 896


def references(values: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W h, sum_i |W[o,i] h[i]|) in float64."""
    w64, h64 = values.astype(np.float64), h.astype(np.float64)
    return w64 @ h64, np.abs(w64) @ np.abs(h64)


def check_gemv(launcher, rng, stream, dev, ggml_type, shape, norm) -> None:
    """y = W h with h = x or RMSNorm(x) * g, through `launcher` (kernels.gemv's signature), against float64."""
    in_features, out_features = shape
    raw, values = weights(ggml_type, out_features, in_features)
    x, norm_weight = randn(rng, in_features, scale=2.0), randn(rng, in_features)
    y = poisoned(out_features, np.float32, stream)
    norm_ptr = dev(norm_weight) if norm else 0
    launcher(dev(raw), ggml_type, dev(x), norm_ptr, EPS, 0, y.ptr, in_features, out_features, stream.handle)
    h = rms_norm(x, norm_weight, EPS) if norm else x
    expected, condition = references(values, h)
    rtol = NORM_RTOL if norm else MATMUL_RTOL[ggml_type]
    got = from_device(y, out_features, np.float32, stream)
    assert_close(got, expected, rtol, scale=condition, what=f"{launcher.__name__} {ggml_type.name} {shape}")


@pytest.mark.parametrize("norm", [False, True], ids=["plain", "rms_norm"])
@pytest.mark.parametrize(("ggml_type", "shape", "path"), TYPE_SHAPE_PATHS, ids=case_id, indirect=["path"])
def test_gemv(rng, stream, dev, ggml_type, shape, path, norm):
    check_gemv(kernels.gemv, rng, stream, dev, ggml_type, shape, norm)


@pytest.mark.parametrize(
    ("ggml_type", "path"), with_paths([(t,) for t in QUANTIZED], lambda case: case), ids=case_id, indirect=["path"]
)
def test_gemv_adds_the_residual_in_place(rng, stream, dev, ggml_type, path):
    raw, values = random_weights(rng, 896, 4864, ggml_type, scale=0.5)
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


def test_gemv_by_name_with_none_for_the_absent_pointers(rng, stream, dev):
    """The runtime calls every launcher by its parameters' names, None for an absent pointer (nullptr)."""
    raw, values = quantize(randn(rng, 33, 896, scale=0.5), mk.GGMLType.Q8_0)
    x = randn(rng, 896)
    y = poisoned(33, np.float32, stream)
    args = dict(weight=dev(raw), type=mk.GGMLType.Q8_0, x=dev(x), eps=EPS, y=y.ptr, in_features=896, out_features=33)
    kernels.gemv(**args, norm_weight=None, residual=None, stream=stream.handle)
    product, condition = references(values, x)
    assert_close(from_device(y, 33, np.float32, stream), product, 1e-5, scale=condition)
    with pytest.raises(TypeError):  # a misnamed parameter is refused before anything launches
        kernels.gemv(**args, norm_weights=None, residual=None, stream=stream.handle)


# The gate/up kernels, each with its activation's float64 reference and the largest slope of that activation
# (silu' < 1.1, the tanh GELU's' < 1.13).
GATED = [(kernels.gemv_swiglu, silu, 1.1), (kernels.gemv_geglu, gelu_tanh, 1.13)]


@pytest.mark.parametrize("d_ff", [1, 33, 4864, 8195])  # 8195: 16390 rows, on the tensor cores where allowed
@pytest.mark.parametrize(
    ("ggml_type", "path"), with_paths([(t,) for t in ALL_TYPES], lambda case: case), ids=case_id, indirect=["path"]
)
@pytest.mark.parametrize(("launcher", "activation", "slope"), GATED, ids=["swiglu", "geglu"])
def test_gemv_gated(rng, stream, dev, launcher, activation, slope, ggml_type, path, d_ff):
    d = width(ggml_type)
    (gate_raw, gate_values), (up_raw, up_values) = (
        random_weights(rng, d_ff, d, ggml_type, scale=0.05) for _ in range(2)
    )
    x, norm_weight = randn(rng, d), randn(rng, d)
    out = poisoned(d_ff, np.float32, stream)
    launcher(dev(gate_raw), dev(up_raw), ggml_type, dev(x), dev(norm_weight), EPS, out.ptr, d, d_ff, stream.handle)
    h = rms_norm(x, norm_weight, EPS)
    (gate, gate_condition), (up, up_condition) = references(gate_values, h), references(up_values, h)
    expected = activation(gate) * up
    # |d(act(g) u)| <= slope |u| |dg| + |act(g)| |du|, each product within NORM_RTOL of its condition
    scale = slope * np.abs(up) * gate_condition + np.abs(activation(gate)) * up_condition + np.abs(expected)
    got = from_device(out, d_ff, np.float32, stream)
    assert_close(got, expected, NORM_RTOL, scale=scale, what=f"{launcher.__name__} {ggml_type.name}")


# (in_features, out_features) for gemv_int8 alone: rows short of one 16-row tile, chunks of two tiles and a
# partial last one (SmolLM2's width), Qwen2.5-0.5B's width, a last chunk of one row; each row's bytes no multiple
# of 16, so the copies widen every slice to whole 16-byte units (and copy the tensor's last few bytes by hand).
# Llama-3.2-1B's width: rows of a multiple of 32 bytes (Q4_0's 1152, Q8_0's 2176), which come one copy a row.
INT8_ONLY_SHAPES = [(64, 5), (576, 16411), (896, 300), (32, 129), (2048, 300)]
# The same in whole super-blocks: one, Qwen3-0.6B's and Llama-3.2-1B's widths (one copy a row for most of these
# types: Q4_K's 576- and 1152-byte rows), a partial chunk.
INT8_ONLY_SUPER_BLOCK_SHAPES = [(256, 5), (1024, 16411), (2048, 300), (512, 129)]
INT8_TYPE_SHAPES = [
    (t, shape)
    for t in INT8_TYPES
    for shape in (
        [*INT8_ONLY_SUPER_BLOCK_SHAPES, *INT8_SUPER_BLOCK_SHAPES]
        if t in SUPER_BLOCK_TYPES
        else [*INT8_ONLY_SHAPES, *INT8_SHAPES]
    )
]


@requires_sm90
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "rms_norm"])
@pytest.mark.parametrize(("ggml_type", "shape"), INT8_TYPE_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
def test_gemv_int8(rng, stream, dev, ggml_type, shape, norm):
    """The tensor-core path against float64: x in three int8 parts (two f16 ones for F16 rows) keeps it to
    ~2^-22 of each block's largest value, inside the float32 bound the CUDA-core GEMV is held to."""
    check_gemv(kernels.gemv_int8, rng, stream, dev, ggml_type, shape, norm)


@requires_sm90
@pytest.mark.parametrize("ggml_type", [t for t in INT8_TYPES if t in HALF_SCALES], ids=lambda t: t.name)
def test_gemv_int8_keeps_a_tiny_block_against_tiny_weight_scales(rng, stream, dev, ggml_type):
    """A 1e-30 block of x against weight scales of ~1e-6 (random blocks drew one such scale in ~10^4 rows at
    N(0, 0.01^2), and a suite run failed on it): the third part's scale, 2^-21 of the block's, is ~1e-38, and
    taken times the weight's scale before the sum it would fall among float32's subnormals and lose the part."""
    in_features, out_features = 256, 64
    raw, values = random_blocks(rng, out_features, in_features, ggml_type, scale_sigma=1e-6)
    x = np.zeros(in_features, np.float32)
    x[:32] = randn(rng, 32, scale=1e-30)
    y = poisoned(out_features, np.float32, stream)
    kernels.gemv_int8(dev(raw), ggml_type, dev(x), 0, EPS, 0, y.ptr, in_features, out_features, stream.handle)
    product, condition = references(values, x)
    got = from_device(y, out_features, np.float32, stream)
    assert_close(got, product, MATMUL_RTOL[ggml_type], scale=condition, what=f"{ggml_type.name}, tiny weight scales")


@requires_sm90
@pytest.mark.parametrize("ggml_type", INT8_TYPES, ids=lambda t: t.name)
def test_gemv_int8_keeps_each_blocks_small_values_and_zero_blocks(rng, stream, dev, ggml_type):
    """Blocks of x far apart in size (1e-4 .. 1e4), a block of zeros and a block with one nonzero value:
    the parts are scaled per block, so a small block keeps its precision next to a large one. A block below
    2^-60 (1e-30) alone: its values and largest value are scaled up by 2^64 before 127 / largest is taken."""
    in_features, out_features = 256, 16411
    raw, values = weights(ggml_type, out_features, in_features)
    x = randn(rng, in_features)
    for block, scale in enumerate((1e-4, 1e4, 0.0, 1.0, 1e2, 1e-2, 3.0, 1.0)):
        x[32 * block : 32 * block + 32] *= scale
    x[32 * 3 : 32 * 3 + 31] = 0.0  # one nonzero value in block 3
    residual = randn(rng, out_features, scale=3.0)
    y = to_device(residual, stream)  # the residual added in place
    kernels.gemv_int8(dev(raw), ggml_type, dev(x), 0, EPS, y.ptr, y.ptr, in_features, out_features, stream.handle)
    product, condition = references(values, x)
    got = from_device(y, out_features, np.float32, stream)
    rtol = MATMUL_RTOL[ggml_type]
    assert_close(got, residual + product, rtol, scale=condition + np.abs(residual), what=f"{ggml_type.name}")
    # A small block alone, against its own condition: a block's scale is its own largest value.
    for size, block_x in (("1e-4", x[:32]), ("1e-30", randn(rng, 32, scale=1e-30))):
        x_small = np.zeros_like(x)
        x_small[:32] = block_x
        y_small = poisoned(out_features, np.float32, stream)
        kernels.gemv_int8(
            dev(raw), ggml_type, dev(x_small), 0, EPS, 0, y_small.ptr, in_features, out_features, stream.handle
        )
        small, small_condition = references(values, x_small)
        got_small = from_device(y_small, out_features, np.float32, stream)
        assert_close(got_small, small, rtol, scale=small_condition, what=f"{ggml_type.name}, a {size} block alone")


@requires_sm90
def test_gemv_int8_refuses_what_it_cannot_read(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    for other in (t for t in ALL_TYPES if t not in INT8_TYPES):
        with pytest.raises(ValueError, match=r"launch_gemv_int8 refused .*Q5_K, Q6_K or IQ4_XS"):
            kernels.gemv_int8(p, other, p, 0, EPS, 0, p, 256, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemv_int8 refused .*whole 32-value blocks"):
        kernels.gemv_int8(p, mk.GGMLType.Q8_0, p, 0, EPS, 0, p, 48, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemv_int8 refused .*whole 256-value super-blocks"):
        kernels.gemv_int8(p, mk.GGMLType.Q6_K, p, 0, EPS, 0, p, 128, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemv_int8 refused .*fitting shared memory"):
        kernels.gemv_int8(p, mk.GGMLType.Q8_0, p, 0, EPS, 0, p, 64 * 1024, 4, h)  # x alone: 250 KB
    with pytest.raises(ValueError, match=r"launch_gemv_int8 refused .*16-byte aligned"):
        kernels.gemv_int8(p + 2, mk.GGMLType.Q8_0, p, 0, EPS, 0, p, 64, 4, h)
    previous = mk.set_int8_gemv(False)  # the process's switch off: the path refuses every launch
    try:
        with pytest.raises(ValueError, match=r"launch_gemv_int8 refused"):
            kernels.gemv_int8(p, mk.GGMLType.Q8_0, p, 0, EPS, 0, p, 64, 4, h)
    finally:
        mk.set_int8_gemv(previous)


def test_gemv_of_many_rows_reads_weights_the_copy_engine_cannot(rng, stream, dev):
    """A head whose weight is only 2-byte aligned (the copy engine needs 16): gemv takes its CUDA-core path."""
    in_features, out_features = 64, 16411
    raw, values = weights(mk.GGMLType.Q8_0, out_features, in_features)
    device_w = mk.DeviceBuffer(raw.nbytes + 2)
    device_w.copy_from_host(raw, stream.handle, offset=2)
    x = randn(rng, in_features)
    y = poisoned(out_features, np.float32, stream)
    kernels.gemv(device_w.ptr + 2, mk.GGMLType.Q8_0, dev(x), 0, EPS, 0, y.ptr, in_features, out_features, stream.handle)
    expected, condition = references(values, x)
    got = from_device(y, out_features, np.float32, stream)
    assert_close(got, expected, MATMUL_RTOL[mk.GGMLType.Q8_0], scale=condition, what="2-byte aligned head")


QKV_CASES = [
    # n_heads, n_kv_heads, head_dim, n_rot, freq_base, mode, bias, scaled (RoPE scaling: a scaled table, mscale)
    (14, 2, 64, 64, 1e6, kernels.ROPE_NEOX, True, False),  # Qwen2.5-0.5B
    (14, 2, 64, 64, 1e6, kernels.ROPE_NEOX, True, True),  # Qwen2.5 with YaRN
    (9, 3, 64, 64, 1e4, kernels.ROPE_NORMAL, False, False),  # SmolLM2 (llama rope, no bias)
    (8, 2, 64, 64, 5e5, kernels.ROPE_NORMAL, False, True),  # Llama 3.2 with its rope_freqs factors
    (4, 4, 128, 96, 1e4, kernels.ROPE_NORMAL, True, False),  # partial rotary
    (3, 1, 80, 32, 1e4, kernels.ROPE_NEOX, False, True),  # partial NeoX
    (16, 8, 128, 0, 1e6, kernels.ROPE_NEOX, False, False),  # Qwen3-0.6B: no rotation (decode attention's)
    (4, 1, 256, 0, 1e6, kernels.ROPE_NEOX, False, False),  # Gemma 3 270M: the same
]


# The (q and k, v) type mixes llama-quantize's presets make (attn_v with more bits than attn_q and attn_k), each
# compiled as a pair of formats (launch_gemv_qkv_rope_store lists them): in rows of whole super-blocks, and in
# rows that are not, after llama-quantize's fallbacks (Q2_K, Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
# Q6_K -> Q8_0, IQ4_XS -> IQ4_NL).
T = mk.GGMLType
PRESET_MIXES = [
    (T.Q2_K, T.Q3_K), (T.Q2_K, T.Q4_K), (T.Q3_K, T.Q4_K), (T.Q3_K, T.Q5_K), (T.Q4_K, T.Q5_K), (T.Q4_K, T.Q6_K),
    (T.Q5_K, T.Q6_K), (T.IQ4_NL, T.Q5_K), (T.IQ4_XS, T.Q5_K),
    (T.Q4_0, T.Q5_0), (T.Q4_0, T.Q5_1), (T.Q5_0, T.Q5_1), (T.Q5_0, T.Q8_0), (T.Q5_1, T.Q8_0), (T.IQ4_NL, T.Q5_1),
]  # fmt: skip
# The types of Wq, Wk, Wv: one type for all three, the presets' mixes, and mixes of three types, whose groups
# pick among every format.
QKV_TYPES = (
    [(t, t, t) for t in ALL_TYPES]
    + [(qk, qk, v) for qk, v in PRESET_MIXES]
    + [(T.Q4_0, T.Q8_0, T.F16), (T.IQ4_NL, T.Q5_1, T.BF16), (T.Q3_K, T.IQ4_XS, T.Q2_K)]
)


def check_gemv_qkv_rope_store(rng, stream, dev, types, d, case) -> None:
    """gemv_qkv_rope_store's q, and its k and v rows at a random position of float32 caches (the other rows as
    they were), against the normed product, its bias and the rotation in float64."""
    n_heads, n_kv_heads, head_dim, n_rot, freq_base, mode, bias, scaled = case
    n_ctx = 37
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    parts = [random_weights(rng, rows, d, t, scale=0.5) for rows, t in zip((q_dim, kv_dim, kv_dim), types, strict=True)]
    values = np.concatenate([part_values for _, part_values in parts])
    x, norm_weight, bias_values = randn(rng, d), randn(rng, d), randn(rng, q_dim + 2 * kv_dim)
    biases = np.split(bias_values, [q_dim, q_dim + kv_dim])
    position = int(rng.integers(0, n_ctx))
    caches = [randn(rng, n_ctx, kv_dim) for _ in range(2)]
    k_cache, v_cache = (to_device(cache, stream) for cache in caches)
    q = poisoned(q_dim, np.float32, stream)
    weight_args = [arg for (raw, _), t in zip(parts, types, strict=True) for arg in (dev(raw), t)]
    bias_args = [dev(b) if bias else 0 for b in biases]
    inv_freq, mscale = rope_inv_freq(freq_base, n_rot, rng if scaled else None), 1.2 if scaled else 1.0
    inv_freq_ptr = dev(inv_freq) if n_rot else None  # n_rot 0: no table
    kernels.gemv_qkv_rope_store(
        *weight_args, dev(x), dev(norm_weight), EPS, *bias_args, q.ptr, k_cache.ptr, v_cache.ptr,
        dev(np.array([position], np.int32)), d, n_heads, n_kv_heads, head_dim, n_rot, inv_freq_ptr, mscale, mode,
        n_ctx, F32, stream.handle,
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
        table = (n_rot, inv_freq, mscale, mode)
        reference, value_scale = rope(values[None], np.array([position]), heads, head_dim, *table)
        _, condition_scale = rope(conditions[None], np.array([position]), heads, head_dim, *table)
        return reference[0], condition_scale[0] + value_scale[0]

    q_ref, q_scale = rotated(q_in, q_cond, n_heads)
    k_ref, k_scale = rotated(k_in, k_cond, n_kv_heads)
    assert_close(from_device(q, q_dim, np.float32, stream), q_ref, NORM_RTOL, scale=q_scale, what="q")
    got_k, got_v = (from_device(c, (n_ctx, kv_dim), np.float32, stream) for c in (k_cache, v_cache))
    assert_close(got_k[position], k_ref, NORM_RTOL, scale=k_scale, what="k row")
    assert_close(got_v[position], v_ref, NORM_RTOL, scale=v_cond, what="v row")
    others = np.arange(n_ctx) != position
    assert np.array_equal(got_k[others], caches[0][others]) and np.array_equal(got_v[others], caches[1][others])


@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "head_dim", "n_rot", "freq_base", "mode", "bias", "scaled"), QKV_CASES
)
@pytest.mark.parametrize("types", QKV_TYPES, ids=case_id)
def test_gemv_qkv_rope_store(
    rng, stream, dev, types, n_heads, n_kv_heads, head_dim, n_rot, freq_base, mode, bias, scaled
):
    case = (n_heads, n_kv_heads, head_dim, n_rot, freq_base, mode, bias, scaled)
    check_gemv_qkv_rope_store(rng, stream, dev, types, max(width(t) for t in types), case)


# Llama-3.2-1B's layer, 2048-value rows (8 warp steps) over 1536 RoPE pairs: where a split row's blocks would take
# two waves (the types with ~90 registers or more on an H100 or H200) the launch gives each pair one warp.
@pytest.mark.parametrize("types", [(T.Q4_0,) * 3, (T.Q4_K,) * 3, (T.Q4_K, T.Q4_K, T.Q6_K), (T.F16,) * 3], ids=case_id)
def test_gemv_qkv_rope_store_of_a_llama_1b_layer(rng, stream, dev, types):
    check_gemv_qkv_rope_store(rng, stream, dev, types, 2048, (32, 8, 64, 64, 5e5, kernels.ROPE_NORMAL, False, True))


# A type a group, a super-block type, and a preset's (q and k, v) mix.
QKV_F16_TYPES = [(T.Q4_0, T.Q4_0, T.Q4_0), (T.F16, T.F16, T.F16), (T.Q4_K, T.Q4_K, T.Q6_K)]


@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "head_dim", "n_rot", "freq_base", "mode", "bias", "scaled"), QKV_CASES
)
@pytest.mark.parametrize("types", QKV_F16_TYPES, ids=case_id)
def test_gemv_qkv_rope_store_into_f16_caches(
    rng, stream, dev, types, n_heads, n_kv_heads, head_dim, n_rot, freq_base, mode, bias, scaled
):
    """The same launch into float32 caches and into f16 caches (NaN before it): q the same float32 bits, the k and
    v rows at positions[0] np.float16 of the float32 caches' rows, bit for bit, every other row still NaN."""
    d, n_ctx = max(width(t) for t in types), 37
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    parts = [random_weights(rng, rows, d, t, scale=0.5) for rows, t in zip((q_dim, kv_dim, kv_dim), types, strict=True)]
    weight_args = [arg for (raw, _), t in zip(parts, types, strict=True) for arg in (dev(raw), t)]
    bias_args = [dev(b) if bias else 0 for b in np.split(randn(rng, q_dim + 2 * kv_dim), [q_dim, q_dim + kv_dim])]
    position = int(rng.integers(0, n_ctx))
    inv_freq, mscale = rope_inv_freq(freq_base, n_rot, rng if scaled else None), 1.2 if scaled else 1.0
    rotation = (n_rot, dev(inv_freq) if n_rot else None, mscale, mode)
    inputs = (dev(randn(rng, d, scale=4.0)), dev(randn(rng, d)), EPS)  # x, the norm's weight, its eps
    position_ptr = dev(np.array([position], np.int32))

    def launch(cache_type):
        dtype = CACHE_DTYPES[cache_type]
        q = poisoned(q_dim, np.float32, stream)
        k_cache, v_cache = (poisoned((n_ctx, kv_dim), dtype, stream) for _ in range(2))
        kernels.gemv_qkv_rope_store(
            *weight_args, *inputs, *bias_args, q.ptr, k_cache.ptr, v_cache.ptr, position_ptr, d, n_heads,
            n_kv_heads, head_dim, *rotation, n_ctx, cache_type, stream.handle,
        )  # fmt: skip
        caches = [from_device(cache, (n_ctx, kv_dim), dtype, stream) for cache in (k_cache, v_cache)]
        return from_device(q, q_dim, np.float32, stream), *caches

    q32, k32, v32 = launch(F32)
    q16, k16, v16 = launch(F16)
    assert np.isfinite(q32).all() and np.isfinite(k32[position]).all() and np.isfinite(v32[position]).all()
    assert np.array_equal(bits(q16), bits(q32)), "q differs with the caches' type"
    for name, got, stored in (("k", k16, k32), ("v", v16, v32)):
        assert np.array_equal(bits(got[position]), bits(stored[position].astype(np.float16))), f"the {name} row"
        others = np.arange(n_ctx) != position
        assert np.isnan(got[others]).all(), f"a {name} cache row other than positions[0] changed"


def test_gemv_refuses_what_it_cannot_read(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(ValueError, match=r"launch_gemv refused .*multiple of 8"):
        kernels.gemv(p, mk.GGMLType.F16, p, 0, EPS, 0, p, 33, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemv refused .*16-byte aligned"):
        kernels.gemv(p, mk.GGMLType.Q4_0, p + 4, 0, EPS, 0, p, 32, 4, h)
    with pytest.raises(ValueError, match=r"launch_gemv refused .*Q4_K"):
        kernels.gemv(p, mk.GGMLType.Q4_K, p, 0, EPS, 0, p, 896, 4, h)  # 896 is not whole super-blocks
    q8 = mk.GGMLType.Q8_0
    tail = (1.0, 0, 8, mk.GGMLType.F32, h)  # mscale, mode, n_ctx, cache_type, stream
    with pytest.raises(ValueError, match=r"launch_gemv_qkv_rope_store refused .*n_rot"):
        heads = (2, 1, 64, 66)  # n_rot 66 > head_dim 64
        kernels.gemv_qkv_rope_store(p, q8, p, q8, p, q8, p, 0, EPS, 0, 0, 0, p, p, p, p, 32, *heads, p, *tail)
    with pytest.raises(ValueError, match=r"launch_gemv_qkv_rope_store refused .*inv_freq"):
        heads = (2, 1, 64, 64)  # a rotation without its table
        kernels.gemv_qkv_rope_store(p, q8, p, q8, p, q8, p, 0, EPS, 0, 0, 0, p, p, p, p, 32, *heads, None, *tail)
    with pytest.raises(ValueError, match=r"launch_gemv_geglu refused .*d_ff"):
        kernels.gemv_geglu(p, p, q8, p, 0, EPS, p, 32, 0, h)
