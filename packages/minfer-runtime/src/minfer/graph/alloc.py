"""The liveness allocator: which scratch buffer each activation lives in.

Walking the nodes in execution order, an activation takes a buffer when its
producer runs and gives it back after its last reader. A freed buffer is reused
only by a tensor of exactly the same size, so a backend's pool never resizes.

The alias rule: an in-place op (ROPE, ADD_BIAS, SILU, MUL, ADD, and fused ops
that declare an in-place input) produces its output in its input's buffer when
that input is an activation of the same size, this node is its *last* reader
(every earlier reader has run: a graph's nodes run in order, on one backend),
and the graph does not return it. Otherwise the output gets a buffer of its own,
and the backend stages a copy of the input into it before running the op in
place (`BufferPlan.stages`): every backend runs an in-place op on its output
buffer, whichever case the plan chose.
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.graph.ir import Graph, Node, TensorKind


@dataclass(frozen=True)
class BufferPlan:
    slot_of: dict[str, int]  # activation name -> buffer slot
    slot_nbytes: list[int]  # bytes of each slot
    aliased: frozenset[str]  # nodes whose output shares the buffer of their in-place input

    @property
    def total_nbytes(self) -> int:
        return sum(self.slot_nbytes)

    def stages(self, node: Node) -> bool:
        """Whether `node`'s in-place input must be copied into its output buffer before the op runs."""
        return node.inplace_input is not None and node.name not in self.aliased


def plan_buffers(graph: Graph) -> BufferPlan:
    """Place every activation of `graph`."""
    consumers = graph.consumers()
    last_use = {name: max(readers) for name, readers in consumers.items()}
    kept_alive = {t.name for t in graph.outputs.values()}

    slot_of: dict[str, int] = {}
    slot_nbytes: list[int] = []
    free_by_size: dict[int, list[int]] = {}
    aliased: set[str] = set()

    def take(tensor_name: str, nbytes: int) -> None:
        free = free_by_size.get(nbytes)
        if free:
            slot_of[tensor_name] = free.pop()
        else:
            slot_of[tensor_name] = len(slot_nbytes)
            slot_nbytes.append(nbytes)

    def release(tensor_name: str) -> None:
        slot = slot_of[tensor_name]
        free_by_size.setdefault(slot_nbytes[slot], []).append(slot)

    for index, node in enumerate(graph.nodes):
        handed_over = None  # the input whose buffer this node's output takes over
        source = node.inputs[node.inplace_input] if node.inplace_input is not None else None
        if (
            source is not None
            and node.output is not None
            and source.kind is TensorKind.ACTIVATION
            and last_use[source.name] == index
            and source.nbytes == node.output.nbytes
            and source.name not in kept_alive
        ):
            slot_of[node.output.name] = slot_of[source.name]
            aliased.add(node.name)
            handed_over = source.name
        for output in node.outputs:
            if output.name not in slot_of:  # an aliased output already has its slot
                take(output.name, output.nbytes)
        for output in node.outputs:
            if output.name not in consumers and output.name not in kept_alive:
                release(output.name)  # produced but never read: nothing to keep
        for name in {t.name for t in node.inputs if t.kind is TensorKind.ACTIVATION}:
            if last_use[name] == index and name not in kept_alive and name != handed_over:
                release(name)
    return BufferPlan(slot_of, slot_nbytes, frozenset(aliased))
