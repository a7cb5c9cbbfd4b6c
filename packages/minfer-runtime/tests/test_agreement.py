"""The rule two backends' greedy continuations are held to (minfer.testing.agreement), on made-up logits and on a
CPU engine against itself."""

from __future__ import annotations

import numpy as np

import minfer
from minfer.testing.agreement import MAX_LOGIT_ERROR, greedy_steps, unexplained_divergence


def continuation(rows: list[list[float]]) -> tuple[np.ndarray, list[int]]:
    logits = np.array(rows, dtype=np.float32)
    return logits, [int(np.argmax(row)) for row in logits]


REFERENCE = continuation([[10.0, 1.0, 0.0], [5.0, 4.99, 0.0], [0.0, 0.0, 10.0]])


def test_an_identical_continuation_agrees():
    assert unexplained_divergence(REFERENCE, REFERENCE) is None


def test_leaving_at_a_near_tie_the_error_explains_agrees():
    # Step 1: the reference's two best logits are 0.01 apart; the other backend's are off by 0.006 and swap them.
    other = continuation([[10.0, 1.0, 0.0], [4.994, 4.996, 0.0], [10.0, 0.0, 0.0]])
    assert unexplained_divergence(REFERENCE, other) is None


def test_leaving_where_the_error_cannot_swap_the_picks_is_named():
    # Step 0: token 1 is 9 below token 0 in the reference; logits off by at most 0.5 cannot pick it.
    other = continuation([[9.5, 9.6, 0.0], [5.0, 4.99, 0.0], [0.0, 0.0, 10.0]])
    divergence = unexplained_divergence(REFERENCE, other)
    assert divergence is not None and divergence.startswith("step 0: picked token 1")


def test_an_error_past_the_bound_is_no_excuse():
    # The swap at step 1 is explained by the error, but the error itself (1.01, a fifth of the largest logit)
    # is past MAX_LOGIT_ERROR.
    assert MAX_LOGIT_ERROR < 1.01 / 5.0
    other = continuation([[10.0, 1.0, 0.0], [4.0, 6.0, 0.0], [0.0, 0.0, 10.0]])
    divergence = unexplained_divergence(REFERENCE, other)
    assert divergence is not None and divergence.startswith("step 1:")


def test_greedy_steps_records_the_logits_each_pick_came_from(synthetic_model):
    engine = minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=64)
    logits, tokens = greedy_steps(engine, [5, 6, 7], 4)
    assert logits.shape == (4, engine.config.vocab_size)
    assert tokens == [int(np.argmax(row)) for row in logits]
    assert unexplained_divergence((logits, tokens), greedy_steps(engine, [5, 6, 7], 4)) is None
