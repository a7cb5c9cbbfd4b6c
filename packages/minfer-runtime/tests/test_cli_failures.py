"""The `minfer` command where its surroundings fail or a flag is at its edge: `--seed -1`, a full disk on
stdout, a closed or unreadable stdin. Each is one line and an exit status, never a traceback."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import PROMPT, TIMEOUT, Result, assert_one_line_error, call_main, cli_env, minfer_cli

from minfer import cli


@pytest.fixture(scope="module")
def tiny_model(synthetic_model) -> Path:
    return synthetic_model("tiny-llama")


def run_cli(*args: str | Path, **popen: object) -> Result:
    """`python -m minfer.cli ARGS` with the standard streams given as subprocess.run arguments."""
    popen.setdefault("stdin", subprocess.DEVNULL)
    popen.setdefault("stdout", subprocess.PIPE)
    completed = subprocess.run(
        [sys.executable, "-m", "minfer.cli", *map(str, args)],
        stderr=subprocess.PIPE,
        env=cli_env(),
        timeout=TIMEOUT,
        **popen,
    )
    stdout = completed.stdout.decode("utf-8", "replace") if completed.stdout is not None else ""
    return Result(completed.returncode, stdout, completed.stderr.decode("utf-8", "replace"))


# -- --seed -----------------------------------------------------------------------------------------------


def test_seed_minus_one_means_a_random_seed(tiny_model):
    assert cli.build_parser().parse_args(["run", "--seed", "-1"]).seed is None  # as SamplingParams(seed=None)
    flags = ["--temp", "1.0", "--seed", "-1", "-n", "16", "--backend", "cpu"]  # the model's head size 16: no CUDA
    runs = [minfer_cli("run", tiny_model, PROMPT, *flags) for _ in range(2)]
    for result in runs:
        assert result.returncode == 0, result.stderr
    assert runs[0].text != runs[1].text  # 16 tokens drawn at temperature 1 over 512: never the same twice


@pytest.mark.parametrize("seed", ["-2", "-12345"])
def test_other_negative_seeds_are_refused_before_the_model_loads(tmp_path, seed):
    # The model does not even exist: the flag is refused first, by name.
    result = minfer_cli("run", tmp_path / "not-there.gguf", "hi", "--seed", seed)
    assert result.returncode == cli.EXIT_USAGE
    line = assert_one_line_error(result, "argument --seed", f"'{seed}'", "-1 (a random seed)")
    assert "not-there" not in line


# -- stdout that cannot be written ----------------------------------------------------------------------

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


@needs_dev_full
@pytest.mark.parametrize(
    "command", [["run", "--temp", "0", "-n", "4", "--backend", "cpu"], ["info"]], ids=["run", "info"]
)
def test_a_full_disk_on_stdout_is_one_line(tiny_model, command):
    name, *flags = command
    args = [name, tiny_model, PROMPT, *flags] if name == "run" else [name, tiny_model]
    with open("/dev/full", "w") as full:
        result = run_cli(*args, stdout=full)
    assert result.returncode == cli.EXIT_ERROR
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["minfer: error: cannot write the output: No space left on device"], result.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="closes a file descriptor in the child (POSIX)")
def test_a_closed_stdout_is_one_line(tiny_model):
    result = run_cli(
        "run", tiny_model, PROMPT, "-n", "2", "--backend", "cpu", stdout=None, preexec_fn=lambda: os.close(1)
    )
    assert result.returncode == cli.EXIT_ERROR
    assert_one_line_error(result, "cannot write the output: standard output is closed")


# -- stdin that cannot be read --------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="closes a file descriptor in the child (POSIX)")
def test_a_closed_stdin_without_a_prompt_is_one_line(tiny_model):
    result = run_cli("run", tiny_model, stdin=None, preexec_fn=lambda: os.close(0))
    assert result.returncode == cli.EXIT_ERROR
    assert_one_line_error(result, "no PROMPT given and stdin is closed")


class FailingStdin(io.StringIO):
    """A stdin whose read fails like a terminal that went away."""

    def read(self, *args: object) -> str:
        raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_a_failing_read_of_stdin_is_one_line(tiny_model, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", FailingStdin())
    code = call_main(["run", str(tiny_model)])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_ERROR
    assert_one_line_error(Result(code, out, err), "cannot read the prompt from stdin: Input/output error")
