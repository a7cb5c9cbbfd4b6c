"""Every file understood or refused: the config's value checks and the audit of every key and tensor.

Each file here is a valid synthetic model changed in one way a converter, a tool or an attacker could
change it; each is either accounted for or refused with one line naming the file and the culprit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGUFValueType

from minfer.errors import ModelFileError
from minfer.gguf_file import GGUFFile
from minfer.models.audit import audit
from minfer.models.config import ModelConfig
from minfer.models.rope import (
    FREQ_FACTORS_TENSOR,
    LONG_FACTORS_TENSOR,
    SHORT_FACTORS_TENSOR,
    RopeConfig,
    rope_table,
    yarn_correction_range,
)
from minfer.testing.synthetic import rewrite_gguf

U32, F32, STR, BOOL = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING, GGUFValueType.BOOL


@pytest.fixture
def variant(synthetic_model, tmp_path):
    """`variant(**rewrite_gguf options)` -> a changed copy of the tiny llama model, opened."""

    def make(preset: str = "tiny-llama", **changes) -> GGUFFile:
        return GGUFFile(rewrite_gguf(synthetic_model(preset), tmp_path / "variant.gguf", **changes))

    return make


def refused(gguf: GGUFFile, pattern: str) -> None:
    with pytest.raises(ModelFileError, match=pattern) as caught:
        ModelConfig.from_gguf(gguf)
    message = str(caught.value)
    assert message.startswith(f"{gguf.path}: ") and "\n" not in message


def test_the_synthetic_models_are_fully_accounted_for(synthetic_model):
    for preset in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-phi3"):
        gguf = GGUFFile(synthetic_model(preset))
        accounted = audit(gguf, ModelConfig.from_gguf(gguf))
        assert set(accounted.read_keys) | set(accounted.ignored_keys) == set(gguf.metadata)
        assert set(accounted.read_tensors) == set(gguf.tensors)


def test_the_default_model_is_fully_accounted_for(default_model_gguf):
    accounted = audit(default_model_gguf, ModelConfig.from_gguf(default_model_gguf))
    assert "llama.rope.freq_base" in accounted.read_keys and "tokenizer.ggml.merges" in accounted.read_keys
    assert accounted.ignored_keys["general.license"].startswith("descriptive metadata")
    assert len(accounted.read_tensors) == len(default_model_gguf.tensors) == 272


@pytest.mark.parametrize(
    ("key", "value", "kind", "pattern"),
    [
        (
            "llama.attention.head_count",
            4.7,
            F32,
            r"'llama\.attention\.head_count' is FLOAT32 \(4\.7\); expected an int",
        ),
        ("llama.attention.head_count", "4", STR, r"'llama\.attention\.head_count' is STRING \('4'\); expected an int"),
        ("llama.block_count", 0, U32, r"'llama\.block_count' = 0 must be in 1\.\."),
        ("llama.block_count", 2**32 - 1, GGUFValueType.UINT32, r"'llama\.block_count' = 4294967295 must be in 1\.\."),
        ("llama.rope.dimension_count", 0, U32, r"'llama\.rope\.dimension_count' = 0 must be in"),
        ("llama.rope.dimension_count", 15, U32, r"'llama\.rope\.dimension_count' = 15 must be even"),
        ("llama.rope.freq_base", 0.0, F32, r"'llama\.rope\.freq_base' = 0\.0 must be a positive number"),
        ("llama.rope.freq_base", 10000, U32, r"'llama\.rope\.freq_base' is UINT32 \(10000\); expected a float"),
        ("llama.attention.layer_norm_rms_epsilon", math.nan, F32, r"layer_norm_rms_epsilon' = nan must be a positive"),
        ("llama.attention.layer_norm_rms_epsilon", -1.0, F32, r"layer_norm_rms_epsilon' = -1\.0 must be a positive"),
        ("llama.attention.head_count_kv", 3, U32, r"head_count 4 is not a multiple of head_count_kv 3"),
        ("llama.attention.value_length", 8, U32, r"'llama\.attention\.value_length' = 8 differs from the key length"),
        ("llama.vocab_size", 511, U32, r"'llama\.vocab_size' = 511 but token_embd\.weight has 512 rows"),
        ("llama.feed_forward_length", 192, U32, r"tensor 'blk\.0\.ffn_gate\.weight' has shape \[64, 160\], expected"),
        ("llama.context_length", 2**31, GGUFValueType.UINT64, r"'llama\.context_length' = 2147483648 must be in"),
    ],
)
def test_hyperparameters_of_the_wrong_type_or_range_are_refused(variant, key, value, kind, pattern):
    refused(variant(set_keys={key: (value, kind)}), pattern)


def test_a_block_count_smaller_than_the_layers_is_refused(variant):
    # The real model with block_count 1 used to run and print newlines.
    refused(
        variant(set_keys={"llama.block_count": (1, U32)}),
        r"tensor 'blk\.1\.attn_norm\.weight' belongs to layer 1, but llama\.block_count says the model has 1 layers",
    )


def test_a_tensor_the_graph_does_not_read_is_refused(variant):
    refused(
        variant(add_tensors={"blk.0.attn_output.bias": np.zeros(64, np.float32)}),
        r"tensor 'blk\.0\.attn_output\.bias' is not read by minfer's llama graph",
    )


def test_a_one_dimensional_token_embedding_is_refused(variant):
    refused(
        variant(drop_tensors=("token_embd.weight",), add_tensors={"token_embd.weight": np.zeros(64, np.float32)}),
        r"tensor 'token_embd\.weight' has shape \[64\]; expected \[embedding length, vocabulary size\]",
    )


@pytest.mark.parametrize(
    ("key", "value", "kind", "feature"),
    [
        ("llama.expert_count", 8, U32, "mixture of experts"),
        ("llama.final_logit_softcapping", 30.0, F32, "final logit soft-capping"),
        ("llama.attn_logit_softcapping", 50.0, F32, "attention logit soft-capping"),
        ("llama.attention.causal", False, BOOL, "non-causal attention"),
        ("llama.attention.scale", 0.5, F32, "attention scale other than"),
        ("llama.embedding_scale", 12.0, F32, "scaled embeddings"),
        ("tokenizer.ggml.add_space_prefix", True, BOOL, "space prefix on every prompt"),
    ],
)
def test_math_changing_keys_are_refused_unless_neutral(variant, key, value, kind, feature):
    refused(variant(set_keys={key: (value, kind)}), rf"'{key}' = .* turns on {feature}")


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [
        ("llama.expert_count", 0, U32),
        ("llama.attention.causal", True, BOOL),
        ("llama.attention.scale", 0.25, F32),  # 1/sqrt(16), the tiny model's head size
        ("tokenizer.ggml.add_space_prefix", False, BOOL),
    ],
)
def test_math_changing_keys_at_their_neutral_value_are_accepted_and_listed(variant, key, value, kind):
    gguf = variant(set_keys={key: (value, kind)})
    assert audit(gguf, ModelConfig.from_gguf(gguf)).ignored_keys[key].startswith("holds its neutral value")


def test_an_unknown_key_under_the_architecture_is_refused(variant):
    refused(
        variant(set_keys={"llama.attention.temperature_scale": (0.5, F32)}),
        r"metadata key 'llama\.attention\.temperature_scale' is not understood by minfer and may change",
    )


def test_an_unknown_tokenizer_key_is_refused(variant):
    refused(
        variant(set_keys={"tokenizer.ggml.precompiled_charsmap": ([1, 2, 3], GGUFValueType.ARRAY)}),
        r"'tokenizer\.ggml\.precompiled_charsmap' is not understood by minfer's tokenizer",
    )


def test_keys_of_other_programs_and_named_templates_are_ignored_and_listed(variant):
    gguf = variant(
        set_keys={
            "quantize.imatrix.file": ("imatrix.dat", STR),
            "tokenizer.chat_template.tool_use": ("{{ messages }}", STR),
            "split.count": (1, GGUFValueType.UINT16),
        }
    )
    ignored = audit(gguf, ModelConfig.from_gguf(gguf)).ignored_keys
    assert ignored["quantize.imatrix.file"].startswith("not read by llama.cpp")
    assert ignored["tokenizer.chat_template.tool_use"].startswith("a named alternative chat template")
    assert ignored["split.count"].startswith("split-file bookkeeping")


def test_one_part_of_a_split_model_is_refused(variant):
    refused(variant(set_keys={"split.count": (3, GGUFValueType.UINT16)}), r"one part of a model split in 3")


def test_an_old_quantization_version_is_refused(variant):
    refused(variant(set_keys={"general.quantization_version": (1, U32)}), r"'general\.quantization_version' = 1")


# -- RoPE scaling: read from the keys llama.cpp's converter writes, computed as transformers computes it ----------


def test_an_unimplemented_rope_scaling_is_refused_by_key(variant):
    refused(
        variant(set_keys={"llama.rope.scaling.type": ("longrope", STR)}),
        r"'llama\.rope\.scaling\.type' = 'longrope' is not supported \(minfer implements none, linear, yarn\)",
    )


def test_an_extrapolation_factor_no_reference_uses_is_refused(variant):
    keys = {"llama.rope.scaling.type": ("yarn", STR), "llama.rope.scaling.yarn_ext_factor": (0.5, F32)}
    refused(variant(set_keys=keys), r"'llama\.rope\.scaling\.yarn_ext_factor' = 0\.5 is not supported")


NOT_POSITIVE = r"'rope_freqs\.weight' holds values that are not positive and finite"


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        (np.ones(4, np.float32), r"'rope_freqs\.weight' is F32 \[4\]; expected F32 \[8\]"),
        (np.array([1, 2, np.nan, 1, 1, 1, 1, 1], np.float32), NOT_POSITIVE),
        (np.array([1, 2, 0, 1, 1, 1, 1, 1], np.float32), NOT_POSITIVE),
    ],
)
def test_broken_rope_frequency_factors_are_refused(variant, values, pattern):
    refused(variant(add_tensors={FREQ_FACTORS_TENSOR: values}), pattern)


def test_the_old_linear_scale_key_means_linear_scaling(variant):
    gguf = variant(set_keys={"llama.rope.scale_linear": (2.0, F32)})
    rope = ModelConfig.from_gguf(gguf).rope
    assert (rope.scaling, rope.factor) == ("linear", 2.0)


def test_scaling_kind_none_never_scales(variant):
    keys = {"llama.rope.scaling.type": ("none", STR), "llama.rope.scaling.factor": (8.0, F32)}
    assert ModelConfig.from_gguf(variant(set_keys=keys)).rope.factor == 1.0


BASE = RopeConfig(n_rot=64, freq_base=10000.0, neox=False)


def test_rope_table_without_scaling_is_the_plain_frequencies():
    inv_freq, mscale = rope_table(BASE)
    np.testing.assert_allclose(inv_freq, 10000.0 ** (-np.arange(32) * 2 / 64), rtol=1e-15)
    assert mscale == 1.0


def test_linear_scaling_and_frequency_factors_divide_the_frequencies():
    factors = tuple(np.linspace(1.0, 8.0, 32))
    plain, _ = rope_table(BASE)
    linear, _ = rope_table(RopeConfig(64, 10000.0, False, scaling="linear", factor=4.0))
    np.testing.assert_allclose(linear, plain / 4.0, rtol=1e-15)
    divided, mscale = rope_table(RopeConfig(64, 10000.0, False, freq_factors=factors, attn_factor=1.5))
    np.testing.assert_allclose(divided, plain / np.array(factors), rtol=1e-15)
    assert mscale == 1.5


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_scales_attention():
    yarn = RopeConfig(64, 10000.0, False, scaling="yarn", factor=4.0, original_context=4096)
    low, high = yarn_correction_range(yarn)
    plain, _ = rope_table(BASE)
    inv_freq, mscale = rope_table(yarn)
    assert 0 < low < high < 31
    np.testing.assert_allclose(inv_freq[: low + 1], plain[: low + 1], rtol=1e-15)  # turn often: kept
    np.testing.assert_allclose(inv_freq[high:], plain[high:] / 4.0, rtol=1e-15)  # turn rarely: interpolated
    between = inv_freq[low + 1 : high] / plain[low + 1 : high]
    assert np.all(np.diff(between) < 0) and np.all((between > 0.25) & (between < 1.0))
    assert mscale == pytest.approx(0.1 * math.log(4.0) + 1.0)
    _, given = rope_table(RopeConfig(64, 10000.0, False, scaling="yarn", factor=4.0, original_context=4096,
                                     yarn_attention_factor=0.9))  # fmt: skip
    assert given == 0.9


def test_a_vocabulary_other_than_the_embedding_rows_is_refused(variant, default_model_gguf):
    tokens = default_model_gguf.metadata["tokenizer.ggml.tokens"]
    for count in (511, 513):
        extended = [*tokens[:count]] if count < 512 else [*tokens[:512], "extra"]
        keys = {
            "tokenizer.ggml.tokens": (extended, GGUFValueType.ARRAY),
            "tokenizer.ggml.token_type": ([1] * count, GGUFValueType.ARRAY),
        }
        refused(variant(set_keys=keys), rf"tokenizer\.ggml\.tokens has {count} tokens but token_embd\.weight has 512")


def test_a_sliding_window_is_honoured_on_every_layer_of_a_llama_file(variant):
    """Mistral-style files: transformers applies the window to every layer, and so does minfer (never ignored)."""
    config = ModelConfig.from_gguf(variant(set_keys={"llama.attention.sliding_window": (4096, U32)}))
    assert (config.sliding_window, config.windowed_layers) == (4096, (True, True))
    assert [config.layer_window(layer) for layer in range(2)] == [4096, 4096]


def test_gemma3_windows_five_layers_of_six_with_their_own_rope(variant):
    config = ModelConfig.from_gguf(variant("tiny-gemma3"))
    assert config.windowed_layers == (True, True, True, True, True, False)
    assert config.rope_local.freq_base == 10000.0 and config.rope.freq_base == 1e6
    pattern = variant("tiny-gemma3", set_keys={"gemma3.attention.sliding_window_pattern": (2, U32)})
    assert ModelConfig.from_gguf(pattern).windowed_layers == (True, False) * 3
    per_layer = [False, True, True, False, True, True]
    listed = variant(
        "tiny-gemma3", set_keys={"gemma3.attention.sliding_window_pattern": (per_layer, GGUFValueType.ARRAY)}
    )
    assert ModelConfig.from_gguf(listed).windowed_layers == tuple(per_layer)


@pytest.mark.parametrize(
    ("preset", "key", "value", "kind", "pattern"),
    [
        ("tiny-gemma3", "gemma3.attention.sliding_window_pattern", [True, False], GGUFValueType.ARRAY,
         r"must hold one bool per layer \(6\)"),
        ("tiny-gemma3", "gemma3.final_logit_softcapping", -1.0, F32, r"must be a positive number"),
        ("tiny-gemma3", "gemma3.rope.freq_base_swa", 0.0, F32, r"'gemma3\.rope\.freq_base_swa' must be positive"),
        ("tiny-llama", "llama.attention.sliding_window", -1, GGUFValueType.INT32, r"must be 0 \(none\) or positive"),
    ],
)  # fmt: skip
def test_broken_window_and_softcap_values_are_refused(variant, preset, key, value, kind, pattern):
    refused(variant(preset, set_keys={key: (value, kind)}), pattern)


def test_gemma_only_keys_stay_refused_on_other_architectures(variant):
    refused(variant(set_keys={"llama.final_logit_softcapping": (30.0, F32)}), "turns on final logit soft-capping")


def test_longrope_needs_both_factor_sets(variant):
    factors = np.linspace(1.0, 2.0, 6, dtype=np.float32)  # tiny-phi3 rotates 12 dimensions: 6 pairs
    keys = {"phi3.rope.scaling.original_context_length": (256, U32)}
    refused(variant("tiny-phi3", set_keys=keys, add_tensors={LONG_FACTORS_TENSOR: factors}), "LongRoPE needs both")
    both = {LONG_FACTORS_TENSOR: factors * 4, SHORT_FACTORS_TENSOR: factors}
    rope = ModelConfig.from_gguf(variant("tiny-phi3", set_keys=keys, add_tensors=both)).rope
    assert rope.for_context(256).freq_factors == tuple(float(f) for f in factors)
    assert rope.for_context(257).freq_factors == tuple(float(f) for f in factors * 4)
