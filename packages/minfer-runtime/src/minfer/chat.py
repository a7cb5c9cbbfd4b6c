"""A multi-turn chat on top of the engine, keeping the KV cache between turns.

The session remembers the exact tokens the cache holds for the conversation so
far. A new turn renders the whole conversation with the chat template; when the
render extends the previous one (true of ChatML and every template that renders
past messages the same way each time), only the new text is tokenized and
prefilled. Otherwise the whole conversation is tokenized again and the engine's
prefix match still reuses every cached token it can.

Context policy: when the conversation plus the reply budget (`max_tokens`) no
longer fits the context, the oldest user/assistant turns are dropped (the system
prompt stays) and the rest is prefilled again. `dropped_turns` says how many.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from minfer.chat_template import ChatTemplate
from minfer.errors import ContextOverflowError, MinferError
from minfer.generation import Generation
from minfer.sampler import SamplingParams
from minfer.tokenizer import Tokenizer

Message = dict[str, str]  # one chat message: {"role": "system" | "user" | "assistant", "content": its text}


class ChatEngine(Protocol):
    """What a ChatSession uses of its engine; `minfer.Engine` is one.

    A protocol, not the Engine class, so that this module imports no engine: the dependency goes one way,
    engine -> chat (`Engine.chat` makes sessions).
    """

    ctx_size: int
    tokenizer: Tokenizer
    template: ChatTemplate

    def stream(
        self,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingParams | None,
        result: Generation | None,
        on_start: Callable[[], None] | None,
    ) -> Iterator[str]: ...


@dataclass(frozen=True)
class _Turn:
    """A prompt that fits: the conversation it renders, the turns dropped for it, its tokens and its text."""

    turns: list[Message]
    dropped: int
    tokens: list[int]
    rendered: str


class ChatSession:
    def __init__(
        self,
        engine: ChatEngine,
        *,
        system: str | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = 512,
    ) -> None:
        self.engine = engine
        self.sampling = sampling or SamplingParams()
        self.max_tokens = max_tokens
        self.system = system
        self.turns: list[Message] = []  # user and assistant messages, alternating
        self.last: Generation | None = None  # the latest reply's tokens, text and stats
        self.dropped_turns = 0  # turns dropped by the context policy on the latest send
        self._tokens: list[int] = []  # the conversation so far as the tokens given to the model
        self._rendered = ""  # ... and as text

    @property
    def messages(self) -> list[Message]:
        return self._with_system(self.turns)

    def _with_system(self, turns: list[Message]) -> list[Message]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *turns]

    @property
    def context_used(self) -> int:
        return len(self._tokens)

    @property
    def ctx_size(self) -> int:
        return self.engine.ctx_size

    def clear(self) -> None:
        """Start a new conversation (the system prompt stays)."""
        self.turns = []
        self.last = None
        self._tokens, self._rendered = [], ""

    def send(self, text: str) -> Iterator[str]:
        """Add a user message and stream the assistant's reply.

        The message is checked and the prompt planned when this is called (one too long for the context is
        refused here); the turn joins the conversation, and the model runs, as the pieces are asked for.
        `send_text` runs the whole turn at once.
        """
        if not isinstance(text, str) or not text.strip():
            raise MinferError("empty message: nothing to send" if isinstance(text, str) else "a message must be text")
        return self._reply(self._plan([*self.turns, {"role": "user", "content": text}]))

    def send_text(self, text: str) -> Generation:
        """Add a user message and return the whole reply: its text, tokens and stats (`Generation`)."""
        for _ in self.send(text):
            pass
        assert self.last is not None  # the turn just ran
        return self.last

    def regenerate(self) -> Iterator[str]:
        """Replace the last reply with a new one (the old one stays if the new request is refused)."""
        if not self.turns or self.turns[-1]["role"] != "assistant":
            raise MinferError("nothing to regenerate: there is no reply yet")
        return self._reply(self._plan(self.turns[:-1]))

    def _plan(self, turns: list[Message]) -> _Turn:
        """The prompt for `turns` with a generation prompt, dropping old turns when it does not fit.

        Nothing changes here: a message too long for the context on its own is refused, and a fitting prompt
        only becomes the conversation when its reply starts (`_reply`).
        """
        dropped = 0
        cached_tokens, cached_text = self._tokens, self._rendered
        tokenizer = self.engine.tokenizer
        while True:
            rendered = self.engine.template.render(self._with_system(turns), add_generation_prompt=True)
            continues = bool(cached_text) and rendered.startswith(cached_text)
            prefix, new_text = (cached_tokens, rendered[len(cached_text) :]) if continues else ([], rendered)
            # A text that cannot fit whatever its tokens is not tokenized (a huge one would only cost time).
            fewest = len(prefix) + tokenizer.fewest_tokens(new_text)
            tokens = None
            if fewest + self.max_tokens <= self.ctx_size:
                tokens = [*prefix, *tokenizer.encode(new_text, add_bos=False if continues else None)]
                if len(tokens) + self.max_tokens <= self.ctx_size:
                    return _Turn(turns, dropped, tokens, rendered)
            if len(turns) <= 1:
                size = f"{len(tokens)} tokens" if tokens is not None else f"at least {fewest} tokens"
                raise ContextOverflowError(
                    f"the message ({size} with the template) plus the reply budget "
                    f"({self.max_tokens} tokens) does not fit the context size {self.ctx_size}"
                )
            turns, dropped = turns[2:], dropped + 1  # the oldest user message and its reply
            cached_tokens, cached_text = [], ""

    def _reply(self, turn: _Turn) -> Iterator[str]:
        """The reply to a planned turn. The engine checks the request here, when `send` is called; the turn joins
        the conversation once the generation holds the engine, so a turn refused because another generation runs
        leaves the conversation as it was."""
        result = Generation()

        def join() -> None:
            self.turns, self.dropped_turns = turn.turns, turn.dropped
            self.last = result

        pieces = self.engine.stream(
            turn.tokens, max_tokens=self.max_tokens, sampling=self.sampling, result=result, on_start=join
        )
        return self._keep_reply(turn, result, pieces)

    def _keep_reply(self, turn: _Turn, result: Generation, pieces: Iterator[str]) -> Iterator[str]:
        """Stream `pieces`; once they end, the reply joins the conversation, as much of it as was generated when
        it was cancelled part-way. A turn that never joined (refused) adds nothing."""
        try:
            yield from pieces
        finally:
            if self.last is result:
                self.turns = [*self.turns, {"role": "assistant", "content": result.text}]
                tokenizer = self.engine.tokenizer
                exact = tokenizer.decode(result.tokens) == result.text
                reply_tokens = result.tokens if exact else tokenizer.encode(result.text, add_bos=False)
                self._tokens = [*turn.tokens, *reply_tokens]
                self._rendered = turn.rendered + result.text

    def to_markdown(self) -> str:
        parts = [f"## {m['role'].capitalize()}\n\n{m['content']}\n" for m in self.messages]
        return "\n".join(parts)

    def to_json(self) -> str:
        return json.dumps(
            {"messages": self.messages, "sampling": asdict(self.sampling), "max_tokens": self.max_tokens},
            indent=2,
            ensure_ascii=False,
        )

    def save(self, path: str | Path) -> Path:
        """Write the conversation as JSON (`.json`) or Markdown (anything else)."""
        path = Path(path)
        path.write_text(self.to_json() if path.suffix == ".json" else self.to_markdown(), encoding="utf-8")
        return path
