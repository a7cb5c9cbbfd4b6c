"""What minfer's commands share on the command line: `minfer` (minfer.cli) and `minfer-chat` parse with these.

One definition of each: the parser (a malformed command line is one line and exit status 2), `--version`, the
model, KV cache type, chat template and sampling options and the types of their values, and the exit statuses. A
value type raises `argparse.ArgumentTypeError`, which the parser reports naming the flag; `minfer-chat` reads a
`/seed` with `seed_value` too, so that the flag and the slash command take the same values.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from minfer.backends import BACKEND_CHOICES
from minfer.chat_template import resolve_chat_template
from minfer.chat_template_builtins import BUILTIN_TEMPLATES
from minfer.errors import TemplateError
from minfer.models.llama import DEFAULT_CACHE_TYPE, KV_CACHE_TYPES, check_cache_type
from minfer.sampler import SamplingParams
from minfer.threads import default_threads

EXIT_ERROR = 1  # a user mistake: a missing file, a bad value, an empty prompt
EXIT_USAGE = 2  # a malformed command line
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports it


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows each option's default, where it has one the help text does not already state."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS, [])
        if shown and action.option_strings and "default" not in text:
            text += " (default: %(default)s)"
        return text


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a malformed command line is one line on stderr, not a usage dump; --help shows defaults.

    `after_parse` holds what reads several flags together once they are all parsed (a flag given twice has its
    last value by then): each is called with the parsed arguments, and an ArgumentTypeError it raises is a usage
    error like a bad flag value."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.after_parse: list[Callable[[argparse.Namespace], None]] = []

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for finish in self.after_parse:
            try:
                finish(parsed)
            except argparse.ArgumentTypeError as exc:
                self.error(str(exc))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """`--version`: every package's version on one line (argparse's own action wraps it to the terminal)."""

    def __init__(self, option_strings: list[str], dest: str, prog: str = "minfer", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.prog = prog

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        sys.stdout.write(versions(self.prog) + "\n")  # on stdout, as argparse's own version action writes it
        parser.exit(0)


def versions(prog: str = "minfer") -> str:
    """`--version` of minfer's commands: every package of minfer, installed or not."""
    parts = []
    for package in ("minfer-runtime", "minfer-kernels", "minfer-chat", "minfer-server"):
        try:
            parts.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{package} (not installed)")
    return f"{prog}: " + ", ".join(parts)


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


def chat_template_value(text: str) -> Path | str:
    """--chat-template: the template file a value names, else the built-in template it names (`minfer.load` reads
    either as `chat_template`); anything else is refused with the built-ins' names."""
    try:
        choice = resolve_chat_template(text)
    except TemplateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return choice if isinstance(choice, Path) else choice.name


def add_chat_template_option(parser: argparse.ArgumentParser) -> None:
    """--chat-template FILE: a Jinja chat template, or a built-in's name, instead of the model file's own."""
    parser.add_argument(
        "--chat-template",
        type=chat_template_value,
        metavar="FILE",
        help="a Jinja chat template file to use instead of the model's, or a built-in template: "
        f"{', '.join(BUILTIN_TEMPLATES)} (an existing file of that name comes first)",
    )


def cache_type_value(text: str) -> str:
    """-ctk/-ctv: a KV cache type minfer has; llama.cpp's others are refused by name (models/llama.py:
    check_cache_type)."""
    try:
        return check_cache_type(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_cache_type_options(parser: OneLineParser) -> None:
    """-ctk/--cache-type-k and -ctv/--cache-type-v TYPE (llama.cpp's): the KV cache's type, `args.cache_type`.

    minfer's K and V caches share one type, so either flag sets both, and the two naming different types is a usage
    error naming both."""
    types = ", ".join(KV_CACHE_TYPES)
    parser.add_argument(
        "-ctk", "--cache-type-k", type=cache_type_value, metavar="TYPE",
        help=f"KV cache type ({types}; default: {DEFAULT_CACHE_TYPE}): f16 halves the cache's memory, each value "
        "rounded to float16 as it is stored; sets V's too",
    )  # fmt: skip
    parser.add_argument(
        "-ctv", "--cache-type-v", type=cache_type_value, metavar="TYPE",
        help="as -ctk: minfer's K and V caches share one type",
    )  # fmt: skip
    parser.after_parse.append(one_cache_type)


def one_cache_type(args: argparse.Namespace) -> None:
    """`args.cache_type` from -ctk and -ctv: the one given, or both when they agree (default: f32)."""
    k, v = args.cache_type_k, args.cache_type_v
    if k is not None and v is not None and k != v:
        raise argparse.ArgumentTypeError(
            f"argument -ctk/--cache-type-k {k} and -ctv/--cache-type-v {v}: minfer's K and V caches share one type "
            "(give one of the flags, or both the same type)"
        )
    args.cache_type = k or v or DEFAULT_CACHE_TYPE


def add_model_options(parser: OneLineParser) -> None:
    """--backend, -c/--ctx-size, -t/--threads, -ctk/-ctv and --chat-template: how to load the model (the arguments
    of `minfer.load`)."""
    parser.add_argument("--backend", choices=BACKEND_CHOICES, default="auto", help="where to run (default: auto)")
    parser.add_argument(
        "-c", "--ctx-size", type=positive_int, help="context size in tokens (default: min(4096, model's))"
    )
    parser.add_argument(
        "-t",
        "--threads",
        type=positive_int,
        help=f"CPU threads for the numpy work (default: one per physical core, {default_threads()} here)",
    )
    add_cache_type_options(parser)
    add_chat_template_option(parser)


# llama.cpp's sampling flags: the flag, the SamplingParams field it sets, its value type, its help.
SAMPLING_FLAGS = (
    ("--temp", "temperature", float_value, "temperature; 0 = greedy"),
    ("--top-k", "top_k", int_value, "0 disables"),
    ("--top-p", "top_p", float_value, "1.0 disables"),
    ("--min-p", "min_p", float_value, "0.0 disables"),
    ("--repeat-penalty", "repeat_penalty", float_value, "1.0 disables"),
    ("--repeat-last-n", "repeat_last_n", int_value, "recent tokens the penalty looks at"),
    ("--seed", "seed", seed_value, "seed for reproducible sampling (default: -1, a random one)"),
)


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """SAMPLING_FLAGS, defaulting to SamplingParams' defaults; `sampling_from` reads them back."""
    defaults = SamplingParams()
    for flag, field, value_type, text in SAMPLING_FLAGS:
        metavar = flag.lstrip("-").upper().replace("-", "_")  # --top-k TOP_K, as argparse names it
        parser.add_argument(flag, dest=field, type=value_type, default=getattr(defaults, field), metavar=metavar,
                            help=text)  # fmt: skip


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams of `add_sampling_options`' flags; a value out of range raises MinferError."""
    return SamplingParams(**{field: getattr(args, field) for _, field, _, _ in SAMPLING_FLAGS})
