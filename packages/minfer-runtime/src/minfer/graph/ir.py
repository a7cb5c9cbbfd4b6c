"""The compute graph's intermediate representation: tensors, ops and nodes.

A graph is data: a list of nodes in execution order, each reading tensors and
writing one. Nothing in it depends on *where* in the sequence the tokens sit —
positions and the KV length are input tensors that backends read at run time —
so the decode graph built once serves every step (and a GPU backend can
capture it once and replay it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class TensorKind(enum.Enum):
    INPUT = "input"  # written by the host before each execution (token ids, positions, KV length)
    WEIGHT = "weight"  # a model tensor from the GGUF, owned by the backend's weight store
    STATE = "state"  # persistent across executions: the per-layer K/V cache regions
    CONSTANT = "constant"  # values the model computes when it builds the graph (Graph.constants): the RoPE table
    ACTIVATION = "activation"  # scratch, placed by the liveness allocator


@dataclass(frozen=True, eq=False)
class Tensor:
    """A value in the graph. `shape` is numpy order (rows first, contiguous axis last)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: TensorKind

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.n_elements * np.dtype(self.dtype).itemsize


class Op(enum.Enum):
    EMBED = "embed"  # rows of a (quantized) table picked by token id
    RMS_NORM = "rms_norm"  # x / rms(x) * weight, per row
    MATMUL = "matmul"  # y[t, o] = sum_i W[o, i] x[t, i]; W stays in its GGUF format
    ADD_BIAS = "add_bias"  # in place: y[t, i] += b[i]
    ROPE = "rope"  # in place: rotary position embedding; positions from an input, frequencies from a constant
    KV_STORE = "kv_store"  # K and V rows written into the persistent cache at their positions
    ATTENTION = "attention"  # grouped-query attention over the cache, causal by position
    ADD = "add"  # in place into one operand: residual connections
    SWIGLU = "swiglu"  # in place into gate: silu(gate) * up
    LAST_ROW = "last_row"  # the final token's row: only its logits are needed
    # Fused ops: one node (one kernel on the GPU) for what the ops above do in several. The llama builder
    # emits them for one-token (decode) graphs; each is exactly the composition its comment spells out.
    NORM_MATMUL = "norm_matmul"  # matmul(rms_norm(x, g), W): the output head
    MATMUL_ADD = "matmul_add"  # in place into the residual r: r + matmul(x, W)
    NORM_SWIGLU = "norm_swiglu"  # swiglu of matmul(rms_norm(x, g), W), W = gate rows then up rows
    NORM_QKV_ROPE_STORE = "norm_qkv_rope_store"  # matmul(rms_norm(x, g), Wqkv) + b, rope on q and k, kv_store; q out


@dataclass(eq=False)
class Node:
    """One operation. `name` follows the GGUF tensor names (`blk.3.ffn_down`) so errors point at the model.

    `inplace_input` names the input whose buffer the op may overwrite to produce
    its output (the alias rule decides whether it really does); `writes` lists
    state tensors the op updates as a side effect.
    """

    name: str
    op: Op
    inputs: list[Tensor]
    output: Tensor | None
    params: dict[str, Any] = field(default_factory=dict)
    inplace_input: int | None = None
    writes: list[Tensor] = field(default_factory=list)


@dataclass
class Graph:
    """Nodes in execution order, the tensors a caller provides or reads, and the values of the constants."""

    n_tokens: int
    nodes: list[Node]
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # CONSTANT tensor name -> its values

    def weights(self) -> list[Tensor]:
        return self._tensors_of_kind(TensorKind.WEIGHT)

    def states(self) -> list[Tensor]:
        seen: dict[str, Tensor] = {}
        for node in self.nodes:
            for tensor in [*node.inputs, *node.writes]:
                if tensor.kind is TensorKind.STATE:
                    seen.setdefault(tensor.name, tensor)
        return list(seen.values())

    def _tensors_of_kind(self, kind: TensorKind) -> list[Tensor]:
        seen: dict[str, Tensor] = {}
        for node in self.nodes:
            for tensor in node.inputs:
                if tensor.kind is kind:
                    seen.setdefault(tensor.name, tensor)
        return list(seen.values())

    def consumers(self) -> dict[str, list[int]]:
        """For every tensor name, the indices of the nodes that read it."""
        readers: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for tensor in node.inputs:
                readers.setdefault(tensor.name, []).append(index)
        return readers
