"""The OpenAI routes through the official `openai` client: chat and completions, streamed and not, the models list."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_steps import API_KEY

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{running.url}/v1", api_key=API_KEY, max_retries=0)


def test_health_needs_no_key(running):
    response = httpx.get(f"{running.url}/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_models_lists_the_served_model(client):
    assert [model.id for model in client.models.list()] == ["tiny"]


def test_chat_completion(client):
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        max_tokens=5,
        temperature=0,
    )
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion" and reply.model == "tiny"
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 5 and 1 <= reply.usage.completion_tokens <= 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_greedy_chat_is_the_engines_reply(client, server_engine):
    """The reply is the engine's own: the same greedy text as Engine.complete for the same messages."""
    messages = [{"role": "user", "content": "Count to three."}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=8, temperature=0)
    expected = server_engine.complete(messages, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.completion_tokens == expected.stats.generated_tokens
    assert reply.choices[0].finish_reason == ("length" if expected.stats.stop_reason == "length" else "stop")


def test_streamed_chat_matches_the_whole_reply_and_ends_with_usage(client):
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert len({chunk.id for chunk in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
        )
    )
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)


def test_stream_ends_with_done(running):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    response = httpx.post(f"{running.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(event.startswith("data: ") for event in events) and events[-1] == "data: [DONE]"


def test_completion_continues_the_raw_prompt(client, server_engine):
    reply = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0, seed=1)
    expected = server_engine.complete("Once upon a time", max_tokens=6, temperature=0, template=False)
    assert reply.object == "text_completion" and reply.choices[0].text == expected.text
    assert reply.usage.prompt_tokens == len(server_engine.encode_prompt("Once upon a time", template=False))


def test_streamed_completion(client):
    whole = client.completions.create(model="tiny", prompt="The sky", max_tokens=6, temperature=0)
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="The sky",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_stop_string_ends_the_reply(client, server_engine):
    messages = [{"role": "user", "content": "Hello"}]
    free = server_engine.complete(messages, max_tokens=12, temperature=0).text
    stop = free[3:5]
    assert stop.strip(), f"no stop string to cut {free!r} at"
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0, stop=stop)
    assert reply.choices[0].message.content == free[: free.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
