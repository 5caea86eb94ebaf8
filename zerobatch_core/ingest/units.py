"""Input units: the pieces of a text corpus that one task reads, fixed by the files alone.

Each parquet row group is one unit, and each JSONL or text file is one; a token file (nanoGPT
shard, ``.npy`` array) is cut into units of records (``TokenFiles``). Units are numbered in
the local reading order (files in the order given, glob matches sorted, row groups in file
order), so a unit's number is its place in the global document order whatever reads it. Ray
conversion (``ray_convert.py``) hands units to tasks; producers (``produce.py``) split them
into shares and resume at a unit after a restart.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import IngestError
from ..tokenization.protocol import import_optional
from .arrays import ArrayFile
from .nanogpt import Align, BinShard
from .records import I64Array
from .source import U32Block
from .text import (
    DEFAULT_BATCH_ROWS,
    Format,
    detect_format,
    is_string_type,
    one_line,
    read_documents,
    row_group_documents,
)


@dataclass(frozen=True)
class Unit:
    """One piece of input read by one task: a parquet row group, or a whole JSONL or text file.

    ``index`` is the unit's place in the global order; ``part`` the row group (``-1``: the
    whole file); ``file`` the index of ``path`` among the inputs.
    """

    index: int
    path: str
    format: Format
    part: int
    file: int

    def row(self) -> dict[str, Any]:
        """The unit as a Ray Data row (plain values)."""
        return {"unit": self.index, "path": self.path, "format": self.format, "part": self.part}


@dataclass(frozen=True)
class InputFile:
    """An input file and its first unit: the manifest's sources come from these."""

    path: str
    first_unit: int


def _parquet_row_groups(path: str, column: str) -> int:
    """Row groups of the parquet file ``path``, after checking its ``column`` holds strings."""
    pa = import_optional("pyarrow", "reading parquet")
    pq = import_optional("pyarrow.parquet", "reading parquet")
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise IngestError(f"{path}: not a readable parquet file: {one_line(e)}") from e
    try:
        schema = pf.schema_arrow
        index = schema.get_field_index(column)
        if index < 0:
            raise IngestError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)})")
        if not is_string_type(pa, schema.field(index).type):
            raise IngestError(
                f"{path}: column {column!r} has type {schema.field(index).type}, "
                f"expected a string column"
            )
        return int(pf.num_row_groups)
    finally:
        pf.close()


def plan_units(
    files: Sequence[str], *, text_field: str = "text", format: Format | None = None
) -> tuple[list[Unit], list[InputFile]]:
    """The units of ``files`` in the global order, and each file's first unit.

    Parquet files are opened (their footer only) to count row groups and check the column.
    """
    units: list[Unit] = []
    inputs: list[InputFile] = []
    for f, path in enumerate(files):
        fmt = format or detect_format(path)
        inputs.append(InputFile(path, len(units)))
        if fmt == "parquet":
            for rg in range(_parquet_row_groups(path, text_field)):
                units.append(Unit(len(units), path, fmt, rg, f))
        else:
            units.append(Unit(len(units), path, fmt, -1, f))
    return units, inputs


def unit_documents(
    path: str,
    format: str,
    part: int,
    text_field: str = "text",
    *,
    per_line: bool = False,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[str]:
    """The documents of one unit, read by the local readers (same order, same errors)."""
    if format == "parquet" and part >= 0:
        pa = import_optional("pyarrow", "reading parquet")
        pq = import_optional("pyarrow.parquet", "reading parquet")
        errors = (pa.ArrowException, OSError, UnicodeDecodeError)
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
        except errors as e:
            raise IngestError(f"{path}: not a readable parquet file: {one_line(e)}") from e
        try:
            yield from row_group_documents(pf, path, part, text_field, batch_rows, errors)
        finally:
            pf.close()
        return
    fmt: Format = "jsonl" if format == "jsonl" else "text"
    yield from read_documents([glob.escape(path)], format=fmt, field=text_field, per_line=per_line)


TokenKind = Literal["nanogpt", "npy"]
TOKEN_KINDS: tuple[TokenKind, ...] = ("nanogpt", "npy")

DEFAULT_UNIT_TOKENS = 2**20
"""Tokens per unit of a token file (nanoGPT shard, ``.npy`` array), about: a unit is
``max(1, DEFAULT_UNIT_TOKENS // seq_len)`` records, so a 100M-token shard is about a hundred
units to share among producers."""


class TokenFiles:
    """Token files (nanoGPT ``.bin`` shards, ``.npy`` arrays) cut into units of ``per_unit``
    records each, the records cut by the file's own reader as ``convert`` cuts them.

    Unit ``part`` of a file is its records ``[part * per_unit, (part + 1) * per_unit)``. The
    record starts of a BOS-aligned shard are kept for the last file read only, so memory is
    one file's starts at most (8 bytes a record).
    """

    def __init__(
        self,
        kind: TokenKind,
        seq_len: int,
        *,
        align: Align = "contiguous",
        bos_token: int | None = None,
        per_unit: int | None = None,
    ) -> None:
        self.kind, self.seq_len, self.align, self.bos_token = kind, seq_len, align, bos_token
        self.per_unit = max(1, DEFAULT_UNIT_TOKENS // seq_len) if per_unit is None else per_unit
        self._starts: tuple[str, I64Array] | None = None

    def records(self, path: str) -> int:
        """Records of the file at ``path``."""
        if self.kind == "npy":
            return ArrayFile(path).count_records(self.seq_len)
        return BinShard(path).count_records(self.seq_len, self.align, self.bos_token)

    def dtype(self, path: str) -> np.dtype[Any]:
        """The dtype of the tokens the file at ``path`` stores (from its header)."""
        return ArrayFile(path).dtype if self.kind == "npy" else BinShard(path).dtype

    def units(self, path: str) -> int:
        """Units of the file at ``path``: ``ceil(records / per_unit)``."""
        return -(-self.records(path) // self.per_unit)

    def blocks(self, path: str, part: int) -> Iterator[U32Block]:
        """The records of unit ``part`` of the file at ``path``, as ``uint32`` blocks."""
        first = part * self.per_unit
        if self.kind == "npy":
            array = ArrayFile(path)
            stop = min(first + self.per_unit, array.count_records(self.seq_len))
            return array.iter_blocks(self.seq_len, records=(first, stop))
        shard = BinShard(path)
        if self.align == "contiguous":
            stop = min(first + self.per_unit, shard.num_tokens // self.seq_len)
            starts = np.arange(first, max(first, stop), dtype=np.int64) * self.seq_len
        else:
            if self._starts is None or self._starts[0] != path:
                self._starts = (path, shard.record_starts(self.seq_len, "bos", self.bos_token))
            starts = self._starts[1][first : first + self.per_unit]
        return shard.iter_blocks(self.seq_len, self.align, self.bos_token, starts=starts)
