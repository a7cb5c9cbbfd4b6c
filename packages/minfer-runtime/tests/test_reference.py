"""The CPU engine against HF transformers (fixtures written by `nox -s reference`).

For each model and prompt: the last position's logits within 1e-3 of the
reference (max |Δ| / max |logit|) and the same 32-token greedy continuation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_steps import last_logits_and_greedy

import minfer
from minfer.gguf_file import GGUFFile
from minfer.testing.synthetic import weights_digest

FIXTURES = Path(__file__).parent / "fixtures"
SYNTHETIC = {"synthetic-qwen2": ("tiny-qwen2", "Q4_0", 7), "synthetic-llama": ("tiny-llama", "F16", 11)}


def load_fixture(name: str) -> tuple[dict, list[tuple[list[int], np.ndarray, list[int]]]]:
    data = np.load(FIXTURES / f"reference_{name}.npz")
    meta = json.loads(str(data["meta"]))
    cases = [
        ([int(t) for t in data[f"ids_{i}"]], data[f"logits_{i}"], [int(t) for t in data[f"greedy_{i}"]])
        for i in range(meta["prompts"])
    ]
    return meta, cases


def check_against_reference(engine: minfer.Engine, name: str) -> None:
    meta, cases = load_fixture(name)
    assert len(cases) >= 5
    assert weights_digest(engine.gguf) == meta["weights_sha256"], f"{name}: the model's weights changed"
    for ids, reference_logits, reference_tokens in cases:
        logits, tokens = last_logits_and_greedy(engine, ids, len(reference_tokens))
        error = np.abs(logits - reference_logits).max() / np.abs(reference_logits).max()
        assert error < 1e-3, f"{name}: prompt of {len(ids)} tokens: relative logit error {error:.2e}"
        assert tokens == reference_tokens, f"{name}: greedy continuation differs for a prompt of {len(ids)} tokens"


def test_default_model_matches_transformers(default_model_path):
    check_against_reference(minfer.load(default_model_path, backend="cpu"), "smollm2")


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_model_matches_transformers(name, synthetic_model):
    preset, weight_type, seed = SYNTHETIC[name]
    path = synthetic_model(preset, weight_type, seed)
    assert weights_digest(GGUFFile(path)) == load_fixture(name)[0]["weights_sha256"]
    check_against_reference(minfer.load(path, backend="cpu"), name)
