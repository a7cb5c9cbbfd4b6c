"""Built-in chat templates: their text is their models' own, they render what llama.cpp's built-ins render, a file
without a template gets one by its vocabulary and architecture, and `--chat-template` replaces a file's template."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import gguf
import pytest
from test_chat_template import CONVERSATIONS, GEMMA_3, minfer_render, reference_render

from minfer.chat_template import (
    MAX_TEMPLATE_CHARS,
    ChatTemplate,
    choose_builtin,
    resolve_chat_template,
)
from minfer.chat_template_builtins import BUILTIN_TEMPLATES, CHATML, LLAMA_3
from minfer.errors import TemplateError
from minfer.gguf_file import GGUFFile
from minfer.testing.synthetic import rewrite_gguf
from minfer.testing.vocab import add_tokenizer_metadata
from minfer.tokenizer import Tokenizer

# -- llama.cpp's expected renders ----------------------------------------------------------------------------------
# From llama.cpp's tests/test-chat-template.cpp (the copy vendored in llama-cpp-python 0.3.36): its conversation,
# and the `expected_output` of the cases whose template llama.cpp detects as each of its built-ins, chatml
# ("teknium/OpenHermes-2.5-Mistral-7B"), gemma ("google/gemma-7b-it"), llama3 ("Llama-3") and phi3 ("Phi-3-small").
# Those cases render with an empty BOS and EOS and a generation prompt.

LLAMA_CPP_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
LLAMA_CPP_EXPECTED = {
    "chatml": (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n"
        "<|im_start|>user\nWho are you<|im_end|>\n"
        "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
        "<|im_start|>user\nAnother question<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "gemma": (
        "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi there<end_of_turn>\n"
        "<start_of_turn>user\nWho are you<end_of_turn>\n"
        "<start_of_turn>model\nI am an assistant<end_of_turn>\n"
        "<start_of_turn>user\nAnother question<end_of_turn>\n"
        "<start_of_turn>model\n"
    ),
    "llama3": (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "phi3": (
        "<|system|>\nYou are a helpful assistant<|end|>\n"
        "<|user|>\nHello<|end|>\n"
        "<|assistant|>\nHi there<|end|>\n"
        "<|user|>\nWho are you<|end|>\n"
        "<|assistant|>\n   I am an assistant   <|end|>\n"
        "<|user|>\nAnother question<|end|>\n"
        "<|assistant|>\n"
    ),
}
# The generation prompt each of them ends with (llama.cpp's `add_ass`).
GENERATION_PROMPTS = {
    "chatml": "<|im_start|>assistant\n",
    "gemma": "<start_of_turn>model\n",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "phi3": "<|assistant|>\n",
}
# The same test's quotes of two published templates (`template_str`).
LLAMA_CPP_OPENHERMES = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"  # noqa: E501 (verbatim)
LLAMA_CPP_LLAMA_3 = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"  # noqa: E501 (verbatim)

ORIGIN = "model.gguf"


def builtin(name: str, *, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    return ChatTemplate(BUILTIN_TEMPLATES[name].source, bos_token=bos_token, eos_token=eos_token, origin=ORIGIN)


def test_the_builtins_are_llama_cpps():
    assert list(BUILTIN_TEMPLATES) == ["chatml", "gemma", "llama3", "phi3"]


@pytest.mark.parametrize("name", LLAMA_CPP_EXPECTED)
def test_builtins_render_what_llama_cpp_renders(name):
    assert builtin(name).render(LLAMA_CPP_CONVERSATION) == LLAMA_CPP_EXPECTED[name]


@pytest.mark.parametrize("name", LLAMA_CPP_EXPECTED)
def test_without_a_generation_prompt_the_last_turn_is_the_end(name):
    """The published templates honour add_generation_prompt; Phi-3's ends a finished conversation with EOS."""
    expected = LLAMA_CPP_EXPECTED[name].removesuffix(GENERATION_PROMPTS[name]) + ("</s>" if name == "phi3" else "")
    assert builtin(name, eos_token="</s>").render(LLAMA_CPP_CONVERSATION, add_generation_prompt=False) == expected


def test_the_builtins_are_the_published_text():
    assert CHATML == LLAMA_CPP_OPENHERMES
    assert BUILTIN_TEMPLATES["gemma"].source == GEMMA_3
    # llama.cpp quotes Llama 3's first release, which wrote the generation prompt whether or not it was asked for.
    header = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    published = LLAMA_CPP_LLAMA_3.replace(header, "{% if add_generation_prompt %}" + header + "{% endif %}")
    assert published == LLAMA_3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_builtins_render_as_transformers_does(name, conversation, add_generation_prompt):
    source, messages = BUILTIN_TEMPLATES[name].source, CONVERSATIONS[conversation]
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>", origin=ORIGIN)
    assert minfer_render(template, messages, add_generation_prompt) == reference_render(
        source, messages, add_generation_prompt
    )


@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_each_builtin_declares_every_control_token_it_writes(name):
    """What is left of a render once the declared tokens, BOS, EOS, roles and contents are gone is punctuation."""
    template = BUILTIN_TEMPLATES[name]
    rendered = builtin(name, bos_token="<s>", eos_token="</s>").render(LLAMA_CPP_CONVERSATION)
    for text in (*template.special_tokens, "<s>", "</s>", *(m["content"].strip() for m in LLAMA_CPP_CONVERSATION)):
        rendered = rendered.replace(text, "")
    for role in ("system", "user", "assistant", "model"):
        rendered = rendered.replace(role, "")
    assert set(rendered) <= {"\n", " "}, rendered


# -- which built-in a file without a template gets --------------------------------------------------------------------

# The special tokens of real vocabularies (llama.cpp's models/ggml-vocab-*.gguf and the models' tokenizer.json).
GEMMA_3_SPECIALS = {
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
}
LLAMA_3_SPECIALS = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
PHI_3_SPECIALS = {"<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"}
QWEN_2_SPECIALS = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}


@pytest.mark.parametrize(
    ("specials", "architecture", "name", "reason"),
    [
        (GEMMA_3_SPECIALS, "gemma3", "gemma", "chosen by the vocabulary's <start_of_turn>"),
        (LLAMA_3_SPECIALS, "llama", "llama3", "chosen by the vocabulary's <|start_header_id|> and <|eot_id|>"),
        (PHI_3_SPECIALS, "phi3", "phi3", "chosen by the vocabulary's <|user|> and <|end|>"),
        (QWEN_2_SPECIALS, "qwen2", "chatml", "chosen by the vocabulary's <|im_start|>"),
        # The vocabulary first, in the rule's order, whatever the architecture says.
        (GEMMA_3_SPECIALS | QWEN_2_SPECIALS, "phi3", "gemma", "chosen by the vocabulary's <start_of_turn>"),
        (LLAMA_3_SPECIALS | PHI_3_SPECIALS, "llama", "llama3", "chosen by the vocabulary's <|start_header_id|> and "
         "<|eot_id|>"),
        (PHI_3_SPECIALS | QWEN_2_SPECIALS, "qwen2", "phi3", "chosen by the vocabulary's <|user|> and <|end|>"),
        # A format needs all of its markers.
        ({"<|start_header_id|>"}, "llama", "chatml", "the default: neither the vocabulary nor general.architecture "
         "llama names another"),
        # Then the architecture; then ChatML.
        ({"<bos>", "<eos>"}, "gemma3", "gemma", "chosen by general.architecture gemma3"),
        ({"<s>", "</s>"}, "phi3", "phi3", "chosen by general.architecture phi3"),
        ({"<s>", "</s>"}, "llama", "chatml", "the default: neither the vocabulary nor general.architecture llama "
         "names another"),
    ],
)  # fmt: skip
def test_the_rule(specials, architecture, name, reason):
    assert choose_builtin(frozenset(specials), architecture) == (BUILTIN_TEMPLATES[name], reason)


VOCAB_SIZE = 2048  # the synthetic vocabulary has unused padding tokens from this size on: room for new ones


def rewrite_vocabulary(
    source: Path,
    target: Path,
    *,
    add: Sequence[str] = (),
    add_as_text: Sequence[str] = (),
    rename: dict[str, str] | None = None,
    keep_template: bool = False,
) -> Path:
    """A copy of `source` (without its chat template unless `keep_template`) whose unused padding tokens are
    replaced by `add` (control tokens, as llama.cpp's converter marks a model's special tokens) and `add_as_text`
    (normal tokens), and whose tokens named in `rename` are spelled anew."""
    gguf_file = GGUFFile(source)
    tokens = list(gguf_file.metadata["tokenizer.ggml.tokens"])
    types = list(gguf_file.metadata["tokenizer.ggml.token_type"])
    padding = iter([index for index, token_type in enumerate(types) if token_type == gguf.TokenType.UNUSED])
    new = [*((text, gguf.TokenType.CONTROL) for text in add), *((text, gguf.TokenType.NORMAL) for text in add_as_text)]
    for text, token_type in new:
        index = next(padding)
        tokens[index], types[index] = text, int(token_type)
    for old, spelled in (rename or {}).items():
        tokens[tokens.index(old)] = spelled
    array = gguf.GGUFValueType.ARRAY
    return rewrite_gguf(
        source,
        target,
        set_keys={"tokenizer.ggml.tokens": (tokens, array), "tokenizer.ggml.token_type": (types, array)},
        drop_keys=() if keep_template else ("tokenizer.chat_template",),
    )


# ChatML's control tokens spelled as Gemma spells its BOS and EOS: a vocabulary without ChatML's markers.
WITHOUT_CHATML = {"<|im_start|>": "<bos>", "<|im_end|>": "<eos>"}


def vocabulary_file(tmp_path: Path, architecture: str = "llama", chat_template: str | None = None, **changes) -> Path:
    """A GGUF of the synthetic tokenizer alone, under `architecture`, changed as `rewrite_vocabulary` does."""
    base = tmp_path / "base.gguf"
    writer = gguf.GGUFWriter(base, architecture)
    add_tokenizer_metadata(writer, VOCAB_SIZE, chat_template=chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if not changes:
        return base
    return rewrite_vocabulary(base, tmp_path / "vocab.gguf", keep_template=True, **changes)


def template_of(path: Path, chat_template: str | Path | None = None) -> tuple[ChatTemplate, Tokenizer]:
    gguf_file = GGUFFile(path)
    tokenizer = Tokenizer.from_gguf(gguf_file)
    return ChatTemplate.from_gguf(gguf_file, tokenizer, chat_template), tokenizer


@pytest.mark.parametrize("name", ["gemma", "llama3", "phi3"])
def test_a_file_without_a_template_gets_the_builtin_its_vocabulary_marks(tmp_path, name):
    markers = BUILTIN_TEMPLATES[name].special_tokens
    template, tokenizer = template_of(vocabulary_file(tmp_path, add=markers))  # ChatML's markers are there too
    reason = choose_builtin(markers, "llama")[1]
    assert template.provenance == f"built-in {name} (the file has none; {reason})"
    assert template.source == BUILTIN_TEMPLATES[name].source
    # Every control token it writes is one token of the prompt, not text.
    ids = tokenizer.encode(template.render(LLAMA_CPP_CONVERSATION))
    for marker in markers:
        assert tokenizer.encode(marker)[0] in ids and len(tokenizer.encode(marker)) == 1


def test_gemma_starts_with_the_vocabularys_bos(tmp_path):
    template, tokenizer = template_of(
        vocabulary_file(tmp_path, "gemma3", add=BUILTIN_TEMPLATES["gemma"].special_tokens, rename=WITHOUT_CHATML)
    )
    rendered = template.render([{"role": "user", "content": "Hi"}])
    assert rendered == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert tokenizer.encode(rendered)[:2] == [tokenizer.bos_id, tokenizer.encode("<start_of_turn>")[0]]


def test_a_builtin_the_vocabulary_cannot_spell_is_refused_at_each_render(tmp_path):
    """A base model without chat tokens loads (raw prompts, benchmarks); a conversation is refused, naming why."""
    path = vocabulary_file(tmp_path, "gemma3", rename=WITHOUT_CHATML)
    template, _ = template_of(path)
    assert template.provenance.startswith("none: the file has none and the built-in gemma")
    with pytest.raises(TemplateError) as refused:
        template.render([{"role": "user", "content": "Hi"}])
    assert str(refused.value) == (
        f"{path}: the file has no chat template, and the built-in gemma template (chosen by general.architecture "
        "gemma3) writes <start_of_turn>, <end_of_turn>, which are not special tokens of its vocabulary: "
        "give a template that fits with --chat-template FILE"
    )


def test_markers_that_are_plain_text_do_not_count(tmp_path):
    path = vocabulary_file(tmp_path, add_as_text=["<start_of_turn>"], rename=WITHOUT_CHATML)
    with pytest.raises(TemplateError, match=r"the built-in chatml template \(the default: neither the vocabulary nor "
                       r"general.architecture llama names another\) writes <\|im_start\|>, <\|im_end\|>, which are "
                       r"not special tokens"):  # fmt: skip
        template_of(path)[0].render([{"role": "user", "content": "Hi"}])


def test_every_control_token_of_the_builtin_is_needed(tmp_path):
    path = vocabulary_file(tmp_path, "phi3", add=["<|user|>", "<|assistant|>", "<|end|>"])
    with pytest.raises(TemplateError, match=r"\(chosen by the vocabulary's <\|user\|> and <\|end\|>\) writes "
                       r"<\|system\|>, which is not a special token of its vocabulary"):  # fmt: skip
        template_of(path)[0].render([{"role": "user", "content": "Hi"}])


# -- --chat-template: a file, or a built-in's name ------------------------------------------------------------------

PLAIN = "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}[assistant] "


def test_a_value_that_names_a_file_is_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_chat_template("gemma") is BUILTIN_TEMPLATES["gemma"]
    Path("gemma").write_text(PLAIN)  # a file of a built-in's name comes first
    assert resolve_chat_template("gemma") == Path("gemma")
    assert resolve_chat_template(tmp_path / "anything.jinja") == tmp_path / "anything.jinja"  # a Path is a path


@pytest.mark.parametrize("value", ["gemma3", "missing.jinja", "", "x" * 5000, "a\0b"])
def test_anything_else_is_refused_with_the_names(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TemplateError) as refused:
        resolve_chat_template(value)
    assert str(refused.value) == (
        f"chat template {value!r} is neither an existing file nor a built-in template "
        "(built-ins: chatml, gemma, llama3, phi3)"
    )


def test_a_template_file_replaces_the_files_own(tmp_path):
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN + "\n")  # Jinja drops one trailing newline, as transformers' environment does
    model = vocabulary_file(tmp_path, chat_template="{% for m in messages %}{{ m.content }")  # its own is broken
    for given in (path, str(path)):
        template, _ = template_of(model, given)
        assert template.provenance == f"{path} (--chat-template)"
        assert template.render(CONVERSATIONS["no system prompt"][:1]) == "[user] Hi!\n[assistant] "


def test_a_byte_order_mark_is_no_part_of_the_template(tmp_path):
    path = tmp_path / "bom.jinja"
    path.write_bytes(b"\xef\xbb\xbf" + PLAIN.encode())
    template, _ = template_of(vocabulary_file(tmp_path), path)
    assert template.source == PLAIN


def test_a_builtin_by_name_replaces_the_files_own(tmp_path):
    model = vocabulary_file(tmp_path, chat_template=CHATML, add=BUILTIN_TEMPLATES["llama3"].special_tokens)
    template, _ = template_of(model, "llama3")
    assert template.provenance == "built-in llama3 (--chat-template)"
    assert template.source == LLAMA_3


def test_a_builtin_by_name_must_fit_the_vocabulary(tmp_path):
    model = vocabulary_file(tmp_path)
    with pytest.raises(TemplateError) as refused:
        template_of(model, "phi3")
    assert str(refused.value) == (
        f"{model}: the built-in phi3 template writes <|system|>, <|user|>, <|assistant|>, <|end|>, which are not "
        "special tokens of its vocabulary: give a template that fits with --chat-template FILE"
    )


BAD_FILES = {
    "missing": (None, "{path}: no such file"),
    "a directory": ("directory", r"{path}: cannot read the chat template \(Is a directory\)"),
    "not UTF-8": (b"{{ messages[0]['content'] }} caf\xe9 au lait", r"{path}: the chat template is not UTF-8 text "
                  r"\(invalid continuation byte at byte 32\)"),
    "too large": (b" " * (4 * MAX_TEMPLATE_CHARS + 1), r"{path}: more than 400,000 bytes, longer than a chat template "
                  r"may be \(100,000 characters\)"),
    "too long": ("é" * (MAX_TEMPLATE_CHARS + 1), r"{path}: chat template is 100,001 characters long, more than the "
                 r"100,000 a template may have"),
    "does not compile": ("{% for message in messages %}", r"{path}: chat template does not compile: Unexpected end "
                         r"of template"),
    "fails the probe": ("{{ raise_exception('no system prompts') }}", r"{path}: chat template failed to render: "
                        r"no system prompts"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_bad_template_file_is_refused_naming_it(tmp_path, name):
    content, error = BAD_FILES[name]
    path = tmp_path / "template.jinja"
    if content == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(TemplateError, match="^" + error.replace("{path}", re.escape(str(path)))):
        template_of(vocabulary_file(tmp_path), path)
