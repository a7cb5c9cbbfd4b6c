"""The op timer's tables (MINFER_OP_TIMING=1), from events that report fixed times: no GPU needed."""

from __future__ import annotations

from dataclasses import dataclass

from minfer.backends.cuda.timing import OpTimer


@dataclass
class Mark:
    """Stands in for a recorded CUDA event: a time on the GPU's clock, in milliseconds."""

    at: float

    def elapsed_ms(self, end: Mark) -> float:
        return end.at - self.at


def marks(*durations: float) -> list[Mark]:
    """Events bracketing nodes that took `durations` milliseconds, back to back."""
    times = [0.0]
    for duration in durations:
        times.append(times[-1] + duration)
    return [Mark(t) for t in times]


def test_each_kind_of_run_has_its_own_table_with_the_time_a_run():
    timer = OpTimer()
    ops = ["rms_norm", "gemv", "gemv", "attention"]
    timer.measure("decode step", ops, marks(0.001, 0.004, 0.006, 0.003))
    timer.measure("decode step", ops, marks(0.001, 0.006, 0.004, 0.005))
    timer.measure("prompt", ["matmul"], marks(0.5))
    assert timer.runs == 3
    decode, prompt = timer.table().split("\n\n")
    assert decode.splitlines() == [
        "per-op GPU time, decode step: 2 runs (MINFER_OP_TIMING=1)",
        "| op | nodes | total ms | µs a run | % of run |",
        "| --- | ---: | ---: | ---: | ---: |",
        "| gemv | 4 | 0.020 | 10.0 | 66.7 |",
        "| attention | 2 | 0.008 | 4.0 | 26.7 |",
        "| rms_norm | 2 | 0.002 | 1.0 | 6.7 |",
        "| total | 8 | 0.030 | 15.0 | 100.0 |",
    ]
    assert prompt.splitlines()[0] == "per-op GPU time, prompt: 1 run (MINFER_OP_TIMING=1)"
    assert prompt.splitlines()[-1] == "| total | 1 | 0.500 | 500.0 | 100.0 |"


def test_a_timer_that_measured_nothing_has_no_runs():
    timer = OpTimer()
    assert timer.runs == 0 and timer.table() == ""
