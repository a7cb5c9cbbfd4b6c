"""Greedy argmax on the device, against numpy.argmax: the index must be exactly the same."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import INT_POISON, SIZES, from_device, poisoned, randn, requires_gpu

from minfer_kernels import kernels

pytestmark = requires_gpu


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("n", SIZES)
def test_argmax(rng, stream, dev, n, rows):
    x = randn(rng, rows, n, scale=5.0)
    out = poisoned(rows, np.int32, stream)
    kernels.argmax_f32(dev(x), out.ptr, rows, n, stream.handle)
    got = from_device(out, rows, np.int32, stream)
    assert INT_POISON not in got
    assert np.array_equal(got, np.argmax(x, axis=1))


def test_argmax_ties_go_to_the_lowest_index(rng, stream, dev):
    x = randn(rng, 1, 151936)
    x[0, [70_001, 3_333, 151_935]] = x.max() + 1.0  # three equal maxima, far apart
    out = poisoned(1, np.int32, stream)
    kernels.argmax_f32(dev(x), out.ptr, 1, 151936, stream.handle)
    assert from_device(out, 1, np.int32, stream)[0] == 3_333 == np.argmax(x)
