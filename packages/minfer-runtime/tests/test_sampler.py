"""The sampler: each filter of the chain, seeding, and parameter validation."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.errors import MinferError
from minfer.sampler import Sampler, SamplingParams

LOGITS = np.array([1.0, 4.0, 3.5, -2.0, 0.5, 3.9], dtype=np.float32)


def draws(params: SamplingParams, n: int = 400, history: tuple[int, ...] = ()) -> set[int]:
    sampler = Sampler(params)
    return {sampler.sample(LOGITS, list(history)) for _ in range(n)}


def test_greedy_takes_the_argmax():
    assert draws(SamplingParams(temperature=0), 5) == {1}
    assert not Sampler(SamplingParams(temperature=0)).needs_logits
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=1.3)).needs_logits


def test_top_k_keeps_the_k_best():
    assert draws(SamplingParams(temperature=5.0, top_k=2, top_p=1.0, min_p=0.0)) == {1, 5}
    assert draws(SamplingParams(temperature=5.0, top_k=1, top_p=1.0, min_p=0.0)) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities at temperature 1: token 1 ≈ 0.37, 5 ≈ 0.33, 2 ≈ 0.22, ...
    assert draws(SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0)) == {1, 5}
    assert draws(SamplingParams(temperature=1.0, top_k=0, top_p=0.3, min_p=0.0)) == {1}


def test_min_p_drops_tokens_far_below_the_best():
    # relative to the best token: 5 ≈ 0.90, 2 ≈ 0.61, 0 ≈ 0.05, 4 ≈ 0.03
    assert draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5)) == {1, 2, 5}


def test_unrestricted_sampling_reaches_every_token():
    assert draws(SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0), 3000) == set(range(len(LOGITS)))


def test_repeat_penalty_pushes_recent_tokens_down():
    params = SamplingParams(temperature=0, repeat_penalty=2.0, repeat_last_n=4)
    assert Sampler(params).sample(LOGITS, [1]) == 5
    assert Sampler(params).sample(LOGITS, [1, 5]) == 2
    assert Sampler(params).sample(LOGITS, [1, 5, 0, 0, 0]) == 1  # token 1 is outside the last 4, 5 inside


def test_seed_makes_draws_reproducible():
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=123)
    a, b = Sampler(params), Sampler(params)
    assert [a.sample(LOGITS, []) for _ in range(50)] == [b.sample(LOGITS, []) for _ in range(50)]


@pytest.mark.parametrize(
    "field,value",
    [("temperature", -1.0), ("top_k", -3), ("top_p", 0.0), ("top_p", 1.5), ("min_p", 1.0), ("repeat_penalty", 0.0)],
)
def test_invalid_parameters_are_named(field, value):
    with pytest.raises(MinferError, match=f"invalid sampling parameter {field}="):
        SamplingParams(**{field: value})
