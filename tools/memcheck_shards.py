"""The kernel tests under compute-sanitizer memcheck, in shards: the selected test ids dealt round-robin into N
groups, each group one pytest process under its own sanitizer, all N at once.

Why not pytest-xdist under one sanitizer (`--target-processes all`): on the H200 (session 21) such a pass with 4
or 12 workers printed nothing after "bringing up nodes..." until its timeout, even over 12 tests that take 2 s in
one process, while one pytest process under its own sanitizer ran every test it was given in seconds. A shard is
that shape. A shard that still hangs is killed with its whole process group at the deadline and named, with the
test it was running (the shards run `pytest -v`, which prints a test's id before running it); the others report.
The collection and the shards load no plugin of the machine's own (PYTEST_DISABLE_PLUGIN_AUTOLOAD: the H200's
Python has torch's and pytest-benchmark's, and under the sanitizer a process pays for every CUDA library it
loads); a plugin the pass wants comes in PYTEST_ARGS (`-p pytest_timeout --timeout 240`).

    python tools/memcheck_shards.py [--shards N] [--timeout S] [--logs DIR] [-m EXPR] PATH... [-- PYTEST_ARGS...]

PYTEST_ARGS go to every shard's run (not to the collection). Exit status: 0 when every shard's tests passed and its
sanitizer reported no error; 1 otherwise; 2 when the selection collected no test.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ONLY_OWN_PLUGINS = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
MEMCHECK = "compute-sanitizer --tool memcheck --error-exitcode 86 --print-limit 20"
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")
SANITIZER_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) errors?")
PYTEST_SUMMARY = re.compile(r"^=* ?(\d+ \w+.* in [0-9.]+s.*?) ?=*$")


def pytest_command(*args: str) -> list[str]:
    """pytest in this Python, without its cache, the current folder its rootdir: test ids are relative to the
    rootdir, which a package's own pytest configuration would move away from the folder the shards run in, so
    the collection and every shard share this one and the collected ids resolve in the shards."""
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", os.getcwd(), *args]


def deal(test_ids: list[str], shards: int) -> list[list[str]]:
    """Test ids dealt round-robin into at most `shards` non-empty groups: one test's parametrisations, which sit
    next to each other in collection order and often cost alike, land in different shards."""
    groups = [test_ids[shard::shards] for shard in range(shards)]
    return [group for group in groups if group]


def collect(paths: list[str], markers: str | None) -> list[str]:
    """The ids pytest selects under `paths` and the marker expression, in collection order."""
    command = pytest_command("--collect-only", "-q", *paths)
    if markers:
        command += ["-m", markers]
    collected = subprocess.run(command, capture_output=True, text=True, env=ONLY_OWN_PLUGINS)
    if collected.returncode not in (0, 5):
        raise SystemExit(f"memcheck_shards: collecting {' '.join(paths)} failed:\n{collected.stdout}{collected.stderr}")
    return [line for line in collected.stdout.splitlines() if "::" in line]


@dataclass
class ShardOutcome:
    """What one shard's log says: pytest's counts, the sanitizer's error count, the last test it began."""

    exit_code: int | None
    counts: dict[str, int]
    sanitizer_errors: int | None
    summary: str
    last_test: str


def read_outcome(log: str, exit_code: int | None) -> ShardOutcome:
    """The outcome of a shard from its log (exit_code None: killed at the deadline)."""
    summary, last_test, counts, errors = "", "", {}, None
    for line in log.splitlines():
        if match := PYTEST_SUMMARY.match(line.strip()):
            summary = match.group(1)
            counts = {
                word.rstrip("s") if word.startswith("error") else word: int(number)
                for number, word in PYTEST_COUNT.findall(summary)
            }
        if match := SANITIZER_ERRORS.search(line):
            errors = int(match.group(1))
        if "::" in line and not line.startswith(("FAILED", "ERROR", "=", " ")):
            last_test = line.split(" ", 1)[0]
    return ShardOutcome(exit_code, counts, errors, summary, last_test)


def passed(outcome: ShardOutcome) -> bool:
    return (
        outcome.exit_code == 0
        and outcome.sanitizer_errors == 0
        and not outcome.counts.get("failed")
        and not outcome.counts.get("error")
    )


def describe(shard: int, outcome: ShardOutcome) -> str:
    verdict = "PASS" if passed(outcome) else "FAIL"
    if outcome.exit_code is None:
        ending = f"killed at the deadline while running {outcome.last_test or 'its first test'}"
    else:
        ending = f"exit {outcome.exit_code}, {outcome.summary or 'no pytest summary'}"
    errors = "no sanitizer summary" if outcome.sanitizer_errors is None else f"{outcome.sanitizer_errors} errors"
    return f"{verdict}  shard {shard}: {ending}; sanitizer: {errors}"


def run_shards(
    groups: list[list[str]], sanitizer: list[str], pytest_args: list[str], timeout: float, logs: Path
) -> list[ShardOutcome]:
    """Every group at once, one `sanitizer pytest -v` process each (its own process group, its log in
    logs/memcheck-shard-K.log); a group still running at the deadline is killed with its process group."""
    logs.mkdir(parents=True, exist_ok=True)
    running = []
    for shard, group in enumerate(groups):
        log_path = logs / f"memcheck-shard-{shard}.log"
        command = [*sanitizer, *pytest_command("-v", *pytest_args, *group)]
        with open(log_path, "w") as log:
            running.append(
                (
                    log_path,
                    subprocess.Popen(
                        command, stdout=log, stderr=subprocess.STDOUT, env=ONLY_OWN_PLUGINS, start_new_session=True
                    ),
                )
            )
    deadline = time.monotonic() + timeout
    outcomes = []
    for shard, (log_path, process) in enumerate(running):
        try:
            exit_code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            exit_code = None
        outcome = read_outcome(log_path.read_text(errors="replace"), exit_code)
        print(describe(shard, outcome), flush=True)
        outcomes.append(outcome)
    return outcomes


def main(argv: list[str]) -> int:
    own, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8, help="processes at once (default 8)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for the whole pass (default 1200)")
    parser.add_argument("--logs", type=Path, default=Path("build/memcheck"), help="where the shards' logs go")
    parser.add_argument("--sanitizer", default=MEMCHECK, help=f"the command each shard runs under ({MEMCHECK})")
    parser.add_argument("-m", dest="markers", help="pytest marker expression selecting the tests")
    parser.add_argument("paths", nargs="+", help="test files or folders")
    options = parser.parse_args(own)
    if options.shards < 1:
        parser.error(f"--shards must be at least 1, not {options.shards}")
    test_ids = collect(options.paths, options.markers)
    if not test_ids:
        print(f"memcheck_shards: no test selected under {' '.join(options.paths)} (-m {options.markers!r})")
        return 2
    groups = deal(test_ids, options.shards)
    print(f"{len(test_ids)} tests in {len(groups)} shards under: {options.sanitizer}", flush=True)
    start = time.monotonic()
    outcomes = run_shards(groups, shlex.split(options.sanitizer), pytest_args, options.timeout, options.logs)
    totals = {
        word: sum(outcome.counts.get(word, 0) for outcome in outcomes)
        for word in ("passed", "failed", "error", "skipped")
    }
    errors = sum(outcome.sanitizer_errors or 0 for outcome in outcomes)
    good = sum(passed(outcome) for outcome in outcomes)
    print(
        f"memcheck shards: {good}/{len(outcomes)} passed; {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['error']} errors, {totals['skipped']} skipped, {errors} sanitizer errors "
        f"in {time.monotonic() - start:.1f}s"
    )
    return 0 if good == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
