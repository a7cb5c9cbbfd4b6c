"""The Python API as a new user meets it: eager argument checks, whole replies with their usage, closing a
model, and the thread count."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info

import minfer
from minfer.errors import ContextOverflowError, MinferError
from minfer.testing import workers as test_workers
from minfer.threads import default_threads


@pytest.fixture
def engine(synthetic_model) -> minfer.Engine:
    return minfer.load(synthetic_model("tiny-llama", "Q8_0"), backend="cpu", ctx_size=128)


def blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_a_mistyped_keyword_fails_at_the_call_not_at_the_first_piece(engine):
    with pytest.raises(MinferError, match=r"unknown sampling parameter 'temprature'"):
        engine.generate("Hi", temprature=0)  # not iterated
    with pytest.raises(MinferError, match=r"max tokens must be a positive integer, got 0"):
        engine.generate("Hi", max_tokens=0)
    with pytest.raises(ContextOverflowError, match=r"exceeds the context size 128"):
        engine.generate("Hi", max_tokens=500)
    with pytest.raises(MinferError, match=r"sampling must be a SamplingParams, got dict"):
        engine.generate("Hi", sampling={"temperature": 0})
    with pytest.raises(MinferError, match=r"max tokens must be a positive integer"):
        engine.stream([1, 2, 3], max_tokens=-1)
    chat = engine.chat(max_tokens=100)
    with pytest.raises(ContextOverflowError, match=r"does not fit the context size 128"):
        chat.send("word " * 200)  # not iterated
    with pytest.raises(MinferError, match=r"empty message"):
        chat.send("  ")
    assert chat.turns == []


def test_a_generator_that_was_never_iterated_changes_nothing(engine):
    chat = engine.chat(sampling=minfer.SamplingParams(temperature=0), max_tokens=4)
    pieces = chat.send("Hello")
    assert chat.turns == [] and engine.kv_tokens == []
    assert "".join(pieces) == chat.turns[-1]["content"]


def test_complete_returns_the_whole_reply_with_its_usage(engine):
    result = engine.complete("Hello there", max_tokens=5, temperature=0)
    assert isinstance(result, minfer.Generation)
    assert result.text == "".join(engine.generate("Hello there", max_tokens=5, temperature=0))
    stats = result.stats
    assert stats.generated_tokens == len(result.tokens) <= 5
    assert stats.stop_reason in ("length", "eos") and stats.prompt_tokens > 0 and stats.prompt_seconds > 0
    assert stats.threads == engine.threads


def test_send_text_runs_a_turn_and_reuses_the_cache(engine):
    chat = engine.chat(sampling=minfer.SamplingParams(temperature=0), max_tokens=4)
    first = chat.send_text("Hello")
    assert chat.turns[-1] == {"role": "assistant", "content": first.text} and first.stats.cached_tokens == 0
    second = chat.send_text("And then?")
    assert second.stats.cached_tokens > 0  # the first turn's tokens came from the cache
    assert second.stats.cached_tokens + second.stats.prompt_tokens == len(engine.kv_tokens) - len(second.tokens) + 1


def test_a_closed_model_refuses_to_run_and_closing_twice_is_harmless(synthetic_model):
    with minfer.load(synthetic_model("tiny-llama", "Q8_0"), backend="cpu", ctx_size=64) as model:
        assert model.complete("Hi", max_tokens=2, temperature=0).stats.generated_tokens >= 0
    assert model.backend is None
    model.close()
    for use in (lambda: model.complete("Hi"), lambda: model.info, lambda: model.forward([1], 0)):
        with pytest.raises(MinferError, match=r"this model was closed \(Engine\.close\)"):
            use()


def test_threads_set_numpys_blas_and_are_reported(synthetic_model):
    engine = minfer.load(synthetic_model("tiny-llama", "Q8_0"), backend="cpu", ctx_size=64, threads=1)
    assert engine.threads == engine.info.threads == 1 and blas_threads() == {1}
    engine.set_threads(None)
    assert engine.threads == default_threads() and blas_threads() == {default_threads()}
    with pytest.raises(MinferError, match=r"threads must be a positive integer, got 0"):
        engine.set_threads(0)


@pytest.mark.parametrize("cpus, workers", [(range(16), 4), (range(16), 3), (range(16), 16), ([2, 3, 5], 8)])
def test_xdist_workers_split_the_cpus_so_their_default_threads_do_not_oversubscribe(monkeypatch, cpus, workers):
    cpus, shares = list(cpus), []
    monkeypatch.setattr(test_workers.os, "sched_getaffinity", lambda pid: set(cpus))
    monkeypatch.setattr(test_workers.os, "sched_setaffinity", lambda pid, share: shares.append(list(share)))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    for index in range(workers):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        test_workers.pin_to_worker_share()
    if workers <= len(cpus):  # disjoint slices that cover every CPU
        assert [cpu for share in shares for cpu in share] == cpus and all(shares)
    else:  # one CPU each, in turn
        assert shares == [[cpus[index % len(cpus)]] for index in range(workers)]
