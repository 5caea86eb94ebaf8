"""Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) as token files.

The format of ``megatron.core.datasets.indexed_dataset`` (``IndexedDatasetBuilder``, read by
``IndexedDataset``; older Megatron-LM and GPT-NeoX write the same files with their
``MMapIndexedDataset``). fairseq's ``MMapIndexedDataset``, the ancestor, has the same magic and
version but no document count or document index; it is recognised by its size and refused
(a ``size`` error that says so).

Everything is little-endian (the header is packed ``<``; the arrays are NumPy's native order,
little-endian on every machine these tools run on)::

    PREFIX.idx
      bytes  0-8   magic            b"MMIDIDX\\x00\\x00"
      bytes  9-16  version          uint64, 1
      byte   17    dtype code       uint8, the token type of PREFIX.bin (TOKEN_DTYPES)
      bytes 18-25  sequence_count   uint64, S
      bytes 26-33  document_count   uint64, N: the entries of document_index (documents + 1)
      then         sequence_lengths  int32[S]   tokens of each sequence
                   sequence_pointers int64[S]   byte offset of each sequence in PREFIX.bin
                   document_index    int64[N]   sequence at which each document starts, ascending
                                                from 0; the last entry is S (it closes the last
                                                document), so there are N - 1 documents
                   sequence_modes    int8[S]    multimodal datasets only (no flag says so: the
                                                file size does)
    PREFIX.bin
      the sequences' tokens, back to back, in the dtype of the code

A *sequence* is one ``add_item`` (a sentence with ``--split-sentences``, else a whole
document); ``end_document`` closes a document, so a document is a run of sequences and may be
empty (``end_document`` twice, or only empty sequences). The stream of a ``MegatronFile`` is its
sequences concatenated in order; ``document_starts`` is the stream position of each document's
first sequence (an empty document shares its start with the next one).

Opening validates the whole index, streaming it in chunks of ``INDEX_CHUNK_ENTRIES`` entries
with positioned reads (``SourceFile``: never a memory map, so a file cut short while it is
read gives an ``IngestError`` instead of ``SIGBUS``). Each broken rule is an ``IngestError``
naming the file, the field (and entry) and the rule:

- ``magic`` (the legacy ``TNTIDX`` index of the non-mmap ``IndexedDataset`` is named as such),
  ``version`` 1, a known dtype code. Codes 6 and 7 are floating point (float64, float32);
  token ids are integers (Megatron's own choice for them, ``DType.optimal_dtype``, is uint16
  or int32), so a float dataset is refused as not a token corpus.
- ``size``: the ``.idx`` is exactly ``34 + 12 S + 8 N`` bytes, or ``S`` more with sequence
  modes. This is checked from the header alone, before anything is allocated, so corrupt
  counts (up to ``2**64 - 1``) cost nothing. ``document_count`` is at least 1.
- ``sequence_lengths[i] >= 0``.
- ``sequence_pointers[i]`` is exactly where sequence ``i - 1`` ends (0 for the first): every
  writer (Megatron's builder, its ``add_index`` concatenation, GPT-NeoX) computes the
  pointers as this running sum, and Megatron's own slice reads assume it. Anything else is
  refused rather than read pointer by pointer: a bit flip in a pointer then cannot pass as a
  deliberate layout, and reads are plain byte ranges of the ``.bin``.
- the ``.bin`` is exactly as long as the sequences (``sum(lengths) * itemsize`` bytes): shorter
  is a truncated file or the ``.bin`` of another index (reported at the first sequence that
  runs past its end), longer is trailing data no sequence holds. Megatron does not check
  either; a ``.bin`` that does not match its index is not the data it describes.
- ``sequence_modes[i] == 0`` (text) when present: other modes hold non-text data (Megatron's
  multimodal preprocessing stores image bytes as mode 1), not token ids.
- ``document_index``: ``[0] == 0``, ascending (equal neighbours are empty documents), at most
  ``S``, and the last entry is ``S``, as ``IndexedDataset`` asserts.

Memory is bounded whatever the corpus size: an open ``MegatronFile`` holds a few integers, no
per-sequence array. ``document_starts`` builds the only per-document array, 8 bytes per
document, reading the document index in chunks and the pointers it needs in windows of at most
``GATHER_ENTRIES`` entries; it is rebuilt on each call rather than kept, since
``TokenFileSource`` keeps the record starts it derives and asks once. ``read_tokens`` is one
positioned read of the byte range (the pointers are contiguous from byte 0). No descriptor is
held between calls, so a conversion can have any number of datasets open.

``path`` is the ``.bin`` file, the one that holds the tokens (``idx_path`` and ``prefix`` are
attributes too); records, manifests and traces point into it.
"""

from __future__ import annotations

import glob
import os
import struct
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..closing import Closing
from ..errors import IngestError
from .records import I64Array
from .source import PathLike, Patterns, SourceFile

MAGIC: Final = b"MMIDIDX\x00\x00"
"""The first 9 bytes of an ``.idx`` (``_INDEX_HEADER`` in Megatron)."""
LEGACY_MAGIC: Final = b"TNTIDX\x00\x00"
"""The 8-byte magic of the older, non-mmap ``IndexedDataset`` index (``.idx`` too)."""
VERSION: Final = 1
HEADER = struct.Struct("<9sQBQQ")
"""magic, version, dtype code, sequence_count, document_count: 34 bytes, no padding."""
HEADER_BYTES: Final = HEADER.size


def _little(t: type[np.integer[Any]]) -> np.dtype[Any]:
    """``t`` little-endian. (Megatron's types are spelled by NumPy type, not as strings, so that
    none reads as LLMBATCH's token dtype: the two formats only share a width by chance.)"""
    return np.dtype(t).newbyteorder("<")


TOKEN_DTYPES: dict[int, np.dtype[np.integer[Any]]] = {
    1: _little(np.uint8),
    2: _little(np.int8),
    3: _little(np.int16),
    4: _little(np.int32),
    5: _little(np.int64),
    8: _little(np.uint16),
}
"""Megatron's ``DType`` codes of integer token types (signed values below 0 are refused when
records are cut)."""
FLOAT_CODES: dict[int, str] = {6: "float64", 7: "float32"}
"""Megatron's ``DType`` codes of floating-point types: refused (see the module docstring)."""

LENGTH_DTYPE: np.dtype[np.int32] = _little(np.int32)
POINTER_DTYPE: np.dtype[np.int64] = _little(np.int64)
DOCUMENT_DTYPE: np.dtype[np.int64] = _little(np.int64)
MODE_DTYPE: np.dtype[np.int8] = _little(np.int8)
ENTRY_BYTES: Final = LENGTH_DTYPE.itemsize + POINTER_DTYPE.itemsize
"""Index bytes per sequence, without modes: a length and a pointer."""

INDEX_CHUNK_ENTRIES = 2**18
"""Index entries validated at once (1 MiB of lengths and 2 MiB of pointers)."""
GATHER_ENTRIES = 2**17
"""Most pointers read at once when finding document starts (1 MiB): nearby documents share a
read, the pointers between far-apart ones are not read."""

IDX_SUFFIX: Final = ".idx"
BIN_SUFFIX: Final = ".bin"
_NANOGPT_INDEX_SUFFIX = ".bos.idx"  # nanoGPT's BOS index beside a shard, not a Megatron index
_CHANGED = "changed since it was opened"
_FAIRSEQ_HEADER_BYTES = HEADER_BYTES - 8  # fairseq's index: the same header, no document count


def megatron_prefix(path: PathLike) -> str:
    """The dataset prefix of ``path``: itself, or without its ``.idx`` / ``.bin`` suffix."""
    p = os.fspath(path)
    if p.endswith((IDX_SUFFIX, BIN_SUFFIX)):
        return p[: -len(IDX_SUFFIX)]
    return p


def _check_regular(path: str, what: str, prefix: str) -> None:
    """An ``IngestError`` unless ``path`` is a regular file (a FIFO would block its reader)."""
    if not os.path.isfile(path):
        state = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise IngestError(f"{path}: {what} file of Megatron dataset {prefix} {state}")


def _read(src: SourceFile, offset: int, count: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """``count`` items of ``dtype`` at byte ``offset`` of ``src``, as a fresh array."""
    out = np.empty(count, dtype=dtype)
    if count:
        src.read_into(offset, out)
    return out


class MegatronFile(Closing):
    """One Megatron indexed dataset, validated, as a ``TokenFile`` (see the module docstring).

    ``path`` may be the prefix or either file of the pair. Opening reads and checks the whole
    ``.idx`` in bounded chunks and the ``.bin``'s size; nothing is kept open afterwards, so
    ``close`` has nothing to release.
    """

    prefix: str
    idx_path: str
    bin_path: str
    path: str
    """The ``.bin`` file (the token stream's file, named in records, manifests and traces)."""
    dtype: np.dtype[np.integer[Any]]
    """The token type (little-endian), from the index's dtype code (``dtype_code``)."""
    dtype_code: int
    num_tokens: int
    """Tokens in the stream: the sum of the sequence lengths."""
    sequence_count: int
    document_count: int
    """Documents: the document index has one entry more."""
    multimodal: bool
    """Whether the index ends with sequence modes (all 0, text, once opened)."""

    def __init__(self, path: PathLike) -> None:
        self.prefix = megatron_prefix(path)
        self.idx_path = self.prefix + IDX_SUFFIX
        self.bin_path = self.prefix + BIN_SUFFIX
        self.path = self.bin_path
        _check_regular(self.idx_path, "index", self.prefix)
        _check_regular(self.bin_path, "data", self.prefix)
        try:
            bin_size = os.stat(self.bin_path).st_size
        except OSError as e:
            raise IngestError(f"{self.bin_path}: cannot stat: {e.strerror or e}") from e
        with SourceFile(self.idx_path) as src:
            self._read_header(src)
            self.num_tokens = self._check_sequences(src, bin_size) // self.dtype.itemsize
            self._check_document_index(src)

    # -- opening ----------------------------------------------------------------------------

    def _error(self, field: str, rule: str) -> IngestError:
        return IngestError(f"{self.idx_path}: field {field}: {rule}")

    def _read_header(self, src: SourceFile) -> None:
        size = src.size()
        if size < HEADER_BYTES:
            raise self._error(
                "header",
                f"expected at least {HEADER_BYTES} bytes (magic, version, dtype code, sequence "
                f"and document counts), got a {size}-byte file (truncated index)",
            )
        raw = _read(src, 0, HEADER_BYTES, np.dtype(np.uint8)).tobytes()
        magic, version, code, sequences, entries = HEADER.unpack(raw)
        if magic != MAGIC:
            hint = (
                " (the legacy non-mmap IndexedDataset index, 'TNTIDX'; rebuild the dataset "
                "with IndexedDatasetBuilder)"
                if magic.startswith(LEGACY_MAGIC)
                else ""
            )
            raise self._error("magic (bytes 0-8)", f"expected {MAGIC!r}, got {magic!r}{hint}")
        if version != VERSION:
            raise self._error("version (bytes 9-16)", f"expected {VERSION}, got {version}")
        if code in FLOAT_CODES:
            raise self._error(
                "dtype code (byte 17)",
                f"code {code} is {FLOAT_CODES[code]}; token ids are integers (Megatron writes "
                "them as uint16 or int32), so this dataset is not a token corpus",
            )
        if code not in TOKEN_DTYPES:
            known = ", ".join(f"{c} ({d.name})" for c, d in sorted(TOKEN_DTYPES.items()))
            raise self._error("dtype code (byte 17)", f"expected one of {known}, got {code}")
        base = HEADER_BYTES + ENTRY_BYTES * sequences + DOCUMENT_DTYPE.itemsize * entries
        if size != base and not (sequences and size == base + sequences):
            state = "truncated index" if size < base else "trailing bytes"
            modes = f" ({base + sequences} with sequence modes)" if sequences else ""
            if size == _FAIRSEQ_HEADER_BYTES + ENTRY_BYTES * sequences:
                state = (
                    "the layout of fairseq's MMapIndexedDataset, which has no document count "
                    "and no document index: not supported"
                )
            else:
                state += ", or corrupt counts"
            raise self._error(
                "size",
                f"sequence_count {sequences} and document_count {entries} need "
                f"{HEADER_BYTES} + {ENTRY_BYTES} * {sequences} + 8 * {entries} = {base} bytes"
                f"{modes}, got {size} ({state})",
            )
        if entries < 1:
            raise self._error(
                "document_count (bytes 26-33)",
                "expected at least 1 (the document index always holds its entry 0), got 0",
            )
        self.dtype = TOKEN_DTYPES[code]
        self.dtype_code = int(code)
        self.sequence_count = int(sequences)
        self.document_count = int(entries) - 1
        self.multimodal = size != base
        self._pointers_at = HEADER_BYTES + LENGTH_DTYPE.itemsize * sequences
        self._documents_at = HEADER_BYTES + ENTRY_BYTES * sequences
        self._modes_at = base

    def _check_sequences(self, src: SourceFile, bin_size: int) -> int:
        """Check lengths, pointers and modes chunk by chunk; return the sequences' bytes."""
        n, item, step = self.sequence_count, self.dtype.itemsize, INDEX_CHUNK_ENTRIES
        end = 0  # where the sequences so far end in the .bin, at most bin_size
        for s in range(0, n, step):
            k = min(step, n - s)
            lengths = _read(src, HEADER_BYTES + LENGTH_DTYPE.itemsize * s, k, LENGTH_DTYPE)
            lengths = lengths.astype(np.int64)
            bad = np.flatnonzero(lengths < 0)
            if bad.size:
                j = int(bad[0])
                raise self._error(
                    f"sequence_lengths[{s + j}]", f"expected >= 0 tokens, got {int(lengths[j])}"
                )
            ends = end + np.cumsum(lengths * item)
            starts = np.concatenate([np.full(1, end, np.int64), ends[:-1]])
            pointers = _read(src, self._pointers_at + POINTER_DTYPE.itemsize * s, k, POINTER_DTYPE)
            bad = np.flatnonzero(pointers != starts)
            if bad.size:
                j, i = int(bad[0]), s + int(bad[0])
                where = (
                    "the first sequence starts at byte 0"
                    if i == 0
                    else f"where sequence {i - 1} ends: sequence_pointers[{i - 1}] + "
                    f"sequence_lengths[{i - 1}] * {item}"
                )
                raise self._error(
                    f"sequence_pointers[{i}]",
                    f"expected {int(starts[j])} ({where}; every writer stores the sequences "
                    f"back to back), got {int(pointers[j])}",
                )
            past = np.flatnonzero(ends > bin_size)
            if past.size:
                j = int(past[0])
                raise IngestError(
                    f"{self.bin_path}: field size: sequence {s + j} of {self.idx_path} ends at "
                    f"byte {int(ends[j])}, past the end of the {bin_size}-byte data file "
                    "(truncated .bin, or not the .bin this index describes)"
                )
            if self.multimodal:
                modes = _read(src, self._modes_at + s, k, MODE_DTYPE)
                bad = np.flatnonzero(modes != 0)
                if bad.size:
                    j = int(bad[0])
                    raise self._error(
                        f"sequence_modes[{s + j}]",
                        f"expected 0 (text), got {int(modes[j])}: a multimodal dataset's other "
                        "sequences (images) do not hold token ids",
                    )
            end = int(ends[-1])
        if end != bin_size:
            raise IngestError(
                f"{self.bin_path}: field size: expected {end} bytes (where the last sequence of "
                f"{self.idx_path} ends), got {bin_size} ({bin_size - end} trailing bytes: not "
                "the .bin this index describes?)"
            )
        return end

    def _check_document_index(self, src: SourceFile) -> None:
        """Check the document index chunk by chunk: from 0, ascending, ending at S."""
        n, last = self.document_count + 1, self.sequence_count
        prev = 0
        for s in range(0, n, INDEX_CHUNK_ENTRIES):
            k = min(INDEX_CHUNK_ENTRIES, n - s)
            entries = _read(src, self._documents_at + 8 * s, k, DOCUMENT_DTYPE)
            if s == 0 and entries[0] != 0:
                raise self._error(
                    "document_index[0]",
                    f"expected 0 (the first document starts at sequence 0), got {int(entries[0])}",
                )
            before = np.concatenate([np.full(1, prev, np.int64), entries[:-1]])
            bad = np.flatnonzero((entries < before) | (entries > last))
            if bad.size:
                j, i = int(bad[0]), s + int(bad[0])
                v = int(entries[j])
                rule = (
                    f"expected at most sequence_count {last}, got {v}"
                    if v > last
                    else f"expected >= document_index[{i - 1}] = {int(before[j])} (documents "
                    f"in order), got {v}"
                )
                raise self._error(f"document_index[{i}]", rule)
            prev = int(entries[-1])
        if prev != last:
            raise self._error(
                f"document_index[{n - 1}]",
                f"expected sequence_count {last} (the last entry closes the last document), got "
                f"{prev} (sequences added after the last end_document(), or an index "
                "concatenated by an old merge_file_ that did not extend the document index)",
            )

    # -- TokenFile --------------------------------------------------------------------------

    def read_tokens(self, start: int, stop: int) -> npt.NDArray[np.integer[Any]]:
        """Tokens ``[start, stop)`` of the stream, one positioned read of the ``.bin``."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IngestError(
                f"{self.bin_path}: tokens [{start}, {stop}) are not within the file's "
                f"{self.num_tokens} tokens"
            )
        out = np.empty(stop - start, dtype=self.dtype)
        if out.size:
            with SourceFile(self.bin_path) as src:
                src.read_into(start * self.dtype.itemsize, out)
        return out

    def document_starts(self) -> I64Array:
        """The stream position of each document's first sequence: ``int64[document_count]``,
        ascending (built anew on each call; see the module docstring)."""
        out = np.empty(self.document_count, dtype=np.int64)
        prev = 0
        with SourceFile(self.idx_path) as src:
            for s in range(0, self.document_count, INDEX_CHUNK_ENTRIES):
                k = min(INDEX_CHUNK_ENTRIES, self.document_count - s)
                seqs = _read(src, self._documents_at + 8 * s, k, DOCUMENT_DTYPE)
                before = np.concatenate([np.full(1, prev, np.int64), seqs[:-1]])
                if bool(((seqs < before) | (seqs > self.sequence_count)).any()):
                    raise self._error(f"document_index[{s}:{s + k}]", _CHANGED)
                out[s : s + k] = self._sequence_starts(src, seqs)
                prev = int(seqs[-1])
        return out

    def _sequence_starts(self, src: SourceFile, seqs: I64Array) -> I64Array:
        """The stream position of each of ``seqs`` (ascending sequence indices in ``[0, S]``;
        ``S`` is the end of the stream), from the pointers."""
        item, total = self.dtype.itemsize, self.num_tokens * self.dtype.itemsize
        out = np.full(seqs.size, total, dtype=np.int64)
        inner = int(np.searchsorted(seqs, self.sequence_count))  # seqs[:inner] < S
        j = 0
        while j < inner:
            lo = int(seqs[j])
            e = int(np.searchsorted(seqs[:inner], lo + GATHER_ENTRIES, side="left"))
            hi = int(seqs[e - 1]) + 1
            pointers = _read(src, self._pointers_at + 8 * lo, hi - lo, POINTER_DTYPE)
            out[j:e] = pointers[seqs[j:e] - lo]
            j = e
        if bool(((out < 0) | (out > total) | (out % item != 0)).any()):
            raise self._error("sequence_pointers", _CHANGED)
        return out // item

    def side_files(self) -> list[str]:
        """The file read besides ``path``: the ``.idx`` (so that no output overwrites it)."""
        return [self.idx_path]

    def close(self) -> None:
        """Nothing to release: no descriptor is held between reads."""

    def __repr__(self) -> str:
        return (
            f"MegatronFile({self.prefix!r}, dtype={self.dtype.name}, "
            f"sequences={self.sequence_count}, documents={self.document_count}, "
            f"num_tokens={self.num_tokens})"
        )


def _has_magic(idx_path: str) -> bool:
    """Whether ``idx_path`` is a regular file starting with a Megatron index magic."""
    if not os.path.isfile(idx_path):
        return False
    try:
        with open(idx_path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError:
        return False
    return head == MAGIC or head.startswith(LEGACY_MAGIC)


def is_megatron(path: PathLike) -> bool:
    """Whether ``path`` names a Megatron dataset, for format detection (never raises).

    A path ending in ``.idx`` does by its name (except nanoGPT's ``.bos.idx``), so that a
    damaged index gets this format's error; a ``.bin`` does only when the ``.idx`` beside it
    starts with the Megatron magic (nanoGPT shards are ``.bin`` files too); any other path is
    taken as a prefix, which does when ``PREFIX.idx`` starts with the magic. A glob pattern is
    judged by its first match (or, when nothing matches it, as a pattern of prefixes). The
    legacy ``TNTIDX`` magic counts, so that opening it says why it cannot be read.
    """
    try:
        p = os.fspath(path)
        if glob.has_magic(p):
            matches = sorted(glob.glob(p)) or sorted(glob.glob(p + IDX_SUFFIX))
            if not matches:
                return False
            p = matches[0]
        if p.endswith(_NANOGPT_INDEX_SUFFIX):
            return False
        if p.endswith(IDX_SUFFIX):
            return True
        return _has_magic(megatron_prefix(p) + IDX_SUFFIX)
    except (OSError, TypeError, ValueError):
        return False


def expand_megatron(patterns: Patterns) -> list[str]:
    """Dataset prefixes from paths and glob patterns, each checked to have both files.

    An entry may be a prefix or either file of a pair; a glob pattern may match ``.idx`` or
    ``.bin`` files (both files of a pair give one prefix; nanoGPT's ``.bos.idx`` and other
    files are ignored) or prefixes (``pattern + ".idx"`` is matched too). One pattern gives its
    prefixes sorted; a sequence keeps the order given, each entry's prefixes sorted, as
    ``expand_paths`` does for other formats. A pattern that matches no dataset, a missing or
    irregular ``.idx`` or ``.bin`` (the error names it) and a dataset listed twice are
    ``IngestError``s.
    """
    items = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    if not items:
        raise IngestError("no Megatron datasets given")
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        pattern = os.fspath(item)
        if glob.has_magic(pattern):
            found = {
                megatron_prefix(m)
                for m in glob.glob(pattern)
                if m.endswith((IDX_SUFFIX, BIN_SUFFIX)) and not m.endswith(_NANOGPT_INDEX_SUFFIX)
            }
            found.update(m[: -len(IDX_SUFFIX)] for m in glob.glob(pattern + IDX_SUFFIX))
            prefixes = sorted(found)
            if not prefixes:
                raise IngestError(
                    f"{pattern}: no Megatron dataset (.idx or .bin file, or prefix) matches "
                    "this pattern"
                )
        else:
            prefixes = [megatron_prefix(pattern)]
        for prefix in prefixes:
            _check_regular(prefix + IDX_SUFFIX, "index", prefix)
            _check_regular(prefix + BIN_SUFFIX, "data", prefix)
            key = os.path.realpath(prefix + BIN_SUFFIX)
            if key in seen:
                raise IngestError(
                    f"{prefix}: Megatron dataset listed twice; it would be ingested twice"
                )
            seen.add(key)
            out.append(prefix)
    return out


__all__ = [
    "FLOAT_CODES",
    "MAGIC",
    "TOKEN_DTYPES",
    "MegatronFile",
    "expand_megatron",
    "is_megatron",
    "megatron_prefix",
]
