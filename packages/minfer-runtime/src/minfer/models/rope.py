"""Rotary position embedding: the frequency of every rotated pair, with the file's RoPE scaling.

RoPE rotates pair i (0 <= i < n_rot/2) of a head at position p by the angle p * inv_freq[i], and every
kind of RoPE scaling minfer reads is a change of inv_freq plus one factor on the rotation's cosine and
sine (`mscale`). So the whole of it is a table computed here once, on the host, in float64; the CPU
backend and the CUDA kernels (rope.cuh) then only compute p * inv_freq[i], reduce it, and rotate.

The GGUF keys, and what each means, follow llama.cpp's loader (llama_model_loader, llama_context) and
its converter (convert_hf_to_gguf.py), whose outputs are the contract; the arithmetic follows
transformers' `modeling_rope_utils` (the math reference the tests compare against):

    base    inv_freq[i] = freq_base^(-2i / n_rot) / rope_freqs[i]        rope_freqs.weight: llama3 factors
    linear  inv_freq[i] = base[i] / factor                              rope.scaling.type = linear
    yarn    inv_freq[i] = base[i] * ((1 - w[i]) / factor + w[i])        rope.scaling.type = yarn
            w[i]   = (1 - ramp(i)) * ext_factor, the share of pair i left unscaled (extrapolated)
            ramp(i) = clamp((i - low) / max(high - low, 0.001), 0, 1), low and high the pairs whose
                      wavelength turns beta_fast and beta_slow times over the original context
            mscale = attention_factor, or 0.1 ln(factor) + 1 (the YaRN paper's attention temperature)

and mscale is multiplied by `rope.scaling.attn_factor` for every kind, as llama.cpp does.

LongRoPE (Phi-3 128k, Phi-4-mini) stores two sets of per-pair divisors, `rope_factors_short.weight` and
`rope_factors_long.weight`, used as rope_freqs is: llama.cpp picks the long ones when the context it runs
with exceeds `rope.scaling.original_context_length` (llama_model::get_rope_factors), and so does
`RopeConfig.for_context`; the converter stores LongRoPE's attention factor as `rope.scaling.attn_factor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType

from minfer.errors import ModelFileError
from minfer.gguf_file import GGUFFile, printable

SCALING_KINDS = ("none", "linear", "yarn")
FREQ_FACTORS_TENSOR = "rope_freqs.weight"  # per-pair divisors of the frequencies (Llama 3.x)
SHORT_FACTORS_TENSOR = "rope_factors_short.weight"  # LongRoPE's divisors up to the original context
LONG_FACTORS_TENSOR = "rope_factors_long.weight"  # and beyond it
FACTOR_TENSORS = (FREQ_FACTORS_TENSOR, SHORT_FACTORS_TENSOR, LONG_FACTORS_TENSOR)
# transformers' and llama.cpp's defaults for the YaRN ramp (the paper's alpha and beta).
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


@dataclass(frozen=True)
class RopeConfig:
    n_rot: int  # rotated dimensions per head (the first n_rot of head_dim)
    freq_base: float
    neox: bool  # NeoX rotates pairs (i, i + n_rot/2); the llama layout rotates adjacent pairs (2i, 2i+1)
    scaling: str = "none"  # one of SCALING_KINDS
    factor: float = 1.0  # context extension factor (linear, yarn)
    original_context: int = 0  # yarn: the context the model was pretrained with
    attn_factor: float = 1.0  # rope.scaling.attn_factor: a factor on cos and sin, any kind
    yarn_attention_factor: float | None = None  # yarn's mscale when the file gives it, else computed
    beta_fast: float = YARN_BETA_FAST
    beta_slow: float = YARN_BETA_SLOW
    ext_factor: float = 1.0  # yarn: how much of the ramp is extrapolated (1 in every published model)
    freq_factors: tuple[float, ...] | None = None  # rope_freqs.weight (or LongRoPE's short set), n_rot/2 values
    long_factors: tuple[float, ...] | None = None  # LongRoPE's set for a context past original_context

    def for_context(self, n_ctx: int) -> RopeConfig:
        """The RoPE a session of `n_ctx` positions runs: LongRoPE's long factors past the original context."""
        if self.long_factors is not None and n_ctx > self.original_context:
            return replace(self, freq_factors=self.long_factors)
        return self

    def describe(self) -> str:
        layout = "neox" if self.neox else "normal"
        text = f"{layout}, theta {self.freq_base:g}, dims {self.n_rot}"
        if self.scaling == "linear":
            text += f", linear scaling x{self.factor:g}"
        elif self.scaling == "yarn":
            text += f", yarn x{self.factor:g} from {self.original_context} (beta {self.beta_fast:g}/{self.beta_slow:g})"
        if self.long_factors is not None:
            text += f", LongRoPE (long factors past {self.original_context} positions)"
        elif self.freq_factors is not None:
            text += f", per-pair factors from {FREQ_FACTORS_TENSOR}"
        if self.attn_factor != 1.0:
            text += f", attn factor {self.attn_factor:g}"
        return text


def rope_table(rope: RopeConfig) -> tuple[np.ndarray, float]:
    """(inv_freq, mscale): pair i of a head at position p turns by p * inv_freq[i], and the rotation's
    cos and sin are multiplied by mscale. inv_freq is float64, n_rot/2 values (the module docstring
    spells out each scaling kind)."""
    half = rope.n_rot // 2
    pairs = np.arange(half, dtype=np.float64)
    extrapolated = rope.freq_base ** (-2.0 * pairs / rope.n_rot)
    if rope.freq_factors is not None:
        extrapolated = extrapolated / np.asarray(rope.freq_factors, dtype=np.float64)
    mscale = rope.attn_factor
    if rope.scaling == "linear":
        return extrapolated / rope.factor, mscale
    if rope.scaling != "yarn":
        return extrapolated, mscale
    low, high = yarn_correction_range(rope)
    ramp = np.clip((pairs - low) / max(high - low, 0.001), 0.0, 1.0)
    kept = (1.0 - ramp) * rope.ext_factor  # the share of each pair's frequency left as pretrained
    inv_freq = extrapolated / rope.factor * (1.0 - kept) + extrapolated * kept
    if rope.yarn_attention_factor is not None:
        mscale *= rope.yarn_attention_factor
    elif rope.factor > 1.0:
        mscale *= 0.1 * math.log(rope.factor) + 1.0
    return inv_freq, mscale


def yarn_correction_range(rope: RopeConfig) -> tuple[float, float]:
    """The pairs between which YaRN blends: below `low` frequencies are kept, above `high` interpolated.

    Pair i turns original_context * inv_freq[i] / 2pi times over the original context; `low` is where that
    count is beta_fast, `high` where it is beta_slow (floored and ceiled, and clamped to the pairs, as
    transformers does with truncate=True and llama.cpp's ggml_rope_yarn_corr_dims always does)."""

    def pair_turning(turns: float) -> float:
        return rope.n_rot * math.log(rope.original_context / (turns * 2 * math.pi)) / (2 * math.log(rope.freq_base))

    low = math.floor(pair_turning(rope.beta_fast))
    high = math.ceil(pair_turning(rope.beta_slow))
    return max(low, 0), min(high, rope.n_rot - 1)


def read_rope_config(gguf: GGUFFile, arch: str, n_rot: int, default_base: float, neox: bool, n_ctx: int) -> RopeConfig:
    """The RoPE of `gguf` (keys under `arch.rope.`), every value checked; a kind minfer does not implement
    (longrope, anything unknown) is refused naming the key."""

    def key(name: str) -> str:
        return f"{arch}.rope.{name}"

    def positive(name: str, value: float) -> float:
        if not (math.isfinite(value) and value > 0):
            raise ModelFileError(f"{gguf.path}: metadata key '{key(name)}' = {value!r} must be a positive number")
        return value

    base = positive("freq_base", gguf.get_float(key("freq_base"), default_base))
    kind = gguf.get_str(key("scaling.type"), None)
    # llama.cpp reads the factor from rope.scaling.factor, or from the older rope.scale_linear; 0 means none.
    factor_key = "scaling.factor" if key("scaling.factor") in gguf.metadata else "scale_linear"
    factor = gguf.get_float(key(factor_key), 0.0)
    factor = 1.0 if factor == 0.0 else positive(factor_key, factor)
    if kind is None:
        kind = "linear" if factor != 1.0 else "none"  # llama.cpp's default kind is linear
    if kind not in SCALING_KINDS:
        raise ModelFileError(
            f"{gguf.path}: metadata key '{key('scaling.type')}' = '{printable(kind)}' is not supported "
            f"(minfer implements {', '.join(SCALING_KINDS)})"
        )
    if kind == "none":
        factor = 1.0  # llama.cpp never scales when the kind says none, whatever the factor
    rope = RopeConfig(
        n_rot=n_rot,
        freq_base=base,
        neox=neox,
        scaling=kind,
        factor=factor,
        attn_factor=positive("scaling.attn_factor", gguf.get_float(key("scaling.attn_factor"), 1.0)),
        freq_factors=read_freq_factors(gguf, FREQ_FACTORS_TENSOR, n_rot),
    )
    short, long = (read_freq_factors(gguf, name, n_rot) for name in (SHORT_FACTORS_TENSOR, LONG_FACTORS_TENSOR))
    if (short is None) != (long is None) or (short is not None and rope.freq_factors is not None):
        raise ModelFileError(
            f"{gguf.path}: LongRoPE needs both '{SHORT_FACTORS_TENSOR}' and '{LONG_FACTORS_TENSOR}', and no "
            f"'{FREQ_FACTORS_TENSOR}' beside them"
        )
    if short is not None:
        original = gguf.get_int(key("scaling.original_context_length"))
        if original <= 0:
            raise ModelFileError(
                f"{gguf.path}: metadata key '{key('scaling.original_context_length')}' must be positive"
            )
        rope = replace(rope, freq_factors=short, long_factors=long, original_context=original)
    if kind != "yarn":
        return rope
    original = gguf.get_int(key("scaling.original_context_length"), n_ctx)
    if original <= 0:
        raise ModelFileError(f"{gguf.path}: metadata key '{key('scaling.original_context_length')}' must be positive")
    attention = gguf.get_float(key("scaling.yarn_attn_factor"), None)
    ext_factor = gguf.get_float(key("scaling.yarn_ext_factor"), 1.0)
    if ext_factor != 1.0:
        # Neither transformers nor llama.cpp's llama/qwen2 graphs read it: honouring it would match neither.
        raise ModelFileError(
            f"{gguf.path}: metadata key '{key('scaling.yarn_ext_factor')}' = {ext_factor:g} is not supported "
            "(the reference implementations of this architecture always use 1)"
        )
    return replace(
        rope,
        original_context=original,
        yarn_attention_factor=None if attention is None else positive("scaling.yarn_attn_factor", attention),
        beta_fast=positive("scaling.yarn_beta_fast", gguf.get_float(key("scaling.yarn_beta_fast"), YARN_BETA_FAST)),
        beta_slow=positive("scaling.yarn_beta_slow", gguf.get_float(key("scaling.yarn_beta_slow"), YARN_BETA_SLOW)),
    )


def read_freq_factors(gguf: GGUFFile, name: str, n_rot: int) -> tuple[float, ...] | None:
    """Tensor `name` of per-pair divisors (one of FACTOR_TENSORS), when the file has it: n_rot/2 positive
    finite F32 values."""
    tensor = gguf.tensors.get(name)
    if tensor is None:
        return None
    if tensor.shape != (n_rot // 2,) or tensor.qtype is not GGMLQuantizationType.F32:
        raise ModelFileError(
            f"{gguf.path}: tensor '{name}' is {tensor.qtype.name} {list(tensor.shape)}; "
            f"expected F32 [{n_rot // 2}] (one factor per rotated pair)"
        )
    factors = tensor.data.view(np.float32)
    if not (np.isfinite(factors).all() and (factors > 0).all()):
        raise ModelFileError(f"{gguf.path}: tensor '{name}' holds values that are not positive and finite")
    return tuple(float(f) for f in factors)
