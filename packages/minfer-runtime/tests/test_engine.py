"""The engine's generation loop, KV reuse, chat sessions and their edge cases (CPU, synthetic models)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import minfer
from minfer import bench
from minfer.errors import BackendError, ContextOverflowError, EngineBusyError, MinferError
from minfer.generation import StopMatcher
from minfer.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def engine(synthetic_model) -> minfer.Engine:
    return minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=256)


def test_generate_streams_pieces_and_records_stats(engine):
    result = minfer.Generation()
    prompt = engine.encode_prompt("Hello there")
    pieces = list(engine.stream(prompt, max_tokens=12, sampling=GREEDY, result=result))
    stats = result.stats
    assert engine.last_stats is stats
    assert stats.stop_reason in {"length", "eos"}
    assert (
        stats.generated_tokens
        == len(result.tokens)
        == (12 if stats.stop_reason == "length" else stats.generated_tokens)
    )
    assert "".join(pieces) == result.text == engine.tokenizer.decode(result.tokens)
    assert stats.prompt_tokens == len(prompt) and stats.prompt_seconds > 0
    assert engine.kv_tokens[: len(prompt)] == prompt


def test_greedy_generation_is_deterministic_and_seeded_sampling_reproducible(engine):
    first = "".join(engine.generate("Tell me a story", max_tokens=16, sampling=GREEDY))
    engine.reset()
    assert "".join(engine.generate("Tell me a story", max_tokens=16, sampling=GREEDY)) == first
    sampled = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    a = "".join(engine.generate("Tell me a story", max_tokens=16, sampling=sampled))
    b = "".join(engine.generate("Tell me a story", max_tokens=16, sampling=sampled))
    assert a == b


def test_incremental_decoding_matches_a_full_forward_pass(engine):
    ids = engine.encode_prompt("The quick brown fox")
    engine.reset()
    program, ran = engine.prefill(ids)
    assert ran == len(ids)
    next_token = program.argmax("logits")
    step = engine.forward([next_token], len(ids)).read("logits")
    engine.reset()
    full, _ = engine.prefill([*ids, next_token])
    np.testing.assert_allclose(step, full.read("logits"), rtol=1e-4, atol=1e-5)


def one_step_at_a_time(engine: minfer.Engine, token: int, position: int, n: int) -> list[int]:
    picks = []
    for step in range(n):
        token = engine.forward([token], position + step).argmax("logits")
        picks.append(token)
    return picks


@pytest.mark.parametrize("chunk", [1, 4, minfer.engine.GREEDY_CHUNK])
def test_greedy_chunks_give_the_picks_and_cache_of_one_step_at_a_time(engine, monkeypatch, chunk):
    """Engine.greedy (generation's greedy loop: chunks of steps whose picks come back together) against
    forward + argmax per step: the same picks, kv_tokens and cache (the next step's logits)."""
    monkeypatch.setattr(minfer.engine, "GREEDY_CHUNK", chunk)
    ids = engine.encode_prompt("Count to ten")
    engine.reset()
    first = engine.prefill(ids)[0].argmax("logits")
    expected = one_step_at_a_time(engine, first, len(ids), 40)
    expected_cache, expected_logits = list(engine.kv_tokens), engine.forward([5], len(ids) + 40).read("logits")
    engine.reset()
    engine.prefill(ids)
    assert engine.greedy(first, len(ids), 40) == expected
    assert engine.kv_tokens == expected_cache  # the last pick is not run: no step has fed it yet
    np.testing.assert_array_equal(engine.forward([5], len(ids) + 40).read("logits"), expected_logits)


def test_greedy_refuses_what_forward_refuses(engine):
    engine.reset()
    engine.prefill([5, 6, 7])
    with pytest.raises(MinferError, match=r"^token id 512 is outside the vocabulary"):
        engine.greedy(512, 3, 4)
    with pytest.raises(ContextOverflowError, match=r"positions 250\.\.256 exceed the context size 256"):
        engine.greedy(5, 250, 7)
    assert engine.kv_tokens == [5, 6, 7]  # refused before any step ran


def test_prefill_reuses_the_cached_prefix(engine):
    ids = engine.encode_prompt("A question about caches")
    engine.reset()
    engine.prefill(ids)
    _, ran = engine.prefill([*ids, 7, 8, 9])
    assert ran == 3
    _, ran = engine.prefill([*ids, 7, 8, 9])
    assert ran == 1  # everything is cached: the last token runs again for its logits
    _, ran = engine.prefill([*ids[:-2], 11])
    assert ran == 1 and engine.kv_tokens == [*ids[:-2], 11]


def test_long_prompts_are_prefilled_in_chunks(engine, monkeypatch):
    monkeypatch.setattr(minfer.engine, "PREFILL_CHUNK", 8)
    ids = [int(t) for t in np.random.default_rng(0).integers(3, 400, size=21)]
    engine.reset()
    chunked = engine.prefill(ids)[0].read("logits")
    monkeypatch.setattr(minfer.engine, "PREFILL_CHUNK", 512)
    engine.reset()
    whole = engine.prefill(ids)[0].read("logits")
    np.testing.assert_allclose(chunked, whole, rtol=1e-4, atol=1e-5)


def test_context_overflow_is_refused_up_front_with_the_numbers(engine):
    with pytest.raises(
        ContextOverflowError, match=r"prompt \(\d+ tokens\) \+ max tokens \(250\) = \d+ exceeds the context size 256"
    ):
        list(engine.generate("Hello there friend", max_tokens=250))


def test_bad_requests_are_clear_errors(engine):
    with pytest.raises(MinferError, match="empty prompt"):
        list(engine.generate("   "))
    with pytest.raises(MinferError, match="max tokens must be a positive integer, got 0"):
        list(engine.generate("hi", max_tokens=0))
    with pytest.raises(MinferError, match="outside the vocabulary"):
        engine.forward([10**6], 0)


def test_stop_strings_cut_the_stream(engine):
    text = "".join(engine.generate("Go on", max_tokens=24, sampling=GREEDY))
    assert len(text) > 4, "the tiny model should produce some text"
    stop = text[2:4]
    cut = "".join(engine.generate("Go on", max_tokens=24, sampling=GREEDY, stop=[stop]))
    assert cut == text[: text.index(stop)]
    assert engine.last_stats.stop_reason == "stop"


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["Hello", " wor", "ld", "!"], ["world"], ("Hello ", True)),
        (["ab", "c"], ["bcd"], ("abc", False)),
        (["x<", "|e", "nd|>", "y"], ["<|end|>"], ("x", True)),
    ],
)
def test_stop_matcher_holds_back_possible_stop_prefixes(pieces, stops, expected):
    matcher = StopMatcher(stops)
    emitted, stopped = "", False
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        emitted += text
        if stopped:
            break
    if not stopped:
        emitted += matcher.feed("", final=True)[0]
    assert (emitted, stopped) == expected


def test_closing_the_stream_cancels_and_keeps_stats(engine):
    stream = engine.generate("Keep talking", max_tokens=100, sampling=GREEDY)
    received = [next(stream), next(stream)]
    stream.close()
    assert engine.last_stats.stop_reason == "cancelled"
    assert engine.last_stats.generated_tokens >= len(received)


def test_on_start_runs_once_the_generation_holds_the_engine_and_never_for_a_refused_one(engine):
    engine.reset()
    calls: list[str] = []
    prompt = engine.encode_prompt("Hello there")
    first = engine.stream(prompt, max_tokens=8, sampling=GREEDY, on_start=lambda: calls.append("first"))
    assert calls == []  # a generator that has not started holds nothing
    next(first)
    assert calls == ["first"]
    refused = engine.stream(prompt, max_tokens=8, sampling=GREEDY, on_start=lambda: calls.append("refused"))
    with pytest.raises(EngineBusyError):
        next(refused)
    list(first)
    assert calls == ["first"]


def test_chat_second_turn_prefills_only_its_own_tokens(engine):
    chat = engine.chat(system="You are terse.", sampling=GREEDY, max_tokens=8)
    first = "".join(chat.send("Hello"))
    assert chat.turns[-1] == {"role": "assistant", "content": first}
    cached = len(engine.kv_tokens)
    "".join(chat.send("And again?"))
    conversation = engine.tokenizer.encode(engine.template.render(chat.messages[:-1], add_generation_prompt=True))
    assert chat.last.stats.prompt_tokens == len(conversation) - cached
    assert len(chat.turns) == 4


def test_chat_turns_give_the_same_tokens_as_a_fresh_run(engine, synthetic_model):
    chat = engine.chat(sampling=GREEDY, max_tokens=6)
    for text in ("One", "Two", "Three"):
        "".join(chat.send(text))
    fresh = minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=256)
    replay = fresh.chat(sampling=GREEDY, max_tokens=6)
    replay.turns = chat.turns[:-1]
    prompt = fresh.encode_prompt(replay.messages)
    tokens = list(fresh.stream(prompt, max_tokens=6, sampling=GREEDY))
    assert "".join(tokens) == chat.turns[-1]["content"]


def test_chat_regenerate_clear_and_save(engine, tmp_path):
    chat = engine.chat(sampling=SamplingParams(temperature=1.0, seed=5), max_tokens=6)
    with pytest.raises(MinferError, match="nothing to regenerate"):
        chat.regenerate()
    "".join(chat.send("Hi"))
    "".join(chat.regenerate())
    assert [m["role"] for m in chat.turns] == ["user", "assistant"]
    saved = chat.save(tmp_path / "chat.json")
    assert json.loads(saved.read_text())["messages"][0] == {"role": "user", "content": "Hi"}
    assert "## User\n\nHi" in chat.save(tmp_path / "chat.md").read_text()
    chat.clear()
    assert chat.messages == [] and chat.context_used == 0


def test_chat_drops_oldest_turns_when_the_context_fills(synthetic_model):
    engine = minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=64)
    chat = engine.chat(sampling=GREEDY, max_tokens=8)
    for _ in range(6):
        "".join(chat.send("a fairly long message to fill the context"))
    assert chat.dropped_turns >= 1
    assert chat.context_used <= engine.ctx_size
    with pytest.raises(ContextOverflowError, match="does not fit the context size 64"):
        "".join(chat.send("word " * 80))
    assert chat.turns[-1]["role"] == "assistant"  # the refused message was not kept


def test_a_refused_regenerate_keeps_the_conversation(engine):
    chat = engine.chat(sampling=GREEDY, max_tokens=6)
    reply = "".join(chat.send("Hi"))
    chat.max_tokens = engine.ctx_size
    with pytest.raises(ContextOverflowError):
        chat.regenerate()
    assert chat.turns == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": reply}]


def test_generate_takes_sampling_fields_by_name(engine):
    by_name = "".join(engine.generate("Name it", max_tokens=8, temperature=0))
    assert by_name == "".join(engine.generate("Name it", max_tokens=8, sampling=GREEDY))
    seeded = "".join(engine.generate("Name it", max_tokens=8, sampling=GREEDY, temperature=1.0, seed=3))
    assert seeded == "".join(engine.generate("Name it", max_tokens=8, temperature=1.0, seed=3))
    with pytest.raises(MinferError, match="unknown sampling parameter 'temp'"):
        list(engine.generate("Name it", temp=0.5))


# -- every bad request is a MinferError naming what is wrong ---------------------------------------


@pytest.mark.parametrize(
    ("tokens", "named"),
    [([5, -3, 10**6], "-3"), ([7, 10**6], "1000000"), ([2**40], str(2**40)), ([1.5], "1.5")],
    ids=["negative", "too-large", "beyond-int32", "not-an-integer"],
)
def test_a_bad_token_id_is_named_whichever_way_it_is_wrong(engine, tokens, named):
    with pytest.raises(MinferError, match=rf"^token id {named} is outside the vocabulary \(integers 0\.\.511\)$"):
        engine.forward(tokens, 0)


def test_bad_forward_and_prefill_arguments_are_clear_errors(engine):
    with pytest.raises(MinferError, match="no tokens to run"):
        engine.forward([], 0)
    with pytest.raises(MinferError, match=r"start position -1 is not a position"):
        engine.forward([5], -1)
    engine.reset()
    engine.prefill([5, 6, 7])
    with pytest.raises(ContextOverflowError, match="257 tokens exceed the context size 256"):
        engine.prefill([5] * 257)
    assert engine.kv_tokens == [5, 6, 7]  # refused before any chunk ran


def test_a_compiled_graphs_inputs_are_checked_by_name(engine):
    program = engine.program(1)
    good = {"tokens": [5], "positions": [0], "kv_len": [1]}
    cases = {
        "cpu: input 'tokens' has shape (2,), the graph expects (1,)": {**good, "tokens": [5, 6]},
        "cpu: input 'kv_len' is missing (the graph reads tokens, positions, kv_len)": {"tokens": [5], "positions": [0]},
        "cpu: input 'positions' is not int32 data": {**good, "positions": [2**40]},
    }
    for message, inputs in cases.items():
        with pytest.raises(BackendError, match=f"^{re.escape(message)}"):
            program.run(inputs)


def test_a_context_size_of_zero_is_refused_not_taken_as_the_default(synthetic_model):
    with pytest.raises(MinferError, match=r"context size 0 is outside 1\.\.512"):
        minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=0)


@pytest.mark.parametrize(
    ("stop", "message"),
    [("abc", "a list of strings, not the string 'abc'"), (["ok", None], "must be strings, got None")],
)
def test_stop_strings_must_be_a_list_of_strings(engine, stop, message):
    with pytest.raises(MinferError, match=re.escape(message)):
        list(engine.generate("Hi", max_tokens=4, stop=stop))


@pytest.mark.parametrize(
    ("test", "repetitions", "message"),
    [
        (bench.BenchTest(8, 0), 0, "repetitions must be at least 1 (-r), got 0"),
        (bench.BenchTest(8, 0, -1), 1, "every depth (-d) must be zero or more, got -1"),
        (bench.BenchTest(-8, 0), 1, "every prompt size (-p) must be zero or more, got -8"),
        (bench.BenchTest(0, -4), 1, "every generation length (-n) must be zero or more, got -4"),
        (bench.BenchTest(0, 0), 1, "no prompt and no generation measures nothing"),
        (bench.BenchTest(0, 4, threads=0), 1, "thread counts must be at least 1 (-t), got 0"),
    ],
)
def test_bench_refuses_tests_it_cannot_measure(engine, test, repetitions, message):
    with pytest.raises(MinferError, match=re.escape(message)):
        bench.check_tests(engine, [test], repetitions)
