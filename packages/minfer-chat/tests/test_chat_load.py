"""`/load`: a conversation saved by `/save NAME.json` read back and continued; every bad file a one-line error."""

from __future__ import annotations

import json
import os

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
from minfer_chat.saved_chat import SavedChatError, parse_saved_chat

pytestmark = pytest.mark.timeout(120)

EXCHANGE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


def saved(messages: object = EXCHANGE, **fields: object) -> str:
    return json.dumps({"messages": messages, **fields})


# -- the file, without the app ------------------------------------------------------------------------


def test_what_save_writes_is_read_back():
    sampling = SamplingParams(temperature=0.3, seed=7)
    chat = parse_saved_chat(
        saved([{"role": "system", "content": "Be brief."}, *EXCHANGE], sampling=vars(sampling), max_tokens=32)
    )
    assert (chat.system, chat.turns, chat.sampling, chat.max_tokens) == ("Be brief.", EXCHANGE, sampling, 32)
    assert chat.messages == [{"role": "system", "content": "Be brief."}, *EXCHANGE]


def test_settings_are_optional_and_an_empty_conversation_is_one():
    chat = parse_saved_chat(saved([]))
    assert (chat.system, chat.turns, chat.sampling, chat.max_tokens) == (None, [], None, None)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "not JSON (Expecting value at line 1 column 1)"),
        ('{"messages": [}', "not JSON (Expecting value at line 1 column 15)"),
        ("[" * 100_000, "not JSON that can be read (nested too deeply)"),
        ("[]", "expected a JSON object with a list of messages, got a list"),
        ("null", "expected a JSON object with a list of messages, got null"),
        ("{}", 'no "messages": not a conversation saved by /save'),
        (saved(model="x"), "unknown key 'model' (a saved conversation has messages, sampling, max_tokens)"),
        (saved({"role": "user"}), '"messages" must be a list, got an object'),
        (saved(["Hi"]), "message 1 must be an object with a role and a content, got a string"),
        (saved([{"content": "Hi"}]), "message 1 needs a text role, got nothing"),
        (saved([{"role": "user", "content": 3}]), "message 1 needs a text content, got a number"),
        (saved([{"role": "user", "content": None}]), "message 1 needs a text content, got null"),
        (saved([{"role": "user", "content": "Hi", "name": "me"}]), "message 1 has an unknown key 'name'"),
        (saved([{"role": "tool", "content": "{}"}]),
         "message 1 has the role 'tool': expected system, user or assistant"),
        (saved([*EXCHANGE, {"role": "system", "content": "Be brief."}]),
         "message 3 is a system message: only the first message may be a system message"),
        (saved(EXCHANGE[::-1]), "message 1 is an assistant message: user and assistant messages take turns"),
        (saved([EXCHANGE[0], *EXCHANGE]), "message 2 is a user message: user and assistant messages take turns"),
        (saved([{"role": "system", "content": "Be brief."}, EXCHANGE[1]]), "message 2 is an assistant message"),
        (saved(EXCHANGE[:1]), "the last message is the user's, with no reply: a saved conversation ends with a reply"),
        (saved(sampling=[0.8]), '"sampling" must be an object, got a list'),
        (saved(sampling={"temp": 0.8}), "unknown sampling parameter 'temp' (known: temperature, top_k, "),
        (saved(sampling={"top_p": 3}), "invalid sampling parameter top_p=3"),
        (saved(sampling={"top_k": 4.5}), "invalid sampling parameter top_k=4.5: not an integer"),
        (saved(max_tokens="lots"), '"max_tokens" must be a whole number of at least 1, got "lots"'),
        (saved(max_tokens=0), '"max_tokens" must be a whole number of at least 1, got 0'),
        (saved(max_tokens=True), '"max_tokens" must be a whole number of at least 1, got true'),
    ],
)  # fmt: skip
def test_files_of_another_shape_are_refused_saying_what_is_wrong(text, error):
    with pytest.raises(SavedChatError) as refused:
        parse_saved_chat(text)
    assert str(refused.value).startswith(error)
    assert "\n" not in str(refused.value)


# -- in the app ---------------------------------------------------------------------------------------


@run_async
async def test_a_saved_conversation_is_loaded_with_its_settings_and_continued(tiny_model, tmp_path):
    path = tmp_path / "chat.json"
    first = chat_app(tiny_model, system="Be brief.", sampling=SamplingParams(temperature=0.8, seed=5), max_tokens=10)
    async with first.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "First question")
        await submit(pilot, "Second question")
        await submit(pilot, f"/save {path}")
        conversation = first.chat.messages

    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, f"/load {path}")
        assert notices(app, errors_only=True) == []
        assert app.chat.messages == conversation and app.chat.system == "Be brief."
        assert (app.chat.sampling, app.chat.max_tokens) == (SamplingParams(temperature=0.8, seed=5), 10)
        assert user_messages(app) == ["First question", "Second question"]
        assert [reply.text for reply in replies(app)] == [
            m["content"] for m in conversation if m["role"] == "assistant"
        ]
        assert notices(app)[0] == "System prompt: Be brief."
        assert notices(app)[-1].startswith(f"Loaded 5 messages from {path}, with their settings")

        await submit(pilot, "Third question")
        assert app.chat.messages[:5] == conversation and app.chat.messages[5]["content"] == "Third question"
        assert len(replies(app)) == 3 and replies(app)[-1].text == app.chat.last.text
        # The model had seen none of it: the whole conversation was read, with the new message.
        engine = app.chat.engine
        prompt = engine.template.render(app.chat.messages[:6], add_generation_prompt=True)
        assert app.chat.last.stats.prompt_tokens == len(engine.tokenizer.encode(prompt))

        # Loading again replaces what is on screen.
        await submit(pilot, f"/load {path}")
        assert app.chat.messages == conversation and user_messages(app) == ["First question", "Second question"]
        assert len(replies(app)) == 2 and notices(app, errors_only=True) == []


def long_conversation(folder):
    path = folder / "long.json"
    path.write_text(saved([{"role": "user", "content": "word " * 200}, EXCHANGE[1]]))
    return str(path)


def huge_conversation(folder):
    path = folder / "huge.json"
    path.write_text(saved([{"role": "user", "content": "x" * 1_000_000}, EXCHANGE[1]]))
    return str(path)


def written(name, content):
    def write(folder):
        path = folder / name
        path.write_bytes(content)
        return str(path)

    return write


# Files /load refuses, with what the app says after "cannot load 'PATH': " (or part of it).
BAD_FILES = {
    "missing": (lambda folder: str(folder / "missing.json"), "No such file or directory"),
    "a folder": (lambda folder: str(folder), "Is a directory"),
    "not UTF-8": (written("latin1.json", b'{"messages": "caf\xe9"}'), "not UTF-8 text"),
    "not JSON": (written("chat.md", b"## User\n\nHi\n"), "not JSON (Expecting value at line 1 column 1)"),
    "the wrong shape": (written("list.json", b"[]"), "expected a JSON object with a list of messages"),
    "another role": (
        written("tool.json", saved([{"role": "tool", "content": "{}"}]).encode()),
        "message 1 has the role 'tool'",
    ),
    "too long": (long_conversation, " tokens with the template, more than the context holds (128)"),
    "far too long": (huge_conversation, "the conversation is at least "),
    "too large a reply budget": (
        written("budget.json", saved(max_tokens=128).encode()),
        "max_tokens 128 leaves no room for the conversation in the context (128 tokens)",
    ),
}


@pytest.mark.parametrize("case", BAD_FILES)
@run_async
async def test_bad_files_are_one_line_errors_and_the_conversation_stays(tiny_model, tmp_path, case):
    make_path, reason = BAD_FILES[case]
    path = make_path(tmp_path)
    app = chat_app(tiny_model, ctx_size=128)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "First question")
        conversation, shown = app.chat.messages, [reply.text for reply in replies(app)]
        await submit(pilot, f"/load {path}")
        [error] = notices(app, errors_only=True)
        assert error.startswith(f"cannot load {path!r}: ") and reason in error and "\n" not in error
        assert (app.chat.messages, app.chat.sampling, app.chat.max_tokens) == (conversation, GREEDY, 12)
        assert user_messages(app) == ["First question"] and [reply.text for reply in replies(app)] == shown
        await submit(pilot, "Second question")  # the app carries on with the same conversation
        assert app.chat.messages[:2] == conversation and len(replies(app)) == 2


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="an endless file: /dev/zero")
@run_async
async def test_an_endless_file_is_refused_without_filling_the_memory(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "/load /dev/zero")
        assert notices(app, errors_only=True) == [
            "cannot load '/dev/zero': larger than 64 MiB, more than any context holds"
        ]


@run_async
async def test_load_path_errors_are_one_line(tiny_model):
    app = chat_app(tiny_model)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        await submit(pilot, "/load ~no-such-user-x/chat.json")
        await submit(pilot, "/load nul\x00.json")
        assert notices(app, errors_only=True) == [
            "cannot load '~no-such-user-x/chat.json': no home directory for '~no-such-user-x'",
            "cannot load 'nul\\x00.json': embedded null byte",
        ]
