"""Chat templates: a conversation rendered into the prompt text a model was trained on.

A GGUF stores its chat template as Jinja source in `tokenizer.chat_template`,
written for Hugging Face transformers' `apply_chat_template`. We render it the
same way: jinja2's immutable sandbox (templates are untrusted code), blocks
trimmed as transformers does, and the names templates expect —
`messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
`raise_exception`, `strftime_now` and a `tojson` filter that does not escape
HTML.

A template is compiled and test-rendered when the model loads, so a broken
template is reported at once rather than at the first chat turn.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from minfer.errors import TemplateError
from minfer.gguf_file import GGUFFile

if TYPE_CHECKING:
    from minfer.tokenizer import Tokenizer

# Used only for a GGUF without a template: the ChatML format of Qwen and SmolLM.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ROLES = ("system", "user", "assistant")

# The conversation every template must render at load time.
PROBE_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2 + 2?"},
]


class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str, origin: str, is_fallback: bool = False) -> None:
        """Compile `source` and check that it renders `PROBE_CONVERSATION`.

        `origin` names where the template came from (the GGUF path) in errors.
        """
        self.source = source
        self.is_fallback = is_fallback
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._origin = origin
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{origin}: tokenizer.chat_template does not compile: {_describe(exc)}") from None
        self.render(PROBE_CONVERSATION)

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile, tokenizer: Tokenizer) -> ChatTemplate:
        """The template of `gguf_file`, or ChatML when the file has none."""
        source = gguf_file.get("tokenizer.chat_template")
        if source is not None and not isinstance(source, str):
            raise TemplateError(f"{gguf_file.path}: tokenizer.chat_template is not a string")
        return cls(
            CHATML if source is None else source,
            bos_token=_token_or_empty(tokenizer, tokenizer.bos_id),
            eos_token=_token_or_empty(tokenizer, tokenizer.eos_id),
            origin=str(gguf_file.path),
            is_fallback=source is None,
        )

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (dicts with `role` and `content`).

        With `add_generation_prompt`, the text ends where the assistant's reply begins.
        """
        _check_messages(messages)
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{self._origin}: chat template failed to render: {_describe(exc)}") from None
        except Exception as exc:  # a template is code: it can fail with any Python error
            raise TemplateError(
                f"{self._origin}: chat template failed to render: {type(exc).__name__}: {exc}"
            ) from None


class _GenerationBlock(jinja2.ext.Extension):
    """Accepts transformers' `{% generation %}...{% endgeneration %}` markers and renders their body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    """A sandbox set up like transformers' `_compile_jinja_template`."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
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


def _describe(exc: jinja2.TemplateError) -> str:
    line = getattr(exc, "lineno", None)
    where = f" (line {line})" if line else ""
    return f"{exc.message or type(exc).__name__}{where}"


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
