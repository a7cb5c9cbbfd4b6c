"""What minfer-chat looks like after one exchange, compared with the committed SVG snapshot.

Update after an intended change of looks: `pytest packages/minfer-chat/tests --snapshot-update`,
then look at the new SVG before committing it.
"""

from __future__ import annotations

import pytest
from chat_steps import chat_app, submit, wait_until_loaded
from textual.pilot import Pilot

from minfer import SamplingParams
from minfer_chat.widgets import PromptInput, StatusLine

pytestmark = pytest.mark.timeout(120)


def test_one_exchange(snap_compare, tiny_model):
    # One thread: the header and the status line name the count, which is the machine's by default.
    app = chat_app(tiny_model, sampling=SamplingParams(temperature=0.8, seed=1234), max_tokens=24, threads=1)

    async def exchange_one_message(pilot: Pilot) -> None:
        await wait_until_loaded(pilot)
        await submit(pilot, "Hello! What can you do?")
        # Speeds differ from run to run and the cursor blinks: pin both so the picture is the same each time.
        status = app.query_one(StatusLine)
        status.prompt_speed, status.generation_speed = 1000.0, 100.0
        app.query_one(PromptInput).cursor_blink = False

    assert snap_compare(app, terminal_size=(100, 30), run_before=exchange_one_message)
