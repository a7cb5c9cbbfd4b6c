"""`minfer serve` stopped by SIGTERM: the queued request gets 503, the running stream ends with the shutdown error
after the grace period, the access log is on stderr, and the process exits with status 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(90)

HELLO = [{"role": "user", "content": "Tell me everything."}]


def queue_depth(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return next(f.samples[0].value for f in text_string_to_metric_families(text) if f.name == "minfer_queue_depth")


def test_sigterm_refuses_the_queue_ends_the_stream_and_exits_0(endless_model):
    command = [sys.executable, "-m", "minfer.cli", "serve", str(endless_model), "--backend", "cpu", "-t", "1",
               "-c", "4096", "--port", "0", "--shutdown-grace", "1"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    queued: list[httpx.Response] = []
    try:
        line = server.stdout.readline()
        assert line.startswith("minfer serve: listening on http://127.0.0.1:"), server.stderr.read()
        url = line.split()[-1]
        body = {"messages": HELLO, "stream": True, "temperature": 0}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            next(lines), next(lines)  # the endless reply is running
            waiting = threading.Thread(
                target=lambda: queued.append(
                    httpx.post(f"{url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=30)
                )
            )
            waiting.start()
            deadline = time.monotonic() + 20
            while queue_depth(url) != 1:
                assert time.monotonic() < deadline, "the second request did not queue"
                time.sleep(0.02)
            server.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            rest = [line for line in lines if line]  # ends without an error: the response is complete
        waiting.join(timeout=30)
        _, stderr = server.communicate(timeout=30)
        exited = time.monotonic() - stopped
    finally:
        server.kill()
    assert server.returncode == 0, stderr
    assert exited < 10  # the 1 s grace, then the close
    assert queued and queued[0].status_code == 503
    assert queued[0].json()["error"]["code"] == "server_shutting_down"
    # The reply went on during the grace period, then its last event is the shutdown error (no [DONE]).
    assert len(rest) > 2 and json.loads(rest[-2].removeprefix("data: "))["choices"]
    assert json.loads(rest[-1].removeprefix("data: "))["error"]["code"] == "server_shutting_down"
    assert "Traceback" not in stderr
    access = [line for line in stderr.splitlines() if "method=POST path=/v1/chat/completions" in line]
    assert len(access) == 2 and any("status=503" in line for line in access)
    assert any("status=200" in line and "generated_tokens=" in line for line in access)
