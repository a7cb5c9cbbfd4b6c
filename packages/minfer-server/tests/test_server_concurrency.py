"""One engine, one generation at a time: a full queue is 503, and a streaming client that leaves frees the engine."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from server_steps import AUTH

pytestmark = pytest.mark.timeout(60)

LONG = 8000  # thousands of tokens: the reply would hold the engine for much longer than the test waits


def wait_for(condition, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_full_queue_is_503_and_a_closed_stream_frees_the_engine(running, path):
    body = {"messages": [{"role": "user", "content": "Tell me everything."}], "stream": True}
    if path.startswith("/v1"):
        long_body = {**body, "max_tokens": LONG, "temperature": 0}
    else:
        long_body = {**body, "options": {"num_predict": LONG, "temperature": 0}}
    short = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": False}
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=running.url, headers=AUTH, timeout=30) as streaming:
        with streaming.stream("POST", path, json=long_body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            next(lines), next(lines)  # the long reply is running
            waiting = threading.Thread(
                target=lambda: answers.append(
                    httpx.post(f"{running.url}/v1/chat/completions", json=short, headers=AUTH, timeout=30)
                )
            )
            waiting.start()
            wait_for(lambda: running.waiting == 1, "the second request to queue")
            refused = httpx.post(f"{running.url}{path}", json=short, headers=AUTH, timeout=30)
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            error = refused.json()["error"]
            assert "busy" in (error if isinstance(error, str) else error["message"])
            started = time.monotonic()
        # The stream is closed: its generation stops and the queued request gets its whole answer.
        waiting.join(timeout=30)
    assert time.monotonic() - started < 15
    assert answers and answers[0].status_code == 200
    answer = answers[0].json()
    assert answer["usage"]["completion_tokens"] >= 1 and answer["choices"][0]["finish_reason"] in ("stop", "length")
    after = httpx.post(f"{running.url}/v1/chat/completions", json={**short, "max_tokens": 4}, headers=AUTH, timeout=30)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] >= 1
    assert running.waiting == 0
