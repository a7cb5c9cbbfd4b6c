"""The Ollama routes through the official `ollama` client: chat and generate, streamed (its default) and not."""

from __future__ import annotations

import httpx
import ollama
import pytest
from server_steps import API_KEY

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(running) -> ollama.Client:
    return ollama.Client(host=running.url, headers={"Authorization": f"Bearer {API_KEY}"})


def test_chat(client, server_engine):
    messages = [{"role": "user", "content": "Hello"}]
    reply = client.chat(model="tiny", messages=messages, stream=False, options={"temperature": 0, "num_predict": 6})
    expected = server_engine.complete(messages, max_tokens=6, temperature=0)
    assert reply.done and reply.message.role == "assistant" and reply.message.content == expected.text
    assert reply.eval_count == expected.stats.generated_tokens and reply.prompt_eval_count > 0
    assert reply.done_reason in ("stop", "length") and reply.model == "tiny"


def test_streamed_chat_matches_the_whole_reply(client):
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
               "options": {"temperature": 0, "num_predict": 10}}  # fmt: skip
    whole = client.chat(**request, stream=False)
    parts = list(client.chat(**request, stream=True))
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].eval_count == whole.eval_count


def test_generate_with_system_and_sampling_options(client, server_engine):
    options = {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.1, "seed": 3, "repeat_penalty": 1.1,
               "num_predict": 6}  # fmt: skip
    first = client.generate(model="tiny", prompt="Why?", system="Be brief.", stream=False, options=options)
    again = client.generate(model="tiny", prompt="Why?", system="Be brief.", stream=False, options=options)
    assert first.response == again.response  # the seed makes sampling reproducible
    parts = client.generate(model="tiny", prompt="Why?", system="Be brief.", stream=True, options=options)
    streamed = "".join(part.response for part in parts)
    assert streamed == first.response
    expected = server_engine.complete(
        "Why?", system="Be brief.", max_tokens=6, temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, seed=3,
        repeat_penalty=1.1,
    )  # fmt: skip
    assert first.response == expected.text


def test_generate_raw_and_stop(client, server_engine):
    free = server_engine.complete("Once", max_tokens=10, temperature=0, template=False).text
    stop = free[2:4]
    reply = client.generate(model="tiny", prompt="Once", raw=True, stream=False,
                            options={"temperature": 0, "num_predict": 10, "stop": [stop]})  # fmt: skip
    assert reply.response == free[: free.index(stop)] and reply.done_reason == "stop"


def test_tags_and_version(client, running):
    models = client.list().models
    assert [model.model for model in models] == ["tiny"]
    assert models[0].details.format == "gguf" and models[0].details.family == "llama" and models[0].size > 0
    version = httpx.get(f"{running.url}/api/version", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert version == {"version": "0.1.0"}
