"""LLMBATCH byte layout: the header declared once with ``construct``, and the slot arithmetic.

This module is the reference for every byte of the format (see ``SPEC.md``), and the only place
in ZeroBatch where format numbers are written down: the header size and slot alignment, the
token dtype and its size, the field bounds. Everything else imports them from here (a unit test,
``tests/unit/test_format_literals.py``, fails on a format literal anywhere outside ``spec/``).

The header fields are declared once, as the subcons of a ``construct.Struct``. Their offsets,
the reserved range and the field list that ``Header``, ``parse_header`` and ``build_header``
use are all derived from that declaration, and the core parses and builds headers only through
it, so nothing can drift from what readers and writers do.
"""

from __future__ import annotations

import struct as _struct
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from construct import Bytes, Default, Int32ul, Int64ul, Struct

MAGIC: Final = b"LLMBATCH"
"""Bytes 0..8 of every LLMBATCH file."""

VERSION: Final = 1
"""The only format version this specification defines."""

DTYPE_UINT32: Final = 0
"""Token dtype code 0: little-endian uint32 (every token value valid)."""

DTYPE_UINT16: Final = 1
"""Token dtype code 1: little-endian uint16, for vocabularies of at most 65,536 ids."""

TOKEN_DTYPES: Final[dict[int, np.dtype[np.unsignedinteger]]] = {
    DTYPE_UINT32: np.dtype("<u4"),
    DTYPE_UINT16: np.dtype("<u2"),
}
"""NumPy dtype of a token on disk for each defined dtype code; any other code is invalid."""

DTYPE_NAMES: Final = {DTYPE_UINT32: "uint32", DTYPE_UINT16: "uint16"}
"""The name of each dtype code, as manifests, messages and the ``--dtype`` options spell it."""

TOKEN_DTYPE: Final[np.dtype[np.uint32]] = np.dtype("<u4")
"""NumPy dtype of a token of dtype code 0 (little-endian uint32), the default."""

TOKEN_BYTES: Final = TOKEN_DTYPE.itemsize
"""Bytes per token of dtype code 0: the itemsize of ``TOKEN_DTYPE``."""

U32_MAX: Final = 2**32 - 1
"""Largest value of a ``u32`` field (and of a dtype 0 token; ``token_max`` gives each dtype's)."""

U64_MAX: Final = 2**64 - 1
"""Largest value of a ``u64`` field."""

SLOT_ALIGNMENT: Final = 4096
"""Slots are padded to a multiple of this many bytes, so every slot starts page-aligned."""

HEADER_SIZE: Final = SLOT_ALIGNMENT
"""The header occupies exactly one alignment unit; batch slots start right after it."""

_VALUE_FIELDS: Final = (
    "magic" / Default(Bytes(len(MAGIC)), MAGIC),
    "version" / Default(Int32ul, VERSION),
    "batch_size" / Int32ul,
    "seq_len" / Int32ul,
    "num_batches" / Int64ul,
    "dtype" / Default(Int32ul, DTYPE_UINT32),
    "seed" / Int32ul,
    "total_records" / Int32ul,
)
"""The header's fields before the reserved bytes, in on-disk order: the one declaration of them."""

RESERVED_OFFSET: Final = sum(field.sizeof() for field in _VALUE_FIELDS)
"""First reserved byte: every byte from here to ``HEADER_SIZE`` MUST be zero in version 1."""

RESERVED_SIZE: Final = HEADER_SIZE - RESERVED_OFFSET
"""Length of the reserved range, which fills the header up to ``HEADER_SIZE``."""

HEADER_STRUCT: Final = Struct(
    *_VALUE_FIELDS,
    "reserved" / Default(Bytes(RESERVED_SIZE), bytes(RESERVED_SIZE)),
)
"""The 4096-byte header, little-endian, fields at the offsets given in ``SPEC.md``.

``reserved`` is declared as raw bytes rather than ``Padding`` so that a parse returns them and
validation can insist they are zero (``Padding`` would silently accept anything).
"""


def _field_offsets(struct: Struct) -> dict[str, int]:
    """Each named subcon's byte offset: the sum of the fixed sizes of the subcons before it."""
    offsets: dict[str, int] = {}
    at = 0
    for sub in struct.subcons:
        offsets[sub.name] = at
        at += sub.sizeof()
    return offsets


FIELD_OFFSETS: Final = _field_offsets(HEADER_STRUCT)
"""Byte offset of every header field (``magic`` .. ``reserved``), derived from ``HEADER_STRUCT``."""

HEADER_FIELDS: Final = tuple(name for name in FIELD_OFFSETS if name not in ("magic", "reserved"))
"""The integer header fields in on-disk order: the attributes of ``Header`` and its dict form."""


def _unpacker(struct: Struct) -> _struct.Struct:
    """A ``struct`` format for the integer fields of ``struct`` (magic and reserved skipped as
    pad bytes), derived from the declaration: what ``parse_header`` runs, since readers of a
    dataset with thousands of shards parse a header every time they enter one."""
    codes = {4: "I", 8: "Q"}
    parts = []
    for sub in struct.subcons:
        size = sub.sizeof()
        parts.append(f"{size}x" if sub.name in ("magic", "reserved") else codes[size])
    return _struct.Struct("<" + "".join(parts))


_UNPACK: Final = _unpacker(HEADER_STRUCT)

DEFINED_DTYPES: Final = ", ".join(f"{code} ({name})" for code, name in DTYPE_NAMES.items())
"""The defined dtype codes and their names, as messages list them: ``0 (uint32), 1 (uint16)``."""


def token_dtype(dtype: int = DTYPE_UINT32) -> np.dtype[np.unsignedinteger]:
    """The NumPy dtype of a token of dtype code ``dtype``; ``ValueError`` for an undefined code."""
    exact = isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool)
    if exact and int(dtype) in TOKEN_DTYPES:  # not True or 1.0, which equal 1 too
        return TOKEN_DTYPES[int(dtype)]
    raise ValueError(f"dtype code {dtype!r} is not defined (defined: {DEFINED_DTYPES})")


def token_bytes(dtype: int = DTYPE_UINT32) -> int:
    """Bytes per token of dtype code ``dtype``: 4 for uint32, 2 for uint16."""
    return token_dtype(dtype).itemsize


def token_max(dtype: int = DTYPE_UINT32) -> int:
    """The largest token value dtype code ``dtype`` holds: 2**32 - 1 or 2**16 - 1."""
    return int(np.iinfo(token_dtype(dtype)).max)


def dtype_code(name: str) -> int:
    """The dtype code of a dtype name (``"uint32"`` or ``"uint16"``); ``ValueError`` otherwise."""
    for code, known in DTYPE_NAMES.items():
        if name == known:
            return code
    names = ", ".join(map(repr, DTYPE_NAMES.values()))
    raise ValueError(f"token dtype must be one of {names}, got {name!r}")


def dtype_field(obj: dict[str, Any]) -> int | None:
    """The optional ``"dtype"`` member of a manifest or a live descriptor: its code (0 when
    absent), or ``None`` when it is anything but the JSON integer of a defined code."""
    if "dtype" not in obj:
        return DTYPE_UINT32
    value = obj["dtype"]
    if isinstance(value, bool) or not isinstance(value, int) or value not in DTYPE_NAMES:
        return None
    return value


def raw_batch_bytes(batch_size: int, seq_len: int, dtype: int = DTYPE_UINT32) -> int:
    """Bytes of token data in one batch: ``batch_size * seq_len * token_bytes(dtype)``."""
    return batch_size * seq_len * token_bytes(dtype)


def padded_batch_bytes(batch_size: int, seq_len: int, dtype: int = DTYPE_UINT32) -> int:
    """Size of one batch slot: the raw batch size rounded up to a multiple of 4096."""
    raw = raw_batch_bytes(batch_size, seq_len, dtype)
    return -(-raw // SLOT_ALIGNMENT) * SLOT_ALIGNMENT


def slot_words(batch_size: int, seq_len: int, dtype: int = DTYPE_UINT32) -> int:
    """Tokens that fit in one slot, padding included: ``padded_batch_bytes // token_bytes``."""
    return padded_batch_bytes(batch_size, seq_len, dtype) // token_bytes(dtype)


def expected_file_size(
    batch_size: int, seq_len: int, num_batches: int, dtype: int = DTYPE_UINT32
) -> int:
    """``4096 + num_batches * padded_batch_bytes``, exact (Python integers never overflow)."""
    return HEADER_SIZE + num_batches * padded_batch_bytes(batch_size, seq_len, dtype)


def batch_offset(index: int, batch_size: int, seq_len: int, dtype: int = DTYPE_UINT32) -> int:
    """Byte offset of batch ``index``'s slot."""
    return HEADER_SIZE + index * padded_batch_bytes(batch_size, seq_len, dtype)


@dataclass(frozen=True)
class Header:
    """The decoded fields of an LLMBATCH header (magic and reserved bytes are implied).

    Its attributes are exactly ``HEADER_FIELDS``; they are listed here as well because a type
    checker needs them spelled out, and ``tests/unit/test_layout.py`` checks that the two agree.
    """

    batch_size: int
    seq_len: int
    num_batches: int
    seed: int
    total_records: int
    version: int = VERSION
    dtype: int = DTYPE_UINT32

    @property
    def token_dtype(self) -> np.dtype[np.unsignedinteger]:
        """NumPy dtype of the tokens (``ValueError`` for an undefined dtype code)."""
        return token_dtype(self.dtype)

    @property
    def raw_batch_bytes(self) -> int:
        """Token bytes per batch."""
        return raw_batch_bytes(self.batch_size, self.seq_len, self.dtype)

    @property
    def padded_batch_bytes(self) -> int:
        """Slot size per batch, a multiple of 4096."""
        return padded_batch_bytes(self.batch_size, self.seq_len, self.dtype)

    @property
    def slot_words(self) -> int:
        """Tokens per slot, padding included (the row length of a ``[num_batches, -1]`` view)."""
        return slot_words(self.batch_size, self.seq_len, self.dtype)

    @property
    def file_size(self) -> int:
        """The exact size a file with this header must have."""
        return expected_file_size(self.batch_size, self.seq_len, self.num_batches, self.dtype)

    def as_dict(self) -> dict[str, int]:
        """The header fields as plain integers, in on-disk order (``HEADER_FIELDS``)."""
        return {name: getattr(self, name) for name in HEADER_FIELDS}


def parse_header(data: bytes) -> Header:
    """Decode the first 4096 bytes of ``data``; does not validate (see ``rules.find_violation``).

    Equal to ``HEADER_STRUCT.parse`` on every input (a test checks it), several times faster.
    """
    values = _UNPACK.unpack_from(data[:HEADER_SIZE])
    return Header(**dict(zip(HEADER_FIELDS, values, strict=True)))


def build_header(header: Header, *, magic: bytes = MAGIC, reserved: bytes | None = None) -> bytes:
    """Encode ``header`` as the 4096 header bytes.

    ``magic`` and ``reserved`` exist so conformance vectors can build deliberately broken headers
    through the same declaration; writers never pass them.
    """
    fields = {"magic": magic, **header.as_dict()}
    fields["reserved"] = bytes(RESERVED_SIZE) if reserved is None else reserved
    return bytes(HEADER_STRUCT.build(fields))
