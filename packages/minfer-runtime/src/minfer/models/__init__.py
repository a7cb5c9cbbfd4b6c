"""Model families: each architecture name maps to the builder of its graph."""

from __future__ import annotations

from collections.abc import Callable

from minfer.graph.ir import Graph
from minfer.models import llama
from minfer.models.config import ModelConfig
from minfer.models.llama import DEFAULT_CACHE_TYPE

ForwardPass = Callable[[ModelConfig, int, int, str], Graph]  # (config, n_tokens, n_ctx, cache_type) -> graph

BUILDERS: dict[str, ForwardPass] = dict.fromkeys(("llama", "qwen2", "qwen3", "gemma3", "phi3"), llama.build_graph)


def build_graph(config: ModelConfig, n_tokens: int, n_ctx: int, cache_type: str = DEFAULT_CACHE_TYPE) -> Graph:
    """The forward-pass graph for `n_tokens` new tokens of a model with this config, its KV cache `n_ctx` rows of
    `cache_type` (models/llama.py: KV_CACHE_TYPES)."""
    return BUILDERS[config.architecture](config, n_tokens, n_ctx, cache_type)
