"""Per-op timing (MINFER_OP_TIMING=1): CUDA events between the nodes of a run, one table per kind of run.

A replayed decode step is timed inside a graph of its own: the step's launches with an event recorded after
each node, captured once and replayed for every timed step, so the nodes run back to back as in the replayed
step and each row is GPU time. Launched node by node from the host instead (a prompt, or a decode step with
MINFER_NO_CUDA_GRAPH=1), a short node's row also holds the host's time to issue the next launch. In neither
form does a node start under the previous one's tail, as programmatic dependent launch lets it, and each event
adds a gap of its own, so a table's total runs above the step's time in `minfer bench` (Qwen2.5-0.5B's step:
1.04 ms timed, 0.64 ms replayed, on an H200): read the rows as shares of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import minfer_kernels as mk


@dataclass
class OpTotals:
    nodes: int = 0
    milliseconds: float = 0.0


@dataclass
class RunTotals:
    """GPU time per op over the runs of one kind."""

    runs: int = 0
    ops: dict[str, OpTotals] = field(default_factory=dict)


@dataclass
class OpTimer:
    """Accumulates GPU time per op across runs, by kind of run; `table()` renders one table a kind."""

    kinds: dict[str, RunTotals] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return sum(totals.runs for totals in self.kinds.values())

    def measure(self, kind: str, ops: list[str], events: list[mk.Event]) -> None:
        """After a run of `kind`: events[i] and events[i + 1] bracket node i (the stream must be synchronized)."""
        totals = self.kinds.setdefault(kind, RunTotals())
        for index, op in enumerate(ops):
            entry = totals.ops.setdefault(op, OpTotals())
            entry.nodes += 1
            entry.milliseconds += events[index].elapsed_ms(events[index + 1])
        totals.runs += 1

    def table(self) -> str:
        return "\n\n".join(self.kind_table(kind, totals) for kind, totals in self.kinds.items())

    @staticmethod
    def kind_table(kind: str, totals: RunTotals) -> str:
        total = sum(t.milliseconds for t in totals.ops.values())
        share = total or 1.0
        lines = [
            f"per-op GPU time, {kind}: {totals.runs} run{'s' if totals.runs != 1 else ''} (MINFER_OP_TIMING=1)",
            "| op | nodes | total ms | µs a run | % of run |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for op, t in sorted(totals.ops.items(), key=lambda item: -item[1].milliseconds):
            per_run, percent = 1000 * t.milliseconds / totals.runs, 100 * t.milliseconds / share
            lines.append(f"| {op} | {t.nodes} | {t.milliseconds:.3f} | {per_run:.1f} | {percent:.1f} |")
        nodes = sum(t.nodes for t in totals.ops.values())
        lines.append(f"| total | {nodes} | {total:.3f} | {1000 * total / totals.runs:.1f} | 100.0 |")
        return "\n".join(lines)
