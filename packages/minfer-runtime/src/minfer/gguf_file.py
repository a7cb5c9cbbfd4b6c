"""Open a GGUF file, validate every byte of its layout, and expose its metadata and tensor views.

A GGUF file is, in order (all little-endian):

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata:  key (u64 length + UTF-8) | value type u32 | value (arrays: element type u32, count u64, items)
    tensors:   name (u64 length + UTF-8) | n_dims u32 | dims u64 x n_dims | type u32 | data offset u64
    padding to `general.alignment` (32 by default), then the data section: each tensor's bytes, each
    padded to the alignment

The parser here reads that layout itself instead of through the `gguf` package's reader, because a model
file is untrusted input: every count and length is checked against the bytes left in the file *before*
anything is read or allocated (a 175 KB file claiming a 2^32-entry array is refused at once, not walked),
and every refusal names the file and the key or tensor being read. The data regions must tile the data
section exactly, so every byte of the file belongs to the header, a tensor, or alignment padding.

The file is memory-mapped: tensor data are numpy views into the map, so opening a 100 MB model costs
almost nothing until a backend reads its weights.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from minfer.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # version 1 had 32-bit counts and is long gone
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml tensors have at most four axes
MAX_ELEMENTS = 1 << 62  # a tensor's element count must fit ggml's int64 arithmetic with room to spare

# Tensor types this engine can dequantize on the CPU (through gguf.quants): the floats, the legacy and K-quant
# blocks, and the non-linear 4-bit ones.
SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for family in (
        ("F32", "F16", "BF16"),
        ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"),
        ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"),
        ("IQ4_NL", "IQ4_XS"),
    )
    for name in family
)

# Fixed-size value types: struct format and size in bytes.
_SCALARS: dict[GGUFValueType, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
INTEGER_TYPES = frozenset(t for t in _SCALARS if t.name.startswith(("INT", "UINT")))
FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
_MISSING: Any = object()


def printable(text: str, limit: int = 80) -> str:
    """`text` safe to print on a terminal: control characters (escape sequences included) escaped, long
    text cut. Names and strings from a model file pass through this before they reach a message."""
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def align_up(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class ValueType:
    """The stored type of a metadata value: a scalar type, or an array and its element type."""

    type: GGUFValueType
    element: GGUFValueType | None = None  # arrays only

    def __str__(self) -> str:
        return f"array of {self.element.name}" if self.element is not None else self.type.name


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    `shape` is in GGUF order: `shape[0]` is the contiguous (innermost) axis. A weight with GGUF shape
    [in, out] is therefore `out` rows of `in` values, and `data` holds its bytes exactly as stored
    (quantized blocks stay quantized): a uint8 array whose numpy shape is the GGUF shape reversed, the
    last axis counted in bytes (the layout gguf.quants.dequantize takes).
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
        return self.data.reshape(-1)


class _Record(NamedTuple):
    """A tensor record of the header: where its bytes are in the data section, and how many."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    offset: int
    nbytes: int


class _Cursor:
    """Reads the header front to back; every read is checked against the end of the file first."""

    def __init__(self, path: Path, buffer: memoryview) -> None:
        self.path = path
        self.buffer = buffer
        self.size = len(buffer)
        self.offset = 0
        self.context = "the header"  # what is being read, for error messages

    def fail(self, reason: str) -> NoReturn:
        raise ModelFileError(f"{self.path}: {self.context}: {reason}")

    def need(self, n_bytes: int, what: str) -> None:
        left = self.size - self.offset
        if n_bytes > left:
            self.fail(f"{what} needs {n_bytes} bytes at byte {self.offset}, but only {left} remain (truncated file?)")

    def scalar(self, value_type: GGUFValueType, what: str) -> Any:
        fmt, size = _SCALARS[value_type]
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT64, what)

    def string(self, what: str) -> str:
        length = self.u64(f"the length of {what}")
        self.need(length, f"{what} of {length} bytes")
        raw = bytes(self.buffer[self.offset : self.offset + length])
        self.offset += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8")

    def value_type(self, what: str) -> GGUFValueType:
        code = self.u32(what)
        try:
            return GGUFValueType(code)
        except ValueError:
            self.fail(f"unknown value type id {code}")

    def value(self) -> tuple[Any, ValueType]:
        value_type = self.value_type("the value type")
        if value_type is GGUFValueType.STRING:
            return self.string("the string value"), ValueType(value_type)
        if value_type is GGUFValueType.FLOAT32:
            # As the shortest decimal that reads back as the stored float32 (4.7, not 4.699999809265137).
            return float(str(np.float32(self.scalar(value_type, "a FLOAT32 value")))), ValueType(value_type)
        if value_type is not GGUFValueType.ARRAY:
            return self.scalar(value_type, f"a {value_type.name} value"), ValueType(value_type)
        element = self.value_type("the array's element type")
        count = self.u64("the array's length")
        if element is GGUFValueType.ARRAY:
            self.fail("arrays of arrays are not part of any model format minfer reads")
        if element is GGUFValueType.STRING:
            # Each string takes at least its 8-byte length: a count the file cannot hold is refused before
            # the walk, so a header claiming 2^32 strings costs nothing.
            self.need(8 * count, f"an array of {count} strings")
            return [self.string(f"string {i} of the array") for i in range(count)], ValueType(value_type, element)
        fmt, size = _SCALARS[element]
        self.need(size * count, f"an array of {count} {element.name} values")
        items = np.frombuffer(self.buffer, dtype=np.dtype(fmt), count=count, offset=self.offset)
        self.offset += size * count
        return items.tolist(), ValueType(value_type, element)


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
                self.file_size = os.fstat(f.fileno()).st_size
                magic = f.read(4)
                if magic != GGUF_MAGIC:
                    raise ModelFileError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise ModelFileError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, ValueType] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse(_Cursor(self.path, memoryview(self._map)))

    # -- parsing ----------------------------------------------------------------------------------

    def _parse(self, cursor: _Cursor) -> None:
        cursor.offset = 4
        self.version = cursor.u32("the version")
        if self.version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            if swapped in SUPPORTED_VERSIONS:
                cursor.fail(f"a big-endian GGUF (version {swapped}); minfer reads little-endian files only")
            cursor.fail(f"GGUF version {self.version} is not supported (supported: {SUPPORTED_VERSIONS})")
        n_tensors = cursor.u64("the tensor count")
        n_keys = cursor.u64("the metadata count")
        # Each metadata entry and tensor record takes at least 8 + 4 (+ 8) bytes: refuse counts the file
        # cannot hold before looping over them.
        cursor.need(12 * n_keys + 24 * n_tensors, f"{n_keys} metadata entries and {n_tensors} tensor records")
        for index in range(n_keys):
            cursor.context = f"metadata entry {index} of {n_keys}"
            key = cursor.string("the key")
            cursor.context = f"metadata key '{printable(key)}'"
            if key in self.metadata:
                cursor.fail("appears twice")
            self.metadata[key], self.value_types[key] = cursor.value()
        self.alignment = self._alignment()
        records: dict[str, _Record] = {}
        for index in range(n_tensors):
            record = self._tensor_record(cursor, index, n_tensors)
            if record.name in records:
                cursor.fail("appears twice")
            records[record.name] = record
        cursor.context = "the tensor data"
        self.data_offset = align_up(cursor.offset, self.alignment)
        self._check_tiling(cursor, list(records.values()))
        for name, shape, qtype, offset, nbytes in records.values():
            start = self.data_offset + offset
            byte_shape = (*reversed(shape[1:]), shape[0] // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1])
            data = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=start).reshape(byte_shape)
            self.tensors[name] = TensorInfo(name, shape, qtype, data, start, nbytes)

    def _alignment(self) -> int:
        key = "general.alignment"
        if key not in self.metadata:
            return DEFAULT_ALIGNMENT
        alignment = self.metadata[key]
        if self.value_types[key].type is not GGUFValueType.UINT32 or alignment <= 0 or alignment & (alignment - 1):
            raise ModelFileError(f"{self.path}: metadata key '{key}' must be a power of two (UINT32), got {alignment}")
        return alignment

    def _tensor_record(self, cursor: _Cursor, index: int, n_tensors: int) -> _Record:
        cursor.context = f"tensor record {index} of {n_tensors}"
        name = cursor.string("the tensor name")
        cursor.context = f"tensor '{printable(name)}'"
        n_dims = cursor.u32("the axis count")
        if not 1 <= n_dims <= MAX_DIMS:
            cursor.fail(f"has {n_dims} axes (1 to {MAX_DIMS} allowed)")
        shape = tuple(cursor.u64(f"axis {axis}") for axis in range(n_dims))
        n_elements = 1
        for dim in shape:
            if dim <= 0 or n_elements * dim > MAX_ELEMENTS:
                cursor.fail(f"has shape {list(shape)}: every axis must be positive and the product below 2^62")
            n_elements *= dim
        code = cursor.u32("the type id")
        try:
            qtype = GGMLQuantizationType(code)
        except ValueError:
            cursor.fail(f"has unknown type id {code}")
        if qtype not in SUPPORTED_TYPES:
            cursor.fail(
                f"has type {qtype.name}, which minfer does not support "
                f"(supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))})"
            )
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        if shape[0] % block_size:
            cursor.fail(f"has shape {list(shape)}, invalid for {qtype.name} (rows must be a multiple of {block_size})")
        offset = cursor.u64("the data offset")
        if offset % self.alignment:
            cursor.fail(f"data offset {offset} is not a multiple of the alignment {self.alignment}")
        return _Record(name, shape, qtype, offset, n_elements // block_size * type_size)

    def _check_tiling(self, cursor: _Cursor, records: list[_Record]) -> None:
        """Every tensor lies inside the file, starts where the one before it ends (rounded up to the
        alignment), and the file ends with the last one's padding: no tensor overlaps another, no bytes
        belong to nothing."""
        for name, _shape, _qtype, offset, nbytes in records:
            cursor.context = f"tensor '{printable(name)}'"
            end = self.data_offset + offset + nbytes
            if end > self.file_size:
                cursor.fail(f"ends at byte {end} but the file has {self.file_size} bytes (truncated file?)")
        expected = 0
        for name, _shape, _qtype, offset, nbytes in sorted(records, key=lambda record: record.offset):
            cursor.context = f"tensor '{printable(name)}'"
            if offset < expected:
                cursor.fail(f"starts at data offset {offset}, inside the tensor before it (which ends at {expected})")
            if offset > expected:
                cursor.fail(f"starts at data offset {offset}: bytes {expected}..{offset - 1} belong to no tensor")
            expected = align_up(offset + nbytes, self.alignment)
        cursor.context = "the tensor data"
        tail = self.file_size - (self.data_offset + expected)
        if tail > 0:
            cursor.fail(f"the file goes on for {tail} bytes after the last tensor's data, which belong to no tensor")

    # -- metadata ---------------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        return self.get_str("general.architecture")

    @property
    def name(self) -> str:
        name = self.metadata.get("general.name")
        return name if isinstance(name, str) and name else self.path.stem

    def _typed(self, key: str, default: Any, accepted: frozenset[GGUFValueType], kind: str) -> Any:
        if key not in self.metadata:
            if default is _MISSING:
                raise ModelFileError(f"{self.path}: required metadata key '{key}' is missing")
            return default
        stored = self.value_types[key]
        if stored.type not in accepted:
            value = printable(repr(self.metadata[key]), 40)
            raise ModelFileError(f"{self.path}: metadata key '{key}' is {stored} ({value}); expected {kind}")
        return self.metadata[key]

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        """An integer key (any GGUF integer width; never a float, bool or string), or `default` when absent."""
        return self._typed(key, default, INTEGER_TYPES, "an integer")

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        """A FLOAT32/FLOAT64 key, as llama.cpp reads floats (an integer-typed value is refused, as there)."""
        value = self._typed(key, default, FLOAT_TYPES, "a float")
        return value if value is default else float(value)

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        return self._typed(key, default, frozenset({GGUFValueType.STRING}), "a string")

    # -- tensors ----------------------------------------------------------------------------------

    def tensor(self, name: str) -> TensorInfo:
        """A tensor that must be present."""
        if name not in self.tensors:
            raise ModelFileError(f"{self.path}: required tensor '{name}' is missing")
        return self.tensors[name]

    def quant_mix(self) -> dict[str, int]:
        """How many tensors of each type the file holds, most frequent first."""
        counts = Counter(t.qtype.name for t in self.tensors.values())
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def n_parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())
