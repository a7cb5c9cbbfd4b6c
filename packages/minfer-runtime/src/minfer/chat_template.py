"""Chat templates: a conversation rendered into the prompt text a model was trained on.

A GGUF stores its chat template as Jinja source in `tokenizer.chat_template`,
written for Hugging Face transformers' `apply_chat_template`. We render it the
same way: jinja2's immutable sandbox (templates are untrusted code), blocks
trimmed as transformers does, and the names templates expect —
`messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
`raise_exception`, `strftime_now` and a `tojson` filter that does not escape
HTML.

The sandbox keeps a template away from Python's internals (an unsafe attribute
is an error at once, where jinja2 would hand back an undefined that prints as
nothing); budgets keep it from hanging or taking the machine's memory:
- time: checked wherever the template calls, looks up, loops or prints;
- memory: every value the template builds is measured as it is built, and a
  call whose arguments size an allocation (`'x' * n`, `center(n)`,
  `tojson(indent=n)`) is refused before it allocates;
- the prompt: what the template prints;
- integer length and value nesting, which keep Python's own arithmetic and C
  code safe.
The sandbox's hooks do not see loops, `~`, literals, slices or output, so the
parsed template is rewritten (`_Guards`) to route those through the environment
too, and it is compiled without jinja2's constant folding, so that no template
code runs outside a render. Going over a budget is a one-line `TemplateError`
naming the budget.

A template is compiled and test-rendered when the model loads, so a broken
template is reported at once rather than at the first chat turn.

A file without a template gets one of the built-in templates
(`chat_template_builtins`), chosen by `choose_builtin` from the vocabulary's
special tokens and the architecture, and refused when the vocabulary lacks a
control token it writes. `--chat-template` names a template file or a built-in
to use instead of the file's own (`resolve_chat_template`).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import re
import string
import sys
import time
import types
from collections.abc import Callable, Collection, Iterable, Iterator
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

from minfer.chat_template_builtins import BUILTIN_TEMPLATES, BuiltinTemplate
from minfer.chat_template_builtins import CHATML as CHATML  # re-exported: the template synthetic files carry
from minfer.errors import TemplateError
from minfer.gguf_file import GGUFFile

if TYPE_CHECKING:
    from minfer.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant")

# The conversation every template must render at load time.
PROBE_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2 + 2?"},
]

# Budgets. A real template renders a long conversation in milliseconds; two seconds is far beyond that on any
# machine and still short enough to read as an error rather than a hang.
RENDER_SECONDS = 2.0
# The longest context of a model minfer runs is 128k tokens, about half a million characters: eight times that
# leaves room for any real conversation and stops a template that prints without end.
MAX_PROMPT_CHARS = 4_000_000
# Bytes (as sys.getsizeof counts them) of the values one render builds, all together; a value's size counts what
# it holds wherever it appears. Real templates build up to 12 bytes per character of their prompt (the copies `+`
# makes, 4 bytes a character in a text with an emoji): this is 16 per character of the longest prompt, and little
# enough that a hostile template cannot take the machine's memory.
MAX_RENDER_BYTES = 64_000_000
# Python will not turn a longer integer into text, and arithmetic on integers this long stays fast, while a
# template's `10 ** (10 ** 9)` would take minutes and gigabytes.
MAX_INT_DIGITS = sys.int_info.default_max_str_digits
# Real values nest a few levels (a message's tool calls, a tool's JSON schema: under 20); Python's C code that
# hashes or compares values recurses once per level and crashes the interpreter on one nested a million deep.
MAX_VALUE_DEPTH = 100
# Five times the longest published chat templates (about 20,000 characters). Compiling cannot be interrupted and
# takes about a second per 100,000 characters, so the length is the compile budget.
MAX_TEMPLATE_CHARS = 100_000
# What an error quotes from the template (a message given to raise_exception, say): enough to read, one line.
MAX_QUOTED_CHARS = 300

# How the size of a value yet to be built is estimated, before building it.
CHAR_BYTES = 4  # a character takes at most 4 bytes (1 in an ASCII text)
ITEM_BYTES = 8  # a list or tuple holds a pointer per item
PIECE_BYTES = ITEM_BYTES + 80  # a piece of a split text: its pointer and a str object of its own (header included)
FORMAT_FIELD_CHARS = 400  # the longest a number formats to without a width: '%f' of 1e308 is 316 characters
STRFTIME_CHARS = 32  # a strftime directive writes at most this many characters per character of the format
# The characters str.splitlines splits on, and those str.split splits on without a separator (str.isspace).
LINE_BREAKS = "\n\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029"
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)

_MEMORY_MESSAGE = f"chat template would exceed its {MAX_RENDER_BYTES // 1_000_000} MB memory budget"


# A value of `--chat-template` (`minfer.load`'s `chat_template`): a template file, or a built-in template's name.
TemplateChoice = str | os.PathLike[str]

# The markers of each built-in format among a vocabulary's special tokens, tried in this order, and the
# architectures whose format is known when the vocabulary shows none (`choose_builtin`).
VOCABULARY_MARKERS = (
    ("gemma", ("<start_of_turn>",)),
    ("llama3", ("<|start_header_id|>", "<|eot_id|>")),
    ("phi3", ("<|user|>", "<|end|>")),
    ("chatml", ("<|im_start|>",)),
)
ARCHITECTURE_TEMPLATES = {"gemma3": "gemma", "phi3": "phi3"}
DEFAULT_TEMPLATE = "chatml"


class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str,
        eos_token: str,
        origin: str,
        label: str = "tokenizer.chat_template",
        provenance: str = "from the file",
        unusable: str | None = None,
    ) -> None:
        """Compile `source` and check that it renders `PROBE_CONVERSATION`.

        Errors name the template by `origin`, where it came from (the GGUF path), and `label`, what it is there
        (the GGUF key); `provenance` is how it was chosen, as `minfer info` says it. `unusable`, when given, is
        why no conversation may be rendered with it (a built-in whose control tokens the vocabulary lacks):
        the model still loads, for raw prompts and benchmarks, and each render raises it.
        """
        self.source = source
        self.provenance = provenance
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._origin = origin
        self._template = _compile(source, origin, label)
        self._unusable = None
        self.render(PROBE_CONVERSATION)
        self._unusable = unusable

    @classmethod
    def from_gguf(
        cls, gguf_file: GGUFFile, tokenizer: Tokenizer, chat_template: TemplateChoice | None = None
    ) -> ChatTemplate:
        """The template `gguf_file` is rendered with: `chat_template` when given (a file or a built-in's name, as
        `resolve_chat_template` reads it), else the file's own, else the built-in that `choose_builtin` picks.

        A built-in must find the special tokens it writes in the vocabulary; it is refused otherwise.
        """
        tokens = {
            "bos_token": _token_or_empty(tokenizer, tokenizer.bos_id),
            "eos_token": _token_or_empty(tokenizer, tokenizer.eos_id),
        }
        if chat_template is not None:
            choice = resolve_chat_template(chat_template)
            if isinstance(choice, Path):
                return cls(
                    read_template_file(choice),
                    **tokens,
                    origin=str(choice),
                    label="chat template",
                    provenance=f"{choice} (--chat-template)",
                )
            _check_special_tokens(choice, tokenizer, f"{gguf_file.path}: the built-in {choice.name} template")
            return cls(
                choice.source,
                **tokens,
                origin=f"built-in template {choice.name}",
                provenance=f"built-in {choice.name} (--chat-template)",
            )
        source = gguf_file.metadata.get("tokenizer.chat_template")
        if source is not None:
            if not isinstance(source, str):
                raise TemplateError(f"{gguf_file.path}: tokenizer.chat_template is not a string")
            return cls(source, **tokens, origin=str(gguf_file.path))
        builtin, reason = choose_builtin(_special_texts(tokenizer), gguf_file.architecture)
        unusable = None
        try:
            _check_special_tokens(
                builtin,
                tokenizer,
                f"{gguf_file.path}: the file has no chat template, and the built-in {builtin.name} template ({reason})",
            )
        except TemplateError as refusal:  # a base model without chat tokens: raw prompts only
            unusable = str(refusal)
        return cls(
            builtin.source,
            **tokens,
            origin=f"built-in template {builtin.name}",
            provenance=f"none: the file has none and the built-in {builtin.name} ({reason}) does not fit its vocabulary"
            if unusable
            else f"built-in {builtin.name} (the file has none; {reason})",
            unusable=unusable,
        )

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (dicts with `role` and `content`).

        With `add_generation_prompt`, the text ends where the assistant's reply begins.
        """
        if self._unusable is not None:
            raise TemplateError(self._unusable)
        _check_messages(messages)
        token = _BUDGET.set(_RenderBudget())
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except _BudgetExceeded as exc:
            raise TemplateError(f"{self._origin}: {exc}") from None
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{self._origin}: chat template failed to render: {_describe(exc)}") from None
        except Exception as exc:  # a template is code: it can fail with any Python error
            raise TemplateError(f"{self._origin}: chat template failed to render: {_python_error(exc)}") from None
        finally:
            _BUDGET.reset(token)


def choose_builtin(special_tokens: Collection[str], architecture: str) -> tuple[BuiltinTemplate, str]:
    """The built-in template for a file that has none, and why it is that one (as `minfer info` says it).

    The vocabulary decides first, by the markers of each format among its special tokens, tried in this order:
    `<start_of_turn>` is Gemma's, `<|start_header_id|>` with `<|eot_id|>` Llama 3's, `<|user|>` with `<|end|>`
    Phi-3's, `<|im_start|>` ChatML's. A vocabulary with none of them leaves it to `general.architecture`: `gemma3`
    is Gemma, `phi3` is Phi-3. Anything else gets ChatML, as in llama.cpp, whose `llama_model_chat_template` returns
    nothing for a file without a template and whose callers then use chatml.
    """
    for name, markers in VOCABULARY_MARKERS:
        if all(marker in special_tokens for marker in markers):
            return BUILTIN_TEMPLATES[name], f"chosen by the vocabulary's {' and '.join(markers)}"
    if architecture in ARCHITECTURE_TEMPLATES:
        return BUILTIN_TEMPLATES[ARCHITECTURE_TEMPLATES[architecture]], f"chosen by general.architecture {architecture}"
    return (
        BUILTIN_TEMPLATES[DEFAULT_TEMPLATE],
        f"the default: neither the vocabulary nor general.architecture {architecture} names another",
    )


def resolve_chat_template(value: TemplateChoice) -> Path | BuiltinTemplate:
    """What a `--chat-template` value names: a path (a `str` naming one that exists, or any `os.PathLike`) is a
    template file; else a built-in template's name is that built-in; anything else is refused, listing the names."""
    if isinstance(value, os.PathLike):
        return Path(value)
    if not isinstance(value, str):
        raise TemplateError(f"a chat template is a file or a built-in's name, got {type(value).__name__}")
    try:
        exists = value != "" and Path(value).exists()
    except (OSError, ValueError):  # a name too long for a path, or one with a NUL in it
        exists = False
    if exists:
        return Path(value)
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    raise TemplateError(
        f"chat template {value!r} is neither an existing file nor a built-in template "
        f"(built-ins: {', '.join(BUILTIN_TEMPLATES)})"
    )


def read_template_file(path: Path) -> str:
    """The text of a template file, refused by name when it is missing, unreadable, too large or not UTF-8."""
    most_bytes = MAX_TEMPLATE_CHARS * CHAR_BYTES  # the longest a template of MAX_TEMPLATE_CHARS can take
    try:
        with path.open("rb") as file:
            data = file.read(most_bytes + 1)  # never more: the file may be huge, or a pipe without end
    except FileNotFoundError:
        raise TemplateError(f"{path}: no such file") from None
    except OSError as exc:
        raise TemplateError(f"{path}: cannot read the chat template ({exc.strerror or exc})") from None
    if len(data) > most_bytes:
        raise TemplateError(
            f"{path}: more than {most_bytes:,} bytes, longer than a chat template may be "
            f"({MAX_TEMPLATE_CHARS:,} characters)"
        )
    try:
        return data.decode("utf-8-sig")  # an editor's byte-order mark is no part of the template
    except UnicodeDecodeError as exc:
        raise TemplateError(f"{path}: the chat template is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _special_texts(tokenizer: Tokenizer) -> frozenset[str]:
    return frozenset(tokenizer.token_text(token_id) for token_id in tokenizer.special_ids)


def _check_special_tokens(template: BuiltinTemplate, tokenizer: Tokenizer, what: str) -> None:
    """Refuse a built-in template whose control tokens the vocabulary would read as plain text; `what` names it."""
    specials = _special_texts(tokenizer)
    missing = [token for token in template.special_tokens if token not in specials]
    if missing:
        are_not = "is not a special token" if len(missing) == 1 else "are not special tokens"
        raise TemplateError(
            f"{what} writes {', '.join(missing)}, which {are_not} of its vocabulary: "
            "give a template that fits with --chat-template FILE"
        )


def _compile(source: str, origin: str, label: str) -> jinja2.Template:
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateError(
            f"{origin}: {label} is {len(source):,} characters long, "
            f"more than the {MAX_TEMPLATE_CHARS:,} a template may have"
        )
    environment = _environment()
    try:
        tree = environment.parse(source)
        _Guards().visit(tree)
        tree.set_environment(environment)  # the nodes _Guards made
        return environment.from_string(tree)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{origin}: {label} does not compile: {_describe(exc)}") from None
    except Exception as exc:  # deep nesting runs jinja2's parser or Python's compiler out of stack or memory
        raise TemplateError(f"{origin}: {label} does not compile: {_python_error(exc)}") from None


class _GenerationBlock(jinja2.ext.Extension):
    """Accepts transformers' `{% generation %}...{% endgeneration %}` markers and renders their body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _environment() -> _BudgetedSandbox:
    """A sandbox set up like transformers' `_compile_jinja_template`, every filter and test under the budgets."""
    environment = _BudgetedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        optimized=False,  # constant folding would run template code at compile time, outside any budget
    )
    environment.filters["tojson"] = _tojson
    environment.filters = {name: _budgeted_filter(name, f) for name, f in environment.filters.items()}
    environment.tests = {name: _timed(test) for name, test in environment.tests.items()}
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own `tojson` escapes <, > and & for HTML, which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


# -- the budgets of one render -------------------------------------------------------------------------------------


class _BudgetExceeded(Exception):
    """A render went over one of its budgets; the message says which. Not a ValueError or TypeError, which some
    filters catch to fall back to a default."""


class _RenderBudget:
    """The time and space one render may take, and what it has taken so far."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.built = 0  # bytes of the values built so far, each counted once
        self.printed = 0  # characters of output so far
        # id -> (value, size, depth) of each value measured whose size cannot change. Holding the value keeps its
        # id from being reused by a new object during the render; the budget counts what that holding costs.
        self._known: dict[int, tuple[object, int, int]] = {}

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise _BudgetExceeded(f"chat template exceeded its {RENDER_SECONDS:g} s render budget")

    def reserve(self, size: int) -> None:
        """Refuse, before it is built, a value estimated at `size` bytes that the budget has no room for."""
        if size > MAX_RENDER_BYTES - self.built:
            raise _BudgetExceeded(_MEMORY_MESSAGE)

    def admit(self, value: object) -> object:
        """Measure a value the template has just built, refusing it if it breaks a budget; returns it."""
        if isinstance(value, int) and value.bit_length() * math.log10(2) > MAX_INT_DIGITS:
            raise _BudgetExceeded(_DIGITS_MESSAGE)
        size, depth = self.measure(value)
        if size > MAX_RENDER_BYTES or self.built > MAX_RENDER_BYTES:
            raise _BudgetExceeded(_MEMORY_MESSAGE)
        if depth > MAX_VALUE_DEPTH:
            raise _BudgetExceeded(f"chat template would build a value nested more than {MAX_VALUE_DEPTH} levels deep")
        return value

    def measure(self, value: object) -> tuple[int, int]:
        """`value`'s size in bytes, counting what it holds wherever it appears, and how many levels it nests.

        A value met for the first time adds its own size to `built`; one seen before costs nothing more, so
        measuring is linear in what is new. Sizes stop growing past the budget: beyond it they do not matter.
        """
        sizes: dict[int, tuple[int, int]] = {}
        if self._settle(value, sizes):
            return sizes[id(value)]
        changeable: set[int] = set()  # namespaces, values holding one, and values whose size a cycle cut short
        active: set[int] = set()  # being sized: met again below itself, it is a cycle
        pending: list[tuple[object, Collection[object] | None]] = [(value, None)]
        while pending:
            item, parts = pending.pop()
            key = id(item)
            if key in sizes:
                continue
            if parts is None:  # size its parts first
                parts = _parts(item)
                active.add(key)
                pending.append((item, parts))
                for part in parts:
                    if id(part) not in sizes and id(part) not in active and not self._settle(part, sizes):
                        pending.append((part, None))
                continue
            active.discard(key)
            own = sys.getsizeof(item) + (sys.getsizeof(_attributes(item)) if isinstance(item, Namespace) else 0)
            size, depth = own, 0
            for part in parts:
                part_size, part_depth = sizes.get(id(part), (0, 0))
                if id(part) not in sizes or id(part) in changeable:
                    changeable.add(key)
                size, depth = size + part_size, max(depth, part_depth + 1)
            sizes[key] = (min(size, MAX_RENDER_BYTES + 1), depth)
            if isinstance(item, Namespace):
                changeable.add(key)
            if key in changeable:
                self.built += own
            else:
                self._remember(item, *sizes[key])
        return sizes[id(value)]

    def _settle(self, item: object, sizes: dict[int, tuple[int, int]]) -> bool:
        """Size `item` at once if it was measured before or holds no values; False if its parts come first."""
        known = self._known.get(id(item))
        if known is not None:
            sizes[id(item)] = known[1:]
        elif isinstance(item, (str, bytes)):
            sizes[id(item)] = (sys.getsizeof(item), 0)
            self._remember(item, sys.getsizeof(item), 0)
        elif not isinstance(item, _CONTAINERS):  # a number, None, a function, an undefined...
            sizes[id(item)] = (sys.getsizeof(item), 0)
            self.built += sys.getsizeof(item)
        else:
            return False
        return True

    def _remember(self, item: object, size: int, depth: int) -> None:
        self._known[id(item)] = (item, size, depth)
        self.built += sys.getsizeof(item) + _REMEMBERING_BYTES

    def printed_chars(self, value: object) -> int:
        """At most how many characters `str(value)` has: a container's repr takes at most 4 per byte it holds."""
        return len(value) if isinstance(value, str) else 4 * self.measure(value)[0]

    def text(self, value: object) -> str:
        """`value` as the text a filter reads from it (what jinja2's soft_str gives), made within the budget."""
        if isinstance(value, str):
            return value
        self.reserve(self.printed_chars(value))
        return str(value)

    def counted(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """The items of `iterable`, each measured as it comes, the time checked between them."""
        for item in iterable:
            self.check_time()
            yield self.admit(item)

    def materialized(self, iterable: Iterable[Any]) -> list[Any]:
        """The items of `iterable` in a list, built within the budget, for a size estimate that needs them all."""
        return self.admit(list(self.counted(iterable)))


_DIGITS_MESSAGE = f"chat template would build a number of more than {MAX_INT_DIGITS} digits"
_DICT_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
_CONTAINERS = (list, tuple, set, frozenset, dict, Namespace, *_DICT_VIEWS)  # the values _parts looks into
_REMEMBERING_BYTES = 100  # a tuple and a dict entry in _RenderBudget._known, per value remembered
_BUDGET: ContextVar[_RenderBudget] = ContextVar("chat_template_budget")  # the render running in this thread


def _budget() -> _RenderBudget:
    return _BUDGET.get()


def _parts(value: object) -> Collection[object]:
    """The values `value` holds, as repr and json would write them."""
    if isinstance(value, (str, bytes)):
        return ()
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    if isinstance(value, dict):
        return (*value.keys(), *value.values())
    if isinstance(value, _DICT_VIEWS):
        return (*value.mapping.keys(), *value.mapping.values())
    if isinstance(value, Namespace):
        attributes = _attributes(value)
        return (*attributes.keys(), *attributes.values())
    return ()


def _attributes(namespace: Namespace) -> dict[str, Any]:
    return object.__getattribute__(namespace, "_Namespace__attrs")


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with the render's budgets checked in every hook that the compiled template calls.

    The `budget_*` methods are what `_Guards` routes loops, `~`, literals, slices and output through.
    """

    # All of them: jinja2 would otherwise compute `'x' * 10**10` or `10 ** 10**10` as plain Python.
    intercepted_binops = frozenset(SandboxedEnvironment.default_binop_table)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.check_time()
        if _is_text_method(obj, "join") and len(args) == 1:
            args = (budget.materialized(args[0]),)
        size = _call_size(obj, args, kwargs)
        if size is not None:
            budget.reserve(size)
        return _admitted(budget, super().call(context, obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.check_time()
        if operator == "**" and _power_digits(left, right) > MAX_INT_DIGITS:
            raise _BudgetExceeded(_DIGITS_MESSAGE)
        size = _binop_size(budget, operator, left, right)
        if size is not None:
            budget.reserve(size)
        return budget.admit(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().check_time()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget().check_time()
        return super().getitem(obj, argument)

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        """Refuse an unsafe attribute at once; jinja2's undefined would print as '' and hide the attempt."""
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def budget_loop(self, iterable: Iterable[Any]) -> _Timed:
        """The iterable of a `for` loop: the time is checked before each pass, even through an empty body."""
        return _Timed(iterable, _budget())

    def budget_concat(self, *parts: Any) -> str:
        """`a ~ b ~ ...`, as jinja2's `str_join` makes it, once its length is known to fit."""
        budget = _budget()
        budget.reserve(sum(_text_bytes(budget.printed_chars(part), part) for part in parts))
        return "".join(map(str, parts))

    def budget_value(self, value: object) -> object:
        """A list, tuple or dict literal or a slice, measured by `call` on the way out."""
        return value

    def budget_output(self, value: object) -> str:
        """What a `{{ }}` or a piece of template text adds to the output, within the prompt budget."""
        budget = _budget()
        if budget.printed + budget.printed_chars(value) > MAX_PROMPT_CHARS:
            raise _BudgetExceeded(
                f"chat template would print more than {MAX_PROMPT_CHARS:,} characters (its prompt budget)"
            )
        text = str(value)
        budget.printed += len(text)
        return text


class _Timed:
    """An iterator over `iterable` that checks the time budget before each item.

    Not a generator, so `call` measures it as one value rather than each item it yields (a loop's items
    are not new values: a loop over a long text would otherwise count each character it passes).
    """

    def __init__(self, iterable: Iterable[Any], budget: _RenderBudget) -> None:
        self._items = iter(iterable)
        self._budget = budget

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        self._budget.check_time()
        return next(self._items)


def _admitted(budget: _RenderBudget, result: Any) -> Any:
    """A call's result, measured; a generator's items are measured as they come, since each may be new."""
    if isinstance(result, types.GeneratorType):
        return budget.counted(result)
    return budget.admit(result)


class _Guards(NodeTransformer):
    """Routes through the environment what the sandbox's own hooks do not see.

    A `for` loop over a list makes no call, `~` and literals build values, a slice copies, and output grows,
    all in plain Python: each becomes a call of one of `_BudgetedSandbox`'s `budget_*` methods.
    """

    def visit_For(self, node: jinja2.nodes.For) -> jinja2.nodes.For:
        self.generic_visit(node)
        node.iter = _budget_call("budget_loop", node.iter)
        return node

    def visit_Concat(self, node: jinja2.nodes.Concat) -> jinja2.nodes.Call:
        self.generic_visit(node)
        return _budget_call("budget_concat", *node.nodes)

    def visit_List(self, node: jinja2.nodes.Expr) -> jinja2.nodes.Call:
        self.generic_visit(node)
        return _budget_call("budget_value", node)

    visit_Dict = visit_List

    def visit_Tuple(self, node: jinja2.nodes.Tuple) -> jinja2.nodes.Expr:
        self.generic_visit(node)
        return _budget_call("budget_value", node) if node.ctx == "load" else node

    def visit_Getitem(self, node: jinja2.nodes.Getitem) -> jinja2.nodes.Expr:
        self.generic_visit(node)
        return _budget_call("budget_value", node) if isinstance(node.arg, jinja2.nodes.Slice) else node

    def visit_Output(self, node: jinja2.nodes.Output) -> jinja2.nodes.Output:
        self.generic_visit(node)
        node.nodes = [_budget_call("budget_output", child) for child in node.nodes]
        return node


def _budget_call(method: str, *arguments: jinja2.nodes.Expr) -> jinja2.nodes.Call:
    lineno = arguments[0].lineno
    return jinja2.nodes.Call(
        jinja2.nodes.EnvironmentAttribute(method, lineno=lineno), list(arguments), [], None, None, lineno=lineno
    )


def _timed(test: Callable[..., bool]) -> Callable[..., bool]:
    """A jinja2 test that checks the time budget first (tests run per item inside `select` and `reject`)."""

    @functools.wraps(test)  # keeps jinja2's pass_context / pass_environment marks
    def timed(*args: Any, **kwargs: Any) -> bool:
        _budget().check_time()
        return test(*args, **kwargs)

    return timed


# -- estimating what a call will build, before it builds it ---------------------------------------------------------


def _budgeted_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (the filter `name`) under the budgets: its result measured, its size estimated first when its
    arguments can make it large, and a text it would turn into a list at once given to it a character at a time."""
    size_of = _FILTER_SIZES.get(name)
    signature = inspect.signature(function)
    parameters = list(signature.parameters)
    subject = next(p for p in parameters if p not in _PASSED_ARGUMENTS)  # the value being filtered
    # jinja2 passes the environment, eval context or context first to a filter marked for it; a filter with an
    # async variant gets one its (synchronous) signature does not show.
    hidden = int(getattr(function, "jinja_pass_arg", None) is not None and parameters[0] not in _PASSED_ARGUMENTS)
    reads_arguments = size_of is not None or name in _LISTING_FILTERS or name in _MATERIALIZING_FILTERS

    @functools.wraps(function)  # keeps jinja2's pass_context / pass_environment marks
    def budgeted(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.check_time()
        if not reads_arguments:
            return _admitted(budget, function(*args, **kwargs))
        try:
            bound = signature.bind(*args[hidden:], **kwargs)
        except TypeError:  # the filter itself says what is wrong with its arguments
            return _admitted(budget, function(*args, **kwargs))
        bound.apply_defaults()
        arguments = bound.arguments
        if name in _LISTING_FILTERS and isinstance(arguments[subject], str):
            arguments[subject] = budget.counted(arguments[subject])
        elif name in _MATERIALIZING_FILTERS:
            arguments[subject] = budget.materialized(arguments[subject])
        if size_of is not None:
            budget.reserve(size_of(budget, arguments))
        return _admitted(budget, function(*args[:hidden], *bound.args, **bound.kwargs))

    return budgeted


# What jinja2 passes a filter before the value filtered: environment, eval context or context.
_PASSED_ARGUMENTS = frozenset({"environment", "env", "eval_ctx", "context"})
# Filters that build a list of a text's characters all at once: they get the characters one by one instead.
_LISTING_FILTERS = frozenset({"list", "sort", "batch", "slice", "unique", "groupby"})
# Filters whose size estimate needs the items of the value first.
_MATERIALIZING_FILTERS = frozenset({"join", "sum"})


def _text_bytes(chars: int, *parts: object) -> int:
    """The bytes of a text of `chars` characters made from `parts`: one per character when all of them are ASCII
    (texts that are, and numbers), else four."""
    ascii_only = all(
        part.isascii() if isinstance(part, (str, bytes)) else isinstance(part, (int, float)) or part is None
        for part in parts
    )
    return chars if ascii_only else chars * CHAR_BYTES


def _count(value: object) -> int:
    """`value` as a repeat count or width; anything else is 0, and the callee refuses it with its own error."""
    return max(value, 0) if isinstance(value, int) else 0


def _digits(text: str) -> int:
    return int(text) if len(text) <= 18 else 10**18  # a longer number is over every budget anyway


def _replace_chars(text: str | bytes, old: str | bytes, new: str | bytes, count: int | None) -> int:
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(len(new) - len(old), 0)


_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsab%]")


def _formatted_chars(budget: _RenderBudget, text: str, values: Collection[object], *, braces: bool) -> int:
    """At most how long `text` formatted with `values` is: `str.format` (`braces`) or `%` style.

    Each field may print any of the values, padded to any width the text names; a width taken from the values
    (`*`, or `{:{}}`) may be any of their integers.
    """
    if braces:
        fields = [spec for _, name, spec, _ in string.Formatter().parse(text) if name is not None]
        widths = sum(_digits(number) for spec in fields for number in re.findall(r"\d+", spec or ""))
        nested = any("{" in (spec or "") for spec in fields)
    else:
        specs = _PERCENT_FIELD.findall(text)
        fields = specs
        widths = sum(_digits(number) for spec in specs for number in spec if number not in ("", "*"))
        nested = "*" in text
    from_values = sum(_count(abs(v)) for v in values if isinstance(v, int)) if nested else 0
    printed = sum(budget.printed_chars(value) for value in values)
    return len(text) + widths + from_values + len(fields) * (FORMAT_FIELD_CHARS + printed)


def _format_method(obj: Any) -> types.BuiltinMethodType | None:
    """The `str.format` or `format_map` that `obj` wraps: the sandbox hands templates a wrapper for those."""
    wrapped = getattr(obj, "__wrapped__", None) if isinstance(obj, types.FunctionType) else None
    if _is_text_method(wrapped, "format") or _is_text_method(wrapped, "format_map"):
        return wrapped
    return None


def _is_text_method(obj: Any, name: str) -> bool:
    return (
        isinstance(obj, types.BuiltinMethodType)
        and isinstance(getattr(obj, "__self__", None), (str, bytes))
        and obj.__name__ == name
    )


def _call_size(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Bytes the call `obj(*args, **kwargs)` may build, where its arguments can make that large; else None."""
    budget = _budget()
    method = _format_method(obj)
    if method is not None:
        values = [*args, *kwargs.values()]
        if method.__name__ == "format_map" and len(values) == 1 and isinstance(values[0], dict):
            values = list(values[0].values())
        try:
            chars = _formatted_chars(budget, method.__self__, values, braces=True)
        except ValueError:  # a malformed format: the call says so itself
            return None
        return _text_bytes(chars, method.__self__, *values)
    if obj is _strftime_now and args and isinstance(args[0], str):
        return _text_bytes(STRFTIME_CHARS * len(args[0]))
    if obj is generate_lorem_ipsum:
        try:
            bound = inspect.signature(generate_lorem_ipsum).bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        n, longest = _count(bound.arguments["n"]), _count(bound.arguments["max"])
        return n * (longest + 1) * 16  # words of up to 15 letters and their separators
    if isinstance(obj, types.BuiltinMethodType) and isinstance(getattr(obj, "__self__", None), int):
        if obj.__name__ == "to_bytes":
            length = args[0] if args else kwargs.get("length", 1)
            return _count(length)
        return None
    text = getattr(obj, "__self__", None)
    if isinstance(obj, types.BuiltinMethodType) and isinstance(text, (str, bytes)) and obj.__name__ in _TEXT_METHODS:
        try:
            bound = _method_signature(type(text), obj.__name__).bind(text, *args, **kwargs)
        except TypeError:  # the call says itself what is wrong with its arguments
            return None
        bound.apply_defaults()
        try:
            return _text_method_size(text, obj.__name__, bound.arguments)
        except TypeError:  # arguments of the wrong type: the call says so itself
            return None
    return None


# The str and bytes methods whose arguments can make their result large, or a list of many new pieces.
_TEXT_METHODS = frozenset(
    {"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "translate", "split", "rsplit", "splitlines"}
)


@functools.cache
def _method_signature(kind: type, name: str) -> inspect.Signature:
    return inspect.signature(getattr(kind, name))


def _text_method_size(text: str | bytes, name: str, a: dict[str, Any]) -> int | None:
    """Bytes a str or bytes method may build, for those whose arguments can make the result large."""
    chars: int | None = None
    if name in ("center", "ljust", "rjust", "zfill"):
        chars = max(len(text), _count(a["width"]))
    elif name == "expandtabs":
        chars = len(text) + text.count("\t" if isinstance(text, str) else b"\t") * _count(a["tabsize"])
    elif name == "replace":
        chars = _replace_chars(text, a["old"], a["new"], a["count"])
    elif name == "join":
        items = a["iterable" if isinstance(text, str) else "iterable_of_bytes"]
        chars = sum(len(item) for item in items if isinstance(item, (str, bytes))) + len(text) * max(len(items) - 1, 0)
        return _text_bytes(chars, text, *items)
    elif name == "translate" and isinstance(text, str):
        table = a["table"]
        values = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
        chars = len(text) * max([1, *(len(v) for v in values if isinstance(v, str))])
        return _text_bytes(chars, text, *values)
    elif name in ("split", "rsplit", "splitlines"):
        return _pieces(text, name, a) * PIECE_BYTES + sys.getsizeof(text)
    return None if chars is None else _text_bytes(chars, text, *a.values())


def _pieces(text: str | bytes, name: str, a: dict[str, Any]) -> int:
    """At most how many pieces `text.split()`, `rsplit()` or `splitlines()` cut `text` into."""
    if name == "splitlines":
        breaks = LINE_BREAKS if isinstance(text, str) else b"\n\r"
        return sum(text.count(breaks[i : i + 1]) for i in range(len(breaks))) + 1
    separator, most = a["sep"], a["maxsplit"]
    if separator is None:
        spaces = WHITESPACE if isinstance(text, str) else b" \t\n\r\x0b\x0c"
        pieces = sum(text.count(spaces[i : i + 1]) for i in range(len(spaces))) + 1
    else:
        pieces = text.count(separator) + 1
    return min(pieces, most + 1) if isinstance(most, int) and most >= 0 else pieces


def _power_digits(base: Any, exponent: Any) -> float:
    """About how many digits `base ** exponent` has, for integers; 0 for what is not a growing integer power."""
    if not (isinstance(base, int) and isinstance(exponent, int)) or exponent <= 0 or abs(base) <= 1:
        return 0
    return exponent * math.log10(abs(base))


def _binop_size(budget: _RenderBudget, operator: str, left: Any, right: Any) -> int | None:
    """Bytes `left <operator> right` may build, for the operators that can build much more than they are given."""
    if operator == "*":
        sequence, count = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(sequence, (str, bytes)) and isinstance(count, int):
            return _text_bytes(len(sequence) * _count(count), sequence)
        if isinstance(sequence, (list, tuple)) and isinstance(count, int):
            return budget.measure(sequence)[0] * _count(count)
    if operator == "%" and isinstance(left, str):
        values = (
            list(right.values()) if isinstance(right, dict) else list(right) if isinstance(right, tuple) else [right]
        )
        return _text_bytes(_formatted_chars(budget, left, values, braces=False), left, *values)
    return None


def _json_size(budget: _RenderBudget, a: dict[str, Any]) -> int:
    """`tojson`: each byte of the value escapes to at most 6 characters, and each item gets its separators and a
    line indented once per level."""
    size, depth = budget.measure(a["value"])
    indent = a["indent"]
    indent_chars = len(indent) if isinstance(indent, str) else _count(indent)
    separators = a["separators"]
    separator_chars = sum(len(s) for s in separators if isinstance(s, str)) if isinstance(separators, tuple) else 4
    return 6 * size + (size // ITEM_BYTES + 1) * (depth * indent_chars + separator_chars + 2)


def _pprint_size(budget: _RenderBudget, a: dict[str, Any]) -> int:
    size, depth = budget.measure(a["value"])
    return 4 * size * (1 + depth)  # a repr, and lines indented by one more space per level


def _indent_size(budget: _RenderBudget, a: dict[str, Any]) -> int:
    text, width = budget.text(a["s"]), a["width"]
    prefix = len(width) if isinstance(width, str) else _count(width)
    return _text_bytes((len(text) + 2) * (1 + prefix), text, width)  # every line of the text, and one more


def _join_size(budget: _RenderBudget, a: dict[str, Any]) -> int:
    items, separator = a["value"], budget.text(a["d"])
    chars = sum(budget.printed_chars(item) for item in items) + len(separator) * max(len(items) - 1, 0)
    return _text_bytes(chars, separator, *items)


def _sum_size(budget: _RenderBudget, a: dict[str, Any]) -> int:
    items = a["iterable"]
    if not any(isinstance(item, (list, tuple)) for item in items):
        return 0
    return len(items) * sum(budget.measure(item)[0] for item in items)  # each partial sum is a new list


def _text_filter_size(growth: int) -> Callable[[_RenderBudget, dict[str, Any]], int]:
    """A filter that reads its value as text and writes each character of it as at most `growth` characters."""

    def size(budget: _RenderBudget, a: dict[str, Any]) -> int:
        value = next(v for k, v in a.items() if k not in _PASSED_ARGUMENTS)
        return growth * CHAR_BYTES * budget.printed_chars(value)

    return size


# The filters whose arguments can make their result much larger than their input: bytes they may build.
_FILTER_SIZES: dict[str, Callable[[_RenderBudget, dict[str, Any]], int]] = {
    "center": lambda b, a: _text_bytes(max(b.printed_chars(a["value"]), _count(a["width"])), a["value"]),
    "format": lambda b, a: _text_bytes(
        _formatted_chars(b, b.text(a["value"]), list(a["kwargs"].values()) or list(a["args"]), braces=False),
        a["value"],
        *a["args"],
        *a["kwargs"].values(),
    ),
    "indent": _indent_size,
    "join": _join_size,
    "replace": lambda b, a: _text_bytes(
        _replace_chars(b.text(a["s"]), b.text(a["old"]), b.text(a["new"]), a["count"]), a["s"], a["new"]
    ),
    "batch": lambda b, a: ITEM_BYTES * _count(a["linecount"]) if a["fill_with"] is not None else 0,
    "slice": lambda b, a: (ITEM_BYTES + sys.getsizeof([])) * _count(a["slices"]),
    "wordwrap": lambda b, a: _text_bytes(
        b.printed_chars(a["s"]) * (1 + len(b.text(a["wrapstring"] or "\n"))), a["s"], a["wrapstring"] or ""
    ),
    "tojson": _json_size,
    "pprint": _pprint_size,
    "sum": _sum_size,
    "urlize": lambda b, a: _text_bytes(
        6 * b.printed_chars(a["value"])
        + (b.printed_chars(a["value"]) // 3 + 1) * (48 + len(b.text(a["rel"] or "")) + len(b.text(a["target"] or ""))),
        a["value"],
    ),
    **dict.fromkeys(("e", "escape", "forceescape", "xmlattr"), _text_filter_size(6)),  # '&#34;' for '"'
    "urlencode": _text_filter_size(12),  # '%XX' for each of up to 4 UTF-8 bytes
    **dict.fromkeys(
        ("capitalize", "lower", "upper", "title", "trim", "striptags", "truncate", "wordcount", "string", "safe"),
        _text_filter_size(1),
    ),
}


# -- errors ------------------------------------------------------------------------------------------------------------


def _describe(exc: jinja2.TemplateError) -> str:
    line = getattr(exc, "lineno", None)
    where = f" (line {line})" if line else ""
    return f"{_one_line(exc.message or type(exc).__name__)}{where}"


def _python_error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {_one_line(str(exc))}"


def _one_line(text: str) -> str:
    """`text` on one line and at most MAX_QUOTED_CHARS long: a template chooses its own error messages."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text[: MAX_QUOTED_CHARS * 2]).split())
    return line if len(line) <= MAX_QUOTED_CHARS else line[: MAX_QUOTED_CHARS - 1] + "…"


def _check_messages(messages: list[dict[str, str]]) -> None:
    if not isinstance(messages, list) or not messages:
        raise TemplateError("a conversation must be a non-empty list of messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise TemplateError(f"message {index} must be a dict with 'role' and 'content'")
        if message["role"] not in ROLES:
            raise TemplateError(f"message {index} has role {message['role']!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise TemplateError(f"message {index} ({message['role']}) has content that is not a string")


def _token_or_empty(tokenizer: Tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tokenizer.token_text(token_id)
