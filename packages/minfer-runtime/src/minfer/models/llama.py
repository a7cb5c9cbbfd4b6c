"""The llama family's forward pass as a graph (llama, SmolLM2, qwen2).

    x = embed(tokens)
    per layer:  h = attn_norm(x);  q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)
                rope(q), rope(k);  store k, v in the cache at their positions
                x = x + attention(q, cache) Wo
                h = ffn_norm(x);   x = x + (silu(h Wgate) * (h Wup)) Wdown
    logits = output_norm(x[last]) Wout          (Wout = token_embd when tied)

A one-token (decode) graph says the same in fused ops, five nodes per layer
instead of sixteen, over stacked weights (Wqkv = Wq|Wk|Wv, Wgate_up = Wgate|Wup,
ModelConfig.stacked_tensors) — see `fused_decode_layer`.

`build_graph` is a pure function of the config and the token count: the same
graph serves position 0 and position 5000, because positions and the KV length
are inputs the kernels read when they run. RoPE's frequencies, RoPE scaling
included, are one constant table (models/rope.py) that every rope reads.
"""

from __future__ import annotations

from collections.abc import Callable

from minfer.graph.ir import Graph, Node, Op, Tensor, TensorKind
from minfer.models.config import ModelConfig
from minfer.models.rope import rope_table

ROPE_TABLE = "rope.inv_freq"  # the graph constant holding each rotated pair's frequency


class _GraphBuilder:
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
        writes: tuple[Tensor, ...] = (),
        **params: object,
    ) -> Tensor:
        output = Tensor(name, shape, "float32", TensorKind.ACTIVATION)
        node = Node(name, op, inputs, output, dict(params), inplace_input=inplace_input, writes=list(writes))
        self.nodes.append(node)
        return output


def weight(name: str, shape: tuple[int, ...]) -> Tensor:
    """A GGUF tensor, in numpy order (GGUF shape reversed)."""
    return Tensor(name, tuple(reversed(shape)), "float32", TensorKind.WEIGHT)


def kv_cache_tensors(config: ModelConfig, layer: int, n_ctx: int) -> tuple[Tensor, Tensor]:
    shape = (n_ctx, config.kv_dim)
    return (
        Tensor(f"cache_k.{layer}", shape, "float32", TensorKind.STATE),
        Tensor(f"cache_v.{layer}", shape, "float32", TensorKind.STATE),
    )


def build_graph(config: ModelConfig, n_tokens: int, n_ctx: int) -> Graph:
    """The forward pass over `n_tokens` new tokens with a KV cache of `n_ctx` rows."""
    if n_tokens < 1:
        raise ValueError(f"a graph needs at least one token, got {n_tokens}")
    shapes = config.graph_tensors()
    n, d = n_tokens, config.d_model
    tokens = Tensor("tokens", (n,), "int32", TensorKind.INPUT)
    positions = Tensor("positions", (n,), "int32", TensorKind.INPUT)
    kv_len = Tensor("kv_len", (1,), "int32", TensorKind.INPUT)
    g = _GraphBuilder()

    def w(name: str) -> Tensor:
        return weight(name, shapes[name])

    x = g.node("embed", Op.EMBED, [w("token_embd.weight"), tokens], (n, d))
    inv_freq, mscale = rope_table(config.rope)
    rope_freqs = Tensor(ROPE_TABLE, inv_freq.shape, "float64", TensorKind.CONSTANT)
    rope = dict(head_dim=config.head_dim, rope_dim=config.rope.n_rot, neox=config.rope.neox, mscale=mscale)
    fused = n_tokens == 1 and config.fuse_decode
    for layer in range(config.n_layers):
        blk = f"blk.{layer}"
        cache = kv_cache_tensors(config, layer, n_ctx)
        if fused:
            x = fused_decode_layer(g, config, blk, x, w, (positions, kv_len, rope_freqs), cache, rope)
            continue
        h = g.node(f"{blk}.attn_norm", Op.RMS_NORM, [x, w(f"{blk}.attn_norm.weight")], (n, d), eps=config.rms_eps)
        # The three projections of h first, one after the other: the CUDA backend runs such a run as one
        # launch (CudaCompiledGraph.gemm_groups).
        widths = {"q": config.q_dim, "k": config.kv_dim, "v": config.kv_dim}
        projections = {
            part: g.node(f"{blk}.attn_{part}", Op.MATMUL, [h, w(f"{blk}.attn_{part}.weight")], (n, width))
            for part, width in widths.items()
        }
        if config.qkv_bias:
            for part, width in widths.items():
                projections[part] = g.node(
                    f"{blk}.attn_{part}_bias",
                    Op.ADD_BIAS,
                    [projections[part], w(f"{blk}.attn_{part}.bias")],
                    (n, width),
                    inplace_input=0,
                )
        for part, n_heads in (("q", config.n_heads), ("k", config.n_kv_heads)):
            projections[part] = g.node(
                f"{blk}.rope_{part}",
                Op.ROPE,
                [projections[part], positions, rope_freqs],
                (n, widths[part]),
                inplace_input=0,
                n_heads=n_heads,
                **rope,
            )
        cache_k, cache_v = cache
        kv_inputs = [projections["k"], projections["v"], positions]
        g.nodes.append(Node(f"{blk}.kv_store", Op.KV_STORE, kv_inputs, None, writes=[cache_k, cache_v]))
        attn = g.node(
            f"{blk}.attention",
            Op.ATTENTION,
            [projections["q"], cache_k, cache_v, positions, kv_len],
            (n, config.q_dim),
            n_heads=config.n_heads,
            n_kv_heads=config.n_kv_heads,
            head_dim=config.head_dim,
        )
        attn_out = g.node(f"{blk}.attn_output", Op.MATMUL, [attn, w(f"{blk}.attn_output.weight")], (n, d))
        x = g.node(f"{blk}.attn_residual", Op.ADD, [x, attn_out], (n, d), inplace_input=1)
        h = g.node(f"{blk}.ffn_norm", Op.RMS_NORM, [x, w(f"{blk}.ffn_norm.weight")], (n, d), eps=config.rms_eps)
        gate = g.node(f"{blk}.ffn_gate", Op.MATMUL, [h, w(f"{blk}.ffn_gate.weight")], (n, config.d_ff))
        up = g.node(f"{blk}.ffn_up", Op.MATMUL, [h, w(f"{blk}.ffn_up.weight")], (n, config.d_ff))
        act = g.node(f"{blk}.ffn_swiglu", Op.SWIGLU, [gate, up], (n, config.d_ff), inplace_input=0)
        down = g.node(f"{blk}.ffn_down", Op.MATMUL, [act, w(f"{blk}.ffn_down.weight")], (n, d))
        x = g.node(f"{blk}.ffn_residual", Op.ADD, [x, down], (n, d), inplace_input=1)

    output_weight = w("token_embd.weight" if config.tied_output else "output.weight")
    if fused:
        head_inputs = [x, w("output_norm.weight"), output_weight]
        logits = g.node("output", Op.NORM_MATMUL, head_inputs, (1, config.vocab_size), eps=config.rms_eps)
    else:
        last = g.node("last_row", Op.LAST_ROW, [x], (1, d))
        normed = g.node("output_norm", Op.RMS_NORM, [last, w("output_norm.weight")], (1, d), eps=config.rms_eps)
        logits = g.node("output", Op.MATMUL, [normed, output_weight], (1, config.vocab_size))
    return Graph(
        n_tokens=n,
        nodes=g.nodes,
        inputs={t.name: t for t in (tokens, positions, kv_len)},
        outputs={"logits": logits},
        constants={ROPE_TABLE: inv_freq},
    )


def fused_decode_layer(
    g: _GraphBuilder,
    config: ModelConfig,
    blk: str,
    x: Tensor,
    w: Callable[[str], Tensor],
    position_inputs: tuple[Tensor, Tensor, Tensor],
    cache: tuple[Tensor, Tensor],
    rope: dict[str, object],
) -> Tensor:
    """One layer for one token in five nodes, each one kernel on the GPU; returns the new residual x.

    q = rope(attn_norm(x) Wqkv + bqkv), its k and v stored in the cache   (NORM_QKV_ROPE_STORE)
    x = x + attention(q, cache) Wo                                        (ATTENTION, MATMUL_ADD)
    x = x + swiglu(ffn_norm(x) Wgate_up) Wdown                            (NORM_SWIGLU, MATMUL_ADD)
    """
    positions, kv_len, rope_freqs = position_inputs
    qkv_inputs = [x, w(f"{blk}.attn_norm.weight"), w(f"{blk}.attn_qkv.weight"), positions, rope_freqs]
    if config.qkv_bias:
        qkv_inputs.append(w(f"{blk}.attn_qkv.bias"))
    heads = dict(n_heads=config.n_heads, n_kv_heads=config.n_kv_heads)
    q = g.node(
        f"{blk}.attn_qkv",
        Op.NORM_QKV_ROPE_STORE,
        qkv_inputs,
        (1, config.q_dim),
        writes=cache,
        eps=config.rms_eps,
        **heads,
        **rope,
    )
    attention_inputs = [q, *cache, positions, kv_len]
    attn = g.node(f"{blk}.attention", Op.ATTENTION, attention_inputs, q.shape, head_dim=config.head_dim, **heads)
    d = config.d_model
    x = g.node(f"{blk}.attn_output", Op.MATMUL_ADD, [attn, w(f"{blk}.attn_output.weight"), x], (1, d), inplace_input=2)
    gate_up = [x, w(f"{blk}.ffn_norm.weight"), w(f"{blk}.ffn_gate_up.weight")]
    act = g.node(f"{blk}.ffn_gate_up", Op.NORM_SWIGLU, gate_up, (1, config.d_ff), eps=config.rms_eps)
    return g.node(f"{blk}.ffn_down", Op.MATMUL_ADD, [act, w(f"{blk}.ffn_down.weight"), x], (1, d), inplace_input=2)
