"""How many CPU threads the numpy work uses: the BLAS behind every CPU matmul, the `-t/--threads` flag.

numpy's BLAS starts a thread for every logical CPU by default. On a machine doing anything else that
oversubscribes the cores: one measured `minfer run --backend cpu` made 2.4 tok/s under load against 12 with
one BLAS thread. So minfer always sets the count, through threadpoolctl (the maintained way to limit
OpenBLAS, MKL and BLIS alike), to the user's `-t` or to `default_threads()`: like llama.cpp, one thread per
physical core the process may run on, hyperthread siblings not counted.
"""

from __future__ import annotations

import os
from pathlib import Path

from threadpoolctl import ThreadpoolController

from minfer.errors import MinferError

_controller: ThreadpoolController | None = None  # found once: it inspects every loaded library


def available_cpus() -> set[int]:
    """The logical CPUs this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def default_threads() -> int:
    """One per physical core among the CPUs this process may use (llama.cpp's cpu_get_num_math): the
    siblings of a hyperthreaded core share its arithmetic units, so a second BLAS thread there only adds
    contention. Where the topology is not readable, every available logical CPU counts."""
    cpus = available_cpus()
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return len(cpus)
        cores.add((package, core))
    return max(1, len(cores))


def set_threads(threads: int | None) -> int:
    """Limit numpy's BLAS to `threads` threads (None: `default_threads()`) for this process; returns the
    count in force. The limit is process-wide, as BLAS's own thread pool is."""
    global _controller
    count = default_threads() if threads is None else threads
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise MinferError(f"threads must be a positive integer, got {threads!r}")
    if _controller is None:
        _controller = ThreadpoolController()
    _controller.limit(limits=count, user_api="blas")
    return count
