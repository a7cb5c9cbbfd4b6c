"""The build and the import, on any machine (CI has nvcc but no GPU): these never skip."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import gguf
import pytest

import minfer_kernels as mk


def test_build_info_describes_the_build():
    info = mk.build_info()
    assert info.archs_sass, "no architecture compiled to SASS"
    assert set(info.archs_sass) <= set(info.archs_probed), "a SASS arch the probe did not accept"
    assert info.archs_ptx == tuple(sorted({min(info.archs_sass), max(info.archs_sass)})), "PTX: lowest and highest"
    assert all(70 <= arch <= 121 for arch in info.archs_probed)
    assert re.fullmatch(r"\d+\.\d+\.\d+", info.nvcc_version)
    if int(info.nvcc_version.split(".")[0]) >= 13:
        assert not {70, 72} & set(info.archs_probed), "CUDA 13 dropped sm_70/sm_72: the probe must skip them"
    if info.arch_request == "all":
        assert info.archs_sass == info.archs_probed
    elif info.arch_request != "native":
        requested = {int(arch) for arch in re.findall(r"\d+", info.arch_request)}
        assert set(info.archs_sass) == requested
    assert info.cudart in ("static", "shared")
    assert os.path.basename(info.cudart_path).startswith("libcudart")
    assert info.host_compiler and os.path.isabs(info.host_compiler.split(" ")[0])
    assert re.fullmatch(r"\d+\.\d+", info.runtime_version)


def test_the_extension_does_not_link_the_driver_library():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run([readelf, "-d", mk._C.__file__], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert needed, "readelf listed no NEEDED entries"
    assert not [lib for lib in needed if lib.startswith("libcuda.")], "libcuda must be opened at run time, not linked"
    if mk.build_info().cudart == "static":
        assert not [lib for lib in needed if lib.startswith("libcudart")], "cudart should be linked statically"


NO_GPU_PROBE = """
import json
import minfer_kernels as mk
report = {"device_count": mk.device_count(), "devices": mk.devices(), "reason": mk.unavailable_reason()}
for what, attempt in (("alloc", lambda: mk.DeviceBuffer(16)), ("launch", lambda: mk.kernels.silu_f32(0, 1, 0))):
    try:
        attempt()
        report[what] = None
    except mk.CudaError as error:
        report[what] = {"name": error.name, "latched": error.latched, "message": str(error)}
print(json.dumps(report))
"""


@pytest.mark.provokes_cuda_error
def test_without_a_visible_gpu_device_count_is_zero_and_calls_raise():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # hides every GPU, as on a machine without one
    result = subprocess.run([sys.executable, "-c", NO_GPU_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["device_count"] == 0
    assert report["devices"] == []
    assert report["reason"].startswith("cudaGetDeviceCount")
    for what in ("alloc", "launch"):
        assert report[what] is not None, f"{what} without a GPU must raise CudaError"
        assert not report[what]["latched"], "'no GPU' is not a latched error"
        assert "not usable" in report[what]["message"] or "failed" in report[what]["message"]


def test_device_count_never_raises():
    count = mk.device_count()
    assert isinstance(count, int) and count >= 0
    assert len(mk.devices()) == count
    assert (mk.unavailable_reason() == "") == (count > 0)


def test_row_bytes_follow_the_gguf_block_table():
    for ggml_type in mk.GGMLType:
        values_per_block, bytes_per_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(ggml_type))]
        for n in (256, 4864) if values_per_block == 256 else (32, 896, 4864):
            assert mk.row_bytes(ggml_type, n) == n // values_per_block * bytes_per_block
    assert mk.row_bytes(mk.GGMLType.F16, 33) == 66
    with pytest.raises(ValueError, match="whole number of its blocks"):
        mk.row_bytes(mk.GGMLType.Q4_0, 33)
    with pytest.raises(ValueError, match="256 for Q2_K, Q3_K, Q4_K"):
        mk.row_bytes(mk.GGMLType.Q4_K, 896)
    with pytest.raises(ValueError, match="not a type the kernels read"):
        mk.row_bytes(int(gguf.GGMLQuantizationType.IQ2_XXS), 256)


def test_public_api_is_complete():
    missing = [name for name in mk.__all__ if not hasattr(mk, name)]
    assert not missing
    kernel_missing = [name for name in mk.kernels.__all__ if not hasattr(mk.kernels, name)]
    assert not kernel_missing
    error = mk.CudaError("message", 700, "cudaErrorIllegalAddress", "sync()", latched=True)
    assert (error.code, error.name, error.call, error.latched, str(error)) == (
        700,
        "cudaErrorIllegalAddress",
        "sync()",
        True,
        "message",
    )
    assert isinstance(error, RuntimeError)
