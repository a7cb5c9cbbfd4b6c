"""The decode step as the GPU runs it: each kernel's start and length, and the part of the step it accounts for,
with the overlap that programmatic dependent launch gives (MINFER_OP_TIMING's events take that overlap away).
Read from CUPTI through PyTorch's profiler, so it runs on the device, whose python3 holds PyTorch:

    python3 tools/timeline.py /tmp/minfer-bench/llama3.2-1b-Q4_K_M.gguf [-d 2048] [-n 64] [--trace FILE]

It runs `minfer bench MODEL --backend cuda -p 0 -n N -d DEPTH -r 1` (graph replay, as measured) under the profiler,
cuts the kernels into decode steps at each embedding lookup (a step's first kernel), keeps the steps of the usual
length (a prompt's kernels are not one), and prints two tables of medians over those steps:

- a layer: the kernels of one layer in order, each over every layer of every step (the layer is the step's
  repeating stretch of kernel names);
- the step: every kernel by name, how many a step, their time and what they account for.

A kernel's "adds" is its end less the latest end before it: the step's time that ends in it, so a step's adds sum
to its length (first start to last end). "overlap" is how long it ran beside the kernels before it, "wait" the
idle time before it (its start less the latest end before it, when positive). --trace FILE reads a Chrome trace
that the profiler wrote instead of profiling (the tables of an earlier run, or tests).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

STEP_FIRST_KERNEL = "embed_rows"  # the embedding lookup: a decode step's first node


@dataclass(frozen=True)
class Kernel:
    name: str  # short_name's form
    start: float  # µs
    end: float  # µs


@dataclass(frozen=True)
class Placed:
    """A kernel in its step: its length, and against the latest end of the kernels before it."""

    name: str
    duration: float
    adds: float
    overlap: float
    wait: float


def short_name(name: str) -> str:
    """A demangled kernel name without its return type, parameters and namespaces: `void minfer::(anonymous
    namespace)::gemv_int8<minfer::(anonymous namespace)::Int8Q4_K, ...>(minfer::Int8Launch, ...)` becomes
    `gemv_int8<Int8Q4_K, ...>`."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "").replace("minfer::", "")
    if name.endswith(")"):  # the parameter list: the parenthesised group that closes the name
        depth = 0
        for index in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[index], 0)
            if depth == 0:
                name = name[:index]
                break
    return name.strip()


def kernel_events(trace: dict) -> list[Kernel]:
    """The trace's kernels in order of start (its complete events of category `kernel`)."""
    kernels = [
        Kernel(short_name(event["name"]), float(event["ts"]), float(event["ts"]) + float(event["dur"]))
        for event in trace.get("traceEvents", [])
        if event.get("ph") == "X" and event.get("cat") == "kernel"
    ]
    return sorted(kernels, key=lambda kernel: kernel.start)


def decode_steps(kernels: list[Kernel]) -> list[list[Kernel]]:
    """The kernels cut at each embedding lookup, the runs of the most common length among them kept (a step
    that the trace cuts off, or a prompt's, has another)."""
    runs: list[list[Kernel]] = []
    for kernel in kernels:
        if kernel.name.startswith(STEP_FIRST_KERNEL):
            runs.append([])
        if runs:
            runs[-1].append(kernel)
    if not runs:
        return []
    usual = Counter(len(run) for run in runs).most_common(1)[0][0]
    return [run for run in runs if len(run) == usual]


def place(step: list[Kernel]) -> list[Placed]:
    """Each kernel of a step against the latest end before it."""
    placed, latest = [], step[0].start
    for kernel in step:
        placed.append(
            Placed(
                kernel.name,
                duration=kernel.end - kernel.start,
                adds=max(0.0, kernel.end - latest),
                overlap=max(0.0, min(latest, kernel.end) - kernel.start),
                wait=max(0.0, kernel.start - latest),
            )
        )
        latest = max(latest, kernel.end)
    return placed


def layer_span(names: list[str]) -> tuple[int, int, int]:
    """(first, period, layers): the step's repeating stretch of names, `layers` copies of `period` kernels from
    index `first`. The period is the one whose shifted names agree most often (the smallest among equals);
    (0, 0, 0) where nothing repeats."""
    best_period, best_matches = 0, 0
    for period in range(1, len(names) // 2 + 1):
        matches = sum(names[i] == names[i + period] for i in range(len(names) - period))
        if matches > best_matches:
            best_period, best_matches = period, matches
    if best_period == 0:
        return 0, 0, 0
    period = best_period
    for first in range(len(names) - 2 * period + 1):
        if names[first : first + period] == names[first + period : first + 2 * period]:
            layers = 2
            while names[first + layers * period : first + (layers + 1) * period] == names[first : first + period]:
                layers += 1
            return first, period, layers
    return 0, 0, 0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def layer_table(steps: list[list[Placed]]) -> str:
    """One layer's kernels in order, each the median over every layer of every step."""
    first, period, layers = layer_span([kernel.name for kernel in steps[0]])
    if period == 0:
        return "no repeating layer in the step"
    lines = [
        f"one layer: kernels {first} .. {first + period - 1} of the step, {layers} layers, medians over "
        f"{layers * len(steps)} (µs)",
        "| # | kernel | duration | overlap | wait | adds |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    total_adds = 0.0
    for position in range(period):
        placed = [step[first + layer * period + position] for step in steps for layer in range(layers)]
        adds = median([p.adds for p in placed])
        total_adds += adds
        lines.append(
            f"| {position} | `{placed[0].name}` | {median([p.duration for p in placed]):.2f} | "
            f"{median([p.overlap for p in placed]):.2f} | {median([p.wait for p in placed]):.2f} | {adds:.2f} |"
        )
    lines.append(f"| | a layer | | | | {total_adds:.2f} |")
    return "\n".join(lines)


def step_table(steps: list[list[Placed]], period: float) -> str:
    """Every kernel by name: how many a step, and the medians over steps of their summed time and adds; `period`
    is step_period's."""
    names = list(dict.fromkeys(kernel.name for kernel in steps[0]))
    lengths = [sum(kernel.adds for kernel in step) for step in steps]
    lines = [
        f"the step: {len(steps)} steps of {len(steps[0])} kernels, {median(lengths):.1f} µs a step (first start to "
        f"last end, median), one starting every {period:.1f} µs",
        "| kernel | a step | duration | adds | % of step |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in sorted(names, key=lambda n: -median([sum(k.adds for k in step if k.name == n) for step in steps])):
        count = sum(kernel.name == name for kernel in steps[0])
        duration = median([sum(k.duration for k in step if k.name == name) for step in steps])
        adds = median([sum(k.adds for k in step if k.name == name) for step in steps])
        lines.append(f"| `{name}` | {count} | {duration:.1f} | {adds:.1f} | {100 * adds / median(lengths):.1f} |")
    return "\n".join(lines)


def step_period(steps: list[list[Kernel]]) -> float:
    """The median time from one step's start to the next's, over successive steps (a pair further apart than
    twice the usual, across a repetition's break or a dropped run, is not successive)."""
    gaps = [after[0].start - before[0].start for before, after in itertools.pairwise(steps)]
    if not gaps:
        return float("nan")
    usual = median(gaps)
    return median([gap for gap in gaps if gap <= 2 * usual])


def report(trace: dict) -> str:
    kernels = kernel_events(trace)
    steps = decode_steps(kernels)
    if not steps:
        raise SystemExit(
            f"timeline: no decode step in the trace (no `{STEP_FIRST_KERNEL}` kernel among its {len(kernels)} kernels)"
        )
    placed = [place(step) for step in steps]
    return layer_table(placed) + "\n\n" + step_table(placed, step_period(steps))


def profile_bench(model: Path, depth: int, n_gen: int) -> dict:
    """`minfer bench` of the model under PyTorch's profiler (CUDA activity: CUPTI's kernel records), as a Chrome
    trace."""
    import torch  # the device's python3 holds it; nothing else here needs it

    from minfer import cli

    args = ["bench", str(model), "--backend", "cuda", "-p", "0", "-n", str(n_gen), "-d", str(depth), "-r", "1"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        status = cli.main(args)
    if status != 0:
        raise SystemExit(f"timeline: minfer {' '.join(args)} exited with {status}")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        profiler.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, help="the GGUF file to decode with")
    parser.add_argument("-d", "--depth", type=int, default=0, help="tokens in the KV cache first (bench's -d)")
    parser.add_argument("-n", "--n-gen", type=int, default=64, help="decode steps (bench's -n)")
    parser.add_argument("--trace", type=Path, help="a Chrome trace to read instead of profiling")
    args = parser.parse_args(argv)
    if args.trace is not None:
        trace = json.loads(args.trace.read_text())
    elif args.model is not None:
        trace = profile_bench(args.model, args.depth, args.n_gen)
    else:
        parser.error("give a model to profile or --trace FILE")
    print(report(trace))
    return 0


if __name__ == "__main__":
    sys.exit(main())
