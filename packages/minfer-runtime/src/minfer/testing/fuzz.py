"""A fuzz campaign over model files: seeded mutations of real and synthetic GGUFs, each loaded and run.

Every case is a source file and a mutation: a truncation at a section boundary, bytes patched over a
count, a length, a type id, a dimension, a name, a tensor's data (NaN, Inf), or random bit flips. The
file layout the mutations aim at is read with the `gguf` package's own reader, not minfer's.

A case passes when the mutated file either loads and generates (greedy and sampled) or is refused
with one `MinferError` line (naming the file when the refusal comes from reading it). It fails on a
traceback of any other exception, on a hang (a per-case time limit), on an unbounded allocation (a
memory limit on the worker process: MemoryError) and on a crash (the worker dies). Cases run in
worker processes so that a crash or a hang costs one case, not the campaign:

    python -m minfer.testing.fuzz SOURCE.gguf [...]    a campaign over these files, with a summary
"""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

CASE_SECONDS = 20  # a case that takes longer hangs: a synthetic model loads and runs in well under a second
WORKER_MEMORY = 4 << 30  # address space of a worker: the default model on the CPU needs ~1 GiB
HUGE = (2**32, 2**62, 2**64 - 1)  # counts and lengths no file can back
# Tensor type ids written over a record's: unknown, unsupported, and two that do not match the stored bytes.
PATCHED_TYPE_IDS = (99, *(int(GGMLQuantizationType[name]) for name in ("IQ2_XXS", "F32", "Q4_0")))
LOAD_ERRORS = ("ModelFileError", "TokenizerError", "TemplateError")  # refusals of the file: they name it


@dataclass(frozen=True)
class Case:
    """A mutation of `source`: `patches` (offset, hex bytes) written over it, then cut at `truncate`."""

    name: str
    source: str
    patches: tuple[tuple[int, str], ...] = ()
    truncate: int | None = None
    via_cli: bool = False  # run through `minfer run` in a subprocess instead of the Python API


@dataclass
class Result:
    case: str
    outcome: str  # ran, refused, traceback, hang, crash
    detail: str = ""
    error_type: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome in ("ran", "refused")


# -- mutations ------------------------------------------------------------------------------------------


def _u64(value: int) -> str:
    return struct.pack("<Q", value).hex()


def _u32(value: int) -> str:
    return struct.pack("<I", value % 2**32).hex()


def mutations(source: Path, rng: np.random.Generator, n_flips: int, limit: int | None = None) -> list[Case]:
    """Seeded mutations of `source`, aimed at its layout (at most `limit`, a random sample, when given)."""
    reader = GGUFReader(source)
    size = source.stat().st_size
    cases: list[Case] = []
    src = str(source)

    def add(name: str, *patches: tuple[int, str], truncate: int | None = None) -> None:
        cases.append(Case(f"{source.name}: {name}", src, tuple(patches), truncate))

    boundaries = {8, 16, 24, reader.data_offset, size - 1}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        offsets = np.cumsum([0, *(int(p.nbytes) for p in fld.parts)]) + fld.offset
        boundaries.update(int(o) for o in offsets[:4])
        boundaries.add(int(offsets[-1]))
        add(f"{key}: key length huge", (fld.offset, _u64(HUGE[int(rng.integers(3))])))
        add(f"{key}: value type 13", (int(offsets[2]), _u32(13)))
        if len(fld.parts) >= 5 and int(fld.parts[2][0]) == 9:  # an array: element type, count, items
            add(f"{key}: array count huge", (int(offsets[4]), _u64(HUGE[int(rng.integers(3))])))
            add(f"{key}: array count +1", (int(offsets[4]), _u64(int(fld.parts[4][0]) + 1)))
            add(f"{key}: array of arrays", (int(offsets[3]), _u32(9)))
            add(f"{key}: array element type swapped", (int(offsets[3]), _u32(int(rng.choice([0, 6, 8, 12])))))
        elif int(fld.parts[2][0]) == 8:  # a string: its length
            add(f"{key}: string length huge", (int(offsets[3]), _u64(HUGE[int(rng.integers(3))])))
        else:
            add(
                f"{key}: value bytes",
                (int(offsets[3]), rng.integers(0, 256, int(fld.parts[3].nbytes), np.uint8).tobytes().hex()),
            )
    names = [t.name for t in reader.tensors]
    for tensor in reader.tensors:
        fld = tensor.field
        offsets = np.cumsum([0, *(int(p.nbytes) for p in fld.parts)]) + fld.offset
        boundaries.update(int(o) for o in offsets)
        n_dims = int(fld.parts[2][0])
        add(f"{tensor.name}: name length huge", (fld.offset, _u64(HUGE[int(rng.integers(3))])))
        add(
            f"{tensor.name}: {int(rng.choice([0, 5, 2**31]))} axes",
            (int(offsets[2]), _u32(int(rng.choice([0, 5, 2**31])))),
        )
        axis = int(rng.integers(n_dims))
        for dim in (0, 2**32, 2**62, int(fld.parts[3][axis]) + 32):
            add(f"{tensor.name}: axis {axis} = {dim}", (int(offsets[3]) + 8 * axis, _u64(dim)))
        for type_id in PATCHED_TYPE_IDS:
            add(f"{tensor.name}: type {type_id}", (int(offsets[4]), _u32(type_id)))
        data_offset = int(fld.parts[5][0])
        for offset in (data_offset + 1, data_offset + 32, 2**63, 0):
            add(f"{tensor.name}: data offset {offset}", (int(offsets[5]), _u64(offset)))
        twins = [other for other in names if other != tensor.name and len(other) == len(tensor.name)]
        if twins:
            twin = twins[int(rng.integers(len(twins)))]
            add(f"{tensor.name}: renamed {twin} (a duplicate)", (int(offsets[1]), twin.encode().hex()))
        add(f"{tensor.name}: renamed (missing)", (int(offsets[1]), b"X".hex()))
        start = int(tensor.data_offset)
        boundaries.update((start, start + int(tensor.n_bytes)))
        if tensor.tensor_type is GGMLQuantizationType.F32:
            for bad in (np.nan, np.inf, -np.inf):
                add(f"{tensor.name}: {bad} in its data", (start, np.float32(bad).tobytes().hex()))
        elif tensor.tensor_type in (GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0):
            add(f"{tensor.name}: NaN scale", (start, np.float16(np.nan).tobytes().hex()))  # each block opens with f16
    for boundary in sorted(boundaries):
        for cut in (boundary - 1, boundary, boundary + 1):
            if 0 < cut < size:
                add(f"cut at byte {cut}", truncate=cut)
    header_end = reader.data_offset
    for index in range(n_flips):
        region = header_end if index % 4 else size  # most flips hit the header, some the weights
        flips = [(int(rng.integers(region)), int(rng.integers(256))) for _ in range(int(rng.integers(1, 5)))]
        add(f"random bytes {index}", *((offset, bytes([value]).hex()) for offset, value in flips))
    if limit is not None and len(cases) > limit:
        cases = [cases[i] for i in sorted(rng.choice(len(cases), limit, replace=False))]
    return cases


# -- running a case (in a worker process) ---------------------------------------------------------------


class CaseTimeout(BaseException):
    """Raised by the alarm when a case outlives CASE_SECONDS (a BaseException: no handler may swallow it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def materialize(case: Case, work: Path) -> Path:
    """The mutated file of `case`, written at `work`."""
    data = bytearray(Path(case.source).read_bytes())
    for offset, hex_bytes in case.patches:
        patch = bytes.fromhex(hex_bytes)
        data[offset : offset + len(patch)] = patch[: max(0, len(data) - offset)]
    if case.truncate is not None:
        data = data[: case.truncate]
    work.write_bytes(data)
    return work


def run_case(case: Case, path: Path) -> Result:
    """Load the mutated file and generate from it (greedy, then sampled), or record how it was refused."""
    if case.via_cli:
        return _run_cli(case, path)
    from minfer.engine import Engine
    from minfer.errors import MinferError

    try:
        engine = Engine(path, backend="cpu", ctx_size=256)
        "".join(engine.generate("Hello!", max_tokens=4, temperature=0))
        "".join(engine.generate("Hi there", max_tokens=4, temperature=0.8, seed=1))
        return Result(case.name, "ran")
    except MinferError as exc:
        return _refusal(case, path, type(exc).__name__, str(exc))
    except Exception as exc:  # the defect this campaign exists to find
        return Result(case.name, "traceback", traceback.format_exc(limit=8)[-3000:], type(exc).__name__)


def _refusal(case: Case, path: Path, error_type: str, message: str) -> Result:
    if "\n" in message:
        return Result(case.name, "traceback", f"a refusal of more than one line: {message[:500]}", error_type)
    if error_type in LOAD_ERRORS and str(path) not in message:
        return Result(case.name, "traceback", f"a refusal of the file that does not name it: {message}", error_type)
    return Result(case.name, "refused", message, error_type)


def _run_cli(case: Case, path: Path) -> Result:
    command = [sys.executable, "-m", "minfer.cli", "run", str(path), "Hello!", "-n", "4", "--temp", "0"]
    try:
        done = subprocess.run([*command, "--backend", "cpu", "--no-stats"], capture_output=True, text=True,
                              timeout=CASE_SECONDS, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return Result(case.name, "hang", f"minfer run: more than {CASE_SECONDS} s")
    if done.returncode == 0:
        return Result(case.name, "ran")
    lines = done.stderr.strip().splitlines()
    if done.returncode == 1 and len(lines) == 1 and lines[0].startswith("minfer: error: "):
        return Result(case.name, "refused", lines[0], "cli")
    return Result(case.name, "traceback", f"exit {done.returncode}: {done.stderr[-2000:]}", "cli")


def worker(cases_file: Path, results_file: Path) -> None:
    """Run the cases of `cases_file` (a JSON list), appending one JSON result per line; before each case its
    index goes to stdout, so that the parent knows which case a crash interrupted."""
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    signal.signal(signal.SIGALRM, _on_alarm)
    cases = [
        Case(**{**c, "patches": tuple(tuple(p) for p in c["patches"])}) for c in json.loads(cases_file.read_text())
    ]
    with tempfile.TemporaryDirectory() as folder, open(results_file, "a") as out:
        for index, case in enumerate(cases):
            print(index, flush=True)
            path = materialize(case, Path(folder) / "case.gguf")
            signal.alarm(CASE_SECONDS)
            try:
                result = run_case(case, path)
            except CaseTimeout:
                result = Result(case.name, "hang", f"more than {CASE_SECONDS} s")
            finally:
                signal.alarm(0)
            out.write(json.dumps(asdict(result)) + "\n")
            out.flush()


# -- the campaign -----------------------------------------------------------------------------------------


@dataclass
class Campaign:
    results: list[Result] = field(default_factory=list)

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if not r.passed]

    def counts(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    def summary(self) -> str:
        counts = self.counts()
        refusals = Counter(r.error_type for r in self.results if r.outcome == "refused")
        lines = [
            f"{len(self.results)} cases: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())),
            "refusals: " + ", ".join(f"{n} {kind}" for kind, n in refusals.most_common()),
        ]
        lines += [f"FAIL {r.outcome}: {r.case}: {r.detail.splitlines()[-1] if r.detail else ''}" for r in self.failures]
        return "\n".join(lines)


def run_campaign(cases: list[Case], workers: int = 2, timeout: float = 600.0) -> Campaign:
    """Run `cases` over `workers` processes; a worker that dies costs the case it was running (a crash) and
    is replaced for the rest of its cases."""
    campaign = Campaign()
    with tempfile.TemporaryDirectory() as folder:
        pending = [chunk for chunk in (cases[start::workers] for start in range(workers)) if chunk]
        while pending:
            running = []
            for number, chunk in enumerate(pending):
                cases_file, results_file = Path(folder) / f"cases{number}.json", Path(folder) / f"results{number}.jsonl"
                cases_file.write_text(json.dumps([asdict(c) for c in chunk]))
                results_file.write_text("")
                process = subprocess.Popen(
                    [sys.executable, "-m", "minfer.testing.fuzz", "--worker", str(cases_file), str(results_file)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
                running.append((chunk, process, results_file))
            pending = []
            for chunk, process, results_file in running:
                try:
                    _, stderr = process.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    _, stderr = process.communicate()
                done = [Result(**json.loads(line)) for line in results_file.read_text().splitlines()]
                campaign.results += done
                if len(done) < len(chunk):  # the worker died in the middle of case len(done)
                    reason = f"worker exit {process.returncode}: {stderr.strip()[-500:]}"
                    campaign.results.append(Result(chunk[len(done)].name, "crash", reason))
                    if len(done) + 1 < len(chunk):
                        pending.append(chunk[len(done) + 1 :])
    return campaign


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    rng = np.random.default_rng(2026)
    cases = [case for source in sys.argv[1:] for case in mutations(Path(source), rng, n_flips=100)]
    campaign = run_campaign(cases, workers=os.cpu_count() or 2)
    print(campaign.summary())
    sys.exit(1 if campaign.failures else 0)


if __name__ == "__main__":
    main()
