"""What a backend provides to the scheduler.

A backend owns three kinds of memory: the weight store (every model tensor,
uploaded once at load), the state (the persistent per-layer K/V cache), and
per-graph scratch laid out by the liveness allocator. `lower` rewrites a model's
graph of primitive ops into the graph the backend runs (its own fused ops);
`compile` binds that graph to the memory; the result runs it as many times as
the engine asks.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from minfer.errors import BackendError, NumericalError
from minfer.gguf_file import GGUFFile
from minfer.graph.alloc import BufferPlan
from minfer.graph.ir import Graph, Tensor, TensorKind

# Called as progress(done_bytes, total_bytes) while weights load.
ProgressCallback = Callable[[int, int], None]


class CompiledGraph(ABC):
    """One graph bound to a backend's buffers, ready to run.

    Every tensor lives in one of five stores, by its kind (`storage`): the scratch slot the buffer plan
    gave an activation, the backend's weights, states and constants, or this graph's inputs.
    """

    slots: list
    inputs: dict
    plan: BufferPlan
    backend: Backend

    def storage(self, tensor: Tensor) -> object:
        """The backend's object holding `tensor` (a numpy array on the CPU, a device buffer on the GPU)."""
        if tensor.kind is TensorKind.ACTIVATION:
            return self.slots[self.plan.slot_of[tensor.name]]
        if tensor.kind is TensorKind.WEIGHT or tensor.kind is TensorKind.CONSTANT:
            return self.backend.weights[tensor.name]
        if tensor.kind is TensorKind.STATE:
            return self.backend.states[tensor.name]
        return self.inputs[tensor.name]

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> None:
        """Execute every node; `inputs` maps the graph's input names to int32 arrays."""

    @abstractmethod
    def read(self, tensor: Tensor) -> np.ndarray:
        """A host copy of an output tensor (float32)."""

    def argmax(self, tensor: Tensor) -> int:
        """Index of the largest value of a one-row output (greedy decoding); NumericalError if it holds NaN or Inf
        (numpy's argmax would return the first NaN as if it were the largest value)."""
        row = self.read(tensor)[0]
        if not np.isfinite(row).all():
            raise NumericalError(f"non-finite values (NaN or Inf) in '{tensor.name}'")
        return int(np.argmax(row))

    def greedy_steps(self, logits: Tensor, inputs: dict[str, np.ndarray], n: int) -> list[int]:
        """`n` runs of a one-token decode graph, the first on `inputs` (`tokens`, `positions`, `kv_len`), each
        next one on the argmax of the last one's `logits` row, one position further: the n picks, in order.

        A row holding NaN or Inf ends the list with -1 (the picks after it would be noise). Here each run's pick
        comes back to the host before the next runs; a backend may keep them on its device instead.
        """
        token, position = int(inputs["tokens"][0]), int(inputs["positions"][0])
        picks: list[int] = []
        for step in range(n):
            at = position + step
            self.run({"tokens": np.array([token]), "positions": np.array([at]), "kv_len": np.array([at + 1])})
            try:
                token = self.argmax(logits)
            except NumericalError:
                return [*picks, -1]
            picks.append(token)
        return picks

    def release(self) -> None:  # noqa: B027 (most backends have nothing to give back)
        """Give scratch memory back to the backend: the graph will not run again."""


def checked_inputs(backend: str, graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's inputs as int32 arrays of the shapes it was built for, or a BackendError naming the input."""
    checked = {}
    for name, tensor in graph.inputs.items():
        if name not in inputs:
            raise BackendError(f"{backend}: input '{name}' is missing (the graph reads {', '.join(graph.inputs)})")
        try:
            value = np.asarray(inputs[name], dtype=np.int32)
        except (OverflowError, TypeError, ValueError) as exc:
            raise BackendError(f"{backend}: input '{name}' is not int32 data ({exc})") from None
        if value.shape != tensor.shape:
            raise BackendError(f"{backend}: input '{name}' has shape {value.shape}, the graph expects {tensor.shape}")
        checked[name] = value
    return checked


def check_states_fit(backend: str, states: list[Tensor], available: int, memory: str) -> None:
    """Refuse, before allocating it, a K/V cache larger than `available` bytes (`memory` says what those are).

    The caches are [n_ctx][kv_dim] per layer, so their size grows with the context size the user chose.
    """
    needed = sum(tensor.nbytes for tensor in states)
    if states and needed > available:
        raise BackendError(
            f"{backend}: the KV cache for --ctx-size {states[0].shape[0]} needs {needed} bytes "
            f"({needed / 2**30:.1f} GiB) but {memory} is {available} bytes ({available / 2**30:.1f} GiB): "
            "lower --ctx-size"
        )


class LoadProgress:
    """Counts the bytes of the file tensors a backend has loaded and reports them to a ProgressCallback."""

    def __init__(self, gguf: GGUFFile, names: list[str], callback: ProgressCallback | None) -> None:
        self.gguf = gguf
        self.callback = callback
        self.total = sum(gguf.tensor(name).nbytes for name in names)
        self.done = 0

    def loaded(self, name: str) -> None:
        self.done += self.gguf.tensor(name).nbytes
        if self.callback is not None:
            self.callback(self.done, self.total)


class Backend(ABC):
    name: str
    device_name: str

    @abstractmethod
    def supports(self, op: enum.Enum) -> bool: ...

    def lower(self, graph: Graph) -> Graph:
        """The graph this backend runs for a model's graph: the same math, in the ops it implements best
        (the CUDA backend's fused ops). The identity by default: every backend runs the primitive ops."""
        return graph

    @abstractmethod
    def load_weights(self, gguf: GGUFFile, names: list[str], progress: ProgressCallback | None = None) -> None:
        """Make every named tensor of `gguf` available to the kernels, under its name."""

    @abstractmethod
    def weight_nbytes(self, name: str) -> int:
        """Bytes this backend holds for the loaded weight `name`, in the form its kernels read: what one pass
        over the whole weight reads from memory (the bench's weight traffic per token)."""

    @abstractmethod
    def allocate_states(self, states: list[Tensor]) -> None:
        """Create the persistent state tensors (K/V cache) once; later calls with the same tensors are no-ops."""

    @abstractmethod
    def compile(self, graph: Graph, plan: BufferPlan) -> CompiledGraph: ...

    def op_timing_report(self) -> str | None:
        """A per-op timing table when the backend measured one (MINFER_OP_TIMING=1), else None."""
        return None
