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
    """The primitive ops a model's graph is made of. Backends may rewrite a graph into ops of their own
    (`Backend.lower`: the CUDA backend's fused ops, backends/cuda/fuse.py), never the model."""

    EMBED = "embed"  # rows of a (quantized) table picked by token id
    RMS_NORM = "rms_norm"  # x / rms(x) * weight over each run of len(weight) values: a row, or a head of one
    MATMUL = "matmul"  # y[t, o] = sum_i W[o, i] x[t, i]; W stays in its GGUF format
    ADD_BIAS = "add_bias"  # in place: y[t, i] += b[i]
    ROPE = "rope"  # in place: rotary position embedding; positions from an input, frequencies from a constant
    KV_STORE = "kv_store"  # K and V rows written into the persistent cache at their positions
    ATTENTION = "attention"  # grouped-query attention over the cache, causal by position (a sliding window
    #                          of the last `window` rows when it is not 0), scores `scale` * q.k
    ADD = "add"  # in place into one operand: residual connections
    SCALE = "scale"  # in place: x * factor (Gemma's embeddings times sqrt(d))
    SILU = "silu"  # in place: x * sigmoid(x)
    GELU = "gelu"  # in place: the tanh approximation of GELU (Gemma's gated FFN)
    MUL = "mul"  # in place into one operand: elementwise product (the gate of a gated FFN)
    SOFTCAP = "softcap"  # in place: cap * tanh(x / cap) (Gemma's final logits)
    SLICE = "slice"  # columns start .. start + width - 1 of every row (a fused projection's parts)
    LAST_ROW = "last_row"  # the final token's row: only its logits are needed


@dataclass(eq=False)
class Node:
    """One operation. `name` follows the GGUF tensor names (`blk.3.ffn_down`) so errors point at the model.

    `op` is an `Op`, or after a backend's lowering one of that backend's own ops (an enum too: its value is
    the op's one name). `inplace_input` names the input whose buffer the op may overwrite to produce its
    output (the alias rule decides whether it really does); `writes` lists state tensors the op updates as a
    side effect; `more_outputs` are further activations the op produces (a fused op computing several
    products at once).
    """

    name: str
    op: enum.Enum
    inputs: list[Tensor]
    output: Tensor | None
    params: dict[str, Any] = field(default_factory=dict)
    inplace_input: int | None = None
    writes: list[Tensor] = field(default_factory=list)
    more_outputs: list[Tensor] = field(default_factory=list)

    @property
    def outputs(self) -> list[Tensor]:
        return [self.output, *self.more_outputs] if self.output is not None else list(self.more_outputs)


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
