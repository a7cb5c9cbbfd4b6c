"""The engine: load a model, prefill a prompt, decode token by token, stream text.

One engine holds one sequence's KV cache. It remembers which tokens the cache
holds, so a request whose tokens start with the cached ones (the next turn of a
chat) prefills only what is new. Graphs are built per token count and reused:
one decode graph serves every step.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any

import llguidance
import numpy as np

from minfer.backends import create_backend
from minfer.backends.base import ProgressCallback
from minfer.chat import ChatSession, Message
from minfer.chat_template import ChatTemplate, TemplateChoice
from minfer.errors import ContextOverflowError, EngineBusyError, MinferError, NumericalError
from minfer.generation import Generation, GenerationStats, StopMatcher
from minfer.gguf_file import GGUFFile
from minfer.grammar import Grammar, GrammarMatcher, grammar_tokenizer
from minfer.model_store import resolve_model
from minfer.models import build_graph
from minfer.models.config import ModelConfig
from minfer.models.llama import DEFAULT_CACHE_TYPE, check_cache_type
from minfer.sampler import Sampler, SamplingParams
from minfer.scheduler import Program, schedule
from minfer.threads import set_threads
from minfer.tokenizer import Tokenizer

DEFAULT_CTX_SIZE = 4096
PREFILL_CHUNK = 512  # longest prompt piece run as one graph (llama.cpp's default batch)
GRAPH_CACHE_SIZE = 4  # compiled graphs kept per engine: decode, and a few prompt lengths
GREEDY_CHUNK = 32  # most greedy steps run before their picks come back (the chunks grow 1, 2, 4, ... to this)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: Path
    file_size: int
    architecture: str
    n_parameters: int
    quant_mix: dict[str, int]
    context_length: int
    ctx_size: int
    cache_type: str  # the KV cache's element type, K and V alike: f32 or f16 (-ctk/-ctv)
    backend: str
    device: str
    threads: int  # CPU threads of numpy's BLAS (-t)
    config: ModelConfig


class Engine:
    def __init__(
        self,
        model: str | Path | None = None,
        *,
        backend: str = "auto",
        ctx_size: int | None = None,
        threads: int | None = None,
        max_tokens: int | None = None,
        progress: ProgressCallback | None = None,
        chat_template: TemplateChoice | None = None,
        cache_type: str = DEFAULT_CACHE_TYPE,
    ) -> None:
        """Open a model (a path, a known name, or None for the default) and load its weights onto `backend`;
        `threads` CPU threads for numpy's BLAS (default: one per physical core, minfer.threads). `max_tokens`,
        when given, is the longest reply it will be asked for: a context too small for it (and a one-token
        prompt) is refused here, before the weights load. `chat_template`, a Jinja template file or a built-in
        template's name (chatml, gemma, llama3, phi3; a str that names an existing path is the file), replaces
        the file's own. `cache_type` is the KV cache's element type, K and V alike (llama.cpp's names: f32, or f16,
        half the memory, each value rounded to float16 as it is stored)."""
        self.threads = set_threads(threads)  # before anything runs numpy's BLAS (minfer.threads)
        self.gguf = GGUFFile(resolve_model(model))
        self.config = ModelConfig.from_gguf(self.gguf)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        self.template = ChatTemplate.from_gguf(self.gguf, self.tokenizer, chat_template)
        self.ctx_size = ctx_size if ctx_size is not None else min(self.config.context_length, DEFAULT_CTX_SIZE)
        if not isinstance(self.ctx_size, Integral) or not 1 <= self.ctx_size <= self.config.context_length:
            raise MinferError(
                f"context size {self.ctx_size} is outside 1..{self.config.context_length} (the model's trained context)"
            )
        if max_tokens is not None and max_tokens >= self.ctx_size:
            raise ContextOverflowError(
                f"max tokens {max_tokens} leave no room for a prompt in the context size {self.ctx_size}: "
                "lower --max-tokens or raise --ctx-size"
            )
        try:
            self.cache_type = check_cache_type(cache_type)
        except ValueError as exc:
            raise MinferError(str(exc)) from None
        self.backend = create_backend(backend)
        self.backend.load_weights(self.gguf, list(self.config.expected_tensors()), progress)
        self.kv_tokens: list[int] = []  # the tokens whose K/V rows the cache holds, at positions 0..n-1
        # Held by the one generation (or direct forward pass) using the cache (`_hold`). A Lock, not an RLock:
        # a generator may be closed on another thread than the one that started it (the chat app's worker).
        self._busy = threading.Lock()
        self._programs: OrderedDict[int, Program] = OrderedDict()
        self.last_stats = GenerationStats()

    def set_threads(self, threads: int | None) -> None:
        """Run numpy's BLAS on `threads` CPU threads from now on (None: the default; process-wide)."""
        self.threads = set_threads(threads)

    @property
    def info(self) -> ModelInfo:
        self._check_open()
        return ModelInfo(
            name=self.gguf.name,
            path=self.gguf.path,
            file_size=self.gguf.file_size,
            architecture=self.config.architecture,
            n_parameters=self.gguf.n_parameters(),
            quant_mix=self.gguf.quant_mix(),
            context_length=self.config.context_length,
            ctx_size=self.ctx_size,
            cache_type=self.cache_type,
            backend=self.backend.name,
            device=self.backend.device_name,
            threads=self.threads,
            config=self.config,
        )

    # -- forward passes ---------------------------------------------------------------------------

    def program(self, n_tokens: int) -> Program:
        """The compiled graph for `n_tokens` new tokens, built once and kept while it is in use."""
        if n_tokens in self._programs:
            self._programs.move_to_end(n_tokens)
            return self._programs[n_tokens]
        program = schedule(build_graph(self.config, n_tokens, self.ctx_size, self.cache_type), self.backend)
        self._programs[n_tokens] = program
        if len(self._programs) > GRAPH_CACHE_SIZE:
            _, evicted = self._programs.popitem(last=False)
            evicted.release()
        return program

    @contextmanager
    def _hold(self) -> Iterator[None]:
        """Hold the KV cache for one generation or forward pass; EngineBusyError if it is held already.

        The cache holds one sequence: two users of it would corrupt each other's tokens. Nothing waits: a second
        generation, from another thread or a second generator started while the first is suspended, is refused.
        A generation holds the engine from its first step until it ends, raises or is closed (garbage collection
        closes a generator); a generator that has not started holds nothing.
        """
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("the model is busy with another generation; one Engine runs one at a time")
        try:
            self._check_open()
            yield
        finally:
            self._busy.release()

    def _check_open(self) -> None:
        if self.backend is None:
            raise MinferError(f"{self.gguf.path}: this model was closed (Engine.close); load it again to use it")

    def close(self) -> None:
        """Free the model: its compiled graphs, and the backend with the weights and the KV cache it holds
        (device memory on the GPU). The engine cannot run afterwards; closing twice does nothing.
        `with minfer.load() as model:` closes it at the end of the block."""
        if self.backend is None:
            return
        with self._hold():
            for program in self._programs.values():
                program.release()
            self._programs.clear()
            self.backend = None  # the last reference to the weights: they are freed here
            self.kv_tokens = []

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def forward(self, tokens: Sequence[int], start: int) -> Program:
        """Run `tokens` at positions start.. (their K/V land in the cache); the program holds the logits."""
        with self._hold():
            return self._forward(tokens, start)

    def _forward(self, tokens: Sequence[int], start: int) -> Program:
        ids = self._checked_ids(tokens, start, len(tokens))
        program = self.program(len(tokens))
        program.run(
            {
                "tokens": ids,
                "positions": np.arange(start, start + len(tokens), dtype=np.int32),
                "kv_len": np.array([start + len(tokens)], dtype=np.int32),
            }
        )
        del self.kv_tokens[start:]  # in place: a decode step appends one token, not a copy of the history
        self.kv_tokens.extend(tokens)
        return program

    def _checked_ids(self, tokens: Sequence[int], start: int, n_positions: int) -> np.ndarray:
        """`tokens` as int32 ids, once they and positions start .. start + n_positions - 1 are checked."""
        if not tokens:
            raise MinferError("no tokens to run")
        if not isinstance(start, Integral) or start < 0:
            raise MinferError(f"start position {start!r} is not a position (an integer from 0)")
        if start + n_positions > self.ctx_size:
            raise ContextOverflowError(
                f"positions {start}..{start + n_positions - 1} exceed the context size {self.ctx_size}"
            )
        ids = np.asarray(tokens)
        # One vectorized check (a 512-token chunk checked in a Python loop cost ~190 us); the loop below only
        # runs to name the first bad id, whichever way it is out of range.
        if ids.dtype.kind not in "iu" or ids.ndim != 1 or not ((ids >= 0) & (ids < self.config.vocab_size)).all():
            for token in tokens:
                if not isinstance(token, Integral) or not 0 <= token < self.config.vocab_size:
                    raise MinferError(
                        f"token id {token!r} is outside the vocabulary (integers 0..{self.config.vocab_size - 1})"
                    )
        return ids.astype(np.int32)

    def greedy(self, token: int, position: int, n: int) -> list[int]:
        """`n` greedy picks after `token` at `position` (the cache holds what comes before it), each fed the
        last, run as generation runs them (`_greedy_picks`); refused before any step runs where the steps would
        not fit the context."""
        with self._hold():
            self._checked_ids([token], position, n)
            return list(self._greedy_picks(token, position, n, first_step=1))

    def _greedy_picks(self, token: int, position: int, limit: int, *, first_step: int) -> Iterator[int]:
        """Up to `limit` greedy picks after `token` (at `position`, not in the cache yet), in chunks of steps the
        backend runs before their picks come back: 1, 2, 4, ... GREEDY_CHUNK steps, so the first picks stream out
        at once and later ones wait for the device once a chunk (Program.greedy_steps). A consumer that stops
        early leaves the rest of a chunk run for nothing; the cache holds those steps' tokens, and kv_tokens says
        so. `first_step` numbers the first pick among the generated tokens (NumericalError names it).
        """
        chunk, produced = 1, 0
        while produced < limit:
            n, at = min(chunk, limit - produced), position + produced
            ids = self._checked_ids([token], at, n)
            inputs = {"tokens": ids, "positions": np.array([at], np.int32), "kv_len": np.array([at + 1], np.int32)}
            picks = self.program(1).greedy_steps("logits", inputs, n)
            del self.kv_tokens[at:]
            self.kv_tokens.extend([token, *picks[: n - 1]])  # each step's token; the last pick is not run yet
            for index, pick in enumerate(picks):
                if pick < 0:  # the backend's mark of logits holding NaN or Inf
                    del self.kv_tokens[at + index + 1 :]
                    raise NumericalError(
                        f"non-finite logits (NaN or Inf) at generation step {first_step + produced + index} "
                        f"(position {at + index + 1}): the model's weights or hyperparameters produce NaN/Inf"
                    )
                yield pick
            produced += n
            token, chunk = picks[-1], min(2 * chunk, GREEDY_CHUNK)

    def prefill(self, tokens: Sequence[int]) -> tuple[Program, int]:
        """Bring the cache to hold exactly `tokens`, running only what is not cached already.

        Returns the program holding the last token's logits and how many tokens ran.
        """
        with self._hold():
            return self._prefill(tokens)

    def _prefill(self, tokens: Sequence[int]) -> tuple[Program, int]:
        if not tokens:
            raise MinferError("empty prompt: nothing to generate from")
        if len(tokens) > self.ctx_size:  # refused before any chunk runs
            raise ContextOverflowError(f"{len(tokens)} tokens exceed the context size {self.ctx_size}")
        cached = common_prefix_length(self.kv_tokens, tokens)
        start = min(cached, len(tokens) - 1)  # the last token always runs: its logits pick the next one
        self.kv_tokens = self.kv_tokens[:start]
        program = None
        for chunk_start in range(start, len(tokens), PREFILL_CHUNK):
            program = self._forward(tokens[chunk_start : chunk_start + PREFILL_CHUNK], chunk_start)
        assert program is not None
        return program, len(tokens) - start

    def reset(self) -> None:
        """Forget the cached sequence (the cache rows are simply overwritten later)."""
        with self._hold():
            self.kv_tokens = []

    # -- generation -------------------------------------------------------------------------------

    def encode_prompt(
        self, prompt: str | list[Message], *, system: str | None = None, template: bool = True
    ) -> list[int]:
        """Token ids for a prompt: a string or a list of chat messages, through the chat template unless disabled."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise MinferError("empty prompt: nothing to generate from")
            if not template:
                return self._tokenize_prompt(prompt)
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = list(prompt)
            if not template:
                raise MinferError("a list of chat messages needs the chat template (template=False given)")
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        return self._tokenize_prompt(self.template.render(messages, add_generation_prompt=True))

    def _tokenize_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt's text, refusing first, without tokenizing, a text no context of this size holds:
        a huge text would only cost time and memory in the tokenizer (millions of words can abort it)."""
        fewest = self.tokenizer.fewest_tokens(text)
        if fewest > self.ctx_size:
            raise ContextOverflowError(
                f"the prompt ({len(text)} characters) is at least {fewest} tokens, more than the context size "
                f"{self.ctx_size}: shorten it or raise --ctx-size"
            )
        return self.tokenizer.encode(text)

    def check_fits(self, n_prompt: int, max_tokens: int) -> None:
        if n_prompt + max_tokens > self.ctx_size:
            raise ContextOverflowError(
                f"prompt ({n_prompt} tokens) + max tokens ({max_tokens}) = {n_prompt + max_tokens} exceeds the "
                f"context size {self.ctx_size}: shorten the prompt, lower --max-tokens or raise --ctx-size"
            )

    def generate(
        self,
        prompt: str | list[Message],
        *,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        system: str | None = None,
        template: bool = True,
        grammar: Grammar | None = None,
        result: Generation | None = None,
        **sampling_overrides: float | int | None,
    ) -> Iterator[str]:
        """Stream the reply to a prompt as text pieces; `last_stats` describes the run once it ends, and `result`
        (if given) collects its tokens, text and stats.

        Sampling comes from `sampling`, with any SamplingParams field given by name on top of it:
        `generate("Hi", temperature=0)` is greedy. `grammar`, when given, constrains every token so that the
        reply matches it (`Grammar.json_schema(...)`); the reply ends when the grammar is complete. The arguments
        are checked and the prompt encoded when this is called (a mistyped keyword fails here, not at the first
        piece); the model runs as the pieces are asked for.
        """
        tokens, sampling = self._request(prompt, sampling, sampling_overrides, system=system, template=template)
        return self.stream(tokens, max_tokens=max_tokens, sampling=sampling, stop=stop, result=result, grammar=grammar)

    def complete(self, prompt: str | list[Message], **arguments: Any) -> Generation:
        """The whole reply at once (`generate`'s arguments): its text, tokens and stats — tokens prefilled and
        taken from the cache, tokens generated, timings, the stop reason."""
        result = Generation()
        for _ in self.generate(prompt, result=result, **arguments):
            pass
        return result

    def _request(
        self,
        prompt: str | list[Message],
        sampling: SamplingParams | None,
        overrides: dict[str, float | int | None],
        *,
        system: str | None,
        template: bool,
    ) -> tuple[list[int], SamplingParams]:
        """A request's prompt tokens and sampling, checked."""
        self._check_open()
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise MinferError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        sampling = with_overrides(sampling or SamplingParams(), overrides)
        return self.encode_prompt(prompt, system=system, template=template), sampling

    def stream(
        self,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        result: Generation | None = None,
        on_start: Callable[[], None] | None = None,
        grammar: Grammar | None = None,
    ) -> Iterator[str]:
        """Generate after `prompt_tokens`, yielding text; `result` (if given) collects tokens, text and stats.

        The arguments are checked when this is called, `grammar`'s matcher built too (GrammarError if it cannot
        be). The generation holds the engine from its first step to its end: a second one meanwhile is refused
        (EngineBusyError). `on_start`, if given, is called once it holds the engine, before anything runs, so
        never for a refused one (ChatSession adds its turn there).
        """
        self.check_request(prompt_tokens, max_tokens, stop)
        matcher = self.grammar_matcher(grammar) if grammar is not None else None
        return self._stream(prompt_tokens, max_tokens, sampling, stop, result, on_start, matcher)

    def grammar_matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A fresh matcher of `grammar` over this model's vocabulary, for one generation."""
        self._check_open()
        if not isinstance(grammar, Grammar):
            raise MinferError(f"grammar must be a Grammar (Grammar.json_schema, ...), got {type(grammar).__name__}")
        return GrammarMatcher(grammar, self._grammar_tokenizer, self.config.vocab_size)

    @functools.cached_property
    def _grammar_tokenizer(self) -> llguidance.LLTokenizer:
        """The grammar engine's view of the vocabulary, built on the first grammar (it reads every token)."""
        return grammar_tokenizer(self.tokenizer, self.config.vocab_size)

    def check_request(self, prompt_tokens: Sequence[int], max_tokens: int, stop: Sequence[str]) -> None:
        """Refuse, before anything runs, a reply budget below 1, a request that overflows the context, or stop
        strings that are not strings."""
        self._check_open()
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, Integral) or max_tokens < 1:
            raise MinferError(f"max tokens must be a positive integer, got {max_tokens!r}")
        self.check_fits(len(prompt_tokens), max_tokens)
        StopMatcher(stop)

    def _stream(
        self,
        prompt_tokens: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams | None,
        stop: Sequence[str],
        result: Generation | None,
        on_start: Callable[[], None] | None,
        matcher: GrammarMatcher | None,
    ) -> Iterator[str]:
        """The generation itself, for `stream` (which has checked the request); it holds the engine throughout.

        With a grammar's `matcher`, each token is picked from those it allows and advances it; a complete grammar
        ends the reply as its end-of-generation token would ("eos"), without running the model for that token.
        """
        with self._hold():
            if on_start is not None:
                on_start()
            result = result if result is not None else Generation()
            stats = result.stats
            stats.threads = self.threads
            self.last_stats = stats
            sampler = Sampler(sampling or SamplingParams())
            decoder = self.tokenizer.stream_decoder()
            stops = StopMatcher(stop)
            stats.stop_reason = "cancelled"  # until the loop finishes on its own
            try:
                started = time.perf_counter()
                program, stats.prompt_tokens = self._prefill(prompt_tokens)
                stats.cached_tokens = len(prompt_tokens) - stats.prompt_tokens
                token = self.pick(program, sampler, [*prompt_tokens], step=1, matcher=matcher)
                stats.prompt_seconds = time.perf_counter() - started
                started = time.perf_counter()
                history = [*prompt_tokens]
                greedy_picks: Iterator[int] | None = None
                while True:
                    if token in self.tokenizer.stop_ids:
                        stats.stop_reason = "eos"
                        break
                    result.tokens.append(token)
                    history.append(token)
                    stats.generated_tokens += 1
                    if matcher is not None:
                        matcher.accept(token)
                    text, stopped = stops.feed(decoder.feed(token))
                    if text:
                        result.text += text
                        yield text
                    if stopped:
                        stats.stop_reason = "stop"
                        break
                    if matcher is not None and matcher.complete:
                        stats.stop_reason = "eos"
                        break
                    if stats.generated_tokens >= max_tokens:
                        stats.stop_reason = "length"
                        break
                    if greedy_picks is not None:
                        token = next(greedy_picks)
                    elif matcher is None and not sampler.needs_logits:  # greedy: the picks stay on the device
                        greedy_picks = self._greedy_picks(
                            token, len(history) - 1, max_tokens - stats.generated_tokens,
                            first_step=stats.generated_tokens + 1,
                        )  # fmt: skip
                        token = next(greedy_picks)
                    else:
                        program = self._forward([token], len(history) - 1)
                        token = self.pick(program, sampler, history, step=stats.generated_tokens + 1, matcher=matcher)
                if stats.stop_reason != "stop":
                    tail, _ = stops.feed(decoder.flush(), final=True)
                    if tail:
                        result.text += tail
                        yield tail
            finally:
                stats.generation_seconds = time.perf_counter() - started

    def pick(
        self,
        program: Program,
        sampler: Sampler,
        history: list[int],
        *,
        step: int,
        matcher: GrammarMatcher | None = None,
    ) -> int:
        """The next token: argmax on the backend when sampling is greedy and no grammar constrains it, else the
        sampler over the logits read back, with the grammar's mask when there is one (greedy too: the device
        argmax cannot see the mask).

        `step` counts the generated tokens from 1 (this one included); the token goes to position len(history).
        Logits holding NaN or Inf are a NumericalError naming both: whatever token they gave would be noise.
        """
        try:
            if matcher is None and not sampler.needs_logits:
                return program.argmax("logits")
            allowed = matcher.allowed() if matcher is not None else None
            return sampler.sample(program.read("logits")[0], history, allowed)
        except NumericalError:
            raise NumericalError(
                f"non-finite logits (NaN or Inf) at generation step {step} (position {len(history)}): "
                "the model's weights or hyperparameters produce NaN/Inf"
            ) from None

    def chat(
        self,
        *,
        system: str | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = 512,
    ) -> ChatSession:
        return ChatSession(self, system=system, sampling=sampling, max_tokens=max_tokens)


def with_overrides(sampling: SamplingParams, overrides: dict[str, float | int | None]) -> SamplingParams:
    unknown = sorted(set(overrides) - set(SamplingParams.names()))
    if unknown:
        raise MinferError(f"unknown sampling parameter {unknown[0]!r} (known: {', '.join(SamplingParams.names())})")
    return dataclasses.replace(sampling, **overrides) if overrides else sampling


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
