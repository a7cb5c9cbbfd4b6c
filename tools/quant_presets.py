"""Issue 16's check: every llama-quantize preset, made by llama.cpp's own tool, on minfer's backends.

    python tools/quant_presets.py --llama-quantize BIN [--check-f16 SMALL.gguf [--check-jobs N]] [--bench-f16 BIG.gguf
        [--llama-bench BIN]] [--backend cuda] [--presets Q4_K_M,...] [--workdir DIR]

For each preset, `llama-quantize` turns the F16 model `--check-f16` (when given) into that preset (its own type mix:
the output head, attn_v and ffn_down get other types), and the file runs on the CPU and on `--backend` over the
same prompts: the last position's relative logit error and the greedy continuations, held to the rule of
packages/minfer-runtime/tests/test_cuda_backend.py (minfer.testing.agreement: error < 1e-2, and every continuation
the CPU's, or leaving it only at a near-tie that the step's logit error explains). The checks run first, on
`--check-jobs` processes at once, each pinned to its own slice of the CPUs (the CPU reference is their slow side).
With `--bench-f16`, the same presets of that model (Qwen2.5-0.5B's shapes in the issue) are benchmarked with
`minfer bench` and, given `--llama-bench`, with llama-bench on the same file (`-p 512 -n 128 -fa 1 -ngl 99`),
one after the other. A markdown table goes to stdout; the exit status is 1 if a preset failed its check. Nothing
is downloaded: both binaries are built from the llama-cpp-python sdist's vendor/llama.cpp.
"""

from __future__ import annotations

import argparse
import csv
import io
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import minfer
from minfer.testing.agreement import MAX_LOGIT_ERROR, greedy_steps, relative_error, unexplained_divergence
from minfer.testing.workers import pin_to_share

# Every preset the issue names, in llama-quantize's spelling. F16 too: llama-quantize writes it from the F16 source
# like any other preset, so its row is a file the tool made, as every other row's is.
PRESETS = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_S",
           "Q5_K_M", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS", "F16", "BF16")  # fmt: skip
PROMPTS, PROMPT_TOKENS, CONTINUATION = 5, 64, 32


def quantize(llama_quantize: Path, source: Path, preset: str, workdir: Path) -> Path:
    target = workdir / f"{source.stem}-{preset}.gguf"
    if not target.exists():
        subprocess.run([str(llama_quantize), str(source), str(target), preset], check=True, capture_output=True)
    return target


def check(path: Path, backend: str) -> tuple[float, int]:
    """The largest relative logit error of `backend` against the CPU, and how many continuations leave the CPU's
    for a reason other than a near-tie."""
    cpu = minfer.load(path, backend="cpu", ctx_size=256)
    other = minfer.load(path, backend=backend, ctx_size=256)
    rng = np.random.default_rng(0)
    worst, diverged = 0.0, 0
    for _ in range(PROMPTS):
        prompt = [int(t) for t in rng.integers(3, cpu.config.vocab_size, size=PROMPT_TOKENS)]
        reference, ours = greedy_steps(cpu, prompt, CONTINUATION), greedy_steps(other, prompt, CONTINUATION)
        worst = max(worst, relative_error(ours[0][0], reference[0][0]))
        diverged += unexplained_divergence(reference, ours) is not None
    return worst, diverged


def pin_check_process(started: multiprocessing.sharedctypes.Synchronized, count: int) -> None:
    """A check process's start: the next share of the CPUs (the processes count themselves in)."""
    with started.get_lock():
        index = started.value
        started.value += 1
    pin_to_share(index, count)


def check_all(paths: dict[str, Path], backend: str, jobs: int) -> dict[str, tuple[float, int]]:
    """check() of each preset's file, on `jobs` processes at once. One after the other, the 4-layer model's checks
    took ~40 s each on the H200's machine (session 14: 6 in 240 s); 11 on six processes of 2 CPUs, 37 s in all.
    The processes are spawned, not forked: a forked CUDA context is unusable."""
    if jobs <= 1:
        return {preset: check(path, backend) for preset, path in paths.items()}
    context = multiprocessing.get_context("spawn")
    started = context.Value("i", 0)
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=pin_check_process, initargs=(started, jobs)) as pool:
        futures = {preset: pool.submit(check, path, backend) for preset, path in paths.items()}
        return {preset: future.result() for preset, future in futures.items()}


def minfer_rates(path: Path, backend: str, *flags: str) -> dict[str, float]:
    """`minfer bench`'s t/s by test (pp512, tg128, `tg128 @ d2048` with `-d 2048`), more `flags` given."""
    out = subprocess.run([sys.executable, "-m", "minfer.cli", "bench", "-m", str(path), "--backend", backend,
                          "-p", "512", "-n", "128", "-r", "5", "-o", "csv", *flags], check=True, stdout=subprocess.PIPE,
                         text=True).stdout  # fmt: skip
    return {row["test"]: float(row["avg_ts"]) for row in csv.DictReader(io.StringIO(out))}


def llama_rates(llama_bench: Path, path: Path, *flags: str) -> dict[str, float]:
    """llama-bench's t/s by test, named as minfer bench names them; flash attention on, every layer on the GPU."""
    out = subprocess.run([str(llama_bench), "-m", str(path), "-p", "512", "-n", "128", "-fa", "1", "-ngl", "99",
                          "-r", "5", "-o", "csv", *flags], check=True, stdout=subprocess.PIPE,
                         text=True).stdout  # fmt: skip
    rates = {}
    for row in csv.DictReader(io.StringIO(out)):
        test = f"pp{row['n_prompt']}" if int(row["n_gen"]) == 0 else f"tg{row['n_gen']}"
        depth = int(row.get("n_depth") or 0)
        rates[test + (f" @ d{depth}" if depth else "")] = float(row["avg_ts"])
    return rates


def ratio(ours: float, theirs: float) -> str:
    """minfer's rate over llama.cpp's, as the tables print it: three decimals, so that 1.499 does not read as 1.50."""
    return f"{ours / theirs:.3f}x" if theirs else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-quantize", type=Path, required=True)
    parser.add_argument("--check-f16", type=Path, help="the F16 model the check quantizes")
    parser.add_argument("--check-jobs", type=int, default=max(1, (os.cpu_count() or 1) // 2),
                        help="checks run at once, each on its own CPUs (default: one per 2 CPUs)")  # fmt: skip
    parser.add_argument("--bench-f16", type=Path, help="the F16 model the speed table quantizes")
    parser.add_argument("--llama-bench", type=Path)
    parser.add_argument("--backend", default="cuda", help="the backend checked against the CPU (default: cuda)")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/minfer-presets"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    presets = args.presets.split(",")
    unknown = sorted(set(presets) - set(PRESETS))
    if args.check_f16 is None and args.bench_f16 is None:
        parser.error("nothing to do: give --check-f16, --bench-f16 or both")
    if unknown:
        parser.error(f"--presets: unknown {', '.join(unknown)} (known: {', '.join(PRESETS)})")
    if args.check_jobs < 1:
        parser.error(f"--check-jobs: must be at least 1, got {args.check_jobs}")
    checks = {}
    if args.check_f16 is not None:
        paths = {preset: quantize(args.llama_quantize, args.check_f16, preset, args.workdir) for preset in presets}
        checks = check_all(paths, args.backend, min(args.check_jobs, len(presets)))
    failed = False
    print(f"| preset | {args.backend} vs cpu: max logit error | continuations off the CPU's | pp512 | llama.cpp pp512 "
          "| pp ratio | tg128 | llama.cpp tg128 | tg ratio |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for preset in presets:
        cells = [""] * 8
        if preset in checks:
            error, diverged = checks[preset]
            failed |= error >= MAX_LOGIT_ERROR or diverged > 0
            cells[:2] = [f"{error:.1e}", f"{diverged}/{PROMPTS}"]
        if args.bench_f16 is not None:
            path = quantize(args.llama_quantize, args.bench_f16, preset, args.workdir)
            ours = minfer_rates(path, args.backend)
            theirs = llama_rates(args.llama_bench, path) if args.llama_bench is not None else {}
            for column, test in ((2, "pp512"), (5, "tg128")):
                cells[column] = f"{ours.get(test, 0):.0f}"
                if test in theirs:
                    cells[column + 1 : column + 3] = [f"{theirs[test]:.0f}", ratio(ours.get(test, 0), theirs[test])]
        print(f"| {preset} | " + " | ".join(cells) + " |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
