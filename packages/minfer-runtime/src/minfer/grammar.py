"""A constraint on the next token: the reply must match a grammar (JSON that validates against a schema).

The grammar engine is llguidance. A `Grammar` is compiled and checked when it is made, so a schema the engine
rejects fails at the request, not at the first token. Per generation, a `GrammarMatcher` gives the tokens allowed
next (a mask the sampler applies before its chain) and advances with each accepted token; once the grammar is
complete, only an end-of-generation token could follow, and the generation ends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np

from minfer.errors import GrammarError
from minfer.tokenizer import Tokenizer

# No whitespace between JSON tokens unless a schema's "x-guidance" asks for it: a model's whitespace would only
# spend tokens (a weak model can fill a reply with newlines), and compact JSON validates the same.
JSON_DEFAULTS = {"whitespace_flexible": False}
# llguidance's convention (its llama.cpp binding): a special token's bytes start with 0xFF, a byte no UTF-8 text
# holds, so no grammar can spell a control token out of text.
SPECIAL_PREFIX = b"\xff"


@dataclass(frozen=True)
class Grammar:
    """What a reply must be, checked by the grammar engine when it is made (`Grammar.json_schema`,
    `Grammar.json_object`). `description` names it in messages; `definition` is llguidance's grammar."""

    description: str
    definition: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> Grammar:
        """JSON that validates against `schema` (a JSON Schema object); GrammarError naming what the grammar
        engine rejects in it."""
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"the JSON schema is not JSON: {exc}") from None
        try:
            definition = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema cannot be used: {one_line(str(exc))}") from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(definition)
        if is_error:
            raise GrammarError(f"the JSON schema cannot be used: {one_line(messages[0])}")
        return cls("JSON schema", definition)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's `{"type": "json_object"}`, Ollama's `format: "json"`)."""
        return cls("JSON object", cls.json_schema({"type": "object"}).definition)


def one_line(message: str) -> str:
    """The engine's message (a regex error spans lines) as one line, as every MinferError is."""
    return " ".join(message.split())


class GrammarVocabulary:
    """The vocabulary as llguidance's `TokenizerWrapper` reads it: every token id's bytes (special ones marked),
    the end-of-generation tokens, and a text encoder."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        if not tokenizer.stop_ids:
            raise GrammarError(f"{tokenizer.source}: the vocabulary has no end-of-generation token to end a reply")
        self._tokenizer = tokenizer
        self.eos_token_id = min(tokenizer.stop_ids)
        self.bos_token_id = tokenizer.bos_id
        special = tokenizer.special_ids
        self.special_token_ids = sorted(special)
        self.tokens = [
            SPECIAL_PREFIX + tokenizer.token_bytes(token_id) if token_id in special else tokenizer.token_bytes(token_id)
            for token_id in range(tokenizer.vocab_size)
        ]

    def __call__(self, text: str) -> list[int]:
        # TokenizerWrapper probes with bytes first and falls back to str when that raises.
        if not isinstance(text, str):
            raise TypeError("the encoder takes text, not bytes")
        return self._tokenizer.encode(text, add_bos=False, parse_special=False)


def grammar_tokenizer(tokenizer: Tokenizer, n_logits: int) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for a model whose logits have `n_logits` entries: built once per Engine (it reads the
    whole vocabulary); every stop token of `tokenizer` ends a grammar."""
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(GrammarVocabulary(tokenizer)),
        n_vocab=max(n_logits, tokenizer.vocab_size),
        eos_token=sorted(tokenizer.stop_ids),
    )


class GrammarMatcher:
    """One generation's place in a grammar: which tokens may come next, advanced by each accepted token."""

    def __init__(self, grammar: Grammar, tokenizer: llguidance.LLTokenizer, n_logits: int) -> None:
        self.grammar = grammar
        self.n_logits = n_logits
        self._matcher = llguidance.LLMatcher(tokenizer, grammar.definition, log_level=0)
        self._check()
        self._bitmask = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)

    def allowed(self) -> np.ndarray:
        """A boolean per logit: True where that token may come next."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bitmask)
        self._check()
        # Bit i of 32-bit word j is token 32*j + i: little-endian words unpack in that order.
        bits = np.unpackbits(self._bitmask.astype("<i4").view(np.uint8), bitorder="little")
        return bits[: self.n_logits].astype(bool)

    def accept(self, token: int) -> None:
        """Advance past `token`, which `allowed` permitted."""
        self._matcher.consume_token(token)
        self._check()

    @property
    def complete(self) -> bool:
        """The grammar is satisfied and nothing can extend it: only an end-of-generation token could follow."""
        return self._matcher.is_stopped()

    def _check(self) -> None:
        """The matcher's error state (a grammar it cannot build, a parser limit) as a GrammarError."""
        if self._matcher.is_error():
            raise GrammarError(
                f"the {self.grammar.description} cannot be matched: {one_line(self._matcher.get_error())}"
            )
