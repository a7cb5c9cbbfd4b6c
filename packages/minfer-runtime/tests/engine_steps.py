"""Helpers shared by the runtime's tests: greedy decoding step by step, and a graph that exercises the alias rule."""

from __future__ import annotations

import numpy as np

import minfer
from minfer.graph.ir import Graph, Node, Op, Tensor, TensorKind


def last_logits_and_greedy(engine: minfer.Engine, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """From an empty cache: the prompt's last-position logits, and `n` greedy tokens after it (no early stop)."""
    engine.reset()
    program, _ = engine.prefill(prompt)
    logits = program.read("logits")[0]
    tokens = [program.argmax("logits")]
    while len(tokens) < n:
        tokens.append(engine.forward([tokens[-1]], len(prompt) + len(tokens) - 1).argmax("logits"))
    return logits, tokens


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
