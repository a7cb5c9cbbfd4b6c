"""minfer-chat driven through textual's pilot on a real engine: loading, replies, Esc, multi-turn, input."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from chat_steps import (
    GREEDY,
    TERMINAL_SIZE,
    PieceWatcher,
    chat_app,
    enter,
    enter_while_streaming,
    notices,
    queued,
    replies,
    run_async,
    submit,
    type_text,
    user_messages,
    wait_for,
    wait_until_idle,
    wait_until_loaded,
)
from textual.widgets import Markdown, ProgressBar

import minfer
from minfer import SamplingParams
from minfer.errors import ContextOverflowError
from minfer_chat.app import dropped_turns_notice
from minfer_chat.widgets import AssistantMessage, LoadingPanel, ModelHeader, PromptInput, StatusLine

pytestmark = pytest.mark.timeout(120)

# Tokens: a reply this long takes minutes, far longer than any test waits before pressing Esc.
LONG_REPLY = 32000


@run_async
async def test_loading_shows_progress_then_the_model_in_the_header(tiny_model, monkeypatch):
    progress: list[tuple[int, int]] = []
    show_progress = LoadingPanel.show_progress

    def recording_show_progress(panel: LoadingPanel, done_bytes: int, total_bytes: int) -> None:
        progress.append((done_bytes, total_bytes))
        show_progress(panel, done_bytes, total_bytes)

    monkeypatch.setattr(LoadingPanel, "show_progress", recording_show_progress)
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        assert len(progress) > 1 and progress[-1][0] == progress[-1][1] > 0
        assert not app.query(LoadingPanel)
        header = str(app.query_one(ModelHeader).content)
        info = app.chat.engine.info
        for fact in (info.name, "llama", "Q8_0 ×16, F32 ×5", "cpu", "CPU (numpy)", f"{info.threads} thread"):
            assert fact in header
        assert app.query_one(PromptInput).has_focus


@run_async
async def test_threads_reach_the_engine_and_the_screen(tiny_model):
    app = chat_app(tiny_model, threads=1)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        assert app.chat.engine.threads == 1
        assert str(app.query_one(ModelHeader).content).endswith("cpu on CPU (numpy), 1 thread")
        assert "· cpu, 1 thread" in str(app.query_one(StatusLine).render())


@run_async
async def test_the_cache_type_reaches_the_engine(tiny_model):
    app = chat_app(tiny_model, cache_type="f16")
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        assert app.chat.engine.info.cache_type == "f16"
        await submit(pilot, "Hello")
        assert app.session.last.stats.generated_tokens > 0


@run_async
async def test_closing_while_the_weights_load_stops_loading_them(tiny_model, monkeypatch):
    steps = 10_000  # a load of ten seconds or more
    reached: list[int] = []
    finished = threading.Event()

    def slow_load(model: object, *, progress: Callable[[int, int], None], **options: object) -> minfer.Engine:
        done = 0
        try:
            for done in range(1, steps + 1):
                progress(done, steps)  # where the app stops the load once it is closing
                time.sleep(0.001)
        finally:
            reached.append(done)
            finished.set()
        raise AssertionError("the load was not stopped")

    monkeypatch.setattr(minfer, "load", slow_load)
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_for(pilot, lambda: app.query_one(LoadingPanel).query_one(ProgressBar).progress > 0)
        app.exit()
    assert await asyncio.to_thread(finished.wait, 5)
    assert reached[0] < steps and app.load_error is None


@run_async
async def test_missing_model_exits_with_its_one_line_error(tmp_path):
    app = chat_app(tmp_path / "missing.gguf")
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_idle(pilot)
    assert app.return_code == 1
    assert app.load_error == f"{tmp_path / 'missing.gguf'}: no such file"


@run_async
async def test_the_chat_template_given_is_the_one_the_conversation_uses(tiny_model, tmp_path):
    template = tmp_path / "brackets.jinja"
    template.write_text("{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}")
    app = chat_app(tiny_model, chat_template=template)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        assert app.session.engine.template.provenance == f"{template} (--chat-template)"
        await submit(pilot, "Hello")
        tokenizer = app.session.engine.tokenizer
        assert app.session.last.stats.prompt_tokens == len(tokenizer.encode("[user] Hello\n"))


@run_async
async def test_a_chat_template_that_does_not_compile_exits_with_its_one_line_error(tiny_model, tmp_path):
    template = tmp_path / "broken.jinja"
    template.write_text("{% for message in messages %}")
    app = chat_app(tiny_model, chat_template=template)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_idle(pilot)
    assert app.return_code == 1
    assert app.load_error.startswith(f"{template}: chat template does not compile: Unexpected end of template.")


@run_async
async def test_reply_budget_must_leave_room_in_the_context(tiny_model):
    app = chat_app(tiny_model, max_tokens=512)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_idle(pilot)
    assert app.return_code == 1
    assert app.load_error.startswith("--max-tokens 512 leaves no room for the conversation in the context (512 tokens)")


@run_async
async def test_reply_streams_piece_by_piece_then_shows_as_markdown(tiny_model, monkeypatch):
    streamed = PieceWatcher(monkeypatch).pieces
    app = chat_app(tiny_model, max_tokens=12)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await type_text(pilot, "Hello there")
        await pilot.press("enter")
        await wait_until_idle(pilot)

        # What the engine says to the same message, outside the app.
        expected = "".join(
            minfer.load(tiny_model, backend="cpu").chat(sampling=GREEDY, max_tokens=12).send("Hello there")
        )
        # Shown as it came: one piece at a time, or several at once when the screen was busy.
        assert streamed and "".join(streamed) == expected
        assert user_messages(app) == ["Hello there"]
        [reply] = replies(app)
        assert reply.text == expected and len(reply.query(Markdown)) == 1
        assert app.chat.messages == [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": expected},
        ]
        assert app.query_one(PromptInput).text == ""


@run_async
async def test_status_line_shows_speeds_context_and_backend(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        status = app.query_one(StatusLine)
        assert status.prompt_speed is None and status.context_used == 0
        await submit(pilot, "Hi")
        assert status.prompt_speed > 0 and status.generation_speed > 0
        assert (status.context_used, status.ctx_size) == (app.chat.context_used, 512)
        assert f"context {app.chat.context_used}/512 · cpu, " in str(status.render())


@run_async
async def test_status_line_shows_the_speed_while_the_reply_streams(long_context_model, monkeypatch):
    pieces = PieceWatcher(monkeypatch)
    app = chat_app(long_context_model, ctx_size=32768, max_tokens=LONG_REPLY)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        status = app.query_one(StatusLine)
        await enter(pilot, "Tell me everything")
        await pieces.wait_for_first()
        await wait_for(pilot, lambda: status.generation_speed is not None)
        assert app.streaming and app.chat.last.stats.stop_reason == "cancelled"  # still generating
        assert status.generation_speed > 0 and status.prompt_speed > 0
        line = str(status.render())
        assert f"generation {status.generation_speed:.1f} tok/s" in line and line.endswith("  Esc stops")
        await pilot.press("escape")
        await wait_until_idle(pilot)
        assert status.generation_speed == app.chat.last.stats.generation_tokens_per_second  # the engine's own


@run_async
async def test_the_generation_thread_never_waits_for_the_screen(tiny_model, monkeypatch):
    """The UI thread is held on the first piece until the engine has finished the reply: a worker that waited
    for the UI to take each piece (and had the wait counted in its speed) would be stuck at that piece."""
    app = chat_app(tiny_model, max_tokens=12)
    show_piece = AssistantMessage.append
    held_until: list[str] = []

    def held_append(message: AssistantMessage, piece: str) -> None:
        if not held_until:
            stats, deadline = app.chat.last.stats, time.monotonic() + 10
            while stats.stop_reason == "cancelled" and time.monotonic() < deadline:  # set when the loop ends
                time.sleep(0.001)
            held_until.append(stats.stop_reason)
        show_piece(message, piece)

    monkeypatch.setattr(AssistantMessage, "append", held_append)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "The first message")
        assert held_until == ["length"]  # all 12 tokens came while the screen took none
        [reply] = replies(app)
        assert reply.text == app.chat.last.text != ""


@run_async
async def test_status_line_fits_50_columns(long_context_model, monkeypatch):
    pieces = PieceWatcher(monkeypatch)
    app = chat_app(long_context_model, ctx_size=32768, max_tokens=LONG_REPLY)
    async with app.run_test(size=(50, 24)) as pilot:
        await wait_until_loaded(pilot)
        status = app.query_one(StatusLine)
        assert status.content_size.width == 48  # 50 less the padding

        def shown() -> str:
            line = status.render()
            assert line.cell_length <= status.content_size.width  # one line: nothing cut, nothing wrapped
            return str(line)

        threads = app.chat.engine.threads
        assert shown() == f"prompt – · gen – · ctx 0/32768 · cpu ×{threads}"
        await enter(pilot, "Tell me everything")
        await pieces.wait_for_first()
        await wait_for(pilot, lambda: status.generation_speed is not None)
        # While a reply streams: its live speed, the context and how to stop it.
        assert shown().startswith("gen ") and " t/s · ctx 0/32768" in shown() and shown().endswith("  Esc stops")
        await pilot.press("escape")
        await wait_until_idle(pilot)
        assert shown().startswith("prompt ") and f" t/s · ctx {app.chat.context_used}/32768" in shown()


def new_turn_tokens(engine: minfer.Engine, before: list[dict[str, str]], after: list[dict[str, str]]) -> list[int]:
    """The tokens a new turn adds, from the template and tokenizer alone.

    `before` ends with a reply, `after` with the next user message: render both, and the text
    that `after`'s prompt adds to `before`'s prompt and reply is the new turn.
    """
    previous = engine.template.render(before[:-1], add_generation_prompt=True) + before[-1]["content"]
    prompt = engine.template.render(after, add_generation_prompt=True)
    assert prompt.startswith(previous)
    return engine.tokenizer.encode(prompt[len(previous) :], add_bos=False)


@run_async
async def test_second_turn_prefills_only_its_own_tokens(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "The first message")
        first_turn, first_stop = app.chat.messages, app.chat.last.stats.stop_reason
        await submit(pilot, "And a second one")

        new_turn = new_turn_tokens(app.chat.engine, first_turn, app.chat.messages[:3])
        # The cache holds every token the model has run. The first reply ended at the length limit, so
        # its last token was sampled but never run: it is prefilled along with the new turn.
        assert first_stop == "length"
        assert app.chat.last.stats.prompt_tokens == len(new_turn) + 1
        assert app.chat.context_used > 2 * len(new_turn)  # the first turn was not prefilled again


@run_async
async def test_escape_stops_the_reply_and_keeps_its_text(long_context_model, monkeypatch):
    pieces = PieceWatcher(monkeypatch)
    app = chat_app(long_context_model, ctx_size=32768, max_tokens=LONG_REPLY)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await type_text(pilot, "Tell me everything")
        await pilot.press("enter")
        await pieces.wait_for_first()
        assert app.streaming

        await pilot.press("escape")
        await wait_until_idle(pilot)
        assert not app.streaming
        stats = app.chat.last.stats
        assert stats.stop_reason == "cancelled" and 0 < stats.generated_tokens < LONG_REPLY
        [reply] = replies(app)
        assert reply.text == app.chat.messages[-1]["content"] == app.chat.last.text != ""
        assert reply.border_subtitle == "stopped"


@run_async
async def test_entries_typed_while_a_reply_streams_wait_their_turn_in_order(long_context_model, monkeypatch):
    pieces = PieceWatcher(monkeypatch)
    app = chat_app(long_context_model, ctx_size=32768, max_tokens=LONG_REPLY)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await enter(pilot, "Go on")
        await pieces.wait_for_first()

        # Each Enter is one entry, and the box is empty for the next: nothing is added to what waits.
        entries = ["/max-tokens 4", "/top-k 40", "/top-k 30", "/temp 0.5", "What next?\nTell me."]
        for entry in entries:
            await enter_while_streaming(pilot, entry)
        await enter_while_streaming(pilot, "/help")  # it touches nothing: it runs at once
        await wait_for(pilot, lambda: "/load PATH" in notices(app)[-1])
        assert app.streaming and list(app.pending) == entries
        assert queued(app) == ["queued /max-tokens 4", "queued /top-k 40", "queued /top-k 30", "… and 2 more"]

        await pilot.press("escape")
        await wait_until_idle(pilot)
        assert queued(app) == [] and not app.pending
        assert notices(app, errors_only=True) == []
        assert notices(app)[-4:] == ["max_tokens = 4", "top_k = 40", "top_k = 30", "temperature = 0.5"]
        assert user_messages(app) == ["Go on", "What next?\nTell me."]
        assert app.chat.sampling == SamplingParams(temperature=0.5, top_k=30)
        assert len(replies(app)) == 2 and app.chat.last.stats.generated_tokens <= 4


@run_async
async def test_enter_empties_the_box_at_once(tiny_model):
    app = chat_app(tiny_model, max_tokens=2)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        box = app.query_one(PromptInput)
        # Typed key by key, as a user would: the command, then the question right after it.
        await type_text(pilot, "/temp 0")
        await pilot.press("enter")
        assert box.text == ""
        await type_text(pilot, "What is 2+2?")
        await pilot.press("enter")
        await wait_until_idle(pilot)
        assert app.chat.sampling.temperature == 0 and notices(app, errors_only=True) == []
        assert user_messages(app) == ["What is 2+2?"] and len(replies(app)) == 1
        await pilot.press("enter")  # an empty box sends nothing
        await wait_until_idle(pilot)
        assert len(replies(app)) == 1 and notices(app, errors_only=True) == []


@run_async
async def test_quit_while_a_reply_streams_stops_it(long_context_model, monkeypatch):
    pieces = PieceWatcher(monkeypatch)
    app = chat_app(long_context_model, ctx_size=32768, max_tokens=LONG_REPLY)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await enter(pilot, "Go on")
        await pieces.wait_for_first()
        await enter(pilot, "/quit")
        await wait_until_idle(pilot)
        assert not app.is_running
    assert app.chat.last.stats.stop_reason == "cancelled"


@run_async
async def test_next_message_after_escape_reuses_the_cache(long_context_model, monkeypatch):
    pieces = PieceWatcher(monkeypatch)
    app = chat_app(long_context_model, ctx_size=32768, max_tokens=LONG_REPLY)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await enter(pilot, "Go on")
        await pieces.wait_for_first()
        await pilot.press("escape")
        await wait_until_idle(pilot)
        stopped_turn = app.chat.messages

        app.chat.max_tokens = 4
        await submit(pilot, "Thanks")
        assert len(replies(app)) == 2
        # Only the new turn runs, and the stopped reply's last pick unless the greedy steps of its chunk ran past
        # it already (Engine._greedy_picks): the cache keeps whatever of the conversation it holds.
        new_turn = new_turn_tokens(app.chat.engine, stopped_turn, app.chat.messages[:3])
        assert app.chat.last.stats.prompt_tokens in (len(new_turn), len(new_turn) + 1)


def test_dropped_turns_notice_agrees_with_its_count():
    assert dropped_turns_notice(1).startswith("The context is full: the oldest turn (greyed out) was dropped and")
    assert dropped_turns_notice(1).endswith("The model no longer sees it.")
    assert dropped_turns_notice(2).startswith("The context is full: the oldest 2 turns (greyed out) were dropped")
    assert dropped_turns_notice(2).endswith("The model no longer sees them.")


@run_async
async def test_full_context_drops_the_oldest_turns_with_a_notice(tiny_model):
    app = chat_app(tiny_model, ctx_size=96, max_tokens=24)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        for text in ("one", "two", "three", "four"):
            await submit(pilot, text)
        assert app.chat.context_used <= 96
        assert any("The context is full" in notice for notice in notices(app))
        assert "one" in [str(message.content) for message in app.query("UserMessage.dropped")]
        assert "one" not in [message["content"] for message in app.chat.messages]
        assert len(replies(app)) == 4  # dropped turns stay on screen, greyed out


@run_async
async def test_the_notice_counts_the_dropped_turns(tiny_model):
    app = chat_app(tiny_model, ctx_size=128, max_tokens=8)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        for text in ("one", "two", "three", "four", "five"):
            await submit(pilot, text)
        assert app.chat.dropped_turns == 1  # "five" needed the room of "one" and its reply
        assert notices(app)[-1] == dropped_turns_notice(1)

        await submit(pilot, "/max-tokens 60")  # the next reply needs the room of several turns
        await submit(pilot, "six")
        dropped = app.chat.dropped_turns
        assert dropped >= 2 and notices(app)[-1] == dropped_turns_notice(dropped)
        assert len(app.query("UserMessage.dropped")) == 1 + dropped


@run_async
async def test_message_too_long_for_the_context_stays_in_the_box(tiny_model):
    app = chat_app(tiny_model, ctx_size=64, max_tokens=40)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        too_long = "a rather long message " * 4
        await submit(pilot, too_long)
        [error] = notices(app, errors_only=True)
        assert error.startswith("Not sent: the message (") and "does not fit the context size 64" in error
        assert error.endswith("it is back in the message box.")
        assert app.chat.messages == [] and user_messages(app) == [] and replies(app) == []
        box = app.query_one(PromptInput)
        assert box.text == too_long.strip() and box.cursor_location == box.document.end

        box.clear()  # the user shortens it
        await submit(pilot, "short")  # the app carries on
        assert len(replies(app)) == 1


@run_async
async def test_message_refused_while_a_draft_is_typed_does_not_merge_with_it(tiny_model, monkeypatch):
    app = chat_app(tiny_model, ctx_size=64, max_tokens=40)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        box = app.query_one(PromptInput)
        send = app.chat.send

        def send_while_typing(text: str):
            box.insert("the next draft")  # typed between Enter and the session's answer
            return send(text)

        monkeypatch.setattr(app.chat, "send", send_while_typing)
        await submit(pilot, "a rather long message " * 4)
        assert box.text == "the next draft"
        assert notices(app, errors_only=True)[-1].endswith("Up brings it back from the history.")


def refused_when_asked(reason: str):
    """A stand-in for `ChatSession.send`/`regenerate` that refuses when the first piece is asked for, as a session
    planning the turn lazily (or an engine busy elsewhere) does."""

    def refuse(*args: object) -> Iterator[str]:
        raise ContextOverflowError(reason)
        yield  # a generator: nothing runs until the first piece is asked for

    return refuse


@run_async
async def test_message_refused_by_the_reply_worker_goes_back_to_the_box(tiny_model, monkeypatch):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "Hello")
        before = app.chat.messages
        monkeypatch.setattr(app.chat, "send", refused_when_asked("it does not fit"))
        await submit(pilot, "Too much")
        assert notices(app, errors_only=True) == ["Not sent: it does not fit; it is back in the message box."]
        assert app.query_one(PromptInput).text == "Too much"
        assert user_messages(app) == ["Hello"] and len(replies(app)) == 1 and app.chat.messages == before
        assert not app.streaming


@run_async
async def test_regen_refused_by_the_reply_worker_keeps_the_old_reply(tiny_model, monkeypatch):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "Hello")
        [old] = replies(app)
        monkeypatch.setattr(app.chat, "regenerate", refused_when_asked("it does not fit"))
        await submit(pilot, "/regen")
        assert notices(app, errors_only=True) == ["it does not fit"]
        assert replies(app) == [old] and old.display


@run_async
async def test_history_and_multiline_entry(tiny_model):
    app = chat_app(tiny_model, max_tokens=2)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "first")
        await type_text(pilot, "two\nlines")
        await pilot.press("enter")
        await wait_until_idle(pilot)
        assert app.chat.messages[2] == {"role": "user", "content": "two\nlines"}

        box = app.query_one(PromptInput)
        await type_text(pilot, "draft")
        await pilot.press("up")
        assert box.text == "two\nlines"
        await pilot.press("up", "up")  # the cursor leaves the second line first, then the history moves on
        assert box.text == "first"
        await pilot.press("down")
        assert box.text == "two\nlines"
        await pilot.press("down", "down")
        assert box.text == "draft"
