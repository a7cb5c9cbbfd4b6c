"""Structured output through the official clients: OpenAI's `response_format` and Ollama's `format`.

The test model never ends a reply on its own (its end-of-text logits are zero), so each reply below ends because
its grammar is complete: that and the schema's validation are what these tests check.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import openai
import pytest
from server_steps import API_KEY, AUTH

pytestmark = pytest.mark.timeout(60)

ORDER = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "maxLength": 10},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "express": {"type": "boolean"},
    },
    "required": ["item", "quantity", "express"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Order something as JSON."}]


@pytest.fixture
def structured_openai(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{running.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture
def structured_ollama(running) -> ollama.Client:
    return ollama.Client(host=running.url, headers=AUTH)


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "order", "schema": schema, "strict": True}}


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_openai_json_schema_reply_validates(structured_openai, temperature):
    reply = structured_openai.chat.completions.create(
        model="tiny", messages=ASK, response_format=json_schema_format(ORDER), temperature=temperature, seed=3,
        max_tokens=200,
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), ORDER)


def test_openai_streamed_json_schema_reply_validates(structured_openai):
    chunks = structured_openai.chat.completions.create(
        model="tiny", messages=ASK, response_format=json_schema_format(ORDER), temperature=0, max_tokens=200,
        stream=True,
    )  # fmt: skip
    pieces, finish = [], None
    for chunk in chunks:
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads("".join(pieces)), ORDER)


def test_openai_completion_with_json_schema_validates(structured_openai):
    reply = structured_openai.completions.create(
        model="tiny", prompt="An order:", extra_body={"response_format": json_schema_format(ORDER)}, temperature=0,
        max_tokens=200,
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].text), ORDER)


def test_openai_json_object_reply_is_an_object(structured_openai):
    reply = structured_openai.chat.completions.create(
        model="tiny", messages=ASK, response_format={"type": "json_object"}, temperature=0, max_tokens=600
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_openai_text_format_is_plain_text(structured_openai):
    reply = structured_openai.chat.completions.create(
        model="tiny", messages=ASK, response_format={"type": "text"}, temperature=0, max_tokens=6
    )
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 6


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_format_schema_reply_validates(structured_ollama, stream):
    options = {"temperature": 0, "num_predict": 200}
    if stream:
        parts = list(structured_ollama.chat(model="tiny", messages=ASK, format=ORDER, options=options, stream=True))
        content, done_reason = "".join(part.message.content for part in parts), parts[-1].done_reason
    else:
        reply = structured_ollama.chat(model="tiny", messages=ASK, format=ORDER, options=options)
        content, done_reason = reply.message.content, reply.done_reason
    assert done_reason == "stop"
    jsonschema.validate(json.loads(content), ORDER)


def test_ollama_generate_format_json_is_an_object(structured_ollama):
    reply = structured_ollama.generate(
        model="tiny", prompt="Any JSON", format="json", options={"temperature": 0, "repeat_penalty": 2.0,
                                                                 "num_predict": 600}
    )  # fmt: skip
    assert reply.done_reason == "stop" and isinstance(json.loads(reply.response), dict)


BAD_SCHEMA = {"type": "object", "properties": {"n": {"type": "whole number"}}}


def test_a_schema_the_grammar_engine_rejects_is_400_naming_the_field(running, structured_openai):
    with pytest.raises(openai.BadRequestError) as raised:
        structured_openai.chat.completions.create(
            model="tiny", messages=ASK, response_format=json_schema_format(BAD_SCHEMA)
        )
    error = raised.value.body
    assert error["param"] == "response_format.json_schema.schema"
    assert (
        error["message"].startswith("response_format.json_schema.schema: ")
        and "Invalid type: whole number" in error["message"]
    )
    response = httpx.post(f"{running.url}/api/generate", json={"prompt": "Hi", "format": BAD_SCHEMA}, headers=AUTH)
    assert response.status_code == 400 and response.json()["error"].startswith("format: ")
    assert "Invalid type: whole number" in response.json()["error"]
