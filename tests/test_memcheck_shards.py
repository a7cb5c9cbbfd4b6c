"""tools/memcheck_shards.py: the kernel suite's memcheck pass as shards, each pytest process under its own sanitizer.
Here the sanitizer is a stand-in that runs the command and prints compute-sanitizer's summary line."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from tool_modules import tool_module

# Runs the shard's pytest, then says what compute-sanitizer says when it found nothing, keeping pytest's exit code.
CLEAN_SANITIZER = 'sh -c \'"$@"; code=$?; echo "========= ERROR SUMMARY: 0 errors"; exit $code\' sanitizer'


@pytest.fixture(scope="module")
def shards() -> Iterator[ModuleType]:
    """tools/memcheck_shards.py as a module."""
    with tool_module("memcheck_shards") as module:
        yield module


def write_tests(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_sample.py").write_text(textwrap.dedent(body))
    return folder


def test_deal_spreads_neighbours_over_shards_and_drops_empty_ones(shards: ModuleType) -> None:
    ids = [f"t::{n}" for n in range(7)]
    assert shards.deal(ids, 3) == [["t::0", "t::3", "t::6"], ["t::1", "t::4"], ["t::2", "t::5"]]
    assert shards.deal(ids[:2], 5) == [["t::0"], ["t::1"]]


def test_outcome_of_a_clean_shard(shards: ModuleType) -> None:
    log = textwrap.dedent("""\
        a.py::test_x[1] PASSED                                   [ 50%]
        a.py::test_x[2] SKIPPED (no reason)                      [100%]
        ==================== 1 passed, 1 skipped in 3.21s ====================
        ========= ERROR SUMMARY: 0 errors
        """)
    outcome = shards.read_outcome(log, 0)
    assert outcome.counts == {"passed": 1, "skipped": 1}
    assert outcome.sanitizer_errors == 0
    assert shards.passed(outcome)
    assert shards.describe(4, outcome) == "PASS  shard 4: exit 0, 1 passed, 1 skipped in 3.21s; sanitizer: 0 errors"


def test_outcome_counts_sanitizer_errors_even_when_the_tests_pass(shards: ModuleType) -> None:
    log = "a.py::test_x PASSED\n= 1 passed in 1.00s =\n========= ERROR SUMMARY: 2 errors\n"
    outcome = shards.read_outcome(log, 86)
    assert outcome.sanitizer_errors == 2
    assert not shards.passed(outcome)


def test_outcome_of_a_killed_shard_names_the_test_it_was_running(shards: ModuleType) -> None:
    log = "a.py::test_x[1] PASSED  [ 50%]\na.py::test_x[2] \n========= Invalid __global__ read at minfer::gemm\n"
    outcome = shards.read_outcome(log, None)
    assert not shards.passed(outcome)
    assert "killed at the deadline while running a.py::test_x[2]" in shards.describe(0, outcome)


def test_every_selected_test_runs_once_and_the_pass_is_green(
    shards: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write_tests(
        tmp_path / "suite",
        """\
        import pytest

        @pytest.mark.parametrize("n", range(5))
        def test_numbers(n):
            assert n < 5

        @pytest.mark.provokes_cuda_error
        def test_left_out():
            assert False
        """,
    )
    # The suite's own configuration makes its folder pytest's rootdir, as packages/minfer-kernels' does.
    (tmp_path / "suite" / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    provokes_cuda_error: makes a CUDA call fail\n"
    )
    code = shards.main(
        [
            "--shards",
            "3",
            "--timeout",
            "120",
            "--logs",
            str(tmp_path / "logs"),
            "--sanitizer",
            CLEAN_SANITIZER,
            "-m",
            "not provokes_cuda_error",
            "suite",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "5 tests in 3 shards" in out
    assert "memcheck shards: 3/3 passed; 5 passed, 0 failed, 0 errors, 0 skipped, 0 sanitizer errors" in out
    assert len(list((tmp_path / "logs").glob("memcheck-shard-*.log"))) == 3


def test_a_failing_test_or_a_hanging_one_fails_the_pass_and_is_named(
    shards: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write_tests(
        tmp_path / "suite",
        """\
        import time

        def test_fails():
            assert 1 == 2

        def test_hangs():
            time.sleep(600)
        """,
    )
    code = shards.main(
        ["--shards", "2", "--timeout", "12", "--logs", str(tmp_path / "logs"), "--sanitizer", CLEAN_SANITIZER, "suite"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  shard 0: exit 1, 1 failed in" in out
    assert "FAIL  shard 1: killed at the deadline while running suite/test_sample.py::test_hangs" in out
    assert "memcheck shards: 0/2 passed; 0 passed, 1 failed" in out


def test_a_selection_of_nothing_is_an_error(
    shards: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write_tests(tmp_path / "suite", "def test_one():\n    pass\n")
    assert shards.main(["-m", "nothing_has_this_marker", "suite"]) == 2
    assert "no test selected under suite" in capsys.readouterr().out
