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

from textual.pilot import Pilot

from minfer import SamplingParams
from minfer_chat import ChatApp, ChatOptions
from minfer_chat.widgets import AssistantMessage, Notice, UserMessage

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


async def wait_until_loaded(pilot: Pilot) -> None:
    await wait_until_idle(pilot)
    assert pilot.app.chat is not None, f"the model did not load: {pilot.app.load_error}"


async def type_text(pilot: Pilot, text: str) -> None:
    """Type `text` key by key into the focused message box (a newline is Ctrl+J)."""
    await pilot.press(*("ctrl+j" if char == "\n" else char for char in text))


async def submit(pilot: Pilot, text: str) -> None:
    """Type `text`, press Enter, and wait for what it started (a reply, say) to finish."""
    await type_text(pilot, text)
    await pilot.press("enter")
    await wait_until_idle(pilot)


async def wait_for(event: asyncio.Event) -> None:
    """Wait for `event` while the app runs; fail rather than hang if it never comes."""
    await asyncio.wait_for(event.wait(), timeout=60)


def notices(app: ChatApp, *, errors_only: bool = False) -> list[str]:
    selector = "Notice.error" if errors_only else "Notice"
    return [str(notice.content) for notice in app.query(selector).results(Notice)]


def user_messages(app: ChatApp) -> list[str]:
    return [str(message.content) for message in app.query(UserMessage).results(UserMessage)]


def replies(app: ChatApp) -> list[AssistantMessage]:
    return list(app.query(AssistantMessage).results(AssistantMessage))
