"""Serving the app with uvicorn: `serve` runs until SIGTERM or Ctrl-C, prints one line with the URL once it listens,
and writes the access log on stderr.

Stopping (either signal): the socket stops accepting, the requests waiting in the queue get 503, and the running
reply has `shutdown_grace` seconds to finish before it is ended with the shutdown error (503, or its stream's last
event), then the process exits: normally after SIGTERM, with KeyboardInterrupt after Ctrl-C.
"""

from __future__ import annotations

import asyncio
import copy
import signal
import socket
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI
from uvicorn.config import LOGGING_CONFIG

from minfer import Engine
from minfer_server.app import DEFAULT_QUEUE_SIZE, DEFAULT_REQUEST_TIMEOUT, create_app
from minfer_server.metrics import ACCESS_LOGGER

DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
# Past the grace period, how long uvicorn still waits for the connections to close (the ended replies' last
# bytes) before it cancels what is left.
CLOSE_SECONDS = 5.0


def logging_config() -> dict:
    """uvicorn's logging config plus the access log: `minfer_server.access` at INFO on stderr, with the time."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["minfer_access"] = {"format": "%(asctime)s %(message)s"}
    config["handlers"]["minfer_access"] = {
        "formatter": "minfer_access",
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
    }
    config["loggers"][ACCESS_LOGGER] = {"handlers": ["minfer_access"], "level": "INFO", "propagate": False}
    return config


class Server(uvicorn.Server):
    """uvicorn's server, printing `minfer serve: listening on URL` on stdout once its socket is bound (port 0
    gives a free port: the line names the one it got), and stopping as the module says."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, shutdown_grace: float) -> None:
        super().__init__(config)
        self.app, self.shutdown_grace = app, shutdown_grace

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            sys.stdout.write(f"minfer serve: listening on http://{shown}:{port}\n")
            sys.stdout.flush()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        worker = self.app.state.worker
        worker.close()
        interrupting = asyncio.get_running_loop().call_later(self.shutdown_grace, worker.interrupt)
        try:
            await super().shutdown(sockets)
        finally:
            interrupting.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn (0.29 on) raises a caught signal again once it has stopped, from its private list; SIGTERM is the
        # stop a process manager asks for, and a server that stopped as asked exits with status 0, not killed by
        # the signal. test_server_shutdown.py checks the exit status, so a uvicorn that changes this shows there.
        captured = getattr(self, "_captured_signals", [])
        if sig == signal.SIGTERM and sig in captured:
            captured.remove(sig)


def serve(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    model_name: str | None = None,
    request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE_SECONDS,
) -> None:
    """Serve `engine` on host:port until SIGTERM (then return) or Ctrl-C (then KeyboardInterrupt, which uvicorn
    raises again once it has stopped). `request_timeout` is `create_app`'s; `shutdown_grace` is how long a running
    reply may go on once the server is stopping."""
    if shutdown_grace < 0:
        raise ValueError(f"the shutdown grace must be zero or more seconds, got {shutdown_grace}")
    app = create_app(
        engine, model_name=model_name, api_key=api_key, queue_size=queue_size, request_timeout=request_timeout
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        log_config=logging_config(),
        access_log=False,  # the app writes its own, with the token counts
        timeout_graceful_shutdown=shutdown_grace + CLOSE_SECONDS,
    )
    Server(config, app, shutdown_grace).run()
