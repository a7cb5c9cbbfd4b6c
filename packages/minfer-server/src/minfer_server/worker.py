"""The one thread that runs generations: requests wait in a bounded queue and run one at a time, in arrival order.

An Engine holds one KV cache and runs one generation at a time (EngineBusyError otherwise), and a generation is
synchronous numpy or CUDA work, so it never runs on the event loop. A `Job` carries one request to the worker and
its events back to the coroutine that answers the client: "start" (the request was checked and holds the engine),
then "piece"s of text, then "end" with the Generation, or an "error" at any point. Cancelling a job (its client
went away) stops it between two pieces, or before it starts if it is still waiting. A job past its deadline (the
per-request timeout, counted from its arrival) or stopped by a shutting-down server ends the same way, with an
"error" event that says why.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from minfer import ContextOverflowError, Engine, Generation, Grammar, Message, SamplingParams
from minfer_server.metrics import Metrics


class QueueFullError(Exception):
    """Every place in the queue is taken: the client should come back later (503 with Retry-After)."""


class JobInterrupted(Exception):
    """A job the server ended before its reply was complete, for a reason its client is told."""


class RequestTimeoutError(JobInterrupted):
    """The request ran past the server's per-request timeout (504)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the request ran past the server's timeout of {seconds:g} seconds (--request-timeout)")


class ShuttingDownError(JobInterrupted):
    """The server is stopping: a request still waiting, arriving, or still running after the grace period (503)."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down; retry on another server or later")


@dataclass
class GenerationRequest:
    """One generation as the engine takes it, whichever API it came through.

    `max_tokens` None is the rest of the context after the prompt (OpenAI's and Ollama's default: no limit);
    `grammar`, when given, is what the reply must be (structured output).
    """

    prompt: str | list[Message]
    template: bool = True
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    grammar: Grammar | None = None


@dataclass
class Event:
    kind: str  # "start", "piece", "end" or "error"
    text: str = ""
    generation: Generation | None = None
    prompt_tokens: int = 0  # on "end": the whole prompt, the tokens the KV cache held included
    error: BaseException | None = None


class Job:
    """One request on its way through the worker; its events arrive on the event loop that submitted it."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        self.request = request
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.arrived = time.monotonic()
        self.timeout = timeout
        self.stopped: JobInterrupted | None = None  # set from another thread: end the job with this error
        # Set by the worker thread once the request holds the engine; read live by the access log.
        self.prompt_tokens: int | None = None
        self.result: Generation | None = None

    def cancel(self) -> None:
        """Stop the generation at its next piece (or skip it if it has not started)."""
        self.cancelled.set()

    def push(self, event: Event) -> None:
        """From the worker thread: hand `event` to the loop; a loop that is gone cancels the job."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop was closed (the server stopped)
            self.cancel()

    async def next(self) -> Event:
        """The next event; an "error" raises its exception."""
        event = await self.events.get()
        if event.kind == "error":
            assert event.error is not None
            raise event.error
        return event

    async def pieces(self) -> AsyncIterator[str | Event]:
        """After "start": each piece of text, then the "end" event."""
        while True:
            event = await self.next()
            if event.kind == "end":
                yield event
                return
            yield event.text

    def interruption(self) -> JobInterrupted | None:
        """Why the job must end now, if it must: the server stopping it, or its deadline passed."""
        if self.stopped is not None:
            return self.stopped
        if self.timeout is not None and time.monotonic() - self.arrived > self.timeout:
            return RequestTimeoutError(self.timeout)
        return None

    def run(self, engine: Engine, metrics: Metrics) -> None:
        """In the worker thread: check the request and generate, pushing the events and counting the tokens."""
        if self.cancelled.is_set():
            return
        if (interrupted := self.interruption()) is not None:  # it waited in the queue past its deadline
            self.push(Event("error", error=interrupted))
            return
        try:
            pieces, result, n_prompt = start(engine, self.request)
        except Exception as exc:  # the route answers it: a MinferError with its status, anything else a 500
            self.push(Event("error", error=exc))
            return
        self.prompt_tokens, self.result = n_prompt, result
        metrics.prompt_tokens.inc(n_prompt)
        self.push(Event("start"))
        first = True
        try:
            for piece in pieces:
                if self.cancelled.is_set():
                    return
                if (interrupted := self.interruption()) is not None:
                    self.push(Event("error", error=interrupted))
                    return
                if first:
                    metrics.time_to_first_token.observe(time.monotonic() - self.arrived)
                    first = False
                self.push(Event("piece", text=piece))
        except Exception as exc:
            self.push(Event("error", error=exc))
            return
        finally:
            pieces.close()  # releases the engine at once, also when the client went away mid-reply
            metrics.generated_tokens.inc(result.stats.generated_tokens)
            if result.stats.generated_tokens > 0:
                metrics.tokens_per_second.observe(result.stats.generation_tokens_per_second)
        self.push(Event("end", generation=result, prompt_tokens=n_prompt))


def start(engine: Engine, request: GenerationRequest) -> tuple[Iterator[str], Generation, int]:
    """Encode and check a request: its pieces (not started yet), the Generation they fill, its prompt's length."""
    tokens = engine.encode_prompt(request.prompt, template=request.template)
    max_tokens = request.max_tokens
    if max_tokens is None:
        max_tokens = engine.ctx_size - len(tokens)
        if max_tokens < 1:
            raise ContextOverflowError(
                f"the prompt ({len(tokens)} tokens) fills the context size {engine.ctx_size}: no room for a reply"
            )
    result = Generation()
    pieces = engine.stream(
        tokens, max_tokens=max_tokens, sampling=request.sampling, stop=request.stop, result=result,
        grammar=request.grammar,
    )  # fmt: skip
    return pieces, result, len(tokens)


class Worker:
    """The thread that owns the engine's generations; at most `queue_size` jobs wait behind the running one."""

    def __init__(self, engine: Engine, queue_size: int, metrics: Metrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.current: Job | None = None
        self.closing = False
        self.thread = threading.Thread(target=self._loop, name="minfer-server-worker", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        """Jobs in the queue, not counting the running one."""
        return self.jobs.qsize()

    def submit(self, job: Job) -> None:
        """Queue `job`; QueueFullError when every place is taken, ShuttingDownError once `close` was called."""
        if self.closing:
            raise ShuttingDownError
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise QueueFullError from None

    def close(self) -> None:
        """The server begins to stop: refuse new jobs and end the waiting ones with ShuttingDownError; the running
        one goes on (until `interrupt`)."""
        self.closing = True
        for job in self._take_waiting():
            job.push(Event("error", error=ShuttingDownError()))

    def interrupt(self) -> None:
        """End the running job, at its next piece, with ShuttingDownError (the grace period is over)."""
        if (job := self.current) is not None:
            job.stopped = ShuttingDownError()

    def _take_waiting(self) -> list[Job]:
        taken = []
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return taken
            if job is not None:
                taken.append(job)

    def stop(self) -> None:
        """Cancel the running and waiting jobs and end the thread."""
        for job in self._take_waiting():
            job.cancel()
        if self.current is not None:
            self.current.cancel()
        self.jobs.put(None)
        self.thread.join()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            self.current = job
            job.run(self.engine, self.metrics)
            self.current = None
