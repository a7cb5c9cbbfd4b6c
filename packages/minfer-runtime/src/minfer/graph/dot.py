"""Graphviz export: one box per node, one shape per weight, input, state and constant tensor."""

from __future__ import annotations

from minfer.graph.alloc import BufferPlan
from minfer.graph.ir import Graph, TensorKind

TENSOR_STYLE = {
    TensorKind.INPUT: 'shape=ellipse, style=filled, fillcolor="#d8e8ff"',
    TensorKind.WEIGHT: 'shape=ellipse, style=filled, fillcolor="#eeeeee"',
    TensorKind.STATE: 'shape=cylinder, style=filled, fillcolor="#ffe9c6"',
    TensorKind.CONSTANT: 'shape=note, style=filled, fillcolor="#e4f5e0"',
}


def _quote(text: str) -> str:
    return '"' + text.replace('"', r"\"") + '"'


def to_dot(graph: Graph, plan: BufferPlan | None = None) -> str:
    """The graph as DOT text; with a buffer plan, each node shows its scratch slot (and * when aliased)."""
    lines = [f"digraph minfer_{graph.n_tokens}_tokens {{", "  rankdir=TB;", '  node [fontname="monospace"];']
    producer: dict[str, str] = {}
    declared: set[str] = set()
    for node in graph.nodes:
        label = f"{node.name}\\n{node.op.value}"
        for output in node.outputs:
            label += f" {list(output.shape)}"
            producer[output.name] = node.name
        if plan is not None and node.outputs:
            slots = ",".join(str(plan.slot_of[output.name]) for output in node.outputs)
            label += f"\\nslot {slots}{' *' if node.name in plan.aliased else ''}"
        lines.append(f"  {_quote('n:' + node.name)} [shape=box, label={_quote(label)}];")
        for tensor in [*node.inputs, *node.writes]:
            if tensor.kind is TensorKind.ACTIVATION:
                continue
            key = "t:" + tensor.name
            if key not in declared:
                declared.add(key)
                lines.append(f"  {_quote(key)} [{TENSOR_STYLE[tensor.kind]}, label={_quote(tensor.name)}];")
        for tensor in node.inputs:
            source = producer[tensor.name] if tensor.kind is TensorKind.ACTIVATION else None
            origin = "n:" + source if source else "t:" + tensor.name
            lines.append(f"  {_quote(origin)} -> {_quote('n:' + node.name)};")
        for tensor in node.writes:
            lines.append(f"  {_quote('n:' + node.name)} -> {_quote('t:' + tensor.name)} [style=dashed];")
    lines.append("}")
    return "\n".join(lines) + "\n"
