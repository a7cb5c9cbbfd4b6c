"""Time the kernels at Qwen2.5-0.5B's decode shapes: microseconds per launch and effective bandwidth.

    python packages/minfer-kernels/bench/bench_kernels.py

Each case is launched a few times to warm up, then N times between two CUDA events on one stream; the
table shows the mean time per launch and the bytes the kernel must move divided by that time (weights
and activations read, outputs written). Weight bytes are random: timing does not depend on the values.
The H200 moves about 4.3 TB/s device to device; a decode-step kernel that reads 1 MB is launch-bound.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import minfer_kernels as mk
from minfer_kernels import kernels

HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 896, 4864, 151936, 14, 2, 64
REPEATS = 200


def time_per_launch_us(launch: Callable[[], None], stream: mk.Stream) -> float:
    for _ in range(5):
        launch()
    start, end = mk.Event(), mk.Event()
    start.record(stream.handle)
    for _ in range(REPEATS):
        launch()
    end.record(stream.handle)
    end.synchronize()
    return start.elapsed_ms(end) * 1000.0 / REPEATS


def main() -> None:
    rng = np.random.default_rng(0)
    stream = mk.Stream()
    h = stream.handle
    keep: list[mk.DeviceBuffer] = []

    def device(nbytes: int) -> int:
        buffer = mk.upload(rng.integers(0, 256, nbytes, dtype=np.uint8), h)
        keep.append(buffer)
        return buffer.ptr

    def floats(n: int) -> int:
        buffer = mk.upload(rng.standard_normal(n).astype(np.float32), h)
        keep.append(buffer)
        return buffer.ptr

    cases: list[tuple[str, int, Callable[[], None]]] = []

    def matmul_case(ggml_type: mk.GGMLType, n_in: int, n_out: int, n_tokens: int, label: str) -> None:
        weight_bytes = mk.row_bytes(ggml_type, n_in) * n_out
        w, x, y = device(weight_bytes), floats(n_in * n_tokens), floats(n_out * n_tokens)
        moved = weight_bytes + 4 * (n_in + n_out) * n_tokens
        cases.append(
            (
                f"matmul {ggml_type.name} {n_in}->{n_out} x{n_tokens} ({label})",
                moved,
                lambda: kernels.matmul(w, ggml_type, x, y, n_in, n_out, n_tokens, h),
            )
        )

    for ggml_type in (mk.GGMLType.Q4_0, mk.GGMLType.Q8_0, mk.GGMLType.F16):
        matmul_case(ggml_type, HIDDEN, FFN, 1, "ffn_up")
        matmul_case(ggml_type, FFN, HIDDEN, 1, "ffn_down")
        matmul_case(ggml_type, HIDDEN, VOCAB, 1, "lm_head")
    matmul_case(mk.GGMLType.Q4_0, HIDDEN, FFN, 512, "prefill")

    x, weight, out = floats(HIDDEN), floats(HIDDEN), floats(HIDDEN)
    cases.append(("rms_norm 1x896", 12 * HIDDEN, lambda: kernels.rms_norm_f32(x, weight, out, 1, HIDDEN, 1e-6, h)))
    gate = floats(FFN)
    cases.append(("silu 4864", 8 * FFN, lambda: kernels.silu_f32(gate, FFN, h)))
    q = floats(HEADS * HEAD_DIM)
    position = mk.upload(np.array([1000], np.int32), h)
    keep.append(position)
    cases.append(
        (
            "rope q 14x64",
            8 * HEADS * HEAD_DIM,
            lambda: kernels.rope_f32(q, position.ptr, 1, HEADS, HEAD_DIM, HEAD_DIM, 1e6, kernels.ROPE_NEOX, h),
        )
    )

    def attention_case(kv_len: int, n_splits: int) -> None:
        kv_dim = KV_HEADS * HEAD_DIM
        k_cache, v_cache, attn_out = floats(kv_len * kv_dim), floats(kv_len * kv_dim), floats(HEADS * HEAD_DIM)
        length = mk.upload(np.array([kv_len], np.int32), h)
        workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(HEADS, HEAD_DIM, n_splits))
        keep.extend([length, workspace])
        cases.append(
            (
                f"attention decode kv={kv_len} splits={n_splits}",
                8 * kv_len * kv_dim,
                lambda: kernels.attention_decode_f32(
                    q, k_cache, v_cache, attn_out, length.ptr, workspace.ptr,
                    HEADS, KV_HEADS, HEAD_DIM, kv_len, n_splits, h,
                ),
            )
        )  # fmt: skip

    attention_case(1024, 16)
    attention_case(4096, 32)
    logits, index = floats(VOCAB), floats(1)
    cases.append(("argmax 151936", 4 * VOCAB, lambda: kernels.argmax_f32(logits, index, 1, VOCAB, h)))

    device_name = mk.devices()[0].name
    print(f"minfer-kernels microbench on {device_name} ({REPEATS} launches per case)")
    print(f"{'case':52s} {'us/launch':>10s} {'GB/s':>8s}")
    for name, moved, launch in cases:
        us = time_per_launch_us(launch, stream)
        print(f"{name:52s} {us:10.2f} {moved / us / 1e3:8.1f}")
    mk.sync(h)


if __name__ == "__main__":
    main()
