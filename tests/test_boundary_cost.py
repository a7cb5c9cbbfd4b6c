"""tools/boundary_cost.cu builds with the nvcc command its header gives (no GPU: running it needs one, on the GPU
machine)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "boundary_cost.cu"
NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")


@pytest.mark.skipif(NVCC is None, reason="needs the CUDA compiler nvcc (PATH or /usr/local/cuda/bin)")
def test_the_boundary_measurement_builds_with_its_headers_command(tmp_path):
    command = next(line for line in TOOL.read_text().splitlines() if line.startswith("//   nvcc "))
    build = command.removeprefix("//").split("&&")[0].split()  # nvcc FLAGS -o /tmp/boundary_cost tools/...cu
    binary = tmp_path / "boundary_cost"
    build = [NVCC if word == "nvcc" else str(binary) if word == "/tmp/boundary_cost" else word for word in build]
    result = subprocess.run(build, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert binary.stat().st_size > 0
