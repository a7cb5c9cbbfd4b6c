"""`--chat-template` on the `minfer` command line, and the template `minfer info` names: run as a user runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_chat_template_builtins import VOCAB_SIZE, rewrite_vocabulary
from test_cli import PROMPT, assert_one_line_error, info_rows, minfer_cli

from minfer.engine import Engine
from minfer.testing.synthetic import scaled, write_synthetic_model

# A template no model file carries: what a prompt looks like through it shows that it was the one used.
BRACKETS = "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}[assistant] "


@pytest.fixture(scope="module")
def template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("templates") / "brackets.jinja"
    path.write_text(BRACKETS)
    return path


@pytest.fixture(scope="module")
def gemma_marked_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama whose vocabulary has Gemma's turn markers as control tokens, and no chat template."""
    folder = tmp_path_factory.mktemp("marked")
    base = write_synthetic_model(folder / "base.gguf", scaled("tiny-llama", vocab_size=VOCAB_SIZE))
    return rewrite_vocabulary(base, folder / "gemma-marked.gguf", add=("<start_of_turn>", "<end_of_turn>"))


def test_info_names_the_builtin_a_file_without_a_template_gets(gemma_marked_model):
    result = minfer_cli("info", gemma_marked_model)
    assert result.returncode == 0, result.stderr
    assert info_rows(result.stdout)["chat template"] == (
        "built-in gemma (the file has none; chosen by the vocabulary's <start_of_turn>)"
    )


def test_info_names_the_template_given(gemma_marked_model, template_file):
    rows = info_rows(minfer_cli("info", gemma_marked_model, "--chat-template", template_file).stdout)
    assert rows["chat template"] == f"{template_file} (--chat-template)"
    rows = info_rows(minfer_cli("info", gemma_marked_model, "--chat-template", "chatml").stdout)
    assert rows["chat template"] == "built-in chatml (--chat-template)"


def test_run_renders_the_prompt_with_the_template_given(synthetic_model, template_file):
    model = synthetic_model("tiny-llama")
    result = minfer_cli("run", model, PROMPT, "--chat-template", template_file, "--temp", "0", "-n", "6")
    assert result.returncode == 0, result.stderr
    with Engine(model, backend="cpu", chat_template=template_file) as engine:
        assert engine.template.render([{"role": "user", "content": PROMPT}]) == f"[user] {PROMPT}\n[assistant] "
        assert int(result.stats()["prompt"]) == len(engine.encode_prompt(PROMPT))
        assert result.text == "".join(engine.generate(PROMPT, max_tokens=6, temperature=0))
    default = minfer_cli("run", model, PROMPT, "--temp", "0", "-n", "1")
    assert default.stats()["prompt"] != result.stats()["prompt"]  # the file's own ChatML is longer


@pytest.mark.parametrize("command", [["run", "{model}", "hi"], ["info", "{model}"], ["serve", "{model}"]])
@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ("gemma3", ["--chat-template", "'gemma3' is neither an existing file nor a built-in template",
                    "(built-ins: chatml, gemma, llama3, phi3)"]),
        ("{broken}", ["{broken}: chat template does not compile"]),
        ("phi3", ["the built-in phi3 template writes <|system|>, <|user|>, <|assistant|>, <|end|>"]),
    ],
)  # fmt: skip
def test_a_chat_template_that_cannot_be_used_is_one_line(synthetic_model, tmp_path, command, value, fragments):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}{{ message['content'] }")
    names = {"model": str(synthetic_model("tiny-llama")), "broken": str(broken)}
    args = [arg.format(**names) for arg in command]
    assert_one_line_error(
        minfer_cli(*args, "--chat-template", value.format(**names)), *(f.format(**names) for f in fragments)
    )


@pytest.mark.parametrize("command", ["run", "info", "serve"])
def test_help_names_the_flag_and_the_builtins(command):
    text = minfer_cli(command, "--help").stdout
    assert "--chat-template FILE" in text
    assert "chatml, gemma, llama3, phi3" in " ".join(text.split())
