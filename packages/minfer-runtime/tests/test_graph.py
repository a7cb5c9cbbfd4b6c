"""The compute graph: builder shape, liveness allocator and alias rule, scheduler, DOT export."""

from __future__ import annotations

import numpy as np
import pytest
from engine_steps import shared_inplace_input_graph

from minfer.backends.cpu import CpuBackend
from minfer.backends.cuda.fuse import fuse
from minfer.errors import BackendError
from minfer.graph.alloc import plan_buffers
from minfer.graph.dot import to_dot
from minfer.graph.ir import Graph, Op, TensorKind
from minfer.models import build_graph
from minfer.scheduler import schedule
from minfer.testing.synthetic import PRESETS, scaled


def structure(graph: Graph) -> list[tuple]:
    return [
        (n.name, n.op, [(t.name, t.shape) for t in n.inputs], n.output and n.output.shape, sorted(n.params.items()))
        for n in graph.nodes
    ]


@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "gemma3-270m", "phi4-mini-small"])
def test_graph_has_every_layer_and_reads_every_weight(preset):
    config = PRESETS[preset].config()
    graph = build_graph(config, 7, 256)
    weights = {t.name for t in graph.weights()}
    assert weights == set(config.expected_tensors()) - ({"output.weight"} if config.tied_output else set())
    assert len(graph.states()) == 2 * config.n_layers
    assert graph.outputs["logits"].shape == (1, config.vocab_size)
    ops = [n.op for n in graph.nodes]
    assert ops.count(Op.ATTENTION) == ops.count(Op.KV_STORE) == config.n_layers
    assert ops.count(Op.ADD_BIAS) == (3 * config.n_layers if config.qkv_bias else 0)


def test_qwen3_norms_every_head_of_q_and_k_before_rope():
    config = PRESETS["qwen3-0.6b"].config()
    nodes = {n.name: n for n in build_graph(config, 3, 64).nodes}
    for part, width in (("q", config.q_dim), ("k", config.kv_dim)):
        norm = nodes[f"blk.0.attn_{part}_norm"]
        assert norm.op is Op.RMS_NORM and norm.inputs[1].shape == (config.head_dim,) and norm.output.shape == (3, width)
        assert nodes[f"blk.0.rope_{part}"].inputs[0] is norm.output
    assert config.q_dim == 2048 != config.d_model


def test_gemma3_layers_window_scale_and_cap_as_llama_cpp_does():
    config = scaled("gemma3-270m", final_logit_softcap=30.0).config()
    graph = build_graph(config, 3, 1024)
    nodes = {n.name: n for n in graph.nodes}
    assert nodes["embed_scale"].params["factor"] == pytest.approx(640**0.5)
    windows = [nodes[f"blk.{layer}.attention"].params["window"] for layer in range(config.n_layers)]
    assert windows == [0 if layer % 6 == 5 else 512 for layer in range(18)]
    tables = [nodes[f"blk.{layer}.rope_q"].inputs[2].name for layer in range(config.n_layers)]
    assert tables == ["rope.inv_freq" if layer % 6 == 5 else "rope.inv_freq_local" for layer in range(18)]
    assert {nodes[f"blk.{layer}.attention"].params["scale"] for layer in range(18)} == {1 / 16}
    for norm in ("post_attention_norm", "post_ffw_norm"):
        assert nodes[f"blk.0.{norm}"].inputs[1].name == f"blk.0.{norm}.weight"
    assert nodes["blk.0.ffn_gelu"].op is Op.GELU
    assert graph.outputs["logits"] is nodes["output_softcap"].output and nodes["output_softcap"].params["cap"] == 30.0
    np.testing.assert_allclose(graph.constants["rope.inv_freq_local"][1], 10000 ** (-2 / 256))


def test_phi3_slices_its_fused_projections():
    config = PRESETS["phi4-mini-small"].config()
    nodes = {n.name: n for n in build_graph(config, 2, 64).nodes}
    starts = {part: nodes[f"blk.0.attn_qkv.{part}"].params["start"] for part in "qkv"}
    assert starts == {"q": 0, "k": config.q_dim, "v": config.q_dim + config.kv_dim}
    assert nodes["blk.0.ffn_up.up"].params["start"] == config.d_ff and nodes["blk.0.ffn_silu"].inputs[0].name == (
        "blk.0.ffn_up.gate"
    )
    assert nodes["blk.0.rope_q"].params["rope_dim"] == 48 < config.head_dim


def test_activation_names_never_collide_with_weight_names():
    graph = build_graph(PRESETS["qwen2.5-0.5b"].config(), 2, 64)
    activations = {n.output.name for n in graph.nodes if n.output is not None}
    assert len(activations) == len([n for n in graph.nodes if n.output is not None])
    assert not activations & {t.name for t in graph.weights()}


def test_graph_is_a_pure_function_of_the_token_count():
    config = PRESETS["tiny-qwen2"].config()
    assert structure(build_graph(config, 5, 128)) == structure(build_graph(config, 5, 128))
    decode = build_graph(config, 1, 128)
    assert {t.shape for t in decode.inputs.values()} == {(1,)}
    assert all("position" not in k for n in decode.nodes for k in n.params)


def live_intervals(graph: Graph) -> dict[str, tuple[int, int]]:
    """Activation name -> (producing node index, last reading node index); outputs live to the end."""
    consumers = graph.consumers()
    end = len(graph.nodes)
    intervals = {}
    for index, node in enumerate(graph.nodes):
        for output in node.outputs:
            readers = consumers.get(output.name, [])
            last = end if output in graph.outputs.values() else max(readers, default=index)
            intervals[output.name] = (index, last)
    return intervals


@pytest.mark.parametrize("lowered", [False, True], ids=["model graph", "lowered for cuda"])
@pytest.mark.parametrize("n_tokens", [1, 9, 64])
def test_allocator_never_shares_a_buffer_between_live_tensors(n_tokens, lowered):
    graph = build_graph(scaled("tiny-qwen2", n_layers=8, d_model=256, d_ff=512).config(), n_tokens, 64)
    if lowered:  # fused nodes, gemm groups among them: nodes of several outputs
        graph = fuse(graph, lambda name: 8)
    plan = plan_buffers(graph)
    intervals = live_intervals(graph)
    handovers = {(n.inputs[n.inplace_input].name, n.output.name) for n in graph.nodes if n.name in plan.aliased}
    names = list(intervals)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if plan.slot_of[a] != plan.slot_of[b] or (a, b) in handovers:
                continue
            (a0, a1), (b0, b1) = intervals[a], intervals[b]
            assert a1 <= b0 or b1 <= a0, f"{a} and {b} share slot {plan.slot_of[a]} while both live"
    for name, slot in plan.slot_of.items():
        tensor = next(t for n in graph.nodes for t in n.outputs if t.name == name)
        assert plan.slot_nbytes[slot] == tensor.nbytes
    assert len(plan.slot_nbytes) < len(intervals) / 4  # reuse is real: far fewer buffers than tensors


def test_alias_rule_aliases_an_inplace_input_at_its_last_reader():
    graph = build_graph(PRESETS["tiny-qwen2"].config(), 3, 64)
    plan = plan_buffers(graph)
    consumers = graph.consumers()
    for index, node in enumerate(graph.nodes):
        if node.inplace_input is None:
            continue
        source = node.inputs[node.inplace_input]
        last = source.kind is TensorKind.ACTIVATION and max(consumers[source.name]) == index
        assert (node.name in plan.aliased) == last, node.name
    # The residual adds take over x although attn_norm and ffn_norm read it first.
    assert {Op.ROPE, Op.ADD, Op.SILU, Op.MUL} <= {n.op for n in graph.nodes if n.name in plan.aliased}


def test_backend_stages_a_copy_when_an_inplace_input_has_other_readers():
    d, vocab = 8, 4
    graph = shared_inplace_input_graph(d, vocab)
    backend = CpuBackend()
    rng = np.random.default_rng(0)
    backend.weights = {"table": rng.standard_normal((vocab, d)).astype(np.float32),
                       "bias": rng.standard_normal(d).astype(np.float32)}  # fmt: skip
    program = schedule(graph, backend)
    assert program.plan.aliased == {"z"}  # y's input x has two readers; z's input y has one
    program.run({"tokens": np.array([3, 1], dtype=np.int32)})
    rows = backend.weights["table"][[3, 1]]
    np.testing.assert_allclose(program.read("z"), rows + (rows + backend.weights["bias"]), rtol=1e-6)


def test_scheduler_refuses_a_node_the_backend_cannot_run(monkeypatch):
    graph = build_graph(PRESETS["tiny-llama"].config(), 2, 16)
    backend = CpuBackend()
    monkeypatch.setattr(backend, "supports", lambda op: op is not Op.SILU)
    with pytest.raises(BackendError, match=r"cpu: blk\.0\.ffn_silu: op 'silu' is not supported"):
        schedule(graph, backend)


def test_dot_export_draws_every_node_and_weight():
    graph = build_graph(PRESETS["tiny-llama"].config(), 2, 16)
    plan = plan_buffers(graph)
    dot = to_dot(graph, plan)
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    for node in graph.nodes:
        assert f'"n:{node.name}"' in dot
    for weight in graph.weights():
        assert f'"t:{weight.name}"' in dot
    assert '"n:blk.0.kv_store" -> "t:cache_k.0" [style=dashed]' in dot
