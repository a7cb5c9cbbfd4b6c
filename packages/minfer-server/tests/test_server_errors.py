"""Bad requests: each gets its status in its route family's error shape, and the server keeps serving after it."""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest
from server_steps import API_KEY, AUTH

pytestmark = pytest.mark.timeout(60)

HELLO = [{"role": "user", "content": "Hello"}]


def post(running, path: str, body: object, headers: dict[str, str] = AUTH) -> httpx.Response:
    if isinstance(body, bytes):  # sent as JSON, as a client does, but not valid JSON
        headers = {**headers, "Content-Type": "application/json"}
        return httpx.post(f"{running.url}{path}", content=body, headers=headers, timeout=30)
    return httpx.post(f"{running.url}{path}", json=body, headers=headers, timeout=30)


def assert_openai_error(response: httpx.Response, status: int, param: str | None, code: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param and error["code"] == code
    return error["message"]


def assert_still_serving(running) -> None:
    response = post(running, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b'{"messages": [', None, "not valid JSON"),
        ({"messages": HELLO, "temperature": "hot"}, "temperature", "valid number"),
        ({"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role", "'system', 'user' or 'assistant'"),
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens", "greater than 0"),
        ({"messages": HELLO, "max_completion_tokens": -3}, "max_completion_tokens", "greater than 0"),
        ({"messages": HELLO, "response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
        ({"messages": HELLO, "response_format": {"type": "xml"}}, "response_format.type", "'json_schema'"),
        ({}, "messages", "Field required"),
    ],
)
def test_bad_chat_requests_are_400_naming_the_field(running, body, param, words):
    message = assert_openai_error(post(running, "/v1/chat/completions", body), 400, param)
    assert words in message
    assert_still_serving(running)


def test_a_sampling_value_out_of_range_is_400(running):
    message = assert_openai_error(post(running, "/v1/completions", {"prompt": "Hi", "top_p": 0}), 400, None)
    assert "top_p" in message
    assert_still_serving(running)


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(running, server_engine):
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "word " * server_engine.ctx_size}]
        )
    assert raised.value.code == "context_length_exceeded" and "context size" in raised.value.message
    message = assert_openai_error(
        post(running, "/v1/completions", {"prompt": "Hi", "max_tokens": server_engine.ctx_size}), 400, None,
        "context_length_exceeded",
    )  # fmt: skip
    assert "exceeds the context size" in message
    assert_still_serving(running)


def test_a_body_over_the_limit_is_413(running):
    big = {"messages": [{"role": "user", "content": "x" * 2**21}]}
    message = assert_openai_error(post(running, "/v1/chat/completions", big), 413, None)
    assert "over the limit of 1048576 bytes" in message
    response = post(running, "/api/chat", big)
    assert response.status_code == 413 and "over the limit" in response.json()["error"]

    def chunked():  # no Content-Length: the limit is counted as the body is read
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"x" * 2**16
        yield b'"}]}'

    response = httpx.post(f"{running.url}/v1/chat/completions", content=chunked(), headers=AUTH, timeout=30)
    assert response.status_code == 413 and "over the limit" in response.json()["error"]["message"]
    assert_still_serving(running)


def test_unknown_routes_are_404_in_the_familys_shape(running):
    assert "message" in httpx.get(f"{running.url}/v1/nothing", headers=AUTH).json()["error"]
    assert isinstance(httpx.get(f"{running.url}/api/nothing", headers=AUTH).json()["error"], str)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}])
def test_the_api_key_is_checked_on_every_route_but_health(running, headers):
    assert httpx.get(f"{running.url}/health", headers=headers).status_code == 200
    for path in ("/v1/models", "/api/tags", "/api/version"):
        response = httpx.get(f"{running.url}{path}", headers=headers)
        assert response.status_code == 401
    assert_openai_error(post(running, "/v1/chat/completions", {"messages": HELLO}, headers), 401, None,
                        "invalid_api_key")  # fmt: skip
    response = post(running, "/api/chat", {"messages": HELLO}, headers)
    assert response.status_code == 401 and "API key" in response.json()["error"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{running.url}/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/api/chat", b"{not json", "not valid JSON"),
        ("/api/chat", {"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role"),
        ("/api/chat", {"messages": HELLO, "options": {"temperature": "hot"}}, "options.temperature"),
        ("/api/chat", {"messages": HELLO, "format": "xml"}, 'format: must be "json" or a JSON schema'),
        ("/api/generate", {"prompt": "Hi", "options": {"num_predict": 0}}, "num_predict"),
        ("/api/generate", {"prompt": "   "}, "empty prompt"),
        ("/api/generate", {"prompt": "word " * 9000}, "context size"),
    ],
)
def test_bad_ollama_requests_are_400_with_a_message(running, path, body, words):
    response = post(running, path, body)
    assert response.status_code == 400 and list(response.json()) == ["error"] and words in response.json()["error"]
    assert_still_serving(running)


def test_the_ollama_client_sees_the_error(running):
    client = ollama.Client(host=running.url, headers=AUTH)
    with pytest.raises(ollama.ResponseError) as raised:
        client.chat(model="tiny", messages=HELLO, format={"type": "string", "minLength": -1})
    assert raised.value.status_code == 400 and "format" in raised.value.error
