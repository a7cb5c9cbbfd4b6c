"""The chat templates minfer knows by name: for a GGUF that carries none, and for `--chat-template NAME`.

Each is a model family's own Jinja template, as its authors publish it in the model's `tokenizer_config.json`,
rendered like a file's template (`minfer.chat_template`). The names are llama.cpp's (its
`llama_chat_builtin_templates`); which one a file without a template gets is `chat_template.choose_builtin`'s rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    source: str
    # The control tokens the template writes (BOS and EOS aside, which come from the vocabulary itself): a model
    # whose vocabulary lacks one would read its text as plain words.
    special_tokens: tuple[str, ...]


# teknium/OpenHermes-2.5-Mistral-7B, as llama.cpp's tests/test-chat-template.cpp quotes it: the ChatML of Qwen and
# SmolLM, and llama.cpp's fallback for a file without a template.
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# google/gemma-3-4b-it (transformers' models/gemma3/convert_gemma3_weights.py writes the same): BOS first, the system
# message folded into the first user turn, `model` for the assistant, strict alternation. Its newlines are real
# ones, inside the quotes too.
GEMMA = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

# meta-llama/Meta-Llama-3-8B-Instruct's tokenizer_config.json (newlines real, as its JSON's "\n" decode). llama.cpp's
# test quotes the first release, which wrote the assistant header even without add_generation_prompt; this is the
# published fix, which writes it only when asked.
LLAMA_3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# microsoft/Phi-3.5-mini-instruct, as llama.cpp's models/templates/microsoft-Phi-3.5-mini-instruct.jinja keeps it:
# the Phi-3 template that keeps the system prompt (Phi-3-mini's first one dropped system messages without a word).
PHI_3 = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

BUILTIN_TEMPLATES = {
    template.name: template
    for template in (
        BuiltinTemplate("chatml", CHATML, ("<|im_start|>", "<|im_end|>")),
        BuiltinTemplate("gemma", GEMMA, ("<start_of_turn>", "<end_of_turn>")),
        BuiltinTemplate("llama3", LLAMA_3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
        BuiltinTemplate("phi3", PHI_3, ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")),
    )
}
