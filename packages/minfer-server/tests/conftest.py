"""Fixtures: the real server (uvicorn on 127.0.0.1, a free port, in a background thread) over a tiny synthetic model.

The model has random weights (its replies are gibberish) but a real tokenizer and ChatML template. Its output
rows of the end-of-text tokens are zero, so a greedy reply never ends on its own: a long one holds the engine for as
long as a test needs (to fill the queue, to leave a stream early).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from server_steps import API_KEY

import minfer
from minfer.testing.synthetic import random_tensors, rewrite_gguf, scaled, write_synthetic_model
from minfer_server import create_app

CTX_SIZE = 8192


@dataclass
class Running:
    url: str
    app: FastAPI

    @property
    def waiting(self) -> int:
        """Requests in the server's queue behind the running one."""
        return self.app.state.worker.waiting


@pytest.fixture(scope="session")
def endless_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    spec = scaled("tiny-llama", context_length=32768)
    base = write_synthetic_model(folder / "tiny-llama-32k.gguf", spec)
    with minfer.load(base, backend="cpu") as engine:
        stop_ids = sorted(engine.tokenizer.stop_ids)
    output = random_tensors(spec, seed=0)["output.weight"]
    output[stop_ids] = 0.0  # logit 0, below the greedy pick's: the largest of hundreds of random logits
    path = folder / "tiny-llama-32k-endless.gguf"
    return rewrite_gguf(base, path, drop_tensors=("output.weight",), add_tensors={"output.weight": output})


@pytest.fixture(scope="session")
def server_engine(endless_model: Path) -> Iterator[minfer.Engine]:
    with minfer.load(endless_model, backend="cpu", ctx_size=CTX_SIZE, threads=1) as loaded:
        yield loaded


def start_server(app: FastAPI) -> tuple[uvicorn.Server, threading.Thread, str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def running(server_engine: minfer.Engine) -> Iterator[Running]:
    """The server every test talks to: API key required, one request may wait behind the running one, 1 MiB bodies."""
    app = create_app(server_engine, model_name="tiny", api_key=API_KEY, queue_size=1, max_body_bytes=2**20)
    server, thread, url = start_server(app)
    yield Running(url, app)
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def short_timeout_server(server_engine: minfer.Engine) -> Iterator[Running]:
    """A second server over the same engine (the tests run one at a time) whose requests time out after 0.5 s."""
    app = create_app(server_engine, model_name="tiny", queue_size=1, request_timeout=0.5)
    server, thread, url = start_server(app)
    yield Running(url, app)
    server.should_exit = True
    thread.join(timeout=30)
