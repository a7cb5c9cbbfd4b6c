"""Device and pinned memory of the CUDA backend: weights, scratch, input staging, read-back.

Pointers cross into kernels as plain ints, which do not keep a buffer alive: every
buffer here is owned by an object that lives at least as long as any launch or
captured graph that uses its address (docs/GPU_SAFETY.md, rule 6).
"""

from __future__ import annotations

import numpy as np

import minfer_kernels as mk
from minfer.errors import BackendError


def allocate(nbytes: int, what: str) -> mk.DeviceBuffer:
    """A device buffer, or a BackendError naming what it was for when the device is out of memory."""
    try:
        return mk.DeviceBuffer(max(nbytes, 1))
    except mk.CudaError as exc:
        if exc.name == "cudaErrorMemoryAllocation":
            free, total = mk.mem_info()
            raise BackendError(
                f"cuda: out of device memory for {what} ({nbytes} bytes; {free} of {total} bytes free)"
            ) from None
        raise


class WeightRegistry:
    """The single owner of device weights, registered by name in their raw GGUF bytes.

    Registering a name again with the same size reuses its buffer (same address, so captured graphs
    stay valid). With a different size the old buffer is retired, not freed: a captured graph may still
    point at it, and freeing it would be a use-after-free on the next replay. That is a deliberate,
    bounded leak — at most one old buffer per replacement, counted in `retired_bytes`.
    """

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.buffers: dict[str, mk.DeviceBuffer] = {}
        self.retired: list[mk.DeviceBuffer] = []

    def __contains__(self, name: str) -> bool:
        return name in self.buffers

    def __getitem__(self, name: str) -> mk.DeviceBuffer:
        return self.buffers[name]

    @property
    def retired_bytes(self) -> int:
        return sum(b.nbytes for b in self.retired)

    def register(self, name: str, data: np.ndarray) -> mk.DeviceBuffer:
        """Upload `data` (a contiguous byte view of the GGUF tensor) under `name`; returns its buffer."""
        data = data.reshape(-1).view(np.uint8)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.nbytes != data.nbytes:
            if buffer is not None:
                self.retired.append(buffer)
            buffer = allocate(data.nbytes, f"weight '{name}'")
            self.buffers[name] = buffer
        buffer.copy_from_host(data, self.stream)
        return buffer


class ScratchPool:
    """Activation buffers, recycled by exact size: a graph's plan never needs a buffer to grow."""

    def __init__(self) -> None:
        self.free: dict[int, list[mk.DeviceBuffer]] = {}

    def acquire(self, nbytes: int, what: str) -> mk.DeviceBuffer:
        spare = self.free.get(nbytes)
        return spare.pop() if spare else allocate(nbytes, what)

    def release(self, buffers: list[mk.DeviceBuffer]) -> None:
        for buffer in buffers:
            self.free.setdefault(buffer.nbytes, []).append(buffer)


class StagingRing:
    """Pinned slots for host-to-device input copies that return at once.

    Each copy is enqueued on the backend's stream before the kernels that read it, so same-stream
    ordering makes it safe (rule 7). A slot is reused only after the event recorded behind its last
    copy has completed, so the host never overwrites bytes a pending copy has not read yet.
    """

    def __init__(self, stream: int, slots: int = 8, slot_bytes: int = 1 << 16) -> None:
        self.stream = stream
        self.slots = [mk.PinnedBuffer(slot_bytes) for _ in range(slots)]
        self.events = [mk.Event(timing=False) for _ in range(slots)]
        self.used = [False] * slots
        self.next = 0

    def upload(self, target: mk.DeviceBuffer, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        index = self.next
        slot = self.slots[index]
        if data.nbytes > slot.nbytes:
            target.copy_from_host(data, self.stream)  # larger than a slot: a plain stream-ordered copy
            return
        if self.used[index]:
            self.events[index].synchronize()
        view = slot.numpy()[: data.nbytes]
        view[:] = data
        target.copy_from_host_async(view, self.stream)
        self.events[index].record(self.stream)
        self.used[index] = True
        self.next = (index + 1) % len(self.slots)


class Readback:
    """A pinned buffer, grown on demand, through which results come back to the host."""

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.buffer = mk.PinnedBuffer(1 << 12)

    def read(self, source: mk.DeviceBuffer, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if nbytes > self.buffer.nbytes:
            self.buffer = mk.PinnedBuffer(nbytes)
        view = self.buffer.numpy()[:nbytes]
        source.copy_to_host_async(view, self.stream)
        mk.sync(self.stream)  # the drain point: also where a fault of any earlier kernel surfaces
        return view.view(dtype).reshape(shape).copy()
