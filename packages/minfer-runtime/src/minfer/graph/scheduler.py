"""The scheduler: assign every node a backend before anything runs, plan memory, execute.

Assignment is decided up front and never changes at run time: if the chosen
backend cannot run a node, scheduling fails with the node's name — there is no
silent fallback to another backend. The whole graph then forms one split on
that backend, so a step synchronizes once, at its end.
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
    """A graph scheduled on a backend: run it, then read its outputs."""

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

    def release(self) -> None:
        self.compiled.release()


def assign_backends(graph: Graph, backend: Backend) -> dict[str, str]:
    """Node name -> backend name, refusing the first node the backend cannot run."""
    for node in graph.nodes:
        if not backend.supports(node.op):
            raise BackendError(f"{backend.name}: {node.name}: op '{node.op.value}' is not supported by this backend")
    return {node.name: backend.name for node in graph.nodes}


def schedule(graph: Graph, backend: Backend) -> Program:
    plan = plan_buffers(graph, assign_backends(graph, backend))
    backend.allocate_states(graph.states())
    return Program(graph, backend, plan, backend.compile(graph, plan))
