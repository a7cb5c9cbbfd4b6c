"""Issue 17's table: minfer against llama.cpp on the same GGUF files, on one GPU, in one run.

    python tools/bench_vs_llamacpp.py --llama-bin DIR [--shapes qwen2.5-0.5b,llama3.2-1b]
        [--types Q4_0,Q8_0,Q4_K_M,F16] [--models FILE,...] [--depth 2048] [--cache-type f16] [--workdir DIR]

For each shape (a preset of minfer.testing.synthetic, whose writer is gguf-py, llama.cpp's own GGUF library),
an F16 model with random weights is written once; llama.cpp's `llama-quantize` (in DIR, with `llama-bench`)
makes each type from it (F16 is the source itself). On each file `minfer bench` and then llama-bench (flash
attention on, every layer on the GPU) measure pp512 and tg128, both with `-r 5` and a KV cache of one type
(`--cache-type`, given to both as -ctk and -ctv: f16, llama-bench's default, unless f32 is asked for), and again
after `--depth` tokens in the cache (0: not). `--models` adds GGUF files benched as they are (a real model in its own
quantization, such as Gemma 3 270M's Q4_K_M): its rows name the file, type "as shipped". One markdown table goes
to stdout: shape, type, test, minfer, llama.cpp, ratio.
tools/bench-vs-llamacpp.sh builds llama.cpp from the llama-cpp-python sdist and runs this.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quant_presets import llama_rates, minfer_rates, quantize, ratio

from minfer.models.llama import KV_CACHE_TYPES
from minfer.testing.synthetic import PRESETS, write_synthetic_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="the folder of llama-bench and llama-quantize")
    parser.add_argument("--shapes", default="qwen2.5-0.5b,llama3.2-1b")
    parser.add_argument("--types", default="Q4_0,Q8_0,Q4_K_M,F16")
    parser.add_argument("--models", default="", help="GGUF files benched as they are, after the shapes")
    parser.add_argument("--depth", type=int, default=2048, help="tokens in the cache for the second pass (0: none)")
    parser.add_argument("--cache-type", choices=KV_CACHE_TYPES, default="f16", help="the KV cache type of both tools")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/minfer-vs-llamacpp"))
    args = parser.parse_args()
    shapes = [shape for shape in args.shapes.split(",") if shape]
    models = [Path(model) for model in args.models.split(",") if model]
    unknown = sorted(set(shapes) - set(PRESETS))
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)} (known: {', '.join(sorted(PRESETS))})")
    missing = [str(model) for model in models if not model.is_file()]
    if missing:
        parser.error(f"--models: {', '.join(missing)} does not exist")
    for tool in ("llama-bench", "llama-quantize"):
        if not (args.llama_bin / tool).is_file():
            parser.error(f"--llama-bin: {args.llama_bin / tool} does not exist")
    args.workdir.mkdir(parents=True, exist_ok=True)
    passes = [()] + ([("-d", str(args.depth), "--ctx-size", str(args.depth + 512))] if args.depth else [])
    print("| shape | type | test | minfer t/s | llama.cpp t/s | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for shape in shapes:
        source = args.workdir / f"{shape}-F16.gguf"
        if not source.exists():
            write_synthetic_model(source, shape, weight_type="F16")
        for weight_type in args.types.split(","):
            path = source if weight_type == "F16" else quantize(args.llama_bin / "llama-quantize", source,
                                                                weight_type, args.workdir)  # fmt: skip
            print_rows(shape, weight_type, path, passes, args)
    for model in models:
        print_rows(model.name, "as shipped", model, passes, args)
    return 0


def print_rows(shape: str, weight_type: str, path: Path, passes: list, args: argparse.Namespace) -> None:
    """The table's rows of one file: each pass's tests, minfer's rate against llama-bench's."""
    cache = ("-ctk", args.cache_type, "-ctv", args.cache_type)
    for flags in passes:
        ours = minfer_rates(path, args.backend, *flags, *cache)
        theirs = llama_rates(args.llama_bin / "llama-bench", path, *flags[:2], *cache)
        for test, rate in ours.items():
            other = theirs.get(test, 0)
            rates = f"{rate:.0f} | {other:.0f} | {ratio(rate, other)}"
            print(f"| {shape} | {weight_type} | {test} | {rates} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
