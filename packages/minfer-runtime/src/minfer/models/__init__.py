"""Model families: each architecture name maps to the builder of its graph."""

from __future__ import annotations

from collections.abc import Callable

from minfer.graph.ir import Graph
from minfer.models import llama
from minfer.models.config import ModelConfig

ForwardPass = Callable[[ModelConfig, int, int], Graph]  # (config, n_tokens, n_ctx) -> graph

BUILDERS: dict[str, ForwardPass] = dict.fromkeys(("llama", "qwen2", "qwen3", "gemma3", "phi3"), llama.build_graph)


def build_graph(config: ModelConfig, n_tokens: int, n_ctx: int) -> Graph:
    """The forward-pass graph for `n_tokens` new tokens of a model with this config."""
    return BUILDERS[config.architecture](config, n_tokens, n_ctx)
