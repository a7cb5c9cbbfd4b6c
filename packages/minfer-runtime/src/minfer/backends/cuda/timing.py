"""Per-op timing (MINFER_OP_TIMING=1): CUDA events around every node of the runs that are not replays."""

from __future__ import annotations

from dataclasses import dataclass, field

import minfer_kernels as mk


@dataclass
class OpTotals:
    nodes: int = 0
    milliseconds: float = 0.0


@dataclass
class OpTimer:
    """Accumulates GPU time per op across executions; `table()` renders it."""

    totals: dict[str, OpTotals] = field(default_factory=dict)
    steps: int = 0

    def add(self, op: str, milliseconds: float) -> None:
        entry = self.totals.setdefault(op, OpTotals())
        entry.nodes += 1
        entry.milliseconds += milliseconds

    def measure(self, ops: list[str], events: list[mk.Event]) -> None:
        """After a run: events[i] and events[i + 1] bracket node i (the stream must be synchronized)."""
        for index, op in enumerate(ops):
            self.add(op, events[index].elapsed_ms(events[index + 1]))
        self.steps += 1

    def table(self) -> str:
        total = sum(t.milliseconds for t in self.totals.values()) or 1.0
        lines = [
            f"per-op GPU time over {self.steps} executions (MINFER_OP_TIMING=1)",
            "| op | nodes | total ms | % of step |",
            "| --- | ---: | ---: | ---: |",
        ]
        for op, t in sorted(self.totals.items(), key=lambda item: -item[1].milliseconds):
            lines.append(f"| {op} | {t.nodes} | {t.milliseconds:.3f} | {100 * t.milliseconds / total:.1f} |")
        lines.append(f"| total | {sum(t.nodes for t in self.totals.values())} | {total:.3f} | 100.0 |")
        return "\n".join(lines)
