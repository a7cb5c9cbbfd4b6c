"""Elementwise kernels against numpy float64.

Error bounds (relative to |reference|):
    add, mul, scale   2^-24: one correctly rounded float32 operation on float32 inputs
    silu, swiglu      1e-6:  expf (2 ulp) plus a few rounded operations
    add_bias          2^-24
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import SIZES, assert_close, from_device, poisoned, randn, requires_gpu, silu, to_device

from minfer_kernels import kernels

pytestmark = requires_gpu

ONE_ROUNDING = 2.0**-24


@pytest.mark.parametrize("n", SIZES)
def test_add(rng, stream, dev, n):
    a, b = randn(rng, n), randn(rng, n)
    out = poisoned(n, np.float32, stream)
    kernels.add_f32(dev(a), dev(b), out.ptr, n, stream.handle)
    assert_close(from_device(out, n, np.float32, stream), a.astype(np.float64) + b, ONE_ROUNDING, what="add")


@pytest.mark.parametrize("n", SIZES)
def test_mul(rng, stream, dev, n):
    a, b = randn(rng, n), randn(rng, n)
    out = poisoned(n, np.float32, stream)
    kernels.mul_f32(dev(a), dev(b), out.ptr, n, stream.handle)
    assert_close(from_device(out, n, np.float32, stream), a.astype(np.float64) * b, ONE_ROUNDING, what="mul")


@pytest.mark.parametrize("n", SIZES)
def test_scale(rng, stream, dev, n):
    x = randn(rng, n)
    factor = np.float32(rng.uniform(0.1, 4.0))
    out = poisoned(n, np.float32, stream)
    kernels.scale_f32(dev(x), out.ptr, float(factor), n, stream.handle)
    assert_close(from_device(out, n, np.float32, stream), x.astype(np.float64) * factor, ONE_ROUNDING, what="scale")


def test_add_in_place_as_a_residual(rng, stream, dev):
    residual, update = randn(rng, 896), randn(rng, 896)
    r = to_device(residual, stream)
    kernels.add_f32(r.ptr, dev(update), r.ptr, 896, stream.handle)
    assert_close(from_device(r, 896, np.float32, stream), residual.astype(np.float64) + update, ONE_ROUNDING)


@pytest.mark.parametrize("n", SIZES)
def test_silu_in_place(rng, stream, n):
    x = randn(rng, n, scale=4.0)
    buffer = to_device(x, stream)
    kernels.silu_f32(buffer.ptr, n, stream.handle)
    assert_close(from_device(buffer, n, np.float32, stream), silu(x), 1e-6, what="silu")


@pytest.mark.parametrize(("rows", "d"), [(1, 4864), (33, 896), (3, 4097), (2, 151936), (7, 1)])
def test_swiglu_of_separate_buffers(rng, stream, dev, rows, d):
    gate, up = randn(rng, rows, d, scale=3.0), randn(rng, rows, d)
    out = poisoned((rows, d), np.float32, stream)
    kernels.swiglu_f32(dev(gate), dev(up), out.ptr, rows, d, d, stream.handle)
    assert_close(from_device(out, (rows, d), np.float32, stream), silu(gate) * up, 1e-6, what="swiglu")


@pytest.mark.parametrize(("rows", "d"), [(1, 4864), (33, 33)])
def test_swiglu_of_a_fused_gate_up_projection(rng, stream, rows, d):
    fused = randn(rng, rows, 2 * d, scale=3.0)  # [rows][gate | up], as one matmul with both weights writes
    base = to_device(fused, stream)
    out = poisoned((rows, d), np.float32, stream)
    kernels.swiglu_f32(base.ptr, base.ptr + 4 * d, out.ptr, rows, d, 2 * d, stream.handle)
    expected = silu(fused[:, :d]) * fused[:, d:]
    assert_close(from_device(out, (rows, d), np.float32, stream), expected, 1e-6, what="fused swiglu")


@pytest.mark.parametrize(("rows", "d"), [(1, 896), (33, 4097), (5, 151936), (4, 1)])
def test_add_bias_to_every_row(rng, stream, dev, rows, d):
    y, bias = randn(rng, rows, d), randn(rng, d)
    buffer = to_device(y, stream)
    kernels.add_bias_f32(buffer.ptr, dev(bias), rows, d, stream.handle)
    assert_close(from_device(buffer, (rows, d), np.float32, stream), y.astype(np.float64) + bias, ONE_ROUNDING)
