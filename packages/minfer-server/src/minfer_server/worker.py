"""The one thread that runs generations: requests wait in a bounded queue and run one at a time, in arrival order.

An Engine holds one KV cache and runs one generation at a time (EngineBusyError otherwise), and a generation is
synchronous numpy or CUDA work, so it never runs on the event loop. A `Job` carries one request to the worker and
its events back to the coroutine that answers the client: "start" (the request was checked and holds the engine),
then "piece"s of text, then "end" with the Generation, or an "error" at any point. Cancelling a job (its client
went away) stops it between two pieces, or before it starts if it is still waiting.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from minfer import ContextOverflowError, Engine, Generation, Grammar, Message, SamplingParams


class QueueFullError(Exception):
    """Every place in the queue is taken: the client should come back later (503 with Retry-After)."""


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

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()

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

    def run(self, engine: Engine) -> None:
        """In the worker thread: check the request and generate, pushing the events."""
        if self.cancelled.is_set():
            return
        try:
            pieces, result, n_prompt = start(engine, self.request)
        except Exception as exc:  # the route answers it: a MinferError with its status, anything else a 500
            self.push(Event("error", error=exc))
            return
        self.push(Event("start"))
        try:
            for piece in pieces:
                if self.cancelled.is_set():
                    return
                self.push(Event("piece", text=piece))
        except Exception as exc:
            self.push(Event("error", error=exc))
            return
        finally:
            pieces.close()  # releases the engine at once, also when the client went away mid-reply
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

    def __init__(self, engine: Engine, queue_size: int) -> None:
        self.engine = engine
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.current: Job | None = None
        self.thread = threading.Thread(target=self._loop, name="minfer-server-worker", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        """Jobs in the queue, not counting the running one."""
        return self.jobs.qsize()

    def submit(self, job: Job) -> None:
        """Queue `job`; QueueFullError when every place is taken."""
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise QueueFullError from None

    def stop(self) -> None:
        """Cancel the running and waiting jobs and end the thread."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
        if self.current is not None:
            self.current.cancel()
        self.jobs.put(None)
        self.thread.join()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            self.current = job
            job.run(self.engine)
            self.current = None
