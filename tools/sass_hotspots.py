"""Where a kernel's warps wait, a SASS instruction at a time: the summary of Nsight Compute's source page, as
`tools/device-call.sh source` writes it on the device:

    ncu --section SourceCounters --section WarpStateStats --page source --print-source sass --csv ... > FILE
    python3 tools/sass_hotspots.py FILE [--top 25]

For each kernel of the file: its warp-stall samples, the stall reasons that hold most of them (ncu's stall_*
columns, counted over every instruction), then the instructions with the most samples, in program order, each with
its index in the kernel, its samples and their share, the SASS, its two largest stall reasons and how many times
a warp executed it. An instruction where many samples sit waiting on a long scoreboard is the first use of a
global load's result: the load is the one a few lines above it that writes the same register.

ncu prints a kernel's page once for each section it was asked for; a page equal to the one before it is the same
kernel again and is left out. Samples are a statistical picture: a page of a few hundred samples (a short kernel,
ncu's default interval) places the large waits, not the small ones.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
STALL_PREFIX = "stall_"
NOT_ISSUED = "(Not Issued)"


@dataclass(frozen=True)
class Instruction:
    index: int  # in the kernel's SASS, from 0
    sass: str
    samples: int
    executed: int
    stalls: dict[str, int]  # reason (ncu's column without "stall_") -> samples


@dataclass(frozen=True)
class KernelPage:
    name: str
    instructions: tuple[Instruction, ...]

    @property
    def samples(self) -> int:
        return sum(instruction.samples for instruction in self.instructions)

    def stall_totals(self) -> Counter[str]:
        totals: Counter[str] = Counter()
        for instruction in self.instructions:
            totals.update(instruction.stalls)
        return totals


def as_count(text: str) -> int:
    """A cell of a count column: ncu writes '' or '-' where there is none, and may group digits with commas."""
    text = text.replace(",", "").strip()
    return int(float(text)) if text and text != "-" else 0


def read_pages(text: str) -> list[KernelPage]:
    """The kernels' source pages in the CSV that ncu printed (its other lines, the program's own output and ncu's
    ==PROF== lines, are skipped), a repeated page once."""
    pages: list[KernelPage] = []
    name: str | None = None
    header: list[str] = []
    rows: list[Instruction] = []

    def close() -> None:
        if name is not None and header:
            page = KernelPage(name, tuple(rows))
            if not pages or pages[-1] != page:
                pages.append(page)

    for row in csv.reader(text.splitlines()):
        if not row:
            continue
        if row[0] == "Kernel Name":
            close()
            name, header, rows = row[1], [], []
        elif row[0] == "Address" and name is not None:
            header = row
        elif header and row[0].startswith("0x") and len(row) == len(header):
            cells = dict(zip(header, row, strict=True))
            stalls = {
                column.removeprefix(STALL_PREFIX): as_count(value)
                for column, value in cells.items()
                if column.startswith(STALL_PREFIX) and NOT_ISSUED not in column and as_count(value)
            }
            rows.append(
                Instruction(
                    len(rows), cells["Source"].strip(), as_count(cells[SAMPLES]), as_count(cells[EXECUTED]), stalls
                )
            )
    close()
    return pages


def summary(page: KernelPage, top: int) -> list[str]:
    """The page's lines: its name, samples and leading stall reasons, then its `top` busiest instructions."""
    total = page.samples
    lines = [f"{page.name}", f"  {total} samples over {len(page.instructions)} instructions"]
    if total == 0:
        return lines
    reasons = ", ".join(f"{reason} {count / total:.0%}" for reason, count in page.stall_totals().most_common(6))
    lines.append(f"  stalls: {reasons}")
    busiest = sorted(page.instructions, key=lambda instruction: -instruction.samples)[:top]
    for instruction in sorted(busiest, key=lambda instruction: instruction.index):
        if instruction.samples == 0:
            continue
        leading = sorted(instruction.stalls.items(), key=lambda item: -item[1])[:2]
        why = " ".join(f"{reason}:{count}" for reason, count in leading)
        lines.append(
            f"  {instruction.index:6d} {instruction.samples:6d} {instruction.samples / total:6.1%}  "
            f"{instruction.sass[:64]:64s} {why}  (executed {instruction.executed})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="ncu's --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=25, help="instructions shown a kernel (default 25)")
    args = parser.parse_args(argv)
    try:
        text = args.csv.read_text(errors="replace")
    except OSError as error:
        print(f"sass_hotspots: cannot read {args.csv}: {error.strerror}", file=sys.stderr)
        return 1
    pages = read_pages(text)
    if not pages:
        print(
            f"sass_hotspots: {args.csv} holds no source page (ncu --page source --csv's 'Kernel Name' and "
            "'Address' rows)",
            file=sys.stderr,
        )
        return 1
    for page in pages:
        print("\n".join(summary(page, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
