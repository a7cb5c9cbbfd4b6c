"""Reference models made the way users' files are made: transformers' config, llama.cpp's converter.

Each `HFReference` is a tiny Hugging Face model of a family people download (Llama with each RoPE
scaling, Qwen2, Qwen3, Gemma 3, Phi-3 / Phi-4-mini) with random weights drawn from a seed.
`nox -s reference` (tools/make_reference_fixtures.py) saves it with transformers, converts it with
llama.cpp's own `convert_hf_to_gguf.py` and records what transformers computes on it, together with
the converter's metadata and a digest of the converter's tensors.

The tests cannot run torch or the converter, and the models are never committed. So
`write_reference_gguf` writes the same GGUF again from the seed and the recorded metadata: the weights
named and laid out as the converter writes them (gguf-py's tensor map, which the converter uses; Q and
K rows permuted for llama's adjacent-pair RoPE; 1 added to Gemma's norm weights; LongRoPE's factors as
tensors), every metadata key exactly as the converter wrote it. The recorded digest proves the copy is
the converter's file, tensor for tensor; only the vocabulary differs (minfer's synthetic one: the
converter needs a real tokenizer, the math does not).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import MODEL_ARCH, MODEL_TENSOR, TENSOR_NAMES, GGUFValueType, GGUFWriter, get_tensor_name_map

from minfer.gguf_file import GGUFFile
from minfer.testing.vocab import add_tokenizer_metadata

# transformers' class and model_type for each GGUF architecture.
HF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
}
# Real Gemma 3 models alternate five sliding-window layers with one global layer (llama.cpp's default
# pattern for gemma3 when the file has no attention.sliding_window_pattern, as the converter writes it).
GEMMA3_PATTERN = 6
ROPE_FACTORS_LONG = TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight"
ROPE_FACTORS_SHORT = TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight"


@dataclass(frozen=True)
class HFReference:
    """A tiny transformers model: its config (transformers' names), the seed of its weights, its prompts
    and the context the engine runs it with in the tests."""

    name: str
    architecture: str  # the GGUF architecture: a key of HF_ARCHITECTURES
    rope_parameters: dict[str, Any]  # transformers' rope_parameters (gemma3: one dict per layer type)
    tied: bool
    seed: int
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size / num_attention_heads
    intermediate_size: int = 256
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    sliding_window: int | None = None  # gemma3: its sliding layers' window; phi3: every layer's
    final_logit_softcapping: float | None = None  # gemma3
    prompt_lengths: tuple[int, ...] = field(default=(1, 7, 33, 640, 900))
    # The engine's context in the tests: LongRoPE picks its factors by it, as llama.cpp does (long ones
    # when the context exceeds the original one), where transformers picks them by the sequence's length.
    context: int = 1024

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def global_rope(self) -> dict[str, Any]:
        """The RoPE parameters of the full-attention layers (every layer but Gemma 3's sliding ones)."""
        return self.rope_parameters.get("full_attention", self.rope_parameters)

    @property
    def layer_types(self) -> list[str]:
        """transformers' layer_types of a Gemma 3 model: sliding x5, then full, repeated."""
        return [
            "full_attention" if (layer + 1) % GEMMA3_PATTERN == 0 else "sliding_attention"
            for layer in range(self.num_hidden_layers)
        ]

    def hf_config(self) -> dict[str, Any]:
        """The config.json fields, as transformers writes them (`architectures` picks the converter's class)."""
        hf_class, model_type = HF_ARCHITECTURES[self.architecture]
        config = {
            "architectures": [hf_class],
            "model_type": model_type,
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
            "torch_dtype": "float32",
        }
        if self.architecture == "gemma3":
            return config | {
                "hidden_activation": "gelu_pytorch_tanh",
                # 1/sqrt(head_dim), llama.cpp's attention scale for every Gemma 3 but the 27B
                "query_pre_attn_scalar": self.head_dim,
                "sliding_window": self.sliding_window,
                "layer_types": self.layer_types,
                "final_logit_softcapping": self.final_logit_softcapping,
            }
        config["hidden_act"] = "silu"
        if self.architecture == "phi3":
            # Phi3Config keeps the pretraining context at the top level and copies it over rope_parameters'
            original = self.rope_parameters.get("original_max_position_embeddings", self.max_position_embeddings)
            config |= {"sliding_window": self.sliding_window, "original_max_position_embeddings": original}
            # the script's SentencePiece ids (Phi3Config's defaults, 32000, lie past this vocabulary)
            config |= {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
        return config


def ramp(n: int, first: float, last: float) -> list[float]:
    """n values rising geometrically from `first` to `last`: LongRoPE factors in the shape of Phi-3's
    (the high-frequency pairs kept, the low-frequency ones stretched most)."""
    return [round(first * (last / first) ** (i / (n - 1)), 6) for i in range(n)]


def longrope(n_factors: int, original: int) -> dict[str, Any]:
    """transformers' rope_parameters of a LongRoPE model (Phi-3-128k, Phi-4-mini): no `factor`, so that
    transformers takes max_position_embeddings / original, as the converter does."""
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": original,
        "short_factor": ramp(n_factors, 1.0, 1.25),
        "long_factor": ramp(n_factors, 1.0, 16.0),
    }


GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},  # rope_local_base_freq
    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
}
# Phi-4-mini: a quarter of each head does not rotate (24 of 32 dimensions here: 12 factor pairs).
PHI4_MINI_ROPE = longrope(12, 256) | {"partial_rotary_factor": 0.75}
PHI3_LONG_PROMPTS = (257, 300, 512, 640, 900)  # past the original 256 positions: long factors
PHI3_SHORT_PROMPTS = (1, 7, 33, 100, 224)  # with their 32 greedy tokens, within 256: short factors

# Each RoPE variant the GGUF files of these families carry, with an original context (256) far below the
# longest prompt (900 tokens), so that the scaling changes the result; and Qwen3, Gemma 3 and Phi-3 as
# their real configs are built.
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
        # Qwen3-0.6B's shape: heads wider than hidden / heads (q is 256 wide), tied.
        HFReference(
            "hf-qwen3",
            "qwen3",
            {"rope_type": "default", "rope_theta": 1000000.0},
            tied=True,
            seed=41,
            head_dim=64,
            rms_norm_eps=1e-6,
        ),
        # Qwen3-8B and up: untied, with the YaRN the Qwen3 model cards give for long contexts.
        HFReference(
            "hf-qwen3-yarn",
            "qwen3",
            {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 256},
            tied=False,
            seed=42,
            num_hidden_layers=3,
            head_dim=64,
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
        ),
        # Gemma 3 1B's shape: head_dim 256, five sliding layers then a global one, 10k / 1M RoPE bases.
        HFReference(
            "hf-gemma3",
            "gemma3",
            GEMMA3_ROPE,
            tied=True,
            seed=43,
            num_hidden_layers=6,
            head_dim=256,
            rms_norm_eps=1e-6,
            sliding_window=16,
            prompt_lengths=(1, 7, 16, 17, 33, 640),
        ),
        # Gemma 3 4B and up: linear RoPE scaling (factor 8) on the global layers only; the soft cap on the
        # logits as Gemma 2 had it; eight layers, so that the pattern starts again after the global one.
        HFReference(
            "hf-gemma3-softcap",
            "gemma3",
            GEMMA3_ROPE | {"full_attention": GEMMA3_ROPE["full_attention"] | {"rope_type": "linear", "factor": 8.0}},
            tied=True,
            seed=44,
            num_hidden_layers=8,
            head_dim=64,
            rms_norm_eps=1e-6,
            sliding_window=16,
            final_logit_softcapping=30.0,
            prompt_lengths=(1, 7, 16, 17, 33, 640),
        ),
        # Phi-3-mini-4k: one head per KV head, untied, a sliding window on every layer (transformers applies
        # it; llama.cpp ignores Phi-3's).
        HFReference(
            "hf-phi3-swa",
            "phi3",
            {"rope_type": "default", "rope_theta": 10000.0},
            tied=False,
            seed=45,
            num_key_value_heads=4,
            sliding_window=64,
            prompt_lengths=(1, 7, 33, 64, 65, 200, 640),
        ),
        # Phi-4-mini without its LongRoPE: partial rotary (the first 24 of 32 dimensions of each head), GQA,
        # tied.
        HFReference(
            "hf-phi3-partial",
            "phi3",
            {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
            tied=True,
            seed=46,
        ),
        # Phi-4-mini: LongRoPE over the partial rotary, original context 256 of 2048. The same model twice
        # (same seed): prompts that pass 256 positions at a context of 1024 (long factors), and prompts that
        # stay within 256 at a context of 256 (short factors).
        HFReference("hf-phi3-longrope", "phi3", PHI4_MINI_ROPE, tied=True, seed=47, prompt_lengths=PHI3_LONG_PROMPTS),
        HFReference(
            "hf-phi3-longrope-short",
            "phi3",
            PHI4_MINI_ROPE,
            tied=True,
            seed=47,
            prompt_lengths=PHI3_SHORT_PROMPTS,
            context=256,
        ),
    )
}


def hf_weights(reference: HFReference) -> dict[str, np.ndarray]:
    """The model's state dict in transformers' names and layouts (float32 [out, in]), drawn from its seed:
    matrices N(0, 0.02) as transformers initializes them, norm weights near 1 (Gemma's near 0: it scales by
    1 + w), biases N(0, 0.1). Phi-3's projections are fused as transformers holds them: qkv_proj is Q, K, V
    rows; gate_up_proj is gate rows, then up rows."""
    rng = np.random.default_rng(reference.seed)
    arch = reference.architecture
    h, head = reference.hidden_size, reference.head_dim
    q, kv = reference.num_attention_heads * head, reference.num_key_value_heads * head
    ff = reference.intermediate_size

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)

    def norm(size: int = h) -> np.ndarray:
        return ((0.0 if arch == "gemma3" else 1.0) + 0.1 * rng.standard_normal(size)).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(reference.vocab_size, h)}
    for layer in range(reference.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        weights[f"{prefix}.input_layernorm.weight"] = norm()
        if arch == "phi3":
            weights[f"{prefix}.self_attn.qkv_proj.weight"] = matrix(q + 2 * kv, h)
        else:
            for part, rows in (("q", q), ("k", kv), ("v", kv)):
                weights[f"{prefix}.self_attn.{part}_proj.weight"] = matrix(rows, h)
        weights[f"{prefix}.self_attn.o_proj.weight"] = matrix(h, q)
        if arch in ("qwen3", "gemma3"):
            weights[f"{prefix}.self_attn.q_norm.weight"] = norm(head)
            weights[f"{prefix}.self_attn.k_norm.weight"] = norm(head)
        weights[f"{prefix}.post_attention_layernorm.weight"] = norm()
        if arch == "gemma3":
            weights[f"{prefix}.pre_feedforward_layernorm.weight"] = norm()
        if arch == "phi3":
            weights[f"{prefix}.mlp.gate_up_proj.weight"] = matrix(2 * ff, h)
        else:
            weights[f"{prefix}.mlp.gate_proj.weight"] = matrix(ff, h)
            weights[f"{prefix}.mlp.up_proj.weight"] = matrix(ff, h)
        weights[f"{prefix}.mlp.down_proj.weight"] = matrix(h, ff)
        if arch == "gemma3":
            weights[f"{prefix}.post_feedforward_layernorm.weight"] = norm()
        if arch == "qwen2":
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
    """The converter's tensors for this model, float32: named by gguf-py's tensor map for the architecture
    (the table the converter maps names with), llama's Q/K rows permuted, Gemma's norm weights + 1
    (Gemma3Model.modify_tensors: transformers scales by 1 + w, llama.cpp by the stored w), LongRoPE's
    factors as rope_factors_long/short (Phi3MiniModel.generate_extra_tensors). Gemma's converter also trims
    token_embd to the tokenizer's size: the script's tokenizer fills exactly vocab_size ids, so it keeps all."""
    arch = reference.architecture
    names = get_tensor_name_map(MODEL_ARCH[arch.upper()], reference.num_hidden_layers)
    permuted_heads = {"attn_q": reference.num_attention_heads, "attn_k": reference.num_key_value_heads}
    tensors = {}
    for hf_name, values in hf_weights(reference).items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise KeyError(f"{reference.name}: gguf-py maps no {arch} tensor name for {hf_name}")
        if arch == "llama" and (heads := permuted_heads.get(name.split(".")[-2])):
            values = permute_for_adjacent_pairs(values, heads)
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            values = values + np.float32(1.0)
        tensors[name] = values
    if reference.global_rope["rope_type"] == "longrope":
        tensors[ROPE_FACTORS_LONG] = np.asarray(reference.global_rope["long_factor"], dtype=np.float32)
        tensors[ROPE_FACTORS_SHORT] = np.asarray(reference.global_rope["short_factor"], dtype=np.float32)
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
    pre = "qwen2" if reference.architecture in ("qwen2", "qwen3") else "smollm"
    add_tokenizer_metadata(writer, reference.vocab_size, pre=pre)
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
