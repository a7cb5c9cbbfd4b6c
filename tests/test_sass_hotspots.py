"""tools/sass_hotspots.py: the summary of Nsight Compute's source page, from a page written here in ncu's CSV form
(on the device, `tools/device-call.sh source` writes it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import tool_module

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "sass_hotspots.py"

SAMPLE_COLUMNS = ["Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)"]
STALL_COLUMNS = ["stall_long_sb", "stall_imc", "stall_wait", "stall_long_sb (Not Issued)"]
HEADER = ["Address", "Source", *SAMPLE_COLUMNS, "Instructions Executed", *STALL_COLUMNS]
GEMV = "void minfer::<unnamed>::gemv<minfer::<unnamed>::GemvQ8_0, minfer::StoreRows<(int)1, (bool)1>>(GemvInput, T2)"
ATTENTION = "void minfer::<unnamed>::attention_decode<(int)256, (bool)1, float>(const float *, T3 *)"


def csv_line(cells: list[str]) -> str:
    return ",".join(f'"{cell}"' for cell in cells)


def page(name: str, rows: list[tuple[str, int, int, int, int, int]]) -> list[str]:
    """A kernel's page: rows of (SASS, samples, executed, long_sb, imc, wait)."""
    lines = [csv_line(["Kernel Name", name]), csv_line(HEADER)]
    for index, (sass, samples, executed, long_sb, imc, wait) in enumerate(rows):
        stalls = [str(count) for count in (long_sb, imc, wait, long_sb)]
        lines.append(
            csv_line([f"0x7f00{index:04x}", f"      {sass}", str(samples), str(samples), f"{executed:,}", *stalls])
        )
    return lines


GEMV_ROWS = [
    ("LDC R1, c[0x0][0x28]", 2, 896, 0, 0, 2),
    ("ULDC UR4, c[0x0][0x228]", 10, 896, 0, 10, 0),
    ("LDG.E R2, desc[UR6][R2.64]", 0, 896, 0, 0, 0),
    ("STL [R1], R2", 30, 896, 30, 0, 0),
    ("LDG.E.128 R12, desc[UR4][R20.64]", 1, 1792, 0, 0, 1),
    ("FMUL R17, R13, R13", 40, 1792, 40, 0, 0),
    ("EXIT", 0, 896, 0, 0, 0),
]
ATTENTION_ROWS = [("ULDC.64 UR10, c[0x0][0x208]", 33, 1024, 0, 33, 0), ("EXIT", 1, 1024, 0, 0, 1)]


def ncu_output() -> str:
    """What ncu prints: the program's own lines and ncu's, then each kernel's page twice (once a section)."""
    lines = ["==PROF== Connected to process 12919 (/usr/bin/python3.12)", "| model | size |", "build: minfer 0.1.0"]
    lines += page(GEMV, GEMV_ROWS) + page(GEMV, GEMV_ROWS) + page(ATTENTION, ATTENTION_ROWS)
    lines += [*page(ATTENTION, ATTENTION_ROWS), "==PROF== Disconnected from process 12919"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def tool():
    with tool_module("sass_hotspots") as module:
        yield module


def test_pages_are_read_once_each_with_their_instructions_in_order(tool):
    pages = tool.read_pages(ncu_output())
    assert [p.name for p in pages] == [GEMV, ATTENTION]
    gemv = pages[0]
    assert [i.sass for i in gemv.instructions] == [row[0] for row in GEMV_ROWS]
    assert [i.index for i in gemv.instructions] == list(range(len(GEMV_ROWS)))
    assert gemv.samples == 83
    assert gemv.instructions[5].executed == 1792  # ncu's digit grouping read
    assert gemv.instructions[3].stalls == {"long_sb": 30}  # the "(Not Issued)" column is not a reason of its own
    assert gemv.stall_totals() == {"long_sb": 70, "imc": 10, "wait": 3}


def test_the_summary_names_the_leading_reasons_and_the_busiest_instructions_in_program_order(tool):
    gemv = tool.read_pages(ncu_output())[0]
    lines = tool.summary(gemv, top=3)
    assert lines[0] == GEMV
    assert lines[1] == "  83 samples over 7 instructions"
    assert lines[2] == "  stalls: long_sb 84%, imc 12%, wait 4%"
    shown = lines[3:]
    assert [line.split()[0] for line in shown] == ["1", "3", "5"]  # the three busiest, in program order
    assert "STL [R1], R2" in shown[1] and "long_sb:30" in shown[1] and "36.1%" in shown[1]
    assert shown[2].endswith("(executed 1792)")


def test_the_command_line_prints_every_kernel_and_refuses_a_file_without_a_page(tmp_path):
    written = tmp_path / "source.csv"
    written.write_text(ncu_output())
    result = subprocess.run([sys.executable, str(TOOL), str(written), "--top", "2"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("samples over") == 2
    assert "ULDC.64 UR10, c[0x0][0x208]" in result.stdout

    other = tmp_path / "report.txt"
    other.write_text("==PROF== Disconnected from process 1\n")
    result = subprocess.run([sys.executable, str(TOOL), str(other)], capture_output=True, text=True)
    assert result.returncode == 1
    assert f"{other} holds no source page" in result.stderr
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "missing.csv")], capture_output=True, text=True)
    assert result.returncode == 1
    assert "cannot read" in result.stderr and "missing.csv" in result.stderr
