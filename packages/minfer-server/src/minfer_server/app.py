"""The FastAPI app: OpenAI's and Ollama's routes over one Engine, their error shapes, the API key, the queue.

Routes under /api/ are Ollama's and answer errors as `{"error": "..."}`; the others answer OpenAI's
`{"error": {"message", "type", "param", "code"}}`. Every generation goes through the one `Worker`; a streaming
response waits for its request to be checked before it sends its status, so a bad request is an error status,
never a stream that fails. A reply the server ends early (the request timeout, a shutdown) is 504 or 503 before its
status is sent, and after it the stream's last event is the error: an SSE `data: {"error": {...}}` with no
`[DONE]`, or an NDJSON `{"error": "..."}` line.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minfer import (
    BackendError,
    ContextOverflowError,
    Engine,
    Grammar,
    GrammarError,
    MinferError,
    NumericalError,
    SamplingParams,
)
from minfer_server.metrics import Metrics, Observe
from minfer_server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    OllamaChatRequest,
    OllamaGenerateRequest,
    OpenAISampling,
    ResponseFormat,
)
from minfer_server.worker import (
    Event,
    GenerationRequest,
    Job,
    JobInterrupted,
    QueueFullError,
    RequestTimeoutError,
    Worker,
)

DEFAULT_QUEUE_SIZE = 8
DEFAULT_MAX_BODY_BYTES = 16 * 2**20  # a full 128k-token context is well under 1 MiB of text
DEFAULT_REQUEST_TIMEOUT = 600.0  # seconds: a reply with no max_tokens may otherwise hold the engine for its context
RETRY_AFTER_SECONDS = 1


class ApiError(Exception):
    """An error answer: its status, its one-line message and, for OpenAI's shape, the field and code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    @classmethod
    def of(cls, exc: MinferError | JobInterrupted) -> ApiError:
        """A user's mistake is 400 (a prompt too long for the context with OpenAI's code); the model failing, 500;
        the request timeout, 504; the server shutting down, 503."""
        if isinstance(exc, RequestTimeoutError):
            return cls(504, str(exc), kind="timeout_error", code="request_timeout")
        if isinstance(exc, JobInterrupted):
            return cls(503, str(exc), kind="server_error", code="server_shutting_down")
        if isinstance(exc, ContextOverflowError):
            return cls(400, str(exc), code="context_length_exceeded")
        if isinstance(exc, NumericalError | BackendError):
            return cls(500, str(exc), kind="server_error")
        return cls(400, str(exc))


def is_ollama(path: str) -> bool:
    return path.startswith("/api/")


def error_body(path: str, error: ApiError) -> dict[str, Any]:
    """The error in the shape of the route family that `path` belongs to."""
    if is_ollama(path):
        return {"error": error.message}
    return {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}


def error_response(request: Request, error: ApiError) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, error), status_code=error.status, headers=error.headers)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over the limit of {limit} bytes", kind="request_too_large")


class BodyLimit:
    """Refuse a request body over `limit` bytes with 413 in its route family's shape: at once when its
    Content-Length says so, else when the bytes read pass the limit (a chunked body)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await JSONResponse(error_body(scope["path"], too_large(self.limit)), status_code=413)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise HTTPException(413, too_large(self.limit).message)  # the app's handler shapes it
            return message

        await self.app(scope, limited, send)


def field_name(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location after "body" as OpenAI writes a param: messages[0].role."""
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def validation_error(exc: RequestValidationError) -> ApiError:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    param = field_name(tuple(first["loc"][1:])) or None
    return ApiError(400, f"{param or 'the request body'}: {first['msg']}", param=param)


def checked_grammar(schema: dict[str, Any] | None, param: str) -> Grammar:
    """The grammar of a JSON schema (None: any JSON object); 400 naming `param` when the grammar engine rejects it."""
    try:
        return Grammar.json_object() if schema is None else Grammar.json_schema(schema)
    except GrammarError as exc:
        raise ApiError(400, f"{param}: {exc}", param=param) from None


def openai_grammar(response_format: ResponseFormat | None) -> Grammar | None:
    """What OpenAI's `response_format` asks the reply to be: nothing (text), any JSON object, or a schema's JSON."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return checked_grammar(None, "response_format")
    if response_format.json_schema is None:
        raise ApiError(400, "response_format.json_schema: required when the type is json_schema",
                       param="response_format.json_schema")  # fmt: skip
    return checked_grammar(response_format.json_schema.json_schema, "response_format.json_schema.schema")


def ollama_grammar(format: object) -> Grammar | None:
    """What Ollama's `format` asks the reply to be: nothing (absent or ""), any JSON object ("json"), or JSON that
    follows a schema (an object)."""
    if format in (None, ""):
        return None
    if format == "json":
        return checked_grammar(None, "format")
    if isinstance(format, dict):
        return checked_grammar(format, "format")
    raise ApiError(400, f'format: must be "json" or a JSON schema object, got {json.dumps(format)}', param="format")


def sampling_params(**given: float | int | None) -> SamplingParams:
    """SamplingParams with the fields a request gave; the others keep minfer's defaults (llama.cpp's)."""
    return SamplingParams(**{name: value for name, value in given.items() if value is not None})


def finish_reason(end: Event) -> str:
    """OpenAI's and Ollama's name for how a reply ended: "stop" (end of text, a stop string, a complete grammar)
    or "length"."""
    assert end.generation is not None
    return "length" if end.generation.stats.stop_reason == "length" else "stop"


def usage(end: Event) -> dict[str, int]:
    assert end.generation is not None
    generated = end.generation.stats.generated_tokens
    return {
        "prompt_tokens": end.prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": end.prompt_tokens + generated,
    }


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def ndjson(data: dict[str, Any]) -> str:
    return json.dumps(data) + "\n"


def messages_of(messages: list[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": message.role, "content": message.text()} for message in messages]


def openai_request(
    body: OpenAISampling, prompt: str | list[dict[str, str]], max_tokens: int | None
) -> GenerationRequest:
    sampling = sampling_params(
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, seed=body.seed
    )
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens, sampling=sampling, stop=body.stops(),
                             grammar=openai_grammar(body.response_format))  # fmt: skip


def ollama_request(
    body: OllamaChatRequest | OllamaGenerateRequest, prompt: str | list[dict[str, str]], *, template: bool
) -> GenerationRequest:
    options = body.options
    num_predict = options.num_predict
    sampling = sampling_params(
        temperature=options.temperature,
        top_k=options.top_k,
        top_p=options.top_p,
        min_p=options.min_p,
        seed=options.seed,
        repeat_penalty=options.repeat_penalty,
        repeat_last_n=options.repeat_last_n,
    )
    if num_predict is not None and num_predict not in (-1, -2) and num_predict < 1:
        raise ApiError(400, f"options.num_predict must be positive, -1 or -2, got {num_predict}")
    max_tokens = num_predict if num_predict is not None and num_predict > 0 else None
    return GenerationRequest(prompt=prompt, template=template, max_tokens=max_tokens, sampling=sampling,
                             stop=options.stop or [], grammar=ollama_grammar(body.format))  # fmt: skip


async def start_job(http: Request, request: GenerationRequest) -> Job:
    """Queue `request` and wait until it holds the engine; its error (a bad prompt, say) is raised here. The job is
    the HTTP request's state `job`, for its access-log line."""
    worker: Worker = http.app.state.worker
    job = Job(request, asyncio.get_running_loop(), http.app.state.request_timeout)
    http.state.job = job
    try:
        worker.submit(job)
    except QueueFullError:
        raise ApiError(
            503,
            f"the server is busy: {worker.waiting} requests are waiting for the model; retry later",
            kind="server_error",
            code="server_busy",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None
    try:
        await job.next()
    except BaseException:  # the request's error, or this coroutine cancelled while it waited: never run it
        job.cancel()
        raise
    return job


async def collect(job: Job) -> Event:
    """Wait for the whole reply: its "end" event."""
    try:
        async for item in job.pieces():
            if isinstance(item, Event):
                return item
        raise AssertionError("a job's pieces end with its end event")
    finally:
        job.cancel()


async def openai_stream(
    job: Job,
    header: dict[str, Any],
    choice: Callable[[str, str | None], dict[str, Any]],
    first: dict[str, Any] | None,
    include_usage: bool,
) -> AsyncGenerator[str]:
    """Server-sent events: `first` (chat's role delta), a chunk per piece, the finish chunk, the usage chunk when
    asked for, [DONE]. A client that goes away cancels this generator, which cancels the job."""
    try:
        if first is not None:
            yield sse({**header, "choices": [first]})
        async for item in job.pieces():
            if isinstance(item, Event):
                yield sse({**header, "choices": [choice("", finish_reason(item))]})
                if include_usage:
                    yield sse({**header, "choices": [], "usage": usage(item)})
            elif item:
                yield sse({**header, "choices": [choice(item, None)]})
        yield "data: [DONE]\n\n"
    except (MinferError, JobInterrupted) as exc:  # the status is sent already, so the error is the last event
        yield sse(error_body("/v1", ApiError.of(exc)))
    finally:
        job.cancel()


def ollama_stats(end: Event) -> dict[str, Any]:
    """The final object's fields: how it ended, token counts and durations in nanoseconds, as Ollama reports them."""
    assert end.generation is not None
    stats = end.generation.stats
    prompt_ns, eval_ns = int(stats.prompt_seconds * 1e9), int(stats.generation_seconds * 1e9)
    return {
        "done": True,
        "done_reason": finish_reason(end),
        "total_duration": prompt_ns + eval_ns,
        "load_duration": 0,
        "prompt_eval_count": end.prompt_tokens,
        "prompt_eval_duration": prompt_ns,
        "eval_count": stats.generated_tokens,
        "eval_duration": eval_ns,
    }


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


async def ollama_stream(job: Job, model: str, content: Callable[[str], dict[str, Any]]) -> AsyncGenerator[str]:
    """NDJSON: an object per piece, then the final one with `done` and the stats."""
    try:
        async for item in job.pieces():
            if isinstance(item, Event):
                yield ndjson({"model": model, "created_at": now_iso(), **content(""), **ollama_stats(item)})
            elif item:
                yield ndjson({"model": model, "created_at": now_iso(), **content(item), "done": False})
    except (MinferError, JobInterrupted) as exc:
        yield ndjson({"error": ApiError.of(exc).message})
    finally:
        job.cancel()


def create_app(
    engine: Engine,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
) -> FastAPI:
    """The server's app over a loaded `engine`, served under `model_name` (default: the file's name).

    `queue_size` requests may wait behind the running one (more get 503 with Retry-After); `api_key`, when given,
    must come as `Authorization: Bearer KEY` on every route but /health; a body over `max_body_bytes` gets 413.
    A generation still running `request_timeout` seconds after its request arrived (the queue's wait included) is
    stopped: 504, or an error as a stream's last event (None: no limit). `GET /metrics` has Prometheus' metrics of
    this app alone; each request is also a line of the `minfer_server.access` logger.
    The worker thread starts and stops with the app (its lifespan).
    """
    if queue_size < 1:
        raise ValueError(f"queue size must be at least 1, got {queue_size}")
    if request_timeout is not None and request_timeout <= 0:
        raise ValueError(f"the request timeout must be positive seconds (or None: no limit), got {request_timeout}")
    metrics = Metrics()
    info = engine.info
    name = model_name or Path(info.path).stem
    modified = Path(info.path).stat().st_mtime

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.worker = worker = Worker(engine, queue_size, metrics)
        metrics.queue_depth.set_function(lambda: worker.waiting)
        try:
            yield
        finally:
            app.state.worker.stop()

    app = FastAPI(title="minfer", lifespan=lifespan)
    app.state.request_timeout = request_timeout
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(MinferError)
    async def on_minfer_error(request: Request, exc: MinferError) -> JSONResponse:
        return error_response(request, ApiError.of(exc))

    @app.exception_handler(JobInterrupted)
    async def on_interrupted(request: Request, exc: JobInterrupted) -> JSONResponse:
        return error_response(request, ApiError.of(exc))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, validation_error(exc))

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "request_too_large" if exc.status_code == 413 else "invalid_request_error"
        return error_response(request, ApiError(exc.status_code, str(exc.detail), kind=kind, headers=exc.headers))

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(401, "invalid or missing API key: send the header Authorization: Bearer KEY",
                           kind="authentication_error", code="invalid_api_key")  # fmt: skip

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    routes = APIRouter(dependencies=[Depends(check_key)])

    @routes.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @routes.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": int(modified), "owned_by": "minfer"}],
        }

    @routes.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        max_tokens = body.max_completion_tokens or body.max_tokens
        job = await start_job(request, openai_request(body, messages_of(body.messages), max_tokens))
        header = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
        if body.stream:

            def delta(text: str, finish: str | None) -> dict[str, Any]:
                return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}

            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            chunks = openai_stream(job, {**header, "object": "chat.completion.chunk"}, delta, first, include_usage)
            return StreamingResponse(chunks, media_type="text/event-stream")
        end = await collect(job)
        assert end.generation is not None
        message = {"role": "assistant", "content": end.generation.text}
        choice = {"index": 0, "message": message, "finish_reason": finish_reason(end)}
        return {**header, "object": "chat.completion", "choices": [choice], "usage": usage(end)}

    @routes.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        generation = openai_request(body, body.prompt, body.max_tokens)
        generation.template = False  # a completion continues the text as given
        job = await start_job(request, generation)
        header = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                  "model": name}  # fmt: skip

        def text_choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            chunks = openai_stream(job, header, text_choice, None, include_usage)
            return StreamingResponse(chunks, media_type="text/event-stream")
        end = await collect(job)
        assert end.generation is not None
        return {**header, "choices": [text_choice(end.generation.text, finish_reason(end))], "usage": usage(end)}

    @routes.post("/api/chat", response_model=None)
    async def ollama_chat(body: OllamaChatRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        job = await start_job(request, ollama_request(body, messages_of(body.messages), template=True))

        def message(text: str) -> dict[str, Any]:
            return {"message": {"role": "assistant", "content": text}}

        if body.stream:
            return StreamingResponse(ollama_stream(job, name, message), media_type="application/x-ndjson")
        end = await collect(job)
        assert end.generation is not None
        return {"model": name, "created_at": now_iso(), **message(end.generation.text), **ollama_stats(end)}

    @routes.post("/api/generate", response_model=None)
    async def ollama_generate(body: OllamaGenerateRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        if not body.prompt.strip():
            raise ApiError(400, "prompt: empty prompt, nothing to generate from", param="prompt")
        if body.raw:
            prompt: str | list[dict[str, str]] = body.prompt
        else:
            system = [{"role": "system", "content": body.system}] if body.system is not None else []
            prompt = [*system, {"role": "user", "content": body.prompt}]
        job = await start_job(request, ollama_request(body, prompt, template=not body.raw))

        def response(text: str) -> dict[str, Any]:
            return {"response": text}

        if body.stream:
            return StreamingResponse(ollama_stream(job, name, response), media_type="application/x-ndjson")
        end = await collect(job)
        assert end.generation is not None
        return {"model": name, "created_at": now_iso(), **response(end.generation.text), **ollama_stats(end)}

    @routes.get("/api/tags")
    async def ollama_tags() -> dict[str, Any]:
        details = {
            "format": "gguf",
            "family": info.architecture,
            "families": [info.architecture],
            "parameter_size": f"{info.n_parameters / 1e6:.0f}M",
            "quantization_level": max(info.quant_mix, key=info.quant_mix.get, default=""),
        }
        modified_at = datetime.fromtimestamp(modified, UTC).isoformat().replace("+00:00", "Z")
        return {"models": [{"name": name, "model": name, "modified_at": modified_at, "size": info.file_size,
                            "details": details}]}  # fmt: skip

    @routes.get("/api/version")
    async def ollama_version() -> dict[str, str]:
        return {"version": importlib.metadata.version("minfer-server")}

    app.include_router(routes)
    # Outermost, so that a request refused by the body limit is counted and logged too.
    served = frozenset(route.path for route in [*app.routes, *routes.routes] if isinstance(route, APIRoute))
    app.add_middleware(Observe, metrics=metrics, routes=served)
    return app
