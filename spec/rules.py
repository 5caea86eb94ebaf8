"""The validation rules of LLMBATCH version 1, in the order readers apply them.

Each rule has a stable error code. A reader checks the rules in ``RULES`` order and reports the
first one that fails, so every implementation names the same code for the same broken file.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from .layout import (
    DEFINED_DTYPES,
    HEADER_SIZE,
    MAGIC,
    RESERVED_OFFSET,
    TOKEN_DTYPES,
    VERSION,
    Header,
    parse_header,
)


class ErrorCode(str, Enum):
    """Stable error codes; their string values appear in messages, JSON and conformance vectors.

    ``RULES`` lists the eight header and size rules in order; ``NONZERO_PADDING`` is the deep
    check's code, and ``UNREADABLE_PATH`` is no rule of the format at all: it reports a path
    that cannot be opened and read as a regular file, before there are any bytes to check.
    """

    UNREADABLE_PATH = "unreadable_path"
    TRUNCATED_HEADER = "truncated_header"
    BAD_MAGIC = "bad_magic"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    INVALID_SHAPE = "invalid_shape"
    NONZERO_RESERVED = "nonzero_reserved"
    SIZE_MISMATCH = "size_mismatch"
    RECORD_COUNT_MISMATCH = "record_count_mismatch"
    NONZERO_PADDING = "nonzero_padding"

    def __str__(self) -> str:
        return self.value


RULES: Final = (
    ErrorCode.TRUNCATED_HEADER,
    ErrorCode.BAD_MAGIC,
    ErrorCode.UNSUPPORTED_VERSION,
    ErrorCode.UNSUPPORTED_DTYPE,
    ErrorCode.INVALID_SHAPE,
    ErrorCode.NONZERO_RESERVED,
    ErrorCode.SIZE_MISMATCH,
    ErrorCode.RECORD_COUNT_MISMATCH,
)
"""Header and size rules, in the order they are checked (``NONZERO_PADDING`` is deep-only)."""


@dataclass(frozen=True)
class Violation:
    """One broken rule: its code, the header field (or region) concerned, and what was wrong."""

    code: ErrorCode
    field: str
    detail: str


def find_violation(prefix: bytes, file_size: int) -> Violation | None:
    """Return the first rule that a file breaks, or ``None`` if rules 1-8 all hold.

    ``prefix`` is the file's first bytes (at least 4096 if the file has them) and ``file_size``
    its full length in bytes. Sizes are compared with Python integers, so a ``num_batches`` whose
    product with the slot size exceeds 64 bits is reported as ``size_mismatch``, never wrapped.
    """
    checked = check_header(prefix, file_size)
    return checked if isinstance(checked, Violation) else None


def check_header(prefix: bytes, file_size: int) -> Header | Violation:
    """Validate with rules 1-8 and return the parsed header, or the first violation.

    The header is parsed once: rules 3 to 8 read its fields.
    """
    if len(prefix) < HEADER_SIZE or file_size < HEADER_SIZE:
        have = min(len(prefix), file_size)
        return Violation(
            ErrorCode.TRUNCATED_HEADER,
            "header",
            f"file is {have} bytes; the header alone needs {HEADER_SIZE}",
        )
    magic = bytes(prefix[: len(MAGIC)])
    if magic != MAGIC:
        return Violation(ErrorCode.BAD_MAGIC, "magic", f"expected {MAGIC!r}, found {magic!r}")
    header = parse_header(prefix)
    if header.version != VERSION:
        return Violation(
            ErrorCode.UNSUPPORTED_VERSION,
            "version",
            f"expected {VERSION}, found {header.version}",
        )
    if header.dtype not in TOKEN_DTYPES:
        return Violation(
            ErrorCode.UNSUPPORTED_DTYPE,
            "dtype",
            f"expected one of {DEFINED_DTYPES}, found {header.dtype}",
        )
    if header.batch_size == 0 or header.seq_len == 0:
        which = "batch_size" if header.batch_size == 0 else "seq_len"
        return Violation(ErrorCode.INVALID_SHAPE, which, f"{which} must be at least 1, found 0")
    reserved = bytes(prefix[RESERVED_OFFSET:HEADER_SIZE])
    if reserved.count(0) != len(reserved):
        first = next(i for i, b in enumerate(reserved) if b)
        return Violation(
            ErrorCode.NONZERO_RESERVED,
            "reserved",
            f"byte {RESERVED_OFFSET + first} is {reserved[first]:#04x}; bytes "
            f"{RESERVED_OFFSET}..{HEADER_SIZE - 1} must be zero",
        )
    if file_size != header.file_size:
        return Violation(
            ErrorCode.SIZE_MISMATCH,
            "num_batches",
            f"file is {file_size} bytes; num_batches={header.num_batches} with "
            f"padded_batch_bytes={header.padded_batch_bytes} requires {header.file_size}",
        )
    needed = header.num_batches * header.batch_size
    if header.total_records < needed:
        return Violation(
            ErrorCode.RECORD_COUNT_MISMATCH,
            "total_records",
            f"total_records={header.total_records} is less than num_batches * batch_size "
            f"= {needed}",
        )
    return header
