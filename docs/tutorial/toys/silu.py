"""Toy #2 in Python (docs/tutorial/02-minimal-cuda.md): minfer's own silu_f32 against a CPU reference.

    python docs/tutorial/toys/silu.py            # n = 4864 and n = 896
    python docs/tutorial/toys/silu.py 33 151936  # any sizes

The input goes up through a pinned staging buffer with an asynchronous copy and comes back through a
pinned read-back buffer, the two paths the CUDA backend uses (minfer/backends/cuda/memory.py: StagingRing,
Readback). Exits 1 when the kernel disagrees with the reference.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import minfer_kernels as mk

BLOCK = 256  # launch_silu_f32's threads per block (csrc/kernels/elementwise.cu)
BOUND = 1e-6  # the relative error test_kernels_elementwise.py holds silu_f32 to


def run(n: int, stream: mk.Stream) -> bool:
    """SiLU of n values from -8 to 8 on the GPU; prints the grid and the worst relative error."""
    x = np.linspace(-8.0, 8.0, n, dtype=np.float32)
    staging, readback = mk.PinnedBuffer(x.nbytes), mk.PinnedBuffer(x.nbytes)
    device = mk.DeviceBuffer(x.nbytes)  # held in a variable: the kernel gets only its address
    staging_view = staging.numpy().view(np.float32)
    staging_view[:] = x
    device.copy_from_host_async(staging_view, stream.handle)  # returns at once: pinned memory, same stream
    mk.kernels.silu_f32(device.ptr, n, stream.handle)  # enqueued after the copy on the same stream
    result = readback.numpy().view(np.float32)
    device.copy_to_host_async(result, stream.handle)
    mk.sync(stream.handle)  # the drain point: any error of the copies or the kernel surfaces here

    grid = (n + BLOCK - 1) // BLOCK
    reference = x / (1.0 + np.exp(-x.astype(np.float64)))
    error = np.abs(result - reference) / np.maximum(np.abs(reference), 1e-30)
    worst = int(np.argmax(error))
    passed = bool(error[worst] <= BOUND)
    print(f"n={n} block={BLOCK} grid={grid}: {grid * BLOCK} threads, {grid * BLOCK - n} idle")
    print(
        f"worst at x={x[worst]:.6f}: gpu={result[worst]:.7f} | max relative error {error[worst]:.3e} "
        f"(bound {BOUND:g}) {'PASS' if passed else 'FAIL'}"
    )
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[4864, 896], help="element counts (default: 4864 896)")
    args = parser.parse_args()
    if mk.device_count() == 0:
        print(f"no GPU: {mk.unavailable_reason()}", file=sys.stderr)
        return 1
    stream = mk.Stream()
    results = [run(n, stream) for n in args.sizes]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
