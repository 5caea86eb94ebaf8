"""Document readers: parquet, JSONL and plain text files in, one ``str`` per document out.

Every reader streams: parquet is read a row group at a time (never the whole file), JSONL and
per-line text a line at a time, so memory is bounded by the largest row group's text column or
document, whatever the corpus size. The order is deterministic:
paths in the order given, the matches of a glob pattern sorted by name
(``data/*.parquet``; see ``source.expand_paths``), and within a file the order of its rows or
lines. So the same inputs always give the same documents, and hence the same records.

A corrupt input stops the stream with an :class:`~zerobatch_core.errors.IngestError` naming the
file and the position (row group and row, line number, byte offset), rather than silently
skipping data: a corpus that is quietly shorter than expected is worse than one that fails. All
paths are checked before the first document is produced, so a typo fails at once and not hours
into a job. ``pyarrow`` is only needed for parquet and is imported on first use
(``pip install zerobatch[text]``).

:class:`TextSource` chains the readers with tokenization (:mod:`zerobatch_core.tokenization`)
and packing (:mod:`.packing`) into a ``RecordSource`` that ``write_batch_dataset`` consumes
directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, Literal

from ..arguments import int_arg
from ..errors import IngestError
from ..tokenization.parallel import DEFAULT_BATCH_DOCS, tokenize_documents
from ..tokenization.protocol import Tokenizer, import_optional
from ..tokenization.resolve import load_tokenizer
from .packing import Mode, PackingStats, RecordBlocks, make_records
from .source import PathLike, Patterns, check_seq_len, expand_paths

Format = Literal["parquet", "jsonl", "text"]
_FORMATS: tuple[Format, ...] = ("parquet", "jsonl", "text")

PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")

DEFAULT_BATCH_ROWS = 1024
"""Rows converted to Python strings at a time when reading a parquet row group."""

_BOM = "\ufeff"


# --- parquet ----------------------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    """An exception's message on one line (pyarrow's span several, with trailing newlines)."""
    return " ".join(str(e).split())


def is_string_type(pa: Any, t: Any) -> bool:
    types = pa.types
    view = getattr(types, "is_string_view", None)  # pyarrow >= 16
    return bool(types.is_string(t) or types.is_large_string(t) or (view is not None and view(t)))


def read_parquet(
    paths: Patterns, column: str = "text", *, batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[str]:
    """Documents from the string column ``column`` of parquet files, row group by row group.

    Each row group is read on its own (``ParquetFile.iter_batches`` limited to that row group
    and column) and turned into Python strings ``batch_rows`` at a time, so memory is bounded by
    one row group's column, never a file. Page checksums are
    verified where the writer stored them. A file that is not readable parquet (truncated, bad
    footer), a missing or non-string column, a null value, or a row group that fails to decode
    raises ``IngestError`` naming the file and, for data errors, the row group and row.
    """
    rows = int_arg("batch_rows", batch_rows, 1, None, IngestError)
    files = expand_paths(paths, "parquet")
    pa = import_optional("pyarrow", "reading parquet")
    pq = import_optional("pyarrow.parquet", "reading parquet")
    return _parquet_documents(pa, pq, files, column, rows)


def _parquet_documents(
    pa: Any, pq: Any, files: list[str], column: str, batch_rows: int
) -> Iterator[str]:
    errors = (pa.ArrowException, OSError, UnicodeDecodeError)
    for path in files:
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
        except errors as e:
            raise IngestError(f"{path}: not a readable parquet file: {one_line(e)}") from e
        try:
            schema = pf.schema_arrow
            index = schema.get_field_index(column)
            if index < 0:
                raise IngestError(
                    f"{path}: no column {column!r} (columns: {', '.join(schema.names)})"
                )
            if not is_string_type(pa, schema.field(index).type):
                raise IngestError(
                    f"{path}: column {column!r} has type {schema.field(index).type}, "
                    f"expected a string column"
                )
            for rg in range(pf.num_row_groups):
                yield from row_group_documents(pf, path, rg, column, batch_rows, errors)
        finally:
            pf.close()


def row_group_documents(
    pf: Any,
    path: str,
    rg: int,
    column: str,
    batch_rows: int,
    errors: tuple[type[BaseException], ...],
) -> Iterator[str]:
    row = 0
    batches = pf.iter_batches(batch_size=batch_rows, row_groups=[rg], columns=[column])
    while True:
        try:
            batch = next(batches, None)
            if batch is None:
                return
            values = batch.column(0)
            if values.null_count:
                first = next(i for i, v in enumerate(values.is_valid().to_pylist()) if not v)
                raise IngestError(
                    f"{path}: row group {rg}, row {row + first}: column {column!r} is null"
                )
            texts: list[str] = values.to_pylist()
        except errors as e:
            raise IngestError(
                f"{path}: row group {rg} (rows from {row}): cannot read column {column!r}: "
                f"{one_line(e)}"
            ) from e
        yield from texts
        row += len(texts)


# --- JSONL ------------------------------------------------------------------------------------


def _decode_line(raw: bytes, path: str, lineno: int, offset: int) -> str:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise IngestError(
            f"{path}: line {lineno}, byte offset {offset + e.start}: invalid UTF-8 ({e.reason})"
        ) from e
    return line[1:] if lineno == 1 and line.startswith(_BOM) else line


def _check_encodable(text: str, where: str) -> None:
    """Reject lone surrogates (JSON ``\\ud800`` escapes): no tokenizer can encode them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise IngestError(
            f"{where}: character {e.start} is a lone surrogate ({text[e.start]!r}), not text"
        ) from e


def read_jsonl(paths: Patterns, field: str = "text") -> Iterator[str]:
    """Documents from the string field ``field`` of JSONL files: one JSON object per line.

    Blank lines are skipped. Invalid UTF-8, invalid JSON, a line that is not an object, a
    missing field, a value that is not a string (``null`` included) or that holds a lone
    surrogate (an unpaired ``\\ud800`` escape, which no encoder accepts) raises ``IngestError``
    naming the file and the line (and the byte offset or column of the fault).
    """
    return _jsonl_documents(expand_paths(paths, "JSONL"), field)


def _decoded_lines(path: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` for each line of a UTF-8 file, line endings kept, BOM removed.

    Invalid UTF-8 raises ``IngestError`` naming the file, the line and the byte offset.
    """
    with open(path, "rb") as f:
        offset = 0
        for lineno, raw in enumerate(f, start=1):
            yield lineno, _decode_line(raw, path, lineno, offset)
            offset += len(raw)


def _jsonl_documents(files: list[str], field: str) -> Iterator[str]:
    for path in files:
        for lineno, line in _decoded_lines(path):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise IngestError(
                    f"{path}: line {lineno}, column {e.colno}: invalid JSON: {e.msg}"
                ) from e
            if not isinstance(obj, dict):
                raise IngestError(
                    f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}"
                )
            if field not in obj:
                raise IngestError(
                    f"{path}: line {lineno}: no field {field!r} "
                    f"(fields: {', '.join(map(str, obj))})"
                )
            value = obj[field]
            if not isinstance(value, str):
                raise IngestError(
                    f"{path}: line {lineno}: field {field!r} is "
                    f"{'null' if value is None else type(value).__name__}, expected a string"
                )
            if "\\u" in line:  # only a \u escape can make a lone surrogate
                _check_encodable(value, f"{path}: line {lineno}: field {field!r}")
            yield value


# --- plain text -------------------------------------------------------------------------------


def read_text(paths: Patterns, *, per_line: bool = False) -> Iterator[str]:
    """Documents from UTF-8 text files: one per file, or one per non-empty line (``per_line``).

    A whole file is one document, a leading byte-order mark removed. With ``per_line`` the line
    ending (``\\n`` or ``\\r\\n``) is removed and empty lines, which separate nothing, are
    skipped. Invalid UTF-8 raises ``IngestError`` naming the file and the byte offset (and the
    line with ``per_line``).
    """
    files = expand_paths(paths, "text")
    return _line_documents(files) if per_line else _file_documents(files)


def _file_documents(files: list[str]) -> Iterator[str]:
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise IngestError(f"{path}: byte offset {e.start}: invalid UTF-8 ({e.reason})") from e
        yield text[1:] if text.startswith(_BOM) else text


def _line_documents(files: list[str]) -> Iterator[str]:
    for path in files:
        for _, line in _decoded_lines(path):
            if line.endswith("\n"):
                line = line[:-2] if line.endswith("\r\n") else line[:-1]
            if line:
                yield line


# --- any format -------------------------------------------------------------------------------


def detect_format(path: PathLike) -> Format:
    """The reader for a file, from its suffix: parquet, JSONL, else plain text."""
    name = os.fspath(path)
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return "text"


def _check_format(format: object) -> Format | None:
    if format is None:
        return None
    for known in _FORMATS:
        if format == known:
            return known
    raise IngestError(f"format must be 'parquet', 'jsonl', 'text' or None, got {format!r}")


def read_documents(
    paths: Patterns,
    *,
    format: Format | None = None,
    field: str = "text",
    per_line: bool = False,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[str]:
    """Documents from files of any supported format, in order; ``field`` names the column/field.

    With ``format=None`` each file's reader follows its suffix (``.parquet``; ``.jsonl`` or
    ``.ndjson``; anything else is plain text). ``per_line`` applies to plain text files.
    """
    fmt = _check_format(format)
    rows = int_arg("batch_rows", batch_rows, 1, None, IngestError)
    files = expand_paths(paths, "document")
    formats = [fmt or detect_format(p) for p in files]
    return _documents(files, formats, field, per_line, rows)


def _documents(
    files: list[str], formats: list[Format], field: str, per_line: bool, batch_rows: int
) -> Iterator[str]:
    """The documents of already expanded ``files``; pyarrow is imported first if needed."""
    pa = pq = None
    if "parquet" in formats:  # fail now, not after hours of JSONL
        pa = import_optional("pyarrow", "reading parquet")
        pq = import_optional("pyarrow.parquet", "reading parquet")
    return _chain_documents(files, formats, field, per_line, batch_rows, pa, pq)


def _chain_documents(
    files: list[str],
    formats: list[Format],
    field: str,
    per_line: bool,
    batch_rows: int,
    pa: Any,
    pq: Any,
) -> Iterator[str]:
    for path, fmt in zip(files, formats, strict=True):
        if fmt == "parquet":
            yield from _parquet_documents(pa, pq, [path], field, batch_rows)
        elif fmt == "jsonl":
            yield from _jsonl_documents([path], field)
        elif per_line:
            yield from _line_documents([path])
        else:
            yield from _file_documents([path])


# --- the whole pipeline as a record source ----------------------------------------------------


class TextSource:
    """Text files, tokenized and packed: a ``RecordSource`` for ``write_batch_dataset``.

    ``iter_blocks`` reads the documents (:func:`read_documents`), tokenizes them across
    ``workers`` processes in document order
    (:func:`~zerobatch_core.tokenization.tokenize_documents`), and packs or pads them
    (:mod:`.packing`) into ``uint32 [k, seq_len]`` blocks. The record count
    is known only at the end (``num_records`` is ``None``), which the streaming writer accepts::

        src = TextSource("data/*.parquet", "hf:tok.json?bos=<|bos|>", seq_len=2048, workers=8)
        write_batch_dataset(out, src.iter_blocks(), None, batch_size, src.seq_len, seed)
        print(src.stats.to_dict())

    Files and tokenizer are checked here, before any work. The same files, tokenizer and
    options always give the same records, whatever ``workers``.
    """

    def __init__(
        self,
        paths: Patterns,
        tokenizer: str | Tokenizer,
        seq_len: int,
        *,
        format: Format | None = None,
        field: str = "text",
        per_line: bool = False,
        mode: Mode = "pack",
        pad_id: int | None = None,
        workers: int = 1,
        batch_docs: int = DEFAULT_BATCH_DOCS,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        chunk_records: int | None = None,
    ) -> None:
        fmt = _check_format(format)
        self._seq_len = check_seq_len(seq_len)
        self._files = expand_paths(paths, "document")
        self._formats = [fmt or detect_format(p) for p in self._files]
        self.tokenizer: Tokenizer = (
            load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        )
        if mode == "pad" and pad_id is None:
            if self.tokenizer.eos_id is None:
                raise IngestError(
                    f"mode='pad' needs a pad_id: tokenizer {self.tokenizer.name!r} has no EOS "
                    f"to default to"
                )
            pad_id = self.tokenizer.eos_id
        self._options = (field, per_line, int_arg("batch_rows", batch_rows, 1, None, IngestError))
        self._mode, self._pad_id, self._chunk = mode, pad_id, chunk_records
        self._workers = int_arg("workers", workers, 1, None, IngestError)
        self._batch_docs = int_arg("batch_docs", batch_docs, 1, None, IngestError)
        self.stats: PackingStats | None = None
        make_records(
            [],
            self._seq_len,
            bos_id=self.tokenizer.bos_id,
            mode=mode,
            pad_id=pad_id,
            chunk_records=chunk_records,
        )  # check the packing options now

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        return self._seq_len

    @property
    def num_records(self) -> int | None:
        """Always ``None``: the count is known only once the text has been tokenized."""
        return None

    @property
    def files(self) -> list[str]:
        """The input files, in reading order."""
        return list(self._files)

    @property
    def mode(self) -> Mode:
        """``pack`` or ``pad``."""
        return self._mode

    @property
    def pad_id(self) -> int | None:
        """The padding id of ``pad`` mode (the tokenizer's EOS unless one was given); ``None``
        in ``pack`` mode, which never pads."""
        return self._pad_id if self._mode == "pad" else None

    def iter_blocks(self) -> RecordBlocks:
        """Every record, as blocks; ``self.stats`` is this pass's statistics (final at the end)."""
        field, per_line, batch_rows = self._options
        docs = _documents(self._files, self._formats, field, per_line, batch_rows)
        ids = tokenize_documents(docs, self.tokenizer, self._workers, self._batch_docs)
        blocks = make_records(
            ids,
            self._seq_len,
            bos_id=self.tokenizer.bos_id,
            mode=self._mode,
            pad_id=self._pad_id,
            chunk_records=self._chunk,
        )
        self.stats = blocks.stats
        return blocks
