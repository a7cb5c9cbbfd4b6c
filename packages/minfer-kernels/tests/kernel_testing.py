"""Shared by the kernel tests: device round trips, poisoned outputs, float64 references, error bounds.

Every kernel test follows one recipe: random inputs (never zeros), outputs poisoned with NaN (or a
sentinel for integers) before the launch so an element the kernel forgot to write cannot pass, the
result compared with a numpy float64 reference under a stated relative error bound.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import minfer_kernels as mk

# Sizes that are not multiples of any block: 1, a prime-ish 33, Qwen2.5-0.5B's hidden (896), FFN (4864)
# and vocabulary (151936) sizes, and 4097 (one past a power of two).
SIZES = (1, 33, 896, 4097, 4864, 151936)

requires_gpu = pytest.mark.skipif(
    mk.device_count() == 0,
    reason=f"needs an NVIDIA GPU and driver: minfer_kernels.device_count() == 0 ({mk.unavailable_reason()})",
)

INT_POISON = -12345

GGUF_TYPES = {kernel_type: gguf.GGMLQuantizationType[kernel_type.name] for kernel_type in mk.GGMLType}

# Rows of these are whole 32-value blocks.
BLOCK_TYPES = (
    mk.GGMLType.Q4_0,
    mk.GGMLType.Q4_1,
    mk.GGMLType.Q5_0,
    mk.GGMLType.Q5_1,
    mk.GGMLType.Q8_0,
    mk.GGMLType.IQ4_NL,
)

# Rows of these are whole 256-value super-blocks.
SUPER_BLOCK_TYPES = (
    mk.GGMLType.Q2_K,
    mk.GGMLType.Q3_K,
    mk.GGMLType.Q4_K,
    mk.GGMLType.Q5_K,
    mk.GGMLType.Q6_K,
    mk.GGMLType.IQ4_XS,
)

# The types gguf.quants decodes but cannot encode (tests make random valid blocks of them, random_blocks), each
# with where its float16 scales sit in a block: (first byte, how many), as in ggml-common.h's block structs.
HALF_SCALES = {
    mk.GGMLType.IQ4_NL: (0, 1),  # d, then the nibbles
    mk.GGMLType.Q2_K: (80, 2),  # the scales and quants, then d and dmin
    mk.GGMLType.Q3_K: (108, 1),  # hmask, quants and scales, then d
    mk.GGMLType.Q4_K: (0, 2),  # d and dmin, then the scales and quants
    mk.GGMLType.Q5_K: (0, 2),
    mk.GGMLType.Q6_K: (208, 1),  # quants and scales, then d
    mk.GGMLType.IQ4_XS: (0, 1),  # d, then the scales and nibbles
}


def to_device(array: np.ndarray, stream: mk.Stream) -> mk.DeviceBuffer:
    return mk.upload(array, stream.handle)


class DeviceInputs:
    """Device copies of a test's input arrays, alive until the test ends.

    Calling it uploads an array and returns the device pointer. The buffer must outlive the kernel that
    reads it: `kernels.add_f32(mk.upload(a).ptr, ...)` would free the buffer (its last reference gone)
    before the kernel even runs. This object holds every buffer for the test's whole duration.
    """

    def __init__(self, stream: mk.Stream) -> None:
        self.stream = stream
        self.buffers: list[mk.DeviceBuffer] = []

    def __call__(self, array: np.ndarray) -> int:
        buffer = mk.upload(array, self.stream.handle)
        self.buffers.append(buffer)
        return buffer.ptr


def poisoned(shape, dtype, stream: mk.Stream) -> mk.DeviceBuffer:
    """A device buffer whose every element is NaN (floats) or INT_POISON (integers)."""
    dtype = np.dtype(dtype)
    fill = np.nan if dtype.kind == "f" else INT_POISON
    return mk.upload(np.full(shape, fill, dtype), stream.handle)


def from_device(buffer: mk.DeviceBuffer, shape, dtype, stream: mk.Stream) -> np.ndarray:
    """Drain the stream (sync: any error surfaces here), then read the buffer back."""
    mk.sync(stream.handle)
    return mk.download(buffer, shape, dtype, stream.handle)


def randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def assert_close(got, ref, rtol: float, scale=None, what: str = "") -> None:
    """|got - ref| <= rtol * scale elementwise; scale defaults to |ref| (a plain relative error)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    finite = np.isfinite(got)
    if not finite.all():
        first = np.unravel_index(np.argmin(finite), got.shape)
        raise AssertionError(
            f"{what}: {np.count_nonzero(~finite)} non-finite outputs (unwritten poison?), first at {first}"
        )
    scale = np.abs(ref) if scale is None else np.broadcast_to(np.asarray(scale, np.float64), ref.shape)
    error = np.abs(got - ref)
    bad = error > rtol * scale
    if bad.any():
        ratio = error / np.maximum(scale, np.finfo(np.float64).tiny)
        worst = np.unravel_index(np.argmax(ratio), got.shape)
        raise AssertionError(
            f"{what}: {np.count_nonzero(bad)} of {got.size} values beyond rtol {rtol:g}; worst at {worst}: "
            f"got {got[worst]!r}, reference {ref[worst]!r}, error/scale {ratio[worst]:.3g}"
        )


def quantize(weights: np.ndarray, ggml_type: mk.GGMLType) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes [rows][row_bytes] from gguf.quants.quantize, their values from gguf.quants.dequantize)."""
    qtype = GGUF_TYPES[ggml_type]
    encoded = np.ascontiguousarray(gguf.quants.quantize(weights, qtype))  # float32, float16 or uint8 rows
    raw = encoded.view(np.uint8)
    rows, n = weights.shape
    assert raw.shape == (rows, mk.row_bytes(ggml_type, n)), "the kernels' row size disagrees with GGUF"
    values = gguf.quants.dequantize(encoded, qtype).astype(np.float32).reshape(rows, n)
    return raw, values


def random_blocks(
    rng: np.random.Generator, rows: int, n: int, ggml_type: mk.GGMLType, scale_sigma: float = 0.01
) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes [rows][row_bytes] of random valid blocks, their values from gguf.quants.dequantize).

    Every byte is random (quants, high bits, packed scales and mins, sub-block scales) except the float16
    scales (HALF_SCALES), drawn from N(0, scale_sigma^2): random bits there would give infinities and NaNs, and
    the default ~0.01 keeps the values within a few tens.
    """
    qtype = GGUF_TYPES[ggml_type]
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    assert n % block_values == 0, f"{ggml_type.name} rows are whole {block_values}-value blocks, not {n} values"
    blocks = rng.integers(0, 256, (rows, n // block_values, block_bytes), dtype=np.uint8)
    first, count = HALF_SCALES[ggml_type]
    scales = (rng.standard_normal((rows, n // block_values, count)) * scale_sigma).astype(np.float16)
    blocks[..., first : first + 2 * count] = scales.view(np.uint8)
    raw = blocks.reshape(rows, -1)
    assert raw.shape[1] == mk.row_bytes(ggml_type, n), "the kernels' row size disagrees with GGUF"
    values = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(rows, n)
    return raw, values


def random_weights(
    rng: np.random.Generator, rows: int, n: int, ggml_type: mk.GGMLType, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes, their values) of a random [rows][n] weight: N(0, scale^2) values through quantize, or
    random valid blocks for the types gguf.quants cannot encode (random_blocks; `scale` does not apply)."""
    if ggml_type in HALF_SCALES:
        return random_blocks(rng, rows, n, ggml_type)
    return quantize(randn(rng, rows, n, scale=scale), ggml_type)


def silu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight.astype(np.float64)


def rope_inv_freq(freq_base: float, n_rot: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """The float64 pair frequencies the kernels read: freq_base^(-2p/n_rot), each divided by a random factor
    in [1, 8) when `rng` is given (RoPE scaling, as Llama 3's factors or YaRN, only changes the table)."""
    inv_freq = freq_base ** (-2.0 * np.arange(n_rot // 2) / n_rot)
    return inv_freq if rng is None else inv_freq / rng.uniform(1.0, 8.0, n_rot // 2)


def rope(x, positions, n_heads, head_dim, n_rot, inv_freq, mscale, mode):
    """(rotated x, per-element error scale mscale (|a| + |b|) of the element's pair) as in llama.cpp's rope:
    pair p turns by position * inv_freq[p], its cos and sin times mscale."""
    n_tokens = x.shape[0]
    heads = x.reshape(n_tokens, n_heads, head_dim).astype(np.float64)
    out = heads.copy()
    scale = np.abs(heads).copy()
    half = n_rot // 2
    p = np.arange(half)
    theta = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [n_tokens][half]
    cos, sin = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
    first, second = (p, p + half) if mode == mk.kernels.ROPE_NEOX else (2 * p, 2 * p + 1)
    a, b = heads[:, :, first], heads[:, :, second]
    out[:, :, first] = a * cos - b * sin
    out[:, :, second] = a * sin + b * cos
    scale[:, :, first] = scale[:, :, second] = max(mscale, 1.0) * (np.abs(a) + np.abs(b))
    return out.reshape(x.shape), scale.reshape(x.shape)


def attention(q, k_cache, v_cache, positions, n_heads, n_kv_heads, head_dim, scale=None, window=0, f16_operands=False):
    """Causal GQA attention over the cache: query t sees rows 0..positions[t] (the last `window` of them when
    it is not 0), scores scale * q.k (scale: 1/sqrt(head_dim) by default); float64 softmax.

    With f16_operands, over the values the tensor-core prefill multiplies (attention.cu:
    attention_prefill_tensor_cores): q times float32(scale * log2(e)), K and V, each rounded to f16 once, the
    scores then in log2 units."""
    n_tokens = q.shape[0]
    group = n_heads // n_kv_heads
    scale = 1 / np.sqrt(head_dim) if scale is None else scale
    out = np.empty((n_tokens, n_heads, head_dim))
    qh = q.reshape(n_tokens, n_heads, head_dim)
    if f16_operands:
        score_scale = np.float32(np.float32(1.4426950408889634) * np.float32(scale))  # the kernel's float32 product
        qh = (qh.astype(np.float32) * score_scale).astype(np.float16)
        k_cache, v_cache = k_cache.astype(np.float16), v_cache.astype(np.float16)
    qh = qh.astype(np.float64)
    for t, position in enumerate(positions):
        first = max(0, position - window + 1) if window else 0
        keys = k_cache[first : position + 1].reshape(-1, n_kv_heads, head_dim).astype(np.float64)
        values = v_cache[first : position + 1].reshape(-1, n_kv_heads, head_dim).astype(np.float64)
        for h in range(n_heads):
            if f16_operands:
                scores = keys[:, h // group, :] @ qh[t, h]
                weights = np.exp2(scores - scores.max())
            else:
                scores = keys[:, h // group, :] @ qh[t, h] * scale
                weights = np.exp(scores - scores.max())
            out[t, h] = weights @ values[:, h // group, :] / weights.sum()
    return out.reshape(n_tokens, n_heads * head_dim)
