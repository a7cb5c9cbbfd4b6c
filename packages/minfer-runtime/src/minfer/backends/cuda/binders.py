"""Binding: each node of a lowered graph to its kernel launches, every argument resolved and named.

One binder per launcher, named exactly like it (`rms_norm_f32` binds `kernels.rms_norm_f32`) and grouped
like `csrc/kernels/*.cu`. A binder checks what its kernel needs of the node and raises a BackendError naming
the node otherwise, when the graph is compiled and before anything launches. Arguments go by the launcher
parameter's name (nanobind knows every name), so a reordered C parameter cannot go unnoticed; an absent
pointer is None (nullptr on the C side).

Every op, primitive or fused, runs in place on its output buffer where it has an in-place input: the
compiled graph has staged that input there first when the buffer plan could not alias it
(BufferPlan.stages).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import minfer_kernels as mk
from minfer.backends.cuda.fuse import GEMM_GROUP_PARTS, FusedOp, WeightType, matmul_kernel
from minfer.errors import BackendError
from minfer.graph.ir import Node, Op, Tensor

MAX_DECODE_SPLITS = 256  # attention_decode_f32's limit
MAX_HEAD_DIM = 256  # the attention and rope kernels' head sizes: multiples of 32 up to this


@dataclass(frozen=True)
class Launch:
    """One prepared kernel call: the launcher and its arguments by name, pointers already resolved."""

    kernel: Callable[..., None]
    args: dict[str, object]

    def __call__(self) -> None:
        self.kernel(**self.args)


class Binding(Protocol):
    """What a binder reads of the compiled graph: where each tensor lives, and the backend's facts."""

    stream: int
    workspace: int  # the graph's one workspace (graph_workspace_bytes), its address and size
    workspace_bytes: int
    multiprocessors: int  # the GPU's SMs, which some grids are sized for

    def ptr(self, tensor: Tensor) -> int: ...

    def weight_type(self, tensor: Tensor) -> int: ...


Binder = Callable[[Binding, Node], list[Launch]]


def launch(b: Binding, kernel: Callable[..., None], /, **args: object) -> list[Launch]:
    """The one launch of `kernel` with `args`, on the backend's stream."""
    return [Launch(kernel, {**args, "stream": b.stream})]


def refuse(node: Node, reason: str) -> BackendError:
    return BackendError(f"cuda: {node.name}: {reason}")


# The KV cache dtypes the attention kernels store and read, as the GGML type id they take (kv_cache.cuh).
CACHE_TYPES = {"float32": mk.GGMLType.F32, "float16": mk.GGMLType.F16}


def cache_type(node: Node, cache_k: Tensor, cache_v: Tensor) -> int:
    """The GGML type id of the KV caches `node` stores into or reads: one type for K and V (the graph's)."""
    if cache_k.dtype not in CACHE_TYPES:
        raise refuse(node, f"KV cache {cache_k.name} is {cache_k.dtype}: the kernels store float32 or float16")
    if cache_v.dtype != cache_k.dtype:
        raise refuse(node, f"KV caches {cache_k.name} ({cache_k.dtype}) and {cache_v.name} ({cache_v.dtype}) differ")
    return int(CACHE_TYPES[cache_k.dtype])


def named_inputs(b: Binding, node: Node) -> dict[str, int]:
    """A fused node's inputs as pointers, by the launcher parameter each one is (`params["args"]`)."""
    return {name: b.ptr(tensor) for name, tensor in zip(node.params["args"], node.inputs, strict=True)}


def check_heads(node: Node) -> None:
    head_dim = node.params["head_dim"]
    if head_dim % 32 or head_dim > MAX_HEAD_DIM:
        raise refuse(node, f"head size {head_dim} is not a multiple of 32 up to {MAX_HEAD_DIM}, as the kernels need")


def rope_mode(node: Node) -> int:
    return mk.kernels.ROPE_NEOX if node.params["neox"] else mk.kernels.ROPE_NORMAL


def other_operand(node: Node) -> Tensor:
    """The input of a two-operand in-place op that is not in its output buffer; its shape must be the output's."""
    other = node.inputs[1 - node.inplace_input]
    if other.shape != node.output.shape:
        raise refuse(node, f"{node.op.value} input size mismatch ({node.inputs[0].shape} vs {node.inputs[1].shape})")
    return other


# -- elementwise.cu ----------------------------------------------------------------------------------


def add_f32(b: Binding, node: Node) -> list[Launch]:
    out = b.ptr(node.output)
    return launch(b, mk.kernels.add_f32, a=out, b=b.ptr(other_operand(node)), out=out, n=node.output.n_elements)


def mul_f32(b: Binding, node: Node) -> list[Launch]:
    out = b.ptr(node.output)
    return launch(b, mk.kernels.mul_f32, a=out, b=b.ptr(other_operand(node)), out=out, n=node.output.n_elements)


def scale_f32(b: Binding, node: Node) -> list[Launch]:
    out = b.ptr(node.output)
    return launch(b, mk.kernels.scale_f32, x=out, out=out, scale=node.params["factor"], n=node.output.n_elements)


def silu_f32(b: Binding, node: Node) -> list[Launch]:
    return launch(b, mk.kernels.silu_f32, x=b.ptr(node.output), n=node.output.n_elements)


def gelu_f32(b: Binding, node: Node) -> list[Launch]:
    return launch(b, mk.kernels.gelu_f32, x=b.ptr(node.output), n=node.output.n_elements)


def softcap_f32(b: Binding, node: Node) -> list[Launch]:
    return launch(b, mk.kernels.softcap_f32, x=b.ptr(node.output), cap=node.params["cap"], n=node.output.n_elements)


def slice_f32(b: Binding, node: Node) -> list[Launch]:
    (x,) = node.inputs
    rows, width = node.output.shape
    return launch(
        b, mk.kernels.slice_f32, x=b.ptr(x), out=b.ptr(node.output), rows=rows, width=width, in_stride=x.shape[1],
        start=node.params["start"],
    )  # fmt: skip


def gated(b: Binding, node: Node, kernel: Callable[..., None]) -> list[Launch]:
    """The launch of a gated elementwise kernel (swiglu_f32, geglu_f32: one signature, the activation differs),
    in place into the gate."""
    rows, d = node.output.shape
    gate = b.ptr(node.output)
    return launch(b, kernel, gate=gate, up=b.ptr(node.inputs[1]), out=gate, rows=rows, d=d, in_stride=d)


def swiglu_f32(b: Binding, node: Node) -> list[Launch]:
    return gated(b, node, mk.kernels.swiglu_f32)


def geglu_f32(b: Binding, node: Node) -> list[Launch]:
    return gated(b, node, mk.kernels.geglu_f32)


def add_bias_f32(b: Binding, node: Node) -> list[Launch]:
    rows, d = node.output.shape
    return launch(b, mk.kernels.add_bias_f32, y=b.ptr(node.output), bias=b.ptr(node.inputs[1]), rows=rows, d=d)


# -- norm.cu, rope.cu, embed.cu ----------------------------------------------------------------------


def rms_norm_f32(b: Binding, node: Node) -> list[Launch]:
    """Each run of len(weight) values is a row of the kernel's: a token's row, or one head of it."""
    (d,), eps = node.inputs[1].shape, node.params["eps"]
    x, weight, out = (b.ptr(t) for t in (*node.inputs, node.output))
    rows = node.output.n_elements // d
    return launch(b, mk.kernels.rms_norm_f32, x=x, weight=weight, out=out, rows=rows, d=d, eps=eps)


def rms_norm_add_f32(b: Binding, node: Node) -> list[Launch]:
    """In place: y, the residual, is in the output buffer."""
    (d,) = node.inputs[1].shape
    return launch(
        b, mk.kernels.rms_norm_add_f32, **(named_inputs(b, node) | {"y": b.ptr(node.output)}),
        rows=node.output.n_elements // d, d=d, eps=node.params["eps"],
    )  # fmt: skip


def rope_f32(b: Binding, node: Node) -> list[Launch]:
    check_heads(node)
    p = node.params
    _, positions, inv_freq = node.inputs
    return launch(
        b, mk.kernels.rope_f32, x=b.ptr(node.output), positions=b.ptr(positions), n_tokens=positions.shape[0],
        n_heads=p["n_heads"], head_dim=p["head_dim"], n_rot=p["rope_dim"], inv_freq=b.ptr(inv_freq),
        mscale=p["mscale"], mode=rope_mode(node),
    )  # fmt: skip


def embed_rows(b: Binding, node: Node) -> list[Launch]:
    table, tokens = node.inputs
    n_rows, d = table.shape
    return launch(
        b, mk.kernels.embed_rows, table=b.ptr(table), type=b.weight_type(table), ids=b.ptr(tokens),
        out=b.ptr(node.output), n_tokens=tokens.shape[0], d=d, n_rows=n_rows,
    )  # fmt: skip


# -- matmul.cu, gemm.cu, gemv.cu ---------------------------------------------------------------------


def matmul(b: Binding, node: Node) -> list[Launch]:
    """A MATMUL node runs the launcher fuse.matmul_kernel picks: gemv, gemm or matmul."""
    kernel = matmul_kernel(node)
    if kernel == "gemv":
        return gemv(b, node)
    if kernel == "gemm":
        return gemm(b, node)
    x, weight = node.inputs
    out_features, in_features = weight.shape
    return launch(
        b, mk.kernels.matmul, weight=b.ptr(weight), type=b.weight_type(weight), x=b.ptr(x), y=b.ptr(node.output),
        in_features=in_features, out_features=out_features, n_tokens=x.shape[0],
    )  # fmt: skip


def gemm_weights(node: Node) -> list[Tensor] | None:
    """The weights of a node the tensor-core GEMM runs (a group's in part order), or None for any other node."""
    if node.op in (FusedOp.GEMM, FusedOp.GEMM_GROUP):
        return [t for name, t in zip(node.params["args"], node.inputs, strict=True) if name.startswith("weight")]
    if node.op is Op.MATMUL and matmul_kernel(node) == "gemm":
        return [node.inputs[1]]
    return None


def gemm(b: Binding, node: Node) -> list[Launch]:
    """A prompt's product on the tensor cores: a MATMUL node, or a fused one with its bias and its residual add
    (in place: the residual is in the output buffer)."""
    named = named_inputs(b, node) if node.op is FusedOp.GEMM else {"x": b.ptr(node.inputs[0])}
    x, weight, y = node.inputs[0], node.inputs[1], b.ptr(node.output)
    return launch(
        b, mk.kernels.gemm, weight=b.ptr(weight), type=b.weight_type(weight), x=named["x"], bias=named.get("bias"),
        residual=y if "residual" in named else None, y=y, in_features=weight.shape[1], out_features=weight.shape[0],
        n_tokens=x.shape[0], workspace=b.workspace, workspace_bytes=b.workspace_bytes,
    )  # fmt: skip


def gemm_group(b: Binding, node: Node) -> list[Launch]:
    """Each part's product, plus its bias where the node has one (`bias_<part>`)."""
    named = named_inputs(b, node)
    weights = gemm_weights(node)
    x = node.inputs[0]
    parts: dict[str, object] = {}
    for part in range(GEMM_GROUP_PARTS):  # parts past the node's are absent
        present = part < len(weights)
        parts[f"weight_{part}"] = named.get(f"weight_{part}")
        parts[f"bias_{part}"] = named.get(f"bias_{part}")
        parts[f"y_{part}"] = b.ptr(node.outputs[part]) if present else None
        parts[f"out_features_{part}"] = weights[part].shape[0] if present else 0
    return launch(
        b, mk.kernels.gemm_group, **parts, type=b.weight_type(weights[0]), x=named["x"], in_features=x.shape[1],
        n_tokens=x.shape[0], workspace=b.workspace, workspace_bytes=b.workspace_bytes,
    )  # fmt: skip


def gemm_gated(b: Binding, node: Node, kernel: Callable[..., None]) -> list[Launch]:
    """The launch of a prompt's gated GEMM (gemm_swiglu, gemm_geglu: one signature, the activation differs)."""
    x, gate = node.inputs[:2]
    return launch(
        b, kernel, **named_inputs(b, node), type=b.weight_type(gate), h=b.ptr(node.output),
        in_features=gate.shape[1], d_ff=gate.shape[0], n_tokens=x.shape[0], workspace=b.workspace,
        workspace_bytes=b.workspace_bytes,
    )  # fmt: skip


def gemm_swiglu(b: Binding, node: Node) -> list[Launch]:
    return gemm_gated(b, node, mk.kernels.gemm_swiglu)


def gemm_geglu(b: Binding, node: Node) -> list[Launch]:
    return gemm_gated(b, node, mk.kernels.gemm_geglu)


def gemv(b: Binding, node: Node) -> list[Launch]:
    """One token: a MATMUL node, or a fused one with a norm before it and a residual add after it (in place:
    the residual is in the output buffer)."""
    named = named_inputs(b, node) if node.op is FusedOp.GEMV else {"x": b.ptr(node.inputs[0])}
    weight, y = node.inputs[1], b.ptr(node.output)
    return launch(
        b, mk.kernels.gemv, weight=b.ptr(weight), type=b.weight_type(weight), x=named["x"],
        norm_weight=named.get("norm_weight"), eps=node.params.get("eps", 0.0),
        residual=y if "residual" in named else None, y=y, in_features=weight.shape[1], out_features=weight.shape[0],
    )  # fmt: skip


def gate_up(b: Binding, node: Node, kernel: Callable[..., None]) -> list[Launch]:
    """The launch of a gate/up kernel (gemv_swiglu, gemv_geglu: one signature, the activation differs)."""
    gate = node.inputs[2]
    return launch(
        b, kernel, **named_inputs(b, node), type=b.weight_type(gate), eps=node.params["eps"], out=b.ptr(node.output),
        in_features=gate.shape[1], d_ff=node.output.shape[1],
    )  # fmt: skip


def gemv_swiglu(b: Binding, node: Node) -> list[Launch]:
    return gate_up(b, node, mk.kernels.gemv_swiglu)


def gemv_geglu(b: Binding, node: Node) -> list[Launch]:
    return gate_up(b, node, mk.kernels.gemv_geglu)


def gemv_qkv_rope_store(b: Binding, node: Node) -> list[Launch]:
    """No biases: None for each; rope_dim 0 (attention_decode_f32 rotates after the per-head norms): no inv_freq."""
    check_heads(node)
    p = node.params
    x, _, wq, wk, wv = node.inputs[:5]
    cache_k, cache_v = node.writes
    absent = {"bq": None, "bk": None, "bv": None, "inv_freq": None}
    return launch(
        b, mk.kernels.gemv_qkv_rope_store, **(absent | named_inputs(b, node)),
        q_type=b.weight_type(wq), k_type=b.weight_type(wk), v_type=b.weight_type(wv), eps=p["eps"],
        q=b.ptr(node.output), k_cache=b.ptr(cache_k), v_cache=b.ptr(cache_v), in_features=x.shape[1],
        n_heads=p["n_heads"], n_kv_heads=p["n_kv_heads"], head_dim=p["head_dim"], n_rot=p["rope_dim"],
        mscale=p["mscale"], mode=rope_mode(node), n_ctx=cache_k.shape[0],
        cache_type=cache_type(node, cache_k, cache_v),
    )  # fmt: skip


# -- attention.cu ------------------------------------------------------------------------------------


def kv_store_f32(b: Binding, node: Node) -> list[Launch]:
    k, v, positions = node.inputs
    cache_k, cache_v = node.writes
    n_ctx, kv_dim = cache_k.shape
    return launch(
        b, mk.kernels.kv_store_f32, k=b.ptr(k), v=b.ptr(v), k_cache=b.ptr(cache_k), v_cache=b.ptr(cache_v),
        positions=b.ptr(positions), n_tokens=k.shape[0], kv_dim=kv_dim, n_ctx=n_ctx,
        cache_type=cache_type(node, cache_k, cache_v),
    )  # fmt: skip


def attention(b: Binding, node: Node) -> list[Launch]:
    """One query token: attention_decode_f32, which reads the KV length from device memory, so the same
    launch serves every step (an ATTENTION node, or the fused one that norms and rotates q and the newest k row
    first: decode_head_norm); more: attention_prefill_f32, causal by position.

    A prompt's graph is compiled once per token count and run at any depth (the positions and KV length are
    device data), so the host cannot give prefill the rows its last query sees: max_rows is the cache's n_ctx,
    the bound every position keeps. It only sets how many slices the launch cuts the cache rows into
    (attention_prefill_splits, at most one per 256 rows of n_ctx); each slice's rows come from the positions
    on the device, so a prompt far below n_ctx leaves the last slices empty, and those blocks return at once."""
    check_heads(node)
    p = node.params
    if p["n_heads"] % p["n_kv_heads"]:
        raise refuse(node, "query heads are not a multiple of the KV heads")
    q, cache_k, cache_v, positions, kv_len = node.inputs[:5]
    common = dict(
        q=b.ptr(q), k_cache=b.ptr(cache_k), v_cache=b.ptr(cache_v), out=b.ptr(node.output), n_heads=p["n_heads"],
        n_kv_heads=p["n_kv_heads"], head_dim=p["head_dim"], n_ctx=cache_k.shape[0], scale=p["scale"],
        window=p["window"], cache_type=cache_type(node, cache_k, cache_v),
    )  # fmt: skip
    if q.shape[0] == 1:
        return launch(
            b, mk.kernels.attention_decode_f32, **common, kv_len=b.ptr(kv_len), workspace=b.workspace,
            n_splits=decode_attention_splits(p["n_kv_heads"], b.multiprocessors), **decode_head_norm(b, node),
        )  # fmt: skip
    return launch(
        b, mk.kernels.attention_prefill_f32, **common, positions=b.ptr(positions), n_tokens=q.shape[0],
        max_rows=cache_k.shape[0], workspace=b.workspace, workspace_bytes=b.workspace_bytes,
    )  # fmt: skip


def decode_head_norm(b: Binding, node: Node) -> dict[str, object]:
    """attention_decode_f32's per-head norm arguments: the fused node's norm weights, epsilon and rotation (the
    newest cache row is the one its positions name, kv_len - 1 in decode); none for a primitive attention."""
    if node.op is not FusedOp.ATTENTION_DECODE:
        return dict(q_norm=None, k_norm=None, head_eps=0.0, n_rot=0, inv_freq=None, mscale=1.0,
                    mode=mk.kernels.ROPE_NORMAL)  # fmt: skip
    p, named = node.params, named_inputs(b, node)
    return dict(
        q_norm=named["q_norm"], k_norm=named["k_norm"], head_eps=p["eps"], n_rot=p["rope_dim"],
        inv_freq=named["inv_freq"], mscale=p["mscale"], mode=rope_mode(node),
    )  # fmt: skip


def decode_attention_splits(n_kv_heads: int, multiprocessors: int) -> int:
    """The cache splits of a decode attention launch: the power of two nearest multiprocessors / n_kv_heads, so
    its grid (splits x KV heads) is about one block an SM; at most MAX_DECODE_SPLITS. Fixed for a graph, so a
    captured one serves every depth (a short cache leaves most splits empty: a split is at least a tile, 32 to 128
    rows). Each block loads its split in one round trip and the last one merges, so fewer splits mean more rows a
    block and more splits a longer merge: at depth 2048 on the H200 (132 SMs), Qwen2.5-0.5B's 2 KV heads gave 1343 tok/s
    with 64 splits against 1191 (16), 1273 (32) and 1232 (128) (docs/PERFORMANCE.md, step 19)."""
    blocks_a_head = max(1.0, multiprocessors / n_kv_heads)
    return min(MAX_DECODE_SPLITS, 1 << round(math.log2(blocks_a_head)))


def prefill_attention_workspace_bytes(node: Node, multiprocessors: int) -> int:
    """What a prompt's attention launch needs of the workspace (attention_prefill_workspace_bytes): its slices'
    partial states where it splits the cache rows, with max_rows = n_ctx as the binder passes it."""
    p, q, cache_k = node.params, node.inputs[0], node.inputs[1]
    return mk.kernels.attention_prefill_workspace_bytes(
        q.shape[0], p["n_heads"], p["head_dim"], cache_k.shape[0], multiprocessors
    )


def graph_workspace_bytes(nodes: list[Node], multiprocessors: int, weight_type: WeightType) -> int:
    """Bytes of a graph's one workspace: the most any of its nodes needs, decode attention (its per-head
    counters and split results), a GEMM (its x rounded to 16 bits, its slices' partial sums where it splits K,
    its weights decoded to f16 where a long prompt stages them; gemm_workspace_bytes, gemm_swiglu_workspace_bytes:
    `weight_type` gives a weight's GGML type by name) or a prompt's attention that splits the cache rows (its
    slices' partial states), on a GPU of `multiprocessors` SMs. The launches follow each other on one stream, so
    one buffer serves them in turn: the GEMM's and prefill attention's contents are written before they are read
    within a launch, whatever the buffer held.
    Not with decode attention, though: its counters must stay zeroed from one launch to the next, and the
    others' partials would overwrite them. Decode attention is a one-token graph's, prefill attention a
    graph's of more tokens and the GEMM one's of GEMM_MIN_TOKENS or more, so no model's graph mixes them; one
    that did is refused."""
    decode = [
        mk.kernels.attention_decode_workspace_bytes(
            n.params["n_heads"], n.params["head_dim"], decode_attention_splits(n.params["n_kv_heads"], multiprocessors)
        )
        for n in nodes
        if n.op in (Op.ATTENTION, FusedOp.ATTENTION_DECODE) and n.inputs[0].shape[0] == 1
    ]
    partials = []
    for node in nodes:
        if node.op is Op.ATTENTION and node.inputs[0].shape[0] > 1:
            partials.append(prefill_attention_workspace_bytes(node, multiprocessors))
        elif (weights := gemm_weights(node)) is not None:
            out_features = [w.shape[0] for w in weights] + [0] * (GEMM_GROUP_PARTS - len(weights))
            x = node.inputs[0]
            type_ = weight_type(weights[0].name)
            partials.append(
                mk.kernels.gemm_workspace_bytes(type_, *out_features, x.shape[1], x.shape[0], multiprocessors)
            )
        elif node.op in (FusedOp.GEMM_SWIGLU, FusedOp.GEMM_GEGLU):
            x, gate = node.inputs[:2]
            partials.append(
                mk.kernels.gemm_swiglu_workspace_bytes(weight_type(gate.name), *gate.shape[::-1], x.shape[0])
            )
        else:
            continue
        if partials[-1] and decode:
            raise refuse(node, "it writes the workspace of a graph with decode attention, whose counters it clobbers")
    return max([0, *decode, *partials])


# -- the runtime's copies ----------------------------------------------------------------------------


def last_row(b: Binding, node: Node) -> list[Launch]:
    (x,) = node.inputs
    row_bytes = node.output.nbytes
    source = b.ptr(x) + (x.shape[0] - 1) * row_bytes
    return launch(b, mk.copy_d2d, dst=b.ptr(node.output), src=source, nbytes=row_bytes)


def staging_copy(b: Binding, node: Node) -> list[Launch]:
    """The copy of a node's in-place input into its output buffer, where the plan could not alias them."""
    source = node.inputs[node.inplace_input]
    return launch(b, mk.copy_d2d, dst=b.ptr(node.output), src=b.ptr(source), nbytes=source.nbytes)


BINDERS: dict[enum.Enum, Binder] = {
    Op.EMBED: embed_rows,
    Op.RMS_NORM: rms_norm_f32,
    Op.MATMUL: matmul,
    Op.ADD_BIAS: add_bias_f32,
    Op.ROPE: rope_f32,
    Op.KV_STORE: kv_store_f32,
    Op.ATTENTION: attention,
    Op.ADD: add_f32,
    Op.SCALE: scale_f32,
    Op.SILU: silu_f32,
    Op.GELU: gelu_f32,
    Op.MUL: mul_f32,
    Op.SOFTCAP: softcap_f32,
    Op.SLICE: slice_f32,
    Op.LAST_ROW: last_row,
    FusedOp.GEMV: gemv,
    FusedOp.GEMV_SWIGLU: gemv_swiglu,
    FusedOp.GEMV_GEGLU: gemv_geglu,
    FusedOp.GEMV_QKV_ROPE_STORE: gemv_qkv_rope_store,
    FusedOp.ATTENTION_DECODE: attention,
    FusedOp.SWIGLU_F32: swiglu_f32,
    FusedOp.GEGLU_F32: geglu_f32,
    FusedOp.RMS_NORM_ADD_F32: rms_norm_add_f32,
    FusedOp.GEMM: gemm,
    FusedOp.GEMM_GROUP: gemm_group,
    FusedOp.GEMM_SWIGLU: gemm_swiglu,
    FusedOp.GEMM_GEGLU: gemm_geglu,
}
