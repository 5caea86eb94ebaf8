"""Hugging Face datasets with a token column, read as :class:`~.token_files.TokenFile`.

Inputs (``expand_hf``):

* a ``Dataset.save_to_disk`` directory: ``state.json`` lists its data files
  (``_data_files``, Arrow IPC *stream* files) in row order; ``dataset_info.json`` beside it
  marks the directory (``is_hf_dataset``) but is not needed to read it (each data file's own
  Arrow schema is what is checked). The directory expands to its data files, in
  ``state.json`` order (none for an empty dataset); those paths are what errors, manifests and
  traces name;
* Arrow files (``.arrow``; IPC stream, what ``datasets`` writes, or IPC file format, told apart
  by the ``ARROW1`` magic) and parquet files (``PAR1`` magic), named directly or by glob.

The token column (``input_ids`` unless ``column=`` names another) must be a ``list``,
``large_list`` or ``fixed_size_list`` (of a size above 0) of integers of any width (``int8`` to
``uint64``). Each file is one ``TokenFile``: its stream of tokens is the rows' lists
concatenated in row order, and each row is one document (``document_starts`` are the list
offsets, an empty row sharing its start with the next). A null row or a null token is refused
(``IngestError`` naming the file and the row): a null is a hole in the data, and reading it as
an empty document would silently change the corpus. Values outside ``[0, 2**32 - 1]`` are
refused by ``token_files`` when read, naming the file and the token's position. A column of
strings is text, not tokens, and is refused with a hint to tokenize it (``zerobatch convert``
of parquet/JSONL text with ``--tokenizer``).

Reading. A file is read one *unit* at a time: a record batch (Arrow) or a row group (parquet),
only the token column (``IpcReadOptions(included_fields=...)``, ``columns=[column]``), always
through a plain file (``pyarrow.OSFile``), never a memory map: a mapped file truncated under its
reader kills the process with ``SIGBUS``, while a short read here is an ``IngestError`` naming
the file. pyarrow's IPC reader does not validate what it reads: one byte of a record batch's
metadata set to ``0x80`` gives a child array of length ``-2**63``, and ``ListArray.flatten()``
of it aborts the process (pyarrow 26: ``data.cc:190 Check failed: (off) <= (length)``). So every
unit is checked with ``validate(full=True)`` (lengths, buffer sizes, offsets ascending and
inside the values buffer) before any of its buffers is touched, then for nulls, and, on every
read after the first pass, for the rows and tokens that pass found (a file changed or truncated
since is refused, not read as something else). An Arrow stream must end with its end-of-stream
marker and nothing after it: a stream cut exactly between two record batches is otherwise
indistinguishable from a shorter dataset. pyarrow's own errors (``ArrowInvalid``,
``ArrowIOError``/``OSError``, ``ArrowMemoryError`` for a length no process can allocate,
``UnicodeDecodeError`` for a field name that is not UTF-8) and a ``MemoryError`` while decoding
a unit become one ``IngestError`` naming the file, the unit and its first row.

``num_tokens`` needs one pass over the file (the token count of each unit; stream files have no
index), made on first use; ``document_starts`` one pass too, made on first use and cached (it
also fills the unit index, so the ``documents`` layout reads a file twice in all: once for the
starts, once for the records). ``read_tokens`` keeps a cursor: the open reader and the last
unit decoded, so ascending ranges read each unit once; a range before the cursor reopens a
stream file and reads forward again (IPC file format and parquet files seek to the unit).

Memory is bounded whatever the file size: one unit at a time (the token column of one record
batch, with the batch's message body as pyarrow reads it, or one row group's token column with
its pages; a compressed row group decodes to what its writer put in it), plus 16 bytes per
unit for the index and, once asked, 8 bytes per row for the document starts. The files of one
``expand_hf`` call share one cursor slot: reading a file releases the cursor (descriptor and
unit) of the file read before, so a dataset of thousands of files holds one descriptor and one
unit, not one per file. ``pyarrow`` (the ``text`` extra) is imported only when a file is opened.
"""

from __future__ import annotations

import glob
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..closing import Closing
from ..errors import IngestError, ZeroBatchIOError
from ..tokenization.protocol import import_optional
from .records import I64Array
from .source import PathLike, Patterns
from .text import is_string_type, one_line
from .token_files import DEFAULT_COLUMN

STATE_NAME = "state.json"
"""``save_to_disk``'s table of contents: ``_data_files`` lists the Arrow files in row order."""
INFO_NAME = "dataset_info.json"
"""``save_to_disk``'s description of the dataset (features, splits); marks the directory."""
DICT_NAME = "dataset_dict.json"
"""What ``DatasetDict.save_to_disk`` writes instead: one sub-directory per split."""
ARROW_SUFFIX = ".arrow"
FILE_MAGIC = b"ARROW1"
"""The first (and last) bytes of an Arrow IPC *file* (random access format)."""
PARQUET_MAGIC = b"PAR1"
STREAM_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The end-of-stream marker of an Arrow IPC stream (continuation marker, zero length)."""
LEGACY_STREAM_EOS = b"\x00\x00\x00\x00"
"""The end-of-stream marker of streams written before Arrow 0.15 (zero length alone)."""
STATE_MAX_BYTES = 16 * 2**20
"""A ``state.json`` larger than this is refused unread (one entry is ~50 bytes per file)."""

Container = Literal["stream", "file", "parquet"]
_UNIT_NAMES: dict[Container, str] = {
    "stream": "record batch",
    "file": "record batch",
    "parquet": "row group",
}
_TEXT_HINT = (
    "text, not token ids: tokenize it with a tokenizer (zerobatch convert reads text from "
    "parquet or JSONL with --tokenizer; export it with Dataset.to_parquet), or name the "
    "token column (column=, --column on the command line)"
)


# --- inputs -----------------------------------------------------------------------------------


def is_hf_dataset(path: PathLike) -> bool:
    """Whether ``path`` is a ``save_to_disk`` directory (``state.json`` and
    ``dataset_info.json``) or an ``.arrow`` file: the Hugging Face inputs told by their names."""
    p = os.fspath(path)
    if os.path.isdir(p):
        return all(os.path.isfile(os.path.join(p, n)) for n in (STATE_NAME, INFO_NAME))
    return p.lower().endswith(ARROW_SUFFIX) and os.path.isfile(p)


def dataset_files(directory: PathLike) -> list[str]:
    """The data files of a ``save_to_disk`` directory, in ``state.json`` order.

    ``state.json`` must be a JSON object whose ``_data_files`` is a list of objects with a
    ``filename``: a plain file name (no directory part) of a regular file in the directory,
    each listed once. An empty dataset lists no file, and has none here. A dataset saved with
    an indices mapping (``_indices_data_files``, older ``datasets`` versions) is refused: its
    rows are not in file order. A ``DatasetDict`` directory is refused with the splits to
    choose from.
    """
    d = os.fspath(directory)
    state = os.path.join(d, STATE_NAME)
    if not os.path.isfile(state):
        if os.path.isfile(os.path.join(d, DICT_NAME)):
            splits = sorted(
                n for n in os.listdir(d) if os.path.isfile(os.path.join(d, n, STATE_NAME))
            )
            raise IngestError(
                f"{d}: a DatasetDict directory ({DICT_NAME}); name one split's directory "
                f"(splits: {', '.join(splits) or 'none found'})"
            )
        raise IngestError(f"{d}: not a Hugging Face save_to_disk directory: no {STATE_NAME}")
    doc = _read_state(state)
    if not isinstance(doc, dict):
        raise IngestError(f"{state}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("_indices_data_files"):
        raise IngestError(
            f"{state}: field _indices_data_files: the dataset has an indices mapping (rows not "
            "in file order); save it with a datasets version that flattens indices, or call "
            "flatten_indices() before save_to_disk"
        )
    entries = doc.get("_data_files")
    if not isinstance(entries, list):
        got = "nothing" if entries is None else f"{entries!r}"[:80]
        raise IngestError(f"{state}: field _data_files: expected a list of files, got {got}")
    out: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        name = entry.get("filename") if isinstance(entry, dict) else None
        where = f"{state}: field _data_files[{i}].filename"
        if not isinstance(name, str):
            raise IngestError(f"{where}: expected a file name, got {f'{entry!r}'[:80]}")
        if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise IngestError(f"{where}: {name!r} is not a plain file name in the directory")
        if name in seen:
            raise IngestError(f"{where}: {name!r} is listed twice")
        seen.add(name)
        path = os.path.join(d, name)
        if not os.path.isfile(path):
            what = "is not a regular file" if os.path.lexists(path) else "does not exist"
            raise IngestError(f"{where}: {path} {what}")
        out.append(path)
    return out


def _read_state(state: str) -> Any:
    try:
        with open(state, "rb") as f:
            raw = f.read(STATE_MAX_BYTES + 1)
    except OSError as e:
        raise ZeroBatchIOError(e.errno or 0, f"cannot read: {e.strerror or e}", state) from e
    if len(raw) > STATE_MAX_BYTES:
        raise IngestError(f"{state}: larger than {STATE_MAX_BYTES:,} bytes; not a state.json")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise IngestError(f"{state}: byte offset {e.start}: invalid UTF-8 ({e.reason})") from e
    except json.JSONDecodeError as e:
        raise IngestError(
            f"{state}: line {e.lineno}, column {e.colno}: invalid JSON: {e.msg}"
        ) from e
    except RecursionError as e:
        raise IngestError(f"{state}: invalid JSON: nested too deeply") from e


def expand_hf(patterns: Patterns, column: str = DEFAULT_COLUMN) -> list[HFTokenFile]:
    """Every Hugging Face input that ``patterns`` name, opened, in reading order.

    A pattern is a path or a glob (matches sorted by name); a sequence keeps its order. A
    ``save_to_disk`` directory expands to its data files (``dataset_files``); any other file is
    opened as Arrow or parquet by its first bytes. Every file is opened here, so a missing
    file, a bad ``state.json``, a missing or non-token column fails before any token is read.
    The files share one cursor slot (module docstring). A file listed twice is an error.
    """
    items = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    if not items:
        raise IngestError("no Hugging Face inputs given")
    paths: list[tuple[str, tuple[str, ...]]] = []
    seen: set[str] = set()
    for item in items:
        pattern = os.fspath(item)
        if glob.has_magic(pattern) and not os.path.exists(pattern):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise IngestError(f"{pattern}: no Hugging Face input matches this pattern")
        else:
            matches = [pattern]
        for m in matches:
            if os.path.isdir(m):
                side = tuple(
                    os.path.join(m, n)
                    for n in (STATE_NAME, INFO_NAME)
                    if os.path.isfile(os.path.join(m, n))
                )
                found = [(p, side) for p in dataset_files(m)]
            elif os.path.isfile(m):
                found = [(m, ())]
            else:
                state = "is not a regular file" if os.path.lexists(m) else "does not exist"
                raise IngestError(f"{m}: Hugging Face input {state}")
            for p, side in found:
                key = os.path.realpath(p)
                if key in seen:
                    raise IngestError(f"{p}: listed twice; it would be ingested twice")
                seen.add(key)
                paths.append((p, side))
    slot = CursorSlot()
    files: list[HFTokenFile] = []
    try:
        for p, side in paths:
            files.append(HFTokenFile(p, column, slot=slot, side_files=side))
    except BaseException:
        for f in files:
            f.close()
        raise
    return files


# --- one file ---------------------------------------------------------------------------------


def sniff_container(path: str) -> Container:
    """``parquet``, ``file`` (Arrow IPC file) or ``stream`` (anything else), from the magic."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(FILE_MAGIC))
    except OSError as e:
        raise ZeroBatchIOError(e.errno or 0, f"cannot read: {e.strerror or e}", path) from e
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if head == FILE_MAGIC:
        return "file"
    return "stream"


def token_value_type(pa: Any, t: Any, path: str, column: str) -> Any:
    """The integer value type of a token column of type ``t``, or an ``IngestError``."""
    types = pa.types
    if is_string_type(pa, t):
        raise IngestError(f"{path}: column {column!r} has type {t}: {_TEXT_HINT}")
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        vt = t.value_type
        if is_string_type(pa, vt):
            raise IngestError(f"{path}: column {column!r} has type {t}: {_TEXT_HINT}")
        if types.is_integer(vt):
            if types.is_fixed_size_list(t) and t.list_size == 0:  # rows that cost no bytes
                raise IngestError(
                    f"{path}: column {column!r} has type {t}: lists of size 0 hold no tokens"
                )
            return vt
    raise IngestError(
        f"{path}: column {column!r} has type {t}, expected a list of integers (token ids) per "
        "row: list, large_list or fixed_size_list of int8 to int64 or uint8 to uint64"
    )


@dataclass
class Unit:
    """One record batch or row group of the token column, checked and decoded."""

    rows: int
    offsets: I64Array
    """``rows + 1`` ascending positions of each row's first token in ``tokens``, from 0."""
    tokens: npt.NDArray[np.integer[Any]]


class _Reader:
    """A container opened for its token column: ``unit(i)`` gives unit ``i``'s arrays (``None``
    past the last one). Stream readers only go forward; ``count`` is ``None`` for them."""

    count: int | None = None

    def __init__(self, pa: Any, path: str, column: str) -> None:
        self.pa, self.path, self.column = pa, path, column
        self.schema: Any = None
        self.field = -1
        self.file = pa.OSFile(path, "rb")
        try:
            self._start()
        except BaseException:
            self.file.close()
            raise

    def _start(self) -> None:
        """Read the container's schema (and index), and find the column."""
        raise NotImplementedError

    def unit(self, i: int) -> list[Any] | None:
        raise NotImplementedError

    def can_reach(self, i: int) -> bool:
        """Whether ``unit(i)`` can still be read (a stream cannot go back)."""
        return True

    def close(self) -> None:
        self.file.close()


class _StreamReader(_Reader):
    def _start(self) -> None:
        pa = self.pa
        self.size = self.file.size()
        self.schema = pa.ipc.open_stream(self.file).schema  # reads the schema message only
        self.field = self.schema.get_field_index(self.column)
        self.next = 0
        self.done = False
        if self.field >= 0:
            opts = pa.ipc.IpcReadOptions(use_threads=False, included_fields=[self.field])
            self.file.seek(0)
            self.reader = pa.ipc.open_stream(self.file, options=opts)

    def can_reach(self, i: int) -> bool:
        return i >= self.next

    def unit(self, i: int) -> list[Any] | None:
        if i < self.next:
            raise AssertionError("stream readers only go forward")  # callers reopen first
        batch = None
        while self.next <= i:
            if self.done:
                return None
            before = self.file.tell()
            try:
                batch = self.reader.read_next_batch()
            except StopIteration:
                self.done = True
                self._check_end(before)
                return None
            self.next += 1
        assert batch is not None
        return [batch.column(0)]

    def _check_end(self, before: int) -> None:
        """The stream ended: it must end with its end-of-stream marker, then nothing."""
        end = self.file.tell()
        if end == before:
            raise IngestError(
                f"{self.path}: the Arrow stream ends after {self.next} record batches without "
                f"its end-of-stream marker (truncated at byte {end:,}?)"
            )
        self.file.seek(max(0, end - len(STREAM_EOS)))
        tail = self.file.read(len(STREAM_EOS))
        if not (tail == STREAM_EOS or tail.endswith(LEGACY_STREAM_EOS)):
            raise IngestError(
                f"{self.path}: the Arrow stream does not end with an end-of-stream marker"
            )
        if end != self.size:
            raise IngestError(
                f"{self.path}: {self.size - end:,} bytes after the Arrow stream's end-of-stream "
                f"marker (at byte {end - len(tail):,})"
            )


class _FileReader(_Reader):
    def _start(self) -> None:
        pa = self.pa
        self.reader = pa.ipc.open_file(self.file)
        self.schema = self.reader.schema
        self.field = self.schema.get_field_index(self.column)
        if self.field >= 0:
            opts = pa.ipc.IpcReadOptions(use_threads=False, included_fields=[self.field])
            self.reader = pa.ipc.open_file(self.file, options=opts)
        self.count = int(self.reader.num_record_batches)

    def unit(self, i: int) -> list[Any] | None:
        assert self.count is not None
        if i >= self.count:
            return None
        return [self.reader.get_batch(i).column(0)]


class _ParquetReader(_Reader):
    def _start(self) -> None:
        pq = import_optional("pyarrow.parquet", "reading parquet")
        self.pf = pq.ParquetFile(self.file, page_checksum_verification=True)
        self.schema = self.pf.schema_arrow
        self.field = self.schema.get_field_index(self.column)
        self.count = int(self.pf.num_row_groups)

    def unit(self, i: int) -> list[Any] | None:
        assert self.count is not None
        if i >= self.count:
            return None
        table = self.pf.read_row_group(i, columns=[self.column], use_threads=False)
        expected = self.pf.metadata.row_group(i).num_rows
        if table.num_rows != expected:
            raise IngestError(
                f"{self.path}: row group {i}: {table.num_rows} rows read, the footer says "
                f"{expected}"
            )
        return list(table.column(0).chunks)

    def close(self) -> None:
        try:
            self.pf.close()
        finally:
            super().close()


_READERS: dict[Container, type[_Reader]] = {
    "stream": _StreamReader,
    "file": _FileReader,
    "parquet": _ParquetReader,
}


class CursorSlot:
    """Where the files of one ``expand_hf`` call keep their one open cursor (module docstring):
    the file that holds it, and a lock so that threads reading files take turns."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.owner: HFTokenFile | None = None


class HFTokenFile(Closing):
    """One Arrow (stream or file format) or parquet file with a token column: a ``TokenFile``.

    Opening reads the schema only and checks the column; ``num_tokens`` and
    ``document_starts`` make one pass each on first use (module docstring). ``slot`` is
    shared by the files of one ``expand_hf`` call; ``side_files`` are the metadata files
    (``state.json``...) read to find this file.
    """

    def __init__(
        self,
        path: PathLike,
        column: str = DEFAULT_COLUMN,
        *,
        slot: CursorSlot | None = None,
        side_files: Sequence[str] = (),
    ) -> None:
        self._path = os.fspath(path)
        self.column = column
        self._side = tuple(side_files)
        self._pa = import_optional("pyarrow", "reading Hugging Face Arrow and parquet files")
        self.container: Container = sniff_container(self._path)
        self.unit_name = _UNIT_NAMES[self.container]
        self._slot = slot or CursorSlot()
        self._reader: _Reader | None = None
        self._cached: tuple[int, Unit] | None = None
        self._unit_rows: I64Array | None = None
        self._unit_ends: I64Array | None = None
        self._first_rows: I64Array | None = None
        self._starts: I64Array | None = None
        reader = self._open()
        try:
            if reader.field < 0:
                raise IngestError(
                    f"{self._path}: no column {column!r} (columns: "
                    f"{', '.join(reader.schema.names) or 'none'}); name the token column with "
                    "column= (--column on the command line)"
                )
            vt = token_value_type(
                self._pa, reader.schema.field(reader.field).type, self._path, column
            )
            self._dtype: np.dtype[Any] = np.dtype(vt.to_pandas_dtype())
        except UnicodeDecodeError as e:  # a field name that is not UTF-8 (pyarrow decodes late)
            raise IngestError(
                f"{self._path}: the schema holds a field name that is not UTF-8 ({e.reason} at "
                f"byte {e.start} of {bytes(e.object[:64])!r})"
            ) from e
        finally:
            reader.close()

    # -- the TokenFile protocol --

    @property
    def path(self) -> str:
        """The file, as errors, manifests and traces name it."""
        return self._path

    @property
    def dtype(self) -> np.dtype[Any]:
        """The column's integer type, as NumPy's."""
        return self._dtype

    @property
    def num_tokens(self) -> int:
        """Tokens in the file: every row's list, concatenated (one pass on first use)."""
        ends = self._index()[1]
        return int(ends[-1]) if ends.size else 0

    @property
    def num_rows(self) -> int:
        """Rows (documents) in the file (one pass on first use)."""
        return int(self._index()[0].sum())

    def side_files(self) -> tuple[str, ...]:
        """Metadata files read to find this file (a ``save_to_disk`` directory's)."""
        return self._side

    def document_starts(self) -> I64Array:
        """The position of each row's first token in the stream (read-only, cached)."""
        if self._starts is None:
            self._scan(with_starts=True)
        assert self._starts is not None
        return self._starts

    def read_tokens(self, start: int, stop: int) -> npt.NDArray[np.integer[Any]]:
        """Tokens ``[start, stop)`` of the stream, as a fresh array of ``dtype``."""
        rows, ends = self._index()
        total = int(ends[-1]) if ends.size else 0
        if not 0 <= start <= stop <= total:
            raise IngestError(
                f"{self._path}: tokens [{start}, {stop}) are outside the file's {total} tokens"
            )
        out = np.empty(stop - start, dtype=self._dtype)
        if start == stop:
            return out
        with self._slot.lock:
            u = int(np.searchsorted(ends, start, side="right"))
            pos = start
            while pos < stop:
                unit = self._unit_at(u, rows, ends)
                first = int(ends[u]) - int(unit.offsets[-1])  # the unit's first token
                take = min(stop, int(ends[u])) - pos
                out[pos - start : pos - start + take] = unit.tokens[
                    pos - first : pos - first + take
                ]
                pos += take
                u += 1
        return out

    def close(self) -> None:
        """Close the reader and drop the unit it holds (idempotent); the index and document
        starts stay, so the file can still be read (it is reopened)."""
        with self._slot.lock:
            self._release()
            if self._slot.owner is self:
                self._slot.owner = None

    # -- passes and cursor --

    def _open(self) -> _Reader:
        try:
            return _READERS[self.container](self._pa, self._path, self.column)
        except (self._pa.ArrowException, OSError, UnicodeDecodeError) as e:
            raise IngestError(f"{self._path}: {self._not_readable()}: {one_line(e)}") from e

    def _not_readable(self) -> str:
        kind = {"stream": "Arrow IPC stream", "file": "Arrow IPC file", "parquet": "parquet file"}
        return f"not a readable {kind[self.container]}"

    def _read_unit(self, reader: _Reader, i: int, row: int) -> Unit | None:
        """Unit ``i`` (its first row is ``row``), decoded and checked, or ``None`` at the end."""
        pa = self._pa
        where = f"{self._path}: {self.unit_name} {i} (rows from {row})"
        try:
            chunks = reader.unit(i)
            if chunks is None:
                return None
            return self._decode(chunks, where, row)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            raise IngestError(f"{where}: cannot read column {self.column!r}: {one_line(e)}") from e
        except MemoryError as e:  # the unit decodes to more than this process can hold
            raise IngestError(
                f"{where}: cannot read column {self.column!r}: out of memory decoding this "
                f"{self.unit_name} ({one_line(e) or 'MemoryError'})"
            ) from e

    def _decode(self, chunks: list[Any], where: str, row: int) -> Unit:
        pa = self._pa
        offsets: list[I64Array] = []
        tokens: list[npt.NDArray[np.integer[Any]]] = []
        base = rows = 0
        for arr in chunks:
            arr.validate(full=True)
            t = arr.type
            vt = t.value_type
            if not (pa.types.is_integer(vt) and np.dtype(vt.to_pandas_dtype()) == self._dtype):
                raise IngestError(f"{where}: column {self.column!r} has type {t}, not the schema's")
            n = len(arr)
            if arr.null_count:
                first = int(np.flatnonzero(~arr.is_valid().to_numpy(zero_copy_only=False))[0])
                raise IngestError(
                    f"{self._path}: row {row + rows + first}: column {self.column!r} is null"
                )
            if pa.types.is_fixed_size_list(t):
                size = int(t.list_size)
                rel = np.arange(n + 1, dtype=np.int64) * size
                values = arr.values.slice(arr.offset * size, n * size)
            else:
                off = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
                rel = off - off[0]
                values = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
            if values.null_count:
                k = int(np.flatnonzero(~values.is_valid().to_numpy(zero_copy_only=False))[0])
                r = int(np.searchsorted(rel, k, side="right")) - 1
                raise IngestError(
                    f"{self._path}: row {row + rows + r}: column {self.column!r}: token "
                    f"{k - int(rel[r])} of the row is null"
                )
            offsets.append(rel[:-1] + base if len(chunks) > 1 else rel)
            tokens.append(values.to_numpy(zero_copy_only=False))
            base += int(rel[-1])
            rows += n
        if len(chunks) == 1:
            return Unit(rows, offsets[0], tokens[0])
        offsets.append(np.array([base], dtype=np.int64))
        all_tokens = np.concatenate(tokens) if tokens else np.empty(0, dtype=self._dtype)
        return Unit(rows, np.concatenate(offsets), all_tokens.astype(self._dtype, copy=False))

    def _index(self) -> tuple[I64Array, I64Array]:
        if self._unit_rows is None or self._unit_ends is None:
            self._scan(with_starts=False)
        assert self._unit_rows is not None and self._unit_ends is not None
        return self._unit_rows, self._unit_ends

    def _scan(self, *, with_starts: bool) -> None:
        """One pass over every unit: rows and tokens of each (and the document starts)."""
        rows: list[int] = []
        ends: list[int] = []
        starts: list[I64Array] = []
        total = row = 0
        with self._slot.lock:
            self._take_slot()
            reader = self._open()
            try:
                while True:
                    unit = self._read_unit(reader, len(rows), row)
                    if unit is None:
                        break
                    if with_starts:
                        starts.append(unit.offsets[:-1] + total)
                    total += int(unit.offsets[-1])
                    row += unit.rows
                    rows.append(unit.rows)
                    ends.append(total)
            finally:
                reader.close()
        got_rows, got_ends = np.array(rows, dtype=np.int64), np.array(ends, dtype=np.int64)
        old_rows, old_ends = self._unit_rows, self._unit_ends
        if (
            old_rows is not None
            and old_ends is not None
            and not (np.array_equal(got_ends, old_ends) and np.array_equal(got_rows, old_rows))
        ):
            raise IngestError(f"{self._path}: the file changed since it was first read")
        self._unit_rows, self._unit_ends = got_rows, got_ends
        self._first_rows = np.cumsum(got_rows) - got_rows
        if with_starts:
            s = np.concatenate(starts) if starts else np.empty(0, dtype=np.int64)
            s.flags.writeable = False
            self._starts = s

    def _take_slot(self) -> None:
        """Make this file the slot's owner, releasing the previous owner's cursor."""
        owner = self._slot.owner
        if owner is not self:
            if owner is not None:
                owner._release()
            self._slot.owner = self

    def _release(self) -> None:
        self._cached = None
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.close()

    def _unit_at(self, u: int, rows: I64Array, ends: I64Array) -> Unit:
        """Unit ``u`` through the cursor, checked against the index (caller holds the lock)."""
        self._take_slot()
        if self._cached is not None and self._cached[0] == u:
            return self._cached[1]
        self._cached = None
        reader = self._reader
        if reader is not None and not reader.can_reach(u):  # a stream read past unit u
            self._release()
            reader = None
        if reader is None:
            reader = self._reader = self._open()
        assert self._first_rows is not None
        try:
            unit = self._read_unit(reader, u, int(self._first_rows[u]))
        except BaseException:
            self._release()  # the reader is somewhere in a bad unit: start afresh next time
            raise
        want = int(ends[u] - (ends[u - 1] if u else 0))
        if unit is None or unit.rows != int(rows[u]) or int(unit.offsets[-1]) != want:
            got = "nothing" if unit is None else f"{unit.rows} rows, {int(unit.offsets[-1])} tokens"
            self._release()
            raise IngestError(
                f"{self._path}: {self.unit_name} {u}: expected {int(rows[u])} rows and {want} "
                f"tokens as when the file was first read, got {got} (the file changed or was "
                "truncated since)"
            )
        self._cached = (u, unit)
        return unit

    def __repr__(self) -> str:
        return f"HFTokenFile({self._path!r}, column={self.column!r}, {self.container})"


__all__ = [
    "DEFAULT_COLUMN",
    "HFTokenFile",
    "dataset_files",
    "expand_hf",
    "is_hf_dataset",
]
