"""The numpy reference backend: every op written as plainly as numpy allows.

This backend is the quality model: the CUDA kernels are tested against it, and
it is tested against an implementation no one here wrote (HF transformers).
Weights are dequantized to float32 once at load; activations live in the
buffers the liveness allocator planned, and in-place ops honour the alias rule.
The KV cache holds the graph's cache type (float32, or float16 for -ctk f16).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from minfer.backends.base import (
    Backend,
    CompiledGraph,
    LoadProgress,
    ProgressCallback,
    check_states_fit,
    checked_inputs,
)
from minfer.errors import BackendError
from minfer.gguf_file import GGUFFile
from minfer.graph.alloc import BufferPlan
from minfer.graph.ir import Graph, Node, Op, Tensor, TensorKind
from minfer.quants import dequantize


def physical_memory_bytes() -> int | None:
    """The machine's RAM in bytes, or None where the OS does not tell (os.sysconf is POSIX only)."""
    try:
        nbytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return nbytes if nbytes > 0 else None


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """Each run of len(weight) values of x normalised and scaled by weight: a row, or each head of a row."""
    runs, out_runs = x.reshape(-1, weight.shape[0]), out.reshape(-1, weight.shape[0])
    mean_square = np.mean(np.square(runs, dtype=np.float32), axis=-1, keepdims=True)
    np.multiply(runs, 1.0 / np.sqrt(mean_square + eps), out=out_runs)
    out_runs *= weight


def rope_inplace(
    x: np.ndarray,
    positions: np.ndarray,
    n_heads: int,
    head_dim: int,
    rope_dim: int,
    inv_freq: np.ndarray,
    mscale: float,
    neox: bool,
) -> None:
    """Rotate pair i of the first `rope_dim` values of every head by position * inv_freq[i], the rotation's
    cos and sin scaled by `mscale` (models/rope.py computes both, RoPE scaling included).

    The llama layout pairs adjacent values (2i, 2i+1); NeoX pairs i with i + rope_dim/2.
    """
    heads = x.reshape(x.shape[0], n_heads, head_dim)
    half = rope_dim // 2
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos = (np.cos(angles) * mscale).astype(np.float32)[:, None, :]
    sin = (np.sin(angles) * mscale).astype(np.float32)[:, None, :]
    if neox:
        first, second = heads[..., :half], heads[..., half:rope_dim]
    else:
        first, second = heads[..., 0:rope_dim:2], heads[..., 1:rope_dim:2]
    a, b = first.copy(), second.copy()
    first[...] = a * cos - b * sin
    second[...] = a * sin + b * cos


def attention(
    q: np.ndarray,
    cache_k: np.ndarray,
    cache_v: np.ndarray,
    positions: np.ndarray,
    kv_len: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    scale: float,
    window: int,
    out: np.ndarray,
) -> None:
    """Grouped-query attention over cache rows [0, kv_len); query t sees keys at positions <= positions[t],
    and with a sliding `window` (0: none) only the last `window` of them: a key is hidden once
    positions[t] - row >= window (llama.cpp's is_masked_swa, transformers' sliding mask)."""
    n = q.shape[0]
    group = n_heads // n_kv_heads
    queries = q.reshape(n, n_kv_heads, group, head_dim)
    # An f16 cache's rows are widened to float32 here, only those read (the sums are float32 whatever the cache).
    keys = cache_k[:kv_len].astype(np.float32, copy=False).reshape(kv_len, n_kv_heads, head_dim)
    values = cache_v[:kv_len].astype(np.float32, copy=False).reshape(kv_len, n_kv_heads, head_dim)
    scores = np.einsum("nkgd,tkd->kgnt", queries, keys) * np.float32(scale)
    distance = positions[:, None] - np.arange(kv_len)[None, :]  # [n, kv_len]
    hidden = (distance < 0) | (distance >= window) if window else distance < 0
    scores[..., hidden] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out.reshape(n, n_kv_heads, group, head_dim)[...] = np.einsum("kgnt,tkd->nkgd", scores, values)


class CpuCompiledGraph(CompiledGraph):
    """A graph bound to numpy arrays: every array a node reads and writes is resolved once, here, so running
    is a loop over prepared calls (the per-node lookups cost as much as a small decode op's arithmetic)."""

    def __init__(self, backend: CpuBackend, graph: Graph, plan: BufferPlan) -> None:
        self.backend = backend
        self.graph = graph
        self.plan = plan
        backend.weights.update(graph.constants)  # the weight store holds them, as the file's tensors
        self.slots = [np.empty(nbytes, dtype=np.uint8) for nbytes in plan.slot_nbytes]
        self.inputs = {name: np.zeros(t.shape, dtype=np.int32) for name, t in graph.inputs.items()}
        self.steps = [self.prepare(node) for node in graph.nodes]

    def array(self, tensor: Tensor) -> np.ndarray:
        stored = self.storage(tensor)
        if tensor.kind is TensorKind.ACTIVATION:  # a slot is raw bytes, shared by tensors of one size
            return stored[: tensor.nbytes].view(tensor.dtype).reshape(tensor.shape)
        return stored

    def prepare(self, node: Node) -> CpuStep:
        ins = [self.array(t) for t in node.inputs]
        out = self.array(node.output) if node.output is not None else None
        staged = ins[node.inplace_input] if self.plan.stages(node) else None  # the alias rule's copy
        return CpuStep(OPS[node.op], node, ins, out, staged)

    def run(self, inputs: dict[str, np.ndarray]) -> None:
        for name, value in checked_inputs("cpu", self.graph, inputs).items():
            self.inputs[name][...] = value
        # No floating-point warnings: an overflow can be harmless (silu's exp(-x) of a very negative x gives
        # x / inf = -0, its right value), and NaN or Inf that reach the logits are a NumericalError where the
        # next token is picked, which warnings on stderr would only repeat.
        with np.errstate(all="ignore"):
            for step in self.steps:
                if step.staged is not None:
                    np.copyto(step.out, step.staged)
                step.op(self, step.node, step.ins, step.out)

    def read(self, tensor: Tensor) -> np.ndarray:
        return np.array(self.array(tensor), dtype=np.float32)

    # One method per op; `out` already holds the in-place operand where the op has one (the alias rule).
    def embed(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        table, tokens = ins
        np.take(table, tokens, axis=0, out=out)

    def rms_norm(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        rms_norm(ins[0], ins[1], node.params["eps"], out)

    def matmul(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        np.matmul(ins[0], ins[1].T, out=out)

    def add_bias(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out += ins[1]

    def rope(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        p = node.params
        _, positions, inv_freq = ins
        rope_inplace(out, positions, p["n_heads"], p["head_dim"], p["rope_dim"], inv_freq, p["mscale"], p["neox"])

    def kv_store(self, node: Node, ins: list[np.ndarray], out: None) -> None:
        k, v, positions = ins
        cache_k, cache_v = (self.array(t) for t in node.writes)
        cache_k[positions] = k  # into an f16 cache, numpy rounds each value to the nearest float16 (ties to even)
        cache_v[positions] = v

    def attention(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        q, cache_k, cache_v, positions, kv_len = ins
        p = node.params
        attention(
            q, cache_k, cache_v, positions, int(kv_len[0]), p["n_heads"], p["n_kv_heads"], p["head_dim"],
            p["scale"], p["window"], out,
        )  # fmt: skip

    def add(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out += ins[1 - node.inplace_input]

    def scale(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out *= np.float32(node.params["factor"])

    def silu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out /= 1.0 + np.exp(-out)

    def gelu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out[...] = 0.5 * out * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (out + np.float32(0.044715) * out**3)))

    def softcap(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        cap = np.float32(node.params["cap"])
        out[...] = cap * np.tanh(out / cap)

    def slice(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        start = node.params["start"]
        out[...] = ins[0][:, start : start + out.shape[1]]

    def mul(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out *= ins[1 - node.inplace_input]

    def last_row(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out[...] = ins[0][-1:]


CpuOp = Callable[[CpuCompiledGraph, Node, list[np.ndarray], np.ndarray | None], None]


@dataclass(frozen=True)
class CpuStep:
    """One node's prepared call: its op's method, and the arrays it reads, writes and stages."""

    op: CpuOp
    node: Node
    ins: list[np.ndarray]
    out: np.ndarray | None
    staged: np.ndarray | None


OPS: dict[Op, CpuOp] = {
    Op.EMBED: CpuCompiledGraph.embed,
    Op.RMS_NORM: CpuCompiledGraph.rms_norm,
    Op.MATMUL: CpuCompiledGraph.matmul,
    Op.ADD_BIAS: CpuCompiledGraph.add_bias,
    Op.ROPE: CpuCompiledGraph.rope,
    Op.KV_STORE: CpuCompiledGraph.kv_store,
    Op.ATTENTION: CpuCompiledGraph.attention,
    Op.ADD: CpuCompiledGraph.add,
    Op.SCALE: CpuCompiledGraph.scale,
    Op.SILU: CpuCompiledGraph.silu,
    Op.GELU: CpuCompiledGraph.gelu,
    Op.MUL: CpuCompiledGraph.mul,
    Op.SOFTCAP: CpuCompiledGraph.softcap,
    Op.SLICE: CpuCompiledGraph.slice,
    Op.LAST_ROW: CpuCompiledGraph.last_row,
}


class CpuBackend(Backend):
    name = "cpu"
    device_name = "CPU (numpy)"

    def __init__(self) -> None:
        self.weights: dict[str, np.ndarray] = {}
        self.states: dict[str, np.ndarray] = {}

    def supports(self, op: enum.Enum) -> bool:
        return op in OPS

    def load_weights(self, gguf: GGUFFile, names: list[str], progress: ProgressCallback | None = None) -> None:
        report = LoadProgress(gguf, names, progress)
        for name in names:
            self.weights[name] = dequantize(gguf.tensor(name))
            report.loaded(name)

    def weight_nbytes(self, name: str) -> int:
        return self.weights[name].nbytes  # float32: the weights were dequantized at load

    def holds(self, state: Tensor) -> bool:
        """Whether `state` is allocated already, of its shape and dtype."""
        held = self.states.get(state.name)
        return held is not None and held.shape == state.shape and held.dtype == state.dtype

    def allocate_states(self, states: list[Tensor]) -> None:
        new = [t for t in states if not self.holds(t)]
        memory = physical_memory_bytes()
        if memory is not None:  # where the OS does not say, the allocation below is the only check
            check_states_fit(self.name, new, memory, "the machine's physical memory")
        try:
            for tensor in new:
                self.states[tensor.name] = np.zeros(tensor.shape, dtype=tensor.dtype)
        except MemoryError:
            needed = sum(t.nbytes for t in new)
            raise BackendError(
                f"cpu: out of memory allocating the KV cache for --ctx-size {new[0].shape[0]} ({needed} bytes): "
                "lower --ctx-size"
            ) from None

    def compile(self, graph: Graph, plan: BufferPlan) -> CpuCompiledGraph:
        return CpuCompiledGraph(self, graph, plan)
