"""The CUDA backend (needs the minfer-kernels package and an NVIDIA GPU).

`backend.py` imports `minfer_kernels`; the runtime imports it only when the CUDA backend is asked for
(`backends.create_backend`). Its graph rewrites (`fuse.py`) need no kernels.
"""
