"""GGUF loading: valid files open, damaged copies are refused with the file and the tensor or key named."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf import quants as gguf_quants

from minfer.chat_template import ChatTemplate
from minfer.errors import MinferError, ModelFileError
from minfer.gguf_file import GGUFFile
from minfer.models.config import ModelConfig
from minfer.quants import block_format, dequantize
from minfer.tokenizer import Tokenizer


def damaged_copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "damaged.gguf"
    shutil.copyfile(source, target)
    return target


def part_offset(field, part_index: int) -> int:
    """File offset of one part of a reader field (fields store their parts back to back)."""
    return field.offset + sum(int(p.nbytes) for p in field.parts[:part_index])


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def tensor_info_field(path: Path, name: str):
    reader = GGUFReader(path)
    return next(t.field for t in reader.tensors if t.name == name)


def test_synthetic_model_opens_with_metadata_and_tensors(synthetic_model):
    gguf = GGUFFile(synthetic_model("tiny-qwen2", "Q4_0"))
    assert gguf.architecture == "qwen2"
    assert gguf.require("qwen2.block_count") == 2
    embed = gguf.tensor("token_embd.weight")
    assert embed.shape == (64, 512)
    assert embed.qtype is GGMLQuantizationType.Q4_0
    assert embed.rows == 512 and embed.row_bytes == 2 * 18
    assert gguf.quant_mix() == {"Q4_0": 15, "F32": 11}
    config = ModelConfig.from_gguf(gguf)
    assert (config.n_heads, config.n_kv_heads, config.head_dim, config.qkv_bias) == (4, 2, 16, True)


def test_default_model_metadata(default_model_path):
    gguf = GGUFFile(default_model_path)
    config = ModelConfig.from_gguf(gguf)
    assert (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads) == (30, 576, 9, 3)
    assert (config.d_ff, config.vocab_size, config.tied_output) == (1536, 49152, True)
    assert gguf.quant_mix() == {"Q4_1": 210, "F32": 61, "Q8_0": 1}


def test_missing_file_and_directory_are_refused(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        GGUFFile(tmp_path / "absent.gguf")
    with pytest.raises(ModelFileError, match="not a file"):
        GGUFFile(tmp_path)


def test_bad_magic_is_refused(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("this is not a model\n")
    with pytest.raises(ModelFileError, match=r"notes\.gguf: not a GGUF file"):
        GGUFFile(path)


def test_truncated_file_names_the_tensor(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(ModelFileError, match=r"damaged\.gguf: tensor '.*' ends at byte \d+ but the file has"):
        GGUFFile(path)


def test_truncated_header_is_refused(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    with open(path, "r+b") as f:
        f.truncate(200)
    with pytest.raises(ModelFileError, match=r"damaged\.gguf: corrupt or truncated GGUF header"):
        GGUFFile(path)


def test_tensor_past_the_end_names_the_tensor(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    field = tensor_info_field(path, "blk.1.ffn_up.weight")
    patch(path, part_offset(field, 5), struct.pack("<Q", 1 << 40))
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.1\.ffn_up\.weight' ends at byte"):
        GGUFFile(path)


def test_unknown_quant_type_names_the_tensor(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    field = tensor_info_field(path, "blk.0.attn_q.weight")
    patch(path, part_offset(field, 4), struct.pack("<I", 99))
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.0\.attn_q\.weight' has unknown type id 99"):
        GGUFFile(path)


def test_unsupported_quant_type_names_the_tensor(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    field = tensor_info_field(path, "blk.0.attn_q.weight")
    patch(path, part_offset(field, 4), struct.pack("<I", int(GGMLQuantizationType.IQ2_XXS)))
    with pytest.raises(
        ModelFileError, match=r"tensor 'blk\.0\.attn_q\.weight' has type IQ2_XXS, which minfer does not"
    ):
        GGUFFile(path)


def test_unsupported_architecture_is_refused(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model("tiny-qwen2"), tmp_path)
    field = GGUFReader(path).fields["general.architecture"]
    patch(path, part_offset(field, len(field.parts) - 1), b"qwen9")
    with pytest.raises(ModelFileError, match=r"damaged\.gguf: architecture 'qwen9' is not supported"):
        ModelConfig.from_gguf(GGUFFile(path))


def test_missing_required_key_is_named(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b"llama.block_count", b"llama.block_cXunt", 1))
    with pytest.raises(ModelFileError, match=r"required metadata key 'llama\.block_count' is missing"):
        ModelConfig.from_gguf(GGUFFile(path))


def test_metadata_that_contradicts_a_tensor_shape_is_refused(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    field = GGUFReader(path).fields["llama.feed_forward_length"]
    patch(path, part_offset(field, len(field.parts) - 1), struct.pack("<I", 192))
    with pytest.raises(
        ModelFileError, match=r"tensor 'blk\.0\.ffn_gate\.weight' has shape \[64, 160\], expected \[64, 192\]"
    ):
        ModelConfig.from_gguf(GGUFFile(path))


def test_missing_tensor_is_named(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    path.write_bytes(path.read_bytes().replace(b"blk.1.ffn_down.weight", b"blk.1.ffn_dXwn.weight", 1))
    with pytest.raises(ModelFileError, match=r"required tensor 'blk\.1\.ffn_down\.weight' is missing"):
        ModelConfig.from_gguf(GGUFFile(path))


# Tolerance of each type's round trip, relative to the values' max magnitude.
QUANTIZABLE = {
    "F32": 0.0,
    "F16": 1e-3,
    "BF16": 8e-3,
    "Q8_0": 1e-2,
    "Q5_0": 5e-2,
    "Q5_1": 5e-2,
    "Q4_0": 0.1,
    "Q4_1": 0.1,
}
K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]


def random_k_quant_rows(qtype: GGMLQuantizationType, rows: int, n_values: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with sane f16 scales (gguf-py cannot quantize K-quants, only dequantize them)."""
    fmt = block_format(qtype)
    blocks = rng.integers(0, 256, size=(rows * n_values // fmt.block_size, fmt.type_size), dtype=np.uint8)
    scale = np.float16(0.01).tobytes()
    if qtype is GGMLQuantizationType.Q6_K:
        blocks[:, -2:] = np.frombuffer(scale, dtype=np.uint8)  # d sits at the end of the block
    else:
        blocks[:, 0:2] = np.frombuffer(scale, dtype=np.uint8)  # d, then dmin, open the block
        blocks[:, 2:4] = np.frombuffer(scale, dtype=np.uint8)
    return blocks.reshape(rows, n_values // fmt.block_size * fmt.type_size)


def test_every_supported_type_loads_and_dequantizes(tmp_path):
    rng = np.random.default_rng(3)
    rows, n_values = 3, 512
    values = rng.standard_normal((rows, n_values)).astype(np.float32)
    path = tmp_path / "types.gguf"
    writer = GGUFWriter(str(path), "llama")
    raw: dict[str, np.ndarray] = {}
    for name in [*QUANTIZABLE, *K_QUANTS]:
        qtype = GGMLQuantizationType[name]
        if name in K_QUANTS:
            raw[name] = random_k_quant_rows(qtype, rows, n_values, rng)
        elif name == "F32":
            raw[name] = values
        elif name == "F16":
            raw[name] = values.astype(np.float16)
        else:
            raw[name] = gguf_quants.quantize(values, qtype)
        writer.add_tensor(f"t.{name}", raw[name], raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    gguf = GGUFFile(path)
    for name, tolerance in QUANTIZABLE.items():
        tensor = gguf.tensor(f"t.{name}")
        assert tensor.shape == (n_values, rows)
        got = dequantize(tensor)
        assert got.shape == (rows, n_values) and got.dtype == np.float32
        error = np.abs(got - values).max() / np.abs(values).max()
        assert error <= tolerance, f"{name}: round-trip error {error:.2e} > {tolerance}"
    for name in K_QUANTS:
        tensor = gguf.tensor(f"t.{name}")
        got = dequantize(tensor)
        expected = gguf_quants.dequantize(raw[name], GGMLQuantizationType[name])
        assert got.shape == (rows, n_values)
        assert np.isfinite(got).all() and np.abs(got).max() > 0
        np.testing.assert_array_equal(got, expected)


def test_random_damage_is_always_a_clear_error_or_a_valid_load(synthetic_model, tmp_path):
    """Flip bytes in the header and metadata (and sometimes cut the file): never anything but a MinferError."""
    original = synthetic_model().read_bytes()
    rng = np.random.default_rng(2026)
    path = tmp_path / "fuzzed.gguf"
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(150):
        damaged = bytearray(original)
        for position in rng.integers(0, 40_000, size=rng.integers(1, 5)):
            damaged[position] = rng.integers(0, 256)
        if rng.random() < 0.3:
            damaged = damaged[: rng.integers(8, len(damaged))]
        path.write_bytes(damaged)
        try:
            gguf = GGUFFile(path)
            ModelConfig.from_gguf(gguf)
            ChatTemplate.from_gguf(gguf, Tokenizer.from_gguf(gguf))
            outcomes["loaded"] += 1
        except MinferError as exc:
            assert str(path) in str(exc), f"the message does not name the file: {exc}"
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0 and outcomes["loaded"] > 0
