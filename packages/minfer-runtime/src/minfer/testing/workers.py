"""A worker process's share of the machine's CPUs."""

from __future__ import annotations

import os


def pin_to_share(index: int, count: int) -> None:
    """Pin this process to share `index` of `count` contiguous slices of the CPUs it may use (one CPU each, in turn,
    where there are more shares than CPUs), so that its default thread count (`minfer.threads`: one per physical
    core it may run on) is its slice's. Where the OS has no CPU affinity, it does nothing."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if count >= len(cpus):
        share = [cpus[index % len(cpus)]]
    else:  # contiguous slices: Linux numbers hyperthread siblings apart, so a slice holds whole cores' first threads
        share = cpus[index * len(cpus) // count : (index + 1) * len(cpus) // count]
    os.sched_setaffinity(0, share)


def pin_to_worker_share() -> None:
    """Under pytest-xdist, pin this worker process to its own slice of the CPUs the run may use.

    minfer's default BLAS thread count is one per physical core the process may run on (`minfer.threads`), so
    N workers that each see every core start N times too many threads, which spin against each other. On the
    16-CPU GPU machine, CUDA tests whose CPU side takes 6-24 s on 2 cores alone took 47-175 s each with 3-4
    workers (session 13, docs/PERFORMANCE.md). Outside xdist it does nothing."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker is not None and workers is not None:
        pin_to_share(int(worker.removeprefix("gw")), int(workers))
