"""The `minfer-chat` command: parse the command line, run the app, report a failed load in one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from minfer import MinferError, resolve_model
from minfer.options import (
    EXIT_ERROR,
    OneLineParser,
    VersionAction,
    add_model_options,
    add_sampling_options,
    positive_int,
    sampling_from,
)
from minfer_chat.app import ChatApp, ChatOptions


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="minfer-chat",
        description="Chat with a GGUF model in the terminal. Type /help in the app for its commands.",
    )
    parser.add_argument(
        "model", nargs="?", help="a known model name (smollm2) or a .gguf file (default: the default model)"
    )
    parser.add_argument("--version", action=VersionAction, prog="minfer-chat", help="the versions of minfer's packages")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("-n", "--max-tokens", type=positive_int, default=512, help="longest reply, in tokens")
    add_model_options(parser)
    add_sampling_options(parser)
    return parser


def options_from(args: argparse.Namespace) -> ChatOptions:
    """The app's options from parsed arguments; bad sampling values raise `MinferError`."""
    return ChatOptions(
        model=args.model,
        backend=args.backend,
        ctx_size=args.ctx_size,
        threads=args.threads,
        cache_type=args.cache_type,
        chat_template=args.chat_template,
        system=args.system,
        sampling=sampling_from(args),
        max_tokens=args.max_tokens,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        options = options_from(args)
        resolve_model(options.model)  # a missing model is reported before the screen opens
    except MinferError as exc:
        sys.stderr.write(f"minfer-chat: error: {exc}\n")
        return EXIT_ERROR
    app = ChatApp(options)
    app.run()
    if app.load_error is not None:
        sys.stderr.write(f"minfer-chat: error: {app.load_error}\n")
        return EXIT_ERROR
    return app.return_code or 0
