"""Choosing the next token from logits: greedy, or the llama.cpp sampler chain.

The chain runs in llama.cpp's order: repetition penalty, top-k, top-p, min-p,
temperature, then a draw from the remaining distribution. With a seed the draws
are reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from minfer.errors import MinferError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8  # <= 0 means greedy (argmax)
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64  # how many recent tokens the penalty looks at
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = {
            "temperature": self.temperature >= 0,
            "top_k": self.top_k >= 0,
            "top_p": 0.0 < self.top_p <= 1.0,
            "min_p": 0.0 <= self.min_p < 1.0,
            "repeat_penalty": self.repeat_penalty > 0,
            "repeat_last_n": self.repeat_last_n >= 0,
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

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        p = self.params
        logits = np.array(logits, dtype=np.float64).reshape(-1)
        if p.repeat_penalty != 1.0 and p.repeat_last_n > 0 and history:
            recent = np.unique(np.asarray(history[-p.repeat_last_n :], dtype=np.int64))
            values = logits[recent]
            logits[recent] = np.where(values > 0, values / p.repeat_penalty, values * p.repeat_penalty)
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
        probs = softmax(scores / p.temperature)
        return int(candidates[self.rng.choice(len(candidates), p=probs)])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()
