"""Backends: where a graph's nodes run. `create_backend` turns a --backend choice into one."""

from __future__ import annotations

from minfer.backends.base import Backend
from minfer.errors import BackendError

BACKEND_CHOICES = ("auto", "cpu", "cuda")


def create_backend(name: str) -> Backend:
    """The backend for a `--backend` value; `auto` picks CUDA when it is available, else the CPU."""
    if name not in BACKEND_CHOICES:
        raise BackendError(f"unknown backend '{name}' (choose from {', '.join(BACKEND_CHOICES)})")
    if name == "cuda":
        raise BackendError("the CUDA backend is not available in this version of minfer-runtime yet: use --backend cpu")
    from minfer.backends.cpu import CpuBackend

    return CpuBackend()
