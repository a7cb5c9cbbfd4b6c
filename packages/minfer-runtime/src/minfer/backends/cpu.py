"""The numpy reference backend: every op written as plainly as numpy allows.

This backend is the quality model: the CUDA kernels are tested against it, and
it is tested against an implementation no one here wrote (HF transformers).
Weights are dequantized to float32 once at load; activations live in the
buffers the liveness allocator planned, and in-place ops honour the alias rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable

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
    mean_square = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    np.multiply(x, 1.0 / np.sqrt(mean_square + eps), out=out)
    out *= weight


def normalized(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm into a new array: the input of the fused ops' matmul."""
    out = np.empty_like(x)
    rms_norm(x, weight, eps, out)
    return out


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
    out: np.ndarray,
) -> None:
    """Grouped-query attention over cache rows [0, kv_len); query t sees keys at positions <= positions[t]."""
    n = q.shape[0]
    group = n_heads // n_kv_heads
    queries = q.reshape(n, n_kv_heads, group, head_dim)
    keys = cache_k[:kv_len].reshape(kv_len, n_kv_heads, head_dim)
    values = cache_v[:kv_len].reshape(kv_len, n_kv_heads, head_dim)
    scores = np.einsum("nkgd,tkd->kgnt", queries, keys) / np.float32(np.sqrt(head_dim))
    future = np.arange(kv_len)[None, :] > positions[:, None]  # [n, kv_len]
    scores[..., future] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out.reshape(n, n_kv_heads, group, head_dim)[...] = np.einsum("kgnt,tkd->nkgd", scores, values)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class CpuCompiledGraph(CompiledGraph):
    def __init__(self, backend: CpuBackend, graph: Graph, plan: BufferPlan) -> None:
        self.backend = backend
        self.graph = graph
        self.plan = plan
        self.slots = [np.empty(nbytes, dtype=np.uint8) for nbytes in plan.slot_nbytes]
        self.inputs: dict[str, np.ndarray] = {}

    def array(self, tensor: Tensor) -> np.ndarray:
        if tensor.kind is TensorKind.ACTIVATION:
            slot = self.slots[self.plan.slot_of[tensor.name]]
            return slot[: tensor.nbytes].view(tensor.dtype).reshape(tensor.shape)
        if tensor.kind is TensorKind.WEIGHT:
            return self.backend.weights[tensor.name]
        if tensor.kind is TensorKind.STATE:
            return self.backend.states[tensor.name]
        if tensor.kind is TensorKind.CONSTANT:
            return self.graph.constants[tensor.name]
        return self.inputs[tensor.name]

    def run(self, inputs: dict[str, np.ndarray]) -> None:
        self.inputs = checked_inputs("cpu", self.graph, inputs)
        # No floating-point warnings: an overflow can be harmless (silu's exp(-x) of a very negative x gives
        # x / inf = -0, its right value), and NaN or Inf that reach the logits are a NumericalError where the
        # next token is picked, which warnings on stderr would only repeat.
        with np.errstate(all="ignore"):
            for node in self.graph.nodes:
                self.execute(node)

    def execute(self, node: Node) -> None:
        ins = [self.array(t) for t in node.inputs]
        out = self.array(node.output) if node.output is not None else None
        if node.inplace_input is not None and node.name not in self.plan.aliased:
            # Alias rule: the allocator gave the output its own buffer, so stage the input there first.
            np.copyto(out, ins[node.inplace_input])
        OPS[node.op](self, node, ins, out)

    def read(self, tensor: Tensor) -> np.ndarray:
        return np.array(self.array(tensor), dtype=np.float32)

    # One method per op; `out` already holds the in-place operand where the op has one.
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
        cache_k[positions] = k
        cache_v[positions] = v

    def attention(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        q, cache_k, cache_v, positions, kv_len = ins
        p = node.params
        attention(q, cache_k, cache_v, positions, int(kv_len[0]), p["n_heads"], p["n_kv_heads"], p["head_dim"], out)

    def add(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out += ins[1 - node.inplace_input]

    def swiglu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out[...] = silu(out) * ins[1]

    def last_row(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out[...] = ins[0][-1:]

    # The fused ops: each the composition of the ops above that its Op comment names.
    def norm_matmul(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        x, norm_weight, weight = ins
        np.matmul(normalized(x, norm_weight, node.params["eps"]), weight.T, out=out)

    def matmul_add(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out += ins[0] @ ins[1].T  # out holds the residual (ins[2]), in place or staged

    def norm_swiglu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        x, norm_weight, gate_up = ins
        projected = normalized(x, norm_weight, node.params["eps"]) @ gate_up.T
        d_ff = out.shape[-1]
        out[...] = silu(projected[:, :d_ff]) * projected[:, d_ff:]

    def norm_qkv_rope_store(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        x, norm_weight, qkv_weight, positions, inv_freq, *bias = ins
        p = node.params
        qkv = normalized(x, norm_weight, p["eps"]) @ qkv_weight.T
        for b in bias:
            qkv += b
        q_dim, kv_dim = out.shape[-1], p["n_kv_heads"] * p["head_dim"]
        q, k, v = (np.ascontiguousarray(part) for part in np.split(qkv, [q_dim, q_dim + kv_dim], axis=-1))
        rope = (p["head_dim"], p["rope_dim"], inv_freq, p["mscale"], p["neox"])
        rope_inplace(q, positions, p["n_heads"], *rope)
        rope_inplace(k, positions, p["n_kv_heads"], *rope)
        self.kv_store(node, [k, v, positions], None)
        out[...] = q


OPS: dict[Op, Callable[[CpuCompiledGraph, Node, list[np.ndarray], np.ndarray | None], None]] = {
    Op.EMBED: CpuCompiledGraph.embed,
    Op.RMS_NORM: CpuCompiledGraph.rms_norm,
    Op.MATMUL: CpuCompiledGraph.matmul,
    Op.ADD_BIAS: CpuCompiledGraph.add_bias,
    Op.ROPE: CpuCompiledGraph.rope,
    Op.KV_STORE: CpuCompiledGraph.kv_store,
    Op.ATTENTION: CpuCompiledGraph.attention,
    Op.ADD: CpuCompiledGraph.add,
    Op.SWIGLU: CpuCompiledGraph.swiglu,
    Op.LAST_ROW: CpuCompiledGraph.last_row,
    Op.NORM_MATMUL: CpuCompiledGraph.norm_matmul,
    Op.MATMUL_ADD: CpuCompiledGraph.matmul_add,
    Op.NORM_SWIGLU: CpuCompiledGraph.norm_swiglu,
    Op.NORM_QKV_ROPE_STORE: CpuCompiledGraph.norm_qkv_rope_store,
}


class CpuBackend(Backend):
    name = "cpu"
    device_name = "CPU (numpy)"

    def __init__(self) -> None:
        self.weights: dict[str, np.ndarray] = {}
        self.states: dict[str, np.ndarray] = {}

    def supports(self, op: Op) -> bool:
        return op in OPS

    def load_weights(
        self,
        gguf: GGUFFile,
        names: list[str],
        progress: ProgressCallback | None = None,
        *,
        stacked: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        report = LoadProgress(gguf, names, progress)
        in_a_stack = set()
        for name, parts in (stacked or {}).items():
            # Dequantized once, stacked; the parts are views of its rows, so nothing is held twice. The parts
            # may be of different types (Q4_K_M stores attn_v with more bits than attn_q): float32 either way.
            values = self.weights[name] = np.concatenate([dequantize(gguf.tensor(part)) for part in parts])
            first_row = 0
            for part in parts:
                rows = gguf.tensor(part).shape[-1]
                self.weights[part] = values[first_row : first_row + rows]
                first_row += rows
                in_a_stack.add(part)
                report.loaded(part)
        for name in names:
            if name not in in_a_stack:
                self.weights[name] = dequantize(gguf.tensor(name))
                report.loaded(name)

    def weight_nbytes(self, name: str) -> int:
        return self.weights[name].nbytes  # float32: the weights were dequantized at load

    def allocate_states(self, states: list[Tensor]) -> None:
        new = [t for t in states if t.name not in self.states or self.states[t.name].shape != t.shape]
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
