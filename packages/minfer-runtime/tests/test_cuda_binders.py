"""The CUDA binders without a GPU: every node of every lowered graph binds, and each launch names exactly
its launcher's parameters (the signature nanobind gives `minfer_kernels`), so a misnamed or missing
argument fails here, not on the device. Needs the minfer-kernels package, not a GPU."""

from __future__ import annotations

import re

import pytest

from minfer.errors import BackendError
from minfer.graph.ir import Op, Tensor
from minfer.models import build_graph
from minfer.testing.synthetic import scaled

mk = pytest.importorskip("minfer_kernels", reason="minfer-kernels is not installed (it needs nvcc to build)")
from minfer.backends.cuda.binders import (  # noqa: E402 (needs minfer_kernels)
    BINDERS,
    decode_attention_splits,
    graph_workspace_bytes,
)
from minfer.backends.cuda.fuse import FusedOp, fuse  # noqa: E402


def every_weight(ggml_type: mk.GGMLType):
    """The weight-type lookup of a model whose every weight is `ggml_type`."""
    return lambda name: int(ggml_type)


class FakeBinding:
    """Addresses by tensor name, every weight Q8_0: what a binder reads of a compiled graph."""

    stream = 7
    workspace = 1 << 20
    workspace_bytes = 1 << 24
    multiprocessors = 132  # an H200's

    def __init__(self) -> None:
        self.addresses: dict[str, int] = {}

    def ptr(self, tensor: Tensor) -> int:
        return self.addresses.setdefault(tensor.name, (len(self.addresses) + 1) << 12)

    def weight_type(self, tensor: Tensor) -> int:
        return int(mk.GGMLType.Q8_0)


def parameters(kernel) -> list[str]:
    """The parameter names of a nanobind function, from its signature line."""
    signature = kernel.__doc__.splitlines()[0]
    return re.findall(r"(\w+):", signature[signature.index("(") :])


@pytest.mark.parametrize("n_tokens", [1, 3, 64])
@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "gemma3-270m", "phi4-mini-small"])
def test_every_launch_names_exactly_its_launchers_parameters(preset, n_tokens):
    config = scaled(preset, n_layers=6, final_logit_softcap=30.0 if preset.startswith("gemma3") else 0.0).config()
    graph = fuse(build_graph(config, n_tokens, 128), lambda name: int(mk.GGMLType.Q8_0))
    binding = FakeBinding()
    kernels, head_normed = set(), set()
    for node in graph.nodes:
        for launch in BINDERS[node.op](binding, node):
            kernels.add(launch.kernel.__name__)
            assert sorted(launch.args) == sorted(parameters(launch.kernel)), f"{node.name}: {launch.kernel.__name__}"
            if launch.args.get("q_norm") is not None:
                head_normed.add(launch.kernel.__name__)
    fused = {op.value for op in FusedOp} & {node.op.value for node in graph.nodes}
    assert fused, "the lowering fused nothing"
    # One token: separate q, k and v products go through the fused QKV kernel; where each head of q and k is
    # normed before RoPE, attention_decode_f32 norms and rotates them after it; Gemma's GELU gate is gemv_geglu.
    decode = n_tokens == 1
    assert ("gemv_qkv_rope_store" in kernels) == (decode and not config.fused_qkv)
    assert head_normed == ({"attention_decode_f32"} if decode and config.qk_norm else set())
    assert ("gemv_geglu" in kernels) == (decode and config.activation == "gelu")


def test_a_graphs_workspace_is_the_most_any_of_its_launches_needs():
    """Qwen2.5-0.5B on an H200's 132 SMs, n_ctx 1024: a prompt's ffn_down needs its x rounded to 16 bits
    ([n_tokens][4864]) and its slices' partial sums (4 slices of [512][896] floats at 512 tokens, 8 of [128][896]
    at 128), more than the prompt's attention (3 slices of the cache rows at 512 tokens, [512][14] states of
    64 + 2 floats each; 4 at 128, one per 256 rows of n_ctx) and the other GEMMs; decode attention's alone."""
    config = scaled("qwen2.5-0.5b", n_layers=2).config()
    heads, head_dim = config.n_heads, config.head_dim
    f16 = every_weight(mk.GGMLType.F16)  # no staged weights
    for n_tokens, gemm_splits, attention_splits in ((512, 4, 3), (128, 8, 4)):
        graph = fuse(build_graph(config, n_tokens, 1024), f16)
        rounded_x = -(-n_tokens * config.d_ff * 2 // 256) * 256
        gemm = rounded_x + gemm_splits * n_tokens * config.d_model * 4
        attention = attention_splits * n_tokens * heads * (head_dim + 2) * 4
        assert mk.kernels.attention_prefill_workspace_bytes(n_tokens, heads, head_dim, 1024, 132) == attention
        assert graph_workspace_bytes(graph.nodes, 132, f16) == max(gemm, attention)
    # Q8_0 at 512 tokens: ffn_down's launch adds its staged rows ([896][4864] f16) to its rounded x and slices.
    q8 = every_weight(mk.GGMLType.Q8_0)
    graph = fuse(build_graph(config, 512, 1024), q8)
    staged_down = (
        -(-512 * config.d_ff * 2 // 256) * 256 + 4 * 512 * config.d_model * 4 + config.d_model * config.d_ff * 2
    )
    assert graph_workspace_bytes(graph.nodes, 132, q8) == staged_down
    decode = fuse(build_graph(config, 1, 1024), q8)
    needs = mk.kernels.attention_decode_workspace_bytes(heads, head_dim, decode_attention_splits(2, 132))
    assert graph_workspace_bytes(decode.nodes, 132, q8) == needs


def test_decode_attention_is_cut_into_about_a_block_an_sm():
    """splits x KV heads near the SMs, in powers of two: Qwen2.5-0.5B's 2 KV heads keep step 19's 64 splits on an
    H200, Llama-3.2-1B's and Qwen3-0.6B's 8 take 16, Gemma 3 270M's one 128; never past the kernel's 256."""
    assert [decode_attention_splits(kv, 132) for kv in (1, 2, 4, 8, 16, 64, 200)] == [128, 64, 32, 16, 8, 2, 1]
    assert decode_attention_splits(1, 1000) == 256 and decode_attention_splits(3, 132) == 32
    config = scaled("llama3.2-1b", n_layers=1).config()
    decode = fuse(build_graph(config, 1, 4096), every_weight(mk.GGMLType.Q8_0))
    node = next(n for n in decode.nodes if n.op is Op.ATTENTION)
    (launch,) = BINDERS[node.op](FakeBinding(), node)
    assert launch.kernel is mk.kernels.attention_decode_f32 and launch.args["n_splits"] == 16


def test_a_qk_norm_decode_attention_launch_norms_and_rotates_q_and_k_itself():
    """Qwen3's one-token attention: the fused node passes its norm weights, their epsilon and the rotation to
    attention_decode_f32, and the graph's workspace holds its split results as any decode attention's."""
    config = scaled("qwen3-0.6b", n_layers=1).config()
    q8 = every_weight(mk.GGMLType.Q8_0)
    decode = fuse(build_graph(config, 1, 1024), q8)
    node = next(n for n in decode.nodes if n.op is FusedOp.ATTENTION_DECODE)
    binding = FakeBinding()
    (launch,) = BINDERS[node.op](binding, node)
    assert launch.kernel is mk.kernels.attention_decode_f32
    named = dict(zip(node.params["args"], node.inputs, strict=True))
    for arg in ("q", "k_cache", "v_cache", "kv_len", "q_norm", "k_norm", "inv_freq"):
        assert launch.args[arg] == binding.ptr(named[arg]), arg
    mode = mk.kernels.ROPE_NEOX if config.rope.neox else mk.kernels.ROPE_NORMAL
    assert (launch.args["head_eps"], launch.args["n_rot"], launch.args["mode"]) == (
        config.rms_eps,
        config.rope.n_rot,
        mode,
    )
    splits = decode_attention_splits(config.n_kv_heads, 132)
    needs = mk.kernels.attention_decode_workspace_bytes(config.n_heads, config.head_dim, splits)
    assert graph_workspace_bytes(decode.nodes, 132, q8) == needs


def test_a_prompts_attention_splits_on_the_caches_rows_into_the_graphs_workspace():
    """The prompt's attention launch: max_rows is the cache's n_ctx (the graph runs at any depth), and the
    workspace is the graph's, which graph_workspace_bytes sized for it."""
    config = scaled("qwen2.5-0.5b", n_layers=2).config()
    graph = fuse(build_graph(config, 64, 2048), lambda name: int(mk.GGMLType.Q8_0))
    binding = FakeBinding()
    node = next(node for node in graph.nodes if node.op is Op.ATTENTION)
    (launch,) = BINDERS[node.op](binding, node)
    assert launch.kernel is mk.kernels.attention_prefill_f32
    assert launch.args["max_rows"] == 2048
    assert (launch.args["workspace"], launch.args["workspace_bytes"]) == (binding.workspace, binding.workspace_bytes)
    # 14 query tiles: 8 slices (one per 256 rows of 2048) of [64][14] states.
    assert (
        graph_workspace_bytes(graph.nodes, 132, every_weight(mk.GGMLType.Q8_0))
        >= 8 * 64 * config.n_heads * (config.head_dim + 2) * 4
    )


def test_a_graph_with_decode_attention_and_split_partials_is_refused():
    """Decode attention's counters must stay zeroed: a node that writes into the same workspace is refused with
    its name (no model builds such a graph; this one is spliced)."""
    config = scaled("qwen2.5-0.5b", n_layers=2).config()
    decode = fuse(build_graph(config, 1, 1024), lambda name: int(mk.GGMLType.Q8_0))
    prompt = fuse(build_graph(config, 64, 1024), lambda name: int(mk.GGMLType.Q8_0))
    attention = next(node for node in prompt.nodes if node.op is Op.ATTENTION)
    with pytest.raises(BackendError, match=rf"cuda: {attention.name}: .*decode attention"):
        graph_workspace_bytes([*decode.nodes, attention], 132, every_weight(mk.GGMLType.Q8_0))


@pytest.mark.parametrize(("cache_type", "ggml_type"), [("f32", mk.GGMLType.F32), ("f16", mk.GGMLType.F16)])
@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "qwen3-0.6b", "gemma3-270m"])
def test_every_cache_launch_passes_the_graphs_cache_type(preset, cache_type, ggml_type):
    """The store, the q|k|v product that stores k and v, and attention read the cache's type from the graph's
    cache tensors (models/llama.py: KV_CACHE_TYPES), in a prompt's graph and a step's."""
    config = scaled(preset, n_layers=2).config()
    cache_kernels = set()
    for n_tokens in (1, 7):
        graph = fuse(build_graph(config, n_tokens, 128, cache_type), lambda name: int(mk.GGMLType.Q8_0))
        for node in graph.nodes:
            for launch in BINDERS[node.op](FakeBinding(), node):
                if "k_cache" in launch.args:
                    cache_kernels.add(launch.kernel.__name__)
                    assert launch.args["cache_type"] == int(ggml_type), f"{node.name}: {launch.kernel.__name__}"
    assert {"attention_decode_f32", "attention_prefill_f32", "kv_store_f32"} <= cache_kernels


@pytest.mark.parametrize(
    ("n_tokens", "op", "spliced", "dtype", "refusal"),
    [
        (1, Op.ATTENTION, "inputs", "bfloat16",
         r"KV cache cache_k\.0 is bfloat16: the kernels store float32 or float16"),
        (7, Op.KV_STORE, "writes", "float16", r"KV caches cache_k\.0 \(float32\) and cache_v\.0 \(float16\) differ"),
    ],
    ids=["k of another dtype", "k and v of two dtypes"],
)  # fmt: skip
def test_caches_the_kernels_cannot_take_are_refused_naming_them(n_tokens, op, spliced, dtype, refusal):
    """A KV cache the graph would never declare, spliced into a node: the binder refuses it by name."""
    config = scaled("qwen2.5-0.5b", n_layers=1).config()
    graph = fuse(build_graph(config, n_tokens, 128), lambda name: int(mk.GGMLType.Q8_0))
    node = next(n for n in graph.nodes if n.op is op)
    tensors = getattr(node, spliced)  # attention's inputs: q, cache_k, ...; the store's writes: cache_k, cache_v
    cache = tensors[1]
    tensors[1] = Tensor(cache.name, cache.shape, dtype, cache.kind)
    with pytest.raises(BackendError, match=rf"cuda: {node.name}: {refusal}"):
        BINDERS[node.op](FakeBinding(), node)
