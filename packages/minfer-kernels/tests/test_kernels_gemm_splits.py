"""The GEMM's rule for cutting K into slices (gemm.cu: splits_for, bound as gemm_splits) and the size of its
workspace (gemm_workspace_bytes, gemm_swiglu_workspace_bytes), on any machine: no GPU, the multiprocessor count
given.

The numbers are Qwen2.5-0.5B's prefill products (d = 896, d_ff = 4864, 2 KV heads of 64) on an H200's 132 SMs,
where the small 64 x 64 tiles give 528 block slots (four blocks per SM).
"""

from __future__ import annotations

import pytest

import minfer_kernels as mk
from minfer_kernels import kernels

H200 = 132
QKV = (896, 128, 128)


@pytest.mark.parametrize(
    ("parts", "in_features", "n_tokens", "expected"),
    [
        ((896, 0, 0), 4864, 512, 4),  # ffn_down: 112 tiles, four slices fill 448 of 528 slots
        ((896, 0, 0), 4864, 128, 8),  # 28 tiles: 18 would fit, 8 is the most
        ((896, 0, 0), 896, 512, 3),  # attn_output: 112 tiles, but slices of at least 8 of its 28 steps
        ((896, 0, 0), 896, 128, 3),  # 28 tiles, the same
        ((*QKV,), 896, 512, 3),  # q|k|v: 144 tiles, three slices fill 432 slots
        ((4864, 4864, 0), 896, 512, 1),  # gate|up: large tiles, 304 blocks, never split
        ((896, 0, 0), 4864, 4096, 1),  # 224 large tiles fill the SMs
        ((33, 0, 0), 32, 16, 1),  # one step: nothing to cut
    ],
)
def test_the_split_rule_on_an_h200(parts, in_features, n_tokens, expected):
    assert kernels.gemm_splits(*parts, in_features, n_tokens, H200) == expected


def rounded_x(in_features: int, n_tokens: int) -> int:
    """The workspace's first part: x rounded to 16 bits, in whole 256-byte units."""
    return -(-n_tokens * in_features * 2 // 256) * 256


def test_the_workspace_holds_the_rounded_x_then_each_parts_slices():
    f16 = mk.GGMLType.F16
    assert kernels.gemm_workspace_bytes(f16, 896, 0, 0, 4864, 512, H200) == rounded_x(4864, 512) + 4 * 512 * 896 * 4
    assert kernels.gemm_workspace_bytes(f16, *QKV, 896, 128, H200) == rounded_x(896, 128) + 3 * 128 * sum(QKV) * 4
    assert kernels.gemm_workspace_bytes(f16, 4864, 4864, 0, 896, 512, H200) == rounded_x(896, 512)
    assert kernels.gemm_workspace_bytes(f16, 33, 0, 0, 32, 17, H200) == rounded_x(32, 17) == 1280
    assert kernels.gemm_swiglu_workspace_bytes(f16, 896, 4864, 512) == rounded_x(896, 512)


def test_from_256_tokens_the_decoded_formats_weights_are_staged_after_them():
    """A launch of 256 tokens or more whose weights a tile would decode (every type but F16 and BF16) decodes them
    into the workspace first: every part's rows (gemm_swiglu: the gate's and the up's) as f16, after the slices."""
    q4 = mk.GGMLType.Q4_0
    down = rounded_x(4864, 512) + 4 * 512 * 896 * 4
    assert kernels.gemm_workspace_bytes(q4, 896, 0, 0, 4864, 512, H200) == down + 896 * 4864 * 2
    qkv = rounded_x(896, 256) + 3 * 256 * sum(QKV) * 4  # three slices, as at 512 tokens
    assert kernels.gemm_workspace_bytes(q4, *QKV, 896, 256, H200) == qkv + sum(QKV) * 896 * 2
    assert kernels.gemm_workspace_bytes(q4, *QKV, 896, 255, H200) == rounded_x(896, 255) + 3 * 255 * sum(QKV) * 4
    assert kernels.gemm_swiglu_workspace_bytes(q4, 896, 4864, 512) == rounded_x(896, 512) + 2 * 4864 * 896 * 2
    assert kernels.gemm_swiglu_workspace_bytes(q4, 896, 4864, 255) == rounded_x(896, 255)
    for unstaged in (mk.GGMLType.F16, mk.GGMLType.BF16):
        assert kernels.gemm_workspace_bytes(unstaged, 896, 0, 0, 4864, 512, H200) == down


def test_fewer_multiprocessors_split_less():
    assert kernels.gemm_splits(896, 0, 0, 4864, 512, 28) == 1  # 112 slots for 112 tiles
    assert kernels.gemm_splits(896, 0, 0, 4864, 128, 28) == 4
