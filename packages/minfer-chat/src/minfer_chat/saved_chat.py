"""Reading back a conversation that `/save NAME.json` wrote (`ChatSession.to_json`), for `/load`.

The file holds `messages` (an optional system message first, then user and assistant messages in turn, ending
with a reply), `sampling` (the `SamplingParams` fields) and `max_tokens`. Everything is checked before the app
changes anything: a file that is missing, not JSON, of another shape, or too long for the context is a
`CommandError` naming the file and what is wrong, and the conversation on screen stays as it was.

The runtime has no call that builds a `ChatSession` from saved messages; the app sets the session's public
fields (`system`, `turns`, `sampling`, `max_tokens`) after `clear()`, and the next message reads the whole
conversation into the cache (`apply_saved_chat`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minfer import ChatSession, Engine, MinferError, SamplingParams
from minfer_chat.commands import CommandError, file_error

Message = dict[str, str]

KEYS = ("messages", "sampling", "max_tokens")  # what to_json writes
# Far more than any conversation a context holds (128k tokens of text, every character escaped by JSON, is some
# 12 MB): a larger file, or an endless one such as /dev/zero, is refused before it fills the memory.
MAX_FILE_BYTES = 64 * 2**20
ROLES = ("system", "user", "assistant")


class SavedChatError(Exception):
    """What is wrong with a saved conversation, without the file's name (`read_saved_chat` adds it)."""


@dataclass(frozen=True)
class SavedChat:
    """A conversation read from a file and checked: it can be given to a session as it is."""

    system: str | None
    turns: list[Message]  # user and assistant messages, alternating, ending with a reply
    sampling: SamplingParams | None  # None: the file has none, and the current settings stay
    max_tokens: int | None  # likewise

    @property
    def messages(self) -> list[Message]:
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, *self.turns]


def read_saved_chat(path: Path, engine: Engine) -> SavedChat:
    """The conversation saved in `path`, checked against the loaded model's context; CommandError if unusable."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:  # missing, a folder, no permission; a NUL byte in the name
        raise file_error("load", path, exc) from None
    try:
        if len(data) > MAX_FILE_BYTES:
            raise SavedChatError(f"larger than {MAX_FILE_BYTES // 2**20} MiB, more than any context holds")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SavedChatError("not UTF-8 text (not a file /save wrote)") from None
        saved = parse_saved_chat(text)
        check_fits(saved, engine)
    except SavedChatError as exc:
        raise CommandError(f"cannot load {str(path)!r}: {exc}") from None
    return saved


def parse_saved_chat(text: str) -> SavedChat:
    """A saved conversation from its JSON text; SavedChatError saying what does not match what /save writes."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SavedChatError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:  # thousands of nested brackets: Python's parser gives up
        raise SavedChatError("not JSON that can be read (nested too deeply)") from None
    if not isinstance(data, dict):
        raise SavedChatError(f"expected a JSON object with a list of messages, got {json_type(data)}")
    unknown = [key for key in data if key not in KEYS]
    if unknown:
        raise SavedChatError(f"unknown key {unknown[0]!r} (a saved conversation has {', '.join(KEYS)})")
    if "messages" not in data:
        raise SavedChatError('no "messages": not a conversation saved by /save')
    system, turns = parse_messages(data["messages"])
    return SavedChat(
        system=system,
        turns=turns,
        sampling=parse_sampling(data["sampling"]) if "sampling" in data else None,
        max_tokens=parse_max_tokens(data["max_tokens"]) if "max_tokens" in data else None,
    )


def json_type(value: object) -> str:
    """What a JSON value is, in JSON's words."""
    if value is None:
        return "null"
    names = {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def parse_messages(messages: object) -> tuple[str | None, list[Message]]:
    """(the system prompt or None, the turns) from the saved list, in the order a ChatSession keeps them."""
    if not isinstance(messages, list):
        raise SavedChatError(f'"messages" must be a list, got {json_type(messages)}')
    checked = [parse_message(number, message) for number, message in enumerate(messages, start=1)]
    system = None
    if checked and checked[0]["role"] == "system":
        system = checked.pop(0)["content"] or None  # as in ChatSession, an empty system prompt is none
    first_turn = len(messages) - len(checked) + 1  # the number in the file of checked[0] (2 after a system prompt)
    for index, message in enumerate(checked):
        expected = "user" if index % 2 == 0 else "assistant"
        if message["role"] != expected:
            rule = "user and assistant messages take turns, starting with the user's"
            if message["role"] == "system":
                rule = "only the first message may be a system message"
            article = "an" if message["role"] == "assistant" else "a"
            raise SavedChatError(f"message {first_turn + index} is {article} {message['role']} message: {rule}")
    if checked and checked[-1]["role"] == "user":
        raise SavedChatError("the last message is the user's, with no reply: a saved conversation ends with a reply")
    return system, checked


def parse_message(number: int, message: object) -> Message:
    if not isinstance(message, dict):
        raise SavedChatError(f"message {number} must be an object with a role and a content, got {json_type(message)}")
    unknown = [key for key in message if key not in ("role", "content")]
    if unknown:
        raise SavedChatError(f"message {number} has an unknown key {unknown[0]!r} (a message has role and content)")
    for key in ("role", "content"):
        if not isinstance(message.get(key), str):
            got = json_type(message[key]) if key in message else "nothing"
            raise SavedChatError(f"message {number} needs a text {key}, got {got}")
    if message["role"] not in ROLES:
        raise SavedChatError(f"message {number} has the role {message['role']!r}: expected system, user or assistant")
    return {"role": message["role"], "content": message["content"]}


def parse_sampling(sampling: object) -> SamplingParams:
    if not isinstance(sampling, dict):
        raise SavedChatError(f'"sampling" must be an object, got {json_type(sampling)}')
    unknown = [name for name in sampling if name not in SamplingParams.names()]
    if unknown:
        raise SavedChatError(f"unknown sampling parameter {unknown[0]!r} (known: {', '.join(SamplingParams.names())})")
    try:
        return SamplingParams(**sampling)
    except MinferError as exc:  # the runtime checks the values, as for the command line and the commands
        raise SavedChatError(str(exc)) from None


def parse_max_tokens(max_tokens: object) -> int:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise SavedChatError(f'"max_tokens" must be a whole number of at least 1, got {json.dumps(max_tokens)}')
    return max_tokens


def check_fits(saved: SavedChat, engine: Engine) -> None:
    """Refuse a conversation longer than the context, or a reply budget that leaves it no room."""
    ctx_size = engine.ctx_size
    if saved.max_tokens is not None and saved.max_tokens >= ctx_size:
        raise SavedChatError(
            f"max_tokens {saved.max_tokens} leaves no room for the conversation in the context ({ctx_size} tokens)"
        )
    if not saved.messages:
        return
    try:
        prompt = engine.template.render(saved.messages, add_generation_prompt=False)
    except MinferError as exc:  # a template that fails on these messages
        raise SavedChatError(str(exc)) from None
    # A text that cannot fit whatever its tokens is not tokenized (a huge one would only cost time).
    fewest = engine.tokenizer.fewest_tokens(prompt)
    if fewest > ctx_size:
        raise too_long(f"at least {fewest}", ctx_size)
    size = len(engine.tokenizer.encode(prompt))
    if size > ctx_size:
        raise too_long(str(size), ctx_size)


def too_long(size: str, ctx_size: int) -> SavedChatError:
    return SavedChatError(
        f"the conversation is {size} tokens with the template, more than the context holds ({ctx_size})"
    )


def apply_saved_chat(chat: ChatSession, saved: SavedChat) -> None:
    """Make `chat` the saved conversation; the next message reads all of it into the model."""
    chat.clear()
    chat.system = saved.system
    chat.turns = list(saved.turns)
    if saved.sampling is not None:
        chat.sampling = saved.sampling
    if saved.max_tokens is not None:
        chat.max_tokens = saved.max_tokens
