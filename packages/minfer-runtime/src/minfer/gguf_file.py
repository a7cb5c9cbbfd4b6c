"""Open a GGUF file, validate it, and expose its metadata and tensor views.

The file is memory-mapped through the `gguf` package's reader; tensor data are
numpy views into the map, so opening a 100 MB model costs almost nothing until a
backend reads its weights. Every refusal names the file and the tensor or key.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from minfer.errors import ModelFileError

GGUF_MAGIC = b"GGUF"

# Tensor types this engine can dequantize on the CPU (through gguf.quants).
SUPPORTED_TYPES = frozenset(
    {
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
    }
)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    `shape` is in GGUF order: `shape[0]` is the contiguous (innermost) axis. A
    weight with GGUF shape [in, out] is therefore `out` rows of `in` values, and
    `data` holds its bytes exactly as stored (quantized blocks stay quantized).
    """

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    data: np.ndarray
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def rows(self) -> int:
        """Number of rows: the product of every axis but the innermost."""
        return self.n_elements // self.shape[0]

    @property
    def row_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.qtype]
        return self.shape[0] // block_size * type_size

    def raw_bytes(self) -> np.ndarray:
        """The stored bytes as a flat uint8 view (no copy)."""
        return self.data.reshape(-1).view(np.uint8)


class _ValidatingReader(GGUFReader):
    """The gguf reader, with every tensor's type and bounds checked before any view is built."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.string_arrays: dict[int, list[str]] = {}  # value offset -> decoded strings
        super().__init__(path, mode="r")

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list[int], list]:
        """Arrays of strings (a vocabulary: 50k-150k tokens and merges) are decoded in one pass.

        The stock reader builds two numpy views per string, which takes seconds for a large
        vocabulary; here the array is one opaque part and its strings are kept in `string_arrays`.
        """
        is_string_array = (
            raw_type == GGUFValueType.ARRAY
            and self.byte_order == "I"
            and int(self._get(orig_offs, np.uint32)[0]) == GGUFValueType.STRING
        )
        if not is_string_array:
            return super()._get_field_parts(orig_offs, raw_type)
        count = int(self._get(orig_offs + 4, np.uint64)[0])
        buffer = memoryview(self.data)
        offset, strings = orig_offs + 12, []
        for _ in range(count):
            (length,) = struct.unpack_from("<Q", buffer, offset)
            strings.append(str(buffer[offset + 8 : offset + 8 + length], "utf-8"))
            offset += 8 + length
        if offset > len(self.data):
            raise ValueError(f"string array at byte {orig_offs} runs past the end of the file")
        self.string_arrays[orig_offs] = strings
        header = self._get(orig_offs, np.uint8, 12)
        body = self._get(orig_offs + 12, np.uint8, offset - orig_offs - 12)
        return offset - orig_offs, [header, body], [], [GGUFValueType.ARRAY, GGUFValueType.STRING]

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        file_size = len(self.data)
        for field in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            code = int(raw_dtype[0])
            try:
                qtype = GGMLQuantizationType(code)
            except ValueError:
                raise ModelFileError(f"{self.path}: tensor '{name}' has unknown type id {code}") from None
            if qtype not in SUPPORTED_TYPES:
                raise ModelFileError(
                    f"{self.path}: tensor '{name}' has type {qtype.name}, which minfer does not support "
                    f"(supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))})"
                )
            shape = [int(d) for d in dims]
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            if any(d <= 0 for d in shape) or shape[0] % block_size:
                raise ModelFileError(
                    f"{self.path}: tensor '{name}' has shape {shape}, invalid for {qtype.name} "
                    f"(rows must be a multiple of {block_size} values)"
                )
            n_bytes = int(np.prod(shape)) // block_size * type_size
            start = int(start_offs + int(offset_tensor[0]))
            if start % self.alignment:
                raise ModelFileError(
                    f"{self.path}: tensor '{name}' data offset {start} is not aligned to {self.alignment} bytes"
                )
            if start + n_bytes > file_size:
                raise ModelFileError(
                    f"{self.path}: tensor '{name}' ends at byte {start + n_bytes} but the file has "
                    f"{file_size} bytes (truncated or corrupt file)"
                )
        super()._build_tensors(start_offs, fields)


def _field_value(reader: _ValidatingReader, field: Any) -> Any:
    """Decode one metadata field into plain Python (str, int, float, bool or a list of those)."""
    # A key/value field is: key length (u64), key bytes, value type (u32), then the value.
    value_offset = field.offset + sum(int(part.nbytes) for part in field.parts[:3])
    if value_offset in reader.string_arrays:
        return reader.string_arrays[value_offset]
    value = field.contents()
    if field.types and field.types[0] == GGUFValueType.ARRAY and not isinstance(value, list):
        value = list(value)
    return value


class GGUFFile:
    """A validated, memory-mapped GGUF model file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ModelFileError(f"{self.path}: no such file")
        if not self.path.is_file():
            raise ModelFileError(f"{self.path}: not a file")
        try:
            with open(self.path, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ModelFileError(f"{self.path}: cannot be read ({exc.strerror})") from None
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        try:
            reader = _ValidatingReader(self.path)
        except ModelFileError:
            raise
        except Exception as exc:  # the reader signals every malformed header with a bare exception
            raise ModelFileError(f"{self.path}: corrupt or truncated GGUF header ({exc})") from None
        self.version = int(reader.fields["GGUF.version"].parts[0][0])
        self.alignment = int(reader.alignment)
        self.file_size = len(reader.data)
        self.metadata: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = _field_value(reader, field)
            except Exception as exc:
                raise ModelFileError(f"{self.path}: metadata key '{key}' cannot be decoded ({exc})") from None
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(
                name=t.name,
                shape=tuple(int(d) for d in t.shape),
                qtype=GGMLQuantizationType(t.tensor_type),
                data=t.data,
                offset=int(t.data_offset),
                nbytes=int(t.n_bytes),
            )
            for t in reader.tensors
        }
        self._reader = reader

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name") or self.path.stem)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        """The value of a metadata key that must be present."""
        if key not in self.metadata:
            raise ModelFileError(f"{self.path}: required metadata key '{key}' is missing")
        return self.metadata[key]

    def tensor(self, name: str) -> TensorInfo:
        """A tensor that must be present."""
        if name not in self.tensors:
            raise ModelFileError(f"{self.path}: required tensor '{name}' is missing")
        return self.tensors[name]

    def quant_mix(self) -> dict[str, int]:
        """How many tensors of each type the file holds, most frequent first."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def n_parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())
