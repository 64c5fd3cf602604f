"""One parse of a GGUF file's header (metadata and tensor table), for everything that reads it.

gguf-py's ``GGUFReader`` builds a memory-mapped numpy view per element of every metadata array (about
2 s for the 49k-token vocabulary and merges of the embedded SmolLM2), and transformers' config and
tokenizer readers each parse the file again on their own (``AutoConfig`` twice). Here the header is
read once with ``struct`` (the string arrays as Python lists); the tensors stay views of the memory map.

transformers builds the config and tokenizer of a GGUF only from a path it opens itself (for most
architectures through ``GGUFReader``, and ``read_gguf_metadata``). :func:`transformers_reads_parsed`
hands them this parse instead, for this file only, while kvserve calls them, so their mapping of
llama.cpp's keys onto HF's (with its per-architecture exceptions) stays theirs.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from kvserve.loader.source import ModelLoadError

VERSIONS = (2, 3)
"""The GGUF versions read (v1 counted in 32 bits; no file in use still has it)."""
DEFAULT_ALIGNMENT = 32
"""llama.cpp's alignment of the tensor data where ``general.alignment`` does not say."""
SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
"""The fixed-size value types (little-endian, as llama.cpp writes every file)."""
VALUE_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
"""Tensor types held as values (typed arrays); every other type's data is its blocks' bytes (uint8)."""


@dataclass(frozen=True)
class GGUFField:
    """One metadata key: its type (an array's element type in ``element_type``) and value (a Python
    scalar or str; an array as a list, a numeric one as a numpy array)."""

    value_type: GGUFValueType
    value: Any
    element_type: GGUFValueType | None = None


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as gguf-py's ``ReaderTensor`` describes it: ``shape`` in ggml's order (fastest-moving
    first), ``data`` a read-only view of the memory map shaped as numpy's (rows last-but-one): typed for
    value types, the blocks' bytes (uint8, ``[..., bytes per row]``) for block types."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile:
    """A GGUF file's metadata and tensor table, parsed once; the tensor data memory-mapped, read only
    when a tensor's ``data`` is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.blob = np.memmap(path, mode="r", dtype=np.uint8)
            self._view = memoryview(self.blob)  # slicing a memoryview, unlike a memmap, makes no numpy object
            self._parse()
        except (ValueError, struct.error, UnicodeDecodeError) as error:  # empty, truncated or not text
            raise ModelLoadError(f"{path}: not a readable GGUF file ({error})") from error

    def _parse(self) -> None:
        blob = self.blob
        if bytes(blob[:4]) != b"GGUF":
            raise ModelLoadError(f"{self.path}: not a GGUF file (no GGUF magic bytes)")
        version, tensor_count, field_count = struct.unpack_from("<IQQ", blob, 4)
        if version not in VERSIONS:
            raise ModelLoadError(
                f"{self.path}: GGUF version {version} is not read (versions {VERSIONS}, little-endian)"
            )
        pos = 24
        self.fields: dict[str, GGUFField] = {}
        for _ in range(field_count):
            key, pos = self._string(pos)
            (value_type,) = struct.unpack_from("<I", blob, pos)
            self.fields[key], pos = self._field(pos + 4, GGUFValueType(value_type))
        table = []
        for _ in range(tensor_count):
            name, pos = self._string(pos)
            (dims,) = struct.unpack_from("<I", blob, pos)
            shape = struct.unpack_from(f"<{dims}Q", blob, pos + 4)
            tensor_type, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * dims)
            pos += 4 + 8 * dims + 12
            table.append((name, GGMLQuantizationType(tensor_type), shape, offset))
        alignment = self.value("general.alignment") or DEFAULT_ALIGNMENT
        data_start = -(-pos // alignment) * alignment
        self.tensors = [self._tensor(data_start, *entry) for entry in table]

    def value(self, key: str) -> Any:
        """A metadata value (``None`` when the key is absent)."""
        field = self.fields.get(key)
        return None if field is None else field.value

    def _string(self, pos: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", self.blob, pos)
        pos += 8
        return str(self._view[pos : pos + length], "utf-8"), pos + length

    def _field(self, pos: int, value_type: GGUFValueType) -> tuple[GGUFField, int]:
        if value_type == GGUFValueType.STRING:
            value, pos = self._string(pos)
            return GGUFField(value_type, value), pos
        if value_type != GGUFValueType.ARRAY:
            fmt = SCALAR_FORMATS[value_type]
            return GGUFField(value_type, struct.unpack_from(fmt, self.blob, pos)[0]), pos + struct.calcsize(fmt)
        element_type, count = struct.unpack_from("<IQ", self.blob, pos)
        element_type, pos = GGUFValueType(element_type), pos + 12
        if element_type == GGUFValueType.STRING:
            values = []
            for _ in range(count):
                value, pos = self._string(pos)
                values.append(value)
            return GGUFField(value_type, values, element_type), pos
        if element_type not in SCALAR_FORMATS:
            raise ModelLoadError(f"{self.path}: a metadata array of {element_type.name} is not read")
        dtype = np.dtype(SCALAR_FORMATS[element_type])
        values = np.frombuffer(self.blob, dtype, count, pos)
        return GGUFField(value_type, values, element_type), pos + count * dtype.itemsize

    def _tensor(
        self, data_start: int, name: str, tensor_type: GGMLQuantizationType, shape: tuple[int, ...], offset: int
    ) -> GGUFTensor:
        rows = tuple(reversed(shape))
        start = data_start + offset
        dtype = VALUE_DTYPES.get(tensor_type)
        if dtype is None:
            rows = gguf.quants.quant_shape_to_byte_shape(rows, tensor_type)
            dtype = np.uint8
        count = int(np.prod(rows))
        data = np.frombuffer(self.blob, dtype, count, start).reshape(rows)
        return GGUFTensor(name, tensor_type, shape, data)

    # -- transformers' readers, answered from this parse ------------------------------------------
    def metadata_dict(self, string_arrays: Container[str] = ()) -> dict[str, Any]:
        """The metadata as transformers' ``read_gguf_metadata`` gives it: arrays as lists, a string
        array as its length unless its key is in ``string_arrays``."""
        metadata = {}
        for key, field in self.fields.items():
            value = field.value
            if field.element_type == GGUFValueType.STRING and key not in string_arrays:
                value = len(value)
            elif isinstance(value, np.ndarray):
                value = value.tolist()
            metadata[key] = value
        return metadata

    def reader_view(self) -> _ReaderView:
        """The file as the ``GGUFReader`` transformers' config mapping reads (``fields``, ``tensors``)."""
        return _ReaderView(self)


CONFIG_VOCABULARY = "tokenizer.ggml.tokens"
"""The one tokenizer array transformers' config mapping reads (its length: the vocabulary size where the
architecture's keys give none); it parses every element of every array it is handed, and would drop the
merges, token types and scores after parsing them."""


class _ReaderView:
    """What transformers' ``load_gguf_checkpoint`` reads of a ``GGUFReader``: ``fields`` (gguf's
    ``ReaderField``: value parts, the indices of the data parts, the types; every key but the tokenizer's
    arrays other than :data:`CONFIG_VOCABULARY`) and ``tensors`` (names)."""

    def __init__(self, file: GGUFFile) -> None:
        self.tensors = file.tensors
        self.fields = {
            key: _reader_field(key, field)
            for key, field in file.fields.items()
            if not (key.startswith("tokenizer.") and field.element_type is not None and key != CONFIG_VOCABULARY)
        }


def _reader_field(key: str, field: GGUFField) -> gguf.ReaderField:
    if field.element_type is None:
        types, values = [field.value_type], [field.value]
    else:
        types, values = [field.value_type, field.element_type], field.value
    # transformers reads a part as gguf-py's (a string's bytes, a number's one-element array) through
    # ``list(part)`` and ``part[0]``: bytes and one-tuples answer both, at a fraction of the cost.
    if types[-1] == GGUFValueType.STRING:
        parts = [value.encode() for value in values]
    else:
        parts = [(value,) for value in (values.tolist() if isinstance(values, np.ndarray) else values)]
    return gguf.ReaderField(0, key, parts, list(range(len(parts))), types)


_TRANSFORMERS_READS = threading.Lock()


@contextmanager
def transformers_reads_parsed(file: GGUFFile) -> Iterator[None]:
    """While inside, transformers' GGUF readers (gguf-py's ``GGUFReader`` in its config mapping, its own
    ``read_gguf_metadata`` for the config's architecture and the tokenizer) answer from ``file`` for
    ``file.path``; any other path is read as before. Process-wide for its duration, so held under a lock."""
    from transformers.integrations import gguf as integration
    from transformers.integrations.gguf import reader as integration_reader

    resolved = file.path.resolve()
    real_reader, real_metadata = gguf.GGUFReader, integration_reader.read_gguf_metadata

    def reader(path, *args, **kwargs):
        if Path(path).resolve() != resolved:
            return real_reader(path, *args, **kwargs)
        return file.reader_view()

    def metadata(path, string_arrays=()):
        if Path(path).resolve() != resolved:
            return real_metadata(path, string_arrays)
        return file.metadata_dict(string_arrays), tuple(tensor.name for tensor in file.tensors)

    with _TRANSFORMERS_READS:
        gguf.GGUFReader = reader
        integration.read_gguf_metadata = integration_reader.read_gguf_metadata = metadata
        try:
            yield
        finally:
            gguf.GGUFReader = real_reader
            integration.read_gguf_metadata = integration_reader.read_gguf_metadata = real_metadata
