"""Every file understood or refused: the load-time audit of a model file's metadata keys and tensors.

A model file that carries something minfer does not understand must not run as if it did not: a
Llama 3 file's `rope_freqs.weight` silently ignored gives quietly wrong text. So every key and every
tensor of a file is, after `audit`, in exactly one of three places:

- **read**: the model config, the tokenizer, the chat template or the GGUF parser uses it;
- **ignored**, on an explicit list below with the reason it cannot change the output (descriptive
  metadata, special tokens generation never uses, keys of other programs);
- **refused**: a `ModelFileError` naming it. This is where every key under the architecture's prefix
  that is not understood goes (it may change the math), every value of a math-changing key other
  than the one minfer's graph assumes (experts, sliding window, soft-capping, ...), and every tensor
  the graph does not read (llama.cpp refuses those too: "wrong number of tensors").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from minfer.errors import ModelFileError
from minfer.gguf_file import GGUFFile, printable
from minfer.models.rope import FACTOR_TENSORS


class AuditedConfig(Protocol):
    """What the audit reads of a models.config.ModelConfig (whose from_gguf runs it: config imports this
    module, never the other way)."""

    architecture: str
    n_layers: int
    head_dim: int
    vocab_size: int

    def expected_tensors(self) -> dict[str, tuple[int, ...]]: ...


# Keys under "<arch>." that the config reads (models/config.py, models/rope.py).
ARCH_KEYS_READ = frozenset(
    {
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "vocab_size",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "attention.layer_norm_rms_epsilon",
        "attention.sliding_window",
        "attention.sliding_window_pattern",
        "rope.freq_base",
        "rope.dimension_count",
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scale_linear",
        "rope.scaling.attn_factor",
        "rope.scaling.original_context_length",
        "rope.scaling.yarn_attn_factor",
        "rope.scaling.yarn_beta_fast",
        "rope.scaling.yarn_beta_slow",
        "rope.scaling.yarn_ext_factor",
    }
)
# Keys only some architectures' graphs read (models/config.py): elsewhere they are checked as ARCH_KEYS_NEUTRAL.
ARCH_KEYS_READ_BY = {"gemma3": frozenset({"rope.freq_base_swa", "final_logit_softcapping"})}
ARCH_KEYS_IGNORED = {
    "rope.scaling.finetuned": "says whether the model was fine-tuned at the extended context; no computation uses it",
}


@dataclass(frozen=True)
class Neutral:
    """A math-changing key that minfer's graph runs right only at the value that leaves the math as is."""

    feature: str  # what any other value would turn on
    accepts: Callable[[Any, AuditedConfig], bool]


def _equals(expected: object) -> Callable[[Any, AuditedConfig], bool]:
    return lambda value, _config: value == expected


def _default_attention_scale(value: Any, config: AuditedConfig) -> bool:
    # llama.cpp: 0 means the usual 1/sqrt(head size), which is what minfer's attention computes.
    return value == 0 or math.isclose(value, 1 / math.sqrt(config.head_dim), rel_tol=1e-6)


ARCH_KEYS_NEUTRAL = {
    "attention.causal": Neutral("non-causal attention", _equals(True)),
    "attention.clamp_kqv": Neutral("q/k/v clamping", _equals(0)),
    "attention.scale": Neutral("attention scale other than 1/sqrt(head size)", _default_attention_scale),
    "attn_logit_softcapping": Neutral("attention logit soft-capping", _equals(0)),
    "final_logit_softcapping": Neutral("final logit soft-capping", _equals(0)),
    "expert_count": Neutral("mixture of experts", _equals(0)),
    "expert_used_count": Neutral("mixture of experts", _equals(0)),
    "use_parallel_residual": Neutral("parallel residual blocks", _equals(False)),
    "logit_scale": Neutral("scaled logits", _equals(1)),
    "embedding_scale": Neutral("scaled embeddings", _equals(1)),
    "residual_scale": Neutral("scaled residuals", _equals(1)),
    "pooling_type": Neutral("pooled embeddings (an embedding model, not a generator)", _equals(0)),
}

# Keys under "tokenizer." that the tokenizer (tokenizer.py) and the chat template (chat_template.py) read.
TOKENIZER_KEYS_READ = frozenset(
    {
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.chat_template",
    }
)
# Keys only a SentencePiece vocabulary's tokenizer reads (tokenizer.ggml.model = llama: tokenizer_spm.py); a
# byte-level BPE file's are checked by TOKENIZER_KEYS_IGNORED and TOKENIZER_KEYS_NEUTRAL, as llama.cpp treats them.
SENTENCEPIECE_KEYS_READ = frozenset({"tokenizer.ggml.scores", "tokenizer.ggml.add_space_prefix"})
_SPECIAL_IDS = "a special token for tasks other than chat generation (padding, masking, fill-in-the-middle)"
TOKENIZER_KEYS_IGNORED = {
    "tokenizer.ggml.scores": "BPE vocabularies merge by rank, not score (llama.cpp ignores them too)",
    "tokenizer.ggml.token_type_count": "a count llama.cpp uses only for BERT-style segment types",
    "tokenizer.ggml.unknown_token_id": "minfer's tokenizers never produce an unknown token: byte-level BPE spells "
    "every byte, and SentencePiece falls back to byte tokens",
    "tokenizer.ggml.seperator_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.padding_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.cls_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.mask_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.prefix_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.suffix_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.middle_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.fim_pre_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.fim_suf_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.fim_mid_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.fim_pad_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.fim_rep_token_id": _SPECIAL_IDS,
    "tokenizer.ggml.fim_sep_token_id": _SPECIAL_IDS,
    "tokenizer.huggingface.json": "the original tokenizer.json, kept for reference (llama.cpp does not read it)",
}
# Tokenizer keys that change how prompts are encoded: accepted only at the value minfer's BPE assumes.
TOKENIZER_KEYS_NEUTRAL = {
    "tokenizer.ggml.add_sep_token": Neutral("separator appended to every prompt", _equals(False)),
    "tokenizer.ggml.add_space_prefix": Neutral("space prefix on every prompt", _equals(False)),
    "tokenizer.ggml.remove_extra_whitespaces": Neutral("whitespace collapsed in every prompt", _equals(False)),
}
# Named alternatives to the default chat template (tokenizer.chat_template.tool_use, ...).
NAMED_TEMPLATE = re.compile(r"tokenizer\.chat_template\.[^.]+")

GENERAL_KEYS_READ = frozenset({"general.architecture", "general.alignment", "general.name"})
QUANTIZATION_VERSION = 2  # the block layouts of ggml's quantized types since 2023; the only ones minfer reads


@dataclass(frozen=True)
class FileAudit:
    """Where each key and tensor of a file went: read, or ignored and why (refusals raise instead)."""

    read_keys: tuple[str, ...]
    ignored_keys: dict[str, str]
    read_tensors: tuple[str, ...]


def audit(gguf: GGUFFile, config: AuditedConfig) -> FileAudit:
    """Account for every key and tensor of `gguf`, or raise a ModelFileError naming the first that is not
    understood (the module docstring gives the rule)."""
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) != config.vocab_size:
        # llama.cpp sizes token_embd from the vocabulary: a token without a row, or a row without a token, would
        # fail in the middle of a generation.
        raise ModelFileError(
            f"{gguf.path}: tokenizer.ggml.tokens has {len(tokens)} tokens but token_embd.weight has "
            f"{config.vocab_size} rows; they must be equal"
        )
    read_keys: list[str] = []
    ignored: dict[str, str] = {}
    for key in gguf.metadata:
        reason = _key_verdict(gguf, config, key)
        if reason is None:
            read_keys.append(key)
        else:
            ignored[key] = reason
    return FileAudit(tuple(read_keys), ignored, _check_tensors(gguf, config))


def _key_verdict(gguf: GGUFFile, config: AuditedConfig, key: str) -> str | None:
    """None for a key that is read, the reason for one that is safely ignored; raises for the rest."""
    arch_prefix = f"{config.architecture}."
    if key.startswith(arch_prefix):
        name = key[len(arch_prefix) :]
        if name in ARCH_KEYS_READ or name in ARCH_KEYS_READ_BY.get(config.architecture, ()):
            return None
        if name in ARCH_KEYS_IGNORED:
            return ARCH_KEYS_IGNORED[name]
        if name in ARCH_KEYS_NEUTRAL:
            return _check_neutral(gguf, config, key, ARCH_KEYS_NEUTRAL[name])
        raise ModelFileError(
            f"{gguf.path}: metadata key '{printable(key)}' is not understood by minfer and may change the "
            f"model's math; refusing the file rather than ignoring it"
        )
    if key.startswith("tokenizer."):
        if key in TOKENIZER_KEYS_READ:
            return None
        if key in SENTENCEPIECE_KEYS_READ and gguf.metadata.get("tokenizer.ggml.model") == "llama":
            return None
        if key in TOKENIZER_KEYS_IGNORED:
            return TOKENIZER_KEYS_IGNORED[key]
        if key in TOKENIZER_KEYS_NEUTRAL:
            return _check_neutral(gguf, config, key, TOKENIZER_KEYS_NEUTRAL[key])
        if NAMED_TEMPLATE.fullmatch(key):
            return "a named alternative chat template (tool use, RAG); minfer renders the default one"
        raise ModelFileError(
            f"{gguf.path}: metadata key '{printable(key)}' is not understood by minfer's tokenizer and may change "
            "how text is encoded; refusing the file rather than ignoring it"
        )
    if key.startswith("general."):
        if key in GENERAL_KEYS_READ:
            return None
        if key == "general.quantization_version" and gguf.get_int(key) != QUANTIZATION_VERSION:
            raise ModelFileError(
                f"{gguf.path}: metadata key '{key}' = {gguf.get_int(key)}; minfer reads the block layouts of "
                f"version {QUANTIZATION_VERSION} only"
            )
        return "descriptive metadata (name, author, license, file type, quantization provenance)"
    if key.startswith("split."):
        if key == "split.count" and gguf.get_int(key) > 1:
            raise ModelFileError(
                f"{gguf.path}: this file is one part of a model split in {gguf.get_int(key)} "
                "(split.count); merge the parts first (llama-gguf-split --merge)"
            )
        return "split-file bookkeeping of a model stored whole"
    return "not read by llama.cpp's loader for this architecture (another program's metadata)"


def _check_neutral(gguf: GGUFFile, config: AuditedConfig, key: str, neutral: Neutral) -> str:
    value = gguf.metadata[key]
    if isinstance(value, list) or not neutral.accepts(value, config):
        shown = printable(repr(value), 40)
        raise ModelFileError(
            f"{gguf.path}: metadata key '{key}' = {shown} turns on {neutral.feature}, which minfer does not "
            "implement for this architecture"
        )
    return f"holds its neutral value: no {neutral.feature}"


def _check_tensors(gguf: GGUFFile, config: AuditedConfig) -> tuple[str, ...]:
    """Every tensor of the file must be one the graphs read (config.expected_tensors, and the RoPE
    frequency factors, which models/rope.py reads)."""
    expected = config.expected_tensors()
    read = [*expected, *(name for name in FACTOR_TENSORS if name in gguf.tensors)]
    for name in gguf.tensors:
        if name in expected or name in FACTOR_TENSORS:
            continue
        layer = re.match(r"blk\.(\d+)\.", name)
        if layer and int(layer.group(1)) >= config.n_layers:
            raise ModelFileError(
                f"{gguf.path}: tensor '{printable(name)}' belongs to layer {layer.group(1)}, but "
                f"{config.architecture}.block_count says the model has {config.n_layers} layers"
            )
        raise ModelFileError(
            f"{gguf.path}: tensor '{printable(name)}' is not read by minfer's {config.architecture} graph; refusing "
            "the file rather than ignoring a tensor that may change its math"
        )
    return tuple(read)
