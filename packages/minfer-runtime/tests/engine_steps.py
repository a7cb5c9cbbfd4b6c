"""Helpers shared by the runtime's tests: the CUDA backend's availability, the reference fixtures, and a graph that
exercises the alias rule."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import minfer
from minfer.backends import cuda_unavailable_reason
from minfer.graph.ir import Graph, Node, Op, Tensor, TensorKind
from minfer.testing.agreement import greedy_steps
from minfer.testing.synthetic import weights_digest

FIXTURES = Path(__file__).parent / "fixtures"


def needs_cuda() -> None:
    """Skip the calling test where the CUDA backend cannot run, with the reason; fail instead under
    MINFER_REQUIRE_GPU=1 (tools/gpu-check.sh), so that a GPU machine never skips a CUDA test silently."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        if os.environ.get("MINFER_REQUIRE_GPU") == "1":
            pytest.fail(f"MINFER_REQUIRE_GPU=1 but the CUDA backend cannot run: {reason}")
        pytest.skip(f"needs the CUDA backend: {reason}")


def shared_inplace_input_graph(d: int, vocab: int) -> Graph:
    """x feeds both an in-place bias add and a residual add: writing x in place would corrupt the residual.

    Expected output: z = x + (x + bias), with x = table[tokens].
    """
    table = Tensor("table", (vocab, d), "float32", TensorKind.WEIGHT)
    bias = Tensor("bias", (d,), "float32", TensorKind.WEIGHT)
    tokens = Tensor("tokens", (2,), "int32", TensorKind.INPUT)
    x, y, z = (Tensor(name, (2, d), "float32", TensorKind.ACTIVATION) for name in "xyz")
    return Graph(
        n_tokens=2,
        nodes=[
            Node("x", Op.EMBED, [table, tokens], x),
            Node("y", Op.ADD_BIAS, [x, bias], y, inplace_input=0),
            Node("z", Op.ADD, [x, y], z, inplace_input=1),
        ],
        inputs={"tokens": tokens},
        outputs={"z": z},
    )


def load_fixture(name: str) -> tuple[dict, list[tuple[list[int], np.ndarray, list[int]]]]:
    """A reference fixture (`nox -s reference`): its meta record and (token ids, last logits, greedy tokens) cases."""
    data = np.load(FIXTURES / f"reference_{name}.npz")
    meta = json.loads(str(data["meta"]))
    cases = [
        ([int(t) for t in data[f"ids_{i}"]], data[f"logits_{i}"], [int(t) for t in data[f"greedy_{i}"]])
        for i in range(meta["prompts"])
    ]
    return meta, cases


def check_against_reference(engine: minfer.Engine, name: str, tolerance: float = 1e-3) -> None:
    """Logits within `tolerance` of the reference (relative to its largest logit) and the same greedy tokens."""
    meta, cases = load_fixture(name)
    assert len(cases) >= 5
    assert weights_digest(engine.gguf) == meta["weights_sha256"], f"{name}: the model's weights changed"
    for ids, reference_logits, reference_tokens in cases:
        steps, tokens = greedy_steps(engine, ids, len(reference_tokens))
        logits = steps[0]
        error = np.abs(logits - reference_logits).max() / np.abs(reference_logits).max()
        assert error < tolerance, f"{name}: prompt of {len(ids)} tokens: relative logit error {error:.2e}"
        assert tokens == reference_tokens, f"{name}: greedy continuation differs for a prompt of {len(ids)} tokens"
