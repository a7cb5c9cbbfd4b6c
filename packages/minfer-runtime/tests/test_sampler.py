"""The sampler: each filter of the chain, seeding, and parameter validation."""

from __future__ import annotations

import warnings

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


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("temperature", "hot", "a finite number"),
        ("temperature", float("nan"), "a finite number"),
        ("top_p", float("inf"), "a finite number"),
        ("top_k", 2.5, "an integer"),
        ("top_k", None, "an integer"),
        ("repeat_last_n", True, "an integer"),
        ("seed", 1.5, "an integer"),
    ],
)
def test_parameters_of_the_wrong_type_are_named_not_a_type_error(field, value, what):
    with pytest.raises(MinferError, match=rf"^invalid sampling parameter {field}=.*: not {what}$"):
        SamplingParams(**{field: value})


def test_a_negative_seed_is_refused_and_none_means_random():
    with pytest.raises(MinferError, match=r"^invalid sampling parameter seed=-1$"):
        SamplingParams(seed=-1)
    params = SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=None)
    assert len({tuple(Sampler(params).sample(LOGITS, []) for _ in range(20)) for _ in range(5)}) > 1
    assert SamplingParams(seed=np.int64(3)).seed == 3  # numpy integers are integers


def test_a_tiny_temperature_is_the_argmax_without_overflow():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        for temperature in (1e-300, 5e-324):
            params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=0)
            assert draws(params, 20) == {1}


def test_a_repeat_penalty_that_overflows_the_logits_is_named():
    sampler = Sampler(SamplingParams(temperature=1.0, repeat_penalty=1e-320, seed=0))
    with pytest.raises(MinferError, match=r"^repeat_penalty=1e-320 takes the penalized logits beyond float64$"):
        sampler.sample(LOGITS, [1])
