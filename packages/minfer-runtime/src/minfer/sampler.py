"""Choosing the next token from logits: greedy, or the llama.cpp sampler chain.

The chain runs in llama.cpp's order: repetition penalty, top-k, top-p, min-p,
temperature, then a draw from the remaining distribution. With a seed the draws
are reproducible. A grammar's mask (the tokens allowed next) takes every other
token out before the filters, greedy included: the penalty before it only
rescales logits, so it changes no masked token's fate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from numbers import Integral, Real

import numpy as np

from minfer.errors import MinferError, NumericalError

INTEGER_FIELDS = frozenset({"top_k", "repeat_last_n", "seed"})  # the other fields are real numbers


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8  # <= 0 means greedy (argmax)
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64  # how many recent tokens the penalty looks at
    seed: int | None = None  # None: a fresh random seed

    def __post_init__(self) -> None:
        for name in self.names():
            value = getattr(self, name)
            if name == "seed" and value is None:
                continue
            # Checked before the ranges: comparing a str or None with a number would be a TypeError.
            kind, what = (Integral, "an integer") if name in INTEGER_FIELDS else (Real, "a finite number")
            if not isinstance(value, kind) or isinstance(value, bool) or (kind is Real and not math.isfinite(value)):
                raise MinferError(f"invalid sampling parameter {name}={value!r}: not {what}")
        checks = {
            "temperature": self.temperature >= 0,
            "top_k": self.top_k >= 0,
            "top_p": 0.0 < self.top_p <= 1.0,
            "min_p": 0.0 <= self.min_p < 1.0,
            "repeat_penalty": self.repeat_penalty > 0,
            "repeat_last_n": self.repeat_last_n >= 0,
            "seed": self.seed is None or self.seed >= 0,  # numpy's generators take no negative seed
        }
        for name, ok in checks.items():
            if not ok:
                raise MinferError(f"invalid sampling parameter {name}={getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    @property
    def needs_logits(self) -> bool:
        """False when the next token is the plain argmax, so a backend can pick it on the device."""
        return not (self.params.greedy and self.params.repeat_penalty == 1.0)

    def sample(self, logits: np.ndarray, history: Sequence[int], allowed: np.ndarray | None = None) -> int:
        """The next token after `history` from one row of logits; NumericalError if they hold NaN or Inf.

        `allowed`, when given, is a boolean per logit: only those tokens can be picked (a grammar's mask).
        """
        p = self.params
        logits = np.array(logits, dtype=np.float64).reshape(-1)
        if not np.isfinite(logits).all():
            # NaN would pass every filter below and end in an empty or NaN distribution.
            raise NumericalError("non-finite values (NaN or Inf) in the logits")
        if p.repeat_penalty != 1.0 and p.repeat_last_n > 0 and history:
            recent = np.unique(np.asarray(history[-p.repeat_last_n :], dtype=np.int64))
            values = logits[recent]
            with np.errstate(over="ignore"):  # an overflow is reported just below
                logits[recent] = np.where(values > 0, values / p.repeat_penalty, values * p.repeat_penalty)
            if not np.isfinite(logits[recent]).all():
                raise MinferError(f"repeat_penalty={p.repeat_penalty!r} takes the penalized logits beyond float64")
        if allowed is not None:
            if not allowed.any():
                raise MinferError("the grammar allows no next token")
            logits[~allowed] = -np.inf  # probability 0 in every step below; the argmax is an allowed token
        if p.greedy:
            return int(np.argmax(logits))
        candidates = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            candidates = candidates[: p.top_k]
        scores = logits[candidates]
        probs = softmax(scores)
        if p.top_p < 1.0:
            cumulative = np.cumsum(probs)
            keep = int(np.searchsorted(cumulative, p.top_p)) + 1
            candidates, scores, probs = candidates[:keep], scores[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep_mask = probs >= p.min_p * probs[0]
            candidates, scores = candidates[keep_mask], scores[keep_mask]
        # Shifted so the best score is 0 before dividing: with a tiny temperature the others go to -inf
        # (probability 0) instead of everything overflowing to inf and the distribution to NaN.
        with np.errstate(over="ignore"):
            probs = softmax((scores - scores[0]) / p.temperature)
        return int(candidates[self.rng.choice(len(candidates), p=probs)])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()
