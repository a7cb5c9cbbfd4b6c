"""The error model: launches CUDA refuses raise at once; arguments a launcher refuses raise ValueError
before any CUDA call; a fault inside a kernel is latched, counted, and not blamed on the next call."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from kernel_testing import from_device, randn, requires_gpu, silu, to_device

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu


# How CUDA names an impossible launch configuration: CUDA 13 reports a grid over its limits, or an
# empty one, as cudaErrorInvalidValue; older runtimes as cudaErrorInvalidConfiguration.
BAD_LAUNCH = {"cudaErrorInvalidConfiguration", "cudaErrorInvalidValue"}
F32 = mk.GGMLType.F32  # the KV caches' type where a test does not choose one


@pytest.mark.provokes_cuda_error
def test_an_invalid_launch_raises_at_the_launch_and_is_not_latched(rng, stream):
    rows = 65536  # one more than gridDim.y allows: the launch configuration is invalid
    y = mk.DeviceBuffer(rows * 4)
    bias = to_device(randn(rng, 1), stream)
    latched_before = mk.latched_errors()
    with pytest.raises(mk.CudaError, match="launch_add_bias_f32 failed at launch") as raised:
        kernels.add_bias_f32(y.ptr, bias.ptr, rows, 1, stream.handle)
    assert raised.value.name in BAD_LAUNCH
    assert raised.value.call == "launch_add_bias_f32"
    assert not raised.value.latched
    assert mk.latched_errors() == latched_before

    data = randn(rng, 33)  # the context is fine: the next launch and the drain succeed
    x = to_device(data, stream)
    kernels.silu_f32(x.ptr, 33, stream.handle)
    np.testing.assert_allclose(from_device(x, 33, np.float32, stream), silu(data), rtol=1e-6)
    assert mk.latched_errors() == latched_before


@pytest.mark.provokes_cuda_error
def test_an_empty_grid_is_an_invalid_launch(stream):
    with pytest.raises(mk.CudaError, match="launch_silu_f32 failed at launch") as raised:
        kernels.silu_f32(0, 0, stream.handle)
    assert raised.value.name in BAD_LAUNCH and not raised.value.latched


@pytest.mark.provokes_cuda_error
def test_an_invalid_overlapped_launch_raises_at_the_launch_and_is_not_latched(rng, stream):
    """launch_overlapped's cudaLaunchKernelEx returns its error and also leaves it as the thread's last error:
    the launcher must clear it, or the next launch would report the same error again, as latched."""
    data = randn(rng, 33)
    x = to_device(data, stream)  # before the failure: the launch right after it is the next CUDA call
    latched_before = mk.latched_errors()
    with pytest.raises(mk.CudaError, match="launch_rms_norm_f32 failed at launch") as raised:
        kernels.rms_norm_f32(0, 0, 0, 0, 896, 1e-6, stream.handle)  # rows = 0: an empty grid
    assert raised.value.name in BAD_LAUNCH and not raised.value.latched
    kernels.silu_f32(x.ptr, 33, stream.handle)  # raises nothing: nothing was left pending
    np.testing.assert_allclose(from_device(x, 33, np.float32, stream), silu(data), rtol=1e-6)
    assert mk.latched_errors() == latched_before


def test_refused_arguments_raise_value_error_before_any_cuda_call(stream):
    buffer = mk.DeviceBuffer(1 << 16)
    p, h = buffer.ptr, stream.handle
    with pytest.raises(
        ValueError, match=r"launch_matmul refused its arguments: .*Q4_0.* \(rows of whole 32-value blocks\)"
    ):
        kernels.matmul(p, mk.GGMLType.Q4_0, p, p, 33, 4, 1, h)
    with pytest.raises(ValueError, match=r"launch_matmul refused .*16-byte aligned"):
        kernels.matmul(p, mk.GGMLType.Q8_0, p + 4, p, 32, 4, 1, h)
    with pytest.raises(ValueError, match="launch_embed_rows refused"):
        kernels.embed_rows(p, 16, p, p, 1, 256, 4, h)  # type 16 is IQ2_XXS, which no kernel reads
    with pytest.raises(ValueError, match="n_rot must be even"):
        kernels.rope_f32(p, p, 1, 2, 64, 63, p, 1.0, kernels.ROPE_NEOX, h)
    with pytest.raises(ValueError, match="mode must be"):
        kernels.rope_f32(p, p, 1, 2, 64, 64, p, 1.0, 1, h)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 32"):
        kernels.attention_prefill_f32(p, p, p, p, p, 1, 2, 2, 48, 16, 16, 0.125, 0, p, 0, F32, h)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        kernels.attention_decode_f32(p, p, p, p, p, p, 14, 3, 64, 16, 0.125, 0, 4, *kernels.NO_HEAD_NORM, F32, h)
    with pytest.raises(ValueError, match="n_splits"):
        kernels.attention_decode_f32(p, p, p, p, p, p, 14, 2, 64, 16, 0.125, 0, 0, *kernels.NO_HEAD_NORM, F32, h)
    mk.sync(h)  # nothing reached CUDA: nothing is pending


def test_the_cache_kernels_refuse_a_cache_type_they_do_not_store(stream):
    """cache_type is a GGML type id, 0 (F32) or 1 (F16); the four launchers that store or read a KV cache refuse
    any other (2, Q4_0: no quantized cache) by name, their other arguments valid, before any CUDA call."""
    buffer = mk.DeviceBuffer(1 << 16)
    p, h, q8 = buffer.ptr, stream.handle, mk.GGMLType.Q8_0
    refused = " refused its arguments: .*cache_type"
    for cache_type in (2, -1):
        with pytest.raises(ValueError, match="launch_kv_store_f32" + refused):
            kernels.kv_store_f32(p, p, p, p, p, 1, 32, 16, cache_type, h)
        with pytest.raises(ValueError, match="launch_gemv_qkv_rope_store" + refused):
            heads = (2, 1, 64, 64, p, 1.0, kernels.ROPE_NEOX)  # heads, head_dim, n_rot, inv_freq, mscale, mode
            kernels.gemv_qkv_rope_store(p, q8, p, q8, p, q8, p, None, 1e-6, None, None, None, p, p, p, p, 32, *heads,
                                        16, cache_type, h)  # fmt: skip
        for head_norm in (kernels.NO_HEAD_NORM, (p, p, 1e-6, 64, p, 1.0, kernels.ROPE_NEOX)):
            with pytest.raises(ValueError, match="launch_attention_decode_f32" + refused):
                kernels.attention_decode_f32(p, p, p, p, p, p, 4, 2, 64, 16, 0.125, 0, 4, *head_norm, cache_type, h)
        for head_dim in (64, 96):  # the tensor cores' head size on sm_80+ and the float32 kernel's
            with pytest.raises(ValueError, match="launch_attention_prefill_f32" + refused):
                kernels.attention_prefill_f32(p, p, p, p, p, 1, 2, 2, head_dim, 16, 16, 0.125, 0, p, 1 << 16,
                                              cache_type, h)  # fmt: skip
    mk.sync(h)  # nothing reached CUDA: nothing is pending


# A launch whose kernel traps (argv[1] names it), then what sync() and the next launch report. Both kernels trap on
# a position outside the cache: kv_store_f32 as it stores, gemv_qkv_rope_store in its epilogue's finish, before
# the k and v stores it places (2 heads of 64 over 1 KV head, x of 32 values, Q8_0 weights of zeros).
TRAP_PROBE = """
import json
import os
import sys
import numpy as np
import minfer_kernels as mk
from minfer_kernels import kernels

stream = mk.Stream()
h = stream.handle
k = mk.upload(np.ones((1, 32), np.float32))
v = mk.upload(np.ones((1, 32), np.float32))
k_cache, v_cache = mk.DeviceBuffer(4 * 64 * 4), mk.DeviceBuffer(4 * 64 * 4)
outside = mk.upload(np.array([9], np.int32))  # a cache of n_ctx = 4 rows has no row 9
# enqueued: fine (float32 caches)
if sys.argv[1] == "kv_store_f32":
    kernels.kv_store_f32(k.ptr, v.ptr, k_cache.ptr, v_cache.ptr, outside.ptr, 1, 32, 4, mk.GGMLType.F32, h)
else:
    q8, weights, q = mk.GGMLType.Q8_0, mk.DeviceBuffer(128 * 34), mk.DeviceBuffer(128 * 4)
    kernels.gemv_qkv_rope_store(weights.ptr, q8, weights.ptr, q8, weights.ptr, q8, k.ptr, None, 1e-6, None, None,
                                None, q.ptr, k_cache.ptr, v_cache.ptr, outside.ptr, 32, 2, 1, 64, 0, None, 1.0,
                                kernels.ROPE_NORMAL, 4, mk.GGMLType.F32, h)
report = {}
for what, attempt in (("sync", lambda: mk.sync(h)), ("next_launch", lambda: kernels.silu_f32(k.ptr, 32, h))):
    try:
        attempt()
        report[what] = None
    except mk.CudaError as error:
        report[what] = {"name": error.name, "latched": error.latched, "call": error.call, "message": str(error)}
report["latched_errors"] = mk.latched_errors()
print(json.dumps(report), flush=True)
os._exit(0)  # skip the teardown of a context that is broken on purpose
"""

STICKY = {"cudaErrorLaunchFailure", "cudaErrorIllegalInstruction", "cudaErrorAssert", "cudaErrorIllegalAddress"}


@pytest.mark.provokes_cuda_error
@pytest.mark.parametrize("trapping", ["kv_store_f32", "gemv_qkv_rope_store"])
def test_a_kernel_fault_is_latched_counted_and_not_blamed_on_the_next_launch(trapping):
    # In a child process: the fault breaks the CUDA context for the rest of that process.
    result = subprocess.run([sys.executable, "-c", TRAP_PROBE, trapping], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sync"] is not None, f"the trap inside {trapping} must surface at sync()"
    assert report["sync"]["name"] in STICKY and report["sync"]["latched"]
    launch = report["next_launch"]
    assert launch is not None and launch["name"] in STICKY
    assert launch["latched"] and launch["call"] == "launch_silu_f32"
    assert "not evidence about launch_silu_f32" in launch["message"]
    assert "compute-sanitizer" in launch["message"]
    assert report["latched_errors"] >= 2
