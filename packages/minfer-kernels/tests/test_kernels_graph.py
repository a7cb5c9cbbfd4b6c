"""CUDA graph capture and replay: a captured chain gives what direct launches give, and a captured
decode step stays valid as the sequence grows (positions and KV length live in device buffers)."""

from __future__ import annotations

import numpy as np
from kernel_testing import (
    assert_close,
    attention,
    from_device,
    quantize,
    randn,
    requires_gpu,
    rope,
    rope_inv_freq,
    to_device,
)

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu

D, FFN = 896, 4864


class Block:
    """A small chain: x -> rms_norm -> matmul (Q4_0) -> silu -> matmul (Q8_0) -> + x (the residual)."""

    def __init__(self, rng, stream):
        self.stream = stream
        self.norm_weight = to_device(randn(rng, D), stream)
        self.up, _ = quantize(randn(rng, FFN, D, scale=0.05), mk.GGMLType.Q4_0)
        self.down, _ = quantize(randn(rng, D, FFN, scale=0.05), mk.GGMLType.Q8_0)
        self.up_dev, self.down_dev = to_device(self.up, stream), to_device(self.down, stream)
        self.x = mk.DeviceBuffer(D * 4)
        self.normed = mk.DeviceBuffer(D * 4)
        self.hidden = mk.DeviceBuffer(FFN * 4)
        self.out = mk.DeviceBuffer(D * 4)

    def enqueue(self):
        h = self.stream.handle
        kernels.rms_norm_f32(self.x.ptr, self.norm_weight.ptr, self.normed.ptr, 1, D, 1e-6, h)
        kernels.matmul(self.up_dev.ptr, mk.GGMLType.Q4_0, self.normed.ptr, self.hidden.ptr, D, FFN, 1, h)
        kernels.silu_f32(self.hidden.ptr, FFN, h)
        kernels.matmul(self.down_dev.ptr, mk.GGMLType.Q8_0, self.hidden.ptr, self.out.ptr, FFN, D, 1, h)
        kernels.add_f32(self.out.ptr, self.x.ptr, self.out.ptr, D, h)

    def result(self):
        return from_device(self.out, D, np.float32, self.stream)


def test_replaying_a_captured_chain_equals_direct_launches(rng, stream):
    block = Block(rng, stream)
    first_input, second_input = randn(rng, D), randn(rng, D)

    block.x.copy_from_host(first_input, stream.handle)
    block.enqueue()
    direct_first = block.result()
    block.x.copy_from_host(second_input, stream.handle)
    block.enqueue()
    direct_second = block.result()

    mk.begin_capture(stream.handle)
    block.enqueue()
    graph = mk.end_capture(stream.handle)
    assert graph.node_count == 5

    # The graph holds pointers, not data: new contents of x flow through it.
    block.x.copy_from_host(first_input, stream.handle)
    graph.launch(stream.handle)
    assert np.array_equal(block.result(), direct_first)
    block.x.copy_from_host(second_input, stream.handle)
    graph.launch(stream.handle)
    assert np.array_equal(block.result(), direct_second)


def test_events_recorded_inside_a_capture_time_each_replay(rng, stream):
    """The runtime's op timer (MINFER_OP_TIMING=1) brackets each node of a captured decode step with events."""
    block = Block(rng, stream)
    block.x.copy_from_host(randn(rng, D), stream.handle)
    marks = [mk.Event() for _ in range(3)]
    mk.begin_capture(stream.handle)
    marks[0].record(stream.handle)
    block.enqueue()
    marks[1].record(stream.handle)
    block.enqueue()
    marks[2].record(stream.handle)
    graph = mk.end_capture(stream.handle)
    assert graph.node_count == 13  # two blocks of 5 kernels, 3 event records

    graph.launch(stream.handle)
    stream.synchronize()
    first = [marks[i].elapsed_ms(marks[i + 1]) for i in range(2)]
    between = mk.Event()
    between.record(stream.handle)  # outside the capture: a plain record, after the first replay
    graph.launch(stream.handle)
    stream.synchronize()
    second = [marks[i].elapsed_ms(marks[i + 1]) for i in range(2)]
    assert all(0.0 < ms < 1000.0 for ms in first + second), (first, second)
    # The second replay recorded the marks again: its first mark is later than `between`.
    assert between.elapsed_ms(marks[0]) >= 0.0
    assert between.elapsed_ms(marks[2]) > 0.0


def test_a_captured_decode_step_stays_valid_as_the_sequence_grows(rng, stream):
    n_heads, n_kv_heads, head_dim, n_ctx, n_splits = 14, 2, 64, 512, 8
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    q, k, v = mk.DeviceBuffer(q_dim * 4), mk.DeviceBuffer(kv_dim * 4), mk.DeviceBuffer(kv_dim * 4)
    k_cache, v_cache = mk.DeviceBuffer(n_ctx * kv_dim * 4), mk.DeviceBuffer(n_ctx * kv_dim * 4)
    position, kv_len = mk.DeviceBuffer(4), mk.DeviceBuffer(4)
    out = mk.DeviceBuffer(q_dim * 4)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(n_heads, head_dim, n_splits))
    h = stream.handle

    # The history before the captured steps: 100 rows written directly.
    k_host = np.full((n_ctx, kv_dim), np.nan, np.float32)
    v_host = np.full_like(k_host, np.nan)
    k_host[:100], v_host[:100] = randn(rng, 100, kv_dim), randn(rng, 100, kv_dim)
    k_cache.copy_from_host(k_host, h)
    v_cache.copy_from_host(v_host, h)

    inv_freq = mk.upload(rope_inv_freq(1e6, head_dim), h)
    mk.begin_capture(h)
    kernels.rope_f32(q.ptr, position.ptr, 1, n_heads, head_dim, head_dim, inv_freq.ptr, 1.0, kernels.ROPE_NEOX, h)
    kernels.rope_f32(k.ptr, position.ptr, 1, n_kv_heads, head_dim, head_dim, inv_freq.ptr, 1.0, kernels.ROPE_NEOX, h)
    kernels.kv_store_f32(k.ptr, v.ptr, k_cache.ptr, v_cache.ptr, position.ptr, 1, kv_dim, n_ctx, mk.GGMLType.F32, h)
    kernels.attention_decode_f32(
        q.ptr, k_cache.ptr, v_cache.ptr, out.ptr, kv_len.ptr, workspace.ptr,
        n_heads, n_kv_heads, head_dim, n_ctx, head_dim**-0.5, 0, n_splits, *kernels.NO_HEAD_NORM, mk.GGMLType.F32, h,
    )  # fmt: skip
    step = mk.end_capture(h)

    for pos in range(100, 140):
        q_new, k_new, v_new = randn(rng, 1, q_dim), randn(rng, 1, kv_dim), randn(rng, 1, kv_dim)
        q.copy_from_host(q_new, h)
        k.copy_from_host(k_new, h)
        v.copy_from_host(v_new, h)
        position.copy_from_host(np.array([pos], np.int32), h)
        kv_len.copy_from_host(np.array([pos + 1], np.int32), h)
        step.launch(h)
        got = from_device(out, (1, q_dim), np.float32, stream)

        table = (rope_inv_freq(1e6, head_dim), 1.0, kernels.ROPE_NEOX)
        q_rot, _ = rope(q_new, np.array([pos]), n_heads, head_dim, head_dim, *table)
        k_rot, _ = rope(k_new, np.array([pos]), n_kv_heads, head_dim, head_dim, *table)
        k_host[pos], v_host[pos] = k_rot[0], v_new[0]
        expected = attention(q_rot, k_host, v_host, [pos], n_heads, n_kv_heads, head_dim)
        assert_close(got, expected, 2e-5, scale=np.abs(v_host[: pos + 1]).max(), what=f"step at position {pos}")
