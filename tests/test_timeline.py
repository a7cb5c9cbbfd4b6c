"""tools/timeline.py: the decode step's kernels as the GPU ran them, from a Chrome trace (here a written one; on the
device, PyTorch's profiler's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import tool_module

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "timeline.py"

# Kernel names as CUPTI gives them (demangled), the namespaces spelled out.
ANON = "minfer::(anonymous namespace)::"
EMBED = f"void {ANON}embed_rows<float>(unsigned char const*, long long, int const*, float*, int)"
QKV = f"void {ANON}gemv<{ANON}Q8_0, minfer::QkvRope>(minfer::GemvInput, minfer::QkvRope)"
ATTENTION = "void minfer::attention_decode<64, false, float>(float const*, float*, float const*, float*, int const*)"
DOWN = (
    f"void {ANON}gemv_int8<{ANON}Int8Q8_0, minfer::StoreRows<1, true> >({ANON}Int8Launch, minfer::StoreRows<1, true>)"
)
HEAD = (
    f"void {ANON}gemv_int8<{ANON}Int8Q6_K, minfer::StoreRows<1, false> >({ANON}Int8Launch, minfer::StoreRows<1, false>)"
)


@pytest.fixture(scope="module")
def tool():
    with tool_module("timeline") as module:
        yield module


def kernel(name: str, start: float, duration: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": duration, "pid": 0, "tid": 7}


def decode_step(start: float, layers: int = 3) -> tuple[list[dict], float]:
    """A step: the lookup, `layers` layers of q|k|v (3 µs), attention (2 µs, starting 1 µs before q|k|v ends)
    and ffn_down (4 µs, after a 0.5 µs wait), then the head (10 µs); and its end."""
    events, at = [kernel(EMBED, start, 1.0)], start + 1.0
    for _ in range(layers):
        events.append(kernel(QKV, at, 3.0))
        events.append(kernel(ATTENTION, at + 2.0, 2.0))
        events.append(kernel(DOWN, at + 4.5, 4.0))
        at += 8.5
    events.append(kernel(HEAD, at, 10.0))
    return events, at + 10.0


def trace(steps: int = 4, layers: int = 3) -> dict:
    events, at = [], 0.0
    # A prompt first: the lookup and other kernels in another number (not a decode step).
    events += [kernel(EMBED, at, 5.0), kernel(QKV, at + 5.0, 20.0)]
    at = 100.0
    for _ in range(steps):
        step, end = decode_step(at, layers)
        events += step
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": end, "dur": 1.0})
        at = end + 6.0  # the host's gap between two replays
    return {"traceEvents": events}


def test_short_name_drops_return_type_parameters_and_namespaces(tool):
    assert tool.short_name(DOWN) == "gemv_int8<Int8Q8_0, StoreRows<1, true> >"
    assert tool.short_name(ATTENTION) == "attention_decode<64, false, float>"
    assert tool.short_name("plain_kernel") == "plain_kernel"


def test_steps_are_cut_at_the_lookup_and_the_prompt_left_out(tool):
    steps = tool.decode_steps(tool.kernel_events(trace(steps=4, layers=3)))
    assert len(steps) == 4
    assert all(len(step) == 1 + 3 * 3 + 1 for step in steps)
    assert all(step[0].name.startswith("embed_rows") for step in steps)


def test_placement_splits_a_step_into_what_each_kernel_adds(tool):
    step = tool.place(tool.decode_steps(tool.kernel_events(trace()))[0])
    qkv, attention, down = step[1], step[2], step[3]
    assert (qkv.duration, qkv.adds, qkv.overlap, qkv.wait) == (3.0, 3.0, 0.0, 0.0)
    assert (attention.duration, attention.adds, attention.overlap, attention.wait) == (2.0, 1.0, 1.0, 0.0)
    assert (down.duration, down.adds, down.overlap, down.wait) == (4.0, 4.5, 0.0, 0.5)
    assert sum(kernel.adds for kernel in step) == pytest.approx(1.0 + 3 * 8.5 + 10.0)


def test_the_layer_is_the_repeating_stretch(tool):
    names = ["embed", "a", "b", "c", "a", "b", "c", "a", "b", "c", "head"]
    assert tool.layer_span(names) == (1, 3, 3)
    assert tool.layer_span(["embed", "head"]) == (0, 0, 0)


def test_report_tables(tool):
    text = tool.report(trace(steps=4, layers=5))
    layer, step = text.split("\n\n")
    assert "5 layers, medians over 20" in layer
    rows = [line for line in layer.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split("|")[2].strip() for row in rows[:3]] == [
        "`gemv<Q8_0, QkvRope>`",
        "`attention_decode<64, false, float>`",
        "`gemv_int8<Int8Q8_0, StoreRows<1, true> >`",
    ]
    assert rows[-1].split("|")[-2].strip() == "8.50"  # a layer adds 3 + 1 + 4.5 µs
    step_length = 1.0 + 5 * 8.5 + 10.0
    assert f"4 steps of 17 kernels, {step_length:.1f} µs a step" in step
    assert f"one starting every {step_length + 6.0:.1f} µs" in step
    head = next(line for line in step.splitlines() if "Int8Q6_K" in line)
    assert head.split("|")[2:5] == [" 1 ", " 10.0 ", " 10.0 "]


def test_a_trace_file_on_the_command_line(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace()))
    result = subprocess.run([sys.executable, str(TOOL), "--trace", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "one layer: kernels 1 .. 3 of the step, 3 layers" in result.stdout


def test_a_trace_without_decode_steps_is_refused(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [kernel(QKV, 0.0, 1.0)]}))
    result = subprocess.run([sys.executable, str(TOOL), "--trace", str(path)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "no decode step in the trace (no `embed_rows` kernel among its 1 kernels)" in result.stderr
