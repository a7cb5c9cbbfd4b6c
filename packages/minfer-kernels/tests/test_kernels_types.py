"""The host side of the kernels' formats (ggml_formats.cuh: KERNEL_TYPES, row_bytes), on any machine: no GPU.

The reference is gguf-py's own table of GGML types (their ids and GGML_QUANT_SIZES: values and bytes per block).
"""

from __future__ import annotations

import gguf
import pytest

import minfer_kernels as mk

# The types llama-quantize's presets write (the K-quant and IQ4 mixes, and the 32-value types their rows fall
# back to where a row is not whole super-blocks) and the float types: every one of them the kernels read.
PRESET_TYPES = {
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
}  # fmt: skip


def test_the_kernels_read_the_presets_types_under_ggufs_ids():
    assert set(mk.kernels.TYPES) == PRESET_TYPES
    assert {name: int(gguf.GGMLQuantizationType[name]) for name in PRESET_TYPES} == mk.kernels.TYPES
    assert {t.name: int(t) for t in mk.GGMLType} == mk.kernels.TYPES


@pytest.mark.parametrize("ggml_type", list(mk.GGMLType), ids=lambda t: t.name)
def test_row_bytes_are_ggufs_block_table(ggml_type):
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(ggml_type))]
    for blocks in (1, 3, 19, 593):  # 593 blocks of 256: 151808 values, about a vocabulary row count
        assert mk.row_bytes(ggml_type, blocks * block_values) == blocks * block_bytes


@pytest.mark.parametrize(
    "ggml_type", [t for t in mk.GGMLType if t.name not in ("F32", "F16", "BF16")], ids=lambda t: t.name
)
def test_row_bytes_refuse_rows_of_partial_blocks(ggml_type):
    block_values, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(ggml_type))]
    for n in (block_values // 2, block_values + 16, 7 * block_values // 2):
        with pytest.raises(ValueError, match="whole number of its blocks"):
            mk.row_bytes(ggml_type, n)


def test_row_bytes_refuse_the_types_no_kernel_reads():
    for qtype in gguf.GGMLQuantizationType:
        if qtype.name not in PRESET_TYPES:
            with pytest.raises(ValueError, match="not a type the kernels read"):
                mk.row_bytes(int(qtype), 4096)
