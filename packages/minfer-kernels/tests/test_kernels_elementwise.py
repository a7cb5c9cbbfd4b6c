"""Elementwise kernels against numpy float64.

Error bounds (relative to |reference|):
    add, mul, scale   2^-24: one correctly rounded float32 operation on float32 inputs
    silu, swiglu      1e-6:  expf (2 ulp) plus a few rounded operations
    gelu, softcap     2e-6 of max(|reference|, 1): tanhf (2 ulp) of a rounded argument; near gelu's zero
                      crossing the error is absolute, the product of the rounding of x and of tanh
    geglu             gelu's bound times |up|
    add_bias, slice   2^-24 (slice copies: exact)
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_testing import (
    SIZES,
    assert_close,
    from_device,
    gelu_tanh,
    poisoned,
    randn,
    requires_gpu,
    silu,
    to_device,
)

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


# The gated kernels, each with its activation's float64 reference, that activation's bound and the floor of its
# scale (the bounds above): out = act(gate) * up is within rtol |up| max(|act(gate)|, floor).
GATED = [(kernels.swiglu_f32, silu, 1e-6, 0.0), (kernels.geglu_f32, gelu_tanh, 2e-6, 1.0)]


def assert_gated(got, gate, up, activation, rtol, floor, what):
    scale = np.abs(up) * np.maximum(np.abs(activation(gate)), floor)
    assert_close(got, activation(gate) * up, rtol, scale=scale, what=what)


@pytest.mark.parametrize(("rows", "d"), [(1, 4864), (33, 896), (3, 4097), (2, 151936), (7, 1)])
@pytest.mark.parametrize(("launcher", "activation", "rtol", "floor"), GATED, ids=["swiglu", "geglu"])
def test_gated_of_separate_buffers(rng, stream, dev, launcher, activation, rtol, floor, rows, d):
    gate, up = randn(rng, rows, d, scale=3.0), randn(rng, rows, d)
    out = poisoned((rows, d), np.float32, stream)
    launcher(dev(gate), dev(up), out.ptr, rows, d, d, stream.handle)
    got = from_device(out, (rows, d), np.float32, stream)
    assert_gated(got, gate, up, activation, rtol, floor, launcher.__name__)


@pytest.mark.parametrize(("rows", "d"), [(1, 4864), (33, 33)])
@pytest.mark.parametrize(("launcher", "activation", "rtol", "floor"), GATED, ids=["swiglu", "geglu"])
def test_gated_of_a_fused_gate_up_projection(rng, stream, launcher, activation, rtol, floor, rows, d):
    fused = randn(rng, rows, 2 * d, scale=3.0)  # [rows][gate | up], as one matmul with both weights writes
    base = to_device(fused, stream)
    out = poisoned((rows, d), np.float32, stream)
    launcher(base.ptr, base.ptr + 4 * d, out.ptr, rows, d, 2 * d, stream.handle)
    got = from_device(out, (rows, d), np.float32, stream)
    assert_gated(got, fused[:, :d], fused[:, d:], activation, rtol, floor, f"fused {launcher.__name__}")


@pytest.mark.parametrize(("rows", "d"), [(1, 896), (33, 4097), (5, 151936), (4, 1)])
def test_add_bias_to_every_row(rng, stream, dev, rows, d):
    y, bias = randn(rng, rows, d), randn(rng, d)
    buffer = to_device(y, stream)
    kernels.add_bias_f32(buffer.ptr, dev(bias), rows, d, stream.handle)
    assert_close(from_device(buffer, (rows, d), np.float32, stream), y.astype(np.float64) + bias, ONE_ROUNDING)


@pytest.mark.parametrize("n", SIZES)
def test_gelu_in_place(rng, stream, n):
    x = randn(rng, n, scale=4.0)
    buffer = to_device(x, stream)
    kernels.gelu_f32(buffer.ptr, n, stream.handle)
    expected = gelu_tanh(x)
    scale = np.maximum(np.abs(expected), 1.0)
    assert_close(from_device(buffer, n, np.float32, stream), expected, 2e-6, scale=scale, what="gelu")


@pytest.mark.parametrize("n", SIZES)
def test_softcap_in_place(rng, stream, n):
    cap = 30.0
    x = randn(rng, n, scale=60.0)  # far past the cap too: the tails flatten toward +-cap
    buffer = to_device(x, stream)
    kernels.softcap_f32(buffer.ptr, cap, n, stream.handle)
    expected = cap * np.tanh(x.astype(np.float64) / cap)
    scale = np.maximum(np.abs(expected), 1.0)
    assert_close(from_device(buffer, n, np.float32, stream), expected, 2e-6, scale=scale, what="softcap")


def test_softcap_refuses_a_cap_that_is_not_positive(stream):
    with pytest.raises(ValueError, match="cap must be a positive finite number"):
        kernels.softcap_f32(0, 0.0, 1, stream.handle)


@pytest.mark.parametrize(("rows", "width", "in_stride", "start"), [(1, 896, 1152, 0), (1, 128, 1152, 1024),
                                                                    (33, 4864, 9728, 4864), (7, 1, 3, 2)])  # fmt: skip
def test_slice_copies_a_column_range_of_every_row(rng, stream, dev, rows, width, in_stride, start):
    x = randn(rng, rows, in_stride)
    out = poisoned((rows, width), np.float32, stream)
    kernels.slice_f32(dev(x), out.ptr, rows, width, in_stride, start, stream.handle)
    np.testing.assert_array_equal(from_device(out, (rows, width), np.float32, stream), x[:, start : start + width])


def test_slice_refuses_columns_outside_the_row(stream):
    with pytest.raises(ValueError, match="must lie inside a row"):
        kernels.slice_f32(0, 0, 1, 8, 16, 9, stream.handle)
