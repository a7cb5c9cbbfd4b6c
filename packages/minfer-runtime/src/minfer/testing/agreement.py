"""Whether two backends agree on a model: the rule the CUDA tests and tools/quant_presets.py hold a backend to.

A backend that computes in lower precision (f16 tensor cores, int8 activations) gives logits a little off the
CPU's. Where the CPU's two best tokens are nearly tied, that error may pick the other one, and a greedy
continuation then goes its own way from there: a coin flip, not a defect. On random-weight models a 64-token
continuation meets such a near-tie often (Qwen3-shaped Q5_0, 5 prompts: two of them with the two best logits
1.3e-4 and 1.8e-4 of the largest apart). So the rule is not "continuations identical", but: identical up to
their first difference, and at that step the CPU's own logits put the other backend's pick within twice the
step's measured logit error of its own pick — the only way an error of that size can swap the two.
"""

from __future__ import annotations

import numpy as np

import minfer

# The largest error of a step's logits, relative to the CPU's largest logit (test_cuda_backend.py's bound).
MAX_LOGIT_ERROR = 1e-2


def greedy_steps(engine: minfer.Engine, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """From an empty cache: `n` greedy tokens after `prompt` (no early stop), each picked by the backend's own
    argmax, and the logits each was picked from (n x vocab: the prompt's last position first)."""
    engine.reset()
    program, _ = engine.prefill(prompt)
    logits, tokens = [program.read("logits")[0]], [program.argmax("logits")]
    while len(tokens) < n:
        step = engine.forward([tokens[-1]], len(prompt) + len(tokens) - 1)
        logits.append(step.read("logits")[0])
        tokens.append(step.argmax("logits"))
    return np.stack(logits), tokens


def relative_error(logits: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(logits - reference).max() / np.abs(reference).max())


def unexplained_divergence(reference: tuple[np.ndarray, list[int]], other: tuple[np.ndarray, list[int]]) -> str | None:
    """None where `other`'s continuation (greedy_steps) is the reference's, or leaves it at a near-tie that its
    logit error explains (the module's rule); else what went wrong, and where."""
    (reference_logits, reference_tokens), (logits, tokens) = reference, other
    differing = [i for i, (a, b) in enumerate(zip(reference_tokens, tokens, strict=True)) if a != b]
    if not differing:
        return None
    step = differing[0]  # the histories are the same up to here, so the two steps' logits are comparable
    expected, picked = reference_tokens[step], tokens[step]
    gap = float(reference_logits[step][expected] - reference_logits[step][picked])
    error = float(np.abs(logits[step] - reference_logits[step]).max())
    relative = relative_error(logits[step], reference_logits[step])
    if gap <= 2 * error and relative < MAX_LOGIT_ERROR:
        return None
    return (
        f"step {step}: picked token {picked}, whose reference logit is {gap:.3g} below the reference's pick "
        f"{expected}, where the two backends' logits differ by at most {error:.3g} ({relative:.2e} relative)"
    )
