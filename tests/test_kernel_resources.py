"""tools/kernel_resources.py: what ptxas makes of a kernel family file, with nvcc and no GPU (CI has both)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "kernel_resources.py"
NORM = "packages/minfer-kernels/csrc/kernels/norm.cu"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=REPO, capture_output=True, text=True)


def test_a_kernel_name_loses_its_parameter_list_and_keeps_its_template_arguments():
    spec = importlib.util.spec_from_file_location("kernel_resources_under_test", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks the module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    name = "void gemv<GemvQ4_0, minfer::GemvGated<(minfer::GateActivation)0> >(minfer::GemvInput, minfer::Gated)"
    assert module.without_parameters(name) == "void gemv<GemvQ4_0, minfer::GemvGated<(minfer::GateActivation)0> >"
    assert module.without_parameters("rms_norm_f32") == "rms_norm_f32"


@needs_nvcc
def test_each_kernel_of_the_file_beside_the_same_file_at_a_revision():
    done = run(NORM, "--against", "HEAD")
    assert done.returncode == 0, done.stderr
    kernels = re.findall(r"^(\S.*)$", done.stdout, re.MULTILINE)
    assert kernels == ["rms_norm_add_f32", "rms_norm_f32"]
    for label in ("this tree", "HEAD"):
        assert len(re.findall(rf"^  {label}: \d+ registers, \d+ B static shared$", done.stdout, re.MULTILINE)) == 2


@needs_nvcc
def test_a_kernel_without_shared_memory_is_listed_too():
    """ptxas' line for such a kernel names no smem (rope.cu's one kernel)."""
    done = run("packages/minfer-kernels/csrc/kernels/rope.cu")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"rope_f32\n  this tree: \d+ registers, 0 B static shared\n", done.stdout)


@needs_nvcc
def test_match_keeps_the_kernels_whose_name_holds_it():
    done = run(NORM, "--match", "add")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "rms_norm_add_f32" and "rms_norm_f32" not in done.stdout


@needs_nvcc
def test_names_what_it_cannot_do():
    outside = run("README.md")
    assert outside.returncode == 1 and "README.md: not a file under packages/minfer-kernels" in outside.stderr
    nothing = run(NORM, "--match", "no such kernel")
    assert nothing.returncode == 1 and "matches 'no such kernel'" in nothing.stderr
    unknown = run(NORM, "--against", "no-such-revision")
    assert unknown.returncode == 1 and "--against no-such-revision" in unknown.stderr
