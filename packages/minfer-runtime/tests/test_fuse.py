"""The CUDA backend's lowering (backends/cuda/fuse.py), on any machine: which nodes each rule fuses, which
it leaves alone, and that the lowered graph computes what the model's graph does.

The numbers are checked on the CPU: `FusedCpu` runs each fused op as the composition of the CPU
reference's primitive ops that its FusedOp comment spells out, so a wrongly wired rewrite (an input in the
wrong place, a lost bias, a residual added twice, a buffer shared while live) shows here without a GPU.
The kernels themselves are checked against the CPU on the GPU (test_cuda_backend.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import minfer
from minfer.backends.cpu import OPS, CpuBackend, CpuCompiledGraph, attention, rms_norm, rope_inplace
from minfer.backends.cuda.fuse import FusedOp, fuse, matmul_kernel
from minfer.gguf_file import GGUFFile
from minfer.graph.ir import Graph, Node, Op, Tensor, TensorKind
from minfer.models import build_graph
from minfer.scheduler import schedule
from minfer.testing.synthetic import PRESETS, scaled

CTX = 128
FUSED_LAYER = [FusedOp.GEMV_QKV_ROPE_STORE, Op.ATTENTION, FusedOp.GEMV, FusedOp.GEMV_SWIGLU, FusedOp.GEMV]


def one_type(name: str) -> int:
    return 8  # Q8_0 for every weight


def lowered(preset: str, n_tokens: int, weight_type=one_type) -> Graph:
    return fuse(build_graph(PRESETS[preset].config(), n_tokens, 64), weight_type)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_a_decode_layer_is_five_kernels(preset):
    config = PRESETS[preset].config()
    graph = lowered(preset, 1)
    assert [node.op for node in graph.nodes] == [Op.EMBED, *FUSED_LAYER * config.n_layers, FusedOp.GEMV]
    qkv = graph.nodes[1]
    assert [t.name for t in qkv.writes] == ["cache_k.0", "cache_v.0"]
    assert qkv.output.shape == (1, config.q_dim)
    assert qkv.params["args"][:5] == ("x", "norm_weight", "wq", "wk", "wv")
    assert ("bq" in qkv.params["args"]) == config.qkv_bias
    assert qkv.name.startswith("blk.0.attn_norm+attn_q+")
    head = graph.nodes[-1]
    assert head.name == "output_norm+output" and head.params["args"] == ("x", "weight", "norm_weight")
    # Every weight the lowered graph reads is a tensor of the file, by its own name.
    assert {t.name for t in graph.weights()} == {t.name for t in build_graph(config, 1, 64).weights()}


QKV_BIASED = "attn_q+attn_k+attn_v+attn_q_bias+attn_k_bias+attn_v_bias"


def test_a_prompt_runs_q_k_v_as_a_gemm_group_and_gate_up_with_its_swiglu_as_one_gemm():
    config = PRESETS["qwen2.5-0.5b"].config()
    graph = fuse(build_graph(config, 64, 256), one_type)
    groups = [node for node in graph.nodes if node.op is FusedOp.GEMM_GROUP]
    assert [node.name for node in groups[:1]] == [f"blk.0.{QKV_BIASED}"]
    assert len(groups) == config.n_layers
    assert [t.name for t in groups[0].outputs] == ["blk.0.attn_q_bias", "blk.0.attn_k_bias", "blk.0.attn_v_bias"]
    swiglus = [node for node in graph.nodes if node.op is FusedOp.GEMM_SWIGLU]
    assert len(swiglus) == config.n_layers
    assert swiglus[0].name == "blk.0.ffn_gate+ffn_up+ffn_silu+ffn_gated"
    assert swiglus[0].params["args"] == ("x", "gate", "up") and swiglus[0].output.name == "blk.0.ffn_gated"
    assert [t.name for t in swiglus[0].inputs] == ["blk.0.ffn_norm", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]
    ops = [node.op for node in graph.nodes]
    assert not {Op.SILU, Op.MUL, FusedOp.SWIGLU_F32, FusedOp.GEMV_QKV_ROPE_STORE, FusedOp.GEMV_SWIGLU} & set(ops)
    # A weight of another type ends a run (the Q4_K_M mix's attn_v), which keeps its own bias.
    mixed = fuse(build_graph(config, 64, 256), lambda name: 12 if name.endswith("attn_v.weight") else 8)
    group = next(n for n in mixed.nodes if n.op is FusedOp.GEMM_GROUP)
    assert group.name == "blk.0.attn_q+attn_k+attn_q_bias+attn_k_bias"
    attn_v = next(n for n in mixed.nodes if n.name.startswith("blk.0.attn_v"))
    assert attn_v.op is FusedOp.GEMM and attn_v.params["args"] == ("x", "weight", "bias")


def test_a_prompts_bias_and_residual_adds_are_its_gemms_epilogues():
    """Qwen2's q, k and v biases join their group, attn_output and ffn_down take the residual add after them (in
    place into the residual): no add_bias and no add is left of a prompt's layer."""
    config = PRESETS["qwen2.5-0.5b"].config()
    graph = fuse(build_graph(config, 64, 256), one_type)
    ops = [node.op for node in graph.nodes]
    assert Op.ADD_BIAS not in ops and Op.ADD not in ops
    group = next(n for n in graph.nodes if n.op is FusedOp.GEMM_GROUP)
    assert group.params["args"] == ("x", "weight_0", "weight_1", "weight_2", "bias_0", "bias_1", "bias_2")
    assert [t.name for t in group.inputs[4:]] == [f"blk.0.attn_{p}.bias" for p in "qkv"]
    gemms = [node for node in graph.nodes if node.op is FusedOp.GEMM]
    assert [n.name for n in gemms[:2]] == ["blk.0.attn_output+attn_residual", "blk.0.ffn_down+ffn_residual"]
    assert len(gemms) == 2 * config.n_layers
    attn_output = gemms[0]
    assert attn_output.params["args"] == ("x", "weight", "residual") and attn_output.inplace_input == 2
    assert attn_output.output.name == "blk.0.attn_residual"


def test_adds_the_gemm_cannot_make_stay_separate():
    """A bias that is not as long as the product's rows stays an add_bias, and so do the other parts' (the group's
    node would come after that add_bias, which reads its q); fewer than GEMM_MIN_TOKENS tokens (the matmul
    kernel, no epilogue) and one token (gemv) fold nothing into a GEMM; Gemma 3's residual adds read the
    post-block norm, not the product."""
    config = PRESETS["qwen2.5-0.5b"].config()
    graph = build_graph(config, 64, 256)
    nodes = {node.name: node for node in graph.nodes}
    q, bias = nodes["blk.0.attn_q_bias"].inputs
    short = Tensor(f"{bias.name}.short", (bias.shape[0] // 2,), "float32", TensorKind.WEIGHT)
    nodes["blk.0.attn_q_bias"] = dataclasses.replace(nodes["blk.0.attn_q_bias"], inputs=[q, short])
    short_bias = fuse(dataclasses.replace(graph, nodes=list(nodes.values())), one_type)
    biases = [n.name for n in short_bias.nodes if n.op is Op.ADD_BIAS]
    assert biases == [f"blk.0.attn_{p}_bias" for p in "qkv"]
    groups = [n for n in short_bias.nodes if n.op is FusedOp.GEMM_GROUP]
    assert [n.name for n in groups[:2]] == ["blk.0.attn_q+attn_k+attn_v", f"blk.1.{QKV_BIASED}"]
    for n_tokens in (1, 8):
        assert FusedOp.GEMM not in {node.op for node in fuse(build_graph(config, n_tokens, 256), one_type).nodes}
    gemma = lowered("tiny-gemma3", 20)
    assert FusedOp.GEMM not in {node.op for node in gemma.nodes}
    assert [node.op for node in gemma.nodes].count(FusedOp.RMS_NORM_ADD_F32) == 2 * PRESETS["tiny-gemma3"].n_layers


def test_few_tokens_take_the_matmul_kernel_and_no_group():
    graph = lowered("tiny-qwen2", 8)
    matmuls = [node for node in graph.nodes if node.op is Op.MATMUL]
    assert matmuls and {matmul_kernel(node) for node in matmuls} == {"matmul"}
    assert FusedOp.GEMM_GROUP not in {node.op for node in graph.nodes}


def test_gate_and_up_of_different_types_stay_separate_matmuls():
    graph = lowered("tiny-llama", 1, lambda name: 1 if name == "blk.1.ffn_up.weight" else 8)
    ops = [node.op for node in graph.nodes]
    assert ops.count(FusedOp.GEMV_SWIGLU) == 1  # layer 0 only
    layer_1 = [node.op for node in graph.nodes if node.name.startswith("blk.1.ffn")]
    assert layer_1 == [Op.RMS_NORM, Op.MATMUL, Op.MATMUL, FusedOp.SWIGLU_F32, FusedOp.GEMV]


# A decode layer of the families that norm each head of q and k before RoPE: the QKV kernel rotating nothing,
# then the attention that norms and rotates q and k itself; Gemma 3's sandwich norms keep its output products and
# residual adds apart.
QK_NORM_LAYERS = {
    "tiny-qwen3": [FusedOp.GEMV_QKV_ROPE_STORE, FusedOp.ATTENTION_DECODE, *FUSED_LAYER[2:]],
    "tiny-gemma3": [
        FusedOp.GEMV_QKV_ROPE_STORE, FusedOp.ATTENTION_DECODE, Op.MATMUL, FusedOp.RMS_NORM_ADD_F32,
        FusedOp.GEMV_GEGLU, Op.MATMUL, FusedOp.RMS_NORM_ADD_F32,
    ],
}  # fmt: skip


@pytest.mark.parametrize("preset", sorted(QK_NORM_LAYERS))
def test_a_qk_norm_decode_layer_is_the_qkv_kernel_then_the_attention_that_norms_q_and_k(preset):
    config = PRESETS[preset].config()
    graph = lowered(preset, 1)
    layers = [[node.op for node in graph.nodes if node.name.startswith(f"blk.{i}.")] for i in range(config.n_layers)]
    assert layers == [QK_NORM_LAYERS[preset]] * config.n_layers
    first = next(i for i, node in enumerate(graph.nodes) if node.name.startswith("blk.0."))
    qkv, attention_node = graph.nodes[first : first + 2]
    assert qkv.name == "blk.0.attn_norm+attn_q+attn_k+attn_v+kv_store"
    assert qkv.params["args"] == ("x", "norm_weight", "wq", "wk", "wv", "positions")  # no inv_freq: no rotation
    assert qkv.params["rope_dim"] == 0 and qkv.output.name == "blk.0.attn_q"
    assert [t.name for t in qkv.writes] == ["cache_k.0", "cache_v.0"]
    assert attention_node.name == "blk.0.attn_q_norm+rope_q+attn_k_norm+rope_k+attention"
    assert attention_node.params["args"] == (
        "q", "k_cache", "v_cache", "positions", "kv_len", "q_norm", "k_norm", "inv_freq",
    )  # fmt: skip
    assert [t.name for t in attention_node.inputs[:3]] == [qkv.output.name, "cache_k.0", "cache_v.0"]
    assert [t.name for t in attention_node.inputs[5:7]] == [f"blk.0.attn_{p}_norm.weight" for p in "qk"]
    assert attention_node.inplace_input is None and attention_node.output.name == "blk.0.attention"
    assert [t.name for t in attention_node.writes] == ["cache_k.0"]  # k normed and rotated in its cache row
    p = attention_node.params
    assert p["rope_dim"] == config.rope.n_rot and p["eps"] == config.rms_eps and p["head_dim"] == config.head_dim
    # Gemma 3's sliding-window layers turn by their own table, its global layers by the other.
    tables = {n.inputs[7].name for n in graph.nodes if n.op is FusedOp.ATTENTION_DECODE}
    assert tables == ({"rope.inv_freq", "rope.inv_freq_local"} if preset == "tiny-gemma3" else {"rope.inv_freq"})
    assert {t.name for t in graph.weights()} == {t.name for t in build_graph(config, 1, 64).weights()}


def test_a_post_block_norm_is_added_into_the_residual_in_one_kernel():
    """Gemma 3's post_attention_norm and post_ffw_norm, one token and a prompt alike: the norm and the add into
    the residual stream become one rms_norm_add_f32, in place into the residual."""
    for n_tokens in (1, 16):
        graph = lowered("tiny-gemma3", n_tokens)
        fused = [node for node in graph.nodes if node.op is FusedOp.RMS_NORM_ADD_F32]
        assert [node.name for node in fused[:2]] == ["blk.0.post_attention_norm+attn_residual",
                                                      "blk.0.post_ffw_norm+ffn_residual"]  # fmt: skip
        assert len(fused) == 2 * PRESETS["tiny-gemma3"].n_layers
        norm_add = fused[0]
        assert norm_add.params["args"] == ("x", "weight", "y") and norm_add.inplace_input == 2
        assert [t.name for t in norm_add.inputs[:2]] == ["blk.0.attn_output", "blk.0.post_attention_norm.weight"]
        assert norm_add.output.name == "blk.0.attn_residual"


def test_a_prompts_gelu_gate_joins_the_gate_up_group_as_one_gemm_geglu():
    """Gemma 3's GeGLU as the SwiGLU above: gelu and mul one geglu_f32 node, which the gate|up group takes in as
    its epilogue (gemm_geglu); below the GEMM's tokens it stays geglu_f32 after the two matmuls."""
    n_layers = PRESETS["tiny-gemma3"].n_layers
    graph = lowered("tiny-gemma3", 20)
    geglus = [node for node in graph.nodes if node.op is FusedOp.GEMM_GEGLU]
    assert len(geglus) == n_layers
    assert geglus[0].params["args"] == ("x", "gate", "up")
    assert [t.name for t in geglus[0].inputs[1:]] == ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]
    ops = [node.op for node in graph.nodes]
    assert not {Op.GELU, Op.MUL, FusedOp.GEGLU_F32, FusedOp.GEMM_SWIGLU} & set(ops)
    short = [node.op for node in lowered("tiny-gemma3", 8).nodes]
    assert short.count(FusedOp.GEGLU_F32) == n_layers and FusedOp.GEMM_GEGLU not in short
    assert not {Op.GELU, Op.MUL} & set(short)


def test_a_swiglu_without_a_gate_up_group_stays_swiglu_f32():
    """Gate and up of two types (no group), Phi's fused gate|up weight (one product, sliced) and fewer tokens
    than the GEMM takes keep swiglu_f32; Gemma 3's GELU gate is no SwiGLU."""
    config = PRESETS["qwen2.5-0.5b"].config()
    mixed = fuse(build_graph(config, 64, 256), lambda name: 12 if name.endswith("ffn_up.weight") else 8)
    phi = fuse(build_graph(PRESETS["phi4-mini-small"].config(), 64, 256), one_type)
    for graph in (mixed, phi, lowered("qwen2.5-0.5b", 8)):
        ops = [node.op for node in graph.nodes]
        assert FusedOp.GEMM_SWIGLU not in ops and FusedOp.SWIGLU_F32 in ops
    assert FusedOp.GEMM_SWIGLU not in {node.op for node in lowered("tiny-gemma3", 20).nodes}


def changed_layer_0(graph: Graph, change: str) -> Graph:
    """tiny-qwen3's graph with layer 0's q/k norms made into something the QKV rule cannot split off."""
    nodes = {node.name: node for node in graph.nodes}
    if change == "k not normed":
        k, rope_k = nodes.pop("blk.0.attn_k_norm").inputs[0], nodes["blk.0.rope_k"]
        nodes["blk.0.rope_k"] = dataclasses.replace(rope_k, inputs=[k, *rope_k.inputs[1:]])
    elif change == "eps of its own":
        nodes["blk.0.attn_k_norm"] = dataclasses.replace(nodes["blk.0.attn_k_norm"], params={"eps": 1e-3})
    else:  # a weight as long as q's row
        q, weight = nodes["blk.0.attn_q_norm"].inputs
        row_weight = Tensor(f"{weight.name}.row", q.shape[1:], "float32", TensorKind.WEIGHT)
        nodes["blk.0.attn_q_norm"] = dataclasses.replace(nodes["blk.0.attn_q_norm"], inputs=[q, row_weight])
    return dataclasses.replace(graph, nodes=list(nodes.values()))


@pytest.mark.parametrize("change", ["k not normed", "eps of its own", "q normed as a whole row"])
def test_q_and_k_norms_the_head_norm_kernel_cannot_run_leave_the_projections_unfused(change):
    """Norms of q and k that the normed attention does not compute (one of them missing, two epsilons, a weight
    longer than a head): layer 0 keeps its primitive nodes, the other layers and rules are as ever."""
    config = PRESETS["tiny-qwen3"].config()
    graph = fuse(changed_layer_0(build_graph(config, 1, 64), change), one_type)
    layer_0 = [node.op for node in graph.nodes if node.name.startswith("blk.0.")]
    assert FusedOp.GEMV_QKV_ROPE_STORE not in layer_0 and FusedOp.ATTENTION_DECODE not in layer_0
    assert layer_0[:4] == [Op.RMS_NORM, Op.MATMUL, Op.MATMUL, Op.MATMUL] and Op.KV_STORE in layer_0
    assert layer_0[-3:] == FUSED_LAYER[2:]
    layer_1 = [node.op for node in graph.nodes if node.name.startswith("blk.1.")]
    assert layer_1 == QK_NORM_LAYERS["tiny-qwen3"]


class FusedCpuGraph(CpuCompiledGraph):
    """The CPU reference, also running the CUDA backend's fused ops as the compositions they name."""

    def gemv(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        parts = dict(zip(node.params["args"], ins, strict=True))
        x = parts["x"]
        if "norm_weight" in parts:
            x = np.empty_like(x)
            rms_norm(parts["x"], parts["norm_weight"], node.params["eps"], x)
        product = x @ parts["weight"].T
        if "residual" in parts:
            out += product  # out holds the residual: aliased or staged
        else:
            out[...] = product

    def gate_up(self, node: Node, ins: list[np.ndarray], out: np.ndarray, activation: Op) -> None:
        """activation(h Wgate) * (h Wup), the activation the CPU reference's own op."""
        parts = dict(zip(node.params["args"], ins, strict=True))
        h = np.empty_like(parts["x"])
        rms_norm(parts["x"], parts["norm_weight"], node.params["eps"], h)
        out[...] = h @ parts["gate"].T
        OPS[activation](self, node, [out], out)
        out *= h @ parts["up"].T

    def gemv_swiglu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        self.gate_up(node, ins, out, Op.SILU)

    def gemv_geglu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        self.gate_up(node, ins, out, Op.GELU)

    def gemv_qkv_rope_store(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        parts = dict(zip(node.params["args"], ins, strict=True))
        p = node.params
        h = np.empty_like(parts["x"])
        rms_norm(parts["x"], parts["norm_weight"], p["eps"], h)
        q, k, v = (h @ parts[f"w{name}"].T + parts.get(f"b{name}", 0) for name in "qkv")
        if p["rope_dim"]:  # 0: attention_decode_f32 rotates them
            rope = (p["head_dim"], p["rope_dim"], parts["inv_freq"], p["mscale"], p["neox"])
            rope_inplace(q, parts["positions"], p["n_heads"], *rope)
            rope_inplace(k, parts["positions"], p["n_kv_heads"], *rope)
        self.kv_store(node, [k, v, parts["positions"]], None)
        out[...] = q

    def attention_decode_f32(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        """q normed and rotated (q itself stays raw), the same of k in its cache row, then the attention."""
        parts = dict(zip(node.params["args"], ins, strict=True))
        p, positions = node.params, parts["positions"]
        cache_k = self.array(node.writes[0])
        q, k = parts["q"].copy(), cache_k[positions]
        rope = (p["head_dim"], p["rope_dim"], parts["inv_freq"], p["mscale"], p["neox"])
        for x, weight, n_heads in ((q, parts["q_norm"], p["n_heads"]), (k, parts["k_norm"], p["n_kv_heads"])):
            rms_norm(x, weight, p["eps"], x)
            rope_inplace(x, positions, n_heads, *rope)
        cache_k[positions] = k
        attention(
            q, cache_k, parts["v_cache"], positions, int(parts["kv_len"][0]), p["n_heads"], p["n_kv_heads"],
            p["head_dim"], p["scale"], p["window"], out,
        )  # fmt: skip

    def swiglu_f32(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        out[...] = out / (1 + np.exp(-out)) * ins[1]  # out holds the gate

    def geglu_f32(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        OPS[Op.GELU](self, node, [out], out)  # out holds the gate
        out *= ins[1]

    def rms_norm_add_f32(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        x, weight, _ = ins
        normed = np.empty_like(x)
        rms_norm(x, weight, node.params["eps"], normed)
        out += normed  # out holds y: aliased or staged

    def gemm(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        parts = dict(zip(node.params["args"], ins, strict=True))
        product = parts["x"] @ parts["weight"].T + parts.get("bias", 0)
        if "residual" in parts:
            out += product  # out holds the residual: aliased or staged
        else:
            out[...] = product

    def gemm_gated(self, node: Node, ins: list[np.ndarray], out: np.ndarray, activation: Op) -> None:
        parts = dict(zip(node.params["args"], ins, strict=True))
        out[...] = parts["x"] @ parts["gate"].T
        OPS[activation](self, node, [out], out)
        out *= parts["x"] @ parts["up"].T

    def gemm_swiglu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        self.gemm_gated(node, ins, out, Op.SILU)

    def gemm_geglu(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        self.gemm_gated(node, ins, out, Op.GELU)

    def gemm_group(self, node: Node, ins: list[np.ndarray], out: np.ndarray) -> None:
        parts = dict(zip(node.params["args"], ins, strict=True))
        for part, output in enumerate(node.outputs):
            self.array(output)[...] = parts["x"] @ parts[f"weight_{part}"].T + parts.get(f"bias_{part}", 0)


FUSED_OPS = {op: getattr(FusedCpuGraph, op.value) for op in FusedOp}


class FusedCpu(CpuBackend):
    """The CPU backend lowering as the CUDA backend does (the file's types decide the gate/up rule)."""

    def __init__(self, gguf: GGUFFile) -> None:
        super().__init__()
        self.gguf = gguf

    def lower(self, graph: Graph) -> Graph:
        return fuse(graph, lambda name: int(self.gguf.tensor(name).qtype))

    def compile(self, graph, plan) -> CpuCompiledGraph:
        return FusedCpuGraph(self, graph, plan)


@pytest.fixture
def fused_ops(monkeypatch):
    for op, method in FUSED_OPS.items():
        monkeypatch.setitem(OPS, op, method)


@pytest.mark.parametrize(
    ("preset", "weight_type", "n_tokens"),
    [("tiny-llama", "Q8_0", 1), ("tiny-qwen2", "Q4_0", 1), ("tiny-qwen2", "Q4_K_M", 1), ("tiny-llama", "F16", 20),
     ("tiny-qwen2", "Q8_0", 20),
     ("tiny-qwen3", "Q8_0", 1), ("tiny-qwen3", "Q4_K_M", 1), ("tiny-gemma3", "Q4_0", 1), ("tiny-gemma3", "Q8_0", 20),
     ("tiny-gemma3", "F16", 8)],
)  # fmt: skip
def test_the_lowered_graph_computes_what_the_models_graph_does(synthetic_model, fused_ops, preset, weight_type,
                                                               n_tokens):  # fmt: skip
    spec = scaled(preset, d_model=256, d_ff=512) if weight_type == "Q4_K_M" else preset
    path = synthetic_model(spec, weight_type)
    reference = minfer.load(path, backend="cpu", ctx_size=CTX)
    gguf = reference.gguf
    fused_backend = FusedCpu(gguf)
    fused_backend.weights = reference.backend.weights  # the same float32 weights
    config = reference.config
    programs = {}
    for name, backend in (("primitive", reference.backend), ("lowered", fused_backend)):
        programs[name] = schedule(build_graph(config, n_tokens, CTX), backend)
    assert any(isinstance(node.op, FusedOp) for node in programs["lowered"].graph.nodes)
    prompt = [5, 17, 300, 2, 41, 99]
    reference.prefill(prompt)  # cache rows 0..5, copied into the lowered backend's own cache
    for name, cache in reference.backend.states.items():
        np.copyto(fused_backend.states[name], cache)
    rng = np.random.default_rng(1)
    for step in range(3):
        start = len(prompt) + step * n_tokens
        inputs = {
            "tokens": rng.integers(0, config.vocab_size, n_tokens, dtype=np.int32),
            "positions": np.arange(start, start + n_tokens, dtype=np.int32),
            "kv_len": np.array([start + n_tokens], np.int32),
        }
        for program in programs.values():
            program.run(inputs)
        expected = programs["primitive"].read("logits")
        np.testing.assert_allclose(programs["lowered"].read("logits"), expected, rtol=2e-5, atol=2e-5)
        for name, cache in reference.backend.states.items():
            np.testing.assert_allclose(fused_backend.states[name][: start + n_tokens], cache[: start + n_tokens],
                                       rtol=1e-5, atol=1e-6, err_msg=name)  # fmt: skip
