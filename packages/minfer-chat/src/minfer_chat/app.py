"""The chat app: load a model, then talk to it turn by turn.

Threads: the engine is not thread-safe and a forward pass blocks, so every call into it (loading, and each reply)
runs in a textual thread worker, one at a time. A worker never waits for the UI: it posts messages (thread-safe,
they only enqueue), and a reply's pieces go through a `ReplyFeed`, a list the worker appends to under a lock
held for microseconds and the UI empties when told. So the time the engine measures is the model's own, and a
UI that falls behind takes several pieces at once. Esc sets an event that the worker reads between two tokens.

Input: every Enter is one submission; the message box empties at once, so what is typed next is the next one.
While a reply streams, messages and the commands that touch the conversation wait in a queue (listed above the
message box) and run in order once it ends; `/help` and `/quit` run at once.

The conversation itself lives in a `minfer.ChatSession`: it keeps the KV cache between turns (a new turn
prefills only its own tokens) and applies the context policy (when the context is full it drops the oldest turns
and prefills the rest again). The app shows what the session did; it never edits the tokens.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.worker import get_current_worker

import minfer
from minfer import ChatSession, Generation, GenerationStats, MinferError, SamplingParams
from minfer.options import DEFAULT_CACHE_TYPE, EXIT_ERROR, EXIT_INTERRUPTED
from minfer_chat.commands import (
    COMMANDS,
    SAMPLING_SETTERS,
    CommandError,
    SlashCommand,
    file_error,
    is_command,
    parse_command,
    parse_max_tokens,
    parse_path,
    updated_sampling,
)
from minfer_chat.saved_chat import apply_saved_chat, read_saved_chat
from minfer_chat.widgets import (
    AssistantMessage,
    LoadingPanel,
    ModelHeader,
    Notice,
    PendingList,
    PromptInput,
    StatusLine,
    UserMessage,
    printable,
)

KEYS_HELP = [
    ("Enter", "send the message (while a reply streams, it waits its turn)"),
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
    threads: int | None = None  # CPU threads for numpy's BLAS; None: the runtime's default
    cache_type: str = DEFAULT_CACHE_TYPE  # the KV cache's type, K and V alike (-ctk/-ctv): f32 or f16
    chat_template: str | Path | None = None  # a template file or a built-in's name instead of the model's own
    system: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 512


class LoadCancelled(Exception):
    """The app closed while the weights were loading: stop reading them rather than keep the exit waiting."""


class LoadProgress(Message):
    def __init__(self, done_bytes: int, total_bytes: int) -> None:
        super().__init__()
        self.done_bytes, self.total_bytes = done_bytes, total_bytes


class LoadFinished(Message):
    def __init__(self, chat: ChatSession | None, error: str | None) -> None:
        super().__init__()
        self.chat, self.error = chat, error


@dataclass(frozen=True)
class Speeds:
    """Tokens/s of a reply so far, as the generation thread measures them; None: not known yet."""

    prompt: float | None
    generation: float | None


class ReplyFeed:
    """One reply on its way from the generation thread (`put`) to the UI thread (`take`).

    The generation thread only appends under the lock; it posts a `ReplyPieces` message when the UI has taken
    everything before (one message on its way at a time, however fast the tokens come).
    """

    def __init__(
        self,
        reply: AssistantMessage,
        previous: Generation | None,
        *,
        message: str | None = None,
        replaced: AssistantMessage | None = None,
    ) -> None:
        self.reply = reply
        self.previous = previous  # the session's last generation before this reply: still it, the reply never began
        self.message = message  # the user's text, for a new message (None for /regen)
        self.replaced = replaced  # the reply /regen replaces, hidden meanwhile
        self._lock = threading.Lock()
        self._pieces: list[str] = []
        self._speeds = Speeds(None, None)
        self._told = False  # a ReplyPieces message is on its way

    def put(self, piece: str, speeds: Speeds) -> bool:
        """Add a piece (generation thread); True when the UI has to be told."""
        with self._lock:
            self._pieces.append(piece)
            self._speeds = speeds
            tell, self._told = not self._told, True
        return tell

    def take(self) -> tuple[str, Speeds]:
        """The text not shown yet and the latest speeds (UI thread)."""
        with self._lock:
            text, self._pieces = "".join(self._pieces), []
            self._told = False
            return text, self._speeds


class ReplyPieces(Message):
    def __init__(self, feed: ReplyFeed) -> None:
        super().__init__()
        self.feed = feed


class ReplyEnded(Message):
    def __init__(self, feed: ReplyFeed, *, error: str | None, refusal: str | None) -> None:
        super().__init__()
        self.feed = feed
        self.error = error  # what stopped the reply part-way (it keeps what was generated)
        self.refusal = refusal  # why the session refused the request before generating anything


def live_speeds(stats: GenerationStats, first_piece: tuple[float, int], now: float) -> Speeds:
    """A reply's speeds so far: the prompt's once read, and the tokens generated since the first piece over the
    time since (None until a second piece gives a time)."""
    started, tokens_then = first_piece
    generation = (stats.generated_tokens - tokens_then) / (now - started) if now > started else None
    return Speeds(stats.prompt_tokens_per_second if stats.prompt_tokens else None, generation)


def dropped_turns_notice(dropped_turns: int) -> str:
    if dropped_turns == 1:
        what, them = "the oldest turn (greyed out) was dropped", "it"
    else:
        what, them = f"the oldest {dropped_turns} turns (greyed out) were dropped", "them"
    return f"The context is full: {what} and the rest read again. The model no longer sees {them}."


class ChatApp(App[None]):
    """Header, conversation, queued entries, message box and status line around one `minfer.ChatSession`."""

    TITLE = "minfer-chat"
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "stop_reply", "stop the reply", show=False)]

    streaming: reactive[bool] = reactive(False, init=False)  # a reply is being generated

    def __init__(self, options: ChatOptions) -> None:
        super().__init__()
        self.options = options
        self.session: ChatSession | None = None  # set once the model has loaded
        self.load_error: str | None = None  # why the model did not load; the app then exits
        self.pending: deque[str] = deque()  # submissions waiting for the reply that streams, oldest first
        self._stop_requested = threading.Event()  # set by Esc, read by the reply worker between tokens
        self.command_handlers: dict[str, Callable[[SlashCommand, str], Awaitable[None] | None]] = {
            "help": self.show_help,
            "clear": self.clear_conversation,
            "regen": self.regenerate,
            "system": self.set_system_prompt,
            **dict.fromkeys(SAMPLING_SETTERS, self.set_sampling),
            "max-tokens": self.set_max_tokens,
            "save": self.save_conversation,
            "load": self.load_conversation,
            "stats": self.show_stats,
            "quit": self.quit_app,
        }

    @property
    def chat(self) -> ChatSession:
        """The conversation. The message box is disabled until the model has loaded, so input always has one."""
        if self.session is None:
            raise RuntimeError("the model has not loaded yet")
        return self.session

    async def run_async(self, **options: Any) -> Any:
        """Run the app (`App.run` comes here); a SIGINT from outside (`kill -INT`) closes it with status 130.

        textual reads Ctrl-C as a key, so a SIGINT only comes from another process. Python would raise
        KeyboardInterrupt wherever the loop happens to be; handled on the loop, it is an ordinary exit that
        stops the reply and gives the terminal back as it was.
        """
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, self.interrupted)
        except (NotImplementedError, RuntimeError):  # Windows' loops, or a loop outside the main thread
            return await super().run_async(**options)
        try:
            return await super().run_async(**options)
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    def interrupted(self) -> None:
        self._stop_requested.set()
        self.exit(return_code=EXIT_INTERRUPTED)

    def compose(self) -> ComposeResult:
        yield ModelHeader(id="header")
        with VerticalScroll(id="conversation"):
            yield LoadingPanel(str(self.options.model or "the default model"))
        yield PendingList(id="pending")
        yield PromptInput(id="prompt")
        yield StatusLine(id="status")

    def on_mount(self) -> None:
        self.query_one("#conversation").anchor()  # follow new text until the user scrolls up
        self.query_one(PendingList).show(self.pending)
        self.load_model()

    # -- loading ----------------------------------------------------------------------------------

    @work(thread=True)
    def load_model(self) -> None:
        """Open the model and load its weights (seconds, for a large one) off the UI thread, showing progress."""
        worker = get_current_worker()

        def report_progress(done_bytes: int, total_bytes: int) -> None:
            if worker.is_cancelled:
                raise LoadCancelled
            self.post_message(LoadProgress(done_bytes, total_bytes))

        options = self.options
        try:
            engine = minfer.load(
                options.model,
                backend=options.backend,
                ctx_size=options.ctx_size,
                threads=options.threads,
                cache_type=options.cache_type,
                progress=report_progress,
                chat_template=options.chat_template,
            )
            if options.max_tokens >= engine.ctx_size:
                raise MinferError(
                    f"--max-tokens {options.max_tokens} leaves no room for the conversation in the context "
                    f"({engine.ctx_size} tokens): lower it or raise --ctx-size"
                )
            chat = engine.chat(system=options.system, sampling=options.sampling, max_tokens=options.max_tokens)
        except LoadCancelled:
            return
        except MinferError as exc:
            self.post_message(LoadFinished(None, str(exc)))
            return
        self.post_message(LoadFinished(chat, None))

    @on(LoadProgress)
    def show_load_progress(self, message: LoadProgress) -> None:
        self.query_one(LoadingPanel).show_progress(message.done_bytes, message.total_bytes)

    @on(LoadFinished)
    async def model_loaded(self, message: LoadFinished) -> None:
        if message.chat is None:
            self.load_error = message.error
            self.exit(return_code=EXIT_ERROR)
            return
        chat = self.session = message.chat
        info = chat.engine.info
        self.query_one(ModelHeader).show_model(info)
        status = self.query_one(StatusLine)
        status.backend, status.threads, status.ctx_size = info.backend, info.threads, chat.ctx_size
        await self.query_one(LoadingPanel).remove()
        if chat.system:
            self.notice(f"System prompt: {chat.system}")
        self.notice("Type a message and press Enter. /help lists the commands.")
        prompt = self.query_one(PromptInput)
        prompt.disabled = False
        prompt.focus()

    # -- input ------------------------------------------------------------------------------------

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if self.streaming and self.waits_for_reply(text):
            self.pending.append(text)
            self.query_one(PendingList).show(self.pending)
            return
        await self.run_entry(text)

    def waits_for_reply(self, text: str) -> bool:
        """Whether `text` has to wait while a reply streams: messages, and commands that touch the conversation."""
        if not is_command(text):
            return True
        try:
            command, _ = parse_command(text)
        except CommandError:
            return False  # not a command at all: say so right away
        return not command.while_streaming

    async def run_entry(self, text: str) -> None:
        """Send a message or run a command: what Enter does when nothing streams."""
        try:
            if is_command(text):
                command, argument = parse_command(text)
                done = self.command_handlers[command.name](command, argument)
                if inspect.isawaitable(done):
                    await done
            else:
                self.send_message(text)
        except CommandError as exc:
            self.notice(str(exc), error=True)

    async def run_pending(self) -> None:
        """Run the queued submissions in order, up to the next one that starts a reply."""
        while self.pending and not self.streaming:
            text = self.pending.popleft()
            self.query_one(PendingList).show(self.pending)
            await self.run_entry(text)

    def notice(self, text: str, *, error: bool = False) -> None:
        """Add a line from the app (command output, a notice, an error) to the conversation.

        Notices quote what was typed (an unknown command, a path): its control characters are dropped, so that an
        escape sequence is not played on the terminal.
        """
        self.query_one("#conversation").mount(Notice(Content(printable(text)), classes="error" if error else ""))

    # -- replies ----------------------------------------------------------------------------------

    def send_message(self, text: str) -> None:
        try:
            pieces = self.chat.send(text)
        except MinferError as exc:  # too long for the context, say: checked before anything runs
            self.refuse_message(text, str(exc))
            return
        self.query_one("#conversation").mount(UserMessage(text))
        self.start_reply(pieces, message=text)

    def refuse_message(self, text: str, reason: str) -> None:
        """Say why a message was not sent, and give it back to be edited (into the box, unless a draft is there)."""
        if self.query_one(PromptInput).restore(text):
            where = "it is back in the message box"
        else:
            where = "Up brings it back from the history"
        self.notice(f"Not sent: {reason}; {where}.", error=True)

    def start_reply(
        self, pieces: Iterator[str], *, message: str | None = None, replaced: AssistantMessage | None = None
    ) -> None:
        """Show an empty reply and fill it from a worker thread: `pieces` runs the engine as it is iterated."""
        reply = AssistantMessage()
        self.query_one("#conversation").mount(reply)
        self.streaming = True
        self._stop_requested.clear()
        self.stream_reply(pieces, ReplyFeed(reply, self.chat.last, message=message, replaced=replaced))

    @work(thread=True, group="reply")
    def stream_reply(self, pieces: Iterator[str], feed: ReplyFeed) -> None:
        """Pull the reply out of the engine (prefill, then one piece per token) and hand each piece on."""
        worker = get_current_worker()
        chat = self.chat
        error = refusal = None
        first_piece: tuple[float, int] | None = None  # when the first piece came, and the tokens generated by then
        try:
            for piece in pieces:
                now = time.perf_counter()
                stats = chat.last.stats  # this reply's: the session sets `last` before its first piece
                if first_piece is None:
                    first_piece = (now, stats.generated_tokens)
                if feed.put(piece, live_speeds(stats, first_piece, now)):
                    self.post_message(ReplyPieces(feed))
                if self._stop_requested.is_set() or worker.is_cancelled:
                    break
        except MinferError as exc:
            if chat.last is feed.previous:  # raised before the reply began: the session refused the request
                refusal = str(exc)
            else:
                error = str(exc)
        finally:
            pieces.close()  # stops the engine part-way when we left early; the session keeps the text
        if not worker.is_cancelled:  # cancelled means the app is closing: nothing left to show
            self.post_message(ReplyEnded(feed, error=error, refusal=refusal))

    @on(ReplyPieces)
    def show_pieces(self, message: ReplyPieces) -> None:
        feed = message.feed
        text, speeds = feed.take()
        if text:
            feed.reply.append(text)
        self.query_one(StatusLine).show_live(speeds.prompt, speeds.generation)

    def action_stop_reply(self) -> None:
        self._stop_requested.set()

    def watch_streaming(self, streaming: bool) -> None:
        self.query_one(StatusLine).streaming = streaming  # it shows how to stop the reply

    @on(ReplyEnded)
    async def finish_reply(self, message: ReplyEnded) -> None:
        """Back on the UI thread once the worker is done: render the reply, update the status line, run the queue."""
        feed = message.feed
        if message.refusal is not None:
            # Refused when the first piece was asked for (a session that plans the turn only then, an engine busy
            # elsewhere): not part of the conversation, so it leaves the view too; a message goes back to the user.
            await feed.reply.remove()
            if feed.replaced is not None:
                feed.replaced.display = True
            if feed.message is None:
                self.notice(message.refusal, error=True)
            else:
                await self.query_one("#conversation").query(UserMessage).last().remove()
                self.refuse_message(feed.message, message.refusal)
        else:
            generation = self.chat.last
            if feed.replaced is not None:
                await feed.replaced.remove()
            await feed.reply.complete(generation.text, generation.stats.stop_reason)
            self.query_one(StatusLine).show_reply(generation.stats, self.chat.context_used)
            self.mark_dropped_turns(self.chat.dropped_turns)
            if message.error is not None:
                self.notice(message.error, error=True)
        self.streaming = False
        await self.run_pending()

    def mark_dropped_turns(self, dropped_turns: int) -> None:
        """Grey out the turns the context policy dropped, and say so."""
        if not dropped_turns:
            return
        in_context = self.query(".message").exclude(".dropped")
        for message in list(in_context)[: 2 * dropped_turns]:
            message.add_class("dropped")
        self.notice(dropped_turns_notice(dropped_turns))

    # -- slash commands ---------------------------------------------------------------------------

    def show_help(self, command: SlashCommand, argument: str) -> None:
        width = max(len(c.usage) for c in COMMANDS.values())
        lines = [f"{c.usage:<{width}}  {c.summary}" for c in COMMANDS.values()]
        lines += [""] + [f"{key:<{width}}  {meaning}" for key, meaning in KEYS_HELP]
        self.notice("\n".join(lines))

    async def clear_conversation(self, command: SlashCommand, argument: str) -> None:
        self.chat.clear()
        await self.query_one("#conversation").remove_children()
        self.query_one(StatusLine).context_used = 0
        self.notice("New conversation.")

    def regenerate(self, command: SlashCommand, argument: str) -> None:
        try:
            pieces = self.chat.regenerate()
        except MinferError as exc:
            raise CommandError(str(exc)) from None
        replaced = self.query_one("#conversation").query(AssistantMessage).last()
        replaced.display = False  # until the new reply has begun: a refused one leaves the old in place
        self.start_reply(pieces, replaced=replaced)

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
        path = parse_path(command, argument, action="save to", kind=".json for JSON, else Markdown")
        try:
            self.chat.save(path)
        except (OSError, ValueError) as exc:  # no such folder, no permission, a folder, disk full; a NUL byte
            raise file_error("save to", path, exc) from None
        self.notice(f"Saved {len(self.chat.messages)} messages to {path}.")

    async def load_conversation(self, command: SlashCommand, argument: str) -> None:
        """Replace the conversation with one `/save` wrote as JSON, settings included, and show it."""
        path = parse_path(command, argument, action="load", kind="a .json file that /save wrote")
        saved = read_saved_chat(path, self.chat.engine)  # every check, before anything changes
        apply_saved_chat(self.chat, saved)
        conversation = self.query_one("#conversation")
        await conversation.remove_children()
        self.query_one(StatusLine).context_used = 0
        if saved.system is not None:
            self.notice(f"System prompt: {saved.system}")
        await conversation.mount_all(
            UserMessage(turn["content"]) if turn["role"] == "user" else AssistantMessage(turn["content"])
            for turn in saved.turns
        )
        self.notice(
            f"Loaded {len(saved.messages)} messages from {path}, with their settings (/stats shows them). "
            "The next message reads the conversation into the model."
        )

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
