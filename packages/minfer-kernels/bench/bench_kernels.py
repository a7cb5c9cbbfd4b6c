"""Time the kernels at Qwen2.5-0.5B's decode shapes (decode attention at Llama-3.2-1B's, Qwen3-0.6B's and Gemma 3
270M's too): microseconds per launch and effective bandwidth; then at Qwen2.5-0.5B's prefill shapes (512 tokens,
and Llama-3.2-1B's GEMMs): microseconds per launch and TFLOP/s; then decode's products at Qwen2.5-0.5B's and
Llama-3.2-1B's shapes (or those --models names: Qwen3-0.6B's and Gemma 3 270M's too) with their weights in DRAM,
on both one-token kernels.

    python packages/minfer-kernels/bench/bench_kernels.py [--dram] [--models M,...] [--attention]
        (--dram: the last table alone; --models: its models, of DECODE_MODELS, default DEFAULT_DRAM_MODELS;
        --attention: decode attention alone, each family over ATTENTION_SWEEP_ROWS x ATTENTION_SWEEP_SPLITS)

Each case of the first two tables is launched a few times to warm up, then N times between two CUDA events on
one stream; the table shows the mean time per launch and the bytes the kernel must move divided by that time
(weights and activations read, outputs written). Their weights are few enough to stay in the L2 between
launches. The DRAM table is a decode step's view: each launch reads its own copy of the weight, the copies
together several times the L2, launched back to back in a replayed graph (overlapped, as in the step). Weight
bytes are random: timing does not depend on the values. The H200 moves about 4.3 TB/s device to device; a
decode-step kernel that reads 1 MB is launch-bound.
The rows that write or read a KV cache (the q|k|v GEMV that stores k and v, decode attention, the prompts at
depth 2048) are timed on a float32 cache, then on an f16 one, of half the bytes (their names end "f16 cache").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

import minfer_kernels as mk
from minfer_kernels import kernels

HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 896, 4864, 151936, 14, 2, 64
REPEATS = 200
F32_CACHE = mk.GGMLType.F32  # the KV caches' types: float32 (the runtime's default),
F16_CACHE = mk.GGMLType.F16  # or f16 (`-ctk f16`), 2 bytes a value
# The cache types a row that reads or writes a KV cache is timed at, and the numpy type of their values.
CACHE_DTYPES = {F32_CACHE: np.float32, F16_CACHE: np.float16}


@dataclass(frozen=True)
class AttentionShape:
    """A family's decode attention: query heads, KV heads, head size, whether decode norms and rotates the heads
    (Qwen3, Gemma 3), and the label its rows carry."""

    heads: int
    kv_heads: int
    head_dim: int
    head_norm: bool
    label: str


QWEN2 = AttentionShape(HEADS, KV_HEADS, HEAD_DIM, False, "")  # the microbench's own shape: its rows keep their names
LLAMA_1B = AttentionShape(32, 8, 64, False, " llama3.2-1b")
QWEN3 = AttentionShape(16, 8, 128, True, " qwen3-0.6b")
GEMMA3 = AttentionShape(4, 1, 256, True, " gemma3-270m")


def cache_label(cache_type: mk.GGMLType) -> str:
    """The end of a row's name for its cache type: none for float32, so those rows keep their names."""
    return "" if cache_type == F32_CACHE else f" {cache_type.name.lower()} cache"


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


# --attention's grid: each family at each count of cache rows, in each count of splits, on each cache type. It splits
# a depth's cost in two: the rows a block walks (its tiles' round trips and phases) and the splits it merges.
ATTENTION_SWEEP_ROWS = (64, 512, 1024, 2048, 4096, 8192)
ATTENTION_SWEEP_SPLITS = (1, 8, 16, 32, 64, 128)


def attention_decode_case(
    floats: Callable[..., int],
    keep: list[mk.DeviceBuffer],
    h: int,
    kv_len: int,
    n_splits: int,
    cache_type: mk.GGMLType,
    family: AttentionShape = QWEN2,
) -> tuple[str, int, Callable[[], None]]:
    """(name, bytes moved, launch): one decode attention launch over kv_len cache rows in n_splits splits; `floats`
    uploads random values (main's), `keep` holds the buffers."""
    kv_dim, dtype = family.kv_heads * family.head_dim, CACHE_DTYPES[cache_type]
    k_cache, v_cache = floats(kv_len * kv_dim, dtype), floats(kv_len * kv_dim, dtype)
    q_heads = floats(family.heads * family.head_dim)
    attn_out, length = floats(family.heads * family.head_dim), mk.upload(np.array([kv_len], np.int32), h)
    workspace = mk.DeviceBuffer(kernels.attention_decode_workspace_bytes(family.heads, family.head_dim, n_splits))
    keep.extend([length, workspace])
    head_norm = kernels.NO_HEAD_NORM
    if family.head_norm:  # q's and the newest k row's norms and rotation, as Qwen3's and Gemma 3's decode runs
        head_inv_freq = mk.upload(1e6 ** (-2.0 * np.arange(family.head_dim // 2) / family.head_dim), h)
        keep.append(head_inv_freq)
        norm_weights = floats(family.head_dim), floats(family.head_dim)
        head_norm = (*norm_weights, 1e-6, family.head_dim, head_inv_freq.ptr, 1.0, kernels.ROPE_NEOX)
    return (
        f"attention decode{family.label} kv={kv_len} splits={n_splits}{cache_label(cache_type)}",
        2 * mk.row_bytes(cache_type, kv_len * kv_dim),
        lambda: kernels.attention_decode_f32(
            q_heads, k_cache, v_cache, attn_out, length.ptr, workspace.ptr, family.heads, family.kv_heads,
            family.head_dim, kv_len, family.head_dim**-0.5, 0, n_splits, *head_norm, cache_type, h,
        ),
    )  # fmt: skip


def print_cases(cases: list[tuple[str, int, Callable[[], None]]], stream: mk.Stream) -> None:
    """The microseconds of each case's launch and the bytes it moves per second."""
    print(f"{'case':52s} {'us/launch':>10s} {'GB/s':>8s}")
    for name, moved, launch in cases:
        us = time_per_launch_us(launch, stream)
        print(f"{name:52s} {us:10.2f} {moved / us / 1e3:8.1f}")


def prefill_cases(
    device: Callable[[int], int], floats: Callable[..., int], keep: list[mk.DeviceBuffer], h: int
) -> list[tuple[str, float, Callable[[], None]]]:
    """(name, floating-point operations, launch): the prefill GEMMs of one layer at 512 tokens, the token
    counts around GEMM_MIN_TOKENS (the runtime's switch from matmul to gemm), and prefill attention; `floats(n,
    dtype)` n random values of dtype (float32 by default)."""
    cases: list[tuple[str, float, Callable[[], None]]] = []

    multiprocessors = mk.devices()[0].sm_count

    def product(kernel: Callable[..., None], ggml_type: mk.GGMLType, n_in: int, n_out: int, n_tokens: int) -> None:
        w = device(mk.row_bytes(ggml_type, n_in) * n_out)
        x, y = floats(n_in * n_tokens), floats(n_out * n_tokens)
        name = f"{kernel.__name__} {ggml_type.name} {n_in}->{n_out} x{n_tokens}"
        args: tuple[object, ...] = (w, ggml_type, x, y, n_in, n_out, n_tokens, h)
        if kernel is kernels.gemm:  # no bias or residual; the workspace of its rounded x and slices of K
            splits = kernels.gemm_splits(n_out, 0, 0, n_in, n_tokens, multiprocessors)
            nbytes = kernels.gemm_workspace_bytes(ggml_type, n_out, 0, 0, n_in, n_tokens, multiprocessors)
            space = floats(nbytes // 4)
            args = (w, ggml_type, x, None, None, y, n_in, n_out, n_tokens, space, nbytes, h)
            name += f" ({splits} K slices)" if splits > 1 else ""
        cases.append((name, 2.0 * n_in * n_out * n_tokens, lambda: kernel(*args)))

    for ggml_type in (mk.GGMLType.Q4_0, mk.GGMLType.Q8_0, mk.GGMLType.F16):
        for n_in, n_out in ((HIDDEN, FFN), (FFN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, KV_HEADS * HEAD_DIM)):
            product(kernels.gemm, ggml_type, n_in, n_out, 512)
    # The formats of llama-quantize's Q4_K_M mix, at the FFN shapes. The K-quants need in_features in whole
    # 256-value super-blocks: 4864 is 19 of them, 896 is not (such rows fall back to Q5_0 or Q8_0).
    for n_in, n_out in ((HIDDEN, FFN), (FFN, HIDDEN)):
        product(kernels.gemm, mk.GGMLType.Q5_0, n_in, n_out, 512)
    for ggml_type in (mk.GGMLType.Q4_K, mk.GGMLType.Q6_K):
        product(kernels.gemm, ggml_type, FFN, HIDDEN, 512)
    # Llama-3.2-1B's products, where the 128 x 128 tiles (an H100's or H200's warpgroup tiles) carry most of a prompt.
    hidden, ffn, heads, kv_heads, head_dim = DECODE_MODELS["llama3.2-1b"][:5]
    qkv = (heads + 2 * kv_heads) * head_dim
    for ggml_type in (mk.GGMLType.Q4_0, mk.GGMLType.Q8_0, mk.GGMLType.F16):
        for n_in, n_out in ((hidden, ffn), (ffn, hidden), (hidden, hidden), (hidden, qkv)):
            product(kernels.gemm, ggml_type, n_in, n_out, 512)
    for n_tokens in (8, 16, 32, 64):
        for kernel in (kernels.matmul, kernels.gemm):
            product(kernel, mk.GGMLType.Q4_0, HIDDEN, FFN, n_tokens)
            product(kernel, mk.GGMLType.Q4_0, FFN, HIDDEN, n_tokens)

    # A prompt from position 0, and one behind a cache of `depth` rows (llama-bench's pp512 at depth 2048), with
    # max_rows the largest position + 1; and as the runtime launches them, max_rows the cache's n_ctx (4096 by
    # default), whose extra slices the shallow prompt leaves empty. The prompts behind a cache, whose queries read
    # mostly cached rows, are timed on each cache type; the others on float32 alone.
    shapes = ((512, 0, 512), (2048, 0, 2048), (512, 2048, 2560), (512, 0, 4096), (512, 2048, 4096))
    for n_tokens, depth, n_ctx in shapes:  # tokens, the cache rows before them, n_ctx (the launch's max_rows too)
        kv_dim, max_rows = KV_HEADS * HEAD_DIM, depth + n_tokens
        q, out = floats(n_tokens * HEADS * HEAD_DIM), floats(n_tokens * HEADS * HEAD_DIM)
        positions = mk.upload(depth + np.arange(n_tokens, dtype=np.int32), h)
        keep.append(positions)
        splits = kernels.attention_prefill_splits(n_tokens, HEADS, HEAD_DIM, n_ctx, multiprocessors)
        nbytes = kernels.attention_prefill_workspace_bytes(n_tokens, HEADS, HEAD_DIM, n_ctx, multiprocessors)
        space = floats(nbytes // 4) if nbytes else None
        visible_rows = max_rows * (max_rows + 1) // 2 - depth * (depth + 1) // 2
        name = f"attention prefill {n_tokens} tokens" + (f" at depth {depth}" if depth else "")
        name += (f", n_ctx {n_ctx}" if n_ctx > max_rows else "") + f" ({splits} slices)"
        for cache_type in CACHE_DTYPES if depth else (F32_CACHE,):
            dtype = CACHE_DTYPES[cache_type]
            k_cache, v_cache = floats(n_ctx * kv_dim, dtype), floats(n_ctx * kv_dim, dtype)
            shape = (n_tokens, HEADS, KV_HEADS, HEAD_DIM, n_ctx, n_ctx, HEAD_DIM**-0.5, 0)
            args = (q, k_cache, v_cache, out, positions.ptr, *shape, space, nbytes, cache_type, h)
            cases.append(
                (
                    name + cache_label(cache_type),
                    4.0 * HEADS * HEAD_DIM * visible_rows,  # q.k and weight * v: 2 FLOP each per dimension
                    lambda args=args: kernels.attention_prefill_f32(*args),
                )
            )
    return cases


# A decode step's products per model: (hidden, ffn, heads, KV heads, head_dim, vocabulary, weight types).
DECODE_MODELS = {
    "qwen2.5-0.5b": (896, 4864, 14, 2, 64, 151936, ("Q4_0", "Q5_0", "Q8_0", "F16")),
    "llama3.2-1b": (2048, 8192, 32, 8, 64, 128256, ("Q4_0", "Q8_0", "Q4_K", "Q6_K", "F16")),
    # q_dim 2048 against hidden 1024: attn_output's rows are twice the others' (Gemma 3: 1024 against 640).
    "qwen3-0.6b": (1024, 3072, 16, 8, 128, 151936, ("Q4_0", "Q8_0")),
    "gemma3-270m": (640, 2048, 4, 1, 256, 262144, ("Q4_0", "Q8_0")),
}
# The DRAM table's models unless --models names others: the two the GPU suite's microbench has always timed.
DEFAULT_DRAM_MODELS = ("qwen2.5-0.5b", "llama3.2-1b")
DRAM_BYTES = 512 << 20  # the copies of one weight together: ~10 times the H200's L2
DRAM_REPLAYS = 5


class DecodeBuffers:
    """The activations, caches and tables of one model's decode products (their contents do not matter)."""

    def __init__(self, rng: np.random.Generator, h: int, dims: tuple[int, ...]) -> None:
        d, ffn, heads, kv_heads, head_dim, vocab = dims
        self.d, self.ffn, self.heads, self.kv_heads, self.head_dim, self.vocab = dims
        self.q_dim, self.kv_dim, self.n_ctx, self.h = heads * head_dim, kv_heads * head_dim, 4096, h

        def floats(n: int) -> mk.DeviceBuffer:
            return mk.upload(rng.standard_normal(n).astype(np.float32), h)

        width = max(d, ffn, self.q_dim)
        self.x, self.norm, self.act, self.q, self.y = (floats(width) for _ in range(5))
        self.logits, self.caches = floats(vocab), floats(2 * self.n_ctx * self.kv_dim)
        self.positions = mk.upload(np.array([1000], np.int32), h)
        self.inv_freq = mk.upload(1e6 ** (-2.0 * np.arange(head_dim // 2) / head_dim), h)

    def products(self, t: mk.GGMLType) -> list[tuple[str, int, int, Callable[[int], None]]]:
        """(name, rows, in_features, launch(weight pointer)) of each product of a layer, and the head."""
        d, ffn, q_dim, kv_dim, h = self.d, self.ffn, self.q_dim, self.kv_dim, self.h
        row = mk.row_bytes(t, d)

        def qkv(w: int) -> None:
            kernels.gemv_qkv_rope_store(
                w, t, w + row * q_dim, t, w + row * (q_dim + kv_dim), t, self.x.ptr, self.norm.ptr, 1e-6,
                None, None, None, self.q.ptr, self.caches.ptr, self.caches.ptr + 4 * self.n_ctx * kv_dim,
                self.positions.ptr, d, self.heads, self.kv_heads, self.head_dim, self.head_dim, self.inv_freq.ptr,
                1.0, kernels.ROPE_NEOX, self.n_ctx, F32_CACHE, h,
            )  # fmt: skip

        def attn_output(w: int) -> None:
            kernels.gemv(w, t, self.q.ptr, None, 1e-6, self.y.ptr, self.y.ptr, q_dim, d, h)

        def gate_up(w: int) -> None:
            kernels.gemv_swiglu(w, w + row * ffn, t, self.x.ptr, self.norm.ptr, 1e-6, self.act.ptr, d, ffn, h)

        def ffn_down(w: int) -> None:
            kernels.gemv(w, t, self.act.ptr, None, 1e-6, self.y.ptr, self.y.ptr, ffn, d, h)

        def head(w: int) -> None:
            kernels.gemv(w, t, self.x.ptr, self.norm.ptr, 1e-6, None, self.logits.ptr, d, self.vocab, h)

        return [
            ("qkv", q_dim + 2 * kv_dim, d, qkv),
            ("attn_output", d, q_dim, attn_output),
            ("gate|up", 2 * ffn, d, gate_up),
            ("ffn_down", d, ffn, ffn_down),
            ("output head", self.vocab, d, head),
        ]

    def layer_chain(self, t: mk.GGMLType) -> tuple[int, Callable[[int], None]]:
        """A layer's products one after another (q|k|v, attn_output, gate|up, ffn_down; no attention) over one
        stretch of their weights, each part 256-byte aligned: (the stretch's bytes, launch(its pointer)). Against
        the sum of the products alone it shows what their boundaries cost or save."""
        offsets, launches, total = [], [], 0
        for _, rows, in_features, launch in self.products(t)[:4]:
            offsets.append(total)
            launches.append(launch)
            total += -(-mk.row_bytes(t, in_features) * rows // 256) * 256

        def chain(w: int) -> None:
            for offset, launch in zip(offsets, launches, strict=True):
                launch(w + offset)

        return total, chain


def time_dram_product(
    launch: Callable[[int], None], weight_bytes: int, path: str, rng: np.random.Generator, h: int
) -> float:
    """Microseconds per launch of `launch` over copies of a random weight that together fill DRAM_BYTES, each
    launch its own copy, in one captured graph replayed DRAM_REPLAYS times; `path` the kernel it may take."""
    n_copies = min(256, max(2, -(-DRAM_BYTES // weight_bytes)))
    stride = -(-weight_bytes // 256) * 256  # each copy 256-byte aligned
    copies = mk.DeviceBuffer(stride * n_copies)
    first = mk.upload(rng.integers(0, 256, weight_bytes, dtype=np.uint8), h)
    for i in range(n_copies):
        mk.copy_d2d(copies.ptr + i * stride, first.ptr, weight_bytes, h)
    previous = mk.set_int8_gemv(path == "int8")
    try:
        mk.begin_capture(h)
        for i in range(n_copies):
            launch(copies.ptr + i * stride)
        graph = mk.end_capture(h)
    finally:
        mk.set_int8_gemv(previous)
    for _ in range(2):
        graph.launch(h)
    start, end = mk.Event(), mk.Event()
    start.record(h)
    for _ in range(DRAM_REPLAYS):
        graph.launch(h)
    end.record(h)
    end.synchronize()
    return start.elapsed_ms(end) * 1000.0 / (DRAM_REPLAYS * n_copies)


def dram_table(rng: np.random.Generator, stream: mk.Stream, models: list[str]) -> None:
    """Each product of the decode steps of `models` (DECODE_MODELS' names) with its weight in DRAM, on each
    one-token kernel that reads its type; then, per type and path, a layer's four products (no attention) alone,
    their times summed, and chained, one launch after the other as in a step: the difference is what their
    boundaries cost or save (two int8 launches in a row, say, against a CUDA-core one before an int8 one)."""
    h = stream.handle
    print(f"\n{'decode product, weights in DRAM':52s} {'path':>10s} {'us/launch':>10s} {'GB/s':>8s}")
    for model in models:
        *dims, types = DECODE_MODELS[model]
        buffers = DecodeBuffers(rng, h, tuple(dims))
        for type_name in types:
            t = mk.GGMLType[type_name]
            paths = ("cuda_cores", "int8") if t in INT8_TYPES else ("cuda_cores",)
            layer_sum = dict.fromkeys(paths, 0.0)  # the layer's four products alone, per path
            for index, (name, rows, in_features, launch) in enumerate(buffers.products(t)):
                weight_bytes = mk.row_bytes(t, in_features) * rows
                for path in paths:
                    us = time_dram_product(launch, weight_bytes, path, rng, h)
                    layer_sum[path] += us if index < 4 else 0.0
                    label = f"{model} {name} {type_name} {in_features}->{rows}"
                    print(f"{label:52s} {path:>10s} {us:10.2f} {weight_bytes / us / 1e3:8.1f}")
            chain_bytes, chain = buffers.layer_chain(t)
            for path in paths:
                chained = time_dram_product(chain, chain_bytes, path, rng, h)
                for how, us in (("alone, summed", layer_sum[path]), ("chained", chained)):
                    label = f"{model} layer's 4 products {how} {type_name}"
                    print(f"{label:52s} {path:>10s} {us:10.2f} {chain_bytes / us / 1e3:8.1f}")
    mk.sync(h)


# The types the one-token launchers may take to gemv_int8.cu's pipeline (the integer tensor cores; F16's on the
# half-precision ones).
INT8_TYPES = {t for t in mk.GGMLType if t.name not in ("F32", "BF16")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dram", action="store_true", help="the DRAM table of decode's products alone")
    parser.add_argument(
        "--attention", action="store_true", help="decode attention alone, each family over cache rows x splits"
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_DRAM_MODELS),
        help=f"the DRAM table's models, comma-separated, of: {', '.join(DECODE_MODELS)} (default the first two)",
    )
    args = parser.parse_args()
    models = [model for model in args.models.split(",") if model]
    unknown = [model for model in models if model not in DECODE_MODELS]
    if unknown or not models:
        parser.error(f"--models: no model {', '.join(unknown) or '(none given)'}; known: {', '.join(DECODE_MODELS)}")
    rng = np.random.default_rng(0)
    if args.dram:
        dram_table(rng, mk.Stream(), models)
        return
    stream = mk.Stream()
    h = stream.handle
    keep: list[mk.DeviceBuffer] = []

    def device(nbytes: int) -> int:
        buffer = mk.upload(rng.integers(0, 256, nbytes, dtype=np.uint8), h)
        keep.append(buffer)
        return buffer.ptr

    def floats(n: int, dtype: npt.DTypeLike = np.float32) -> int:
        buffer = mk.upload(rng.standard_normal(n).astype(dtype), h)
        keep.append(buffer)
        return buffer.ptr

    if args.attention:
        print(f"minfer-kernels decode attention on {mk.devices()[0].name} ({REPEATS} launches per case)")
        sweep = [
            attention_decode_case(floats, keep, h, kv_len, n_splits, cache_type, family)
            for family in (QWEN2, LLAMA_1B, QWEN3, GEMMA3)
            for kv_len in ATTENTION_SWEEP_ROWS
            for n_splits in ATTENTION_SWEEP_SPLITS
            for cache_type in CACHE_DTYPES
        ]
        print_cases(sweep, stream)
        return
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

    # The fused one-token kernels of a decode layer (gemv.cu), norm included.
    norm, qkv_rows = floats(HIDDEN), (HEADS + 2 * KV_HEADS) * HEAD_DIM
    positions = mk.upload(np.array([1000], np.int32), h)
    inv_freq = mk.upload(1e6 ** (-2.0 * np.arange(HEAD_DIM // 2) / HEAD_DIM), h)  # the RoPE table (rope.cuh)
    keep += [positions, inv_freq]
    for ggml_type in (mk.GGMLType.Q4_0, mk.GGMLType.Q8_0):
        part_bytes = mk.row_bytes(ggml_type, HIDDEN) * FFN
        gate, up, x, act = device(part_bytes), device(part_bytes), floats(HIDDEN), floats(FFN)
        cases.append(
            (
                f"gemv_swiglu {ggml_type.name} {HIDDEN}->2x{FFN}",
                2 * part_bytes + 4 * (2 * HIDDEN + FFN),
                lambda g=gate, u=up, t=ggml_type, x=x, act=act: kernels.gemv_swiglu(
                    g, u, t, x, norm, 1e-6, act, HIDDEN, FFN, h
                ),
            )
        )
        row = mk.row_bytes(ggml_type, HIDDEN)
        weights = [arg for rows in (HEADS, KV_HEADS, KV_HEADS) for arg in (device(row * rows * HEAD_DIM), ggml_type)]
        biases = (floats(HEADS * HEAD_DIM), floats(KV_HEADS * HEAD_DIM), floats(KV_HEADS * HEAD_DIM))
        q_out = floats(HEADS * HEAD_DIM)
        heads = (HIDDEN, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM, inv_freq.ptr, 1.0, kernels.ROPE_NEOX, 4096)
        for cache_type, dtype in CACHE_DTYPES.items():
            k_cache, v_cache = floats(4096 * KV_HEADS * HEAD_DIM, dtype), floats(4096 * KV_HEADS * HEAD_DIM, dtype)
            outputs = (*biases, q_out, k_cache, v_cache, positions.ptr)  # biases, q, caches, ...
            qkv_args = (*weights, x, norm, 1e-6, *outputs, *heads, cache_type, h)
            cases.append(
                (
                    f"gemv_qkv_rope_store {ggml_type.name} {HIDDEN}->{qkv_rows}{cache_label(cache_type)}",
                    # weights; x and norm, biases read, q written; the new k and v rows stored in the cache's type
                    row * qkv_rows
                    + 4 * (2 * HIDDEN + qkv_rows + HEADS * HEAD_DIM)
                    + mk.row_bytes(cache_type, 2 * KV_HEADS * HEAD_DIM),
                    lambda args=qkv_args: kernels.gemv_qkv_rope_store(*args),
                )
            )

    x, weight, out = floats(HIDDEN), floats(HIDDEN), floats(HIDDEN)
    cases.append(("rms_norm 1x896", 12 * HIDDEN, lambda: kernels.rms_norm_f32(x, weight, out, 1, HIDDEN, 1e-6, h)))
    # Gemma 3 270M's post-block norm (hidden 640), two a layer: x, the weight and y read, y written.
    cases.append(("rms_norm_add 1x640", 16 * 640, lambda: kernels.rms_norm_add_f32(x, weight, out, 1, 640, 1e-6, h)))
    gate = floats(FFN)
    cases.append(("silu 4864", 8 * FFN, lambda: kernels.silu_f32(gate, FFN, h)))
    q = floats(HEADS * HEAD_DIM)
    position = mk.upload(np.array([1000], np.int32), h)
    keep.append(position)
    cases.append(
        (
            "rope q 14x64",
            8 * HEADS * HEAD_DIM,
            lambda: kernels.rope_f32(
                q, position.ptr, 1, HEADS, HEAD_DIM, HEAD_DIM, inv_freq.ptr, 1.0, kernels.ROPE_NEOX, h
            ),
        )
    )

    def attention_case(kv_len: int, n_splits: int, cache_type: mk.GGMLType, family: AttentionShape = QWEN2) -> None:
        cases.append(attention_decode_case(floats, keep, h, kv_len, n_splits, cache_type, family))

    # Short caches (one split of 32+ rows), depth 2048 with the backend's 64 splits against fewer or more, and 4096
    # rows; each on each cache type.
    shapes = ((64, 64), (128, 64), (1024, 16), (2048, 16), (2048, 32), (2048, 64), (2048, 128), (4096, 32))
    for kv_len, n_splits in shapes:
        for cache_type in CACHE_DTYPES:
            attention_case(kv_len, n_splits, cache_type)
    # The other families' attention at a short cache and at depth 2048, with the splits the backend gives them on
    # 132 SMs (binders.decode_attention_splits: 16 at 8 KV heads, 128 at one).
    for family, n_splits in ((LLAMA_1B, 16), (QWEN3, 16), (GEMMA3, 128)):
        for kv_len in (64, 2048):
            for cache_type in CACHE_DTYPES:
                attention_case(kv_len, n_splits, cache_type, family)
    logits, index = floats(VOCAB), floats(1)
    argmax_space = mk.DeviceBuffer(kernels.argmax_workspace_bytes(1, VOCAB))  # zeroed, as argmax needs
    keep.append(argmax_space)
    cases.append(("argmax 151936", 4 * VOCAB, lambda: kernels.argmax_f32(logits, index, argmax_space.ptr, 1, VOCAB, h)))

    device_name = mk.devices()[0].name
    print(f"minfer-kernels microbench on {device_name} ({REPEATS} launches per case)")
    print_cases(cases, stream)
    print(f"\n{'prefill case':52s} {'us/launch':>10s} {'TFLOP/s':>8s}")
    for name, flops, launch in prefill_cases(device, floats, keep, h):
        us = time_per_launch_us(launch, stream)
        print(f"{name:52s} {us:10.2f} {flops / us / 1e6:8.1f}")
    mk.sync(h)
    dram_table(rng, stream, models)


if __name__ == "__main__":
    main()
