"""Steps for driving minfer-chat with textual's pilot: start it, type, send, wait, read what it shows.

Waiting is always for an event (the workers finishing, a piece arriving), never
for a fixed time, so the tests hold on a slow machine.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.pilot import Pilot

from minfer import SamplingParams
from minfer_chat import ChatApp, ChatOptions
from minfer_chat.widgets import AssistantMessage, Notice, PendingList, PromptInput, UserMessage

GREEDY = SamplingParams(temperature=0)
TERMINAL_SIZE = (100, 40)


def run_async(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an `async def` test in its own event loop (pytest alone does not run coroutines)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def chat_app(model: Path, **options: object) -> ChatApp:
    """The app on the CPU, greedy and with short replies unless the test says otherwise."""
    settings: dict[str, object] = {"backend": "cpu", "sampling": GREEDY, "max_tokens": 12, **options}
    return ChatApp(ChatOptions(model=model, **settings))


async def wait_until_idle(pilot: Pilot) -> None:
    """Let every worker (model load, reply) finish and the UI take in what they handed it."""
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def wait_for(pilot: Pilot, condition: Callable[[], bool], *, timeout: float = 60) -> None:
    """Let the app run until `condition` holds (checked every 10 ms, so as not to take the CPU from the workers);
    fail rather than hang."""

    async def poll() -> None:
        while not condition():
            await pilot.pause(0.01)

    await asyncio.wait_for(poll(), timeout=timeout)


async def wait_until_loaded(pilot: Pilot) -> None:
    await wait_until_idle(pilot)
    assert pilot.app.session is not None, f"the model did not load: {pilot.app.load_error}"


async def type_text(pilot: Pilot, text: str) -> None:
    """Type `text` key by key into the focused message box (a newline is Ctrl+J)."""
    await pilot.press(*("ctrl+j" if char == "\n" else char for char in text))


async def enter(pilot: Pilot, text: str) -> None:
    """Put `text` in the message box (as a paste would) and press Enter.

    Tests about typing use `type_text` instead: each pilot key press takes a few tens of milliseconds,
    and up to a second while the model generates (the pilot waits for the app to go idle).
    """
    pilot.app.query_one(PromptInput).insert(text)
    await pilot.press("enter")


async def enter_while_streaming(pilot: Pilot, text: str) -> None:
    """`enter` for a test that types while the model generates, where each pilot key press waits a second or two
    for an idle that does not come: the Enter key goes to the app as the terminal's would, and the step
    returns once the message box has taken it (Enter empties the box)."""
    box = pilot.app.query_one(PromptInput)
    box.insert(text)
    pilot.app.post_message(events.Key("enter", "\r"))
    await wait_for(pilot, lambda: box.text == "")


async def submit(pilot: Pilot, text: str) -> None:
    """`enter` the text, and wait for what it started (a reply, say) to finish."""
    await enter(pilot, text)
    await wait_until_idle(pilot)


class PieceWatcher:
    """Records the text a reply shows as it streams (on the UI thread: each update brings the pieces that came
    since the last one), and flags the first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pieces: list[str] = []
        self.first = asyncio.Event()
        show_piece = AssistantMessage.append

        def recording_append(message: AssistantMessage, piece: str) -> None:
            self.pieces.append(piece)
            self.first.set()
            show_piece(message, piece)

        monkeypatch.setattr(AssistantMessage, "append", recording_append)

    async def wait_for_first(self) -> None:
        """Wait until a reply is streaming; fail rather than hang if none comes."""
        await asyncio.wait_for(self.first.wait(), timeout=60)


def notices(app: ChatApp, *, errors_only: bool = False) -> list[str]:
    selector = "Notice.error" if errors_only else "Notice"
    return [str(notice.content) for notice in app.query(selector).results(Notice)]


def queued(app: ChatApp) -> list[str]:
    """What the list above the message box shows as waiting for the reply."""
    pending = app.query_one(PendingList)
    return str(pending.content).splitlines() if pending.display else []


def user_messages(app: ChatApp) -> list[str]:
    return [str(message.content) for message in app.query(UserMessage).results(UserMessage)]


def replies(app: ChatApp) -> list[AssistantMessage]:
    return list(app.query(AssistantMessage).results(AssistantMessage))
