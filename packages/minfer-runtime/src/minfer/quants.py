"""Quantization formats: the block table and CPU dequantization.

A quantized row of `n` values is `n / block_size` blocks of `type_size` bytes
(Q4_0: 32 values in 18 bytes — an f16 scale and 16 bytes of 4-bit codes). The
arithmetic lives in `gguf.quants`, the reference implementation shared with
llama.cpp's converters; this module only adapts it to minfer's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from minfer.gguf_file import TensorInfo


@dataclass(frozen=True)
class BlockFormat:
    """How one quantization type packs values: `block_size` values in `type_size` bytes."""

    qtype: GGMLQuantizationType
    block_size: int
    type_size: int


def block_format(qtype: GGMLQuantizationType) -> BlockFormat:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return BlockFormat(qtype, block_size, type_size)


def dequantize(tensor: TensorInfo) -> np.ndarray:
    """The tensor's values as float32, numpy shape = reversed GGUF shape (rows last-axis contiguous)."""
    values = gguf_quants.dequantize(tensor.data, tensor.qtype)  # F32 is a view of the stored bytes: no copy
    return np.asarray(values, dtype=np.float32).reshape(tuple(reversed(tensor.shape)))
