"""Operations in process: /metrics moves with the requests, the request timeout ends a reply, the access log."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_steps import AUTH

pytestmark = pytest.mark.timeout(60)

HELLO = [{"role": "user", "content": "Hello"}]


def scrape(running) -> dict[str, float]:
    """Every sample of /metrics by its name and labels, as `name{label="value",...}`."""
    response = httpx.get(f"{running.url}/metrics", headers=AUTH, timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_metrics_count_the_requests_and_their_tokens(running):
    before = scrape(running)
    replies = [
        httpx.post(f"{running.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3}, headers=AUTH,
                   timeout=30)
        for _ in range(2)
    ]  # fmt: skip
    assert [reply.status_code for reply in replies] == [200, 200]
    refused = httpx.post(f"{running.url}/v1/chat/completions", json={"messages": HELLO, "n": 2}, headers=AUTH)
    assert refused.status_code == 400
    after = scrape(running)

    def moved(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert moved('minfer_requests_total{route="/v1/chat/completions",status="200"}') == 2
    assert moved('minfer_requests_total{route="/v1/chat/completions",status="400"}') == 1
    assert moved('minfer_request_duration_seconds_count{route="/v1/chat/completions"}') == 3
    generated = sum(reply.json()["usage"]["completion_tokens"] for reply in replies)
    prompt = sum(reply.json()["usage"]["prompt_tokens"] for reply in replies)
    assert moved("minfer_generated_tokens_total{}") == generated
    assert moved("minfer_prompt_tokens_total{}") == prompt
    assert moved("minfer_time_to_first_token_seconds_count{}") == 2
    assert moved("minfer_time_to_first_token_seconds_sum{}") > 0
    assert moved("minfer_generation_tokens_per_second_count{}") == 2
    assert after["minfer_queue_depth{}"] == 0
    # The scrape before this one is counted too, under its own route.
    assert moved('minfer_requests_total{route="/metrics",status="200"}') >= 1


def test_metrics_need_the_api_key(running):
    response = httpx.get(f"{running.url}/metrics", timeout=30)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_an_unknown_path_is_counted_as_other(running):
    before = scrape(running)
    assert httpx.get(f"{running.url}/no/such/route", headers=AUTH, timeout=30).status_code == 404
    after = scrape(running)
    key = 'minfer_requests_total{route="other",status="404"}'
    assert after[key] - before.get(key, 0.0) == 1
    assert not any("/no/such/route" in name for name in after)


def test_a_reply_past_the_timeout_is_504_in_each_shape_and_the_queue_moves_on(short_timeout_server):
    url = short_timeout_server.url
    started = time.monotonic()
    openai_reply = httpx.post(f"{url}/v1/chat/completions", json={"messages": HELLO, "temperature": 0}, timeout=30)
    assert time.monotonic() - started < 10
    assert openai_reply.status_code == 504
    error = openai_reply.json()["error"]
    assert error["code"] == "request_timeout" and error["type"] == "timeout_error"
    assert "timeout of 0.5 seconds" in error["message"]
    ollama_reply = httpx.post(f"{url}/api/chat", json={"messages": HELLO, "stream": False}, timeout=30)
    assert ollama_reply.status_code == 504
    assert ollama_reply.json() == {"error": error["message"]}
    after = httpx.post(f"{url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=30)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path", ["/v1/completions", "/api/generate"])
def test_a_stream_past_the_timeout_ends_with_an_error_event(short_timeout_server, path):
    with httpx.stream("POST", f"{short_timeout_server.url}{path}", json={"prompt": "Once", "stream": True},
                      timeout=30) as response:  # fmt: skip
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert len(lines) > 2  # pieces came before the timeout
    if path.startswith("/v1"):
        assert lines[-2].startswith("data: {") and "[DONE]" not in lines[-1]
        last = json.loads(lines[-1].removeprefix("data: "))
        assert last["error"]["code"] == "request_timeout"
    else:
        last = json.loads(lines[-1])
        assert set(last) == {"error"} and "timeout of 0.5 seconds" in last["error"]
        assert json.loads(lines[-2])["done"] is False


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """The access log's lines so far, each as its fields."""
    records = [r.getMessage() for r in caplog.records if r.name == "minfer_server.access"]
    return [dict(field.split("=", 1) for field in line.split(" ")) for line in records]


def test_each_request_is_one_access_log_line(running, caplog):
    caplog.set_level(logging.INFO, logger="minfer_server.access")
    reply = httpx.post(f"{running.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3}, headers=AUTH)
    assert reply.status_code == 200
    assert httpx.get(f"{running.url}/v1/models", timeout=30).status_code == 401
    # The server is shared: an earlier test's request (a timed-out stream) may log its line during this one, so
    # the lines of this test's two requests are picked by their paths.
    deadline = time.monotonic() + 10
    while True:
        lines = access_lines(caplog)
        generation = next((line for line in lines if line["path"] == "/v1/chat/completions"), None)
        refused = next((line for line in lines if line["path"] == "/v1/models"), None)
        if generation is not None and refused is not None:
            break
        assert time.monotonic() < deadline, f"no access-log lines of this test's two requests, only {lines}"
        time.sleep(0.01)
    assert [line["path"] for line in lines].count("/v1/chat/completions") == 1  # one line per request, not more
    assert [line["path"] for line in lines].count("/v1/models") == 1
    usage = reply.json()["usage"]
    assert generation["method"] == "POST" and generation["path"] == "/v1/chat/completions"
    assert generation["status"] == "200" and float(generation["duration_s"]) > 0
    assert generation["client"].startswith("127.0.0.1:")
    assert generation["prompt_tokens"] == str(usage["prompt_tokens"]) and generation["generated_tokens"] == "3"
    assert refused["path"] == "/v1/models" and refused["status"] == "401" and "prompt_tokens" not in refused
