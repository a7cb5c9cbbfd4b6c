"""The exception every CUDA failure raises (csrc/runtime.cpp decides the fields)."""

from __future__ import annotations


class CudaError(RuntimeError):
    """A CUDA call failed, or found an error an earlier call had left.

    Attributes:
        code: the cudaError_t value, e.g. 700.
        name: its name, e.g. ``"cudaErrorIllegalAddress"``.
        call: the call that observed the error (``"cudaMalloc(1024 bytes)"``, ``"launch_silu_f32"``,
            ``"sync()"``): where it was seen, which is not always what caused it.
        latched: True when the error was left by an earlier call or kernel (a fault inside a kernel
            surfaces at the next CUDA call or sync). A latched error is counted by
            ``minfer_kernels.latched_errors()`` and is not evidence about ``call``.
    """

    def __init__(self, message: str, code: int, name: str, call: str, latched: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.call = call
        self.latched = latched
