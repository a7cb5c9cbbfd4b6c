"""The error toy in Python (docs/tutorial/02-minimal-cuda.md): the same experiments as errors.cu, through
minfer_kernels' error model (docs/GPU_SAFETY.md).

    python docs/tutorial/toys/errors.py                 # launch, capture, latched: each checked
    compute-sanitizer --tool memcheck python docs/tutorial/toys/errors.py overrun

    launch   silu_f32 over n = 0: an empty grid, which CUDA refuses at the launch; CudaError(latched=False),
             and the context stays usable
    capture  sync() inside a capture window: minfer refuses it before calling CUDA, so (unlike errors.cu)
             the capture survives and its graph replays
    latched  kv_store_f32 with a position outside the cache: the kernel traps; the launch returns, sync()
             reports the fault as latched, and so does the next launch, which did nothing wrong
    overrun  silu_f32 told n = 1024 over a buffer of 896 floats: the kernel's guard is on n, so a caller
             that lies about n writes past the end. Nothing reports it; memcheck does

Exits 1 when a mode does not behave as described (overrun only runs: it has nothing to check).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import numpy as np

import minfer_kernels as mk
from minfer_kernels import kernels


def report(what: str, error: mk.CudaError | None, expect_latched: bool | None) -> bool:
    """Prints what a call raised (or that it raised nothing, expect_latched None) and whether that was expected."""
    if error is None:
        ok = expect_latched is None
        print(f"  {what:44} -> no error {'(as expected)' if ok else '(NOT as expected)'}")
        return ok
    ok = expect_latched is not None and error.latched == expect_latched
    verdict = "(as expected)" if ok else "(NOT as expected)"
    print(f"  {what:44} -> CudaError {error.name}, latched={error.latched} {verdict}")
    print(f"      {error}")
    return ok


def attempt(call: Callable[[], object]) -> mk.CudaError | None:
    """The CudaError `call` raises, or None."""
    try:
        call()
    except mk.CudaError as error:
        return error
    return None


def launch_error(stream: mk.Stream) -> bool:
    print("launch: kernels.silu_f32(x, n=0): an empty grid")
    x = mk.upload(np.linspace(-4, 4, 896, dtype=np.float32), stream.handle)
    ok = report("the launch", attempt(lambda: kernels.silu_f32(x.ptr, 0, stream.handle)), expect_latched=False)
    ok &= report("the next, valid launch", attempt(lambda: kernels.silu_f32(x.ptr, 896, stream.handle)), None)
    ok &= report("sync()", attempt(lambda: mk.sync(stream.handle)), None)
    return ok


def capture_rule(stream: mk.Stream) -> bool:
    print("capture: sync() between begin_capture and end_capture")
    values = np.linspace(-4, 4, 896, dtype=np.float32)
    x = mk.upload(values, stream.handle)
    mk.begin_capture(stream.handle)
    kernels.silu_f32(x.ptr, 896, stream.handle)  # recorded, not run
    refused = attempt(lambda: mk.sync(stream.handle))
    ok = report("sync() inside the window", refused, expect_latched=False)
    ok &= refused is not None and refused.name == "cudaErrorStreamCaptureUnsupported"
    graph = mk.end_capture(stream.handle)  # the capture survived the refused call
    graph.launch(stream.handle)
    mk.sync(stream.handle)
    replayed = mk.download(x, 896, np.float32, stream.handle)
    expected = values / (1.0 + np.exp(-values.astype(np.float64)))
    replay_ok = bool(np.allclose(replayed, expected, rtol=1e-6))
    print(f"  the graph ({graph.node_count} node) replayed: silu of x {'(as expected)' if replay_ok else '(WRONG)'}")
    return ok and replay_ok


def latched_error(stream: mk.Stream) -> bool:
    print("latched: kv_store_f32 at position 9 of a 4-row cache")
    h = stream.handle
    k, v = mk.upload(np.ones((1, 32), np.float32), h), mk.upload(np.ones((1, 32), np.float32), h)
    k_cache, v_cache = mk.DeviceBuffer(4 * 32 * 4), mk.DeviceBuffer(4 * 32 * 4)
    outside = mk.upload(np.array([9], np.int32), h)  # positions are device data: only the kernel sees 9
    f32 = mk.GGMLType.F32  # the caches' type
    launched = attempt(
        lambda: kernels.kv_store_f32(k.ptr, v.ptr, k_cache.ptr, v_cache.ptr, outside.ptr, 1, 32, 4, f32, h)
    )
    ok = report("the launch", launched, None)
    ok &= report("sync() (the drain point)", attempt(lambda: mk.sync(h)), expect_latched=True)
    ok &= report("the next launch (innocent)", attempt(lambda: kernels.silu_f32(k.ptr, 32, h)), expect_latched=True)
    print(f"  latched_errors() = {mk.latched_errors()}")
    return ok


def overrun(stream: mk.Stream) -> None:
    print("overrun: kernels.silu_f32(x, n=1024) over a DeviceBuffer of 896 floats")
    x = mk.upload(np.zeros(896, np.float32), stream.handle)
    kernels.silu_f32(x.ptr, 1024, stream.handle)
    # Alone, nothing reports the 128 accesses past the end; under memcheck the first one stops the kernel.
    failure = attempt(lambda: mk.sync(stream.handle))
    unnoticed = "launch and sync() reported nothing: the 128 writes past the end went unnoticed"
    print(f"  sync(): {failure}" if failure else f"  {unnoticed}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["overrun"], help="only the overrun, for compute-sanitizer")
    args = parser.parse_args()
    if mk.device_count() == 0:
        print(f"no GPU: {mk.unavailable_reason()}", file=sys.stderr)
        return 1
    stream = mk.Stream()
    if args.mode == "overrun":
        overrun(stream)
        os._exit(0)  # under memcheck the context is broken: skip its teardown, as below
    passed = launch_error(stream) & capture_rule(stream) & latched_error(stream)  # latched last: it breaks the context
    print("PASS" if passed else "FAIL", flush=True)
    os._exit(0 if passed else 1)  # skip the teardown of a CUDA context that is broken on purpose


if __name__ == "__main__":
    sys.exit(main())
