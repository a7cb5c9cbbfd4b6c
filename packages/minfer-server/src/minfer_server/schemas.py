"""The wire formats: the requests of the OpenAI and Ollama APIs as pydantic models.

Requests are validated strictly (a string where a number belongs is refused, not converted) and fields minfer
does not know are ignored, as both APIs' servers do. Responses are built as plain dicts in `app.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]


class WireModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        """The content as one string: OpenAI's list of text parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(WireModel):
    include_usage: bool = False


class JsonSchemaFormat(WireModel):
    """OpenAI's `response_format.json_schema`: the reply is JSON that validates against `schema`."""

    name: str
    # `schema` would shadow a BaseModel attribute: the wire name is an alias.
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # the reply always follows the schema, strict or not


class ResponseFormat(WireModel):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON that follows `json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class OpenAISampling(WireModel):
    """What /v1/chat/completions and /v1/completions share: the reply budget, sampling, stop strings, streaming."""

    model: str | None = None  # one model is served: any name is answered by it
    max_tokens: PositiveInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Literal[1] = 1  # one choice per request
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else self.stop


class ChatCompletionRequest(OpenAISampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None  # the newer name of max_tokens; it wins when both are given


class CompletionRequest(OpenAISampling):
    prompt: str


class OllamaOptions(WireModel):
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    num_predict: int | None = None  # -1 (no limit) and -2 (fill the context) are the rest of the context
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None


class OllamaRequest(WireModel):
    """What /api/chat and /api/generate share."""

    model: str | None = None
    stream: bool = True  # Ollama streams NDJSON unless told not to
    options: OllamaOptions = Field(default_factory=OllamaOptions)
    format: Any = None  # "json" (any JSON object) or a JSON schema; checked by the routes (app.ollama_grammar)


class OllamaChatRequest(OllamaRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]


class OllamaGenerateRequest(OllamaRequest):
    prompt: str
    system: str | None = None
    raw: bool = False  # the prompt as given, without the chat template
