"""The llama family's forward pass as a graph of primitive ops (llama, SmolLM2, qwen2, qwen3, gemma3, phi3).

    x = embed(tokens)                                   (gemma3: times sqrt(d))
    per layer:  h = attn_norm(x);  q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)   (phi3: one h Wqkv, sliced)
                q, k = q_norm(q), k_norm(k) per head    (qwen3, gemma3)
                rope(q), rope(k);  store k, v in the cache at their positions
                a = attention(q, cache) Wo               (a sliding window on the layers that have one)
                x = x + a                                (gemma3: x + post_attention_norm(a))
                h = ffn_norm(x);   f = (act(h Wgate) * (h Wup)) Wdown    (act: silu, gemma3 gelu;
                                                                          phi3: one h Wup holds gate|up)
                x = x + f                                (gemma3: x + post_ffw_norm(f))
    logits = output_norm(x[last]) Wout          (Wout = token_embd when tied; gemma3 may soft-cap them)

The same graph serves one token (decode) and many (a prompt): how to run it fast is each backend's
business (`Backend.lower`; the CUDA backend fuses a llama decode layer into five kernels, backends/cuda/fuse.py).
Every weight is a tensor of the file, by its GGUF name; each family's differences are fields of its
ModelConfig (models/config.py), read from the file as llama.cpp reads them.

`build_graph` is a pure function of the config, the token count, the context size and the KV cache's type: the
same graph serves position 0 and position 5000, because positions and the KV length are inputs the kernels read
when they run. RoPE's frequencies, RoPE scaling included, are constant tables (models/rope.py) that the ropes
read: one, or for Gemma 3 a second one for its sliding-window layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from minfer.graph.builder import GraphBuilder, weight
from minfer.graph.ir import Graph, Op, Tensor, TensorKind
from minfer.models.config import ModelConfig
from minfer.models.rope import rope_table

ROPE_TABLE = "rope.inv_freq"  # the graph constant holding each rotated pair's frequency
LOCAL_ROPE_TABLE = "rope.inv_freq_local"  # the sliding-window layers' own (Gemma 3)


@dataclass(frozen=True)
class Rotation:
    """A RoPE table of the graph and the factor on its cos and sin (models/rope.py's rope_table)."""

    table: Tensor
    mscale: float


@dataclass(frozen=True)
class StepInputs:
    """What every layer reads besides the residual: where the new tokens sit, and the RoPE tables."""

    positions: Tensor
    kv_len: Tensor
    rotations: dict[str, Rotation]  # by table name


# The KV cache's element types by llama.cpp's names (its -ctk/--cache-type-k and -ctv/--cache-type-v), each the
# dtype of the cache tensors. K and V rows are rounded to it as they are stored (f16: to nearest even, a relative
# error of at most 2^-11) and widened to float32 where attention reads them; every sum stays float32. minfer's K and
# V share one type.
KV_CACHE_TYPES = {"f32": "float32", "f16": "float16"}
DEFAULT_CACHE_TYPE = "f32"
# llama.cpp's other cache types (common/arg.cpp's kv_cache_types), named when they are asked for.
LLAMA_CPP_ONLY_CACHE_TYPES = ("bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def check_cache_type(cache_type: str) -> str:
    """`cache_type` when minfer's KV cache can have it, else a ValueError: llama.cpp's other types refused by name,
    anything else as unknown."""
    if cache_type in KV_CACHE_TYPES:
        return cache_type
    accepted = ", ".join(KV_CACHE_TYPES)
    if cache_type in LLAMA_CPP_ONLY_CACHE_TYPES:
        raise ValueError(
            f"KV cache type {cache_type!r} is llama.cpp's, not supported by minfer (choose from {accepted})"
        )
    raise ValueError(f"unknown KV cache type {cache_type!r} (choose from {accepted})")


def kv_cache_tensors(config: ModelConfig, layer: int, n_ctx: int, cache_type: str) -> tuple[Tensor, Tensor]:
    """Layer `layer`'s K and V caches: `n_ctx` rows of kv_dim values of `cache_type` (KV_CACHE_TYPES)."""
    shape, dtype = (n_ctx, config.kv_dim), KV_CACHE_TYPES[cache_type]
    return (
        Tensor(f"cache_k.{layer}", shape, dtype, TensorKind.STATE),
        Tensor(f"cache_v.{layer}", shape, dtype, TensorKind.STATE),
    )


def build_graph(config: ModelConfig, n_tokens: int, n_ctx: int, cache_type: str) -> Graph:
    """The forward pass over `n_tokens` new tokens with a KV cache of `n_ctx` rows of `cache_type` (KV_CACHE_TYPES)."""
    if n_tokens < 1:
        raise ValueError(f"a graph needs at least one token, got {n_tokens}")
    check_cache_type(cache_type)
    shapes = config.expected_tensors()

    def w(name: str) -> Tensor:
        return weight(name, shapes[name])

    tokens = Tensor("tokens", (n_tokens,), "int32", TensorKind.INPUT)
    positions = Tensor("positions", (n_tokens,), "int32", TensorKind.INPUT)
    kv_len = Tensor("kv_len", (1,), "int32", TensorKind.INPUT)
    ropes = {ROPE_TABLE: config.rope.for_context(n_ctx)}
    if config.rope_local is not None:
        ropes[LOCAL_ROPE_TABLE] = config.rope_local
    constants, rotations = {}, {}
    for name, rope in ropes.items():
        constants[name], mscale = rope_table(rope)
        rotations[name] = Rotation(Tensor(name, constants[name].shape, "float64", TensorKind.CONSTANT), mscale)
    step = StepInputs(positions, kv_len, rotations)
    g = GraphBuilder()
    x = g.node("embed", Op.EMBED, [w("token_embd.weight"), tokens], (n_tokens, config.d_model))
    if config.embedding_scale != 1.0:
        x = g.node("embed_scale", Op.SCALE, [x], x.shape, inplace_input=0, factor=config.embedding_scale)
    for layer in range(config.n_layers):
        x = layer_graph(g, config, layer, x, w, step, kv_cache_tensors(config, layer, n_ctx, cache_type))
    last = g.node("last_row", Op.LAST_ROW, [x], (1, config.d_model))
    normed = g.node("output_norm", Op.RMS_NORM, [last, w("output_norm.weight")], last.shape, eps=config.rms_eps)
    output_weight = w("token_embd.weight" if config.tied_output else "output.weight")
    logits = g.node("output", Op.MATMUL, [normed, output_weight], (1, config.vocab_size))
    if config.final_logit_softcap:
        logits = g.node("output_softcap", Op.SOFTCAP, [logits], logits.shape, inplace_input=0,
                        cap=config.final_logit_softcap)  # fmt: skip
    return Graph(
        n_tokens=n_tokens,
        nodes=g.nodes,
        inputs={t.name: t for t in (tokens, positions, kv_len)},
        outputs={"logits": logits},
        constants=constants,
    )


def layer_graph(
    g: GraphBuilder,
    config: ModelConfig,
    layer: int,
    x: Tensor,
    w: Callable[[str], Tensor],
    step: StepInputs,
    cache: tuple[Tensor, Tensor],
) -> Tensor:
    """One transformer layer over the residual `x`; returns the new residual."""
    blk = f"blk.{layer}"
    n, d = x.shape
    h = g.node(f"{blk}.attn_norm", Op.RMS_NORM, [x, w(f"{blk}.attn_norm.weight")], (n, d), eps=config.rms_eps)
    widths = {"q": config.q_dim, "k": config.kv_dim, "v": config.kv_dim}
    if config.fused_qkv:
        projections = split(g, f"{blk}.attn_qkv", h, w(f"{blk}.attn_qkv.weight"), widths)
    else:
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
    if config.qk_norm:  # every head of q and k normed on its own: the weight is one head long
        for part in ("q", "k"):
            norm = w(f"{blk}.attn_{part}_norm.weight")
            projections[part] = g.node(
                f"{blk}.attn_{part}_norm", Op.RMS_NORM, [projections[part], norm], (n, widths[part]), eps=config.rms_eps
            )
    local = config.rope_local is not None and config.layer_window(layer) > 0  # Gemma 3's sliding-window layers
    rope_config = config.rope_local if local else config.rope
    rotation = step.rotations[LOCAL_ROPE_TABLE if local else ROPE_TABLE]
    rope = dict(head_dim=config.head_dim, rope_dim=rope_config.n_rot, neox=rope_config.neox, mscale=rotation.mscale)
    for part, n_heads in (("q", config.n_heads), ("k", config.n_kv_heads)):
        projections[part] = g.node(
            f"{blk}.rope_{part}",
            Op.ROPE,
            [projections[part], step.positions, rotation.table],
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
        scale=config.score_scale,
        window=config.layer_window(layer),
    )
    attn_out = g.node(f"{blk}.attn_output", Op.MATMUL, [attn, w(f"{blk}.attn_output.weight")], (n, d))
    if config.sandwich_norms:
        attn_out = post_norm(g, config, f"{blk}.post_attention_norm", attn_out, w)
    x = g.node(f"{blk}.attn_residual", Op.ADD, [x, attn_out], (n, d), inplace_input=0)
    h = g.node(f"{blk}.ffn_norm", Op.RMS_NORM, [x, w(f"{blk}.ffn_norm.weight")], (n, d), eps=config.rms_eps)
    if config.fused_gate_up:
        halves = split(g, f"{blk}.ffn_up", h, w(f"{blk}.ffn_up.weight"), {"gate": config.d_ff, "up": config.d_ff})
        gate, up = halves["gate"], halves["up"]
    else:
        gate = g.node(f"{blk}.ffn_gate", Op.MATMUL, [h, w(f"{blk}.ffn_gate.weight")], (n, config.d_ff))
        up = g.node(f"{blk}.ffn_up", Op.MATMUL, [h, w(f"{blk}.ffn_up.weight")], (n, config.d_ff))
    activation = Op.GELU if config.activation == "gelu" else Op.SILU
    gate = g.node(f"{blk}.ffn_{activation.value}", activation, [gate], gate.shape, inplace_input=0)
    act = g.node(f"{blk}.ffn_gated", Op.MUL, [gate, up], gate.shape, inplace_input=0)
    down = g.node(f"{blk}.ffn_down", Op.MATMUL, [act, w(f"{blk}.ffn_down.weight")], (n, d))
    if config.sandwich_norms:
        down = post_norm(g, config, f"{blk}.post_ffw_norm", down, w)
    return g.node(f"{blk}.ffn_residual", Op.ADD, [x, down], (n, d), inplace_input=0)


def split(g: GraphBuilder, name: str, h: Tensor, fused: Tensor, widths: dict[str, int]) -> dict[str, Tensor]:
    """One matmul by a fused weight (its rows the parts' one after the other), and each part sliced out:
    `name.q`, `name.k`, ... in the order of `widths`."""
    product = g.node(name, Op.MATMUL, [h, fused], (h.shape[0], sum(widths.values())))
    parts, start = {}, 0
    for part, width in widths.items():
        parts[part] = g.node(f"{name}.{part}", Op.SLICE, [product], (h.shape[0], width), start=start)
        start += width
    return parts


def post_norm(g: GraphBuilder, config: ModelConfig, name: str, x: Tensor, w: Callable[[str], Tensor]) -> Tensor:
    """Gemma's norm of a block's output before it joins the residual (`name` is the norm's GGUF name)."""
    return g.node(name, Op.RMS_NORM, [x, w(f"{name}.weight")], x.shape, eps=config.rms_eps)
