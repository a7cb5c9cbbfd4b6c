"""Slash commands: parsed on their own, then run in the app on a real engine."""

from __future__ import annotations

import json
import sys

import pytest
from chat_steps import (
    GREEDY,
    TERMINAL_SIZE,
    chat_app,
    notices,
    replies,
    run_async,
    submit,
    user_messages,
    wait_until_loaded,
)

from minfer import SamplingParams
from minfer_chat.commands import COMMANDS, CommandError, parse_command, updated_sampling

pytestmark = pytest.mark.timeout(120)


# -- parsing, without the app -----------------------------------------------------------------------


def test_parse_splits_name_and_argument():
    command, argument = parse_command("/system   You are terse.  ")
    assert command is COMMANDS["system"] and argument == "You are terse."
    assert parse_command("/clear") == (COMMANDS["clear"], "")
    assert parse_command("/system Two\nlines") == (COMMANDS["system"], "Two\nlines")


@pytest.mark.parametrize("text", ["/", "/nope", "/Temp 1"])
def test_unknown_commands_are_errors(text):
    with pytest.raises(CommandError, match=r"unknown command .*: /help lists the commands"):
        parse_command(text)


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [("/temp 0.3", "temperature", 0.3), ("/top-p 0.5", "top_p", 0.5), ("/top-k 7", "top_k", 7),
     ("/min-p 0.1", "min_p", 0.1), ("/min-p 0", "min_p", 0.0), ("/repeat-penalty 1.1", "repeat_penalty", 1.1),
     ("/seed 42", "seed", 42), ("/seed off", "seed", None), ("/seed -1", "seed", None)],
)  # fmt: skip
def test_sampling_commands_change_one_field(text, field, value):
    before = SamplingParams(seed=1)
    after = updated_sampling(before, *parse_command(text))
    assert getattr(after, field) == value
    assert {k: v for k, v in vars(after).items() if k != field} == {k: v for k, v in vars(before).items() if k != field}


# -- in the app ---------------------------------------------------------------------------------------


@run_async
async def test_help_lists_every_command(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "/help")
        for command in COMMANDS.values():
            assert command.usage in notices(app)[-1]


@run_async
async def test_clear_starts_a_new_conversation(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "Hello")
        await submit(pilot, "/clear")
        assert app.chat.messages == [] and app.chat.context_used == 0
        assert user_messages(app) == [] and replies(app) == []
        assert notices(app) == ["New conversation."]

        await submit(pilot, "Again")
        assert app.chat.messages[0]["content"] == "Again" and len(replies(app)) == 1


@run_async
async def test_regen_replaces_the_last_reply(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "/regen")
        assert "nothing to regenerate" in notices(app, errors_only=True)[-1]

        await submit(pilot, "Hello")
        first = app.chat.last
        await submit(pilot, "/regen")
        assert app.chat.last is not first
        assert app.chat.last.text == first.text  # greedy: the same reply again
        assert [m["role"] for m in app.chat.messages] == ["user", "assistant"]
        assert [reply.text for reply in replies(app)] == [app.chat.last.text]


@run_async
async def test_system_prompt_is_set_and_removed(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "/system You answer in French.")
        assert app.chat.system == "You answer in French."
        await submit(pilot, "Hello")
        assert app.chat.messages[0] == {"role": "system", "content": "You answer in French."}
        engine = app.chat.engine
        prompt = engine.tokenizer.encode(engine.template.render(app.chat.messages[:2], add_generation_prompt=True))
        assert app.chat.last.stats.prompt_tokens == len(prompt)  # the first reply reads the system prompt too

        await submit(pilot, "/system")
        assert app.chat.system is None
        assert app.chat.messages[0]["role"] == "user"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("/temp 9x", "/temp X: '9x' is not a number"),
        ("/temp -1", "invalid sampling parameter temperature=-1.0"),
        ("/temp", "/temp X: give a value (now 0)"),
        ("/top-p 2", "invalid sampling parameter top_p=2.0"),
        ("/top-k 1.5", "/top-k N: '1.5' is not a whole number"),
        ("/min-p 1", "/min-p X: invalid sampling parameter min_p=1.0"),
        ("/min-p lots", "/min-p X: 'lots' is not a number"),
        ("/min-p", "/min-p X: give a value (now 0.05)"),
        ("/repeat-penalty 0", "/repeat-penalty X: invalid sampling parameter repeat_penalty=0.0"),
        ("/repeat-penalty nan", "invalid sampling parameter repeat_penalty=nan: not a finite number"),
        ("/seed soon", "/seed N: not an integer: 'soon'"),
        ("/seed -2", "/seed N: must be -1 (a random seed) or zero or a positive integer, got '-2'"),
        ("/max-tokens 0", "/max-tokens N: must be between 1 and 511"),
        ("/max-tokens lots", "/max-tokens N: 'lots' is not a whole number"),
        ("/max-tokens", "/max-tokens N: give a value (now 12)"),
        ("/save", "/save PATH: give a file name"),
        ("/load", "/load PATH: give a file name (a .json file that /save wrote)"),
        ("/save ~no-such-user-x/chat.md", "cannot save to '~no-such-user-x/chat.md': no home directory for '~no-such"),
        ("/frobnicate now", "unknown command /frobnicate: /help lists the commands"),
        ("/\x1b[2Jclear", "unknown command /[2Jclear: /help lists the commands"),  # the escape is not played
    ],
)
@run_async
async def test_bad_commands_show_an_inline_error_and_change_nothing(tiny_model, text, error):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, text)
        [shown] = notices(app, errors_only=True)
        assert error in shown
        assert (app.chat.sampling, app.chat.max_tokens) == (GREEDY, 12)
        await submit(pilot, "Still here?")  # the app carries on
        assert len(replies(app)) == 1


@run_async
async def test_settings_commands_apply_to_the_next_reply(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        for command in ("/temp 0.7", "/top-p 0.9", "/top-k 5", "/min-p 0.1", "/repeat-penalty 1.3", "/seed 3",
                        "/max-tokens 5"):  # fmt: skip
            await submit(pilot, command)
        assert app.chat.sampling == SamplingParams(
            temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, repeat_penalty=1.3, seed=3
        )
        assert notices(app)[-4:-1] == ["min_p = 0.1", "repeat_penalty = 1.3", "seed = 3"]
        assert notices(app, errors_only=True) == []
        await submit(pilot, "Hello")
        assert app.chat.last.stats.generated_tokens <= 5


@run_async
async def test_save_writes_both_turns_as_markdown_or_json(tiny_model, tmp_path):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "First question")
        await submit(pilot, "Second question")
        await submit(pilot, f"/save {tmp_path / 'chat.md'}")
        await submit(pilot, f"/save {tmp_path / 'chat.json'}")
        await submit(pilot, f"/save {tmp_path / 'missing-folder' / 'chat.md'}")

        replies_text = [m["content"] for m in app.chat.messages if m["role"] == "assistant"]
        markdown = (tmp_path / "chat.md").read_text(encoding="utf-8")
        for text in ("## User\n\nFirst question", "## User\n\nSecond question", *replies_text):
            assert text in markdown
        assert json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))["messages"] == app.chat.messages
        assert notices(app)[-3] == f"Saved 4 messages to {tmp_path / 'chat.md'}."
        assert "cannot save to" in notices(app, errors_only=True)[-1]


@run_async
async def test_seed_minus_one_means_a_fresh_seed_for_every_reply(tiny_model):
    app = chat_app(tiny_model, sampling=SamplingParams(temperature=1.0, seed=3))
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "/seed -1")
        assert app.chat.sampling == SamplingParams(temperature=1.0, seed=None)
        assert notices(app)[-1] == "seed = None" and notices(app, errors_only=True) == []
        await submit(pilot, "Hello")  # the reply that a seed of -1 used to end the app on
        # A random seed may draw the end of the turn first: the reply ran either way, and the app lives on.
        assert len(replies(app)) == 1 and app.chat.last.stats.stop_reason in ("eos", "length")


# Paths /save cannot write to, and the reason the app gives: Python's own for a NUL byte, the OS's for the rest.
UNWRITABLE = {
    "a NUL byte": (lambda folder: f"{folder}/a\x00b.md", "embedded null byte"),
    "a missing folder": (lambda folder: f"{folder}/missing/chat.md", "No such file or directory"),
    "a folder": (lambda folder: str(folder), "Is a directory"),
    "a file as a folder": (lambda folder: f"{folder}/chat.md/again.md", "Not a directory"),
    "a name too long": (lambda folder: f"{folder}/{'x' * 300}.md", "File name too long"),
    "no permission": (lambda folder: "/sys/minfer-chat.md", "Permission denied"),  # sysfs: even for root
    "a full disk": (lambda folder: "/dev/full", "No space left on device"),
}


@pytest.mark.skipif(sys.platform != "linux", reason="/sys and /dev/full, which give these errors for real, are Linux's")
@pytest.mark.parametrize("case", UNWRITABLE)
@run_async
async def test_save_errors_are_reported_and_the_conversation_stays(tiny_model, tmp_path, case):
    path_in, reason = UNWRITABLE[case]
    path = path_in(tmp_path)
    (tmp_path / "chat.md").write_text("a file, not a folder")
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "First question")
        conversation = app.chat.messages
        await submit(pilot, f"/save {path}")
        [shown] = notices(app, errors_only=True)
        assert shown == f"cannot save to {path!r}: {reason}"
        assert app.chat.messages == conversation and len(replies(app)) == 1
        await submit(pilot, "Second question")  # the app carries on with the same conversation
        assert app.chat.messages[:2] == conversation and len(replies(app)) == 2
        await submit(pilot, f"/save {tmp_path / 'saved.json'}")
        assert json.loads((tmp_path / "saved.json").read_text(encoding="utf-8"))["messages"] == app.chat.messages


@run_async
async def test_stats_shows_the_last_reply(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "Hello")
        await submit(pilot, "/stats")
        stats = app.chat.last.stats
        shown = notices(app)[-1]
        assert f"{stats.prompt_tokens} tokens prefilled" in shown
        assert f"{stats.generated_tokens} tokens in" in shown and "ended by length" in shown
        assert f"context     {app.chat.context_used}/512 tokens" in shown


@run_async
async def test_quit_leaves_the_app(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "/quit")
        assert not app.is_running
    assert app.return_code == 0
