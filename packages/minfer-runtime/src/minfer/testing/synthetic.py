"""Synthetic GGUF models: real architectures' shapes (or scaled-down ones) with random weights.

Tests and benchmarks use these instead of downloads. A model is fully determined
by its spec, weight type and seed: the same call writes the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, RopeScalingType

from minfer.gguf_file import GGUFFile
from minfer.models.config import (
    ARCHITECTURES,
    DEFAULT_ROPE_FREQ_BASE_SWA,
    ModelConfig,
    attention_scale,
    windowed_layers,
)
from minfer.models.rope import FREQ_FACTORS_TENSOR, LONG_FACTORS_TENSOR, SHORT_FACTORS_TENSOR, RopeConfig
from minfer.testing.quantize import quantize
from minfer.testing.vocab import add_sentencepiece_metadata, add_tokenizer_metadata


@dataclass(frozen=True)
class SyntheticSpec:
    architecture: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    context_length: int = 2048
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tied_output: bool = True
    qkv_bias: bool = False
    # RoPE scaling as llama.cpp's converter writes it: rope.scaling.{type, factor, original_context_length},
    # and Llama 3's per-pair factors (rope_freqs.weight, head_dim/2 values).
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    rope_original_context: int = 0
    rope_freq_factors: tuple[float, ...] | None = None
    # LongRoPE as the Phi-3 converter writes it: short and long factors, the original context, attn_factor.
    rope_short_factors: tuple[float, ...] | None = None
    rope_long_factors: tuple[float, ...] | None = None
    rope_attn_factor: float = 1.0
    key_length: int | None = None  # attention.key_length when it is not d_model / n_heads (qwen3, gemma3)
    rope_dim: int | None = None  # rope.dimension_count when it is not the head size (Phi-4-mini's 3/4)
    sliding_window: int = 0  # attention.sliding_window (gemma3: on 5 layers of 6; phi3: every layer)
    final_logit_softcap: float = 0.0  # gemma3's final_logit_softcapping
    sentencepiece: str | None = None  # a SentencePiece vocabulary of this style (testing/vocab.py); None: BPE

    @property
    def head_dim(self) -> int:
        return self.key_length or self.d_model // self.n_heads

    def rope(self) -> RopeConfig:
        return RopeConfig(
            n_rot=self.rope_dim or self.head_dim,
            freq_base=self.rope_theta,
            neox=ARCHITECTURES[self.architecture].rope_neox,
            scaling=self.rope_scaling,
            factor=self.rope_scaling_factor,
            original_context=self.rope_original_context,
            freq_factors=self.rope_freq_factors or self.rope_short_factors,
            long_factors=self.rope_long_factors,
            attn_factor=self.rope_attn_factor,
        )

    def config(self) -> ModelConfig:
        """The config the engine reads from the written file, from the architecture's ArchitectureSpec."""
        family = ARCHITECTURES[self.architecture]
        return ModelConfig(
            architecture=self.architecture,
            n_layers=self.n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            d_ff=self.d_ff,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            rope=self.rope(),
            rms_eps=self.rms_eps,
            tied_output=self.tied_output,
            qkv_bias=self.qkv_bias,
            qk_norm=family.qk_norm,
            sandwich_norms=family.sandwich_norms,
            fused_qkv=self.architecture == "phi3",  # as Phi-3's converter stores it
            fused_gate_up=family.fused_gate_up,
            activation=family.activation,
            embedding_scale=self.d_model**0.5 if family.scaled_embeddings else 1.0,
            attention_scale=attention_scale(self.architecture, self.n_layers, self.d_model, self.n_heads),
            sliding_window=self.sliding_window,
            windowed_layers=windowed_layers(family.swa_pattern, self.n_layers) if self.sliding_window else (),
            rope_local=RopeConfig(self.rope().n_rot, DEFAULT_ROPE_FREQ_BASE_SWA, family.rope_neox)
            if self.sliding_window and family.local_rope
            else None,
            final_logit_softcap=self.final_logit_softcap,
        )


PRESETS: dict[str, SyntheticSpec] = {
    # The default model's shapes (SmolLM2-135M).
    "smollm2-135m": SyntheticSpec("llama", 30, 576, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5),
    # Qwen2.5-0.5B's shapes: the model llama.cpp's anchors in ANCHORS.md were measured on.
    "qwen2.5-0.5b": SyntheticSpec("qwen2", 24, 896, 14, 2, 4864, 151936, 32768, 1000000.0, 1e-6, True, True),
    # Qwen2.5-1.5B's: heads of 128 with no head norms (as Llama 3 8B's and Mistral 7B's), groups of 6, tied.
    "qwen2.5-1.5b": SyntheticSpec("qwen2", 28, 1536, 12, 2, 8960, 151936, 32768, 1000000.0, 1e-6, True, True),
    # Scaled down, same structure: small enough for every test to run in milliseconds.
    "tiny-llama": SyntheticSpec("llama", 2, 64, 4, 2, 160, 512, 512, 10000.0, 1e-5, tied_output=False),
    "tiny-qwen2": SyntheticSpec("qwen2", 2, 64, 4, 2, 160, 512, 512, 1000000.0, 1e-6, True, True),
    # Llama-3.2-1B's shapes (the performance issue's second size; its RoPE scaling left out: speed only).
    "llama3.2-1b": SyntheticSpec("llama", 16, 2048, 32, 8, 8192, 128256, 131072, 500000.0, 1e-5, tied_output=True),
    # Qwen3-0.6B's shapes: heads of 128 (q 2048 wide on a 1024 residual), q/k norms, no bias.
    "qwen3-0.6b": SyntheticSpec("qwen3", 28, 1024, 16, 8, 3072, 151936, 40960, 1000000.0, 1e-6, key_length=128),
    # Gemma 3 270M's: heads of 256, one KV head, a 512-row window on 5 layers of 6, a 262144-token vocabulary.
    "gemma3-270m": SyntheticSpec(
        "gemma3",
        18,
        640,
        4,
        1,
        2048,
        262144,
        32768,
        1e6,
        1e-6,
        key_length=256,
        sliding_window=512,
        sentencepiece="gemma",
    ),
    # Phi-4-mini's structure at a small width: fused q|k|v and gate|up, RoPE on 3/4 of each head.
    "phi4-mini-small": SyntheticSpec("phi3", 4, 512, 8, 2, 1024, 2048, 4096, 10000.0, 1e-5, rope_dim=48),
    "tiny-qwen3": SyntheticSpec("qwen3", 2, 64, 4, 2, 160, 512, 512, 1000000.0, 1e-6, key_length=32),
    "tiny-gemma3": SyntheticSpec(
        "gemma3", 6, 64, 4, 2, 160, 512, 512, 1e6, 1e-6, key_length=32, sliding_window=8, sentencepiece="gemma"
    ),
    # Phi-3-mini's SentencePiece vocabulary (Phi-4-mini's is byte-level BPE, as phi4-mini-small's).
    "tiny-phi3": SyntheticSpec(
        "phi3", 2, 64, 4, 4, 160, 512, 512, 10000.0, 1e-5, tied_output=False, rope_dim=12, sentencepiece="phi3"
    ),
}

T = GGMLQuantizationType
# Every type a model's matrices can be written in (the writer's quantizers: testing/quantize.py).
WEIGHT_TYPES = {t.name: t for t in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K,
                                    T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS)}  # fmt: skip
# Mixes of types, as llama-quantize makes them (`Q4_K_M`: see `q4_k_m_type`).
MIXES = ("Q4_K_M",)
# A 256-value type needs rows of whole super-blocks; llama-quantize falls back to these otherwise (its
# tensor_type_fallback).
K_QUANT_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
                    T.IQ4_XS: T.IQ4_NL}  # fmt: skip


def uses_more_bits(layer: int, n_layers: int) -> bool:
    """llama-quantize's choice of layers that get more bits in a _M mix: the first and last eighth, every third."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def is_output_head(name: str, tied_output: bool) -> bool:
    """The output head's matrix: output.weight, or the token embedding that a tied model multiplies by instead
    (llama-quantize gives it the output's type)."""
    return name == "output.weight" or (tied_output and name == "token_embd.weight")


def q4_k_m_type(name: str, row_length: int, n_layers: int, tied_output: bool) -> GGMLQuantizationType:
    """The type llama-quantize gives a matrix in a Q4_K_M model (its llama_tensor_get_type: a fused attn_qkv
    gets Q5_K)."""
    if is_output_head(name, tied_output):
        qtype = GGMLQuantizationType.Q6_K
    elif name.endswith("attn_qkv.weight"):
        qtype = GGMLQuantizationType.Q5_K
    elif name.endswith(("attn_v.weight", "ffn_down.weight")):
        layer = int(name.split(".")[1])
        qtype = GGMLQuantizationType.Q6_K if uses_more_bits(layer, n_layers) else GGMLQuantizationType.Q4_K
    else:
        qtype = GGMLQuantizationType.Q4_K
    return qtype if row_length % 256 == 0 else K_QUANT_FALLBACK[qtype]


def matrix_type(
    spec: SyntheticSpec, weight_type: str, name: str, row_length: int, output_type: str | None = None
) -> GGMLQuantizationType:
    """A matrix's type: `weight_type`'s (a mix's choice for this matrix), the output head's `output_type` where
    one is given; a K-quant falls back as llama-quantize's does where rows are not whole super-blocks."""
    if output_type is not None and is_output_head(name, spec.tied_output):
        qtype = WEIGHT_TYPES[output_type]
    elif weight_type == "Q4_K_M":
        return q4_k_m_type(name, row_length, spec.n_layers, spec.tied_output)
    else:
        qtype = WEIGHT_TYPES[weight_type]
    return K_QUANT_FALLBACK[qtype] if qtype in K_QUANT_FALLBACK and row_length % 256 else qtype


def random_tensors(spec: SyntheticSpec, seed: int, std: float = 0.02) -> dict[str, np.ndarray]:
    """Float32 weights in numpy order (GGUF shape reversed), drawn N(0, std); norm weights near 1."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, gguf_shape in spec.config().expected_tensors().items():
        shape = tuple(reversed(gguf_shape))
        if name.endswith("norm.weight"):
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        else:
            tensors[name] = (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return tensors


def write_synthetic_model(
    path: str | os.PathLike[str],
    spec: SyntheticSpec | str = "tiny-llama",
    *,
    weight_type: str = "Q8_0",
    output_type: str | None = None,
    seed: int = 0,
    pre: str | None = None,
) -> Path:
    """Write a GGUF with random weights: matrices in `weight_type`, norms and biases in F32.

    `output_type` is the output head's type, as llama-quantize's --output-tensor-type (the tied token embedding's
    in a tied model; None: the head is a matrix like the others). llama-quantize's Q4_0, Q4_1, Q5_0 and Q5_1
    models have a Q6_K head: those files are `weight_type="Q4_0", output_type="Q6_K"`. `pre` picks the
    tokenizer's pre-tokenizer (default: `qwen2` for qwen2, `smollm` otherwise).
    """
    if isinstance(spec, str):
        spec = PRESETS[spec]
    if weight_type not in (*WEIGHT_TYPES, *MIXES):
        raise ValueError(f"unknown weight type {weight_type!r} (choose from {', '.join([*WEIGHT_TYPES, *MIXES])})")
    if output_type is not None and output_type not in WEIGHT_TYPES:
        raise ValueError(f"unknown output tensor type {output_type!r} (choose from {', '.join(WEIGHT_TYPES)})")
    path = Path(path)
    writer = GGUFWriter(str(path), spec.architecture)
    writer.add_name(f"synthetic-{spec.architecture}-{spec.n_layers}L-{spec.d_model}d-{weight_type}")
    writer.add_block_count(spec.n_layers)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.d_model)
    writer.add_feed_forward_length(spec.d_ff)
    writer.add_head_count(spec.n_heads)
    writer.add_head_count_kv(spec.n_kv_heads)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_rope_dimension_count(spec.rope().n_rot)
    if spec.key_length is not None:
        writer.add_key_length(spec.key_length)
        writer.add_value_length(spec.key_length)
    if spec.sliding_window:
        writer.add_sliding_window(spec.sliding_window)
    if spec.final_logit_softcap:
        writer.add_final_logit_softcapping(spec.final_logit_softcap)
    if spec.rope_long_factors is not None:
        writer.add_rope_scaling_orig_ctx_len(spec.rope_original_context)
        writer.add_rope_scaling_attn_factors(spec.rope_attn_factor)
        writer.add_tensor(SHORT_FACTORS_TENSOR, np.asarray(spec.rope_short_factors, dtype=np.float32))
        writer.add_tensor(LONG_FACTORS_TENSOR, np.asarray(spec.rope_long_factors, dtype=np.float32))
    if spec.rope_scaling != "none":
        writer.add_rope_scaling_type(RopeScalingType(spec.rope_scaling))
        writer.add_rope_scaling_factor(spec.rope_scaling_factor)
        if spec.rope_scaling == "yarn":
            writer.add_rope_scaling_orig_ctx_len(spec.rope_original_context)
    if spec.rope_freq_factors is not None:
        writer.add_tensor(FREQ_FACTORS_TENSOR, np.asarray(spec.rope_freq_factors, dtype=np.float32))
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_vocab_size(spec.vocab_size)
    if spec.sentencepiece is not None:
        add_sentencepiece_metadata(writer, spec.vocab_size, style=spec.sentencepiece)
    else:
        add_tokenizer_metadata(
            writer, spec.vocab_size, pre=pre or ("qwen2" if spec.architecture == "qwen2" else "smollm")
        )
    for name, values in random_tensors(spec, seed).items():
        if values.ndim == 1:
            writer.add_tensor(name, values)
        else:
            qtype = matrix_type(spec, weight_type, name, values.shape[-1], output_type)
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rewrite_gguf(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    set_keys: dict[str, tuple[object, GGUFValueType]] | None = None,
    drop_keys: tuple[str, ...] = (),
    add_tensors: dict[str, np.ndarray] | None = None,
    drop_tensors: tuple[str, ...] = (),
) -> Path:
    """A copy of a GGUF file with metadata keys set (value, GGUF type) or dropped and tensors added (float32
    values, numpy order) or dropped: the files a test needs that no converter would write."""
    gguf = GGUFFile(source)
    writer = GGUFWriter(str(target), gguf.architecture)
    changes = set_keys or {}
    for key, kind in gguf.value_types.items():
        if key in drop_keys or key in changes or key == "general.architecture":
            continue
        writer.add_key_value(key, gguf.metadata[key], kind.type, sub_type=kind.element)
    for key, (value, value_type) in changes.items():
        sub_type = GGUFValueType.get_type(value[0]) if isinstance(value, list) else None
        writer.add_key_value(key, value, value_type, sub_type=sub_type)
    for name, tensor in gguf.tensors.items():
        if name not in drop_tensors:
            writer.add_tensor(name, np.array(tensor.data), raw_dtype=tensor.qtype)
    for name, values in (add_tensors or {}).items():
        writer.add_tensor(name, np.asarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(target)


def scaled(spec: SyntheticSpec | str, **changes: object) -> SyntheticSpec:
    """A preset with some fields changed (fewer layers for a quick test, say)."""
    base = PRESETS[spec] if isinstance(spec, str) else spec
    return replace(base, **changes)


def weights_digest(gguf: GGUFFile) -> str:
    """sha256 over every tensor's name, type, shape and bytes: identifies a model's weights, whatever the metadata."""
    digest = hashlib.sha256()
    for name in sorted(gguf.tensors):
        tensor = gguf.tensors[name]
        digest.update(f"{name}:{tensor.qtype.name}:{list(tensor.shape)}".encode())
        digest.update(tensor.raw_bytes().tobytes())
    return digest.hexdigest()


def main() -> None:
    """`python -m minfer.testing.synthetic OUT.gguf --preset qwen2.5-0.5b --weight-type Q4_0`: a benchmark model."""
    parser = argparse.ArgumentParser(description="Write a synthetic GGUF model with random weights.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="qwen2.5-0.5b")
    parser.add_argument("--weight-type", choices=sorted([*WEIGHT_TYPES, *MIXES]), default="Q4_0")
    parser.add_argument(
        "--output-tensor-type",
        choices=sorted(WEIGHT_TYPES),
        help="the output head's type, as llama-quantize's flag (its Q4_0, Q4_1, Q5_0 and Q5_1 models: Q6_K)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # Written beside OUT and renamed when complete: an interrupted run leaves no OUT that the scripts, which
    # write a model only where it is missing, would take for a whole one.
    partial = args.out.with_name(args.out.name + ".partial")
    try:
        write_synthetic_model(
            partial, args.preset, weight_type=args.weight_type, output_type=args.output_tensor_type, seed=args.seed
        )
        partial.replace(args.out)
    finally:
        partial.unlink(missing_ok=True)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
