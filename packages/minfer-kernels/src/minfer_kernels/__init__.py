"""minfer's hand-written CUDA kernels and the thin device runtime around them.

The device layer of minfer (docs/BUILD.md, docs/GPU_SAFETY.md)::

    import numpy as np
    import minfer_kernels as mk

    stream = mk.Stream()
    x = mk.upload(np.random.randn(4864).astype(np.float32), stream.handle)
    mk.kernels.silu_f32(x.ptr, 4864, stream.handle)   # enqueued; returns at once
    mk.sync(stream.handle)                            # the drain point: errors surface here
    y = mk.download(x, (4864,), np.float32, stream.handle)

Pointers and streams cross into the kernels as ints. Device memory is owned by ``DeviceBuffer`` objects
(freed when dropped); whoever passes ``buffer.ptr`` to a kernel keeps ``buffer`` alive until the stream
is past that kernel. The module imports on a machine without a GPU or driver: ``device_count()`` is 0
there, and ``unavailable_reason()`` says why.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from . import _C, kernels
from ._C import (
    CudaGraph,
    DeviceBuffer,
    Event,
    PinnedBuffer,
    Stream,
    begin_capture,
    copy_d2d,
    device_count,
    end_capture,
    int8_gemv,
    is_capturing,
    latched_errors,
    mem_info,
    set_device,
    set_int8_gemv,
    sync,
    unavailable_reason,
)
from ._errors import CudaError

#: The GGML type ids of the weight and table formats every kernel family reads, from their one list in the
#: extension (csrc/kernels/ggml_formats.cuh: KERNEL_TYPES).
GGMLType = enum.IntEnum("GGMLType", kernels.TYPES)


def row_bytes(ggml_type: int, n_values: int) -> int:
    """Bytes of one GGUF row of ``n_values`` values of ``ggml_type`` (the kernels' own block table)."""
    nbytes = _C.kernels.row_bytes(int(ggml_type), n_values)
    if nbytes < 0:
        raise ValueError(
            f"GGML type {ggml_type} with {n_values} values per row: not a type the kernels read "
            f"({', '.join(t.name for t in GGMLType)}), or not a whole number of its blocks "
            "(none for F32, F16, BF16; 32 values; 256 for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS)"
        )
    return nbytes


def _archs(text: str) -> tuple[int, ...]:
    return tuple(int(arch) for arch in text.split(";") if arch)


def _cuda_version(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(frozen=True)
class BuildInfo:
    """How this copy of the extension was built (cmake/MinferCuda.cmake prints the same at build time)."""

    archs_sass: tuple[int, ...]  # native code embedded, e.g. (90,) for sm_90
    archs_ptx: tuple[int, ...]  # PTX embedded for the driver to JIT: the lowest and highest SASS arch
    archs_probed: tuple[int, ...]  # every candidate sm_70..sm_121 this nvcc accepted
    arch_request: str  # MINFER_CUDA_ARCHS as given: "all", "native", "90", "80;90"
    nvcc: str
    nvcc_version: str  # e.g. "13.0.88"
    host_compiler: str  # the -ccbin compiler, its version and how it was chosen
    cudart: str  # "static" or "shared"
    cudart_path: str
    runtime_version: str  # the CUDA runtime linked in, e.g. "13.0"
    driver_version: str | None  # the CUDA version the installed driver supports; None without a driver


def build_info() -> BuildInfo:
    """The archs (SASS and PTX), nvcc, host compiler and cudart linkage of this build."""
    raw = _C.build_info()
    return BuildInfo(
        archs_sass=_archs(raw["archs_sass"]),
        archs_ptx=_archs(raw["archs_ptx"]),
        archs_probed=_archs(raw["archs_probed"]),
        arch_request=raw["arch_request"],
        nvcc=raw["nvcc"],
        nvcc_version=raw["nvcc_version"],
        host_compiler=raw["host_compiler"],
        cudart=raw["cudart"],
        cudart_path=raw["cudart_path"],
        runtime_version=_cuda_version(raw["runtime_version"]),
        driver_version=_cuda_version(raw["driver_version"]) if raw["driver_version"] else None,
    )


@dataclass(frozen=True)
class DeviceInfo:
    """One CUDA device, as ``devices()`` lists it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory: int  # bytes
    l2_cache_bytes: int
    max_shared_memory_per_block: int  # bytes a block can opt in to


def devices() -> list[DeviceInfo]:
    """Every visible CUDA device; an empty list without a GPU or driver."""
    return [DeviceInfo(**_C.device_properties(index)) for index in range(device_count())]


def upload(array: np.ndarray, stream: int = 0) -> DeviceBuffer:
    """A new DeviceBuffer holding the bytes of ``array`` (copied in C order), ready when this returns."""
    contiguous = np.ascontiguousarray(array)
    buffer = DeviceBuffer(contiguous.nbytes)
    buffer.copy_from_host(contiguous, stream)
    return buffer


def download(
    buffer: DeviceBuffer, shape: int | tuple[int, ...], dtype: npt.DTypeLike, stream: int = 0, offset: int = 0
) -> np.ndarray:
    """A new array of ``shape`` and ``dtype`` read from ``buffer`` at byte ``offset``, after the work on ``stream``."""
    out = np.empty(shape, dtype)
    buffer.copy_to_host(out, stream, offset)
    return out


__all__ = [
    "BuildInfo",
    "CudaError",
    "CudaGraph",
    "DeviceBuffer",
    "DeviceInfo",
    "Event",
    "GGMLType",
    "PinnedBuffer",
    "Stream",
    "begin_capture",
    "build_info",
    "copy_d2d",
    "device_count",
    "devices",
    "download",
    "end_capture",
    "int8_gemv",
    "is_capturing",
    "kernels",
    "latched_errors",
    "mem_info",
    "row_bytes",
    "set_device",
    "set_int8_gemv",
    "sync",
    "unavailable_reason",
    "upload",
]
