"""Validation of one LLMBATCH file: rules 1-8 at open, plus the opt-in deep check of every
slot's padding (``SPEC.md`` section 6). Datasets are validated in ``datasets/validation.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec import ErrorCode, Header, Violation

from ..errors import FormatError
from .reader import BatchFileReader

DEEP_CHUNK_BYTES = 64 * 2**20
"""Deep validation scans this much mapped data at a time, so it never holds the file in RAM."""


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of validating one file: ``valid``, or the first broken rule."""

    path: str
    valid: bool
    header: Header | None = None
    code: ErrorCode | None = None
    field: str | None = None
    detail: str | None = None
    deep: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form used by ``zerobatch validate --json``."""
        out: dict[str, Any] = {"path": self.path, "valid": self.valid, "deep": self.deep}
        if self.header is not None:
            out["header"] = self.header.as_dict()
            out["padded_batch_bytes"] = self.header.padded_batch_bytes
        if not self.valid:
            out["error"] = {"code": str(self.code), "field": self.field, "detail": self.detail}
        return out


def padding_violation(h: Header, batch: int, words: npt.NDArray[np.uint32]) -> Violation:
    """The ``nonzero_padding`` violation of slot ``batch``, whose padding words are ``words``
    (at least one non-zero): it names the slot's first non-zero byte."""
    word = int(np.flatnonzero(words)[0])
    raw = words[word : word + 1].tobytes()
    byte = next(i for i, v in enumerate(raw) if v)
    offset = h.raw_batch_bytes + words.dtype.itemsize * word + byte
    return Violation(
        ErrorCode.NONZERO_PADDING,
        "padding",
        f"batch {batch}: slot byte {offset} is {raw[byte]:#04x}; slot bytes "
        f"{h.raw_batch_bytes}..{h.padded_batch_bytes - 1} must be zero",
    )


def find_padding_violation(reader: BatchFileReader) -> Violation | None:
    """First non-zero padding byte in any slot, scanning the mapping chunk by chunk.

    The file's size is checked before each chunk (``BatchFileReader.check_size``), so a file
    truncated during a long deep read is reported as ``size_mismatch`` rather than faulting.
    """
    h = reader.header
    pad_bytes = h.padded_batch_bytes - h.raw_batch_bytes
    if pad_bytes == 0 or h.num_batches == 0:
        return None
    step = max(1, DEEP_CHUNK_BYTES // h.padded_batch_bytes)
    for b0 in range(0, h.num_batches, step):
        reader.check_size()
        pad = reader.slot_padding(b0, min(b0 + step, h.num_batches))
        if pad.any():
            row = int(np.flatnonzero(pad.any(axis=1))[0])
            return padding_violation(h, b0 + row, pad[row])
    return None


def validate_file(path: str | os.PathLike[str], deep: bool = False) -> ValidationReport:
    """Check a file against the spec; ``deep`` also reads every slot's padding.

    Returns a report rather than raising for format problems, including a file that shrinks
    during the deep read (``size_mismatch``). A path that cannot be read as a regular file
    (missing, permission denied, a directory) is not a file to validate: it raises ``OSError``
    (``ZeroBatchIOError`` for a path that is not a regular file); the conformance probe answers
    it with the code ``unreadable_path``.
    """
    p = os.fspath(path)
    try:
        reader = BatchFileReader(p)
    except FormatError as e:
        return ValidationReport(p, False, None, e.code, e.field, e.detail, deep)
    with reader:
        if deep:
            try:
                v = find_padding_violation(reader)
            except FormatError as e:
                return ValidationReport(p, False, reader.header, e.code, e.field, e.detail, deep)
            if v is not None:
                return ValidationReport(p, False, reader.header, v.code, v.field, v.detail, deep)
        return ValidationReport(p, True, reader.header, deep=deep)
