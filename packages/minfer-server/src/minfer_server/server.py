"""Serving the app with uvicorn: `serve` runs until Ctrl-C and prints one line with the URL once it listens."""

from __future__ import annotations

import socket
import sys

import uvicorn

from minfer import Engine
from minfer_server.app import DEFAULT_QUEUE_SIZE, create_app

# After Ctrl-C, how long a reply still streaming may go on before uvicorn cancels it (which stops its generation).
SHUTDOWN_GRACE_SECONDS = 2


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, printing `minfer serve: listening on URL` on stdout once its socket is bound (port 0
    gives a free port: the line names the one it got)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            sys.stdout.write(f"minfer serve: listening on http://{shown}:{port}\n")
            sys.stdout.flush()


def serve(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    model_name: str | None = None,
) -> None:
    """Serve `engine` on host:port until interrupted. Ctrl-C ends it with KeyboardInterrupt, after uvicorn has
    closed the connections (uvicorn raises the signal again once it has stopped)."""
    app = create_app(engine, model_name=model_name, api_key=api_key, queue_size=queue_size)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS
    )
    AnnouncingServer(config).run()
