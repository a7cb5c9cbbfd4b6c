"""The tutorial's toys (docs/tutorial/toys/) build and start on a machine without a GPU: each CUDA toy compiles
with nvcc for sm_90, as the chapter compiles it, and each Python toy parses its command line. Running them
needs a GPU: docs/tutorial/toys/run-on-gpu.sh does that (`tools/gpu-check.sh`, its `toys` step)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOYS = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "toys"
NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")


@pytest.mark.skipif(NVCC is None, reason="needs the CUDA compiler nvcc (PATH or /usr/local/cuda/bin)")
@pytest.mark.parametrize("toy", ["silu", "streams", "errors"])
def test_a_cuda_toy_compiles_as_the_chapter_compiles_it(tmp_path, toy):
    result = subprocess.run(
        [NVCC, "-arch=sm_90", "-O2", "-lineinfo", "-o", str(tmp_path / toy), str(TOYS / f"{toy}.cu")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / toy).stat().st_size > 0


@pytest.mark.parametrize("toy", ["silu", "streams", "errors", "replay"])
def test_a_python_toy_parses_its_command_line_without_a_gpu(toy):
    pytest.importorskip("minfer_kernels", reason="the Python toys import minfer_kernels (needs nvcc to build)")
    result = subprocess.run(
        [sys.executable, str(TOYS / f"{toy}.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {toy}.py")


def test_the_gpu_script_runs_every_toy():
    script = (TOYS / "run-on-gpu.sh").read_text()
    for toy in ("silu.cu", "streams.cu", "errors.cu", "silu.py", "streams.py", "errors.py", "replay.py"):
        assert f"$TOYS/{toy}" in script, f"run-on-gpu.sh does not run {toy}"
    result = subprocess.run(["bash", "-n", str(TOYS / "run-on-gpu.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
