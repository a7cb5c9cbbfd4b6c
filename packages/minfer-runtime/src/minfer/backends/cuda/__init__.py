"""The CUDA backend (needs the minfer-kernels package and an NVIDIA GPU).

Importing this package imports `minfer_kernels`; the runtime does so only when
the CUDA backend is asked for (`backends.create_backend`).
"""

from __future__ import annotations

from minfer.backends.cuda.backend import CudaBackend

__all__ = ["CudaBackend"]
