"""The `minfer-chat` command line: its flags (the same as `minfer run`'s), its one-line errors, SIGINT."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

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
        ["model.gguf", "--backend", "cpu", "-c", "1024", "-t", "3", "-ctk", "f16", "--system", "Be brief.", "-n", "64",
         "--temp", "0.5", "--top-k", "10", "--top-p", "0.8", "--min-p", "0.1", "--repeat-penalty", "1.1",
         "--repeat-last-n", "32", "--seed", "7", "--chat-template", "gemma"]
    )  # fmt: skip
    assert options_from(args) == ChatOptions(
        model="model.gguf",
        backend="cpu",
        ctx_size=1024,
        threads=3,
        cache_type="f16",
        chat_template="gemma",
        system="Be brief.",
        sampling=SamplingParams(
            temperature=0.5, top_k=10, top_p=0.8, min_p=0.1, repeat_penalty=1.1, repeat_last_n=32, seed=7
        ),
        max_tokens=64,
    )


def test_defaults_are_the_default_model_and_sampling():
    assert options_from(build_parser().parse_args([])) == ChatOptions(model=None, max_tokens=512)


def test_the_app_imports_minfers_public_api_not_the_minfer_command():
    """Its flags come from `minfer.options`, which `minfer` parses with too: loading the app loads no minfer.cli."""
    code = "import sys, minfer_chat.cli; print('minfer.cli' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout == "False\n"


def test_help_lists_the_flags():
    result = minfer_chat("--help")
    assert result.returncode == 0
    flags = ("--system", "--max-tokens", "--backend", "--ctx-size", "--cache-type-k", "--cache-type-v",
             "--chat-template", "--temp", "--top-p", "--seed")  # fmt: skip
    for flag in flags:
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--temp", "hot"], 2, "minfer-chat: error: argument --temp: not a number: 'hot' (see minfer-chat --help)"),
        (["--top-p", "3"], 1, "minfer-chat: error: invalid sampling parameter top_p=3.0"),
        (["--backend", "tpu"], 2, "minfer-chat: error: argument --backend: invalid choice: 'tpu'"),
        (["-t", "0"], 2, "minfer-chat: error: argument -t/--threads: "),
        (
            ["-ctv", "f16", "--cache-type-k", "f32"],
            2,
            "minfer-chat: error: argument -ctk/--cache-type-k f32 and -ctv/--cache-type-v f16: minfer's K and V caches "
            "share one type (give one of the flags, or both the same type) (see minfer-chat --help)",
        ),
        (["-ctk", "q5_1"], 2, "minfer-chat: error: argument -ctk/--cache-type-k: KV cache type 'q5_1' is llama.cpp's"),
        (
            ["--chat-template", "nope"],
            2,
            "minfer-chat: error: argument --chat-template: chat template 'nope' is "
            "neither an existing file nor a built-in template (built-ins: chatml, gemma, llama3, phi3)",
        ),
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


class Terminal:
    """A pseudo-terminal for running minfer-chat as a user's shell would, reading everything it writes."""

    def __init__(self) -> None:
        import pty
        import termios

        self.master, self.tty = pty.openpty()
        self.settings = termios.tcgetattr(self.tty)  # what the app must give back
        self.output = b""

    def read_until(self, wanted: bytes, process: subprocess.Popen[bytes], *, timeout: float = 30) -> None:
        """Read the app's output (a full pseudo-terminal would stall it) until `wanted` appears."""
        deadline = time.monotonic() + timeout
        while wanted not in self.output:
            assert process.poll() is None, f"minfer-chat ended first: {self.output[-500:]!r}"
            assert time.monotonic() < deadline, f"no {wanted!r} in {self.output[-500:]!r}"
            if select.select([self.master], [], [], 0.1)[0]:
                self.output += os.read(self.master, 65536)

    def read_until_exit(self, process: subprocess.Popen[bytes], *, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while process.poll() is None:
            assert time.monotonic() < deadline, f"minfer-chat is still running: {self.output[-500:]!r}"
            if select.select([self.master], [], [], 0.1)[0]:
                self.output += os.read(self.master, 65536)
        return process.returncode

    def close(self) -> None:
        os.close(self.master)
        os.close(self.tty)


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals and SIGINT from another process are POSIX's")
def test_sigint_from_outside_exits_130_and_gives_the_terminal_back(tiny_model):
    import termios

    terminal = Terminal()
    process = subprocess.Popen(
        [sys.executable, "-m", "minfer_chat", str(tiny_model), "--backend", "cpu", "-t", "1", "-n", "16"],
        stdin=terminal.tty,
        stdout=terminal.tty,
        stderr=terminal.tty,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"},
        start_new_session=True,  # its own session: the pseudo-terminal is its controlling terminal, not ours
    )
    try:
        terminal.read_until(b"Type a message", process)  # the model has loaded and the app waits for input
        assert termios.tcgetattr(terminal.tty) != terminal.settings  # the app has the terminal in raw mode
        process.send_signal(signal.SIGINT)
        assert terminal.read_until_exit(process) == 130
        assert termios.tcgetattr(terminal.tty) == terminal.settings  # echo and line editing are back
        after = terminal.output.rsplit(b"Type a message", 1)[1]
        assert b"\x1b[?1049l" in after  # it left the alternate screen
        assert b"Traceback" not in terminal.output and b"KeyboardInterrupt" not in terminal.output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        terminal.close()


def test_version_names_every_package():
    result = minfer_chat("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("minfer-chat: minfer-runtime 0.1.0, minfer-kernels ")
    assert "minfer-chat " in result.stdout
