"""Toy #3 in Python (docs/tutorial/02-minimal-cuda.md): two busy kernels on one stream run in turn, on two
streams side by side; timed with events.

    python docs/tutorial/toys/streams.py [cycles]

The busy kernel is kernels.toy_busy (csrc/kernels/toys.cu, which exists for this toy): one warp spinning
for `cycles` GPU clocks. Phase 1 launches both on the legacy default stream (handle 0), phase 2 one on each
of two minfer_kernels.Stream (non-blocking, like the CUDA backend's). Exits 1 when two streams are not
clearly faster (speedup below 1.5).
"""

from __future__ import annotations

import argparse
import sys

import minfer_kernels as mk

DEFAULT_STREAM = 0  # the legacy default stream: its work runs in order, like any one stream


def on_one_stream(stream: int, out: mk.DeviceBuffer, cycles: int) -> float:
    """GPU milliseconds of two busy launches, one after the other on `stream`."""
    begin, end = mk.Event(), mk.Event()
    begin.record(stream)
    mk.kernels.toy_busy(out.ptr, cycles, 1, stream)
    mk.kernels.toy_busy(out.ptr + 8, cycles, 1, stream)
    end.record(stream)
    end.synchronize()
    return begin.elapsed_ms(end)


def on_two_streams(first: mk.Stream, second: mk.Stream, out: mk.DeviceBuffer, cycles: int) -> float:
    """GPU milliseconds of two busy launches, one on each stream. Events fork `second` off `first` and join
    it back, so `end` (on `first`) completes after both kernels."""
    begin, forked, joined, end = mk.Event(), mk.Event(), mk.Event(), mk.Event()
    begin.record(first.handle)
    forked.record(first.handle)
    second.wait(forked)
    mk.kernels.toy_busy(out.ptr, cycles, 1, first.handle)
    mk.kernels.toy_busy(out.ptr + 8, cycles, 1, second.handle)
    joined.record(second.handle)
    first.wait(joined)
    end.record(first.handle)
    end.synchronize()
    return begin.elapsed_ms(end)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cycles", nargs="?", type=int, default=40_000_000, help="GPU clocks per kernel")
    args = parser.parse_args()
    if mk.device_count() == 0:
        print(f"no GPU: {mk.unavailable_reason()}", file=sys.stderr)
        return 1
    out = mk.DeviceBuffer(16)  # two int64 counts, one per kernel
    first, second = mk.Stream(), mk.Stream()
    on_one_stream(DEFAULT_STREAM, out, 1000)  # warm-up: first-launch costs stay out of the timings
    serial = on_one_stream(DEFAULT_STREAM, out, args.cycles)
    parallel = on_two_streams(first, second, out, args.cycles)
    speedup = serial / parallel
    print(f"busy kernel: 1 block x 32 threads, {args.cycles} cycles each")
    print(f"default stream: {serial:.2f} ms (the second kernel waits for the first)")
    print(f"two streams   : {parallel:.2f} ms (side by side)")
    print(f"speedup {speedup:.2f}x {'PASS' if speedup >= 1.5 else 'FAIL'}")
    return 0 if speedup >= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
