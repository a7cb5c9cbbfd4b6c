"""The scheduler: lower a graph for its backend, check every node before anything runs, plan memory.

The backend is chosen before anything runs and never changes at run time: if it cannot run a node,
scheduling fails with the node's name — there is no silent fallback to another backend. The whole graph
is one split on that backend, so a step synchronizes once, at its end.

    model graph (primitive ops) --Backend.lower--> the graph the backend runs --plan_buffers--> buffers
                                --Backend.compile--> a CompiledGraph, run once per step
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.backends.base import Backend, CompiledGraph
from minfer.errors import BackendError
from minfer.graph.alloc import BufferPlan, plan_buffers
from minfer.graph.ir import Graph


@dataclass
class Program:
    """A graph scheduled on a backend: run it, then read its outputs. `graph` is the lowered graph."""

    graph: Graph
    backend: Backend
    plan: BufferPlan
    compiled: CompiledGraph

    def run(self, inputs: dict[str, np.ndarray]) -> None:
        self.compiled.run(inputs)

    def read(self, output: str) -> np.ndarray:
        return self.compiled.read(self.graph.outputs[output])

    def argmax(self, output: str) -> int:
        return self.compiled.argmax(self.graph.outputs[output])

    def greedy_steps(self, output: str, inputs: dict[str, np.ndarray], n: int) -> list[int]:
        return self.compiled.greedy_steps(self.graph.outputs[output], inputs, n)

    def release(self) -> None:
        self.compiled.release()


def check_supported(graph: Graph, backend: Backend) -> None:
    """Refuse, naming it, the first node whose op the backend cannot run."""
    for node in graph.nodes:
        if not backend.supports(node.op):
            raise BackendError(f"{backend.name}: {node.name}: op '{node.op.value}' is not supported by this backend")


def schedule(graph: Graph, backend: Backend) -> Program:
    lowered = backend.lower(graph)
    check_supported(lowered, backend)
    plan = plan_buffers(lowered)
    backend.allocate_states(lowered.states())
    return Program(lowered, backend, plan, backend.compile(lowered, plan))
