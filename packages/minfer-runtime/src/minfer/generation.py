"""What one generation request produces: its tokens, its text, its stats; and stop-string matching."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from minfer.errors import MinferError


@dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens actually prefilled (cached ones are not counted)
    cached_tokens: int = 0  # prompt tokens the KV cache held already (a chat's earlier turns)
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    stop_reason: str = ""  # "eos", "stop", "length" or "cancelled"
    threads: int = 0  # CPU threads of numpy's BLAS during the run (-t)

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0


@dataclass
class Generation:
    """What one request produced: its tokens and text, and its stats (usage, timings, stop reason).

    `Engine.complete` and `ChatSession.send_text` return one; the streaming calls fill one as they go.
    """

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)


class StopMatcher:
    """Cuts the streamed text at the first stop string, holding back text that may be the start of one."""

    def __init__(self, stops: Sequence[str]) -> None:
        # A bare string would otherwise be taken as a list of one-character stops.
        if isinstance(stops, str):
            raise MinferError(f"stop strings must be a list of strings, not the string {stops!r}")
        stops = list(stops)
        for stop in stops:
            if not isinstance(stop, str):
                raise MinferError(f"stop strings must be strings, got {stop!r}")
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str, *, final: bool = False) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached)."""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = 0  # the longest tail that may be the start of a stop string, unless no text comes after it
        if not final:
            hold = max((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False
