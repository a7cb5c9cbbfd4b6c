"""One Engine runs one generation at a time: a second one (another thread, or a second generator started while
the first is suspended) is refused with EngineBusyError instead of interleaving with the first in the one KV
cache, which gave garbage without an error."""

from __future__ import annotations

import gc
import threading

import pytest

import minfer
from minfer.errors import EngineBusyError, MinferError
from minfer.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0)
BUSY = r"^the model is busy with another generation; one Engine runs one at a time$"
PROMPT = "Tell me a long story"


@pytest.fixture(scope="module")
def engine(synthetic_model) -> minfer.Engine:
    return minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=256)


@pytest.fixture(scope="module")
def reference(engine) -> str:
    """The greedy reply to PROMPT when nothing else runs."""
    engine.reset()
    return "".join(engine.generate(PROMPT, max_tokens=24, sampling=GREEDY))


def assert_free(engine: minfer.Engine, reference: str) -> None:
    """The engine takes a new generation, and its cache was not corrupted: the reply is the undisturbed one."""
    engine.reset()
    assert "".join(engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)) == reference


def test_a_second_generator_is_refused_while_the_first_is_suspended(engine, reference):
    engine.reset()
    first = engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)
    received = next(first)
    stats = engine.last_stats
    second = engine.generate("Something else", max_tokens=4, sampling=GREEDY)
    with pytest.raises(EngineBusyError, match=BUSY):
        next(second)
    with pytest.raises(EngineBusyError, match=BUSY):
        next(engine.stream([1, 2, 3], max_tokens=4, sampling=GREEDY))
    assert engine.last_stats is stats  # the refused ones did not take over the stats
    assert received + "".join(first) == reference  # the first one was not disturbed
    assert_free(engine, reference)


def test_direct_forward_prefill_and_reset_are_refused_during_a_generation(engine, reference):
    engine.reset()
    first = engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)
    received = next(first)
    cached = list(engine.kv_tokens)
    for call in (lambda: engine.forward([5], 0), lambda: engine.prefill([5, 6]), engine.reset):
        with pytest.raises(EngineBusyError, match=BUSY):
            call()
    assert engine.kv_tokens == cached
    assert received + "".join(first) == reference


def test_a_generator_that_never_started_holds_nothing(engine, reference):
    never_started = engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)
    assert_free(engine, reference)
    assert "".join(never_started) == reference  # and it still runs later


@pytest.mark.parametrize("ending", ["finished", "closed", "collected", "raised"])
def test_the_engine_is_free_again_once_a_generation_ends(engine, reference, ending):
    engine.reset()
    if ending == "raised":
        failing = engine.stream([10**6], max_tokens=4, sampling=GREEDY)  # refused at its first step
        with pytest.raises(MinferError, match="outside the vocabulary"):
            next(failing)
    else:
        generation = engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)
        next(generation)
        if ending == "finished":
            list(generation)
        elif ending == "closed":
            generation.close()
        else:
            del generation
            gc.collect()
    assert_free(engine, reference)


def test_a_generation_from_another_thread_is_refused(engine, reference):
    engine.reset()
    first = engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)
    received = next(first)
    refusals: list[BaseException] = []

    def other_thread() -> None:
        for call in (
            lambda: list(engine.generate("Something else", max_tokens=4, sampling=GREEDY)),
            lambda: engine.forward([5], 0),
            lambda: engine.prefill([5, 6]),
        ):
            try:
                call()
            except EngineBusyError as exc:
                refusals.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert len(refusals) == 3
    assert received + "".join(first) == reference


def test_a_generation_closed_on_another_thread_frees_the_engine(engine, reference):
    """The chat app starts a reply on one thread and closes it on its worker thread."""
    engine.reset()
    generation = engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)
    next(generation)
    thread = threading.Thread(target=generation.close)
    thread.start()
    thread.join(timeout=60)
    assert_free(engine, reference)


def test_threads_racing_for_one_engine_are_refused_never_mixed(engine, reference):
    """Every generation either gives the undisturbed reply or is refused; nothing else happens."""
    start = threading.Barrier(4)
    outcomes: list[str | BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        start.wait()
        for _ in range(3):
            try:
                text = "".join(engine.generate(PROMPT, max_tokens=24, sampling=GREEDY))
            except BaseException as exc:  # anything but a refusal fails the assertions below
                text = exc
            with lock:
                outcomes.append(text)

    engine.reset()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(outcomes) == 12
    refused = [o for o in outcomes if isinstance(o, EngineBusyError)]
    completed = [o for o in outcomes if isinstance(o, str)]
    assert len(refused) + len(completed) == 12, [o for o in outcomes if isinstance(o, BaseException)]
    assert completed and all(text == reference for text in completed)
    assert_free(engine, reference)


def test_a_second_chat_turn_is_refused_and_leaves_both_sessions_as_they_were(engine, reference):
    engine.reset()
    first, second = engine.chat(sampling=GREEDY, max_tokens=8), engine.chat(sampling=GREEDY, max_tokens=8)
    reply = first.send("Hello")
    received = next(reply)
    with pytest.raises(EngineBusyError, match=BUSY):
        next(second.send("Hi"))
    assert (second.turns, second.last, second.context_used) == ([], None, 0)
    turns_during_reply = list(first.turns)
    with pytest.raises(EngineBusyError, match=BUSY):
        next(first.send("And another thing"))  # the same session, while its own reply is suspended
    assert first.turns == turns_during_reply == [{"role": "user", "content": "Hello"}]
    text = received + "".join(reply)
    assert first.turns[-1] == {"role": "assistant", "content": text}
    assert "".join(second.send("Hi"))  # free again once the first reply ended
    assert [m["role"] for m in second.turns] == ["user", "assistant"]


def test_a_refused_regenerate_keeps_the_old_reply(engine):
    engine.reset()
    chat = engine.chat(sampling=GREEDY, max_tokens=8)
    old = "".join(chat.send("Hello"))
    before = (list(chat.turns), chat.last, chat.context_used)
    other = engine.generate(PROMPT, max_tokens=24, sampling=GREEDY)
    next(other)
    with pytest.raises(EngineBusyError, match=BUSY):
        next(chat.regenerate())
    assert (chat.turns, chat.last, chat.context_used) == before
    assert chat.turns[-1] == {"role": "assistant", "content": old}
    other.close()
    assert "".join(chat.regenerate()) == old  # greedy: the same reply again, once the engine is free
