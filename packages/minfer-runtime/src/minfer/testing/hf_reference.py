"""Reference models made the way users' files are made: transformers' config, llama.cpp's converter.

Each `HFReference` is a tiny Hugging Face model (LlamaForCausalLM or Qwen2ForCausalLM) with a RoPE
variant people download — Llama 3's scaled frequencies, linear scaling, YaRN — and random weights drawn
from a seed. `nox -s reference` (tools/make_reference_fixtures.py) saves it with transformers, converts
it with llama.cpp's own `convert_hf_to_gguf.py` and records what transformers computes on it, together
with the converter's metadata and a digest of the converter's tensors.

The tests cannot run torch or the converter, and the models are never committed. So
`write_reference_gguf` writes the same GGUF again from the seed and the recorded metadata: the weights
laid out as the converter lays them out (Q and K rows permuted for llama's adjacent-pair RoPE), every
metadata key exactly as the converter wrote it. The recorded digest proves the copy is the converter's
file, tensor for tensor; only the vocabulary differs (minfer's synthetic one: the converter needs a real
tokenizer, the math does not).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from minfer.gguf_file import GGUFFile
from minfer.testing.vocab import add_tokenizer_metadata


@dataclass(frozen=True)
class HFReference:
    """A tiny transformers model: its config (transformers' names) and the seed of its weights."""

    name: str
    architecture: str  # "llama" or "qwen2"
    rope_parameters: dict[str, Any]  # transformers' rope_parameters, rope_theta included
    tied: bool
    seed: int
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    prompt_lengths: tuple[int, ...] = field(default=(1, 7, 33, 640, 900))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def hf_config(self) -> dict[str, Any]:
        """The config.json fields, as transformers writes them (`architectures` picks the converter's class)."""
        return {
            "architectures": ["LlamaForCausalLM" if self.architecture == "llama" else "Qwen2ForCausalLM"],
            "model_type": self.architecture,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": self.rope_parameters,
            "tie_word_embeddings": self.tied,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }


# Each RoPE variant the GGUF files of these families carry, with an original context (256) far below the
# longest prompt (900 tokens), so that the scaling changes the result.
REFERENCES: dict[str, HFReference] = {
    reference.name: reference
    for reference in (
        HFReference(
            "hf-llama3",
            "llama",
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
            tied=True,
            seed=31,
        ),
        HFReference(
            "hf-llama-linear", "llama", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, False, 32
        ),
        HFReference(
            "hf-llama-yarn",
            "llama",
            {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 256,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
            },
            tied=False,
            seed=33,
            max_position_embeddings=1024,  # original x factor, as transformers expects of YaRN
        ),
        HFReference(
            "hf-qwen2-yarn",
            "qwen2",
            {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 256},
            tied=True,
            seed=34,
            max_position_embeddings=1024,
        ),
    )
}


def hf_weights(reference: HFReference) -> dict[str, np.ndarray]:
    """The model's state dict in transformers' names and layouts (float32 [out, in]), drawn from its seed:
    matrices N(0, 0.02) as transformers initializes them, norm weights near 1, biases N(0, 0.1)."""
    rng = np.random.default_rng(reference.seed)
    h, q = reference.hidden_size, reference.num_attention_heads * reference.head_dim
    kv, ff = reference.num_key_value_heads * reference.head_dim, reference.intermediate_size

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(reference.vocab_size, h)}
    for layer in range(reference.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        weights |= {
            f"{prefix}.input_layernorm.weight": norm(),
            f"{prefix}.self_attn.q_proj.weight": matrix(q, h),
            f"{prefix}.self_attn.k_proj.weight": matrix(kv, h),
            f"{prefix}.self_attn.v_proj.weight": matrix(kv, h),
            f"{prefix}.self_attn.o_proj.weight": matrix(h, q),
            f"{prefix}.post_attention_layernorm.weight": norm(),
            f"{prefix}.mlp.gate_proj.weight": matrix(ff, h),
            f"{prefix}.mlp.up_proj.weight": matrix(ff, h),
            f"{prefix}.mlp.down_proj.weight": matrix(h, ff),
        }
        if reference.architecture == "qwen2":
            for part, width in (("q", q), ("k", kv), ("v", kv)):
                weights[f"{prefix}.self_attn.{part}_proj.bias"] = (0.1 * rng.standard_normal(width)).astype(np.float32)
    weights["model.norm.weight"] = norm()
    if not reference.tied:
        weights["lm_head.weight"] = matrix(reference.vocab_size, h)
    return weights


def permute_for_adjacent_pairs(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """transformers rotates the two halves of a head; llama GGUFs rotate adjacent pairs. The converter
    (LlamaModel.permute) reorders each head's rows so: row (2i + j) of the head takes row (j * half + i)."""
    half = rows.shape[0] // n_heads // 2
    return rows.reshape(n_heads, 2, half, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def gguf_tensors(reference: HFReference) -> dict[str, np.ndarray]:
    """The converter's tensors for this model: GGUF names, llama's Q/K rows permuted, float32."""
    weights = hf_weights(reference)
    tensors = {
        "token_embd.weight": weights["model.embed_tokens.weight"],
        "output_norm.weight": weights["model.norm.weight"],
    }
    if not reference.tied:
        tensors["output.weight"] = weights["lm_head.weight"]
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for layer in range(reference.num_hidden_layers):
        for hf_name, gguf_name in names.items():
            values = weights.get(f"model.layers.{layer}.{hf_name}")
            if values is None:
                continue
            if reference.architecture == "llama" and gguf_name == "attn_q.weight":
                values = permute_for_adjacent_pairs(values, reference.num_attention_heads)
            if reference.architecture == "llama" and gguf_name == "attn_k.weight":
                values = permute_for_adjacent_pairs(values, reference.num_key_value_heads)
            tensors[f"blk.{layer}.{gguf_name}"] = values
    return tensors


def recorded_metadata(path: str | os.PathLike[str]) -> list[list[Any]]:
    """The metadata of a converted file that `write_reference_gguf` copies: every key but the tokenizer's
    and `general.*`, as [key, value type, element type or None, value] (JSON-ready)."""
    gguf = GGUFFile(path)
    return [
        [key, kind.type.name, kind.element.name if kind.element else None, gguf.metadata[key]]
        for key, kind in gguf.value_types.items()
        if not key.startswith(("tokenizer.", "general."))
    ]


def write_reference_gguf(path: str | os.PathLike[str], reference: HFReference, meta: dict[str, Any]) -> Path:
    """The converter's file for `reference` again, from the seed and a fixture's recorded `meta`
    (`metadata`: recorded_metadata's list; `extra_tensors`: tensors the converter computes, such as
    rope_freqs.weight, by name)."""
    path = Path(path)
    writer = GGUFWriter(str(path), reference.architecture)
    writer.add_name(reference.name)
    for key, kind, element, value in meta["metadata"]:
        sub_type = GGUFValueType[element] if element else None
        writer.add_key_value(key, value, GGUFValueType[kind], sub_type=sub_type)
    add_tokenizer_metadata(writer, reference.vocab_size, pre="qwen2" if reference.architecture == "qwen2" else "smollm")
    tensors = gguf_tensors(reference)
    tensors |= {name: np.asarray(values, dtype=np.float32) for name, values in meta["extra_tensors"].items()}
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fixture_meta(fixture: Path) -> dict[str, Any]:
    """The `meta` record of a reference fixture (.npz)."""
    with np.load(fixture) as data:
        return json.loads(str(data["meta"]))
