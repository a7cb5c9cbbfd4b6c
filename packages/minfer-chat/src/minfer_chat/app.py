"""The chat app: load a model, then talk to it turn by turn.

Threads: the engine is not thread-safe and a forward pass blocks, so every
call into it (loading, and each reply) runs in a textual thread worker, one at
a time. The worker hands progress and reply pieces to the UI thread with
`call_from_thread`, which waits until the UI has taken each one: the UI never
falls behind the model, and Esc is seen between two tokens.

The conversation itself lives in a `minfer.ChatSession`: it keeps the KV cache
between turns (a new turn prefills only its own tokens) and applies the context
policy (when the context is full it drops the oldest turns and prefills the
rest again). The app shows what the session did; it never edits the tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.worker import get_current_worker

import minfer
from minfer import ChatSession, Generation, MinferError, SamplingParams
from minfer_chat.commands import (
    COMMANDS,
    SAMPLING_SETTERS,
    CommandError,
    SlashCommand,
    is_command,
    parse_command,
    parse_max_tokens,
    parse_save_path,
    save_error,
    updated_sampling,
)
from minfer_chat.widgets import (
    AssistantMessage,
    LoadingPanel,
    ModelHeader,
    Notice,
    PromptInput,
    StatusLine,
    UserMessage,
    printable,
)

KEYS_HELP = [
    ("Enter", "send the message"),
    ("Ctrl+J", "new line (also Shift+Enter or Alt+Enter where the terminal reports them)"),
    ("Up / Down", "earlier messages and commands"),
    ("Esc", "stop the reply, keeping what was generated"),
    ("Ctrl+Q", "quit"),
]


@dataclass(frozen=True)
class ChatOptions:
    """What to load and how to talk to it: the command line's choices."""

    model: str | Path | None = None  # None: the default model
    backend: str = "auto"
    ctx_size: int | None = None
    system: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 512


class ChatApp(App[None]):
    """Header, conversation, message box and status line around one `minfer.ChatSession`."""

    TITLE = "minfer-chat"
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "stop_reply", "stop the reply", show=False)]

    streaming: reactive[bool] = reactive(False, init=False)  # a reply is being generated

    def __init__(self, options: ChatOptions) -> None:
        super().__init__()
        self.options = options
        self.session: ChatSession | None = None  # set once the model has loaded
        self.load_error: str | None = None  # why the model did not load; the app then exits
        self._stop_requested = threading.Event()  # set by Esc, read by the reply worker between tokens
        self.command_handlers: dict[str, Callable[[SlashCommand, str], None]] = {
            "help": self.show_help,
            "clear": self.clear_conversation,
            "regen": self.regenerate,
            "system": self.set_system_prompt,
            **dict.fromkeys(SAMPLING_SETTERS, self.set_sampling),
            "max-tokens": self.set_max_tokens,
            "save": self.save_conversation,
            "stats": self.show_stats,
            "quit": self.quit_app,
        }

    @property
    def chat(self) -> ChatSession:
        """The conversation. The message box is disabled until the model has loaded, so input always has one."""
        if self.session is None:
            raise RuntimeError("the model has not loaded yet")
        return self.session

    def compose(self) -> ComposeResult:
        yield ModelHeader(id="header")
        with VerticalScroll(id="conversation"):
            yield LoadingPanel(str(self.options.model or "the default model"))
        yield PromptInput(id="prompt")
        yield StatusLine(id="status")

    def on_mount(self) -> None:
        self.query_one("#conversation").anchor()  # follow new text until the user scrolls up
        self.load_model(self.query_one(LoadingPanel))

    # -- loading ----------------------------------------------------------------------------------

    @work(thread=True)
    def load_model(self, panel: LoadingPanel) -> None:
        """Open the model and load its weights (seconds, for a large one) off the UI thread, showing progress."""

        def report_progress(done_bytes: int, total_bytes: int) -> None:
            self.call_from_thread(panel.show_progress, done_bytes, total_bytes)

        options = self.options
        try:
            engine = minfer.load(
                options.model, backend=options.backend, ctx_size=options.ctx_size, progress=report_progress
            )
            if options.max_tokens >= engine.ctx_size:
                raise MinferError(
                    f"--max-tokens {options.max_tokens} leaves no room for the conversation in the context "
                    f"({engine.ctx_size} tokens): lower it or raise --ctx-size"
                )
            chat = engine.chat(system=options.system, sampling=options.sampling, max_tokens=options.max_tokens)
        except MinferError as exc:
            self.call_from_thread(self.fail_to_load, str(exc))
            return
        self.call_from_thread(self.model_loaded, chat)

    def fail_to_load(self, message: str) -> None:
        self.load_error = message
        self.exit(return_code=1)

    async def model_loaded(self, chat: ChatSession) -> None:
        self.session = chat
        info = chat.engine.info
        self.query_one(ModelHeader).show_model(info)
        status = self.query_one(StatusLine)
        status.backend, status.ctx_size = info.backend, chat.ctx_size
        await self.query_one(LoadingPanel).remove()
        if chat.system:
            self.notice(f"System prompt: {chat.system}")
        self.notice("Type a message and press Enter. /help lists the commands.")
        prompt = self.query_one(PromptInput)
        prompt.disabled = False
        prompt.focus()

    # -- input ------------------------------------------------------------------------------------

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.streaming and self.waits_for_reply(text):
            # Leave the text in the box: it can be sent once the reply is done.
            self.notice("A reply is streaming: press Esc to stop it, or wait for it to finish.", error=True)
            return
        self.query_one(PromptInput).commit()
        try:
            if is_command(text):
                command, argument = parse_command(text)
                self.command_handlers[command.name](command, argument)
            else:
                self.send_message(text)
        except CommandError as exc:
            self.notice(str(exc), error=True)

    def waits_for_reply(self, text: str) -> bool:
        """Whether `text` has to wait while a reply streams: messages, and commands that touch the conversation."""
        if not is_command(text):
            return True
        try:
            command, _ = parse_command(text)
        except CommandError:
            return False  # not a command at all: say so right away
        return not command.while_streaming

    def notice(self, text: str, *, error: bool = False) -> None:
        """Add a line from the app (command output, a notice, an error) to the conversation.

        Notices quote what was typed (an unknown command, a path): its control characters are dropped, so that an
        escape sequence is not played on the terminal.
        """
        self.query_one("#conversation").mount(Notice(Content(printable(text)), classes="error" if error else ""))

    # -- replies ----------------------------------------------------------------------------------

    def send_message(self, text: str) -> None:
        self.query_one("#conversation").mount(UserMessage(text))
        self.start_reply(self.chat.send(text))

    def start_reply(self, pieces: Iterator[str]) -> None:
        """Show an empty reply and fill it from a worker thread: `pieces` runs the engine as it is iterated."""
        reply = AssistantMessage()
        self.query_one("#conversation").mount(reply)
        self.streaming = True
        self._stop_requested.clear()
        self.stream_reply(pieces, reply, self.chat.last)

    @work(thread=True, group="reply")
    def stream_reply(self, pieces: Iterator[str], reply: AssistantMessage, previous: Generation | None) -> None:
        """Pull the reply out of the engine (prefill, then one piece per token) and show it as it comes."""
        worker = get_current_worker()
        error = None
        try:
            for piece in pieces:
                self.call_from_thread(reply.append, piece)
                if self._stop_requested.is_set() or worker.is_cancelled:
                    break
        except MinferError as exc:
            error = str(exc)
        finally:
            pieces.close()  # stops the engine part-way when we left early; the session keeps the text
        if not worker.is_cancelled:  # cancelled means the app is closing: nothing left to show
            self.call_from_thread(self.finish_reply, reply, previous, error)

    def action_stop_reply(self) -> None:
        self._stop_requested.set()

    def watch_streaming(self, streaming: bool) -> None:
        self.query_one(StatusLine).streaming = streaming  # it shows how to stop the reply

    async def finish_reply(self, reply: AssistantMessage, previous: Generation | None, error: str | None) -> None:
        """Back on the UI thread once the worker is done: render the reply, update the status line."""
        self.streaming = False
        generation = self.chat.last
        if generation is None or generation is previous:
            # The session refused the message before generating (it does not fit the context, say):
            # it is not part of the conversation, so take it out of the view too.
            await self.query_one("#conversation").query(UserMessage).last().remove()
            await reply.remove()
        else:
            await reply.complete(generation.text, generation.stats.stop_reason)
            self.query_one(StatusLine).show_reply(generation.stats, self.chat.context_used)
            self.mark_dropped_turns(self.chat.dropped_turns)
        if error:
            self.notice(error, error=True)

    def mark_dropped_turns(self, dropped_turns: int) -> None:
        """Grey out the turns the context policy dropped, and say so."""
        if not dropped_turns:
            return
        in_context = self.query(".message").exclude(".dropped")
        for message in list(in_context)[: 2 * dropped_turns]:
            message.add_class("dropped")
        turns = "turn" if dropped_turns == 1 else "turns"
        self.notice(
            f"The context is full: the oldest {dropped_turns} {turns} (greyed out) were dropped and the rest "
            "read again. The model no longer sees them."
        )

    # -- slash commands ---------------------------------------------------------------------------

    def show_help(self, command: SlashCommand, argument: str) -> None:
        width = max(len(c.usage) for c in COMMANDS.values())
        lines = [f"{c.usage:<{width}}  {c.summary}" for c in COMMANDS.values()]
        lines += [""] + [f"{key:<{width}}  {meaning}" for key, meaning in KEYS_HELP]
        self.notice("\n".join(lines))

    def clear_conversation(self, command: SlashCommand, argument: str) -> None:
        self.chat.clear()
        self.query_one("#conversation").remove_children()
        self.query_one(StatusLine).context_used = 0
        self.notice("New conversation.")

    def regenerate(self, command: SlashCommand, argument: str) -> None:
        try:
            pieces = self.chat.regenerate()
        except MinferError as exc:
            raise CommandError(str(exc)) from None
        self.query_one("#conversation").query(AssistantMessage).last().remove()
        self.start_reply(pieces)

    def set_system_prompt(self, command: SlashCommand, argument: str) -> None:
        self.chat.system = argument or None
        if argument:
            self.notice("System prompt set; the next reply reads the conversation again with it.")
        else:
            self.notice("System prompt removed.")

    def set_sampling(self, command: SlashCommand, argument: str) -> None:
        self.chat.sampling = updated_sampling(self.chat.sampling, command, argument)
        field_name, _ = SAMPLING_SETTERS[command.name]
        self.notice(f"{field_name} = {getattr(self.chat.sampling, field_name)}")

    def set_max_tokens(self, command: SlashCommand, argument: str) -> None:
        self.chat.max_tokens = parse_max_tokens(
            command, argument, current=self.chat.max_tokens, ctx_size=self.chat.ctx_size
        )
        self.notice(f"max_tokens = {self.chat.max_tokens}")

    def save_conversation(self, command: SlashCommand, argument: str) -> None:
        path = parse_save_path(command, argument)
        try:
            self.chat.save(path)
        except (OSError, ValueError) as exc:  # no such folder, no permission, a folder, disk full; a NUL byte
            raise save_error(path, exc) from None
        self.notice(f"Saved {len(self.chat.messages)} messages to {path}.")

    def show_stats(self, command: SlashCommand, argument: str) -> None:
        chat = self.chat
        lines: list[str] = []
        if chat.last is not None:
            stats = chat.last.stats
            lines += [
                f"prompt      {stats.prompt_tokens} tokens prefilled in {stats.prompt_seconds:.3f} s "
                f"({stats.prompt_tokens_per_second:.1f} tok/s)",
                f"generation  {stats.generated_tokens} tokens in {stats.generation_seconds:.3f} s "
                f"({stats.generation_tokens_per_second:.1f} tok/s), ended by {stats.stop_reason}",
            ]
        else:
            lines.append("no reply yet")
        sampling = ", ".join(f"{name}={value}" for name, value in asdict(chat.sampling).items())
        lines += [
            f"context     {chat.context_used}/{chat.ctx_size} tokens, {len(chat.turns)} messages",
            f"sampling    {sampling}, max_tokens={chat.max_tokens}",
            f"system      {chat.system or '(none)'}",
        ]
        self.notice("\n".join(lines))

    def quit_app(self, command: SlashCommand, argument: str) -> None:
        self.exit()  # a streaming reply stops too: textual cancels the worker, which checks between tokens
