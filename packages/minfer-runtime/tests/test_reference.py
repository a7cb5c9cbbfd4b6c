"""The CPU engine against HF transformers (fixtures written by `nox -s reference`).

For each model and prompt: the last position's logits within 1e-3 of the
reference (max |Δ| / max |logit|) and the same 32-token greedy continuation.
The models: the real default model, minfer's synthetic ones, and tiny
transformers models with each RoPE scaling of their families, converted by
llama.cpp's convert_hf_to_gguf.py (minfer.testing.hf_reference), whose prompts
reach 900 tokens, far past the 256 positions of their original context.
"""

from __future__ import annotations

import pytest
from engine_steps import check_against_reference, load_fixture

import minfer
from minfer.gguf_file import GGUFFile
from minfer.testing.hf_reference import REFERENCES
from minfer.testing.synthetic import weights_digest

SYNTHETIC = {"synthetic-qwen2": ("tiny-qwen2", "Q4_0", 7), "synthetic-llama": ("tiny-llama", "F16", 11)}


def test_default_model_matches_transformers(default_model_path):
    check_against_reference(minfer.load(default_model_path, backend="cpu"), "smollm2")


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_model_matches_transformers(name, synthetic_model):
    preset, weight_type, seed = SYNTHETIC[name]
    path = synthetic_model(preset, weight_type, seed)
    assert weights_digest(GGUFFile(path)) == load_fixture(name)[0]["weights_sha256"]
    check_against_reference(minfer.load(path, backend="cpu"), name)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_converted_model_matches_transformers(name, converted_model):
    engine = minfer.load(converted_model(name), backend="cpu", ctx_size=1024)
    _, cases = load_fixture(name)
    assert max(len(ids) for ids, _, _ in cases) >= 600, "a long prompt is what exercises the RoPE scaling"
    # float32 weights and float64 RoPE angles: ~1e-7 of the reference; without the scaling, 1e-3 to 1e-2.
    check_against_reference(engine, name, tolerance=1e-5)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_converted_model_carries_its_rope_scaling(name, converted_model):
    """The copy holds what the converter wrote: the scaling kind transformers' config asked for."""
    rope = minfer.load(converted_model(name), backend="cpu").config.rope
    kind = REFERENCES[name].rope_parameters["rope_type"]
    if kind == "llama3":
        assert rope.scaling == "none" and rope.freq_factors is not None and max(rope.freq_factors) == 8.0
    else:
        assert rope.scaling == kind and rope.factor == REFERENCES[name].rope_parameters["factor"]
