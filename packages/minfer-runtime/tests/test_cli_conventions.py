"""The `minfer` command as people expect a CLI to behave: bare help, --version, defaults in --help, DOT on
stdout, list/rm, thread counts, and a reply budget checked before the weights load."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_cli import assert_one_line_error, cli_env, minfer_cli

import minfer
import minfer.engine
from minfer.errors import ContextOverflowError


def test_bare_minfer_prints_its_help():
    result = minfer_cli()
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: minfer")
    for command in ("run", "bench", "info", "pull", "list", "rm", "graph"):
        assert f"\n    {command} " in result.stdout


def test_version_names_every_package():
    result = minfer_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("minfer: minfer-runtime 0.1.0, minfer-kernels ")
    assert "minfer-chat " in result.stdout


def test_help_shows_the_defaults():
    text = minfer_cli("run", "--help").stdout
    assert "most tokens to generate (default: 256)" in text
    assert "temperature; 0 = greedy (default: 0.8)" in text
    assert "recent tokens the penalty looks at (default: 64)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_graph_writes_dot_to_stdout_without_a_file(synthetic_model):
    result = minfer_cli("graph", synthetic_model(), "--tokens", "1")
    assert result.returncode == 0
    assert result.stdout.startswith("digraph minfer_1_tokens {") and result.stdout.endswith("}\n")
    assert "nodes," in result.stderr and "scratch buffers" in result.stderr


def test_list_shows_where_each_known_model_is(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "minfer.cli", "list"], capture_output=True, text=True,
        env=cli_env(MINFER_HOME=str(tmp_path)), timeout=60,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    header, *rows = completed.stdout.splitlines()
    assert header.split() == ["NAME", "SOURCE", "SIZE", "VERIFIED", "PATH"]
    assert any(row.startswith("smollm2 ") for row in rows) or "smollm2: not installed" in completed.stdout


def test_rm_of_a_model_that_is_not_in_the_cache_is_one_line(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "minfer.cli", "rm", "smollm2"], capture_output=True, text=True,
        env=cli_env(MINFER_HOME=str(tmp_path)), timeout=60,
    )  # fmt: skip
    assert completed.returncode == 1 and completed.stdout == ""
    assert completed.stderr.startswith("minfer: error: model 'smollm2' is not in minfer's cache")
    assert len(completed.stderr.splitlines()) == 1


def test_threads_flag_reaches_the_stats(synthetic_model):
    result = minfer_cli("run", synthetic_model(), "Hello", "-n", "3", "--temp", "0", "--backend", "cpu", "-t", "1")
    assert result.returncode == 0, result.stderr
    assert result.stats()["threads"] == "1"
    assert_one_line_error(minfer_cli("run", synthetic_model(), "Hello", "-t", "0"), "-t/--threads")


def test_a_reply_budget_the_context_cannot_hold_is_refused_before_the_weights_load(synthetic_model, monkeypatch):
    assert_one_line_error(
        minfer_cli("run", synthetic_model(), "Hello", "-n", "5000", "--backend", "cpu"),
        "max tokens 5000 leave no room for a prompt in the context size 512",
    )

    def no_backend(name: str, cache_type: str) -> None:
        raise AssertionError("the backend was created: the weights would have loaded")

    monkeypatch.setattr(minfer.engine, "create_backend", no_backend)
    with pytest.raises(ContextOverflowError, match=r"max tokens 64 leave no room .* context size 64"):
        minfer.load(synthetic_model(), backend="cpu", ctx_size=64, max_tokens=64)


def test_info_states_the_memory_each_backend_needs(default_model_path):
    rows = {line.split("  ")[0]: line for line in minfer_cli("info", default_model_path).stdout.splitlines()}
    # 134.5 M parameters as float32 and 30 layers x 4096 rows x 2 x 192 floats of KV cache; measured peak: ~713 MB
    assert "memory, cpu" in rows and "727 MB: weights dequantized to float32 at load (538 MB)" in rows["memory, cpu"]
    assert (
        "KV cache of f32 at context 4096 (189 MB)" in rows["memory, cuda"]
        and "weights as stored (97 MB)" in rows["memory, cuda"]
    )


def test_info_counts_an_f16_kv_cache_at_two_bytes_a_value(default_model_path):
    rows = {
        line.split("  ")[0]: line for line in minfer_cli("info", default_model_path, "-ctv", "f16").stdout.splitlines()
    }
    cpu = rows["memory, cpu"]
    assert "632 MB: weights dequantized to float32 at load (538 MB), KV cache of f16 at context 4096 (94 MB)" in cpu
    assert rows["memory, cuda"].endswith("weights as stored (97 MB), KV cache of f16 at context 4096 (94 MB)")
