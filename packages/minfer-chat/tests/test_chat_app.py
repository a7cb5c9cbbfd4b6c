"""minfer-chat driven through textual's pilot on a real engine: loading, replies, Esc, multi-turn, input."""

from __future__ import annotations

import pytest
from chat_steps import (
    GREEDY,
    TERMINAL_SIZE,
    PieceWatcher,
    chat_app,
    enter,
    notices,
    replies,
    run_async,
    submit,
    type_text,
    user_messages,
    wait_until_idle,
    wait_until_loaded,
)
from textual.widgets import Markdown

import minfer
from minfer_chat.widgets import LoadingPanel, ModelHeader, PromptInput, StatusLine

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
        for fact in (info.name, "llama", "Q8_0 ×16, F32 ×5", "cpu", "CPU (numpy)"):
            assert fact in header
        assert app.query_one(PromptInput).has_focus


@run_async
async def test_missing_model_exits_with_its_one_line_error(tmp_path):
    app = chat_app(tmp_path / "missing.gguf")
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_idle(pilot)
    assert app.return_code == 1
    assert app.load_error == f"{tmp_path / 'missing.gguf'}: no such file"


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
        assert len(streamed) > 1 and "".join(streamed) == expected
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
        assert f"context {app.chat.context_used}/512 · cpu" in str(status.render())


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

        # Sending while a reply streams is refused, and the text stays in the box.
        await enter(pilot, "more")
        assert "press Esc to stop it" in notices(app, errors_only=True)[-1]
        assert app.query_one(PromptInput).text == "more"

        await pilot.press("escape")
        await wait_until_idle(pilot)
        assert not app.streaming
        stats = app.chat.last.stats
        assert stats.stop_reason == "cancelled" and 0 < stats.generated_tokens < LONG_REPLY
        [reply] = replies(app)
        assert reply.text == app.chat.messages[-1]["content"] == app.chat.last.text != ""
        assert reply.border_subtitle == "stopped"


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
        # As after a reply cut by the length limit: only the new turn and the one token sampled but not run.
        new_turn = new_turn_tokens(app.chat.engine, stopped_turn, app.chat.messages[:3])
        assert app.chat.last.stats.prompt_tokens == len(new_turn) + 1


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
async def test_message_too_long_for_the_context_is_refused_inline(tiny_model):
    app = chat_app(tiny_model, ctx_size=64, max_tokens=40)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "a rather long message " * 4)
        assert "does not fit the context size 64" in notices(app, errors_only=True)[-1]
        assert app.chat.messages == [] and user_messages(app) == [] and replies(app) == []
        await submit(pilot, "short")  # the app carries on
        assert len(replies(app)) == 1


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
