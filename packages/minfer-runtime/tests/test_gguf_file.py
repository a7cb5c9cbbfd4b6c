"""GGUF loading: valid files open, damaged copies are refused with the file and the tensor or key named."""

from __future__ import annotations

import shutil
import struct
import time
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
    assert gguf.get_int("qwen2.block_count") == 2
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
    with pytest.raises(ModelFileError, match=r"damaged\.gguf: tensor '.*': ends at byte \d+ but the file has"):
        GGUFFile(path)


def test_truncated_header_is_refused(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    with open(path, "r+b") as f:
        f.truncate(200)
    with pytest.raises(ModelFileError, match=r"damaged\.gguf: the header: .* needs \d+ bytes .* only \d+ remain"):
        GGUFFile(path)


def test_tensor_past_the_end_names_the_tensor(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    field = tensor_info_field(path, "blk.1.ffn_up.weight")
    patch(path, part_offset(field, 5), struct.pack("<Q", 1 << 40))
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.1\.ffn_up\.weight': ends at byte"):
        GGUFFile(path)


def test_unknown_quant_type_names_the_tensor(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    field = tensor_info_field(path, "blk.0.attn_q.weight")
    patch(path, part_offset(field, 4), struct.pack("<I", 99))
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.0\.attn_q\.weight': has unknown type id 99"):
        GGUFFile(path)


def test_unsupported_quant_type_names_the_tensor(synthetic_model, tmp_path):
    path = damaged_copy(synthetic_model(), tmp_path)
    field = tensor_info_field(path, "blk.0.attn_q.weight")
    patch(path, part_offset(field, 4), struct.pack("<I", int(GGMLQuantizationType.IQ2_XXS)))
    with pytest.raises(
        ModelFileError, match=r"tensor 'blk\.0\.attn_q\.weight': has type IQ2_XXS, which minfer does not"
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


# -- hostile headers, byte by byte ---------------------------------------------------------------------------------


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def key_value(key: str | bytes, value_type: int, payload: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", value_type) + payload


def u32_value(key: str, value: int) -> bytes:
    return key_value(key, 4, struct.pack("<I", value))


def tensor_record(name: str, dims: list[int], type_id: int, offset: int) -> bytes:
    return gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


def raw_gguf(
    path: Path,
    entries: list[bytes],
    tensors: list[bytes] = (),
    data: bytes = b"",
    *,
    version: int = 3,
    counts: tuple[int, int] | None = None,
    alignment: int = 32,
) -> Path:
    """A GGUF written byte by byte: header, the given metadata entries and tensor records, padding, data."""
    n_tensors, n_entries = counts or (len(tensors), len(entries))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_entries) + b"".join(entries) + b"".join(tensors)
    path.write_bytes(head + b"\0" * (-len(head) % alignment) + data)
    return path


ARCH = key_value("general.architecture", 8, gguf_string("llama"))
F32_TENSOR = 0


def refuses(path: Path, pattern: str) -> str:
    with pytest.raises(ModelFileError, match=pattern) as caught:
        GGUFFile(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_an_array_count_the_file_cannot_hold_is_refused_before_it_is_walked(tmp_path):
    """A 175 KB file claiming 2^32 token types used to make the reader walk them one by one, without end."""
    huge = key_value("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 2**32) + b"\1" * 175_000)
    start = time.perf_counter()
    refuses(raw_gguf(tmp_path / "m.gguf", [ARCH, huge]), r"'tokenizer\.ggml\.token_type': an array of 4294967296 INT32")
    strings = key_value("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2**40))
    refuses(
        raw_gguf(tmp_path / "s.gguf", [ARCH, strings]), r"'tokenizer\.ggml\.tokens': an array of 1099511627776 strings"
    )
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    ("entries", "pattern"),
    [
        ([struct.pack("<Q", 2**60) + b"key"], r"metadata entry 0 of 1: the key of 1152921504606846976 bytes needs"),
        ([key_value("general.name", 8, struct.pack("<Q", 10**9) + b"abc")], r"'general\.name': the string value of"),
        ([ARCH, ARCH], r"metadata key 'general\.architecture': appears twice"),
        ([key_value("x.y", 13, b"")], r"metadata key 'x\.y': unknown value type id 13"),
        ([key_value("x.y", 9, struct.pack("<IQ", 9, 1))], r"'x\.y': arrays of arrays are not part of"),
        ([key_value(b"bad\xff", 4, b"\0" * 4)], r"metadata entry 0 of 1: the key is not valid UTF-8"),
        ([key_value("general.name", 8, gguf_string(b"\xc3\x28"))], r"'general\.name': the string value is not valid"),
        ([ARCH, u32_value("general.alignment", 24)], r"'general\.alignment' must be a power of two \(UINT32\), got 24"),
    ],
)
def test_malformed_metadata_is_refused_naming_the_entry(tmp_path, entries, pattern):
    refuses(raw_gguf(tmp_path / "m.gguf", entries), pattern)


def test_counts_the_file_cannot_hold_are_refused_at_once(tmp_path):
    refuses(
        raw_gguf(tmp_path / "m.gguf", [ARCH], counts=(2**40, 1)), r"the header: 1 metadata entries and 1099511627776"
    )


@pytest.mark.parametrize(
    ("version", "pattern"),
    [(0x03000000, r"a big-endian GGUF \(version 3\); minfer reads little-endian files only"),
     (1, r"GGUF version 1 is not supported")],
)  # fmt: skip
def test_big_endian_and_old_versions_are_refused(tmp_path, version, pattern):
    refuses(raw_gguf(tmp_path / "m.gguf", [ARCH], version=version), pattern)


@pytest.mark.parametrize(
    ("records", "data_bytes", "pattern"),
    [
        ([tensor_record("t", [8, 1, 1, 1, 1], F32_TENSOR, 0)], 32, r"tensor 't': has 5 axes \(1 to 4 allowed\)"),
        ([tensor_record("t", [8, 0], F32_TENSOR, 0)], 32, r"tensor 't': has shape \[8, 0\]: every axis must be"),
        ([tensor_record("t", [2**40, 2**40], F32_TENSOR, 0)], 32, r"tensor 't': has shape .* product below 2\^62"),
        ([tensor_record("t", [8], 99, 0)], 32, r"tensor 't': has unknown type id 99"),
        ([tensor_record("t", [8], F32_TENSOR, 4)], 64, r"tensor 't': data offset 4 is not a multiple of the alignment"),
        ([tensor_record("t", [8], F32_TENSOR, 0)] * 2, 64, r"tensor 't': appears twice"),
        ([tensor_record("a", [16], F32_TENSOR, 0), tensor_record("b", [8], F32_TENSOR, 32)], 96,
         r"tensor 'b': starts at data offset 32, inside the tensor before it \(which ends at 64\)"),
        ([tensor_record("a", [8], F32_TENSOR, 0), tensor_record("b", [8], F32_TENSOR, 64)], 96,
         r"tensor 'b': starts at data offset 64: bytes 32\.\.63 belong to no tensor"),
        ([tensor_record("a", [8], F32_TENSOR, 0)], 64, r"the file goes on for 32 bytes after the last tensor's data"),
        ([tensor_record("a", [64], F32_TENSOR, 0)], 32, r"tensor 'a': ends at byte \d+ but the file has \d+ bytes"),
    ],
)  # fmt: skip
def test_tensor_records_must_describe_the_data_section_exactly(tmp_path, records, data_bytes, pattern):
    refuses(raw_gguf(tmp_path / "m.gguf", [ARCH], records, b"\0" * data_bytes), pattern)


def test_a_hand_written_file_that_tiles_its_data_opens(tmp_path):
    records = [tensor_record("a", [8], F32_TENSOR, 0), tensor_record("b", [4, 2], F32_TENSOR, 32)]
    data = np.arange(8, dtype=np.float32).tobytes() + np.arange(8, 16, dtype=np.float32).tobytes()
    gguf = GGUFFile(raw_gguf(tmp_path / "m.gguf", [ARCH, u32_value("general.alignment", 32)], records, data))
    assert gguf.architecture == "llama" and gguf.alignment == 32
    np.testing.assert_array_equal(dequantize(gguf.tensor("b")), np.arange(8, 16, dtype=np.float32).reshape(2, 4))


def test_names_with_terminal_escapes_are_printed_escaped(tmp_path):
    name = "evil\x1b]0;owned\x07"
    message = refuses(raw_gguf(tmp_path / "m.gguf", [ARCH], [tensor_record(name, [8], 99, 0)], b"\0" * 32), "evil")
    assert "\x1b" not in message and "\\x1b" in message
