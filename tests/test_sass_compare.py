"""tools/sass_compare.py: which kernels of two builds have the same SASS, on SASS written here in cuobjdump's form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import tool_module

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "sass_compare.py"

# Mangled names as nvcc writes them, with the anonymous namespace's hash of one build (HASH is replaced per build).
GEMV = "_ZN6minfer39_GLOBAL__N__HASH_7_gemv_cu_155b6a894gemvI"
PLAIN = GEMV + "NS0_8GemvQ8_0ENS_9StoreRowsILi1ELb1EEEEEvNS0_9GemvInputET0_"
GATED = GEMV + "NS0_8GemvQ4_0ENS_9GemvGatedILNS_14GateActivationE0EEEEEvNS0_9GemvInputET0_"
BODY = ["LDC R1, c[0x0][0x28]", "S2R R0, SR_TID.X", "LDG.E.128 R4, desc[UR4][R2.64]", "EXIT"]


def sass(kernels: dict[str, list[str]], namespace_hash: str) -> str:
    """cuobjdump -sass's text of an object holding these kernels (name -> instructions)."""
    lines = ["", "Fatbin elf code:", "================", "arch = sm_90a", "", "\tcode for sm_90a"]
    for name, body in kernels.items():
        lines += [f"\t\tFunction : {name.replace('HASH', namespace_hash)}", '\t.headerflags\t@"EF_CUDA_SM90"']
        for offset, instruction in enumerate(body):
            lines.append(f"        /*{offset * 16:04x}*/                   {instruction} ;   /* 0x000fe20000000f00 */")
            lines.append("                                                    /* 0x000fca0000000000 */")
        lines += ["        .......................", ""]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def tool():
    with tool_module("sass_compare") as module:
        yield module


def test_kernels_are_matched_across_builds_and_compared_instruction_by_instruction(tool):
    old = tool.kernels(sass({PLAIN: BODY, GATED: BODY}, "3d38ba93"))
    assert old[PLAIN.replace("HASH", "00000000")] == tuple(BODY)  # the text before ";", no address or encoding
    changed = [*BODY[:2], "LDG.E.128 R8, desc[UR4][R2.64]", "EXIT"]
    new = tool.kernels(sass({PLAIN: BODY, GATED: changed}, "677a7262"))
    groups = tool.compare(old, new, None)
    assert groups["same"] == [PLAIN.replace("HASH", "00000000")]
    assert groups["different"] == [GATED.replace("HASH", "00000000")]
    assert groups["only in OLD"] == groups["only in NEW"] == []


def test_a_mapping_matches_kernels_that_gained_a_template_parameter(tool):
    old = tool.kernels(sass({PLAIN: BODY}, "3d38ba93"))
    without = PLAIN.replace("Lb1EEEEEv", "Lb1EEELb0EEEv")  # gemv<Q8_0, StoreRows<1, true>, false>
    with_it = PLAIN.replace("Lb1EEEEEv", "Lb1EEELb1EEEv")  # gemv<Q8_0, StoreRows<1, true>, true>
    new = tool.kernels(sass({without: BODY, with_it: [*BODY[:3], "FMUL R9, R4, R4", "EXIT"]}, "677a7262"))
    groups = tool.compare(old, new, (r"Lb0E(EEvN)", r"\1"))
    assert groups["same"] == [PLAIN.replace("HASH", "00000000")]
    assert groups["only in NEW"] == [with_it.replace("HASH", "00000000")]
    assert groups["different"] == groups["only in OLD"] == []


def test_the_command_line_counts_lists_and_fails_on_a_difference(tmp_path):
    old, new, other = tmp_path / "old.sass", tmp_path / "new.sass", tmp_path / "other.sass"
    old.write_text(sass({PLAIN: BODY, GATED: BODY}, "3d38ba93"))
    new.write_text(sass({PLAIN: BODY, GATED: [*BODY[:-1], "BRA 0x30", "EXIT"]}, "677a7262"))
    other.write_text(sass({"_Z5otherv": BODY}, "0"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)

    result = run(str(old), str(old))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2 same, 0 different, 0 only in OLD, 0 only in NEW"
    result = run(str(old), str(new), "--list")
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == "1 same, 1 different, 0 only in OLD, 0 only in NEW"
    assert "different:" in result.stdout and "GemvGated" in result.stdout
    result = run(str(old), str(other))
    assert result.returncode == 1
    assert f"no kernel of {other} matches one of {old}" in result.stderr
    result = run(str(old), str(tmp_path / "missing.o"))
    assert result.returncode == 1
    assert "cannot read" in result.stderr and "missing.o" in result.stderr


def test_an_object_without_cuobjdump_is_refused_by_name(tmp_path):
    built = tmp_path / "gemv.o"
    built.write_bytes(b"\x7fELF")
    result = subprocess.run(
        [sys.executable, str(TOOL), str(built), str(built)],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},
    )
    assert result.returncode == 1
    assert "no cuobjdump on PATH; set CUOBJDUMP" in result.stderr
