"""MosaicML Streaming MDS shards as token files, read without importing Streaming.

A Streaming dataset directory holds ``index.json`` and shard files (``streaming/base/format``:
``base/writer.py``, ``mds/writer.py``, ``mds/encodings.py``, ``compression.py``). Its layout::

    index.json   {"version": 2, "shards": [entry, ...]}, one entry per shard:
        format            "mds" (Streaming's "json", "csv", "tsv" shards are not read here)
        version           2
        column_names      the sample's columns, sorted by name
        column_encodings  one per column: "ndarray:uint16", "bytes", "str", "int", "pkl", ...
        column_sizes      one per column: the fixed encoded size in bytes, or null (variable)
        samples           samples in the shard
        raw_data          {"basename", "bytes", "hashes"}: the (decompressed) shard file
        compression       null, or "zstd", "zstd:LEVEL", "gz:LEVEL", "bz2", "br", "snappy", ...
        zip_data          null without compression, else {"basename", "bytes", "hashes"}

    a shard (little-endian):
        uint32                 num_samples
        uint32[num_samples+1]  offsets: sample i is bytes [offsets[i], offsets[i+1]) of the file
        bytes                  the writer's configuration as JSON (up to offsets[0]; not read)
        samples                per sample: uint32 size of each variable-size column (those
                               whose column_sizes entry is null), in column order, then each
                               column's encoded bytes in column order

A merged index (Streaming's ``merge_index``) lists shards of sub-directories by a relative
basename (``"part-0/shard.00000.mds"``); a directory without ``index.json`` whose
sub-directories (down to ``NESTED_DEPTH`` levels) each have one is read index by index, in
sorted order.

**Token column.** One column holds the tokens (``column``, ``input_ids`` by default; llm-foundry
writes ``tokens``). Its encoding is one of:

``ndarray:DTYPE:SHAPE``  fixed size: the values alone (``column_sizes`` gives their size)
``ndarray:DTYPE``        ``[ndim << 2 | shape width code: 1 byte] [shape] [values]``, the
                         shape's integers uint8/16/32/64 for codes 0-3
``ndarray``              ``[dtype code: 1 byte]`` before that (8 uint8, 9 int8, 16 uint16,
                         17 int16, 32 uint32, 33 int32, 64 uint64, 65 int64; the float codes
                         18, 34, 66 are refused); samples of different dtypes are read as
                         their common dtype
``bytes``                the raw token bytes; their dtype is not in the file, so it must be
                         given (``dtype=``: an integer type, little-endian)

Arrays of any shape are flattened (C order). ``pkl`` is refused: input data is never unpickled
(unpickling runs arbitrary code). Other columns are never decoded, only skipped by size, so
their encodings are not checked.

Each sample is one document; the shard's stream of tokens is its samples' token arrays
concatenated, and ``document_starts`` is where each sample's tokens begin.

**Validation**, before any token is read or any buffer is sized from the file: every
``index.json`` field above (types, ranges, a basename that stays inside the directory,
compression and ``zip_data`` given together, a token column that exists and whose fixed size
matches its encoding); the shard file is a regular file of exactly ``raw_data.bytes`` (or
``zip_data.bytes``) bytes; ``num_samples`` equals ``samples`` and its offsets table fits the
file; the offsets start after the table, never decrease and end exactly at the file's end;
each sample holds its size prefixes, and its columns' sizes add up to its length exactly;
each token column holds its dtype/shape header, a whole number of values, and as many values
as its shape says. Any failure is one ``IngestError`` naming the file (or ``index.json`` and
the entry), the field and the rule broken.

**Compression.** ``zstd`` (with the optional ``zstandard`` module, the ``formats`` extra),
``gz`` and ``bz2`` (the standard library) are decompressed; ``br`` and ``snappy`` are
refused. When the raw shard file is present beside the compressed one (a Streaming cache),
the raw file is read instead.
Decompression streams ``DECOMPRESS_CHUNK_BYTES`` at a time into an unnamed temporary file and
stops with an error as soon as the output passes ``raw_data.bytes`` (at most ``2**32 - 1``:
the offsets are uint32) or the stream ends short of it; zstd frames needing a window over
``ZSTD_MAX_WINDOW`` are refused. The temporary copies of one ``expand_mds`` call are kept for
at most ``KEEP_DECOMPRESSED`` shards at a time (the least recently used one is dropped and made
again if read again), and a shard's copy is dropped once its last token has been read. So a
compressed shard is decompressed when opened (to validate it) and, unless its copy is still
held, once more when its tokens are read; disk use is at most ``KEEP_DECOMPRESSED`` raw shards.

**Memory** never depends on a shard's size beyond what its metadata needs: the offsets table
and per-sample bookkeeping (16 bytes a sample, 17 with mixed dtypes) while a shard is open;
scans read ``SCAN_PIECE_BYTES`` at a time and token reads group nearby samples into reads of at
most ``READ_SPAN_BYTES`` (or the tokens asked for), with a few times that in temporaries.
Reads are positioned (``SourceFile``), never memory-mapped.

Not checked: the shards' ``hashes`` (Streaming writes none by default), the configuration JSON
inside each shard, and the other columns' contents.
"""

from __future__ import annotations

import bz2
import contextlib
import glob
import gzip
import json
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from ..arguments import U32_MAX
from ..errors import IngestError, MissingDependencyError, ZeroBatchIOError
from ..tokenization.protocol import import_optional
from .records import I64Array
from .source import PathLike, Patterns, SourceFile
from .token_files import DEFAULT_COLUMN

INDEX_NAME = "index.json"
INDEX_VERSION = 2
INDEX_MAX_BYTES = 1 << 30
"""Largest ``index.json`` read (about a million shard entries)."""
NESTED_DEPTH = 2
"""Levels of sub-directories searched for ``index.json`` below a directory without one."""
DETECT_BYTES = 1 << 16
"""Bytes of ``index.json`` that ``is_mds`` looks at."""

U32: np.dtype[np.uint32] = np.dtype(np.uint32).newbyteorder("<")
"""MDS header words: sample counts, offsets and column sizes (little-endian uint32)."""
WORD = U32.itemsize

NDARRAY_DTYPES: dict[int, str] = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
"""The dtype code a dtype-less ``ndarray`` sample starts with, and its dtype."""
SHAPE_WIDTHS = (1, 2, 4, 8)
"""Bytes per shape integer for the width codes 0-3 (the low two bits of the shape byte)."""
OTHER_ENCODINGS = frozenset(
    {
        "str", "int", "json", "str_int", "str_float", "str_decimal",
        "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
        "float16", "float32", "float64",
        "pil", "jpeg", "jpeg_array", "jpegarray", "png", "list[pil]", "list[jpeg]", "list[png]",
    }
)  # fmt: skip
"""Streaming's encodings that are not token arrays (``pkl`` is refused on its own)."""

COMPRESSIONS = ("zstd", "gz", "bz2")
"""Compressions read (``zstd`` needs the optional ``zstandard`` module)."""
REFUSED_COMPRESSIONS = ("br", "snappy")
ZSTD_MAX_WINDOW = 1 << 27
"""Largest zstd window accepted (libzstd's own default limit, 128 MiB)."""
DECOMPRESS_CHUNK_BYTES = 1 << 20
KEEP_DECOMPRESSED = 2
"""Decompressed shard copies (temporary files) kept at once per ``expand_mds`` call."""

SCAN_PIECE_BYTES = 1 << 20
"""Bytes read at once when reading each sample's size prefixes and array headers."""
READ_SPAN_BYTES = 1 << 20
"""Most bytes one read of token data covers (more when one sample's tokens asked for do)."""
LOOP_SAMPLES = 16
"""Reads covering more samples than this gather their tokens vectorised (``_select``)."""
READ_GAP_BYTES = 64 << 10
"""Samples whose token bytes are further apart than this are read separately."""


def _show(value: object) -> str:
    """``repr(value)``, cut to 80 characters for messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bound(hi: int) -> str:
    return "2**32 - 1" if hi == U32_MAX else f"{hi}"


# -- index.json ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardFile:
    """One file an index entry names: its path and the size ``index.json`` gives it."""

    basename: str
    path: str
    bytes: int


@dataclass(frozen=True)
class ShardInfo:
    """One validated ``index.json`` entry (an MDS shard)."""

    index_path: str
    number: int
    """The entry's position in ``shards``."""
    column_names: tuple[str, ...]
    column_encodings: tuple[str, ...]
    column_sizes: tuple[int | None, ...]
    compression: str | None
    samples: int
    raw: ShardFile
    zip: ShardFile | None

    @property
    def where(self) -> str:
        """The entry, for messages: ``/data/index.json: shards[3]``."""
        return f"{self.index_path}: shards[{self.number}]"


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise IngestError(f"{where}.{key}: missing (every MDS index entry has it)")
    return obj[key]


def _int(value: object, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise IngestError(
            f"{where}: expected an integer in [{lo}, {_bound(hi)}], got {_show(value)}"
        )
    return value


def _str_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise IngestError(f"{where}: expected a list of strings, got {_show(value)}")
    return value


def _compression_family(value: object, where: str) -> str | None:
    """The compression's family (``zstd`` for ``zstd:7``), ``None`` for none."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise IngestError(f"{where}: expected null or a string such as 'zstd', got {_show(value)}")
    family, colon, level = value.partition(":")
    if colon and not re.fullmatch(r"[0-9]{1,2}", level):
        raise IngestError(f"{where}: level {level!r} of {value!r} is not a compression level")
    if family in REFUSED_COMPRESSIONS:
        raise IngestError(
            f"{where}: {value!r} compression is not read by ZeroBatch (it reads "
            f"{', '.join(COMPRESSIONS)}); let Streaming decompress the shards (its cache holds "
            "the raw .mds files) or re-write the dataset with zstd"
        )
    if family not in COMPRESSIONS:
        raise IngestError(f"{where}: unknown compression {value!r}; expected one of {COMPRESSIONS}")
    return family


def _shard_file(value: object, where: str, root: str, hi: int) -> ShardFile:
    if not isinstance(value, dict):
        raise IngestError(
            f"{where}: expected an object with basename and bytes, got {_show(value)}"
        )
    name = _field(value, "basename", where)
    size = _int(_field(value, "bytes", where), f"{where}.bytes", 0, hi)
    if not isinstance(name, str) or not name:
        raise IngestError(f"{where}.basename: expected a file name, got {_show(name)}")
    parts = name.split("/")
    if name.startswith("/") or "\x00" in name or any(p in ("", ".", "..") for p in parts):
        raise IngestError(
            f"{where}.basename: {name!r} must be a relative path inside the dataset directory "
            "(no '..', no absolute path, no empty part)"
        )
    return ShardFile(name, os.path.join(root, *parts), size)


def _parse_entry(index_path: str, number: int, obj: object) -> ShardInfo:
    where = f"{index_path}: shards[{number}]"
    if not isinstance(obj, dict):
        raise IngestError(f"{where}: expected an object, got {_show(obj)}")
    fmt = _field(obj, "format", where)
    if fmt != "mds":
        raise IngestError(
            f"{where}.format: expected 'mds', got {_show(fmt)} (only MDS shards hold token arrays "
            "ZeroBatch reads)"
        )
    version = _field(obj, "version", where)
    if isinstance(version, bool) or version != INDEX_VERSION:
        raise IngestError(f"{where}.version: expected {INDEX_VERSION}, got {_show(version)}")
    names = _str_list(_field(obj, "column_names", where), f"{where}.column_names")
    encodings = _str_list(_field(obj, "column_encodings", where), f"{where}.column_encodings")
    sizes = _field(obj, "column_sizes", where)
    if not names:
        raise IngestError(f"{where}.column_names: expected at least one column, got none")
    if len(set(names)) != len(names):
        raise IngestError(f"{where}.column_names: a column is named twice in {_show(names)}")
    if not isinstance(sizes, list) or not len(names) == len(encodings) == len(sizes):
        raise IngestError(
            f"{where}: column_names, column_encodings and column_sizes must be lists of one "
            f"length, got {len(names)}, {len(encodings)} and {_show(sizes)}"
        )
    fixed = tuple(
        None if s is None else _int(s, f"{where}.column_sizes[{i}]", 1, U32_MAX)
        for i, s in enumerate(sizes)
    )
    root = os.path.dirname(index_path)
    samples = _int(_field(obj, "samples", where), f"{where}.samples", 0, U32_MAX)
    raw = _shard_file(_field(obj, "raw_data", where), f"{where}.raw_data", root, U32_MAX)
    family = _compression_family(_field(obj, "compression", where), f"{where}.compression")
    zip_value = _field(obj, "zip_data", where)
    if (family is None) != (zip_value is None):
        state = "no compression" if family is None else f"compression {obj['compression']!r}"
        raise IngestError(
            f"{where}.zip_data: {state} but zip_data is {_show(zip_value)} (a compressed shard "
            "has both, an uncompressed one neither)"
        )
    packed = None
    if zip_value is not None:
        packed = _shard_file(zip_value, f"{where}.zip_data", root, 2**63 - 1)
    return ShardInfo(
        index_path, number, tuple(names), tuple(encodings), fixed, family, samples, raw, packed
    )


def _regular_size(path: str, what: str) -> int | None:
    """``path``'s size if it is a regular file, ``None`` if nothing is there; anything else
    (a directory, a FIFO, a device) is an ``IngestError``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise IngestError(f"{path}: cannot read {what}: {getattr(e, 'strerror', None) or e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise IngestError(f"{path}: {what} is not a regular file")
    return st.st_size


def read_index(path: PathLike) -> list[ShardInfo]:
    """Every shard entry of the ``index.json`` at ``path``, validated (module docstring)."""
    path = os.fspath(path)
    size = _regular_size(path, "MDS index")
    if size is None:
        raise IngestError(f"{path}: MDS index does not exist")
    if size > INDEX_MAX_BYTES:
        raise IngestError(
            f"{path}: {size:,} bytes, more than an MDS index may be ({INDEX_MAX_BYTES:,})"
        )
    try:
        with open(path, "rb") as f:
            text = f.read(size + 1)  # bounded by the size checked, never INDEX_MAX_BYTES
    except OSError as e:
        raise ZeroBatchIOError(e.errno or 0, f"cannot read: {e.strerror or e}", path) from e
    try:
        obj = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise IngestError(f"{path}: not a JSON MDS index: {e}") from e
    if not isinstance(obj, dict):
        raise IngestError(
            f"{path}: expected a JSON object with version and shards, got {_show(obj)}"
        )
    version = obj.get("version")
    if isinstance(version, bool) or version != INDEX_VERSION:
        raise IngestError(f"{path}: field version: expected {INDEX_VERSION}, got {_show(version)}")
    shards = obj.get("shards")
    if not isinstance(shards, list):
        raise IngestError(f"{path}: field shards: expected a list, got {_show(shards)}")
    return [_parse_entry(path, i, entry) for i, entry in enumerate(shards)]


# -- the token column's encoding ----------------------------------------------------------------


@dataclass(frozen=True)
class TokenEncoding:
    """The token column's encoding: ``bytes``, or ``ndarray`` with the dtype and the shape
    fixed or given per sample (``None``)."""

    text: str
    dtype: np.dtype[Any] | None
    shape: tuple[int, ...] | None
    is_bytes: bool = False

    @property
    def fixed_size(self) -> int | None:
        """The encoded size of every sample when dtype and shape are fixed, else ``None``."""
        if self.dtype is None or self.shape is None:
            return None
        return int(np.prod(self.shape, dtype=object)) * self.dtype.itemsize


def _value_dtype(name: str, where: str) -> np.dtype[Any]:
    if name not in NDARRAY_DTYPES.values():
        raise IngestError(
            f"{where}: dtype {name!r} is not one of Streaming's ndarray dtypes "
            f"({', '.join(sorted(set(NDARRAY_DTYPES.values())))})"
        )
    dt = np.dtype(name).newbyteorder("<")
    if dt.kind not in "ui":
        raise IngestError(f"{where}: dtype {name}: token ids are integers, not {dt.kind!r} floats")
    return dt


def parse_encoding(text: str, where: str) -> TokenEncoding:
    """The token column's encoding ``text`` (``where`` names it in errors)."""
    if text == "bytes":
        return TokenEncoding(text, None, None, is_bytes=True)
    name, _, config = text.partition(":")
    if name == "ndarray":
        args = config.split(":") if config else []
        if len(args) > 2:
            raise IngestError(f"{where}: {text!r}: expected ndarray[:DTYPE[:SHAPE]]")
        dtype = _value_dtype(args[0], where) if args else None
        shape = None
        if len(args) == 2:
            dims = args[1].split(",")
            if not all(re.fullmatch(r"[0-9]{1,20}", d) and int(d) >= 1 for d in dims):
                raise IngestError(
                    f"{where}: shape {args[1]!r} of {text!r}: expected positive integers "
                    "separated by commas"
                )
            shape = tuple(int(d) for d in dims)
        return TokenEncoding(text, dtype, shape)
    if name == "pkl":
        raise IngestError(
            f"{where}: encoding 'pkl' (pickle) is refused: ZeroBatch never unpickles input data "
            "(unpickling runs arbitrary code); write the tokens as ndarray:DTYPE or bytes"
        )
    if text in OTHER_ENCODINGS or name in OTHER_ENCODINGS:
        raise IngestError(
            f"{where}: encoding {text!r} does not hold token arrays; a token column is "
            "ndarray[:DTYPE[:SHAPE]] or bytes (with dtype=)"
        )
    raise IngestError(f"{where}: unknown MDS encoding {text!r}")


def token_dtype(dtype: npt.DTypeLike | None) -> np.dtype[Any] | None:
    """The ``dtype=`` option as a little-endian integer dtype (``None`` stays ``None``)."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise IngestError(f"dtype {dtype!r}: not a NumPy dtype ({e})") from e
    if dt.kind not in "ui":
        raise IngestError(f"dtype {dtype!r}: tokens are integers; expected uint16, int32, ...")
    if dt.byteorder == ">":
        raise IngestError(f"dtype {dtype!r}: MDS shards are little-endian")
    return dt.newbyteorder("<")


# -- decompression ----------------------------------------------------------------------------


class _Decompressed(SourceFile):
    """A compressed shard's decompressed bytes in an unnamed temporary file, read like the raw
    shard (``read_into``); ``path`` names the compressed file in messages."""

    def __init__(self, handle: IO[bytes], label: str) -> None:
        self.handle = handle
        self.path = label
        self.fd = handle.fileno()

    def close(self) -> None:
        if self.fd >= 0:
            self.fd = -1
            self.handle.close()


def _zstd() -> Any:
    """The ``zstandard`` module (the ``formats`` extra), imported on first use."""
    what = "reading zstd-compressed MDS shards"
    try:
        return import_optional("zstandard", what)
    except MissingDependencyError as e:
        raise MissingDependencyError("zstandard", "formats", what) from e.__cause__


def _open_stream(family: str, f: IO[bytes]) -> Any:
    """A reader of ``f`` decompressed whose ``read(n)`` returns at most ``n`` bytes."""
    if family == "zstd":
        dctx = _zstd().ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
        return dctx.stream_reader(f, read_across_frames=True)
    if family == "gz":
        return gzip.GzipFile(fileobj=f, mode="rb")
    return bz2.BZ2File(f, "rb")


def _stream_errors(family: str) -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (EOFError, zlib.error, ValueError)
    if family == "zstd":
        errors += (_zstd().ZstdError,)
    return errors


def decompress(info: ShardInfo) -> _Decompressed:
    """The decompressed copy of ``info``'s compressed file, exactly ``raw_data.bytes`` long, in
    a temporary file (see the module docstring for the bounds)."""
    assert info.zip is not None and info.compression is not None
    path, family, declared = info.zip.path, info.compression, info.raw.bytes
    errors = _stream_errors(family)
    handle = tempfile.TemporaryFile(prefix="zerobatch-mds-")  # noqa: SIM115
    total = 0
    try:
        with open(path, "rb") as f, contextlib.closing(_open_stream(family, f)) as stream:
            while True:
                chunk = stream.read(min(DECOMPRESS_CHUNK_BYTES, declared - total + 1))
                if not chunk:
                    break
                total += len(chunk)
                if total > declared:
                    raise IngestError(
                        f"{path}: decompresses to more than the {declared:,} bytes of "
                        f"{info.where}.raw_data.bytes: refused"
                    )
                handle.write(chunk)
        handle.flush()
    except IngestError:
        handle.close()
        raise
    except errors as e:
        handle.close()
        raise IngestError(f"{path}: not a valid {family} stream after {total:,} bytes: {e}") from e
    except OSError as e:
        handle.close()
        if not e.errno:  # a format error reported as OSError (gzip's BadGzipFile, bz2)
            raise IngestError(
                f"{path}: not a valid {family} stream after {total:,} bytes: {e}"
            ) from e
        raise ZeroBatchIOError(e.errno, f"cannot decompress: {e.strerror or e}", path) from e
    if total < declared:
        handle.close()
        raise IngestError(
            f"{path}: the {family} stream ends after {total:,} of the {declared:,} bytes of "
            f"{info.where}.raw_data.bytes (the compressed shard is cut short)"
        )
    return _Decompressed(handle, f"{path} (decompressed)")


class DecompressedShards:
    """The decompressed copies of the compressed shards that share this object: at most
    ``limit`` at a time; holding one more drops the least recently used. Used from one thread
    at a time, as the shards themselves are."""

    def __init__(self, limit: int = KEEP_DECOMPRESSED) -> None:
        self.limit = max(1, limit)
        self._held: list[MDSShard] = []

    def hold(self, shard: MDSShard) -> None:
        """``shard`` holds a copy now (most recently used)."""
        if shard in self._held:
            self._held.remove(shard)
        self._held.append(shard)
        while len(self._held) > self.limit:
            self._held.pop(0).release()

    def forget(self, shard: MDSShard) -> None:
        """``shard`` dropped its copy."""
        if shard in self._held:
            self._held.remove(shard)


# -- shards -----------------------------------------------------------------------------------


def _gather(src: SourceFile, positions: I64Array, width: int) -> npt.NDArray[np.uint8]:
    """Bytes ``[p, p + width)`` of ``src`` for each of the ascending ``positions``, as
    ``uint8 [n, width]``, reading pieces of about ``SCAN_PIECE_BYTES`` (runs of nearby
    positions share a read; far-apart ones never read what lies between them)."""
    out = np.empty((positions.size, width), dtype=np.uint8)
    if positions.size == 0 or width == 0:
        return out
    span = max(SCAN_PIECE_BYTES, width)
    cols = np.arange(width, dtype=np.int64)
    i = 0
    while i < positions.size:
        lo = int(positions[i])
        e = max(i + 1, int(np.searchsorted(positions, lo + span - width, side="right")))
        buf = np.empty(int(positions[e - 1]) + width - lo, dtype=np.uint8)
        src.read_into(lo, buf)
        out[i:e] = buf[(positions[i:e] - lo)[:, None] + cols]
        i = e
    return out


def _select(buf: npt.NDArray[np.uint8], begins: I64Array, ends: I64Array) -> npt.NDArray[np.uint8]:
    """The bytes of ``buf`` in the ascending, non-overlapping ranges ``[begins, ends)``,
    concatenated (vectorised: a run of many small samples costs no Python loop)."""
    keep = ends > begins
    mark = np.zeros(buf.size + 1, dtype=np.int8)
    mark[begins[keep]] += 1  # distinct among non-empty ranges, as are their ends
    mark[ends[keep]] -= 1
    selected: npt.NDArray[np.uint8] = buf[np.cumsum(mark[:-1], dtype=np.int8).astype(bool)]
    return selected


def _shape_products(dims: npt.NDArray[np.uint64], cap: int) -> npt.NDArray[np.uint64]:
    """Each row's product of ``dims``, saturated at ``cap`` (no overflow for any input)."""
    prod = np.ones(dims.shape[0], dtype=np.uint64)
    top = np.uint64(cap)
    for k in range(dims.shape[1]):
        d = dims[:, k]
        limit = top // np.maximum(d, np.uint64(1))
        prod = np.where(d == 0, np.uint64(0), np.where(prod > limit, top, prod * d))
    return prod


class MDSShard:
    """One MDS shard as a ``TokenFile``: its samples' token arrays, one document each.

    Opening validates ``info`` against the shard file and reads every sample's size prefixes
    and token-array header (never the token values); a compressed shard is decompressed first
    (``decompress``). ``dtype`` is required for a ``bytes`` token column and must match any
    other's. ``read_tokens`` reads the ranges asked for.
    """

    def __init__(
        self,
        info: ShardInfo,
        column: str = DEFAULT_COLUMN,
        dtype: npt.DTypeLike | None = None,
        *,
        copies: DecompressedShards | None = None,
    ) -> None:
        self.info = info
        self.column = column
        self._copies = copies if copies is not None else DecompressedShards()
        self._copy: _Decompressed | None = None
        given = token_dtype(dtype)
        where = info.where
        if column not in info.column_names:
            listed = ", ".join(
                f"{n} ({e})" for n, e in zip(info.column_names, info.column_encodings, strict=True)
            )
            raise IngestError(
                f"{where}.column_names: no token column {column!r}; the shard's columns are "
                f"{listed} (choose one with column=, --column)"
            )
        self._col = info.column_names.index(column)
        enc_where = f"{where}.column_encodings[{self._col}] (column {column!r})"
        self.encoding = parse_encoding(info.column_encodings[self._col], enc_where)
        self._check_encoding(given, enc_where)
        raw_size = _regular_size(info.raw.path, "MDS shard")
        if raw_size is None and info.zip is None:
            raise IngestError(f"{info.raw.path}: MDS shard does not exist ({where}.raw_data)")
        self.compressed = raw_size is None
        if raw_size is not None:
            self.path = info.raw.path
            self._check_size(raw_size, info.raw.bytes, "raw_data")
        else:
            assert info.zip is not None
            self.path = info.zip.path
            zip_size = _regular_size(self.path, "compressed MDS shard")
            if zip_size is None:
                raise IngestError(
                    f"{self.path}: compressed MDS shard does not exist ({where}.zip_data), nor "
                    f"does its raw file {info.raw.basename}"
                )
            self._check_size(zip_size, info.zip.bytes, "zip_data")
        self._code_dtype: dict[int, np.dtype[Any]] = {}
        self._codes: npt.NDArray[np.uint8] | None = None
        try:
            with self._bytes() as src:
                self._scan(src, given)
        except BaseException:
            self.release()  # a bad shard keeps no decompressed copy
            raise
        self.num_samples = info.samples
        self.num_tokens = int(self._cum[-1])

    # -- validation --------------------------------------------------------------------------

    def _check_encoding(self, given: np.dtype[Any] | None, where: str) -> None:
        enc, declared = self.encoding, self.info.column_sizes[self._col]
        if enc.is_bytes and given is None:
            raise IngestError(
                f"{where}: a bytes column does not say its dtype; give it (dtype=, --column-dtype "
                "uint16, uint32, int32, ...)"
            )
        if enc.dtype is not None and given is not None and enc.dtype != given:
            raise IngestError(
                f"{where}: holds {enc.dtype.name} tokens, but dtype {given.name} was given"
            )
        if declared != enc.fixed_size:
            expected = "null (variable size)" if enc.fixed_size is None else f"{enc.fixed_size}"
            raise IngestError(
                f"{self.info.where}.column_sizes[{self._col}]: expected {expected} for encoding "
                f"{enc.text!r}, got {declared}"
            )

    def _check_size(self, actual: int, declared: int, field: str) -> None:
        if actual != declared:
            state = "truncated shard" if actual < declared else "trailing bytes"
            raise IngestError(
                f"{self.path}: expected {declared:,} bytes ({self.info.where}.{field}.bytes), got "
                f"{actual:,} ({state})"
            )

    def _error(self, field: str, detail: str) -> IngestError:
        return IngestError(f"{self.path}: field {field}: {detail}")

    def _scan(self, src: SourceFile, given: np.dtype[Any] | None) -> None:
        """Read and check the header, the offsets and every sample's size prefixes and
        token-array header; keep where each sample's token values start and the token counts."""
        size, n = self.info.raw.bytes, self.info.samples
        if size < WORD:
            raise self._error(
                "num_samples", f"expected a uint32 at byte 0, the shard is {size} bytes"
            )
        head = np.empty(1, dtype=U32)
        src.read_into(0, head)
        if int(head[0]) != n:
            raise self._error(
                "num_samples", f"expected {n} ({self.info.where}.samples), got {int(head[0])}"
            )
        table = WORD * (n + 2)
        if table > size:
            raise self._error(
                "num_samples",
                f"{n} samples need a {table:,}-byte offsets table, the shard is {size:,} bytes",
            )
        raw_offsets = np.empty(n + 1, dtype=U32)
        src.read_into(WORD, raw_offsets)
        offsets = raw_offsets.astype(np.int64)
        del raw_offsets
        if offsets[0] < table:
            raise self._error(
                "offsets[0]", f"{int(offsets[0])} points into the {table}-byte offsets table"
            )
        down = np.flatnonzero(offsets[1:] < offsets[:-1])
        if down.size:
            i = int(down[0])
            raise self._error(
                f"offsets[{i + 1}]",
                f"{int(offsets[i + 1])} is below offsets[{i}] = {int(offsets[i])} (offsets ascend)",
            )
        if int(offsets[-1]) != size:
            raise self._error(
                f"offsets[{n}]",
                f"the last sample ends at {int(offsets[-1]):,}, expected the shard's end "
                f"({size:,})",
            )
        starts, lengths = offsets[:-1], np.diff(offsets)
        del offsets
        col_start, col_size = self._locate_column(src, starts, lengths)
        self._read_headers(src, col_start, col_size, given)

    def _locate_column(
        self, src: SourceFile, starts: I64Array, lengths: I64Array
    ) -> tuple[I64Array, I64Array]:
        """Each sample's token column: where its bytes start and how many there are."""
        sizes_decl = self.info.column_sizes
        variable = [i for i, s in enumerate(sizes_decl) if s is None]
        prefix = WORD * len(variable)
        short = np.flatnonzero(lengths < prefix)
        if short.size:
            i = int(short[0])
            raise self._error(
                f"sample {i}",
                f"{int(lengths[i])} bytes, too short for its {len(variable)} column sizes "
                f"({prefix} bytes)",
            )
        var = _gather(src, starts, prefix).view(U32).reshape(starts.size, len(variable))
        sizes = np.empty((starts.size, len(sizes_decl)), dtype=np.int64)
        for i, s in enumerate(sizes_decl):
            sizes[:, i] = s if s is not None else var[:, variable.index(i)]
        total = sizes.sum(axis=1) + prefix
        bad = np.flatnonzero(total != lengths)
        if bad.size:
            i = int(bad[0])
            raise self._error(
                f"sample {i}",
                f"its column sizes add up to {int(total[i]):,} bytes (with {prefix} bytes of "
                f"sizes), but the sample is {int(lengths[i]):,} bytes (offsets "
                f"[{int(starts[i])}, {int(starts[i] + lengths[i])}))",
            )
        col_start = starts + prefix + sizes[:, : self._col].sum(axis=1)
        return col_start, sizes[:, self._col].copy()

    def _read_headers(
        self,
        src: SourceFile,
        col_start: I64Array,
        col_size: I64Array,
        given: np.dtype[Any] | None,
    ) -> None:
        """Each sample's token values: where they start and how many (the array headers of
        a dtype-less or shape-less ndarray column are read and checked)."""
        enc, n = self.encoding, col_start.size
        name = f"column {self.column!r}"
        if enc.is_bytes or enc.shape is not None:
            dt = given if enc.is_bytes else enc.dtype
            assert dt is not None
            self.dtype: np.dtype[Any] = dt
            odd = np.flatnonzero(col_size % dt.itemsize)
            if odd.size:
                i = int(odd[0])
                raise self._error(
                    f"sample {i} {name}",
                    f"{int(col_size[i])} bytes, not a whole number of {dt.name} tokens",
                )
            self._finish(col_start, col_size // dt.itemsize)
            return
        pre = 1 if enc.dtype is None else 0
        short = np.flatnonzero(col_size < pre + 1)
        if short.size:
            i = int(short[0])
            raise self._error(f"sample {i} {name}", f"{int(col_size[i])} bytes, no array header")
        head = _gather(src, col_start, pre + 1)
        if enc.dtype is None:
            codes = head[:, 0]
            itemsize = self._sample_dtypes(codes, given, name)
        else:
            codes = None
            self.dtype = enc.dtype
            itemsize = np.full(n, enc.dtype.itemsize, dtype=np.int64)
        shape_byte = head[:, pre]
        ndim = (shape_byte >> 2).astype(np.int64)
        width = np.asarray(SHAPE_WIDTHS, dtype=np.int64)[shape_byte & 3]
        header = pre + 1 + ndim * width
        short = np.flatnonzero(col_size < header)
        if short.size:
            i = int(short[0])
            raise self._error(
                f"sample {i} {name}",
                f"{int(col_size[i])} bytes, shorter than its {int(header[i])}-byte array header "
                f"({int(ndim[i])} dimensions)",
            )
        values = col_size - header
        odd = np.flatnonzero(values % itemsize)
        if odd.size:
            i = int(odd[0])
            raise self._error(
                f"sample {i} {name}",
                f"{int(values[i])} bytes of values, not a whole number of "
                f"{int(itemsize[i])}-byte tokens",
            )
        counts = values // itemsize
        cap = U32_MAX + 1
        for byte in np.unique(shape_byte).tolist():
            rows = np.flatnonzero(shape_byte == byte)
            k, w = byte >> 2, SHAPE_WIDTHS[byte & 3]
            if k == 0:
                prods = np.ones(rows.size, dtype=np.uint64)
            else:
                raw = _gather(src, col_start[rows] + pre + 1, k * w)
                dims = raw.view(np.dtype(f"u{w}").newbyteorder("<")).reshape(rows.size, k)
                prods = _shape_products(dims.astype(np.uint64), cap)
            wrong = np.flatnonzero(prods != counts[rows].astype(np.uint64))
            if wrong.size:
                i = int(rows[wrong[0]])
                shown = "saturated" if int(prods[wrong[0]]) == cap else int(prods[wrong[0]])
                raise self._error(
                    f"sample {i} {name}",
                    f"its shape ({k} dimensions) holds {shown} values, its bytes {int(counts[i])}",
                )
        self._codes = codes if codes is not None and len(self._code_dtype) > 1 else None
        self._finish(col_start + header, counts)

    def _sample_dtypes(
        self, codes: npt.NDArray[np.uint8], given: np.dtype[Any] | None, name: str
    ) -> I64Array:
        """The itemsize of each sample of a dtype-less column; sets ``self.dtype`` to their
        common dtype (or the one given, which every sample must have)."""
        table = np.zeros(256, dtype=np.int64)
        found: dict[int, np.dtype[Any]] = {}
        values, firsts = np.unique(codes, return_index=True)
        for k in np.argsort(firsts).tolist():  # in sample order: the first bad sample is named
            code, i = int(values[k]), int(firsts[k])
            if code not in NDARRAY_DTYPES:
                raise self._error(f"sample {i} {name}", f"unknown dtype code {code}")
            dt = _value_dtype(NDARRAY_DTYPES[code], f"{self.path}: field sample {i} {name}")
            if given is not None and dt != given:
                raise self._error(
                    f"sample {i} {name}",
                    f"holds {dt.name} tokens, but dtype {given.name} was given",
                )
            found[code] = dt
            table[code] = dt.itemsize
        common = given or (np.result_type(*found.values()) if found else np.dtype(np.uint32))
        if common.kind not in "ui":
            raise IngestError(
                f"{self.path}: column {self.column!r} mixes "
                f"{', '.join(d.name for d in found.values())} tokens, which no integer dtype holds"
            )
        self.dtype = np.dtype(common).newbyteorder("<")
        self._code_dtype = found
        return table[codes]

    def _finish(self, data: I64Array, counts: I64Array) -> None:
        """Keep where each sample's token values start and the running token count."""
        self._data = np.ascontiguousarray(data, dtype=np.int64)
        self._cum = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=self._cum[1:])

    # -- reading -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _bytes(self) -> Iterator[SourceFile]:
        """The shard's raw bytes for positioned reads: the file, or the decompressed copy."""
        if not self.compressed:
            with SourceFile(self.path) as src:
                yield src
            return
        if self._copy is None:
            self._copy = decompress(self.info)
        self._copies.hold(self)
        yield self._copy

    def release(self) -> None:
        """Drop the decompressed copy (made again if read again)."""
        if self._copy is not None:
            self._copy.close()
            self._copy = None
        self._copies.forget(self)

    def document_starts(self) -> I64Array:
        """Where each sample's tokens start in the stream (read-only, ascending)."""
        starts = self._cum[:-1].view()
        starts.flags.writeable = False
        return starts

    def _sample_dtype(self, k: int) -> np.dtype[Any]:
        if self._codes is None:
            return self.dtype
        return self._code_dtype[int(self._codes[k])]

    def read_tokens(self, start: int, stop: int) -> npt.NDArray[np.integer[Any]]:
        """Tokens ``[start, stop)`` of the stream as a fresh array of ``dtype``."""
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_tokens:
            raise IngestError(
                f"{self.path}: tokens [{start}, {stop}) asked for, the shard has {self.num_tokens}"
            )
        out = np.empty(stop - start, dtype=self.dtype)
        if start == stop:
            return out
        cum = self._cum
        a = int(np.searchsorted(cum, start, side="right")) - 1
        b = int(np.searchsorted(cum, stop, side="left"))
        lo = np.maximum(cum[a:b], start)
        hi = np.minimum(cum[a + 1 : b + 1], stop)
        if self._codes is None:
            itemsize: Any = self.dtype.itemsize
        else:
            itemsize = np.array([self._sample_dtype(k).itemsize for k in range(a, b)])
        first = self._data[a:b] + (lo - cum[a:b]) * itemsize
        last = first + (hi - lo) * itemsize
        breaks = (np.flatnonzero(first[1:] - last[:-1] > READ_GAP_BYTES) + 1).tolist()
        with self._bytes() as src:
            for r0, r1 in zip([0, *breaks], [*breaks, b - a], strict=True):
                i = r0
                while i < r1:
                    j = int(np.searchsorted(last[i:r1], first[i] + READ_SPAN_BYTES, "right")) + i
                    j = max(j, i + 1)
                    base = int(first[i])
                    buf = np.empty(int(last[j - 1]) - base, dtype=np.uint8)
                    src.read_into(base, buf)
                    at = int(lo[i]) - start
                    if self._codes is None and j - i > LOOP_SAMPLES:
                        data = _select(buf, first[i:j] - base, last[i:j] - base)
                        out[at : at + data.size // self.dtype.itemsize] = data.view(self.dtype)
                    else:
                        for k in range(i, j):
                            count = int(hi[k] - lo[k])
                            out[at : at + count] = np.frombuffer(
                                buf, self._sample_dtype(a + k), count, int(first[k]) - base
                            )
                            at += count
                    i = j
        if stop == self.num_tokens:
            self.release()  # the last token is read: a decompressed copy is no longer needed
        return out

    def close(self) -> None:
        """Drop the decompressed copy, if any (idempotent)."""
        self.release()

    def __repr__(self) -> str:
        return (
            f"MDSShard({self.path!r}, column={self.column!r}, {self.num_samples} samples, "
            f"{self.num_tokens} {self.dtype.name} tokens)"
        )


# -- datasets ---------------------------------------------------------------------------------


def _nested_indexes(directory: str, depth: int, first_only: bool) -> list[str]:
    """``index.json`` files in the sub-directories of ``directory`` (sorted by name), taking a
    sub-directory's own index and not looking below it, down to ``depth`` levels."""
    found: list[str] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        try:
            if not entry.is_dir():
                continue
        except OSError:
            continue
        candidate = os.path.join(entry.path, INDEX_NAME)
        if os.path.lexists(candidate):
            found.append(candidate)
        elif depth > 1:
            found.extend(_nested_indexes(entry.path, depth - 1, first_only))
        if first_only and found:
            break
    return found


def find_indexes(path: PathLike) -> list[str]:
    """The ``index.json`` files an input names: itself, the one in a directory, or those of
    its sub-directories (module docstring)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        own = os.path.join(p, INDEX_NAME)
        if os.path.lexists(own):
            return [own]
        found = _nested_indexes(p, NESTED_DEPTH, first_only=False)
        if not found:
            raise IngestError(
                f"{p}: not an MDS dataset: no {INDEX_NAME} in it or in its sub-directories "
                f"(down to {NESTED_DEPTH} levels)"
            )
        return found
    if os.path.basename(p) == INDEX_NAME and os.path.lexists(p):
        return [p]
    state = (
        "does not exist" if not os.path.lexists(p) else f"is neither a directory nor {INDEX_NAME}"
    )
    raise IngestError(f"{p}: MDS input {state}")


def _looks_mds(index: str) -> bool:
    if _regular_size(index, "MDS index") is None:
        return False
    with open(index, "rb") as f:
        head = f.read(DETECT_BYTES)
    return b'"shards"' in head and re.search(rb'"format"\s*:\s*"mds"', head) is not None


def is_mds(path: PathLike) -> bool:
    """Whether ``path`` is a Streaming MDS dataset: an ``index.json`` of MDS shards, or a
    directory with one (in it, or in sub-directories down to ``NESTED_DEPTH`` levels). Looks at
    the first ``DETECT_BYTES`` of one index only, and never raises."""
    try:
        p = os.fspath(path)
        if os.path.isdir(p):
            own = os.path.join(p, INDEX_NAME)
            found = [own] if os.path.lexists(own) else _nested_indexes(p, NESTED_DEPTH, True)
            return bool(found) and _looks_mds(found[0])
        return os.path.basename(p) == INDEX_NAME and _looks_mds(p)
    except (OSError, ValueError, IngestError):
        return False


def expand_mds(
    paths: Patterns, column: str = DEFAULT_COLUMN, dtype: npt.DTypeLike | None = None
) -> list[MDSShard]:
    """The shards of the MDS datasets ``paths`` name (directories, ``index.json`` files or glob
    patterns of them), opened and validated, in index order.

    ``column`` is the token column; ``dtype`` the tokens' dtype for a ``bytes`` column (any
    other column's must match it). A shard file listed twice is an error (it would be read
    twice). Compressed shards share one ``DecompressedShards``.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise IngestError("no MDS inputs given")
    given = token_dtype(dtype)
    indexes: list[str] = []
    for item in items:
        p = os.fspath(item)
        if glob.has_magic(p) and not os.path.lexists(p):
            matches = sorted(glob.glob(p))
            if not matches:
                raise IngestError(f"{p}: no MDS input matches this pattern")
        else:
            matches = [p]
        for match in matches:
            indexes.extend(find_indexes(match))
    copies = DecompressedShards()
    shards: list[MDSShard] = []
    seen: dict[str, str] = {}
    try:
        for index in indexes:
            for info in read_index(index):
                key = os.path.realpath(info.raw.path)
                if key in seen:
                    raise IngestError(
                        f"{info.where}: shard {info.raw.basename} is listed twice (also by "
                        f"{seen[key]}); it would be read twice"
                    )
                seen[key] = info.where
                shards.append(MDSShard(info, column, given, copies=copies))
    except BaseException:
        for shard in shards:
            shard.close()
        raise
    return shards


__all__ = [
    "INDEX_NAME",
    "DecompressedShards",
    "MDSShard",
    "ShardFile",
    "ShardInfo",
    "TokenEncoding",
    "decompress",
    "expand_mds",
    "find_indexes",
    "is_mds",
    "parse_encoding",
    "read_index",
    "token_dtype",
]
