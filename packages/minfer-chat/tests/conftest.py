"""Fixtures: tiny synthetic models for driving minfer-chat on a real engine, on the CPU.

The models have random weights (their replies are gibberish) but a real tokenizer
and ChatML template, so everything the app does with the engine is real. The
pilot helpers that drive the app are in `chat_steps.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minfer.testing.synthetic import scaled, write_synthetic_model
from minfer.testing.workers import pin_to_worker_share


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU and minfer-kernels (tools/gpu-check.sh runs these)")
    pin_to_worker_share()  # before any engine sets its BLAS threads: xdist workers must not oversubscribe


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer llama with a 512-token context: a reply of a few tokens takes milliseconds."""
    return write_synthetic_model(tmp_path_factory.mktemp("models") / "tiny-llama.gguf", "tiny-llama")


@pytest.fixture(scope="session")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with room for 32k tokens: a reply that would take minutes, so it still streams at Esc."""
    path = tmp_path_factory.mktemp("models") / "tiny-llama-32k.gguf"
    return write_synthetic_model(path, scaled("tiny-llama", context_length=32768))
