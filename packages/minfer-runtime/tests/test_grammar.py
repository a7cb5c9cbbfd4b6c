"""Structured output: a grammar's mask alone makes a random-weight model's gibberish valid JSON.

The synthetic model's replies are noise, so every valid reply here is the mask's doing, greedy and sampled alike.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from engine_steps import needs_cuda

import minfer
from minfer import Grammar, GrammarError
from minfer.sampler import Sampler, SamplingParams
from minfer.testing.synthetic import scaled

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "member": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "member", "tags"],
    "additionalProperties": False,
}
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def grammar_engine(synthetic_model) -> minfer.Engine:
    with minfer.load(synthetic_model("tiny-llama"), backend="cpu") as engine:
        yield engine


def assert_valid(generation: minfer.Generation, schema: dict) -> object:
    """The reply parses, follows `schema`, and ended because the grammar was complete."""
    assert generation.stats.stop_reason == "eos", generation.text
    value = json.loads(generation.text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize(
    "sampling",
    [
        GREEDY,
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=2),
        SamplingParams(temperature=0, repeat_penalty=1.3),
    ],
    ids=["greedy", "sampled", "hot-unfiltered", "greedy-penalized"],
)
def test_schema_constrained_replies_validate(grammar_engine, sampling):
    grammar = Grammar.json_schema(PERSON)
    for prompt in ("Describe a person as JSON.", "Who are you?"):
        assert_valid(grammar_engine.complete(prompt, grammar=grammar, sampling=sampling, max_tokens=200), PERSON)


def test_many_seeds_all_validate(grammar_engine):
    grammar = Grammar.json_schema(PERSON)
    for seed in range(10):
        reply = grammar_engine.complete("JSON please", grammar=grammar, temperature=1.0, seed=seed, max_tokens=200)
        assert_valid(reply, PERSON)


def test_json_object_mode_yields_an_object(grammar_engine):
    # Any object has unbounded strings, and plain greedy gibberish loops inside one until the budget runs out:
    # a repeat penalty (greedy still) and short sampled replies end on their own.
    for sampling in (SamplingParams(temperature=0, repeat_penalty=2.0), SamplingParams(temperature=0.8, seed=1),
                     SamplingParams(temperature=0.8, seed=4)):  # fmt: skip
        reply = grammar_engine.complete("Any JSON", grammar=Grammar.json_object(), sampling=sampling, max_tokens=400)
        assert isinstance(assert_valid(reply, {"type": "object"}), dict)


def test_streamed_pieces_are_the_constrained_reply(grammar_engine):
    grammar = Grammar.json_schema(PERSON)
    pieces = list(grammar_engine.generate("Stream it", grammar=grammar, sampling=GREEDY, max_tokens=200))
    assert grammar_engine.last_stats.stop_reason == "eos" and len(pieces) > 1
    jsonschema.validate(json.loads("".join(pieces)), PERSON)
    assert "".join(pieces) == grammar_engine.complete("Stream it", grammar=grammar, sampling=GREEDY).text


def test_without_a_grammar_greedy_output_is_unchanged(grammar_engine, monkeypatch):
    """No grammar: the backend's argmax picks greedy tokens (logits never read back), as before."""
    expected = grammar_engine.complete("Hello there", sampling=GREEDY, max_tokens=24).tokens
    program = grammar_engine.program(1)
    monkeypatch.setattr(type(program), "read", lambda self, name: pytest.fail(f"{name} read back without a grammar"))
    assert grammar_engine.complete("Hello there", sampling=GREEDY, max_tokens=24).tokens == expected


def test_the_grammar_overrides_the_unconstrained_greedy_pick(grammar_engine):
    free = grammar_engine.complete("Hello there", sampling=GREEDY, max_tokens=8).text
    constrained = grammar_engine.complete("Hello there", grammar=Grammar.json_object(), sampling=GREEDY, max_tokens=8)
    assert not free.startswith("{") and constrained.text.startswith("{")


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "foo"}, "Invalid type: foo"),
        ({"type": "string", "pattern": "(("}, "unclosed group"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum (5) is greater than maximum (1)"),
        ({"$ref": "#/nowhere"}, "'/nowhere' does not exist"),
        (["not", "a", "schema"], "must be an object, got list"),
        ({"enum": [{1, 2}]}, "not JSON"),
    ],
)
def test_a_rejected_schema_raises_when_the_grammar_is_made(schema, words):
    with pytest.raises(GrammarError, match="JSON schema") as raised:
        Grammar.json_schema(schema)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_a_non_grammar_is_refused_at_the_call(grammar_engine):
    with pytest.raises(minfer.MinferError, match="grammar must be a Grammar"):
        grammar_engine.generate("Hi", grammar={"type": "object"})  # nothing has run: the call itself raised


def test_the_mask_keeps_only_allowed_tokens_in_the_sampler():
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    allowed = np.array([False, False, True, False, True])
    assert Sampler(GREEDY).sample(logits, [], allowed) == 2
    picks = {Sampler(SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=s)).sample(logits, [], allowed)
             for s in range(40)}  # fmt: skip
    assert picks == {2, 4}
    with pytest.raises(minfer.MinferError, match="allows no next token"):
        Sampler(GREEDY).sample(logits, [], np.zeros(5, dtype=bool))


@pytest.mark.cuda
def test_cuda_constrained_greedy_matches_cpu(synthetic_model):
    """On the GPU the greedy pick reads the logits back to mask them: the CPU's JSON, token for token."""
    needs_cuda()
    # Real widths (head size 64, as the kernels need), few layers: the CUDA backend's own test models.
    path = synthetic_model(scaled("smollm2-135m", n_layers=4, context_length=1024), "Q8_0", 1)
    grammar = Grammar.json_schema(PERSON)
    replies = {}
    for backend in ("cpu", "cuda"):
        with minfer.load(path, backend=backend, ctx_size=512) as engine:
            replies[backend] = [
                engine.complete(prompt, grammar=grammar, sampling=GREEDY, max_tokens=200)
                for prompt in ("Describe a person as JSON.", "Who are you?", "Fill the form.")
            ]
    for cpu, cuda in zip(replies["cpu"], replies["cuda"], strict=True):
        assert_valid(cuda, PERSON)
        assert cuda.text == cpu.text
