"""toy_busy, the tutorial's busy kernel (csrc/kernels/toys.cu): every block writes how many GPU clocks it
spun, at least the cycles asked for; two streams run two launches side by side, one stream runs them in turn."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import INT_POISON, from_device, poisoned, requires_gpu

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu


@pytest.mark.parametrize(("blocks", "cycles"), [(1, 0), (1, 100_000), (7, 1_000_000)])
def test_every_block_spins_at_least_the_cycles_asked_for(stream, blocks, cycles):
    out = poisoned(blocks, np.int64, stream)
    kernels.toy_busy(out.ptr, cycles, blocks, stream.handle)
    spun = from_device(out, blocks, np.int64, stream)
    assert INT_POISON not in spun, f"a block did not write its count: {spun}"
    assert (spun >= cycles).all(), f"asked for {cycles} cycles, blocks spun {spun}"


def test_negative_cycles_are_refused_before_the_launch(stream):
    out = mk.DeviceBuffer(8)
    with pytest.raises(ValueError, match="launch_toy_busy refused its arguments: cycles must not be negative"):
        kernels.toy_busy(out.ptr, -1, 1, stream.handle)


def milliseconds(first: mk.Stream, second: mk.Stream, out: mk.DeviceBuffer, cycles: int) -> float:
    """GPU time of two one-block launches, one on `first` and one on `second` (the same stream or two)."""
    begin, forked, joined, end = mk.Event(), mk.Event(), mk.Event(), mk.Event()
    begin.record(first.handle)
    forked.record(first.handle)
    second.wait(forked)
    kernels.toy_busy(out.ptr, cycles, 1, first.handle)
    kernels.toy_busy(out.ptr + 8, cycles, 1, second.handle)
    joined.record(second.handle)
    first.wait(joined)
    end.record(first.handle)
    end.synchronize()
    return begin.elapsed_ms(end)


def test_two_streams_overlap_and_one_stream_serializes(stream):
    out = mk.DeviceBuffer(16)
    other = mk.Stream()
    cycles = 20_000_000  # ~10 ms on a 2 GHz GPU: long enough that launch costs do not matter
    milliseconds(stream, stream, out, 1000)  # warm-up
    serial = milliseconds(stream, stream, out, cycles)
    parallel = milliseconds(stream, other, out, cycles)
    assert serial / parallel > 1.5, f"one stream {serial:.2f} ms, two streams {parallel:.2f} ms"
