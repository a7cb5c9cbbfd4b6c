"""tools/bench-vs-llamacpp.sh: issue 17's table, minfer against llama-bench on the same files. Here minfer runs on
the CPU on a tiny model, and llama-bench is a stand-in that prints llama-bench's CSV and records its flags."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minfer.testing.synthetic import write_synthetic_model

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "bench-vs-llamacpp.sh"

# llama-bench's CSV columns that the table reads, for pp512 and tg128, and its flags, one line a call.
FAKE_LLAMA_BENCH = """\
    #!/usr/bin/env bash
    echo "$*" >> "$(dirname "$0")/calls"
    echo "n_prompt,n_gen,n_depth,avg_ts"
    echo "512,0,0,1000.0"
    echo "0,128,0,100.0"
    """


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_synthetic_model(path, "tiny-llama", weight_type="Q8_0")
    return path


def llama_bin(folder: Path) -> Path:
    """A folder with a stand-in llama-bench and llama-quantize, as a llama.cpp build leaves them."""
    folder.mkdir()
    (folder / "llama-bench").write_text(textwrap.dedent(FAKE_LLAMA_BENCH))
    (folder / "llama-quantize").write_text("#!/usr/bin/env bash\nexit 1\n")  # no shape here asks for it
    for tool in ("llama-bench", "llama-quantize"):
        (folder / tool).chmod(0o755)
    return folder


def run_table(model: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The script on `model` alone (no synthetic shape), minfer on the CPU, no second pass at depth."""
    variables = {**os.environ, "PYTHON": sys.executable, "SHAPES": "", **env}
    command = ["bash", str(SCRIPT), "--models", str(model), "--depth", "0", "--backend", "cpu", "--workdir",
               str(tmp_path / "work")]  # fmt: skip
    return subprocess.run(command, env=variables, capture_output=True, text=True, timeout=300)


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The table's rows by test: [shape, type, minfer, llama.cpp, ratio]."""
    rows = {}
    for line in stdout.splitlines()[2:]:
        shape, weight_type, test, ours, theirs, ratio = (cell.strip() for cell in line.strip("|").split("|"))
        rows[test] = [shape, weight_type, ours, theirs, ratio]
    return rows


def test_each_test_is_minfers_rate_against_llama_benchs_with_its_conventions(model: Path, tmp_path: Path) -> None:
    bin_dir = llama_bin(tmp_path / "bin")
    result = run_table(model, tmp_path, LLAMA_BIN=str(bin_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "| shape | type | test | minfer t/s | llama.cpp t/s | ratio |"
    rows = table_rows(result.stdout)
    assert sorted(rows) == ["pp512", "tg128"]
    for test, theirs in (("pp512", 1000.0), ("tg128", 100.0)):
        shape, weight_type, ours, their_rate, ratio = rows[test]
        assert (shape, weight_type, float(their_rate)) == ("tiny.gguf", "as shipped", theirs)
        assert float(ours) > 0
        # The ratio is of the unrounded rates, the table's minfer column rounded to a whole t/s.
        assert ratio.endswith("x") and float(ratio[:-1]) == pytest.approx(float(ours) / theirs, abs=0.5 / theirs + 5e-4)
    # llama-bench as the issue measures it: flash attention on, every layer on the GPU, 5 repetitions, the f16
    # cache minfer is given too.
    flags = (bin_dir / "calls").read_text().split()
    expected = {"-m": str(model), "-fa": "1", "-ngl": "99", "-r": "5", "-ctk": "f16", "-ctv": "f16"}
    assert {flag: flags[flags.index(flag) + 1] for flag in expected} == expected


def test_a_build_running_elsewhere_is_waited_for(model: Path, tmp_path: Path) -> None:
    """LLAMA_BUILDING names the pid of a build into LLAMA_BIN (the device's background build): the table starts
    once that process is gone."""
    build = subprocess.Popen(["sleep", "3"])
    (tmp_path / "build.pid").write_text(f"{build.pid}\n")
    started = time.monotonic()
    result = run_table(model, tmp_path, LLAMA_BIN=str(llama_bin(tmp_path / "bin")),
                       LLAMA_BUILDING=str(tmp_path / "build.pid"))  # fmt: skip
    build.wait()
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 3
    assert sorted(table_rows(result.stdout)) == ["pp512", "tg128"]


def test_a_build_that_left_no_binaries_is_named_with_its_log(model: Path, tmp_path: Path) -> None:
    finished = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout  # a pid now gone
    (tmp_path / "build.pid").write_text(finished)
    (tmp_path / "build.log").write_text("FAILED: ggml-cuda/fattn.cu.o\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run_table(model, tmp_path, LLAMA_BIN=str(empty), LLAMA_BUILDING=str(tmp_path / "build.pid"),
                       LLAMA_BUILD_LOG=str(tmp_path / "build.log"))  # fmt: skip
    assert result.returncode == 1
    assert "FAILED: ggml-cuda/fattn.cu.o" in result.stderr
    assert f"left no llama-bench and llama-quantize in {empty}" in result.stderr
    assert "| shape |" not in result.stdout  # no table begun
