"""Chat templates: rendered like transformers does, refused at load when they cannot render, and kept within their
budgets of time and memory whatever the template does."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gguf
import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

import minfer.chat_template
from minfer.chat_template import (
    CHATML,
    MAX_INT_DIGITS,
    MAX_PROMPT_CHARS,
    MAX_RENDER_BYTES,
    MAX_TEMPLATE_CHARS,
    MAX_VALUE_DEPTH,
    PROBE_CONVERSATION,
    RENDER_SECONDS,
    ChatTemplate,
)
from minfer.chat_template_builtins import GEMMA
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
    assert template.provenance == "from the file"
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
    assert load_template(tmp_path, CHATML).provenance == "from the file"
    fallback = load_template(tmp_path, None)
    assert fallback.provenance == "built-in chatml (the file has none; chosen by the vocabulary's <|im_start|>)"
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


# -- real templates render exactly as transformers renders them -------------------------------------------------------

ORIGIN = "model.gguf"
BOS, EOS = "<s>", "</s>"
FIXED_NOW = datetime.datetime(2025, 3, 14, 9, 26, 53)


class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


@pytest.fixture
def fixed_clock(monkeypatch):
    """The clock strftime_now reads, in minfer as in the reference, so that Llama's date line is the same in both."""
    monkeypatch.setattr(minfer.chat_template, "datetime", FixedClock)


def transformers_tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_template_error(message):
    raise jinja2.TemplateError(message)


def reference_render(source: str, messages: list[dict], add_generation_prompt: bool) -> str:
    """What transformers' apply_chat_template renders, or why it refuses: jinja2's sandbox without minfer's budgets."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = transformers_tojson
    environment.globals["raise_exception"] = raise_template_error
    environment.globals["strftime_now"] = FIXED_NOW.strftime
    try:
        return environment.from_string(source).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=BOS, eos_token=EOS
        )
    except jinja2.TemplateError as exc:
        return f"refused: {exc.message}"


def minfer_render(template: ChatTemplate, messages: list[dict], add_generation_prompt: bool) -> str:
    try:
        return template.render(messages, add_generation_prompt=add_generation_prompt)
    except TemplateError as exc:
        return "refused: " + str(exc).removeprefix(f"{ORIGIN}: chat template failed to render: ")


TOOL_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call12345",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius", "days": [1, 2]}},
        }
    ],
}


def long_conversation(turns: int) -> list[dict]:
    """A system prompt and `turns` exchanges of a few kilobytes, with what templates must not touch: HTML, quotes,
    non-ASCII text and Jinja syntax."""
    messages = [{"role": "system", "content": 'Be kind. <b>&amp;</b> "quoted" é 字 😀\n  indented line\n'}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "what does {{ x }} mean? é 字 <&> " * 60})
        messages.append({"role": "assistant", "content": f" Answer {turn}:\n" + "{% raw %} it is 😀 'quoted' " * 60})
    messages.append({"role": "user", "content": "And the last question?"})
    return messages


CONVERSATIONS = {
    "probe": PROBE_CONVERSATION,
    "no system prompt": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "  2+2?  "},
    ],
    "tool call": [
        {"role": "system", "content": "You answer with tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        TOOL_CALL,
        {"role": "assistant", "content": "It is 21 °C in Zürich."},
        {"role": "user", "content": "Thanks <3 & bye"},
    ],
    "long": long_conversation(300),  # about 600,000 characters: a full 128k-token context
}


# meta-llama/Llama-3.2-1B-Instruct: tools, the date from strftime_now, the system message moved into the header.
LLAMA_3_2 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""  # noqa: E501 (verbatim, long lines included)

# Qwen/Qwen2.5-0.5B-Instruct: tools and tool calls through tojson, a default system prompt.
QWEN_2_5 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501 (verbatim, long lines included)

# mistralai/Mistral-7B-Instruct-v0.3: a namespace counting turns, selectattr, tool calls through tojson and a slice.
MISTRAL_V0_3 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""  # noqa: E501 (verbatim, long lines included)

# google/gemma-2-2b-it: no system role, strict alternation (its newlines are real ones, inside the quotes too).
GEMMA_2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# google/gemma-3-4b-it's template (the system message prefixed to the first user turn, image parts, alternation) is
# the builtin `gemma`, word for word.
GEMMA_3 = GEMMA

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Today's weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "for example Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
# transformers passes the tools to a template; minfer's render does not, so these set them in the template.
WITH_TOOLS = "{% set tools = " + json.dumps(TOOLS, ensure_ascii=False) + " %}"
REAL_TEMPLATES = {
    "Llama 3.2": LLAMA_3_2,
    "Llama 3.2 with tools": WITH_TOOLS + LLAMA_3_2,
    "Qwen 2.5": QWEN_2_5,
    "Qwen 2.5 with tools": WITH_TOOLS + QWEN_2_5,
    "Mistral v0.3": MISTRAL_V0_3,
    "Mistral v0.3 with tools": WITH_TOOLS + MISTRAL_V0_3,
    "Gemma 3": GEMMA_3,
}
# Gemma refuses two assistant turns in a row, as transformers does; everything else renders.
REFUSED = {("Gemma 3", "tool call")}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_real_templates_render_as_transformers_does(fixed_clock, name, conversation, add_generation_prompt):
    source, messages = REAL_TEMPLATES[name], CONVERSATIONS[conversation]
    template = ChatTemplate(source, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    rendered = minfer_render(template, messages, add_generation_prompt)
    assert rendered == reference_render(source, messages, add_generation_prompt)
    assert rendered.startswith("refused: ") == ((name, conversation) in REFUSED)


def test_real_templates_use_what_they_are_known_for(fixed_clock):
    """The renders compared above go through each template's distinctive logic."""
    tools = CONVERSATIONS["tool call"]
    llama = ChatTemplate(LLAMA_3_2, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(tools)
    assert "Today Date: 14 Mar 2025\n" in llama  # strftime_now
    assert '{"name": "get_weather", "parameters": {"city": "Zürich", "unit": "celsius", "days": [1, 2]}}' in llama
    qwen = ChatTemplate(QWEN_2_5, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(tools)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"' in qwen  # tojson
    mistral = ChatTemplate(MISTRAL_V0_3, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(tools)
    assert (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius", "days": [1, 2]}, '
        '"id": "call12345"}]</s>' in mistral
    )
    assert mistral.endswith("[INST] You answer with tools.\n\nThanks <3 & bye[/INST]")  # namespace, selectattr
    with_tools = ChatTemplate(WITH_TOOLS + LLAMA_3_2, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(tools)
    assert 'Do not use variables.\n\n{\n    "type": "function",\n    "function": {\n' in with_tools  # tojson(indent=4)
    with_tools = ChatTemplate(WITH_TOOLS + QWEN_2_5, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(tools)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather", "description"' in with_tools
    with_tools = ChatTemplate(WITH_TOOLS + MISTRAL_V0_3, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(tools)
    assert '[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather", "description": "Today' in (
        with_tools
    )
    gemma = ChatTemplate(GEMMA_3, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(CONVERSATIONS["probe"])
    assert gemma.startswith("<s><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n")
    with pytest.raises(TemplateError, match=r"model\.gguf: chat template failed to render: Conversation roles must"):
        ChatTemplate(GEMMA_3, bos_token=BOS, eos_token=EOS, origin=ORIGIN).render(tools)


def test_gemma_2_refuses_the_probes_system_prompt_as_transformers_does():
    expected = reference_render(GEMMA_2, PROBE_CONVERSATION, True)
    assert expected == "refused: System role not supported"
    with pytest.raises(TemplateError) as refused:
        ChatTemplate(GEMMA_2, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    assert str(refused.value) == f"{ORIGIN}: chat template failed to render: System role not supported"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_default_model_template_renders_as_transformers_does(default_model_gguf, conversation):
    source = default_model_gguf.metadata["tokenizer.chat_template"]
    template = ChatTemplate(source, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    for add_generation_prompt in (True, False):
        messages = CONVERSATIONS[conversation]
        assert minfer_render(template, messages, add_generation_prompt) == reference_render(
            source, messages, add_generation_prompt
        )


# -- hostile templates: a one-line TemplateError, quickly, within bounded memory ------------------------------------

TIME = rf"chat template exceeded its {RENDER_SECONDS:g} s render budget"
MEMORY = rf"chat template would exceed its {MAX_RENDER_BYTES // 1_000_000} MB memory budget"
PROMPT = rf"chat template would print more than {MAX_PROMPT_CHARS:,} characters \(its prompt budget\)"
DIGITS = rf"chat template would build a number of more than {MAX_INT_DIGITS} digits"
DEPTH = rf"chat template would build a value nested more than {MAX_VALUE_DEPTH} levels deep"
RECURSION = r"chat template failed to render: RecursionError: maximum recursion depth exceeded"
UNSAFE = r"chat template failed to render: access to attribute '\w+' of '\w+' object is unsafe"


def assert_refused(message: str, expected: str) -> None:
    assert "\n" not in message
    assert re.match(rf"{re.escape(ORIGIN)}: {expected}", message), message


# Templates that would run for hours: stopped by the time budget, or by Python's recursion limit.
ENDLESS = {
    "nested loops with an empty body": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        TIME,
    ),
    "nested loops over a list, no call in them": (
        "{% set xs = range(100000)|list %}{% for a in xs %}{% for b in xs %}{% endfor %}{% endfor %}",
        TIME,
    ),
    "nested loops testing": (
        "{% for i in range(100000) %}{% for j in range(100000) if j is odd %}{% endfor %}{% endfor %}",
        TIME,
    ),
    "nested loops in a block set": (
        "{% set s %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endset %}",
        TIME,
    ),
    "a macro calling itself twice": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        TIME,
    ),
    "a macro calling itself": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", RECURSION),
    "a recursive loop without end": ("{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}", RECURSION),
    "nested loops printing": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0].content * 100 }}"
        "{% endfor %}{% endfor %}",
        PROMPT,
    ),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ENDLESS)
def test_endless_templates_are_stopped(name):
    source, expected = ENDLESS[name]
    with pytest.raises(TemplateError) as refused:
        ChatTemplate(source, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    assert_refused(str(refused.value), expected)


# Templates that would build gigabytes. They run in a child process whose address space is limited: should one get
# past its budget it dies with MemoryError there instead of taking the machine.
MEMORY_LIMIT = 1 << 30
LOAD_UNDER_MEMORY_LIMIT = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT}))
from minfer.chat_template import ChatTemplate
from minfer.errors import TemplateError
try:
    ChatTemplate(sys.stdin.read(), bos_token="<s>", eos_token="</s>", origin="{ORIGIN}")
except TemplateError as exc:
    print(exc)
else:
    print("loaded")
"""

EXPLOSIVE = {
    "a text times 10**10": ("{{ 'x' * 10**10 }}", MEMORY),
    "a text times a constant": ("{{ 'x' * 10000000000 }}", MEMORY),  # jinja2's compiler would fold it
    "a list times 10**10": ("{{ [0] * 10**10 }}", MEMORY),
    "a power of a power": ("{{ 10 ** (10 ** 10) }}", DIGITS),
    "a constant power": ("{{ 10 ** 10000000000 }}", DIGITS),
    "a product of long numbers": ("{{ (7 ** 4000) * (7 ** 4000) }}", DIGITS),
    "a namespace text doubled": (
        "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        MEMORY,
    ),
    "a namespace text doubled with +": (
        "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        MEMORY,
    ),
    "a list holding itself twice, printed": (
        "{% set ns = namespace(l=[0]) %}{% for i in range(100) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
        MEMORY,
    ),
    "tuples nested a million deep": (
        "{% set ns = namespace(t=()) %}{% for i in range(1000) %}{% for j in range(1000) %}"
        "{% set ns.t = (ns.t,) %}{% endfor %}{% endfor %}{{ {ns.t: 1} }}",
        DEPTH,
    ),
    "a recursive macro holding a copy per call": (
        "{% macro f(s, n) %}{% set t = s[1:] %}{% if n < 900 %}{{ f(t, n + 1) }}{% endif %}{% endmacro %}"
        "{{ f('x' * 10000000, 0) }}",
        MEMORY,
    ),
    "printing a big text in a loop": ("{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}", PROMPT),
    "tojson with a huge indent": ("{{ messages|tojson(indent=10**9) }}", MEMORY),
    "tojson with a huge indent text": ("{{ messages|tojson(indent='x' * 10000000) }}", MEMORY),
    "pprint of a wide list": ("{{ ([range(1000)|list] * 10000)|pprint }}", MEMORY),
    "the center filter": ("{{ 'x'|center(10**9) }}", MEMORY),
    "str.center": ("{{ 'x'.center(10**9) }}", MEMORY),
    "str.ljust": ("{{ 'x'.ljust(10**9, '*') }}", MEMORY),
    "str.rjust": ("{{ 'x'.rjust(10**9) }}", MEMORY),
    "str.zfill": ("{{ '1'.zfill(10**9) }}", MEMORY),
    "the indent filter": ("{{ 'a\nb'|indent(10**9) }}", MEMORY),
    "the indent filter with a text": ("{{ ('a\n' * 1000)|indent('x' * 1000000) }}", MEMORY),
    "str.format with a huge width": ("{{ '{:>1000000000}'.format(1) }}", MEMORY),
    "str.format with a huge precision": ("{{ '{:.1000000000f}'.format(1.0) }}", MEMORY),
    "str.format with a width argument": ("{{ '{:>{}}'.format(1, 10**9) }}", MEMORY),
    "str.format repeating a field": ("{{ ('{0}' * 100000).format('x' * 1000) }}", MEMORY),
    "str.format_map": ("{{ '{a:>1000000000}'.format_map({'a': 1}) }}", MEMORY),
    "% with a huge width": ("{{ '%1000000000d' % 1 }}", MEMORY),
    "% with a star width": ("{{ '%*d' % (10**9, 1) }}", MEMORY),
    "the format filter": ("{{ '%1000000000s'|format('x') }}", MEMORY),
    "str.expandtabs": ("{{ ('\t' * 1000).expandtabs(10**9) }}", MEMORY),
    "the slice filter": ("{{ messages|slice(10**9)|list }}", MEMORY),
    "the batch filter": ("{{ messages|batch(10**9, 'fill')|list }}", MEMORY),
    "the wordwrap filter": ("{{ ('x ' * 100000)|wordwrap(1, wrapstring='y' * 10000) }}", MEMORY),
    "the replace filter": ("{{ ('x' * 100000)|replace('x', 'y' * 100000) }}", MEMORY),
    "str.replace of the empty text": ("{{ ('x' * 100000).replace('', 'y' * 100000) }}", MEMORY),
    "str.translate": ("{{ ('a' * 100000).translate({97: 'x' * 100000}) }}", MEMORY),
    "the join filter with a huge separator": ("{{ range(10000)|join('x' * 1000000) }}", MEMORY),
    "str.join of a generator": ("{{ ('x' * 1000000).join(range(10000)|map('string')) }}", MEMORY),
    "the sum of lists": ("{{ ([range(1000)|list] * 1000)|sum(start=[]) }}", MEMORY),
    "a dict of one big value": ("{{ {}.fromkeys(range(100000), 'x' * 1000000) }}", MEMORY),
    "a text listed by character": ("{{ ('字' * 20000000)|list|length }}", MEMORY),
    "a text split into pieces": ("{{ ('字 ' * 10000000).split()|length }}", MEMORY),
    "the escape filter": ("{{ ('&' * 20000000)|e }}", MEMORY),
    "the urlize filter": ("{{ ('a.b ' * 100000)|urlize(target='x' * 10000) }}", MEMORY),
    "int.to_bytes": ("{{ (1).to_bytes(10**10, 'big') }}", MEMORY),
    "lipsum": ("{{ lipsum(10**7) }}", MEMORY),
    "strftime_now": ("{{ strftime_now('%c' * 10**7) }}", MEMORY),
    "~ of big texts": ("{% set x = 'x' * 30000000 %}{{ x ~ x ~ x }}", MEMORY),
}


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS limits a process's memory on Linux only")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", EXPLOSIVE)
def test_explosive_templates_are_refused_before_they_allocate(name):
    source, expected = EXPLOSIVE[name]
    child = subprocess.run(
        [sys.executable, "-c", LOAD_UNDER_MEMORY_LIMIT],
        input=source,
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},  # no thread stacks to reserve
    )
    assert child.returncode == 0, child.stderr
    assert_refused(child.stdout.strip(), expected)


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("{{ 10.0 ** 400 }}", r"OverflowError: \(34, 'Numerical result out of range'\)"),
        ("{{ range(10 ** 100) }}", "OverflowError: Python int too large to convert to C ssize_t"),
        ("{{ 1 // 0 }}", "ZeroDivisionError: integer division or modulo by zero"),
    ],
)
def test_arithmetic_errors_are_template_errors(source, error):
    with pytest.raises(TemplateError) as refused:
        ChatTemplate(source, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    assert_refused(str(refused.value), f"chat template failed to render: {error}$")


def test_a_template_can_explode_at_render_time_too():
    """Loading renders only the probe: a template that explodes on a longer conversation is refused then."""
    template = ChatTemplate(
        "{% if messages|length > 4 %}{{ 'x' * 10**10 }}{% endif %}ok", bos_token=BOS, eos_token=EOS, origin=ORIGIN
    )
    assert template.render(PROBE_CONVERSATION) == "ok"
    with pytest.raises(TemplateError) as refused:
        template.render([*PROBE_CONVERSATION, {"role": "assistant", "content": "4"}])
    assert_refused(str(refused.value), MEMORY)


UNCOMPILABLE = {
    "parentheses nested 500 deep": "{{ " + "(" * 500 + "1" + ")" * 500 + " }}",
    "an addition 3000 terms long": "{{ " + "1 + " * 3000 + "1 }}",
    "ifs nested 120 deep": "{% if true %}" * 120 + "x" + "{% endif %}" * 120,
    "ifs nested 400 deep": "{% if true %}" * 400 + "x" + "{% endif %}" * 400,
    "loops nested 40 deep": "{% for a in [1] %}" * 40 + "x" + "{% endfor %}" * 40,
    "a loop never closed": "{% for message in messages %}{{ message['content'] }}",
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", UNCOMPILABLE)
def test_templates_the_compiler_cannot_take_are_refused_at_load(name):
    with pytest.raises(TemplateError) as refused:
        ChatTemplate(UNCOMPILABLE[name], bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    assert_refused(str(refused.value), "tokenizer.chat_template does not compile: ")


def test_a_template_longer_than_the_compile_budget_is_refused():
    with pytest.raises(TemplateError) as refused:
        ChatTemplate("x" * (MAX_TEMPLATE_CHARS + 1), bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    assert_refused(
        str(refused.value),
        rf"tokenizer\.chat_template is {MAX_TEMPLATE_CHARS + 1:,} characters long, "
        rf"more than the {MAX_TEMPLATE_CHARS:,} a template may have$",
    )


ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__.os }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ lipsum.__globals__ }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ strftime_now.__globals__ }}",
    "{{ range.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ self.__dict__ }}",
    "{{ dict.mro() }}",
    "{{ ''|attr('__class__') }}",
    "{{ '{0.__class__}'.format(messages) }}",
    "{{ '{m.__class__}'.format_map({'m': messages}) }}",
    "{{ messages.append(1) }}",
    "{% set _ = messages[0].update({'role': 'x'}) %}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_the_sandbox_refuses_escapes(source):
    with pytest.raises(TemplateError) as refused:
        ChatTemplate(source, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    assert_refused(str(refused.value), UNSAFE)


def test_a_templates_error_message_is_one_short_line():
    source = "{{ raise_exception('first line\\nsecond\\x1b[31m line ' * 100) }}"
    with pytest.raises(TemplateError) as refused:
        ChatTemplate(source, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    message = str(refused.value)
    assert message.startswith(f"{ORIGIN}: chat template failed to render: first line second [31m line first line")
    assert message.isprintable() and len(message) < 400 and message.endswith("…")


# Every construct that the budgets route through the environment, rendered as plain jinja2 renders it.
CONSTRUCTS = [
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }}/{{ loop.revindex }}"
    "{% if loop.last %}!{% endif %}{% else %}none{% endfor %}",
    "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }};{% endfor %}"
    "{% for x in [] %}{% else %}empty{% endfor %}",
    "{% for c in [1, [2, [3]]] recursive %}[{{ c }}{% if c is iterable %}{{ loop(c) }}{% endif %}]{% endfor %}",
    "{% for ch in messages[1].content %}{{ ch }}.{% endfor %}{% set a, b = 1, 2 %}{{ a + b }}",
    "{{ 'x' ~ 1 ~ none ~ [1] ~ messages[0].role }}{{ ('a', 'b')[1] }}{{ {'a': [1, 2, 3]}['a'][1:] }}",
    "{{ messages[::-1]|map(attribute='role')|join(',') }}{{ messages[-1:]|length }}{{ 'abc'[::-1] }}",
    "{{ 'hello'|list|sort|join }}{{ 'hello'|batch(2)|list }}{{ 'hello'|slice(2)|list }}{{ 'hello'|unique|list }}",
    "{{ messages|groupby('role')|map(attribute='grouper')|list }}{{ range(5)|sum }}{{ [[1], [2]]|sum(start=[]) }}",
    "{{ '%s-%d' % ('a', 3) }}{{ '%5.2f|%-4s|%%' % (3.14159, 'x') }}{{ '%(n)s' % {'n': 1} }}",
    "{{ '{:>8}|{:.3f}|{!r}|{a}'.format('a', 2.5, 'q', a=1) }}{{ '{x}'.format_map({'x': 2}) }}",
    "{{ 'ab'.center(6, '*') }}{{ 'a\tb'.expandtabs(4) }}{{ 'a-b'.replace('-', '+') }}{{ ', '.join(['a', 'b']) }}",
    "{{ 'a b\nc'.split() }}{{ 'a\nb'.splitlines() }}{{ 'a,b'.rsplit(',', 1) }}{{ 'ab'.translate({97: 'x'}) }}",
    "{{ messages[0].content|center(40) }}{{ 'a\nb'|indent(2, first=true) }}{{ 'a b c'|wordwrap(3) }}",
    "{{ 'a&b'|replace('&', ' and ') }}{{ '%s!'|format('hi') }}{{ [3, 1]|sort|join(' ') }}{{ 'x'|e }}",
    "{{ messages|tojson }}{{ messages[0]|tojson(indent=2) }}{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
    "{{ messages[0]|pprint }}{{ 'AbC'|lower }}{{ 'x'|upper }}{{ ' t '|trim }}{{ 'a b'|title }}{{ 'ab'|truncate(9) }}",
    "{{ 7 // 2 }}{{ 7 % 3 }}{{ 2 ** 10 }}{{ 7 / 2 }}{{ 'ab' * 3 }}{{ [0] * 3 }}{{ -(3) }}{{ 1 - 2 * 3 }}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}",
    "{% macro hello(name, greeting='hi') %}{{ greeting }} {{ name }}{{ caller() if caller }}{% endmacro %}"
    "{{ hello('you') }}{% call hello('me') %}!{% endcall %}",
    "{% set block %}{% for m in messages %}{{ m.role }} {% endfor %}{% endset %}{{ block|trim }}"
    "{% filter upper %}{{ messages[0].content }}{% endfilter %}",
    "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}"
    "{{ messages|rejectattr('role', 'in', ['system'])|list|length }}{{ range(10)|select('odd')|list }}",
    "{{ messages|first }}{{ messages|last }}{{ messages|length }}{{ messages|map(attribute='role')|unique|list }}",
    "{{ dict(a=1) }}{{ namespace(a=1).a }}{{ range(3)|list }}{{ joiner(', ')() }}{{ cycler(1, 2).next() }}",
    "{{ undefined_name }}{{ messages[0].missing }}{{ undefined_name is defined }}{{ messages is sequence }}",
]


@pytest.mark.parametrize("source", CONSTRUCTS)
def test_the_constructs_the_budgets_reroute_render_as_jinja2_renders_them(source):
    template = ChatTemplate(source, bos_token=BOS, eos_token=EOS, origin=ORIGIN)
    assert template.render(PROBE_CONVERSATION) == reference_render(source, PROBE_CONVERSATION, True)
