"""The fused decode graph: its shape, the stacked weights, and fused == unfused on the CPU reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import minfer
from minfer.gguf_file import GGUFFile
from minfer.graph.ir import Op, TensorKind
from minfer.graph.scheduler import schedule
from minfer.models import build_graph
from minfer.models.config import ModelConfig
from minfer.testing.synthetic import PRESETS, scaled

FUSED_LAYER = [Op.NORM_QKV_ROPE_STORE, Op.ATTENTION, Op.MATMUL_ADD, Op.NORM_SWIGLU, Op.MATMUL_ADD]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_decode_graph_is_five_fused_nodes_per_layer(preset):
    config = PRESETS[preset].config()
    decode = build_graph(config, 1, 64)
    ops = [node.op for node in decode.nodes]
    assert ops == [Op.EMBED, *FUSED_LAYER * config.n_layers, Op.NORM_MATMUL]
    weights = {t.name for t in decode.weights()}
    assert set(config.stacked_tensors()) <= weights
    assert not weights & {part for parts in config.stacked_tensors().values() for part in parts}
    qkv = decode.nodes[1]
    assert [t.name for t in qkv.writes] == ["cache_k.0", "cache_v.0"]
    assert qkv.output.shape == (1, config.q_dim)


def test_prompt_graphs_and_unstackable_models_stay_unfused():
    config = PRESETS["tiny-qwen2"].config()
    for graph in (build_graph(config, 2, 64), build_graph(dataclasses.replace(config, fuse_decode=False), 1, 64)):
        ops = {node.op for node in graph.nodes}
        assert not ops & {Op.NORM_MATMUL, Op.MATMUL_ADD, Op.NORM_SWIGLU, Op.NORM_QKV_ROPE_STORE}


def test_a_file_whose_gate_and_up_differ_in_type_is_not_fused(synthetic_model, monkeypatch):
    gguf = GGUFFile(synthetic_model("tiny-llama", "Q8_0"))
    up = gguf.tensors["blk.1.ffn_up.weight"]
    monkeypatch.setitem(gguf.tensors, "blk.1.ffn_up.weight", dataclasses.replace(up, qtype=type(up.qtype).F16))
    assert not ModelConfig.from_gguf(gguf).fuse_decode


def test_q_k_and_v_of_different_types_are_still_fused(synthetic_model):
    # The Q4_K_M mix: attn_v gets more bits than attn_q and attn_k (Q8_0 next to Q5_0 in Qwen2.5-0.5B).
    path = synthetic_model(scaled("tiny-qwen2", d_model=256, d_ff=512), "Q4_K_M")
    gguf = GGUFFile(path)
    types = {gguf.tensor(f"blk.{layer}.attn_{p}.weight").qtype for layer in range(2) for p in "qkv"}
    assert len(types) > 1, "the mix should give attn_v another type somewhere"
    assert ModelConfig.from_gguf(gguf).fuse_decode
    engine = minfer.load(path, backend="cpu", ctx_size=64)
    weights = engine.backend.weights
    stacked = weights["blk.0.attn_qkv.weight"]
    parts = [weights[f"blk.0.attn_{p}.weight"] for p in "qkv"]
    assert all(np.shares_memory(part, stacked) for part in parts)
    assert np.array_equal(np.concatenate(parts), stacked)


@pytest.mark.parametrize(("preset", "weight_type"), [("tiny-llama", "Q8_0"), ("tiny-qwen2", "Q4_0")])
def test_fused_decode_step_equals_the_unfused_ops_on_cpu(synthetic_model, preset, weight_type):
    engine = minfer.load(synthetic_model(preset, weight_type), backend="cpu", ctx_size=64)
    prompt = [5, 17, 300, 2, 41, 99]
    engine.prefill(prompt)  # a prompt graph (unfused) fills cache rows 0..5
    fused = engine.program(1)
    unfused = schedule(build_graph(dataclasses.replace(engine.config, fuse_decode=False), 1, 64), engine.backend)
    states = engine.backend.states
    for position, token in enumerate([7, 8, 9], start=len(prompt)):
        inputs = {
            "tokens": np.array([token], np.int32),
            "positions": np.array([position], np.int32),
            "kv_len": np.array([position + 1], np.int32),
        }
        unfused.run(inputs)
        expected = unfused.read("logits")
        expected_rows = {name: cache[position].copy() for name, cache in states.items()}
        fused.run(inputs)  # writes the same cache rows again
        np.testing.assert_allclose(fused.read("logits"), expected, rtol=1e-5, atol=1e-5)
        for name, cache in states.items():
            np.testing.assert_allclose(cache[position], expected_rows[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_stacked_parts_are_views_of_the_stacked_weight_on_cpu(synthetic_model):
    engine = minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=64)
    weights = engine.backend.weights
    stacked = weights["blk.0.ffn_gate_up.weight"]
    assert np.shares_memory(weights["blk.0.ffn_up.weight"], stacked)
    assert np.array_equal(np.concatenate([weights["blk.0.ffn_gate.weight"], weights["blk.0.ffn_up.weight"]]), stacked)
    assert all(
        t.kind is not TensorKind.WEIGHT or t.name in weights for n in engine.program(1).graph.nodes for t in n.inputs
    )
