"""The widgets of the chat screen, top to bottom: header, conversation, queued entries, message box, status line.

They only display what the app hands them; none of them talks to the engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.events import Key
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Label, Markdown, ProgressBar, Static, TextArea

from minfer import GenerationStats, ModelInfo

# Why a reply ended, in the words shown under it ("eos" needs no note: the model finished).
STOP_NOTES = {"cancelled": "stopped", "length": "reached the reply limit (/max-tokens)"}

# Control characters other than tab and newline: a model can emit them, and a terminal would act on them.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def printable(text: str) -> str:
    """`text` without control characters, safe to hand to the terminal (and to an SVG screenshot)."""
    return CONTROL_CHARACTERS.sub("", text)


def describe_quant_mix(quant_mix: dict[str, int]) -> str:
    """`{"Q8_0": 16, "F32": 5}` -> `Q8_0 ×16, F32 ×5`."""
    return ", ".join(f"{quant} ×{count}" for quant, count in quant_mix.items())


def describe_threads(threads: int) -> str:
    return "1 thread" if threads == 1 else f"{threads} threads"


def describe_parameters(n_parameters: int) -> str:
    if n_parameters >= 10**9:
        return f"{n_parameters / 1e9:.1f}B params"
    return f"{n_parameters / 1e6:.1f}M params"


class ModelHeader(Static):
    """One line naming the model and where it runs; it says "loading" until the model is ready."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(Content.assemble(("minfer-chat", "bold"), "  loading the model…"), id=id)

    def show_model(self, info: ModelInfo) -> None:
        self.update(
            Content.assemble(
                (info.name, "bold"),
                f"  {info.architecture} · {describe_parameters(info.n_parameters)} · "
                f"{describe_quant_mix(info.quant_mix)} · {info.backend} on {info.device}, "
                f"{describe_threads(info.threads)}",
            )
        )


class LoadingPanel(Vertical):
    """What the conversation area shows while the weights load: the model asked for and a progress bar."""

    def __init__(self, model_label: str) -> None:
        super().__init__()
        self.model_label = model_label

    def compose(self) -> ComposeResult:
        yield Label(Content(f"Loading {self.model_label}…"))
        yield ProgressBar(show_eta=False)

    def show_progress(self, done_bytes: int, total_bytes: int) -> None:
        self.query_one(ProgressBar).update(total=total_bytes, progress=done_bytes)


class UserMessage(Static):
    """A message the user sent, shown as typed."""

    def __init__(self, text: str) -> None:
        super().__init__(Content(text), classes="message")
        self.border_title = "you"


def reply_body(text: str) -> Widget:
    """A finished reply as it is shown: Markdown, or a note that it is empty."""
    shown = printable(text)
    return Markdown(shown) if shown.strip() else Static("(empty reply)", classes="empty")


class AssistantMessage(Vertical):
    """A reply: plain text while it streams (cheap to update per token), Markdown once complete."""

    # Marks the end of a reply that is still coming (before the first piece: the prompt is being read).
    CURSOR = "▍"

    def __init__(self, text: str | None = None) -> None:
        """A reply about to stream, or with `text` a finished one (a conversation `/load` read)."""
        super().__init__(classes="message")
        self.border_title = "assistant"
        self.text = text or ""
        self._streaming = text is None

    def compose(self) -> ComposeResult:
        yield Static(self.CURSOR, classes="streaming") if self._streaming else reply_body(self.text)

    def append(self, piece: str) -> None:
        self.text += piece
        self.query_one(".streaming", Static).update(Content(printable(self.text) + self.CURSOR))

    async def complete(self, text: str, stop_reason: str) -> None:
        """Show the finished reply (the session's copy of it) as Markdown, noting why it ended if not on its own."""
        self.text = text
        self._streaming = False
        await self.query_one(".streaming").remove()
        await self.mount(reply_body(text))
        self.border_subtitle = STOP_NOTES.get(stop_reason, "")


class Notice(Static):
    """A line from the app in the conversation: command output, a notice, or an error (class "error")."""


class PendingList(Static):
    """The messages and commands typed while a reply streams, waiting their turn (hidden when there are none)."""

    SHOWN = 3  # entries listed; more are counted

    def show(self, entries: Iterable[str]) -> None:
        entries = list(entries)
        lines = [Content.assemble(("queued ", "bold"), first_line(entry)) for entry in entries[: self.SHOWN]]
        if len(entries) > self.SHOWN:
            lines.append(Content(f"… and {len(entries) - self.SHOWN} more"))
        self.update(Content("\n").join(lines))
        self.display = bool(entries)


def first_line(text: str) -> str:
    """`text` on one line: its first, marked with … when more follow."""
    lines = printable(text).splitlines() or [""]
    return lines[0] + (" …" if len(lines) > 1 else "")


class PromptInput(TextArea):
    """The message box: Enter sends, Ctrl+J starts a new line, Up and Down walk the sent-message history.

    Shift+Enter and Alt+Enter also start a new line in terminals that report them. Pasted text keeps
    its line breaks. Enter empties the box at once (what is typed next is the next submission, never
    added to this one) and hands the text to the app; `restore` puts back one the app could not take.
    """

    BINDINGS: ClassVar[list[BindingType]] = [("up", "history_back"), ("down", "history_forward")]
    NEWLINE_KEYS = frozenset({"ctrl+j", "shift+enter", "alt+enter"})

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(
            id=id,
            soft_wrap=True,
            highlight_cursor_line=False,
            placeholder="Message (Enter sends, Ctrl+J new line, /help for commands)",
            disabled=True,
        )
        self.input_history: list[str] = []
        self._history_position = 0  # index into history; len(history) means "the draft being typed"
        self._draft = ""

    async def _on_key(self, event: Key) -> None:
        # TextArea inserts a newline on Enter; we take Enter to send, so handle it before TextArea does.
        if event.key == "enter":
            event.prevent_default()
            text = self.text
            if text.strip():
                self.commit()
                self.post_message(self.Submitted(text))
        elif event.key in self.NEWLINE_KEYS:
            event.prevent_default()
            self.insert("\n")

    def commit(self) -> None:
        """Remember the text in the history and empty the box."""
        if not self.input_history or self.input_history[-1] != self.text:
            self.input_history.append(self.text)
        self._history_position = len(self.input_history)
        self._draft = ""
        self.clear()

    def restore(self, text: str) -> bool:
        """Put back a submission the app refused, to be edited; not over a new draft (the two would merge)."""
        if self.text:
            return False
        self._show(text)
        return True

    def action_history_back(self) -> None:
        if not self.cursor_at_first_line or self._history_position == 0:
            self.action_cursor_up()
            return
        if self._history_position == len(self.input_history):
            self._draft = self.text
        self._history_position -= 1
        self._show(self.input_history[self._history_position])

    def action_history_forward(self) -> None:
        if not self.cursor_at_last_line or self._history_position == len(self.input_history):
            self.action_cursor_down()
            return
        self._history_position += 1
        at_draft = self._history_position == len(self.input_history)
        self._show(self._draft if at_draft else self.input_history[self._history_position])

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)


def describe_speed(value: float | None, *, short: bool) -> str:
    if value is None:
        return "–"
    if short:
        return f"{value:.0f} t/s" if value >= 100 else f"{value:.1f} t/s"
    return f"{value:.1f} tok/s"


class StatusLine(Widget):
    """Speeds (live while a reply streams), context use, backend and threads, and how to stop a reply.

    It is one line at any width: when the full wording does not fit, it shortens the hint, then the labels, then
    leaves out the backend (the header names it too), then the prompt speed.
    """

    prompt_speed: reactive[float | None] = reactive(None)  # tokens/s of the last prefill
    generation_speed: reactive[float | None] = reactive(None)  # tokens/s of the reply streaming, or of the last one
    context_used: reactive[int] = reactive(0)
    ctx_size: reactive[int] = reactive(0)
    backend: reactive[str] = reactive("")
    threads: reactive[int] = reactive(0)
    streaming: reactive[bool] = reactive(False)

    def show_live(self, prompt_speed: float | None, generation_speed: float | None) -> None:
        """The speeds of the reply that is streaming, as measured on the generation thread so far."""
        self.prompt_speed, self.generation_speed = prompt_speed, generation_speed

    def show_reply(self, stats: GenerationStats, context_used: int) -> None:
        """The engine's own figures for the reply that just ended."""
        self.prompt_speed = stats.prompt_tokens_per_second if stats.prompt_tokens else None
        self.generation_speed = stats.generation_tokens_per_second if stats.generated_tokens else None
        self.context_used = context_used

    def layouts(self) -> list[Content]:
        """The line from the longest wording to the shortest."""
        prompt, generation = self.prompt_speed, self.generation_speed
        context = f"{self.context_used}/{self.ctx_size}"
        full = [
            f"prompt {describe_speed(prompt, short=False)}",
            f"generation {describe_speed(generation, short=False)}",
            f"context {context}",
            f"{self.backend}, {describe_threads(self.threads)}",
        ]
        short_prompt = f"prompt {describe_speed(prompt, short=True)}"
        short_generation = f"gen {describe_speed(generation, short=True)}"
        short = [short_prompt, short_generation, f"ctx {context}", f"{self.backend} ×{self.threads}"]
        wordings = [
            (full, "Esc stops the reply"),
            (full, "Esc stops"),
            (short, "Esc stops"),
            (short[:3], "Esc stops"),
            (short[1:3], "Esc stops"),
        ]
        return [
            Content.assemble(" · ".join(parts), (f"  {hint}" if self.streaming else "", "bold"))
            for parts, hint in wordings
        ]

    def render(self) -> Content:
        if not self.backend:
            return Content("loading the model…")
        layouts = self.layouts()
        width = self.content_size.width
        return next((line for line in layouts if line.cell_length <= width), layouts[-1])
