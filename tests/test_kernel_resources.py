"""tools/kernel_resources.py: what ptxas makes of a kernel family file, with nvcc and no GPU (CI has both)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import tool_module

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "kernel_resources.py"
NORM = "packages/minfer-kernels/csrc/kernels/norm.cu"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=REPO, capture_output=True, text=True)


@pytest.fixture(scope="module")
def tool():
    """The tool as a module, for its pure functions."""
    with tool_module("kernel_resources") as module:
        yield module


def test_a_kernel_name_loses_its_parameter_list_and_keeps_its_template_arguments(tool):
    name = "void gemv<GemvQ4_0, minfer::GemvGated<(minfer::GateActivation)0> >(minfer::GemvInput, minfer::Gated)"
    assert tool.without_parameters(name) == "void gemv<GemvQ4_0, minfer::GemvGated<(minfer::GateActivation)0> >"
    assert tool.without_parameters("rms_norm_f32") == "rms_norm_f32"


# cuobjdump's layout: an address comment, the instruction (a predicate first where it has one), its encoding.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a0000017a02 */
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;            /* 0x0000000404027981 */
        /*0020*/                   IMMA.16832.S8.S8 R8, R8.ROW, R26.COL, RZ ;  /* 0x0000001a0808723c */
        /*0030*/                   LDS R3, [R5] ;                          /* 0x0000000005037984 */
        /*0040*/                   HFMA2.MMA R9, -RZ, RZ, 0, 0 ;           /* 0x00000000ff097435 */
        /*0050*/               @P0 BRA 0x20 ;                              /* 0xfffffffc00f40947 */
        /*0060*/                   SHFL.BFLY PT, R6, R7, 0x1, 0x1f ;       /* 0x0c201f0007067f89 */
        /*0070*/              @!P1 BRA 0x0 ;                               /* 0xfffffff400e49947 */
        /*0080*/                   BRA.DIV UR4, 0xa0 ;                     /* 0x0000000204047947 */
        /*0090*/                   BRA 0x90 ;                              /* 0xfffffffc00fc7947 */
        /*00a0*/                   EXIT ;                                  /* 0x000000000000794d */
"""


def test_innermost_loops_are_the_backward_branches_that_hold_no_other(tool):
    """0x20-0x50 is inside 0x0-0x70, which is left out; the spin at 0x90 is a loop of its own; a forward branch
    (BRA.DIV) is none."""
    loops = tool.innermost_loops(SASS)
    assert [first for first, _ in loops] == [0x20, 0x90]
    assert loops[0][1] == [
        "IMMA.16832.S8.S8 R8, R8.ROW, R26.COL, RZ",
        "LDS R3, [R5]",
        "HFMA2.MMA R9, -RZ, RZ, 0, 0",
        "@P0 BRA 0x20",
    ]
    # HFMA2.MMA is an FMA (on the MMA pipe's side), not a tensor-core product.
    assert tool.loop_counts(loops[0][1]) == "4 instructions (1 MMA, 1 LDS, 0 LDG, 0 SHFL)"
    whole = [line.split("*/")[1].split(";")[0].strip() for line in SASS.strip().splitlines()[:8]]
    assert tool.loop_counts(whole) == "8 instructions (1 MMA, 1 LDS, 1 LDG, 1 SHFL)"


@needs_nvcc
def test_each_kernel_of_the_file_beside_the_same_file_at_a_revision():
    done = run(NORM, "--against", "HEAD")
    assert done.returncode == 0, done.stderr
    kernels = re.findall(r"^(\S.*)$", done.stdout, re.MULTILINE)
    assert kernels == [
        "rms_norm_add_f32",  # not a template: ptxas names it without "void"
        "void rms_norm_add_row_f32<1>",
        "void rms_norm_add_row_f32<2>",
        "void rms_norm_add_row_f32<4>",
        "void rms_norm_add_row_f32<8>",
        "void rms_norm_f32<false>",
        "void rms_norm_f32<true>",
    ]
    for label in ("this tree", "HEAD"):
        assert len(re.findall(rf"^  {label}: \d+ registers, \d+ B static shared$", done.stdout, re.MULTILINE)) == 7


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
