"""Slash commands: their names, arguments and help, and the parsing of their values.

Everything here is plain Python, apart from the UI, so a typo like `/temp 9x`
becomes a `CommandError` with a one-line message that the app shows inline.
What each command *does* lives in the app (`ChatApp.command_handlers`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minfer import MinferError, SamplingParams
from minfer.options import seed_value


class CommandError(Exception):
    """A slash command the app cannot run: unknown, or with a bad value. The message is one line."""


@dataclass(frozen=True)
class SlashCommand:
    name: str
    argument: str  # how /help shows the argument ("X", "[TEXT]"); empty when there is none
    summary: str
    while_streaming: bool = False  # safe to run while a reply streams (it does not touch the conversation)

    @property
    def usage(self) -> str:
        return f"/{self.name} {self.argument}".rstrip()


COMMANDS: dict[str, SlashCommand] = {
    command.name: command
    for command in (
        SlashCommand("help", "", "list the commands and keys", while_streaming=True),
        SlashCommand("clear", "", "start a new conversation (the system prompt stays)"),
        SlashCommand("regen", "", "regenerate the last reply"),
        SlashCommand("system", "[TEXT]", "set the system prompt; without TEXT, remove it"),
        SlashCommand("temp", "X", "sampling temperature; 0 is greedy"),
        SlashCommand("top-p", "X", "keep the likeliest tokens up to probability X (1 disables)"),
        SlashCommand("top-k", "N", "keep the N likeliest tokens (0 disables)"),
        SlashCommand("min-p", "X", "drop tokens less likely than X times the likeliest (0 disables)"),
        SlashCommand("repeat-penalty", "X", "make recently used tokens less likely (1 disables)"),
        SlashCommand("max-tokens", "N", "the longest reply, in tokens"),
        SlashCommand("seed", "N", "seed for reproducible sampling; `off` or -1 for a fresh one each time"),
        SlashCommand("save", "PATH", "save the conversation: JSON for .json, else Markdown"),
        SlashCommand("load", "PATH", "load a conversation saved as JSON by /save, and continue it"),
        SlashCommand("stats", "", "speed and token counts of the last reply, and the settings"),
        SlashCommand("quit", "", "leave minfer-chat", while_streaming=True),
    )
}


def is_command(text: str) -> bool:
    return text.startswith("/")


def parse_command(text: str) -> tuple[SlashCommand, str]:
    """`/name the rest` -> (the command, the rest without surrounding whitespace; it may span lines)."""
    name_and_rest = text.strip().removeprefix("/").split(maxsplit=1)
    name = name_and_rest[0] if name_and_rest else ""
    argument = name_and_rest[1] if len(name_and_rest) == 2 else ""
    if name not in COMMANDS:
        raise CommandError(f"unknown command /{name}: /help lists the commands")
    return COMMANDS[name], argument.strip()


def require_value(command: SlashCommand, argument: str, current: object) -> None:
    if not argument:
        raise CommandError(f"{command.usage}: give a value (now {current})")


def parse_float(command: SlashCommand, argument: str) -> float:
    try:
        return float(argument)
    except ValueError:
        raise CommandError(f"{command.usage}: {argument!r} is not a number") from None


def parse_int(command: SlashCommand, argument: str) -> int:
    try:
        return int(argument)
    except ValueError:
        raise CommandError(f"{command.usage}: {argument!r} is not a whole number") from None


def parse_seed(command: SlashCommand, argument: str) -> int | None:
    """A seed, or None (a fresh one for every reply) for `off` or -1, which is what `--seed -1` means."""
    if argument == "off":
        return None
    try:
        return seed_value(argument)  # the command line's reading of a seed, so that both take the same values
    except argparse.ArgumentTypeError as exc:
        raise CommandError(f"{command.usage}: {exc}") from None


# The commands that set one sampling parameter: command name -> (SamplingParams field, how to read the value).
SAMPLING_SETTERS: dict[str, tuple[str, Callable[[SlashCommand, str], float | int | None]]] = {
    "temp": ("temperature", parse_float),
    "top-p": ("top_p", parse_float),
    "top-k": ("top_k", parse_int),
    "min-p": ("min_p", parse_float),
    "repeat-penalty": ("repeat_penalty", parse_float),
    "seed": ("seed", parse_seed),
}


def updated_sampling(sampling: SamplingParams, command: SlashCommand, argument: str) -> SamplingParams:
    """The sampling parameters with the one that `command` sets read from `argument`."""
    field, parse = SAMPLING_SETTERS[command.name]
    require_value(command, argument, getattr(sampling, field))
    try:
        return dataclasses.replace(sampling, **{field: parse(command, argument)})
    except MinferError as exc:  # the runtime checks the ranges: one source of truth
        raise CommandError(f"{command.usage}: {exc}") from None


def parse_path(command: SlashCommand, argument: str, *, action: str, kind: str) -> Path:
    """The file `/save` writes or `/load` reads, `~` expanded; `action` ("save to") and `kind` word the errors."""
    if not argument:
        raise CommandError(f"{command.usage}: give a file name ({kind})")
    try:
        return Path(argument).expanduser()
    except RuntimeError:  # `~name` for a user this system does not know, or `~` with no home directory
        raise CommandError(f"cannot {action} {argument!r}: no home directory for {argument.split('/')[0]!r}") from None


def file_error(action: str, path: Path, exc: OSError | ValueError) -> CommandError:
    """Why `path` could not be written or read, in one line: the OS's reason, or Python's for a path no file can
    have (a NUL byte, a character the file system cannot encode)."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return CommandError(f"cannot {action} {str(path)!r}: {reason}")


def parse_max_tokens(command: SlashCommand, argument: str, *, current: int, ctx_size: int) -> int:
    """A reply budget that leaves room in the context for at least one token of prompt."""
    require_value(command, argument, current)
    value = parse_int(command, argument)
    if not 1 <= value < ctx_size:
        raise CommandError(f"{command.usage}: must be between 1 and {ctx_size - 1} (the context holds {ctx_size})")
    return value
