"""The liveness allocator: which scratch buffer each activation lives in.

Walking the nodes in execution order, an activation takes a buffer when its
producer runs and gives it back after its last reader. A freed buffer is reused
only by a tensor of exactly the same size, so a backend's pool never resizes.

The alias rule: an in-place op (ROPE, ADD_BIAS, SWIGLU, ADD) may produce its
output in its input's buffer only when that input is an activation, this node
is its *sole* consumer, and both nodes run on the same backend. Otherwise the
output gets a buffer of its own and the backend stages a copy of the input into
it before running the op in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.graph.ir import Graph, TensorKind


@dataclass(frozen=True)
class BufferPlan:
    slot_of: dict[str, int]  # activation name -> buffer slot
    slot_nbytes: list[int]  # bytes of each slot
    aliased: frozenset[str]  # nodes whose output shares the buffer of their in-place input

    @property
    def total_nbytes(self) -> int:
        return sum(self.slot_nbytes)


def plan_buffers(graph: Graph, backend_of: dict[str, str]) -> BufferPlan:
    """Place every activation of `graph`; `backend_of` maps node names to their assigned backend."""
    consumers = graph.consumers()
    producer_backend: dict[str, str] = {}
    last_use: dict[str, int] = {}
    for name, readers in consumers.items():
        last_use[name] = max(readers)
    kept_alive = {t.name for t in graph.outputs.values()}

    slot_of: dict[str, int] = {}
    slot_nbytes: list[int] = []
    free_by_size: dict[int, list[int]] = {}
    aliased: set[str] = set()

    def release(tensor_name: str) -> None:
        slot = slot_of[tensor_name]
        free_by_size.setdefault(slot_nbytes[slot], []).append(slot)

    for index, node in enumerate(graph.nodes):
        handed_over = None  # the input whose buffer this node's output takes over
        output = node.output
        if output is not None:
            backend = backend_of[node.name]
            source = node.inputs[node.inplace_input] if node.inplace_input is not None else None
            if (
                source is not None
                and source.kind is TensorKind.ACTIVATION
                and consumers.get(source.name) == [index]
                and producer_backend.get(source.name) == backend
                and source.nbytes == output.nbytes
                and source.name not in kept_alive
            ):
                slot_of[output.name] = slot_of[source.name]
                aliased.add(node.name)
                handed_over = source.name
            else:
                free = free_by_size.get(output.nbytes)
                if free:
                    slot_of[output.name] = free.pop()
                else:
                    slot_of[output.name] = len(slot_nbytes)
                    slot_nbytes.append(output.nbytes)
            producer_backend[output.name] = backend
            if output.name not in consumers and output.name not in kept_alive:
                release(output.name)  # produced but never read: nothing to keep
        for name in {t.name for t in node.inputs if t.kind is TensorKind.ACTIVATION}:
            if last_use[name] == index and name not in kept_alive and name != handed_over:
                release(name)
    return BufferPlan(slot_of, slot_nbytes, frozenset(aliased))
