"""Greedy argmax on the device, against numpy.argmax: the index must be exactly the same (-1 for a row holding
NaN or Inf, which numpy.argmax would answer with the first NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import INT_POISON, SIZES, from_device, poisoned, randn, requires_gpu

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu


def workspace(rows: int, n: int) -> mk.DeviceBuffer:
    return mk.DeviceBuffer(kernels.argmax_workspace_bytes(rows, n))  # zeroed, as the kernel needs


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("n", [*SIZES, 151936])
def test_argmax(rng, stream, dev, n, rows):
    x = randn(rng, rows, n, scale=5.0)
    out, space = poisoned(rows, np.int32, stream), workspace(rows, n)  # held: the kernel writes it
    kernels.argmax_f32(dev(x), out.ptr, space.ptr, rows, n, stream.handle)
    got = from_device(out, rows, np.int32, stream)
    assert INT_POISON not in got
    assert np.array_equal(got, np.argmax(x, axis=1))


def test_argmax_reuses_its_workspace(rng, stream, dev):
    # The last block of a row resets the row's counter: the same workspace serves the next launch.
    space, out = workspace(2, 151936), poisoned(2, np.int32, stream)
    for seed in range(3):
        x = randn(np.random.default_rng(seed), 2, 151936)
        kernels.argmax_f32(dev(x), out.ptr, space.ptr, 2, 151936, stream.handle)
        assert np.array_equal(from_device(out, 2, np.int32, stream), np.argmax(x, axis=1))


def test_argmax_ties_go_to_the_lowest_index(rng, stream, dev):
    x = randn(rng, 1, 151936)
    x[0, [70_001, 3_333, 151_935]] = x.max() + 1.0  # three equal maxima, far apart
    out, space = poisoned(1, np.int32, stream), workspace(1, 151936)
    kernels.argmax_f32(dev(x), out.ptr, space.ptr, 1, 151936, stream.handle)
    assert from_device(out, 1, np.int32, stream)[0] == 3_333 == np.argmax(x)


# Rows of one block (1, 33 values: the scalar loop), of two (4097: scalar; 4864: float4 loads) and of 38
# (151936, each block striding over several float4 chunks): a NaN or an infinity in any block's slice must
# reach the merge.
NONFINITE_SIZES = (1, 33, 4097, 4864, 151936)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("n", NONFINITE_SIZES)
def test_argmax_marks_a_row_holding_nan_or_inf(rng, stream, dev, n, where, value):
    x = randn(rng, 1, n, scale=5.0)
    x[0, {"first": 0, "middle": n // 2, "last": n - 1}[where]] = value
    out, space = poisoned(1, np.int32, stream), workspace(1, n)
    kernels.argmax_f32(dev(x), out.ptr, space.ptr, 1, n, stream.handle)
    assert from_device(out, 1, np.int32, stream)[0] == -1


@pytest.mark.parametrize("n", NONFINITE_SIZES)
def test_argmax_marks_only_the_rows_holding_nan_or_inf(rng, stream, dev, n):
    rows = 5
    x = randn(rng, rows, n, scale=5.0)
    x[1, n - 1] = np.nan
    x[3, 0] = np.inf
    x[4, :] = np.nan  # every value NaN
    out, space = poisoned(rows, np.int32, stream), workspace(rows, n)
    kernels.argmax_f32(dev(x), out.ptr, space.ptr, rows, n, stream.handle)
    expected = np.argmax(x, axis=1)
    expected[[1, 3, 4]] = -1
    assert np.array_equal(from_device(out, rows, np.int32, stream), expected)


def test_a_marked_row_leaves_the_workspace_ready(rng, stream, dev):
    # The merging block still resets the row's counter: the next launch on the same workspace is exact.
    n = 151936
    space, out = workspace(1, n), poisoned(1, np.int32, stream)
    broken = randn(rng, 1, n)
    broken[0, 77_777] = np.nan
    kernels.argmax_f32(dev(broken), out.ptr, space.ptr, 1, n, stream.handle)
    assert from_device(out, 1, np.int32, stream)[0] == -1
    x = randn(rng, 1, n)
    kernels.argmax_f32(dev(x), out.ptr, space.ptr, 1, n, stream.handle)
    assert from_device(out, 1, np.int32, stream)[0] == np.argmax(x)


def test_greedy_advance_makes_the_pick_the_next_steps_inputs(stream):
    """Three steps' picks recorded in order; each becomes the token, positions and kv_len one further; a -1 pick
    (a row holding NaN or Inf) is recorded and the token made 0, a row the embedding can read."""
    token, step, positions, kv_len = (mk.upload(np.array([v], np.int32), stream.handle) for v in (7, 0, 40, 41))
    picks = poisoned(4, np.int32, stream)
    for pick in (11, -1, 5):
        token.copy_from_host(np.array([pick], np.int32), stream.handle)  # argmax_f32 writes it there
        kernels.greedy_advance(token.ptr, picks.ptr, step.ptr, positions.ptr, kv_len.ptr, 4, stream.handle)
        assert from_device(token, 1, np.int32, stream)[0] == max(pick, 0)
    assert list(from_device(picks, 4, np.int32, stream)) == [11, -1, 5, INT_POISON]
    assert [from_device(b, 1, np.int32, stream)[0] for b in (step, positions, kv_len)] == [3, 43, 44]


def test_greedy_advance_records_nothing_past_its_capacity(stream):
    token, step, positions, kv_len = (mk.upload(np.array([v], np.int32), stream.handle) for v in (9, 2, 0, 1))
    picks = poisoned(3, np.int32, stream)
    kernels.greedy_advance(token.ptr, picks.ptr, step.ptr, positions.ptr, kv_len.ptr, 2, stream.handle)
    assert list(from_device(picks, 3, np.int32, stream)) == [INT_POISON] * 3
    assert from_device(step, 1, np.int32, stream)[0] == 3
    with pytest.raises(ValueError, match="capacity must be positive"):
        kernels.greedy_advance(token.ptr, picks.ptr, step.ptr, positions.ptr, kv_len.ptr, 0, stream.handle)
