"""Prefill attention's rule for cutting the cache rows into slices (attention.cu: prefill_splits, bound as
attention_prefill_splits and sized by attention_prefill_workspace_bytes), on any machine: no GPU, the
multiprocessor count given.

On an H200's 132 SMs the tensor-core kernel holds 3 blocks per SM at head size 64 (396 block slots) and 2 at
128 (264); a launch has n_heads x ceil(n_tokens / 64) query tiles, and max_rows / 256 caps the slices.
"""

from __future__ import annotations

import pytest

from minfer_kernels import kernels

H200 = 132


@pytest.mark.parametrize(
    ("n_tokens", "n_heads", "head_dim", "max_rows", "expected"),
    [
        (512, 14, 64, 2560, 3),  # Qwen2.5-0.5B, pp512 at depth 2048: 112 tiles, three slices fill 336 of 396 slots
        (512, 14, 64, 4096, 3),  # the runtime's bound n_ctx: the same count, the slices sized on the device
        (512, 14, 64, 512, 2),  # depth 0: at most one slice per 256 rows
        (512, 14, 64, 255, 1),  # fewer rows than one slice's minimum
        (512, 16, 128, 2560, 2),  # Qwen3-0.6B: 128 tiles for 264 slots
        (512, 32, 64, 2560, 1),  # Llama 3.2 1B: 256 tiles, no second slice fits in one wave
        (128, 32, 64, 2560, 6),  # 64 tiles
        (64, 14, 64, 4096, 16),  # one query tile per head: 28 slices would fit, 16 is the most
        (4096, 14, 64, 8192, 1),  # 896 tiles fill the SMs
        (512, 14, 96, 2560, 1),  # a head size the float32 kernel takes: never split
        (512, 4, 256, 4096, 1),
    ],
)
def test_the_split_rule_on_an_h200(n_tokens, n_heads, head_dim, max_rows, expected):
    assert kernels.attention_prefill_splits(n_tokens, n_heads, head_dim, max_rows, H200) == expected


def test_the_workspace_holds_each_slices_state_and_is_empty_without_slices():
    # [splits][n_tokens][n_heads] of head_dim accumulators and a maximum and a denominator, floats.
    assert kernels.attention_prefill_workspace_bytes(512, 14, 64, 2560, H200) == 3 * 512 * 14 * (64 + 2) * 4
    assert kernels.attention_prefill_workspace_bytes(512, 16, 128, 2560, H200) == 2 * 512 * 16 * (128 + 2) * 4
    assert kernels.attention_prefill_workspace_bytes(512, 32, 64, 2560, H200) == 0
    assert kernels.attention_prefill_workspace_bytes(512, 14, 96, 2560, H200) == 0


def test_fewer_multiprocessors_split_less():
    assert kernels.attention_prefill_splits(512, 14, 64, 2560, 56) == 1  # 168 slots for 112 tiles
    assert kernels.attention_prefill_splits(128, 14, 64, 2560, 56) == 6
