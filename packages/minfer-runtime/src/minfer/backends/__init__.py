"""Backends: where a graph's nodes run. `create_backend` turns a --backend choice into one."""

from __future__ import annotations

from minfer.backends.base import Backend
from minfer.errors import BackendError

BACKEND_CHOICES = ("auto", "cpu", "cuda")


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can."""
    try:
        import minfer_kernels
    except ImportError:
        return "the minfer-kernels package is not installed (pip install ./packages/minfer-kernels; it needs nvcc)"
    if minfer_kernels.device_count() == 0:
        return f"no CUDA device: {minfer_kernels.unavailable_reason() or 'none found'}"
    return None


def cuda_kernel_types() -> frozenset[str] | None:
    """The GGML type names the CUDA kernels read (the extension's one list), or None without minfer-kernels."""
    try:
        import minfer_kernels
    except ImportError:
        return None
    return frozenset(kernel_type.name for kernel_type in minfer_kernels.GGMLType)


def create_backend(name: str) -> Backend:
    """The backend for a `--backend` value; `auto` picks CUDA when it can run here, else the CPU.

    An explicit `cuda` that cannot run is an error, never a silent switch to the CPU.
    """
    if name not in BACKEND_CHOICES:
        raise BackendError(f"unknown backend '{name}' (choose from {', '.join(BACKEND_CHOICES)})")
    if name == "cuda" or (name == "auto" and cuda_unavailable_reason() is None):
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise BackendError(f"--backend cuda: the CUDA backend cannot run here: {reason} (use --backend cpu)")
        from minfer.backends.cuda.backend import CudaBackend

        return CudaBackend()
    from minfer.backends.cpu import CpuBackend

    return CpuBackend()
