"""llama-bench's measurements and output formats: pp (prompt tokens/s), tg (generated tokens/s) and pp+tg.

A test (`BenchTest`) prefills `n_prompt` random tokens, or generates `n_gen` tokens one by one, or does
both (llama-bench's `-pg`), after `n_depth` tokens already in the KV cache (`-d`), on `threads` CPU threads
(`-t`). `plan_tests` multiplies the parameter lists into tests in llama-bench's order. Each model, and each KV
cache type of it (`-ctk`/`-ctv`, `cache_types`), is a load of its own that runs every test. Each test runs once to
warm up, then `repetitions` times, each from a cache that holds exactly the depth's tokens (prefilled, untimed,
before each repetition); the result is every repetition's time, reported as llama-bench reports it: the mean ±
sample standard deviation of tokens per second. Token ids are random (seeded) — the speed of a forward pass
does not depend on them.

The printers write llama-bench's formats (`-o md|csv|json|jsonl|sql`) with its field names, as a header, one
piece per test as it ends, and a footer, so that a long run shows its results as they come.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import re
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

import minfer
from minfer.engine import PREFILL_CHUNK, Engine
from minfer.errors import ContextOverflowError, MinferError
from minfer.models.llama import DEFAULT_CACHE_TYPE, check_cache_type

# Called with a step of the running test: "depth", "prompt" or "generation" (what runs next).
Announce = Callable[[str], None]


@dataclass(frozen=True)
class BenchTest:
    n_prompt: int  # tokens prefilled (0: none)
    n_gen: int  # tokens generated one by one after them (0: none)
    n_depth: int = 0  # tokens already in the KV cache when the test starts
    threads: int | None = None  # CPU threads (-t); None keeps the engine's count

    @property
    def name(self) -> str:
        """llama-bench's name: `pp512`, `tg128`, `pp512+tg128`, `tg128 @ d2048`."""
        if self.n_gen == 0:
            name = f"pp{self.n_prompt}"
        elif self.n_prompt == 0:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        return name + (f" @ d{self.n_depth}" if self.n_depth else "")


def plan_tests(
    prompt_sizes: Iterable[int],
    gen_sizes: Iterable[int],
    pairs: Iterable[tuple[int, int]] = (),
    depths: Iterable[int] = (0,),
    threads: Iterable[int | None] = (None,),
) -> list[BenchTest]:
    """Every combination of the lists, in llama-bench's order (get_cmd_params_instances): for each thread count,
    for each depth, the prompt sizes, then the generation lengths, then the pp+tg pairs. A size of 0 (a pair
    of zeros) is no test: `-p 0` measures generation only."""
    prompt_sizes, gen_sizes, pairs, depths = list(prompt_sizes), list(gen_sizes), list(pairs), list(depths)
    tests = []
    for n_threads in threads:
        for depth in depths:
            tests += [BenchTest(n, 0, depth, n_threads) for n in prompt_sizes if n]
            tests += [BenchTest(0, n, depth, n_threads) for n in gen_sizes if n]
            tests += [BenchTest(p, g, depth, n_threads) for p, g in pairs if p or g]
    return tests


def check_tests(engine: Engine, tests: Sequence[BenchTest], repetitions: int) -> None:
    """Refuse, before anything runs, what cannot be measured: no repetitions, a negative size, or a test that
    does not fit this engine's context."""
    if repetitions < 1:
        raise MinferError(f"repetitions must be at least 1 (-r), got {repetitions}")
    info = engine.info
    for test in tests:
        sizes = {"prompt size (-p)": test.n_prompt, "generation length (-n)": test.n_gen, "depth (-d)": test.n_depth}
        for what, value in sizes.items():
            if value < 0:
                raise MinferError(f"every {what} must be zero or more, got {value}")
        if test.n_prompt == test.n_gen == 0:
            raise MinferError("a test with no prompt and no generation measures nothing (-p 0 and -n 0 skip a test)")
        if test.threads is not None and test.threads < 1:
            raise MinferError(f"thread counts must be at least 1 (-t), got {test.threads}")
        needed = test.n_depth + test.n_prompt + test.n_gen
        if needed > engine.ctx_size:
            raise ContextOverflowError(
                f"{info.path}: test {test.name} needs {needed} tokens of context, more than the context size "
                f"{engine.ctx_size}: lower -p/-n/-pg/-d or raise --ctx-size (the model's context is "
                f"{info.context_length})"
            )


def decode_weight_bytes(engine: Engine) -> int:
    """Bytes of weights one decode step reads, in the form the backend holds them (Backend.weight_nbytes: the
    stored quantized blocks on CUDA, float32 values on the CPU, which dequantizes at load). Every weight is read
    whole, except an embedding table that is not also the output head: the lookup reads one row of it."""
    config = engine.config
    total = 0
    for name in config.expected_tensors():
        nbytes = engine.backend.weight_nbytes(name)
        if name == "token_embd.weight" and not config.tied_output:
            nbytes //= config.vocab_size
        total += nbytes
    return total


@functools.cache
def cpu_info() -> str:
    """The CPU's model name (llama-bench's `cpu_info`): /proc/cpuinfo's where there is one, else platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class BenchResult:
    """One test's measurement, with llama-bench's field names."""

    model_filename: str
    model_type: str
    model_size: int
    model_n_params: int
    backends: str
    gpu_info: str
    n_threads: int
    cache_type: str  # the KV cache's type, K and V alike (llama-bench's type_k and type_v)
    n_prompt: int
    n_gen: int
    n_depth: int
    test_time: str  # when the test started, RFC 3339 in UTC
    samples_ns: tuple[int, ...]  # each repetition's time
    weight_bytes_per_token: int  # bytes of weights one decode step reads (decode_weight_bytes)

    @property
    def test(self) -> str:
        return BenchTest(self.n_prompt, self.n_gen, self.n_depth).name

    @property
    def type_k(self) -> str:
        return self.cache_type

    @property
    def type_v(self) -> str:
        return self.cache_type

    @property
    def samples_ts(self) -> list[float]:
        """Tokens per second of each repetition: prompt and generated tokens together, as llama-bench counts."""
        return [1e9 * (self.n_prompt + self.n_gen) / ns for ns in self.samples_ns]

    @property
    def avg_ns(self) -> int:
        return sum(self.samples_ns) // len(self.samples_ns)

    @property
    def stddev_ns(self) -> int:
        return int(statistics.stdev(self.samples_ns)) if len(self.samples_ns) > 1 else 0

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ns) > 1 else 0.0

    @property
    def weight_gb_per_second(self) -> float | None:
        """Achieved weight traffic of a decode test: weight bytes per token x tokens per second."""
        if self.n_prompt or not self.n_gen:
            return None
        return self.weight_bytes_per_token * self.avg_ts / 1e9


def timed_run(
    engine: Engine, context: list[int], prompt: list[int], first_token: int, n_gen: int, announce: Announce
) -> int:
    """Nanoseconds to prefill `prompt` after `context` (which the cache holds already: it is not run again),
    then to generate `n_gen` tokens one by one, each fed the last one's greedy pick, as generation runs them
    (Engine.greedy: steps in chunks whose picks come back once a chunk; llama-bench waits for every step)."""
    if prompt:
        announce("prompt")
    elif n_gen:
        announce("generation")
    started = time.perf_counter_ns()
    token, position = first_token, len(context)
    if prompt:
        program, _ = engine.prefill(context + prompt)
        token = program.argmax("logits")  # reading a result waits for the device to finish
        position += len(prompt)
        if n_gen:
            announce("generation")  # inside the timed run, as llama-bench's progress line is
    if n_gen:
        engine.greedy(token, position, n_gen)
    return time.perf_counter_ns() - started


def run_test(
    engine: Engine,
    test: BenchTest,
    *,
    model: str,
    repetitions: int = 5,
    seed: int = 0,
    warmup: bool = True,
    delay: float = 0.0,
    progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Measure one test on `engine` (check_tests first); `model` is the name the user gave the model.

    `delay` seconds pass first (llama-bench's --delay, to let the machine cool down); `progress` gets
    llama-bench's progress steps ("warmup prompt run", "depth run 2/5", "generation run 2/5", ...).
    """
    say = progress or (lambda step: None)
    if test.threads is not None:
        engine.set_threads(test.threads)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if delay:
        time.sleep(delay)
    rng = np.random.default_rng(seed)
    vocab = engine.config.vocab_size
    context = [int(t) for t in rng.integers(0, vocab, size=test.n_depth)]
    prompt = [int(t) for t in rng.integers(0, vocab, size=test.n_prompt)]
    first = int(rng.integers(0, vocab))

    def run(announce: Announce) -> int:
        engine.reset()
        if context:
            announce("depth")
            program, _ = engine.prefill(context)
            program.argmax("logits")  # waits for the device: the depth's prefill stays out of the timed run
        return timed_run(engine, context, prompt, first, test.n_gen, announce)

    if warmup:
        # The whole test once, untimed: first-use costs (graph builds, buffer allocation, CUDA graph capture on
        # the third decode step) stay out of the numbers. llama-bench warms up a single generated token.
        run(lambda step: say(f"warmup {step} run") if step != "depth" else None)
    samples = tuple(run(lambda step, i=i: say(f"{step} run {i}/{repetitions}")) for i in range(1, repetitions + 1))
    engine.reset()
    info = engine.info
    return BenchResult(
        model_filename=model,
        model_type=info.name,
        model_size=info.file_size,
        model_n_params=info.n_parameters,
        backends=info.backend,
        gpu_info=info.device if info.backend == "cuda" else "",
        n_threads=engine.threads,
        cache_type=info.cache_type,
        n_prompt=test.n_prompt,
        n_gen=test.n_gen,
        n_depth=test.n_depth,
        test_time=started,
        samples_ns=samples,
        weight_bytes_per_token=decode_weight_bytes(engine),
    )


# -- output formats -------------------------------------------------------------------------------

# llama-bench's fields (test::get_fields) that minfer has a value for, in llama-bench's order and with its
# types (STRING, INT, FLOAT), then minfer's own two. The fields of llama.cpp's knobs that minfer does not have
# (n_batch, flash_attn, ...) are left out rather than filled with values minfer did not run with.
FIELDS: dict[str, type] = {
    "cpu_info": str,
    "gpu_info": str,
    "backends": str,
    "model_filename": str,
    "model_type": str,
    "model_size": int,
    "model_n_params": int,
    "n_threads": int,
    "type_k": str,
    "type_v": str,
    "n_prompt": int,
    "n_gen": int,
    "n_depth": int,
    "test_time": str,
    "avg_ns": int,
    "stddev_ns": int,
    "avg_ts": float,
    "stddev_ts": float,
    "test": str,
    "weight_gb_per_second": float,  # null (NULL, empty) for tests that are not pure decode
}
SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL"}


def record(result: BenchResult) -> dict[str, str | int | float | None]:
    """The result's FIELDS, as typed values."""
    return {"cpu_info": cpu_info(), **{field: getattr(result, field) for field in list(FIELDS)[1:]}}


def format_size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:.2f} GiB"


def format_params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def quoted(value: str | int | float | None, quote: str) -> str:
    """A value as llama-bench writes it in csv and sql: floats with six decimals (C's %f), nothing for none, in
    `quote`s (inner ones doubled: llama-bench writes a model name with a quote as broken SQL)."""
    text = "" if value is None else f"{value:f}" if isinstance(value, float) else str(value)
    return quote + text.replace(quote, 2 * quote) + quote


class Printer(ABC):
    """Writes one output format through `out`: `header` before the first test, `test` after each, `footer` at
    the end (llama-bench's printer)."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self.out = out

    def header(self) -> None:  # noqa: B027 (most formats have no header)
        """Nothing before the tests, unless the format has a header."""

    @abstractmethod
    def test(self, result: BenchResult) -> None: ...

    def footer(self) -> None:  # noqa: B027 (most formats have no footer)
        """Nothing after the tests, unless the format has a footer."""


# llama-bench's markdown_printer::get_field_width for these columns; any other is max(its name's length, 10).
MARKDOWN_WIDTHS = {
    "model": -30, "size": 10, "params": 10, "backend": -10, "threads": 7, "type_k": 6, "type_v": 6, "test": 15,
    "t/s": 20,
}  # fmt: skip
LLAMA_BENCH_CACHE_TYPE = "f16"  # llama-bench's default -ctk and -ctv: its table has no type columns for it


class MarkdownPrinter(Printer):
    """llama-bench's table: its columns, widths and alignment (a negative width aligns left), and its footer."""

    def __init__(self, out: Callable[[str], None], *, threads_column: bool, cache_type_columns: bool) -> None:
        super().__init__(out)
        # llama-bench shows the threads column on a CPU backend, or when -t was given; type_k and type_v when the
        # cache types are not its default, f16 alone.
        self.columns = ["model", "size", "params", "backend", *(["threads"] if threads_column else [])]
        self.columns += [*(["type_k", "type_v"] if cache_type_columns else []), "test", "t/s", "weights GB/s"]

    def width(self, column: str) -> int:
        return MARKDOWN_WIDTHS.get(column, max(len(column), 10))

    def line(self, cells: Iterable[tuple[str, int]]) -> None:
        row = "".join(f" {cell:<{-width}} |" if width < 0 else f" {cell:>{width}} |" for cell, width in cells)
        self.out("|" + row + "\n")

    def header(self) -> None:
        self.line((column, self.width(column)) for column in self.columns)
        widths = [self.width(column) for column in self.columns]
        self.out("|" + "".join(f" {'-' * (abs(w) - 1)}{':' if w > 0 else '-'} |" for w in widths) + "\n")

    def test(self, result: BenchResult) -> None:
        gbps = result.weight_gb_per_second
        cells = {
            "model": result.model_type,
            "size": format_size(result.model_size),
            "params": format_params(result.model_n_params),
            "backend": result.backends,
            "threads": str(result.n_threads),
            "type_k": result.type_k,
            "type_v": result.type_v,
            "test": result.test,
            "t/s": f"{result.avg_ts:.2f} ± {result.stddev_ts:.2f}",
            "weights GB/s": "" if gbps is None else f"{gbps:.1f}",
        }
        self.line((cells[column], self.width(column)) for column in self.columns)

    def footer(self) -> None:
        self.out(f"\nbuild: minfer {minfer.__version__}\n")


class CsvPrinter(Printer):
    """A header line of field names, then a line per test, every value quoted (inner quotes doubled)."""

    def header(self) -> None:
        self.out(",".join(FIELDS) + "\n")

    def test(self, result: BenchResult) -> None:
        self.out(",".join(quoted(value, '"') for value in record(result).values()) + "\n")


def json_record(result: BenchResult) -> dict[str, object]:
    return {**record(result), "samples_ns": list(result.samples_ns), "samples_ts": result.samples_ts}


class JsonPrinter(Printer):
    """One JSON array of the tests' records (each with its samples), written a record at a time."""

    def __init__(self, out: Callable[[str], None]) -> None:
        super().__init__(out)
        self.first = True

    def header(self) -> None:
        self.out("[\n")

    def test(self, result: BenchResult) -> None:
        text = json.dumps(json_record(result), indent=2, ensure_ascii=False).replace("\n", "\n  ")
        self.out(("" if self.first else ",\n") + "  " + text)
        self.first = False

    def footer(self) -> None:
        self.out("\n]\n")


class JsonlPrinter(Printer):
    """One JSON record per line."""

    def test(self, result: BenchResult) -> None:
        self.out(json.dumps(json_record(result), ensure_ascii=False) + "\n")


class SqlPrinter(Printer):
    """SQLite statements: CREATE TABLE IF NOT EXISTS llama_bench, then an INSERT per test (`| sqlite3 db`)."""

    def header(self) -> None:
        columns = ",\n".join(f"  {field} {SQL_TYPES[kind]}" for field, kind in FIELDS.items())
        self.out(f"CREATE TABLE IF NOT EXISTS llama_bench (\n{columns}\n);\n\n")

    def test(self, result: BenchResult) -> None:
        values = ", ".join("NULL" if value is None else quoted(value, "'") for value in record(result).values())
        self.out(f"INSERT INTO llama_bench ({', '.join(FIELDS)}) VALUES ({values});\n")


OUTPUT_FORMATS = ("csv", "json", "jsonl", "md", "sql", "none")


def make_printer(
    output_format: str, out: Callable[[str], None], *, threads_column: bool, cache_type_columns: bool
) -> Printer | None:
    """The printer of a -o/-oe format writing through `out`; None for `none`. The two flags choose the markdown
    table's optional columns."""
    if output_format == "none":
        return None
    if output_format == "md":
        return MarkdownPrinter(out, threads_column=threads_column, cache_type_columns=cache_type_columns)
    printers = {"csv": CsvPrinter, "json": JsonPrinter, "jsonl": JsonlPrinter, "sql": SqlPrinter}
    if output_format not in printers:
        raise MinferError(f"unknown output format '{output_format}' (choose from {', '.join(OUTPUT_FORMATS)})")
    return printers[output_format](out)


# -- llama-bench's command line -------------------------------------------------------------------
# The value syntax of llama-bench's flags (parse_cmd_params), and what each flag that means nothing to minfer
# becomes: ignored (accepted, its value still checked, and named on stderr) or refused (an error naming it).
# cli.py wires these into argparse; a ValueError from a parser is a usage error naming the flag.

MAX_LIST_VALUES = 1000  # values one flag may expand to: `-p 1-1000000000` is a typo, not a sweep to allocate
INT_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?:([+*])([0-9]+))?)?")
SIGNED_INT_RANGE = re.compile(r"(-?[0-9]+)(?:-([0-9]+)(?:([+*])([0-9]+))?)?")


def list_items(text: str) -> list[str]:
    """The comma-separated items of a list value; one trailing comma is allowed, as llama-bench allows it."""
    items = text.split(",")
    if len(items) > 1 and items[-1] == "":
        items.pop()
    return items


def parse_int_range(text: str, *, allow_negative: bool = False) -> list[int]:
    """llama-bench's int list (parse_int_range): comma-separated items, each `first`, `first-last`,
    `first-last+step` or `first-last*mult`; `16-64+16` is 16,32,48,64 and `1-8*2` is 1,2,4,8.

    Unlike llama-bench, a range that holds no value (`64-16`) is an error, not silently nothing.
    """
    pattern = SIGNED_INT_RANGE if allow_negative else INT_RANGE
    values: list[int] = []
    for item in list_items(text):
        match = pattern.fullmatch(item)
        if match is None:
            kind = "integers" if allow_negative else "non-negative integers"
            raise ValueError(
                f"invalid list {text!r}: expected {kind} or ranges (first-last, first-last+step, first-last*mult)"
            )
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        op, step = (match[3], int(match[4])) if match[3] is not None else ("+", 1)
        if last < first:
            raise ValueError(f"invalid range {item!r}: it ends below its start")
        value = first
        while value <= last:
            values.append(value)
            if len(values) > MAX_LIST_VALUES:
                raise ValueError(f"{text!r} expands to more than {MAX_LIST_VALUES} values")
            following = value + step if op == "+" else value * step
            if following <= value:
                raise ValueError(f"invalid range {item!r}: the step does not get past {value}")
            value = following
    return values


def bounded(what: str, minimum: int | None = None, maximum: int | None = None) -> Callable[[str], list[int]]:
    """parse_int_range, each value at least `minimum` and at most `maximum` (where given)."""

    def parse(text: str) -> list[int]:
        values = parse_int_range(text)
        if minimum is not None and any(value < minimum for value in values):
            raise ValueError(f"every {what} must be at least {minimum}, got {text!r}")
        if maximum is not None and any(value > maximum for value in values):
            raise ValueError(f"every {what} must be at most {maximum}, got {text!r}")
        return values

    return parse


def parse_bools(text: str) -> list[bool]:
    """A list of 0|1 (llama-bench's string_split<bool>)."""
    items = list_items(text)
    if any(item not in ("0", "1") for item in items):
        raise ValueError(f"expected a list of 0 and 1, got {text!r}")
    return [item == "1" for item in items]


def parse_choices(*choices: str) -> Callable[[str], list[str]]:
    """A list of names, each one of `choices`."""

    def parse(text: str) -> list[str]:
        items = list_items(text)
        for item in items:
            if item not in choices:
                raise ValueError(f"invalid choice {item!r} (choose from {', '.join(choices)})")
        return items

    return parse


def parse_int_in(low: int, high: int) -> Callable[[str], list[int]]:
    """One integer from `low` to `high`."""

    def parse(text: str) -> list[int]:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be from {low} to {high}, got {text!r}")
        return [value]

    return parse


def parse_counts(text: str) -> list[int]:
    """A list of non-negative integers, without ranges (llama-bench reads -fitt and -fitc with stoull)."""
    items = list_items(text)
    if not all(item.isascii() and item.isdigit() for item in items):
        raise ValueError(f"expected a list of non-negative integers, got {text!r}")
    return [int(item) for item in items]


def parse_cache_types(text: str) -> list[str]:
    """-ctk's and -ctv's lists of KV cache types: f32, f16 (llama.cpp's other types refused by name)."""
    return [check_cache_type(item) for item in list_items(text)]


def cache_types(types_k: Sequence[str], types_v: Sequence[str]) -> list[str]:
    """The KV cache types to measure, in order, each a model load of its own, from -ctk's and -ctv's lists.

    llama-bench crosses the lists (get_cmd_params_instances: every K type with every V type, K outermost). minfer's K
    and V share one type, so one list alone is each of its types for both, and two lists must cross into pairs of
    one type only: a pair of different types is a ValueError saying how to ask. Neither list: minfer's default.
    """
    if not types_k or not types_v:
        return list(types_k or types_v or [DEFAULT_CACHE_TYPE])
    mixed = next(((k, v) for k in types_k for v in types_v if k != v), None)
    if mixed is not None:
        wanted = ",".join(dict.fromkeys([*types_k, *types_v]))
        raise ValueError(
            f"-ctk {','.join(types_k)} -ctv {','.join(types_v)}: llama-bench crosses the two lists (every K type with "
            f"every V type), which pairs K {mixed[0]} with V {mixed[1]}, but minfer's K and V caches share one type: "
            f"give the types to one flag (-ctk {wanted} measures each for both K and V), or one same type to both"
        )
    return [k for k in types_k for _ in types_v]


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """-pg's `pp,tg`: one prompt size and one generation length, both zero or more."""
    items = text.split(",")
    if len(items) != 2 or not all(item.isascii() and item.isdigit() for item in items):
        raise ValueError(f"expected PROMPT,GEN (two non-negative integers, e.g. 512,128), got {text!r}")
    return [(int(items[0]), int(items[1]))]


def parse_models(text: str) -> list[str]:
    """-m's comma-separated model names or paths (a path with a comma goes in the MODEL argument)."""
    items = list_items(text)
    if any(not item for item in items):
        raise ValueError(f"empty model name in {text!r}")
    return items


def parse_flash_attn(text: str) -> list[str]:
    """-fa's values: on|off|auto and the words llama.cpp reads as them (common_arg_utils::is_truthy, ...)."""
    return parse_choices("on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0", "-1")(text)


def parse_cpu_masks(text: str) -> list[str]:
    """-C's hexadecimal CPU masks (llama.cpp's parse_cpu_mask)."""
    items = list_items(text)
    for item in items:
        digits = item.removeprefix("0x")
        if not digits or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ValueError(f"invalid CPU mask {item!r}: expected hexadecimal digits, e.g. 0xff")
    return items


def parse_tensor_split(text: str) -> list[list[float]]:
    """-ts's lists of proportions, one per device, split by / or ;."""
    splits = []
    for item in list_items(text):
        try:
            split = [float(part) for part in re.split(r"[;/]+", item)]
        except ValueError:
            raise ValueError(f"invalid tensor split {item!r}: expected numbers split by / (e.g. 3/1)") from None
        if not all(math.isfinite(part) and part >= 0 for part in split):
            raise ValueError(f"invalid tensor split {item!r}: proportions are finite and zero or more")
        splits.append(split)
    return splits


def parse_main_gpu(text: str) -> list[int]:
    """-mg: 0 is what minfer does; another GPU is refused (running on device 0 instead would mislead)."""
    values = parse_int_range(text)
    if any(values):
        raise ValueError(
            "refused: the cuda backend runs on the first visible GPU (device 0): choose the GPU with "
            "CUDA_VISIBLE_DEVICES instead"
        )
    return values


DEVICE_CHOICE = "minfer picks its device with --backend (cpu, or cuda: the first visible GPU)"


def parse_devices(text: str) -> list[str]:
    """-dev: `auto` is what minfer does; a device list is refused (minfer picks its device with --backend)."""
    items = list_items(text)
    if any(item != "auto" for item in items):
        raise ValueError(f"refused: {DEVICE_CHOICE}")
    return items


def parse_embeddings(text: str) -> list[bool]:
    """-embd: 0 is what minfer does; 1 (measure embedding output) is refused: minfer computes logits."""
    values = parse_bools(text)
    if any(values):
        raise ValueError("refused: minfer computes the next token's logits, not embeddings")
    return values


@dataclass(frozen=True)
class IgnoredFlag:
    options: tuple[str, ...]  # as llama-bench spells them
    metavar: str | None  # None: a flag that takes no value
    parse: Callable[[str], list] | None
    reason: str  # why it changes nothing in minfer


def choice_flag(options: tuple[str, ...], choices: str, reason: str) -> IgnoredFlag:
    """An ignored flag whose values are among `choices` (`a|b|c`, also its metavar)."""
    return IgnoredFlag(options, choices, parse_choices(*choices.split("|")), reason)


def bool_flag(options: tuple[str, ...], reason: str) -> IgnoredFlag:
    """An ignored flag whose values are 0 or 1."""
    return IgnoredFlag(options, "0|1", parse_bools, reason)


@dataclass(frozen=True)
class RefusedFlag:
    options: tuple[str, ...]
    metavar: str | None
    reason: str  # why accepting it would mislead


ONE_DEVICE = "minfer runs a model on one device: there is nothing to split or spread"
LOAD_ONLY = "minfer memory-maps the file and reads every weight at load; how does not change the timed runs"
NO_PINNING = "minfer does not pin or schedule threads (run the command under taskset, nice or chrt for that)"
IGNORED_FLAGS = (
    choice_flag(("--numa",), "distribute|isolate|numactl", "minfer does not place memory or threads on NUMA nodes"),
    IgnoredFlag(("--prio",), "-1|0|1|2|3", parse_int_in(-1, 3), NO_PINNING),
    IgnoredFlag(("-v", "--verbose"), None, None, "minfer writes no logs to make verbose"),
    IgnoredFlag(("-fitt", "--fit-target"), "MiB", parse_counts,
                "minfer loads the whole model on one device: a model that does not fit is refused, not fitted"),
    IgnoredFlag(("-fitc", "--fit-ctx"), "N", parse_counts, "as -fitt"),
    IgnoredFlag(("--offline",), None, None, "minfer bench never uses the network"),
    IgnoredFlag(("-b", "--batch-size"), "N", bounded("batch size", 1),
                f"minfer runs a prompt in pieces of {PREFILL_CHUNK} tokens (llama.cpp's default -ub), whatever -b "
                "says"),
    IgnoredFlag(("-ub", "--ubatch-size"), "N", bounded("batch size", 1), "as -b"),
    IgnoredFlag(("-C", "--cpu-mask"), "HEX[,HEX...]", parse_cpu_masks, NO_PINNING),
    bool_flag(("--cpu-strict",), NO_PINNING),
    IgnoredFlag(("--poll",), "0...100", bounded("polling level", maximum=100),
                "numpy's BLAS threads have no polling level to set"),
    IgnoredFlag(("-ngl", "--n-gpu-layers"), "N", lambda text: parse_int_range(text, allow_negative=True),
                "the whole model runs on the --backend device; a value asking for another placement is refused"),
    IgnoredFlag(("-ncmoe", "--n-cpu-moe"), "N", parse_int_range,
                "minfer runs dense models: there are no expert weights to keep on the CPU"),
    choice_flag(("-sm", "--split-mode"), "none|layer|row|tensor", ONE_DEVICE),
    IgnoredFlag(("-mg", "--main-gpu"), "0", parse_main_gpu, "the cuda backend runs on device 0; another is refused"),
    bool_flag(("-nkvo", "--no-kv-offload"),
              "the KV cache lives with the weights; 1 on the cuda backend (a host cache) is refused"),
    IgnoredFlag(("-fa", "--flash-attn"), "on|off|auto", parse_flash_attn,
                "minfer has one attention per backend (on CUDA, fused flash-decoding and tiled prefill attention)"),
    IgnoredFlag(("-dev", "--device"), "auto", parse_devices,
                "minfer picks its device with --backend; a device list is refused"),
    choice_flag(("-lm", "--load-mode"), "auto|none|mmap|mlock|mmap+mlock|dio", LOAD_ONLY),
    choice_flag(("-lzm", "--lazy-mode"), "on|auto|off", LOAD_ONLY),
    bool_flag(("-mmp", "--mmap"), LOAD_ONLY),
    bool_flag(("-dio", "--direct-io"), LOAD_ONLY),
    IgnoredFlag(("-embd", "--embeddings"), "0", parse_embeddings, "minfer computes logits; 1 (embeddings) is refused"),
    IgnoredFlag(("-ts", "--tensor-split"), "TS0/TS1/...", parse_tensor_split, ONE_DEVICE),
    bool_flag(("-nopo", "--no-op-offload"),
              "the cuda backend holds every weight on the GPU: no op has host weights to offload"),
    bool_flag(("--no-host",), "minfer's weights go straight to the backend's own memory"),
    bool_flag(("--repack",),
              "the CPU backend dequantizes every weight to float32 at load: there is no layout to repack"),
)  # fmt: skip

NOT_DOWNLOADED = "minfer bench does not download models: give a .gguf path or a known name (see minfer pull)"
REFUSED_FLAGS = (
    RefusedFlag(("--list-devices",), None, f"{DEVICE_CHOICE}; there is no list"),
    RefusedFlag(("-rpc", "--rpc"), "SERVERS", "minfer has no RPC backend: the model runs on this machine"),
    RefusedFlag(("-hf", "-hfr", "--hf-repo"), "REPO", NOT_DOWNLOADED),
    RefusedFlag(("-hff", "--hf-file"), "FILE", NOT_DOWNLOADED),
    RefusedFlag(("-hft", "--hf-token"), "TOKEN", NOT_DOWNLOADED),
    RefusedFlag(("-ot", "--override-tensor"), "PATTERN=TYPE;...",
                "minfer keeps every weight on the --backend device: it cannot measure another placement"),
)  # fmt: skip


def check_placement(backend: str, n_layers: int, gpu_layers: Sequence[int], no_kv_offload: Sequence[bool]) -> None:
    """Refuse the -ngl and -nkvo values that ask for a placement this backend does not have.

    On the CPU backend every value is what runs (llama.cpp's CPU build takes any -ngl). The cuda backend runs
    every layer and the output on the GPU, which llama.cpp calls -ngl -1 or more than the layer count; -ngl 0
    keeps them on the CPU, and a count up to the layers splits the model (the output stays on the CPU).
    """
    if backend != "cuda":
        return
    for layers in gpu_layers:
        if layers == 0:
            raise MinferError(
                "-ngl 0 keeps every layer on the CPU, but the cuda backend runs them on the GPU: use --backend cpu"
            )
        if 0 < layers <= n_layers:
            raise MinferError(
                f"-ngl {layers} splits the model between the CPU and the GPU, which minfer does not do: the cuda "
                f"backend runs all {n_layers} layers and the output on the GPU (-ngl -1, or {n_layers + 1} and more)"
            )
    if any(no_kv_offload):
        raise MinferError(
            "-nkvo 1 keeps the KV cache in host memory, but the cuda backend keeps it on the GPU with the weights: "
            "use --backend cpu"
        )
