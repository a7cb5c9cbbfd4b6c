"""Fixtures of the kernel tests: fresh random inputs (seed reported on failure) and a stream per test."""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest
from kernel_testing import DeviceInputs

import minfer_kernels as mk


def pytest_configure(config):
    if os.environ.get("MINFER_REQUIRE_GPU") == "1" and mk.device_count() == 0:
        raise pytest.UsageError(
            f"MINFER_REQUIRE_GPU=1 but no GPU is usable ({mk.unavailable_reason()}): the GPU tests would all skip"
        )
    config.addinivalue_line(
        "markers",
        "provokes_cuda_error: the test makes a CUDA call fail on purpose (error-path tests); "
        "tools/gpu-check.sh leaves these out of the compute-sanitizer pass, which counts every failed call",
    )


@pytest.fixture
def rng(request):
    """A generator with a fresh seed per test; MINFER_TEST_SEED=<n> replays a failure."""
    seed = int(os.environ.get("MINFER_TEST_SEED") or secrets.randbits(32))
    request.node.add_report_section("call", "seed", f"MINFER_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def stream():
    """A fresh non-blocking stream; a test's kernels all go on it."""
    if mk.device_count() == 0:
        pytest.skip(f"needs an NVIDIA GPU and driver ({mk.unavailable_reason()})")
    return mk.Stream()


@pytest.fixture
def dev(stream):
    """dev(array) -> device pointer of a copy of `array` that lives as long as the test."""
    return DeviceInputs(stream)
