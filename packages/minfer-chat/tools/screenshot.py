"""Save a screenshot of minfer-chat after one real exchange with the default model, for the docs.

    python packages/minfer-chat/tools/screenshot.py docs/minfer-chat.svg

It runs on the CPU (a minute or so) and greedily, so the reply is the same each time;
only the speeds in the status line change from run to run.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from minfer import SamplingParams
from minfer_chat import ChatApp, ChatOptions
from minfer_chat.widgets import PromptInput

QUESTION = "Write a Python function that reverses a string, with a short explanation."
TERMINAL_SIZE = (100, 32)


async def save_screenshot(path: Path) -> None:
    app = ChatApp(ChatOptions(backend="cpu", sampling=SamplingParams(temperature=0), max_tokens=256))
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await app.workers.wait_for_complete()  # the model loads
        await pilot.pause()  # and the app takes it in
        if app.load_error:
            sys.exit(f"screenshot: {app.load_error}")
        message_box = app.query_one(PromptInput)
        message_box.insert(QUESTION)
        await pilot.press("enter")
        await pilot.pause()
        await app.workers.wait_for_complete()  # the reply streams
        await pilot.pause()
        message_box.cursor_blink = False  # a blinking cursor may be caught in either state
        path.write_text(app.export_screenshot(), encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: screenshot.py OUTPUT.svg")
    asyncio.run(save_screenshot(Path(sys.argv[1])))
