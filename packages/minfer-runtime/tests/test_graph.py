"""The compute graph: builder shape, liveness allocator and alias rule, scheduler, DOT export."""

from __future__ import annotations

import numpy as np
import pytest
from engine_steps import shared_inplace_input_graph

from minfer.backends.cpu import CpuBackend
from minfer.backends.cuda.gemm_groups import gemm_groups
from minfer.errors import BackendError
from minfer.graph.alloc import plan_buffers
from minfer.graph.dot import to_dot
from minfer.graph.ir import Graph, Op, TensorKind
from minfer.graph.scheduler import assign_backends, schedule
from minfer.models import build_graph
from minfer.testing.synthetic import PRESETS, scaled


def structure(graph: Graph) -> list[tuple]:
    return [
        (n.name, n.op, [(t.name, t.shape) for t in n.inputs], n.output and n.output.shape, sorted(n.params.items()))
        for n in graph.nodes
    ]


@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen2.5-0.5b"])
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
        if node.output is not None:
            readers = consumers.get(node.output.name, [])
            last = end if node.output in graph.outputs.values() else max(readers, default=index)
            intervals[node.output.name] = (index, last)
    return intervals


@pytest.mark.parametrize("n_tokens", [1, 9])
def test_allocator_never_shares_a_buffer_between_live_tensors(n_tokens):
    graph = build_graph(scaled("tiny-qwen2", n_layers=8).config(), n_tokens, 64)
    plan = plan_buffers(graph, assign_backends(graph, CpuBackend()))
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
        tensor = next(n.output for n in graph.nodes if n.output is not None and n.output.name == name)
        assert plan.slot_nbytes[slot] == tensor.nbytes
    assert len(plan.slot_nbytes) < len(intervals) / 4  # reuse is real: far fewer buffers than tensors


def test_alias_rule_aliases_only_sole_consumers():
    graph = build_graph(PRESETS["tiny-qwen2"].config(), 3, 64)
    plan = plan_buffers(graph, assign_backends(graph, CpuBackend()))
    consumers = graph.consumers()
    for node in graph.nodes:
        if node.inplace_input is None:
            continue
        source = node.inputs[node.inplace_input]
        sole = source.kind is TensorKind.ACTIVATION and len(consumers[source.name]) == 1
        assert (node.name in plan.aliased) == sole, node.name
    assert any(n.op is Op.ROPE for n in graph.nodes if n.name in plan.aliased)


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


def test_gemm_groups_are_runs_of_prompt_products_of_one_x_and_type():
    config = PRESETS["qwen2.5-0.5b"].config()
    graph = build_graph(config, 64, 256)
    groups = gemm_groups(graph.nodes, lambda weight: 2)
    assert {first: [node.name.split(".")[-1] for node in run] for first, run in groups.items()} == {
        f"blk.{layer}.{first}": names
        for layer in range(config.n_layers)
        for first, names in (("attn_q", ["attn_q", "attn_k", "attn_v"]), ("ffn_gate", ["ffn_gate", "ffn_up"]))
    }
    # A weight of another type ends a run (the Q4_K_M mix's attn_v); one-token products are no run at all.
    mixed = gemm_groups(graph.nodes, lambda weight: 8 if weight.name.endswith("attn_v.weight") else 2)
    assert [node.name for node in mixed["blk.0.attn_q"]] == ["blk.0.attn_q", "blk.0.attn_k"]
    assert gemm_groups(build_graph(config, 8, 256).nodes, lambda weight: 2) == {}


def test_a_gemm_groups_later_outputs_take_buffers_free_when_the_run_begins():
    """The grouped launch writes every output of a run at its first node: their buffers must not hold a
    tensor that is still live there."""
    graph = build_graph(PRESETS["qwen2.5-0.5b"].config(), 64, 256)
    plan = plan_buffers(graph, {node.name: "cuda" for node in graph.nodes})
    produced = {node.output.name: index for index, node in enumerate(graph.nodes) if node.output is not None}
    last_read = {name: max(readers) for name, readers in graph.consumers().items()}
    position = {node.name: index for index, node in enumerate(graph.nodes)}
    for first, run in gemm_groups(graph.nodes, lambda weight: 2).items():
        start = position[first]
        for node in run[1:]:
            slot = plan.slot_of[node.output.name]
            live = [
                name
                for name, index in produced.items()
                if index < start and last_read.get(name, index) >= start and plan.slot_of.get(name) == slot
            ]
            assert live == [], f"{node.name} writes the buffer of {live}, live at {first}"


def test_scheduler_refuses_a_node_the_backend_cannot_run(monkeypatch):
    graph = build_graph(PRESETS["tiny-llama"].config(), 2, 16)
    backend = CpuBackend()
    monkeypatch.setattr(backend, "supports", lambda op: op is not Op.SWIGLU)
    with pytest.raises(BackendError, match=r"cpu: blk\.0\.ffn_swiglu: op 'swiglu' is not supported"):
        schedule(graph, backend)


def test_dot_export_draws_every_node_and_weight():
    graph = build_graph(PRESETS["tiny-llama"].config(), 2, 16)
    plan = plan_buffers(graph, assign_backends(graph, CpuBackend()))
    dot = to_dot(graph, plan)
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    for node in graph.nodes:
        assert f'"n:{node.name}"' in dot
    for weight in graph.weights():
        assert f'"t:{weight.name}"' in dot
    assert '"n:blk.0.kv_store" -> "t:cache_k.0" [style=dashed]' in dot
