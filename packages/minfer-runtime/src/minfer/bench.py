"""llama-bench-style measurements: pp (prompt tokens/s) and tg (generated tokens/s).

Each test runs once to warm up, then `repetitions` times from an empty KV cache
(or, with a depth, from a cache that already holds `depth` tokens, prefilled
untimed before each repetition: llama-bench's `-d`); the result is the mean ±
sample standard deviation of tokens per second. Token ids are random (seeded) —
the speed of a forward pass does not depend on them.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from minfer.engine import Engine
from minfer.errors import ContextOverflowError, MinferError


@dataclass(frozen=True)
class BenchResult:
    model: str
    size_bytes: int
    n_parameters: int
    backend: str
    kind: str  # "pp" (prompt processing) or "tg" (text generation)
    n_tokens: int
    depth: int  # tokens already in the KV cache when the test starts
    tokens_per_second: list[float]
    weight_bytes_per_token: int  # bytes of weights one decode step reads (tg only)

    @property
    def test(self) -> str:
        """llama-bench's name: `pp512`, `tg128`, `tg128 @ d2048`."""
        return f"{self.kind}{self.n_tokens}" + (f" @ d{self.depth}" if self.depth else "")

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tokens_per_second)

    @property
    def stddev(self) -> float:
        return statistics.stdev(self.tokens_per_second) if len(self.tokens_per_second) > 1 else 0.0

    @property
    def weight_gb_per_second(self) -> float | None:
        """Achieved weight traffic for decode tests: weight bytes per token x tokens per second."""
        if self.kind != "tg":
            return None
        return self.weight_bytes_per_token * self.mean / 1e9


def fill_context(engine: Engine, context: list[int]) -> None:
    """Empty the cache, then prefill `context` into it and wait for the device (all untimed)."""
    engine.reset()
    if context:
        program, _ = engine.prefill(context)
        program.argmax("logits")


def time_prompt(engine: Engine, context: list[int], tokens: list[int]) -> float:
    fill_context(engine, context)
    started = time.perf_counter()
    program, _ = engine.prefill(context + tokens)  # the cached context is not run again
    program.argmax("logits")  # reading a result waits for the device to finish
    return time.perf_counter() - started


def time_generation(engine: Engine, context: list[int], first_token: int, n_tokens: int) -> float:
    fill_context(engine, context)
    started = time.perf_counter()
    token = first_token
    for position in range(len(context), len(context) + n_tokens):
        token = engine.forward([token], position).argmax("logits")
    return time.perf_counter() - started


def run_test(measure: Callable[[], float], n_tokens: int, repetitions: int) -> list[float]:
    measure()  # warm-up: first-use costs (graph build, buffer allocation) stay out of the numbers
    return [n_tokens / measure() for _ in range(repetitions)]


def bench(
    engine: Engine,
    *,
    prompt_sizes: list[int],
    gen_sizes: list[int],
    repetitions: int = 5,
    seed: int = 0,
    depth: int = 0,
) -> list[BenchResult]:
    info = engine.info
    if repetitions < 1:
        raise MinferError(f"repetitions must be at least 1 (-r), got {repetitions}")
    if depth < 0:
        raise MinferError(f"depth must be zero or more (-d), got {depth}")
    sizes = {"prompt size (-p)": prompt_sizes, "generation length (-n)": gen_sizes}
    for what, values in sizes.items():
        if any(n < 1 for n in values):
            raise MinferError(f"every {what} must be at least 1, got {min(values)}")
    longest = max([*prompt_sizes, *gen_sizes], default=0)
    if depth + longest > engine.ctx_size:
        raise ContextOverflowError(
            f"a test of {longest} tokens after {depth} tokens of depth does not fit the context size "
            f"{engine.ctx_size}: lower -p/-n/-d or raise --ctx-size (the model's context is {info.context_length})"
        )
    rng = np.random.default_rng(seed)
    vocab = engine.tokenizer.vocab_size
    context = [int(t) for t in rng.integers(0, vocab, size=depth)]
    weight_bytes = sum(engine.gguf.tensor(name).nbytes for name in engine.config.expected_tensors())
    results = []

    def record(kind: str, n: int, speeds: list[float]) -> None:
        model = (info.name, info.file_size, info.n_parameters, info.backend)
        results.append(BenchResult(*model, kind, n, depth, speeds, weight_bytes))

    for n in prompt_sizes:
        tokens = [int(t) for t in rng.integers(0, vocab, size=n)]
        speeds = run_test(lambda tokens=tokens: time_prompt(engine, context, tokens), n, repetitions)
        record("pp", n, speeds)
    for n in gen_sizes:
        first = int(rng.integers(0, vocab))
        speeds = run_test(lambda n=n, first=first: time_generation(engine, context, first, n), n, repetitions)
        record("tg", n, speeds)
    engine.reset()
    return results


def format_size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def format_params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def to_markdown(results: list[BenchResult]) -> str:
    lines = [
        "| model | size | params | backend | test | t/s | weights GB/s |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in results:
        gbps = r.weight_gb_per_second
        lines.append(
            f"| {r.model} | {format_size(r.size_bytes)} | {format_params(r.n_parameters)} | {r.backend} | "
            f"{r.test} | {r.mean:.2f} ± {r.stddev:.2f} | {'' if gbps is None else f'{gbps:.1f}'} |"
        )
    return "\n".join(lines)


def to_json(results: list[BenchResult]) -> str:
    """One record per test, with llama-bench's JSON field names (plus `test` and the weight traffic)."""
    records = [
        {
            "model_type": r.model,
            "model_size": r.size_bytes,
            "model_n_params": r.n_parameters,
            "backends": r.backend,
            "n_prompt": r.n_tokens if r.kind == "pp" else 0,
            "n_gen": r.n_tokens if r.kind == "tg" else 0,
            "n_depth": r.depth,
            "test": r.test,
            "avg_ts": r.mean,
            "stddev_ts": r.stddev,
            "samples_ts": r.tokens_per_second,
            "weight_gb_per_second": r.weight_gb_per_second,
        }
        for r in results
    ]
    return json.dumps(records, indent=2)
