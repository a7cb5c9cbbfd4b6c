"""The synthetic-model writer: its own quantizers (the types gguf.quants only decodes), the Q4_K_M mix, and
models that load and run."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

import minfer
from minfer.gguf_file import GGUFFile
from minfer.models.config import ModelConfig
from minfer.testing import synthetic
from minfer.testing.quantize import quantize
from minfer.testing.synthetic import PRESETS, WEIGHT_TYPES, q4_k_m_type, scaled, uses_more_bits, write_synthetic_model

# Relative error bounds of a round trip through the quantizer and gguf's dequantizer (‖Δ‖ / ‖x‖), about one
# code step over the values' spread: a 2-bit code with an offset per 16 values lands near 1/3 of a sub-block's
# range, 3 bits near 1/7, a 4-bit code (or 16 non-linear levels) near 1/15, 5 bits 1/31, 6 bits 1/63.
QUANTIZER_BOUNDS = {
    GGMLQuantizationType.Q2_K: 0.4,
    GGMLQuantizationType.Q3_K: 0.2,
    GGMLQuantizationType.Q4_K: 0.1,
    GGMLQuantizationType.Q5_K: 0.05,
    GGMLQuantizationType.Q6_K: 0.03,
    GGMLQuantizationType.IQ4_NL: 0.1,
    GGMLQuantizationType.IQ4_XS: 0.1,
}


@pytest.mark.parametrize("qtype", sorted(QUANTIZER_BOUNDS, key=lambda t: t.name))
def test_quantizers_round_trip_through_ggufs_dequantizer(qtype):
    rng = np.random.default_rng(4)
    values = np.concatenate(
        [
            0.02 * rng.standard_normal((3, 768)),
            np.abs(rng.standard_normal((1, 768))),  # all positive
            -np.abs(rng.standard_normal((1, 768))),  # all negative
            np.zeros((1, 768)),
        ]
    ).astype(np.float32)
    encoded = quantize(values, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    assert encoded.shape == (6, 768 // block_size * type_size) and encoded.dtype == np.uint8
    decoded = gguf_quants.dequantize(encoded, qtype)
    for row, original in zip(decoded, values, strict=True):
        if not original.any():
            assert not row.any()
            continue
        error = np.linalg.norm(row - original) / np.linalg.norm(original)
        assert error < QUANTIZER_BOUNDS[qtype], f"{qtype.name}: relative error {error:.3f}"


def test_k_quants_need_whole_super_blocks():
    with pytest.raises(ValueError, match="Q4_K rows need a multiple of 256 values, got 896"):
        quantize(np.ones((2, 896), dtype=np.float32), GGMLQuantizationType.Q4_K)


def test_q4_k_m_mix_follows_llama_quantize():
    assert [layer for layer in range(24) if uses_more_bits(layer, 24)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    q4_k, q5_0, q6_k, q8_0 = (GGMLQuantizationType[t] for t in ("Q4_K", "Q5_0", "Q6_K", "Q8_0"))
    assert q4_k_m_type("blk.3.ffn_down.weight", 4864, 24, True) is q4_k
    assert q4_k_m_type("blk.2.ffn_down.weight", 4864, 24, True) is q6_k
    assert q4_k_m_type("blk.2.attn_v.weight", 896, 24, True) is q8_0  # Q6_K falls back: 896 is not 256-aligned
    assert q4_k_m_type("blk.3.ffn_up.weight", 896, 24, True) is q5_0  # Q4_K falls back likewise
    assert q4_k_m_type("token_embd.weight", 1024, 24, True) is q6_k  # tied: the output head's type
    assert q4_k_m_type("token_embd.weight", 1024, 24, False) is q4_k


def test_a_q4_k_m_model_loads_and_generates(synthetic_model):
    spec = scaled("tiny-llama", d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, n_layers=3)
    path = synthetic_model(spec, "Q4_K_M")
    mix = GGUFFile(path).quant_mix()
    assert {"Q4_K", "Q6_K", "F32"} <= set(mix)
    engine = minfer.load(path, backend="cpu")
    text = "".join(engine.generate("Hello", max_tokens=8, temperature=0))
    assert engine.last_stats.generated_tokens > 0 and isinstance(text, str)


@pytest.mark.parametrize("weight_type", sorted(WEIGHT_TYPES))
def test_a_model_of_each_type_loads_and_matches_its_float32_weights_on_cpu(synthetic_model, weight_type):
    """Every type the writer makes, the CPU reads and runs: it holds exactly gguf.quants' dequantization of
    each tensor (the reference), so a type's only effect on the logits is its rounding."""
    spec = scaled("tiny-llama", d_model=256, d_ff=512, n_layers=2)
    path = synthetic_model(spec, weight_type)
    gguf = GGUFFile(path)
    expected = WEIGHT_TYPES[weight_type]
    assert expected.name in gguf.quant_mix(), f"no tensor is {expected.name}: {gguf.quant_mix()}"
    engine = minfer.load(path, backend="cpu", ctx_size=64)
    logits = engine.forward([1, 5, 9], 0).read("logits")
    assert np.isfinite(logits).all()
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight"):
        tensor = gguf.tensor(name)
        np.testing.assert_array_equal(engine.backend.weights[name], gguf_quants.dequantize(tensor.data, tensor.qtype))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_presets_config_is_what_the_engine_reads_from_its_file(preset, tmp_path):
    """SyntheticSpec.config() (the graph tests' config) and ModelConfig.from_gguf agree, field by field."""
    spec = scaled(preset, n_layers=min(PRESETS[preset].n_layers, 6), vocab_size=512, d_ff=64)
    path = write_synthetic_model(tmp_path / "model.gguf", spec, weight_type="F16")
    assert ModelConfig.from_gguf(GGUFFile(path)) == spec.config()


def test_the_command_writes_a_whole_model_and_nothing_beside_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "tiny.gguf"
    monkeypatch.setattr(sys, "argv", ["synthetic", str(out), "--preset", "tiny-llama", "--weight-type", "Q8_0"])
    synthetic.main()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny.gguf"]
    assert GGUFFile(out).tensors["token_embd.weight"].qtype == GGMLQuantizationType.Q8_0
    assert str(out) in capsys.readouterr().out


@pytest.mark.parametrize("tied", [True, False])
def test_the_output_tensor_type_is_the_heads_as_llama_quantize_writes_it(tmp_path, monkeypatch, tied):
    """--output-tensor-type (llama-quantize's: its Q4_0 models have a Q6_K head) types the output head alone: the
    tied token embedding where the model multiplies by it, else output.weight; Q8_0 where rows are not whole
    super-blocks, as llama-quantize's fallback."""
    q4_0, q6_k, q8_0 = (GGMLQuantizationType[t] for t in ("Q4_0", "Q6_K", "Q8_0"))
    head = "token_embd.weight" if tied else "output.weight"
    for d_model, expected in ((256, q6_k), (64, q8_0)):
        spec = scaled("tiny-llama", d_model=d_model, d_ff=128, n_layers=1, tied_output=tied)
        types = {name: t.qtype for name, t in GGUFFile(
            write_synthetic_model(tmp_path / f"{d_model}.gguf", spec, weight_type="Q4_0", output_type="Q6_K")
        ).tensors.items() if len(t.shape) == 2}  # fmt: skip
        assert types.pop(head) == expected
        assert set(types.values()) == {q4_0}, types
    out = tmp_path / "command.gguf"
    argv = ["synthetic", str(out), "--preset", "tiny-llama", "--weight-type", "Q4_0", "--output-tensor-type", "Q8_0"]
    monkeypatch.setattr(sys, "argv", argv)
    synthetic.main()
    assert GGUFFile(out).tensors["output.weight"].qtype == q8_0
    assert GGUFFile(out).tensors["token_embd.weight"].qtype == q4_0
    with pytest.raises(ValueError, match="unknown output tensor type 'Q7_K'"):
        write_synthetic_model(tmp_path / "bad.gguf", "tiny-llama", weight_type="Q4_0", output_type="Q7_K")


def test_an_interrupted_command_leaves_no_model(tmp_path, monkeypatch):
    """The scripts write a model only where its file is missing: a cut-short write must not leave one there."""
    out = tmp_path / "tiny.gguf"

    def interrupted(path, *args, **kwargs):
        path.write_bytes(b"GGUF, then nothing")
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "write_synthetic_model", interrupted)
    monkeypatch.setattr(sys, "argv", ["synthetic", str(out), "--preset", "tiny-llama"])
    with pytest.raises(KeyboardInterrupt):
        synthetic.main()
    assert list(tmp_path.iterdir()) == []
