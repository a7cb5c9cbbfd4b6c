"""The llama family's forward pass as a graph of primitive ops (llama, SmolLM2, qwen2).

    x = embed(tokens)
    per layer:  h = attn_norm(x);  q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)
                rope(q), rope(k);  store k, v in the cache at their positions
                x = x + attention(q, cache) Wo
                h = ffn_norm(x);   x = x + (silu(h Wgate) * (h Wup)) Wdown
    logits = output_norm(x[last]) Wout          (Wout = token_embd when tied)

The same graph serves one token (decode) and many (a prompt): how to run it fast is each backend's
business (`Backend.lower`; the CUDA backend fuses a decode layer into five kernels, backends/cuda/fuse.py).
Every weight is a tensor of the file, by its GGUF name.

`build_graph` is a pure function of the config and the token count: the same graph serves position 0 and
position 5000, because positions and the KV length are inputs the kernels read when they run. RoPE's
frequencies, RoPE scaling included, are one constant table (models/rope.py) that every rope reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from minfer.graph.builder import GraphBuilder, weight
from minfer.graph.ir import Graph, Op, Tensor, TensorKind
from minfer.models.config import ModelConfig
from minfer.models.rope import rope_table

ROPE_TABLE = "rope.inv_freq"  # the graph constant holding each rotated pair's frequency


@dataclass(frozen=True)
class StepInputs:
    """The tensors every layer reads besides the residual: where the new tokens sit, and RoPE's table."""

    positions: Tensor
    kv_len: Tensor
    rope_freqs: Tensor


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
    shapes = config.expected_tensors()

    def w(name: str) -> Tensor:
        return weight(name, shapes[name])

    tokens = Tensor("tokens", (n_tokens,), "int32", TensorKind.INPUT)
    positions = Tensor("positions", (n_tokens,), "int32", TensorKind.INPUT)
    kv_len = Tensor("kv_len", (1,), "int32", TensorKind.INPUT)
    inv_freq, mscale = rope_table(config.rope)
    step = StepInputs(positions, kv_len, Tensor(ROPE_TABLE, inv_freq.shape, "float64", TensorKind.CONSTANT))
    g = GraphBuilder()
    x = g.node("embed", Op.EMBED, [w("token_embd.weight"), tokens], (n_tokens, config.d_model))
    for layer in range(config.n_layers):
        x = layer_graph(g, config, layer, x, w, step, kv_cache_tensors(config, layer, n_ctx), mscale)
    last = g.node("last_row", Op.LAST_ROW, [x], (1, config.d_model))
    normed = g.node("output_norm", Op.RMS_NORM, [last, w("output_norm.weight")], last.shape, eps=config.rms_eps)
    output_weight = w("token_embd.weight" if config.tied_output else "output.weight")
    logits = g.node("output", Op.MATMUL, [normed, output_weight], (1, config.vocab_size))
    return Graph(
        n_tokens=n_tokens,
        nodes=g.nodes,
        inputs={t.name: t for t in (tokens, positions, kv_len)},
        outputs={"logits": logits},
        constants={ROPE_TABLE: inv_freq},
    )


def layer_graph(
    g: GraphBuilder,
    config: ModelConfig,
    layer: int,
    x: Tensor,
    w: Callable[[str], Tensor],
    step: StepInputs,
    cache: tuple[Tensor, Tensor],
    mscale: float,
) -> Tensor:
    """One transformer layer over the residual `x`; returns the new residual."""
    blk = f"blk.{layer}"
    n, d = x.shape
    h = g.node(f"{blk}.attn_norm", Op.RMS_NORM, [x, w(f"{blk}.attn_norm.weight")], (n, d), eps=config.rms_eps)
    widths = {"q": config.q_dim, "k": config.kv_dim, "v": config.kv_dim}
    projections = {
        part: g.node(f"{blk}.attn_{part}", Op.MATMUL, [h, w(f"{blk}.attn_{part}.weight")], (n, width))
        for part, width in widths.items()
    }
    if config.qkv_bias:
        for part, width in widths.items():
            bias = w(f"{blk}.attn_{part}.bias")
            projections[part] = g.node(
                f"{blk}.attn_{part}_bias", Op.ADD_BIAS, [projections[part], bias], (n, width), inplace_input=0
            )
    rope = dict(head_dim=config.head_dim, rope_dim=config.rope.n_rot, neox=config.rope.neox, mscale=mscale)
    for part, n_heads in (("q", config.n_heads), ("k", config.n_kv_heads)):
        projections[part] = g.node(
            f"{blk}.rope_{part}",
            Op.ROPE,
            [projections[part], step.positions, step.rope_freqs],
            (n, widths[part]),
            inplace_input=0,
            n_heads=n_heads,
            **rope,
        )
    g.effect(f"{blk}.kv_store", Op.KV_STORE, [projections["k"], projections["v"], step.positions], list(cache))
    attn = g.node(
        f"{blk}.attention",
        Op.ATTENTION,
        [projections["q"], *cache, step.positions, step.kv_len],
        (n, config.q_dim),
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        head_dim=config.head_dim,
    )
    attn_out = g.node(f"{blk}.attn_output", Op.MATMUL, [attn, w(f"{blk}.attn_output.weight")], (n, d))
    x = g.node(f"{blk}.attn_residual", Op.ADD, [x, attn_out], (n, d), inplace_input=0)
    h = g.node(f"{blk}.ffn_norm", Op.RMS_NORM, [x, w(f"{blk}.ffn_norm.weight")], (n, d), eps=config.rms_eps)
    gate = g.node(f"{blk}.ffn_gate", Op.MATMUL, [h, w(f"{blk}.ffn_gate.weight")], (n, config.d_ff))
    up = g.node(f"{blk}.ffn_up", Op.MATMUL, [h, w(f"{blk}.ffn_up.weight")], (n, config.d_ff))
    gate = g.node(f"{blk}.ffn_silu", Op.SILU, [gate], gate.shape, inplace_input=0)
    act = g.node(f"{blk}.ffn_gated", Op.MUL, [gate, up], gate.shape, inplace_input=0)
    down = g.node(f"{blk}.ffn_down", Op.MATMUL, [act, w(f"{blk}.ffn_down.weight")], (n, d))
    return g.node(f"{blk}.ffn_residual", Op.ADD, [x, down], (n, d), inplace_input=0)
