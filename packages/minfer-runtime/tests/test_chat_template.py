"""Chat templates: rendered like transformers does, refused at load when they cannot render."""

from __future__ import annotations

import datetime
from pathlib import Path

import gguf
import pytest

from minfer.chat_template import CHATML, ChatTemplate
from minfer.errors import TemplateError
from minfer.gguf_file import GGUFFile
from minfer.testing.vocab import add_tokenizer_metadata
from minfer.tokenizer import Tokenizer

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+2?"},
]


def load_template(tmp_path: Path, chat_template: str | None) -> ChatTemplate:
    """The template of a small synthetic GGUF carrying `chat_template` (None: no template key)."""
    path = tmp_path / "chat.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    add_tokenizer_metadata(writer, 512, chat_template=chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_file = GGUFFile(path)
    return ChatTemplate.from_gguf(gguf_file, Tokenizer.from_gguf(gguf_file))


def test_default_model_template(default_model_gguf):
    template = ChatTemplate.from_gguf(default_model_gguf, Tokenizer.from_gguf(default_model_gguf))
    assert not template.is_fallback
    assert template.source == default_model_gguf.metadata["tokenizer.chat_template"]
    # SmolLM2's template adds its own system prompt when the conversation has none.
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chatml_renders_every_turn(tmp_path):
    template = load_template(tmp_path, CHATML)
    assert template.render(CONVERSATION) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(CONVERSATION, add_generation_prompt=False).endswith("2+2?<|im_end|>\n")


def test_chatml_is_the_fallback_only_without_a_template(tmp_path):
    fallback = load_template(tmp_path, None)
    assert fallback.is_fallback
    assert fallback.source == CHATML
    assert fallback.render([{"role": "user", "content": "x"}]) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )


def test_transformers_conventions(tmp_path):
    source = (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "{% if message['role'] == 'assistant' %}{% continue %}{% endif %}"
        "{{ message | tojson }}"
        "{% endfor %}"
        "{% generation %}[gen]{% endgeneration %}"
        "{{ eos_token }}"
    )
    template = load_template(tmp_path, source)
    rendered = template.render([{"role": "user", "content": "<b>é</b>"}, {"role": "assistant", "content": "no"}])
    # tojson keeps non-ASCII and does not escape HTML; `continue` works; generation blocks render their body.
    assert rendered == '<|im_start|>{"role": "user", "content": "<b>é</b>"}[gen]<|im_end|>'


def test_strftime_now(tmp_path):
    template = load_template(tmp_path, "{{ strftime_now('%Y') }}")
    assert template.render([{"role": "user", "content": "x"}]) == str(datetime.datetime.now().year)


def test_blocks_are_trimmed_like_transformers(tmp_path):
    source = (
        "{% for message in messages %}\n    {% if true %}\n{{ message['content'] }}\n    {% endif %}\n{% endfor %}\n"
    )
    template = load_template(tmp_path, source)
    assert template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb\n"


def test_a_template_that_does_not_compile_is_refused_at_load(tmp_path):
    with pytest.raises(TemplateError, match=r"chat\.gguf: tokenizer\.chat_template does not compile"):
        load_template(tmp_path, "{% for message in messages %}{{ message['content'] }}")


def test_a_template_that_cannot_render_the_probe_is_refused_at_load(tmp_path):
    source = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    with pytest.raises(TemplateError, match=r"chat\.gguf: chat template failed to render: System role not supported"):
        load_template(tmp_path, source)


def test_python_errors_inside_a_template_are_template_errors(tmp_path):
    with pytest.raises(TemplateError, match=r"chat\.gguf: chat template failed to render"):
        load_template(tmp_path, "{{ messages[0]['content'] / 2 }}")


def test_the_sandbox_blocks_escapes(tmp_path):
    with pytest.raises(TemplateError, match="chat template failed to render"):
        load_template(tmp_path, "{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError, match="chat template failed to render"):
        load_template(tmp_path, "{% set _ = messages.append(1) %}")


def test_a_render_time_raise_is_a_template_error(tmp_path):
    source = (
        "{% for message in messages %}"
        "{% if message['role'] == 'user' and loop.index0 > 1 and messages[loop.index0 - 1]['role'] == 'user' %}"
        "{{ raise_exception('Conversation roles must alternate') }}"
        "{% endif %}{{ message['content'] }}{% endfor %}"
    )
    template = load_template(tmp_path, source)
    with pytest.raises(TemplateError, match="Conversation roles must alternate"):
        template.render([*CONVERSATION, {"role": "user", "content": "again"}])


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([], "non-empty list"),
        ([{"role": "tool", "content": "x"}], r"message 0 has role 'tool'; expected one of system, user, assistant"),
        ([{"role": "user"}], "message 0 must be a dict with 'role' and 'content'"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": 3}], "message 1 .user. has content"),
    ],
)
def test_messages_are_validated(tmp_path, messages, error):
    template = load_template(tmp_path, CHATML)
    with pytest.raises(TemplateError, match=error):
        template.render(messages)
