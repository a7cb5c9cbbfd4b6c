"""The `minfer-chat` command line: its flags (the same as `minfer run`'s) and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minfer import SamplingParams
from minfer_chat.app import ChatOptions
from minfer_chat.cli import build_parser, options_from

pytestmark = pytest.mark.timeout(120)


def minfer_chat(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `minfer-chat ARGS` (as `python -m minfer_chat`, which needs no install) without a terminal."""
    return subprocess.run(
        [sys.executable, "-m", "minfer_chat", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_flags_become_the_apps_options():
    args = build_parser().parse_args(
        ["model.gguf", "--backend", "cpu", "-c", "1024", "--system", "Be brief.", "-n", "64",
         "--temp", "0.5", "--top-k", "10", "--top-p", "0.8", "--min-p", "0.1", "--repeat-penalty", "1.1",
         "--repeat-last-n", "32", "--seed", "7"]
    )  # fmt: skip
    assert options_from(args) == ChatOptions(
        model="model.gguf",
        backend="cpu",
        ctx_size=1024,
        system="Be brief.",
        sampling=SamplingParams(
            temperature=0.5, top_k=10, top_p=0.8, min_p=0.1, repeat_penalty=1.1, repeat_last_n=32, seed=7
        ),
        max_tokens=64,
    )


def test_defaults_are_the_default_model_and_sampling():
    assert options_from(build_parser().parse_args([])) == ChatOptions(model=None, max_tokens=512)


def test_help_lists_the_flags():
    result = minfer_chat("--help")
    assert result.returncode == 0
    for flag in ("--system", "--max-tokens", "--backend", "--ctx-size", "--temp", "--top-p", "--seed"):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--temp", "hot"], 2, "minfer-chat: error: argument --temp: not a number: 'hot' (see minfer-chat --help)"),
        (["--top-p", "3"], 1, "minfer-chat: error: invalid sampling parameter top_p=3.0"),
        (["--backend", "tpu"], 2, "minfer-chat: error: argument --backend: invalid choice: 'tpu'"),
    ],
)
def test_bad_flags_are_one_line_errors(args, status, message):
    result = minfer_chat(*args)
    assert result.returncode == status
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_missing_model_is_a_one_line_error(tmp_path):
    missing = tmp_path / "missing.gguf"
    result = minfer_chat(str(missing))
    assert result.returncode == 1
    # The app had started (it loads the model itself, showing progress); the error follows its exit.
    assert result.stderr.endswith(f"minfer-chat: error: {missing}: no such file\n")
    assert "Traceback" not in result.stderr
