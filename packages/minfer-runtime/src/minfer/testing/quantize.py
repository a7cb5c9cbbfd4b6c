"""Quantizing float weights into GGUF bytes, for writing synthetic models.

`quantize` uses gguf.quants (the reference implementation) for every type it can
quantize. gguf-py dequantizes the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and the
non-linear IQ4_NL and IQ4_XS but cannot quantize them, so this module adds their
quantizers. These are simple (per sub-block min/max or absmax, no search for the
best scales as llama.cpp's `make_qkx2_quants` does): they write valid blocks whose
dequantization through gguf.quants is close to the input, which is all a model with
random weights needs. Each byte layout is the inverse of gguf.quants'
`dequantize_blocks` of its type.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

QK_K = 256  # values per super-block


def _safe_divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator != 0)


def _min_max_codes(values: np.ndarray, n_sub: int, levels: int, scale_max: int) -> tuple[np.ndarray, ...]:
    """x ≈ d·sc·q − dmin·m per sub-block, q in 0..levels, sc and m in 0..scale_max: (d, dmin, sc, m, q) for
    super-blocks of `n_sub` sub-blocks (Q2_K, Q4_K, Q5_K)."""
    sub = values.reshape(-1, n_sub, QK_K // n_sub).astype(np.float32)
    low = np.minimum(sub.min(axis=-1), 0.0)
    scale = (sub.max(axis=-1) - low) / levels
    offset = -low
    d = (scale.max(axis=-1) / scale_max).astype(np.float16)
    dmin = (offset.max(axis=-1) / scale_max).astype(np.float16)
    sc = np.clip(np.rint(_safe_divide(scale, d.astype(np.float32)[:, None])), 0, scale_max).astype(np.uint8)
    m = np.clip(np.rint(_safe_divide(offset, dmin.astype(np.float32)[:, None])), 0, scale_max).astype(np.uint8)
    step = np.broadcast_to((d.astype(np.float32)[:, None] * sc)[..., None], sub.shape)
    shift = (dmin.astype(np.float32)[:, None] * m)[..., None]
    q = np.clip(np.rint(_safe_divide(sub + shift, step)), 0, levels).astype(np.uint8)
    return d, dmin, sc, m, q


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 scale bytes of Q4_K and Q5_K: 6-bit sc and m of sub-blocks 0-3 in bytes 0-7 (their top 2 bits
    carry the high bits of sub-blocks 4-7), the low 4 bits of sc and m of sub-blocks 4-7 in bytes 8-11."""
    packed = np.empty((sc.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return packed


def _half_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """Rows of float32 (length a multiple of 256) -> Q4_K bytes: 144 per 256 values. 8 sub-blocks of 32, each
    x ≈ d·sc·q − dmin·m with q in 0..15 and 6-bit sc, m; d and dmin are float16."""
    d, dmin, sc, m, q = _min_max_codes(values, 8, 15, 63)
    pairs = q.reshape(-1, 4, 2, 32)  # 32 bytes per pair of sub-blocks, the first in the low nibbles
    codes = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([_half_bytes(d), _half_bytes(dmin), _pack_k_scales(sc, m), codes], axis=1)
    return blocks.reshape(values.shape[0], -1)


def quantize_q5_k(values: np.ndarray) -> np.ndarray:
    """Rows of float32 -> Q5_K bytes: 176 per 256 values. Q4_K's layout with q in 0..31: the low 4 bits as
    Q4_K's codes, bit 4 of value j of sub-block i as bit i of byte j of `qh` (32 bytes, before the codes)."""
    d, dmin, sc, m, q = _min_max_codes(values, 8, 31, 63)
    pairs = (q & 0x0F).reshape(-1, 4, 2, 32)
    codes = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    high = (q >> 4).astype(np.uint8)  # [blocks, 8 sub-blocks, 32]
    qh = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    blocks = np.concatenate([_half_bytes(d), _half_bytes(dmin), _pack_k_scales(sc, m), qh, codes], axis=1)
    return blocks.reshape(values.shape[0], -1)


def _two_bit_codes(q: np.ndarray) -> np.ndarray:
    """Q2_K's and Q3_K's 64 bytes of 2-bit codes: value 128h + 32s + j in bits 2s of byte 32h + j."""
    parts = q.reshape(-1, 2, 4, 32).astype(np.uint8) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    return np.bitwise_or.reduce(parts, axis=2).reshape(-1, 64)


def quantize_q2_k(values: np.ndarray) -> np.ndarray:
    """Rows of float32 -> Q2_K bytes: 84 per 256 values. 16 sub-blocks of 16, x ≈ d·sc·q − dmin·m with q in
    0..3 and 4-bit sc (low nibble) and m (high nibble) per sub-block; then the codes, d and dmin."""
    d, dmin, sc, m, q = _min_max_codes(values, 16, 3, 15)
    blocks = np.concatenate([sc | (m << 4), _two_bit_codes(q), _half_bytes(d), _half_bytes(dmin)], axis=1)
    return blocks.reshape(values.shape[0], -1)


def quantize_q3_k(values: np.ndarray) -> np.ndarray:
    """Rows of float32 -> Q3_K bytes: 110 per 256 values. 16 sub-blocks of 16, x ≈ d·(s − 32)·q with q in
    -4..3 and a 6-bit s per sub-block: a mask of q >= 0 (bit s of byte j for value 32s + j), the low 2 bits
    of q + 4·(q < 0) as Q2_K's codes, the 12 packed scale bytes, d."""
    sub = values.reshape(-1, 16, 16).astype(np.float32)
    scale = _extreme(sub) / -4.0  # signed, so that the largest magnitude is the code -4
    d = (np.abs(scale).max(axis=-1) / 31.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_divide(scale, d.astype(np.float32)[:, None])), -32, 31)
    step = np.broadcast_to((d.astype(np.float32)[:, None] * sc)[..., None], sub.shape)
    q = np.clip(np.rint(_safe_divide(sub, step)), -4, 3).astype(np.int8).reshape(-1, 256)
    non_negative = (q >= 0).astype(np.uint8).reshape(-1, 8, 32)
    hmask = np.bitwise_or.reduce(non_negative << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    v = (sc + 32).astype(np.uint8)  # 6-bit, 32 the zero scale
    scales = np.empty((v.shape[0], 12), dtype=np.uint8)
    scales[:, 0:8] = (v[:, 0:8] & 0x0F) | ((v[:, 8:16] & 0x0F) << 4)
    high = (v >> 4).reshape(-1, 4, 4)  # [blocks, s, k]: sub-block 4s + k
    scales[:, 8:12] = np.bitwise_or.reduce(high << (2 * np.arange(4, dtype=np.uint8))[None, :, None], axis=1)
    codes = _two_bit_codes((q + 4 * (q < 0)).astype(np.uint8))
    blocks = np.concatenate([hmask, codes, scales, _half_bytes(d)], axis=1)
    return blocks.reshape(values.shape[0], -1)


IQ4_VALUES = np.array(gguf_quants.IQ4_NL.kvalues, dtype=np.float32)  # the 16 non-linear levels, -127..113


def _extreme(sub: np.ndarray) -> np.ndarray:
    """Each sub-block's value of the largest magnitude, with its sign."""
    return np.take_along_axis(sub, np.abs(sub).argmax(axis=-1)[..., None], axis=-1)[..., 0]


def _iq4_codes(sub: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The index of the nearest IQ4 level of each x / step."""
    scaled = _safe_divide(sub, np.broadcast_to(step, sub.shape))
    return np.abs(scaled[..., None] - IQ4_VALUES).argmin(axis=-1).astype(np.uint8)


def quantize_iq4_nl(values: np.ndarray) -> np.ndarray:
    """Rows of float32 (a multiple of 32) -> IQ4_NL bytes: 18 per 32 values, x ≈ d·level[q], d float16; value
    j < 16 in the low nibble of byte j, value 16 + j in its high nibble."""
    sub = values.reshape(-1, 32).astype(np.float32)
    d = (_extreme(sub) / -127.0).astype(np.float16)  # the largest magnitude is the level -127
    q = _iq4_codes(sub, d.astype(np.float32)[:, None])
    blocks = np.concatenate([_half_bytes(d), q[:, :16] | (q[:, 16:] << 4)], axis=1)
    return blocks.reshape(values.shape[0], -1)


def quantize_iq4_xs(values: np.ndarray) -> np.ndarray:
    """Rows of float32 -> IQ4_XS bytes: 136 per 256 values. 8 sub-blocks of 32, x ≈ d·(s − 32)·level[q] with
    a 6-bit s per sub-block (low 4 bits in `scales_l`, two per byte; high 2 in the uint16 `scales_h`), the
    codes 16 bytes per sub-block as IQ4_NL's."""
    sub = values.reshape(-1, 8, 32).astype(np.float32)
    scale = _extreme(sub) / -127.0  # signed: the largest magnitude is the level -127
    d = (np.abs(scale).max(axis=-1) / 31.0).astype(np.float16)
    s = np.clip(np.rint(_safe_divide(scale, d.astype(np.float32)[:, None])), -32, 31)
    q = _iq4_codes(sub, (d.astype(np.float32)[:, None] * s)[..., None])
    v = (s + 32).astype(np.uint16)
    scales_h = np.bitwise_or.reduce((v >> 4) << (2 * np.arange(8, dtype=np.uint16))[None, :], axis=1)
    scales_l = ((v[:, 0::2] & 0x0F) | ((v[:, 1::2] & 0x0F) << 4)).astype(np.uint8)
    codes = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(-1, 128)
    blocks = np.concatenate([_half_bytes(d), scales_h.astype("<u2").view(np.uint8).reshape(-1, 2), scales_l, codes], 1)
    return blocks.reshape(values.shape[0], -1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """Rows of float32 (length a multiple of 256) -> Q6_K bytes: 210 per 256 values. 16 sub-blocks of 16,
    x ≈ d·sc·(q − 32) with q in 0..63, an int8 sc per sub-block and a float16 d."""
    sub = values.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(axis=-1) / 31.0
    d = (scale.max(axis=-1) / 127.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_divide(scale, d.astype(np.float32)[:, None])), 0, 127).astype(np.int8)
    step = np.broadcast_to((d.astype(np.float32)[:, None] * sc)[..., None], sub.shape)
    q = (np.clip(np.rint(_safe_divide(sub, step)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    low, high = q & 0x0F, q >> 4
    # Per 128-value half: 64 bytes of low nibbles (groups 0 and 2 share bytes 0-31, 1 and 3 bytes 32-63) and
    # 32 bytes holding the four groups' 2 high bits.
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=-1)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    blocks = np.concatenate(
        [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1
    )
    return blocks.reshape(values.shape[0], -1)


# The types gguf.quants dequantizes but cannot quantize, and the block each quantizer needs.
QUANTIZERS = {
    GGMLQuantizationType.Q2_K: (quantize_q2_k, QK_K),
    GGMLQuantizationType.Q3_K: (quantize_q3_k, QK_K),
    GGMLQuantizationType.Q4_K: (quantize_q4_k, QK_K),
    GGMLQuantizationType.Q5_K: (quantize_q5_k, QK_K),
    GGMLQuantizationType.Q6_K: (quantize_q6_k, QK_K),
    GGMLQuantizationType.IQ4_NL: (quantize_iq4_nl, 32),
    GGMLQuantizationType.IQ4_XS: (quantize_iq4_xs, QK_K),
}


def quantize(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Float values (last axis = rows) as the GGUF writer stores them in `qtype`."""
    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if qtype == GGMLQuantizationType.F16:
        return np.ascontiguousarray(values, dtype=np.float16)
    if qtype in QUANTIZERS:
        quantizer, block = QUANTIZERS[qtype]
        if values.shape[-1] % block:
            raise ValueError(f"{qtype.name} rows need a multiple of {block} values, got {values.shape[-1]}")
        rows = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, values.shape[-1])
        return quantizer(rows).reshape(*values.shape[:-1], -1)
    return gguf_quants.quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)
