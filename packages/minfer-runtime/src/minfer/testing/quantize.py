"""Quantizing float weights into GGUF bytes, for writing synthetic models.

`quantize` uses gguf.quants (the reference implementation) for every type it can
quantize. gguf-py dequantizes the K-quants Q4_K and Q6_K but cannot quantize them,
so this module adds quantizers for those two. These quantizers are simple
(per sub-block min/max or absmax, no search for the best scales as llama.cpp's
`make_qkx2_quants` does): they write valid blocks whose dequantization through
gguf.quants is close to the input, which is all a model with random weights needs.
The byte layouts are the inverse of gguf.quants' `Q4_K.dequantize_blocks` and
`Q6_K.dequantize_blocks`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

QK_K = 256  # values per super-block


def _safe_divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator != 0)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """Rows of float32 (length a multiple of 256) -> Q4_K bytes: 144 per 256 values.

    A super-block is 8 sub-blocks of 32 values, each x ≈ d·sc·q − dmin·m with q in 0..15 and
    6-bit sc, m; d and dmin are float16.
    """
    rows = values.shape[0]
    sub = values.reshape(-1, 8, 32).astype(np.float32)
    low = np.minimum(sub.min(axis=-1), 0.0)
    scale = (sub.max(axis=-1) - low) / 15.0
    offset = -low
    d = (scale.max(axis=-1) / 63.0).astype(np.float16)
    dmin = (offset.max(axis=-1) / 63.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_divide(scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_safe_divide(offset, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc
    shift = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint(_safe_divide(sub + shift[..., None], np.broadcast_to(step[..., None], sub.shape))), 0, 15)
    q = q.astype(np.uint8)
    # 12 scale bytes: 6-bit sc and m of sub-blocks 0-3 in bytes 0-7 (their top 2 bits carry the high bits of
    # sub-blocks 4-7), the low 4 bits of sc and m of sub-blocks 4-7 in bytes 8-11.
    packed = np.empty((sub.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    # 128 bytes of codes: 32 bytes per pair of sub-blocks, the first in the low nibbles.
    pairs = q.reshape(-1, 4, 2, 32)
    codes = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed, codes], 1)
    return blocks.reshape(rows, -1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """Rows of float32 (length a multiple of 256) -> Q6_K bytes: 210 per 256 values.

    A super-block is 16 sub-blocks of 16 values, x ≈ d·sc·(q − 32) with q in 0..63, an int8 sc per
    sub-block and a float16 d.
    """
    rows = values.shape[0]
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
    return blocks.reshape(rows, -1)


K_QUANTIZERS = {GGMLQuantizationType.Q4_K: quantize_q4_k, GGMLQuantizationType.Q6_K: quantize_q6_k}


def quantize(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Float values (last axis = rows) as the GGUF writer stores them in `qtype`."""
    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if qtype == GGMLQuantizationType.F16:
        return np.ascontiguousarray(values, dtype=np.float16)
    if qtype in K_QUANTIZERS:
        if values.shape[-1] % QK_K:
            raise ValueError(f"{qtype.name} rows need a multiple of {QK_K} values, got {values.shape[-1]}")
        return K_QUANTIZERS[qtype](np.ascontiguousarray(values, dtype=np.float32))
    return gguf_quants.quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)
