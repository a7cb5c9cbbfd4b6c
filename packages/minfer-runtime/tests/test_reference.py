"""The CPU engine against HF transformers (fixtures written by `nox -s reference`).

For each model and prompt: the last position's logits within 1e-3 of the
reference (max |Δ| / max |logit|) and the same 32-token greedy continuation.
The models: the real default model, minfer's synthetic ones, and tiny
transformers models converted by llama.cpp's convert_hf_to_gguf.py
(minfer.testing.hf_reference): Llama and Qwen2 with each RoPE scaling of their
families, whose prompts reach 900 tokens, far past the 256 positions of their
original context; Qwen3, Gemma 3 (sliding-window layers, soft cap) and Phi-3 /
Phi-4-mini (sliding window, partial rotary, LongRoPE at two contexts). Each runs
at its reference's `context`: LongRoPE's factors depend on it. Each asks for the f32 KV
cache by name, whatever the default: the bounds here are float32's (test_cache_type.py bounds the f16 cache
against this one).
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_steps import check_against_reference, load_fixture
from gguf import Keys

import minfer
from minfer.gguf_file import GGUFFile
from minfer.testing.hf_reference import (
    GEMMA3_PATTERN,
    REFERENCES,
    ROPE_FACTORS_LONG,
    ROPE_FACTORS_SHORT,
    HFReference,
)
from minfer.testing.synthetic import weights_digest

SYNTHETIC = {"synthetic-qwen2": ("tiny-qwen2", "Q4_0", 7), "synthetic-llama": ("tiny-llama", "F16", 11)}
SCALED = sorted(
    name for name, ref in REFERENCES.items() if ref.global_rope["rope_type"] in ("llama3", "linear", "yarn")
)


def longrope_original(reference: HFReference) -> int | None:
    """The original context of a LongRoPE reference, None for any other."""
    rope = reference.global_rope
    return rope["original_max_position_embeddings"] if rope["rope_type"] == "longrope" else None


def test_default_model_matches_transformers(default_model_path):
    check_against_reference(minfer.load(default_model_path, backend="cpu", cache_type="f32"), "smollm2")


def test_gemma3_matches_transformers(gemma3_model_path):
    """The real Gemma 3 270M, as transformers loads the same GGUF: chat turns through the built-in Gemma
    template, a plain completion, and a 700-token prompt, past the 512-row window of its local layers."""
    check_against_reference(minfer.load(gemma3_model_path, backend="cpu", ctx_size=1024, cache_type="f32"), "gemma3")


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_model_matches_transformers(name, synthetic_model):
    preset, weight_type, seed = SYNTHETIC[name]
    path = synthetic_model(preset, weight_type, seed)
    assert weights_digest(GGUFFile(path)) == load_fixture(name)[0]["weights_sha256"]
    check_against_reference(minfer.load(path, backend="cpu", cache_type="f32"), name)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_converted_model_matches_transformers(name, converted_model):
    engine = minfer.load(converted_model(name), backend="cpu", ctx_size=REFERENCES[name].context, cache_type="f32")
    # float32 weights and float64 RoPE angles: ~1e-7 of the reference; without the scaling, 1e-3 to 1e-2.
    # Gemma 3's normed q and k sharpen attention enough that transformers' own float32 angles show: ~8e-6 at
    # 640 positions (1e-6 against transformers with float64 angles).
    check_against_reference(engine, name, tolerance=1e-5)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_converted_model_is_the_converters_file(name, converted_model):
    """write_reference_gguf's copy holds the tensors of the converter's file (the digest the script took of it)."""
    assert weights_digest(GGUFFile(converted_model(name))) == load_fixture(name)[0]["weights_sha256"]


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_reference_prompts_exercise_what_they_test(name):
    """Each fixture's prompts reach what its model is about, and LongRoPE's ran on the factors that llama.cpp
    picks at the reference's context (long when the context exceeds the original one)."""
    reference = REFERENCES[name]
    meta, cases = load_fixture(name)
    longest = max(len(ids) for ids, _, _ in cases)
    assert reference.context >= longest + len(cases[0][2]), "prompt and continuation fit the context"
    if name in SCALED:
        assert longest >= 600, "a long prompt is what exercises the RoPE scaling"
    if reference.sliding_window:
        assert longest > reference.sliding_window, "a prompt past the window is what exercises it"
    if (original := longrope_original(reference)) is not None:
        assert meta["rope_factors"] == ["long" if reference.context > original else "short"] * len(cases)
    else:
        assert "rope_factors" not in meta


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_converted_model_carries_transformers_config(name, converted_model):
    """The keys llama.cpp's loader reads hold what transformers ran with, and the ones it defaults are absent
    where its default is transformers' value: head size (key_length, else hidden / heads), rotary dimensions
    (rope.dimension_count, else the head size), both RoPE bases, windows, soft cap, LongRoPE's tensors and
    factor on cos and sin."""
    reference = REFERENCES[name]
    gguf = GGUFFile(converted_model(name))
    arch = reference.architecture

    def value(key: str, default: object = None) -> object:
        return gguf.metadata.get(key.format(arch=arch), default)

    assert value(Keys.LLM.BLOCK_COUNT) == reference.num_hidden_layers
    assert value(Keys.LLM.EMBEDDING_LENGTH) == reference.hidden_size
    assert value(Keys.LLM.FEED_FORWARD_LENGTH) == reference.intermediate_size
    assert value(Keys.Attention.HEAD_COUNT) == reference.num_attention_heads
    assert value(Keys.Attention.HEAD_COUNT_KV) == reference.num_key_value_heads
    assert value(Keys.Attention.LAYERNORM_RMS_EPS) == pytest.approx(reference.rms_norm_eps, rel=1e-6)
    head_size = value(Keys.Attention.KEY_LENGTH, reference.hidden_size // reference.num_attention_heads)
    assert head_size == value(Keys.Attention.VALUE_LENGTH, head_size) == reference.head_dim
    rope = reference.global_rope
    n_rot = int(reference.head_dim * rope.get("partial_rotary_factor", 1.0))
    assert value(Keys.Rope.DIMENSION_COUNT, head_size) == n_rot
    assert value(Keys.Rope.FREQ_BASE) == rope["rope_theta"]
    if arch == "gemma3":
        # llama.cpp: layer il slides when il % 6 < 5 unless the file has a pattern, as transformers' layer_types
        assert value(Keys.Attention.SLIDING_WINDOW_PATTERN) is None
        assert reference.layer_types == [
            "sliding_attention" if il % GEMMA3_PATTERN < GEMMA3_PATTERN - 1 else "full_attention"
            for il in range(reference.num_hidden_layers)
        ]
        assert value(Keys.Attention.SLIDING_WINDOW) == reference.sliding_window
        assert value(Keys.Rope.FREQ_BASE_SWA) == reference.rope_parameters["sliding_attention"]["rope_theta"]
        assert value(Keys.LLM.FINAL_LOGIT_SOFTCAPPING) == reference.final_logit_softcapping
    elif arch == "phi3":
        assert value(Keys.Attention.SLIDING_WINDOW) == (reference.sliding_window or 0)  # 0: none (Phi-4)
    else:
        assert value(Keys.Attention.SLIDING_WINDOW) is None
    if (original := longrope_original(reference)) is not None:
        meta, _ = load_fixture(name)
        assert value(Keys.Rope.SCALING_ORIG_CTX_LEN) == original
        assert value(Keys.Rope.SCALING_ATTN_FACTOR) == pytest.approx(meta["rope_attention_scaling"], rel=1e-6)
        for tensor, factors in ((ROPE_FACTORS_LONG, rope["long_factor"]), (ROPE_FACTORS_SHORT, rope["short_factor"])):
            assert gguf.tensor(tensor).data.view(np.float32).tolist() == np.asarray(factors, dtype=np.float32).tolist()
            assert len(factors) == n_rot // 2
    else:
        assert value(Keys.Rope.SCALING_ATTN_FACTOR) is None
        assert ROPE_FACTORS_LONG not in gguf.tensors and ROPE_FACTORS_SHORT not in gguf.tensors


@pytest.mark.parametrize("name", SCALED)
def test_converted_model_carries_its_rope_scaling(name, converted_model):
    """The copy holds what the converter wrote: the scaling kind transformers' config asked for."""
    rope = minfer.load(converted_model(name), backend="cpu").config.rope
    kind = REFERENCES[name].global_rope["rope_type"]
    if kind == "llama3":
        assert rope.scaling == "none" and rope.freq_factors is not None and max(rope.freq_factors) == 8.0
    else:
        assert rope.scaling == kind and rope.factor == REFERENCES[name].global_rope["factor"]
