"""The fuzz campaign (minfer.testing.fuzz): seeded mutations of real and synthetic model files.

Every case must load and generate, or be refused with one MinferError line naming the file and the
culprit: never a traceback, a hang, an unbounded allocation or a crash. The cases run in worker processes
under a memory limit and a per-case time limit; a sample goes through `minfer run` itself.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType

from minfer.testing.fuzz import Case, mutations, run_campaign
from minfer.testing.synthetic import rewrite_gguf, scaled

# Templates a model file could carry: each must render or be refused within its budget.
HOSTILE_TEMPLATES = {
    "class escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals escape": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "context escape": "{{ self._TemplateReference__context }}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "string bomb": "{{ 'x' * 10**10 }}",
    "power bomb": "{{ 10**(10**8) }}",
    "json indent bomb": "{{ messages | tojson(indent=10**9) }}",
    "doubling": "{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "deep nesting": "{{" + "(" * 5000 + "1" + ")" * 5000 + "}}",
    "raises": "{{ raise_exception('no') }}",
    "plain": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
}


@pytest.fixture(scope="module")
def sources(synthetic_model, tmp_path_factory) -> dict[str, Path]:
    """The files the campaign mutates: synthetic llama and qwen2 models, one with RoPE scaling keys."""
    rope_scaled = scaled("tiny-llama", rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_context=128)
    rope_scaled = replace(rope_scaled, rope_freq_factors=tuple(float(f) for f in np.linspace(1, 8, 8)))
    return {
        "llama": synthetic_model("tiny-llama", "Q8_0"),
        "qwen2": synthetic_model("tiny-qwen2", "Q4_K_M"),
        "yarn": synthetic_model(rope_scaled, "F16"),
    }


def test_no_mutation_of_a_model_file_crashes_hangs_or_shows_a_traceback(sources, default_model_path, tmp_path):
    rng = np.random.default_rng(2026)
    cases = [case for path in sources.values() for case in mutations(path, rng, n_flips=150)]
    cases += mutations(default_model_path, rng, n_flips=20, limit=40)
    for name, source in HOSTILE_TEMPLATES.items():
        path = rewrite_gguf(sources["llama"], tmp_path / f"template-{len(cases)}.gguf",
                            set_keys={"tokenizer.chat_template": (source, GGUFValueType.STRING)})  # fmt: skip
        cases.append(Case(f"template: {name}", str(path)))
    sample = rng.choice(len(cases), 24, replace=False)
    cases += [replace(cases[i], name=f"minfer run: {cases[i].name}", via_cli=True) for i in sample]

    campaign = run_campaign(cases, workers=2)
    print(campaign.summary())
    assert not campaign.failures, campaign.summary()
    counts = campaign.counts()
    assert counts["ran"] > 20 and counts["refused"] > 1000, counts
    template_refusals = [r for r in campaign.results if r.case.startswith("template: ") and r.outcome == "refused"]
    assert len(template_refusals) >= len(HOSTILE_TEMPLATES) - 2  # all but the plain one and, maybe, the escape
