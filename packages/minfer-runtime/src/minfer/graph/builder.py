"""Building a graph: nodes appended in execution order, each output named after its node.

A model file (models/*.py) describes its forward pass through this builder in primitive ops (ir.Op) and
the tensors of its GGUF file; nothing here, or there, knows which backend will run it.
"""

from __future__ import annotations

from minfer.graph.ir import Node, Op, Tensor, TensorKind


class GraphBuilder:
    """Appends nodes in execution order and names their outputs after them."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def node(
        self,
        name: str,
        op: Op,
        inputs: list[Tensor],
        shape: tuple[int, ...],
        *,
        inplace_input: int | None = None,
        **params: object,
    ) -> Tensor:
        """Append `op` over `inputs`; returns its float32 output of `shape`, named `name`."""
        output = Tensor(name, shape, "float32", TensorKind.ACTIVATION)
        self.nodes.append(Node(name, op, inputs, output, dict(params), inplace_input=inplace_input))
        return output

    def effect(self, name: str, op: Op, inputs: list[Tensor], writes: list[Tensor]) -> None:
        """Append `op`, which produces no activation but updates the state tensors `writes`."""
        self.nodes.append(Node(name, op, inputs, None, writes=writes))


def weight(name: str, gguf_shape: tuple[int, ...]) -> Tensor:
    """A GGUF tensor, in numpy order (GGUF shape reversed)."""
    return Tensor(name, tuple(reversed(gguf_shape)), "float32", TensorKind.WEIGHT)
