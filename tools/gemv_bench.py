"""Time the one-token products of decode (gemv.cu) per weight type and shape, on the GPU: microseconds a
launch and the bandwidth its weight bytes reach, kernel by kernel, without the rest of a decode step.

    python tools/gemv_bench.py --preset qwen2.5-0.5b --types Q4_0,Q4_K,Q6_K,Q8_0
    python tools/gemv_bench.py --shapes 4864x896,2048x8192 --types Q6_K

A shape is in_features x out_features (row length x rows), as `minfer graph` prints a matmul's weight. With
--preset, the shapes are a decode layer's products of that synthetic preset (Q, K and V stacked; the
attention output; the gate and up pair as one `gemv_swiglu`; the down projection; the output head).

How it measures. One CUDA graph holds --launches launches of the kernel, each over another copy of the
weights, with as many copies as it takes to fill twice the GPU's L2 cache: every launch reads its weights
from DRAM, as a decode step does (one step reads every weight once). Replaying the graph leaves no host time
between the launches, and on sm_90 they overlap as the decode step's do (programmatic dependent launch:
gemv.cu prefetches its weights before it waits for the previous kernel). The time per launch is the median
of --repeats replays divided by the launches; GB/s is the weight bytes per launch over it. The weights are
random, quantized by minfer.testing.quantize (the test-model writer's quantizer); a row's time does not
depend on its values.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

import minfer_kernels as mk
from minfer.testing.quantize import quantize
from minfer.testing.synthetic import PRESETS
from minfer_kernels import kernels

QUANTIZED_ROWS = 1024  # rows quantized on the host; a matrix of more rows repeats them (same bytes, same speed)
MAX_COPY_BYTES = 4 << 30  # device memory the copies of one matrix may take


@dataclass(frozen=True)
class Product:
    """One decode product: `kernel` over a weight of `rows` rows of `in_features` values (`pairs` weights of
    that shape: gemv_swiglu reads a gate and an up matrix)."""

    name: str
    kernel: str
    in_features: int
    rows: int
    pairs: int = 1


def preset_products(preset: str) -> list[Product]:
    """A decode layer's products of the synthetic `preset`, and its output head."""
    spec = PRESETS[preset]
    d, head = spec.d_model, spec.head_dim
    q_rows, kv_rows = spec.n_heads * head, spec.n_kv_heads * head
    return [
        Product("attn_q|k|v", "gemv", d, q_rows + 2 * kv_rows),  # as decode does: one product of all three
        Product("attn_output", "gemv", q_rows, d),
        Product("ffn_gate+up", "gemv_swiglu", d, spec.d_ff, pairs=2),
        Product("ffn_down", "gemv", spec.d_ff, d),
        Product("output", "gemv", d, spec.vocab_size),
    ]


def parse_shapes(text: str) -> list[Product]:
    products = []
    for item in text.split(","):
        try:
            in_features, rows = (int(n) for n in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {item!r} is not IN_FEATURESxROWS (e.g. 4864x896)") from None
        products.append(Product(item, "gemv", in_features, rows))
    return products


def weight_bytes(ggml_type: GGMLQuantizationType, product: Product) -> np.ndarray:
    """`product.rows` rows of random weights in `ggml_type`, as GGUF stores them."""
    rng = np.random.default_rng(0)
    rows = min(product.rows, QUANTIZED_ROWS)
    quantized = quantize((0.02 * rng.standard_normal((rows, product.in_features))).astype(np.float32), ggml_type)
    quantized = quantized.view(np.uint8).reshape(rows, -1)
    return np.tile(quantized, (math.ceil(product.rows / rows), 1))[: product.rows]


def launcher(product: Product, ggml_type: int, x: int, y: int, stream: int) -> Callable[[list[int]], None]:
    """A call that enqueues `product`'s kernel over the weight copies it is given (one, or gate and up)."""
    if product.kernel == "gemv_swiglu":
        return lambda w: kernels.gemv_swiglu(
            gate=w[0], up=w[1], type=ggml_type, x=x, norm_weight=None, eps=1e-6, out=y,
            in_features=product.in_features, d_ff=product.rows, stream=stream,
        )  # fmt: skip
    return lambda w: kernels.gemv(
        weight=w[0], type=ggml_type, x=x, norm_weight=None, eps=1e-6, residual=None, y=y,
        in_features=product.in_features, out_features=product.rows, stream=stream,
    )  # fmt: skip


def time_product(product: Product, ggml_type: GGMLQuantizationType, args: argparse.Namespace) -> tuple[float, int]:
    """(microseconds a launch, weight bytes a launch) of `product` in `ggml_type`."""
    stream = mk.Stream()
    matrix = weight_bytes(ggml_type, product)
    nbytes = matrix.nbytes
    l2 = mk.devices()[0].l2_cache_bytes
    copies = max(2, min(math.ceil(2 * l2 / (nbytes * product.pairs)), MAX_COPY_BYTES // (nbytes * product.pairs)))
    first = mk.upload(matrix, stream.handle)
    buffers = [first] + [mk.DeviceBuffer(nbytes) for _ in range(copies * product.pairs - 1)]
    for buffer in buffers[1:]:
        mk.copy_d2d(buffer.ptr, first.ptr, nbytes, stream.handle)
    x = mk.upload(np.random.default_rng(1).standard_normal(product.in_features).astype(np.float32), stream.handle)
    y = mk.DeviceBuffer(4 * product.rows)
    launch = launcher(product, int(ggml_type), x.ptr, y.ptr, stream.handle)
    groups = [[b.ptr for b in buffers[i : i + product.pairs]] for i in range(0, len(buffers), product.pairs)]
    launch(groups[0])  # an eager launch first: a refused type or shape raises here, outside the capture
    mk.begin_capture(stream.handle)
    for i in range(args.launches):
        launch(groups[i % len(groups)])
    graph = mk.end_capture(stream.handle)
    start, end = mk.Event(), mk.Event()
    graph.launch(stream.handle)  # warm-up: the first replay uploads the graph
    times = []
    for _ in range(args.repeats):
        start.record(stream.handle)
        graph.launch(stream.handle)
        end.record(stream.handle)
        end.synchronize()
        times.append(start.elapsed_ms(end) * 1000 / args.launches)
    mk.sync(stream.handle)
    return statistics.median(times), nbytes * product.pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--preset", choices=sorted(PRESETS), default="qwen2.5-0.5b", help="a decode layer's shapes")
    where.add_argument("--shapes", help="IN_FEATURESxROWS,... instead of a preset's (gemv only)")
    parser.add_argument("--types", default="Q4_0,Q8_0,Q4_K,Q6_K,F16", help="GGML types, comma-separated")
    parser.add_argument("--launches", type=int, default=200, help="launches in the replayed graph")
    parser.add_argument("--repeats", type=int, default=5, help="replays timed; the median is printed")
    args = parser.parse_args()
    if mk.device_count() == 0:
        print(f"gemv_bench needs a GPU: {mk.unavailable_reason()}", file=sys.stderr)
        return 1
    try:
        types = [GGMLQuantizationType[name.strip().upper()] for name in args.types.split(",")]
    except KeyError as error:
        print(f"--types: {error.args[0]} is not a GGML type", file=sys.stderr)
        return 2
    products = parse_shapes(args.shapes) if args.shapes else preset_products(args.preset)
    print(f"{mk.devices()[0].name}, --launches {args.launches}, median of {args.repeats}")
    print("| product | kernel | shape | type | MB | µs | GB/s |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for product in products:
        for ggml_type in types:
            shape = f"{product.in_features}x{product.rows}" + (f" x{product.pairs}" if product.pairs > 1 else "")
            try:
                micros, nbytes = time_product(product, ggml_type, args)
            except (ValueError, mk.CudaError) as error:
                print(f"| {product.name} | {product.kernel} | {shape} | {ggml_type.name} | | | refused: {error} |")
                continue
            print(f"| {product.name} | {product.kernel} | {shape} | {ggml_type.name} | {nbytes / 1e6:.2f} | "
                  f"{micros:.2f} | {nbytes / micros / 1e3:.0f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
