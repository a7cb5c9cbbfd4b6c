"""What the server measures: Prometheus metrics (one registry per app) and one access-log line per request.

The metrics are served by `GET /metrics` in Prometheus' text format. The access log goes to the logger
`minfer_server.access` at INFO, one line of key=value pairs per request once its response is complete (a stream's
last byte sent): method, path, status, duration, the client and, for a generation, its prompt and generated tokens.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACCESS_LOGGER = "minfer_server.access"
OTHER_ROUTE = "other"  # the route label of a path no route serves, so that unknown paths cannot grow the labels

access_log = logging.getLogger(ACCESS_LOGGER)


class Metrics:
    """The server's metrics in their own registry (not prometheus_client's global one), so that several apps in
    one process, tests say, each count their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "minfer_requests", "HTTP requests answered, by route and status", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "minfer_request_duration_seconds", "Seconds from a request's arrival to its response's last byte",
            ["route"], registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "minfer_prompt_tokens", "Prompt tokens of the generations started (those the KV cache held included)",
            registry=self.registry,
        )  # fmt: skip
        self.generated_tokens = Counter("minfer_generated_tokens", "Tokens generated", registry=self.registry)
        self.queue_depth = Gauge(
            "minfer_queue_depth", "Requests waiting for the model behind the running one", registry=self.registry
        )
        self.time_to_first_token = Histogram(
            "minfer_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first piece of text (the queue's wait and the prefill included)",
            registry=self.registry, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )  # fmt: skip
        self.tokens_per_second = Histogram(
            "minfer_generation_tokens_per_second", "Generation speed of each reply, in tokens per second",
            registry=self.registry, buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
        )  # fmt: skip

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


class Observe:
    """ASGI middleware: count each HTTP request by route and status, time it, and write its access-log line.

    `routes` are the paths the app serves (the label for any other is "other"). A route that runs a generation puts
    its Job in the request's state as `job`, whose token counts the line then gives.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500  # what the client gets when the app fails before it answers (Starlette's error response)

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            seconds = time.monotonic() - started
            route = scope["path"] if scope["path"] in self.routes else OTHER_ROUTE
            self.metrics.requests.labels(route=route, status=str(status)).inc()
            self.metrics.request_seconds.labels(route=route).observe(seconds)
            access_log.info(access_line(scope, status, seconds))


def access_line(scope: Scope, status: int, seconds: float) -> str:
    """The access-log line of a request: key=value pairs separated by spaces (a path is URL-encoded, so it has
    none); the token counts only where a generation started."""
    client = scope.get("client")
    fields = {
        "method": scope["method"],
        "path": scope["path"],
        "status": status,
        "duration_s": f"{seconds:.3f}",
        "client": f"{client[0]}:{client[1]}" if client else "-",
    }
    job = scope.get("state", {}).get("job")
    if job is not None and job.prompt_tokens is not None:
        fields["prompt_tokens"] = job.prompt_tokens
        fields["generated_tokens"] = job.result.stats.generated_tokens  # so far, for a reply cut short
    return " ".join(f"{key}={value}" for key, value in fields.items())
