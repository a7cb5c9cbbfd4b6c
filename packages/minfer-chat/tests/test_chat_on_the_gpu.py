"""minfer-chat on the GPU with the real Gemma 3 270M, as its user runs it: `minfer-chat gemma3 --backend cuda`.

It needs an NVIDIA GPU, minfer-kernels and the model in minfer's cache (`minfer pull gemma3`). Without a GPU the
test skips with the reason; MINFER_REQUIRE_GPU=1 (tools/gpu-check.sh sets it) turns that skip into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from chat_steps import GREEDY, TERMINAL_SIZE, chat_app, replies, run_async, submit, wait_until_loaded

import minfer
from minfer.backends import cuda_unavailable_reason
from minfer.model_store import KNOWN_MODELS, locate
from minfer_chat.widgets import ModelHeader, StatusLine

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]

QUESTIONS = ("What is the capital of France?", "And of Italy?")
REPLY_TOKENS = 24
# transformers' float32 greedy tokens on the same GGUF (tools/make_reference_fixtures.py); its first case is the
# first question through the built-in Gemma template. The 270M base model echoes the question: so does transformers.
TRANSFORMERS_FIXTURE = Path(__file__).parents[2] / "minfer-runtime/tests/fixtures/reference_gemma3.npz"


@pytest.fixture(scope="module")
def gemma3_on_the_gpu() -> Path:
    """The real Gemma 3 270M's file, where the CUDA backend can run it."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        if os.environ.get("MINFER_REQUIRE_GPU") == "1":
            pytest.fail(f"MINFER_REQUIRE_GPU=1 but the CUDA backend cannot run: {reason}")
        pytest.skip(f"needs the CUDA backend: {reason}")
    path = locate(KNOWN_MODELS["gemma3"])
    if path is None:
        pytest.skip("gemma3 is not in minfer's cache (minfer pull gemma3; nox -s tests pulls it)")
    return path


@run_async
async def test_gemma3_chats_on_the_gpu(gemma3_on_the_gpu):
    """Two turns through the built-in Gemma template on the CUDA backend: the first reply is transformers', and
    each is the one the engine gives the same conversation outside the app."""
    engine = minfer.load(gemma3_on_the_gpu, backend="cuda")
    fixture = np.load(TRANSFORMERS_FIXTURE)
    assert engine.encode_prompt(QUESTIONS[0]) == fixture["ids_0"].tolist()
    outside = engine.chat(sampling=GREEDY, max_tokens=REPLY_TOKENS)
    expected = ["".join(outside.send(question)) for question in QUESTIONS]
    assert expected[0] == engine.tokenizer.decode(fixture["greedy_0"][:REPLY_TOKENS].tolist())

    app = chat_app(gemma3_on_the_gpu, backend="cuda", max_tokens=REPLY_TOKENS)
    async with app.run_test(size=TERMINAL_SIZE) as pilot:
        await wait_until_loaded(pilot)
        header = str(app.query_one(ModelHeader).content)
        assert "gemma3" in header and "cuda on " in header
        for question in QUESTIONS:
            await submit(pilot, question)
        assert [reply.text for reply in replies(app)] == expected
        assert "· cuda, " in str(app.query_one(StatusLine).render())
