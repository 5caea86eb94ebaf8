"""nanoGPT / modded-nanogpt ``.bin`` token shards as a record source.

Shard format (little-endian; written by nanoGPT's and modded-nanogpt's ``fineweb.py`` and by
nemo_automodel's ``tools/nanogpt_data_processor.py``)::

    int32[256] header
        header[0]  magic:      20240520 (legacy, tokens are uint16; header[3] unused)
                               278895051 (new; header[3] gives the token width)
        header[1]  version:    1
        header[2]  num_tokens: tokens that follow the header
        header[3]  itemsize:   bytes per token, 2 (uint16) or 4 (uint32); new magic only
    uint16|uint32[num_tokens] tokens

``BinShard`` checks every header field and that the file is exactly
``1024 + num_tokens * itemsize`` bytes (a shorter file is a truncated shard, a longer one is not
what the header describes). Tokens are read a few MiB at a time with positioned reads
(``SourceFile``), never memory-mapped and never whole: a shard truncated during a conversion gives
an ``IngestError`` naming it and the offset ("truncated while reading"), where a mapped read would
end the process with ``SIGBUS``.

``.bos.idx`` (optional, beside the shard: ``x.bin`` -> ``x.bos.idx``) is a bare
``int32[n_bos]`` array. Its entries are **token positions**: indices into the token array,
counted from the first token after the 1024-byte header, ascending, one per BOS token. The
nemo_automodel docstring (copied into our seed document) calls them "absolute byte positions
... in the .bin file", but no reader uses them that way:

- nemo_automodel's ``NanogptDataset`` (``nanogpt_dataset.py``, "copied from
  modded-nanogpt/data/bin_dataset.py") loads the file with ``np.fromfile(idx, dtype=np.int32)``
  and compares the entries with ``pos``, an index into the token tensor, then slices
  ``tokens[pos:pos + seq_len + 1]``: token positions.
- modded-nanogpt's own ``train_gpt.py`` writes no index; its ``BOSFinder`` computes
  ``(tokens == BOS_ID).nonzero()``, token positions again.
- Writers that were fixed or written against that reader store token units, e.g. a tokenizer
  tool writing ``bos_positions.append(token_count + len(batch_tokens))``, and a regression test
  of a nanogpt_data_processor fork titled "stores BOS positions in token units" expecting
  ``[0, 2]`` for tokens ``[9, 1, 9]``.
- The upstream ``BinaryDataWriter`` in ``tools/nanogpt_data_processor.py`` (NVIDIA-NeMo/
  Automodel) writes ``bin_fp.tell() + np.where(tokens == bos)[0]``: the *byte* offset of each
  write (header included) plus the *token* index within it. That is neither unit, does not
  match its own reader, and cannot be inverted without the write boundaries.

So ZeroBatch reads token positions, and validates the index before trusting it: every entry
must lie in ``[0, num_tokens)``, entries must be strictly increasing, and the token at each
must be the BOS token; otherwise an ``IngestError`` names the index file, the entry, the
position and the shard. An index from the buggy writer fails this check (its first entry is at
least 1024 and rarely a BOS); delete it or pass ``use_bos_index=False`` to scan instead.
Completeness (that no BOS token is missing from the index) is not checked: that needs the full
scan the index exists to avoid, and the reference readers trust it the same way. Checking the
tokens at the entries reads only the pieces of the shard that hold them. Without an index, BOS
positions come from a vectorised scan of the tokens, a few MiB at a time.

Records of ``seq_len`` tokens are cut from each shard on its own:

- ``align="contiguous"``: consecutive non-overlapping windows ``[i*T, (i+1)*T)``; the last
  ``num_tokens % T`` tokens of each shard are dropped.
- ``align="bos"`` (the seed's ``align_to_bos``): a record starts at the first BOS at or after
  the current position and takes ``T`` tokens; the next one starts at the first BOS at or after
  the end of this one; a record that would run past the end of the shard is dropped. The
  reference reader takes ``T + 1`` tokens for its input/label shift; an LLMBATCH record is the
  whole training sequence and the trainer shifts, so this takes exactly ``T``.

Records never straddle two shards. The reference readers (nemo_automodel's ``NanogptDataset``,
modded-nanogpt) never read across a shard boundary either, so the records match what they
train on; a shard's records depend on that shard alone, so counting is header arithmetic (or
per-shard BOS positions), shards can be processed independently and in any subset, and adding
or removing a shard does not shift the records of every later one; and the ``.bos.idx`` of a
shard only describes that shard. The cost is at most ``T - 1`` tokens per shard, negligible for
shards of ~10^8 tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..arguments import U32_MAX, int_arg
from ..errors import IngestError
from .records import I64Array, bos_record_starts, gather_records, locate_record
from .source import (
    Drop,
    PathLike,
    Patterns,
    SourceFile,
    U32Block,
    check_chunk_records,
    check_seq_len,
    expand_paths,
)

# nanoGPT's own shard format: these constants describe ``.bin`` shards, not LLMBATCH files.
HEADER_DTYPE: np.dtype[np.int32] = np.dtype("<i4")
"""Shard header words: little-endian int32."""
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * HEADER_DTYPE.itemsize
SHARD_TOKEN_DTYPES: dict[int, np.dtype[np.unsignedinteger[Any]]] = {
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
}
"""Shard token dtype for each token width ``header[3]`` may give, in bytes."""
BOS_INDEX_DTYPE: np.dtype[np.int32] = np.dtype("<i4")
"""``.bos.idx`` entries: little-endian int32 token positions."""
LEGACY_MAGIC = 20240520
"""Legacy ``fineweb.py`` shards: uint16 tokens, ``header[3]`` unused."""
MAGIC = 278895051
"""``nanogpt_data_processor.py`` shards: ``header[3]`` is the token width in bytes (2 or 4)."""
VERSION = 1
BOS_INDEX_SUFFIX = ".bos.idx"
SCAN_CHUNK_BYTES = 4 * 2**20
"""Bytes of tokens (or index entries) examined at once when scanning or validating."""
PIECE_BYTES = 64 * 2**10
"""Bytes read around each ``.bos.idx`` entry to check its token: entries in one piece share a
read, and a sparse index reads little of the shard."""

_LLMC_LLAMA3_MAGIC = 20240801
_INDEX_HINT = (
    " (.bos.idx entries must be token positions counted from the first token after the "
    "1024-byte header; delete the index or pass use_bos_index=False to scan the tokens)"
)

Align = Literal["contiguous", "bos"]
TokenArray = npt.NDArray[np.unsignedinteger[Any]]


def bos_index_path(path: PathLike) -> str:
    """The ``.bos.idx`` beside a shard: ``x.bin`` -> ``x.bos.idx`` (as nemo_automodel looks)."""
    return str(Path(path).with_suffix(BOS_INDEX_SUFFIX))


class BinShard:
    """One validated nanoGPT ``.bin`` shard, read with positioned reads.

    Opening reads only the 1024-byte header; ``read_tokens`` reads a range of tokens. With
    ``use_bos_index=False`` a ``.bos.idx`` beside the shard is ignored and BOS positions are
    always found by scanning.
    """

    def __init__(self, path: PathLike, *, use_bos_index: bool = True) -> None:
        self.path = os.fspath(path)
        self.use_bos_index = use_bos_index
        try:
            with open(self.path, "rb") as f:
                raw = f.read(HEADER_BYTES)
                self.file_size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise IngestError(f"{self.path}: cannot read shard: {e.strerror or e}") from e
        if len(raw) < HEADER_BYTES:
            raise IngestError(
                f"{self.path}: field header: expected at least {HEADER_BYTES} bytes "
                f"(int32[{HEADER_INTS}]), got a {self.file_size}-byte file (truncated shard)"
            )
        header = np.frombuffer(raw, dtype=HEADER_DTYPE)
        self.magic = int(header[0])
        self.version = int(header[1])
        self.num_tokens = int(header[2])
        if self.magic == LEGACY_MAGIC:
            self.itemsize = 2
        elif self.magic == MAGIC:
            self.itemsize = int(header[3])
        else:
            hint = " (llm.c's LLaMA-3 format)" if self.magic == _LLMC_LLAMA3_MAGIC else ""
            raise self._field_error(
                "magic (header[0])", f"{LEGACY_MAGIC} or {MAGIC}", f"{self.magic}{hint}"
            )
        if self.version != VERSION:
            raise self._field_error("version (header[1])", VERSION, self.version)
        if self.itemsize not in SHARD_TOKEN_DTYPES:
            raise self._field_error("itemsize (header[3])", "2 or 4 bytes per token", self.itemsize)
        if self.num_tokens < 0:
            raise self._field_error("num_tokens (header[2])", ">= 0", self.num_tokens)
        expected = HEADER_BYTES + self.num_tokens * self.itemsize
        if self.file_size != expected:
            state = "truncated shard" if self.file_size < expected else "trailing bytes"
            raise self._field_error(
                "num_tokens (header[2])",
                f"a file of {HEADER_BYTES} + {self.num_tokens} * {self.itemsize} = {expected} "
                f"bytes",
                f"{self.file_size} bytes ({state})",
            )
        self.dtype: np.dtype[np.unsignedinteger[Any]] = SHARD_TOKEN_DTYPES[self.itemsize]
        self._bos_cache: dict[int, I64Array] = {}

    def _field_error(self, field: str, expected: object, actual: object) -> IngestError:
        return IngestError(f"{self.path}: header field {field}: expected {expected}, got {actual}")

    def _open(self) -> SourceFile:
        """The shard for positioned reads of its tokens."""
        return SourceFile(self.path)

    def _read(self, src: SourceFile, start: int, out: TokenArray) -> None:
        """Tokens ``[start, start + out.size)`` into ``out`` (of ``self.dtype``)."""
        src.read_into(HEADER_BYTES + start * self.itemsize, out)

    def read_tokens(self, start: int = 0, stop: int | None = None) -> TokenArray:
        """Tokens ``[start, stop)`` (default: all) as a fresh uint16/uint32 array."""
        end = self.num_tokens if stop is None else min(stop, self.num_tokens)
        begin = min(max(start, 0), end)
        out = np.empty(end - begin, dtype=self.dtype)
        if out.size:
            with self._open() as src:
                self._read(src, begin, out)
        return out

    @property
    def bos_index_path(self) -> str:
        """Where this shard's ``.bos.idx`` is looked for (it need not exist)."""
        return bos_index_path(self.path)

    @property
    def has_bos_index(self) -> bool:
        """Whether a ``.bos.idx`` exists beside the shard and will be used."""
        return self.use_bos_index and os.path.isfile(self.bos_index_path)

    def _check_bos_token(self, bos_token: object) -> int:
        bos = int_arg("bos_token", bos_token, 0, U32_MAX, IngestError)
        top = int(np.iinfo(self.dtype).max)
        if bos > top:
            raise IngestError(
                f"{self.path}: bos_token {bos} cannot occur in a shard of {self.dtype.name} "
                f"tokens (at most {top})"
            )
        return bos

    def bos_positions(self, bos_token: int) -> I64Array:
        """Ascending token positions of ``bos_token``, from the validated ``.bos.idx`` or a scan.

        The result is cached per token and returned read-only.
        """
        bos = self._check_bos_token(bos_token)
        found = self._bos_cache.get(bos)
        if found is None:
            found = self._read_bos_index(bos) if self.has_bos_index else self._scan_bos(bos)
            found.flags.writeable = False
            self._bos_cache[bos] = found
        return found

    def _scan_bos(self, bos: int) -> I64Array:
        """BOS positions by comparing the tokens a chunk at a time (bounded memory)."""
        step = max(1, SCAN_CHUNK_BYTES // self.itemsize)
        target = self.dtype.type(bos)
        parts = [np.zeros(0, dtype=np.int64)]
        buf = np.empty(min(step, self.num_tokens), dtype=self.dtype)
        with self._open() as src:
            for s in range(0, self.num_tokens, step):
                chunk = buf[: min(step, self.num_tokens - s)]
                self._read(src, s, chunk)
                parts.append(np.flatnonzero(chunk == target).astype(np.int64) + s)
        return np.concatenate(parts)

    def _tokens_at(self, src: SourceFile, positions: I64Array) -> TokenArray:
        """The tokens at ``positions`` (each in ``[0, num_tokens)``, any order), reading only
        the ``PIECE_BYTES`` pieces of the shard that hold them."""
        out = np.empty(positions.size, dtype=self.dtype)
        if positions.size == 0:
            return out
        piece = max(1, PIECE_BYTES // self.itemsize)
        order = np.argsort(positions, kind="stable")
        ranked = positions[order]
        ids = ranked // piece
        cuts = np.flatnonzero(np.diff(ids)) + 1
        firsts = np.concatenate([[0], cuts]).tolist()
        ends = np.concatenate([cuts, [ranked.size]]).tolist()
        buf = np.empty(piece, dtype=self.dtype)
        for a, e in zip(firsts, ends, strict=True):
            lo = int(ranked[a])  # read from the first entry to the last of this piece
            chunk = buf[: int(ranked[e - 1]) - lo + 1]
            self._read(src, lo, chunk)
            out[order[a:e]] = chunk[ranked[a:e] - lo]
        return out

    def _read_bos_index(self, bos: int) -> I64Array:
        """The ``.bos.idx`` as int64 token positions, after checking every entry (see module)."""
        idx = self.bos_index_path
        where = f"{idx} (BOS index of {self.path})"
        entry = BOS_INDEX_DTYPE.itemsize
        with SourceFile(idx) as index:
            size = index.size()
            if size % entry:
                raise IngestError(
                    f"{where}: field size: expected a multiple of {entry} bytes (int32 "
                    f"entries), got {size}"
                )
            raw = np.empty(size // entry, dtype=BOS_INDEX_DTYPE)
            index.read_into(0, raw)
        pos = raw.astype(np.int64)
        n, target = self.num_tokens, self.dtype.type(bos)
        step = max(1, SCAN_CHUNK_BYTES // 8)
        with self._open() as src:
            for s in range(0, pos.size, step):  # one pass; the first bad entry is reported
                p = pos[s : s + step]
                prev = np.concatenate([pos[s - 1 : s] if s else np.full(1, -1, np.int64), p[:-1]])
                outside = (p < 0) | (p >= n)
                got = np.zeros(p.size, self.dtype)
                got[~outside] = self._tokens_at(src, p[~outside])
                bad = np.flatnonzero(outside | (p <= prev) | (got != target))
                if not bad.size:
                    continue
                j = int(bad[0])
                i, at = s + j, int(p[j])
                if outside[j]:
                    problem = f"position {at} is outside the shard's tokens [0, {n}){_INDEX_HINT}"
                elif at <= prev[j]:
                    problem = (
                        f"position {at} does not follow position {int(prev[j])}; expected "
                        f"strictly increasing token positions"
                    )
                else:
                    problem = (
                        f"token position {at} holds token {int(got[j])}, not the BOS token {bos}"
                        f"{_INDEX_HINT}"
                    )
                raise IngestError(f"{where}: entry {i}: {problem}")
        return pos

    def record_starts(
        self, seq_len: int, align: Align = "contiguous", bos_token: int | None = None
    ) -> I64Array:
        """Token position of each record this shard yields (see the module for the rules)."""
        t = check_seq_len(seq_len)
        if _check_align(align, bos_token) == "contiguous":
            return np.arange(self.num_tokens // t, dtype=np.int64) * t
        assert bos_token is not None  # checked by _check_align
        return bos_record_starts(self.bos_positions(bos_token), t, self.num_tokens)

    def count_records(
        self, seq_len: int, align: Align = "contiguous", bos_token: int | None = None
    ) -> int:
        """How many records this shard yields: header arithmetic, or its BOS positions."""
        t = check_seq_len(seq_len)
        if _check_align(align, bos_token) == "contiguous":
            return self.num_tokens // t
        return int(self.record_starts(t, align, bos_token).size)

    def iter_blocks(
        self,
        seq_len: int,
        align: Align = "contiguous",
        bos_token: int | None = None,
        chunk_records: int | None = None,
        *,
        starts: I64Array | None = None,
    ) -> Iterator[U32Block]:
        """This shard's records as ``uint32 [k, seq_len]`` blocks of ``chunk_records`` records.

        ``starts`` (from ``record_starts``) avoids recomputing BOS-aligned starts.
        """
        t = check_seq_len(seq_len)
        mode = _check_align(align, bos_token)
        k = check_chunk_records(chunk_records, t)
        if mode == "contiguous" and starts is None:
            return self._contiguous_blocks(t, k)
        if starts is None:
            starts = self.record_starts(t, mode, bos_token)
        return self._gathered_blocks(starts, t, k)

    def _contiguous_blocks(self, t: int, k: int) -> Iterator[U32Block]:
        n = self.num_tokens // t
        with self._open() as src:
            for r0 in range(0, n, k):
                rows = np.empty((min(r0 + k, n) - r0, t), dtype=self.dtype)
                self._read(src, r0 * t, rows)
                yield rows.astype(np.uint32, copy=False)  # ``rows`` is this block's own

    def _gathered_blocks(self, starts: I64Array, t: int, k: int) -> Iterator[U32Block]:
        """Records of ``t`` tokens at ``starts`` (ascending, non-overlapping), read a window
        (``SCAN_CHUNK_BYTES`` of tokens) at a time (``records.gather_records``)."""
        if starts.size == 0:
            return
        window = max(t, SCAN_CHUNK_BYTES // self.itemsize)
        buf = np.empty(window, dtype=self.dtype)
        with self._open() as src:

            def read(lo: int, hi: int) -> TokenArray:
                chunk = buf[: hi - lo]
                self._read(src, lo, chunk)
                return chunk

            yield from gather_records(starts, t, k, window, read)

    def __repr__(self) -> str:
        return (
            f"BinShard({self.path!r}, magic={self.magic}, num_tokens={self.num_tokens}, "
            f"dtype={self.dtype.name})"
        )


ShardLike = PathLike | BinShard
Shards = ShardLike | Sequence[ShardLike]
"""A glob pattern or path, a ``BinShard``, or a sequence of them."""


def _check_align(align: object, bos_token: object) -> Align:
    if align == "contiguous":
        return "contiguous"
    if align == "bos":
        if bos_token is None:
            raise IngestError("align='bos' needs bos_token, the token id that starts a document")
        int_arg("bos_token", bos_token, 0, U32_MAX, IngestError)
        return "bos"
    raise IngestError(f"align must be 'contiguous' or 'bos', got {align!r}")


def expand_shards(patterns: Patterns) -> list[str]:
    """Shard paths from a glob pattern or path, or a sequence of them (see ``expand_paths``).

    One pattern gives its matches sorted; a sequence keeps its order. Nothing matching, a
    missing file and a shard listed twice are ``IngestError``s.
    """
    return expand_paths(patterns, what="shard")


def _resolve(shards: Shards) -> list[BinShard | str]:
    """Paths expanded (not yet opened: one shard is read at a time), ``BinShard``s kept."""
    if isinstance(shards, (BinShard, str, os.PathLike)):
        shards = [shards]
    out: list[BinShard | str] = []
    seen: set[str] = set()
    for item in shards:
        items: list[BinShard | str] = (
            [item] if isinstance(item, BinShard) else list(expand_shards(item))
        )
        for s in items:
            key = os.path.realpath(s.path if isinstance(s, BinShard) else s)
            if key in seen:
                name = s.path if isinstance(s, BinShard) else s
                raise IngestError(f"{name}: shard file listed twice; it would be ingested twice")
            seen.add(key)
            out.append(s)
    if not out:
        raise IngestError("no shard files given")
    return out


def _open(shard: BinShard | str, use_bos_index: bool) -> BinShard:
    return shard if isinstance(shard, BinShard) else BinShard(shard, use_bos_index=use_bos_index)


def count_records(
    shards: Shards,
    seq_len: int,
    align: Align = "contiguous",
    bos_token: int | None = None,
    *,
    use_bos_index: bool = True,
) -> int:
    """How many records ``iter_records`` yields for the same arguments.

    Contiguous mode reads only the headers; BOS mode needs each shard's BOS positions (its
    validated ``.bos.idx``, or a scan).
    """
    t = check_seq_len(seq_len)
    mode = _check_align(align, bos_token)
    return sum(_open(s, use_bos_index).count_records(t, mode, bos_token) for s in _resolve(shards))


def iter_records(
    shards: Shards,
    seq_len: int,
    align: Align = "contiguous",
    bos_token: int | None = None,
    chunk_records: int | None = None,
    *,
    use_bos_index: bool = True,
) -> Iterator[U32Block]:
    """Yield the shards' records, shard by shard, as ``uint32 [k, seq_len]`` blocks.

    Blocks hold at most ``chunk_records`` records (default: about 4 MiB) and never mix two
    shards. Arguments are checked, and patterns expanded, before the first block is asked for;
    shards are opened (and their headers checked) one at a time as the iteration reaches them.
    """
    t = check_seq_len(seq_len)
    mode = _check_align(align, bos_token)
    k = check_chunk_records(chunk_records, t)
    resolved = _resolve(shards)

    def blocks() -> Iterator[U32Block]:
        for s in resolved:
            yield from _open(s, use_bos_index).iter_blocks(t, mode, bos_token, k)

    return blocks()


class NanoGPTSource:
    """nanoGPT shards as a ``RecordSource``: ``num_records`` and ``iter_blocks()``.

    Patterns are expanded at construction. ``num_records`` is computed on first use and cached;
    in BOS mode that finds every shard's record starts, which are kept (8 bytes per record) so
    that ``iter_blocks`` does not scan the shards a second time.
    """

    def __init__(
        self,
        shards: Shards,
        seq_len: int,
        align: Align = "contiguous",
        bos_token: int | None = None,
        chunk_records: int | None = None,
        *,
        use_bos_index: bool = True,
    ) -> None:
        self._seq_len = check_seq_len(seq_len)
        self.align = _check_align(align, bos_token)
        self.bos_token = bos_token
        self.chunk_records = check_chunk_records(chunk_records, self._seq_len)
        self.use_bos_index = use_bos_index
        self._shards = _resolve(shards)
        self._count: int | None = None
        self._starts: list[I64Array] | None = None

    @property
    def shards(self) -> list[str]:
        """The shard paths, in the order their records are yielded."""
        return [s.path if isinstance(s, BinShard) else s for s in self._shards]

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        return self._seq_len

    @property
    def num_records(self) -> int:
        """Records ``iter_blocks`` yields (computed once; see the class docstring)."""
        if self._count is None:
            t, mode, bos = self._seq_len, self.align, self.bos_token
            if mode == "contiguous":
                self._count = sum(
                    _open(s, self.use_bos_index).count_records(t) for s in self._shards
                )
            else:
                self._starts = [
                    _open(s, self.use_bos_index).record_starts(t, mode, bos) for s in self._shards
                ]
                self._count = sum(int(s.size) for s in self._starts)
        return self._count

    def iter_blocks(self) -> Iterator[U32Block]:
        """Every record once, shard by shard, as ``uint32 [k, seq_len]`` blocks."""
        for i, s in enumerate(self._shards):
            starts = None if self._starts is None else self._starts[i]
            shard = _open(s, self.use_bos_index)
            yield from shard.iter_blocks(
                self._seq_len, self.align, self.bos_token, self.chunk_records, starts=starts
            )

    @property
    def source_tokens(self) -> int:
        """Tokens in all the shards (from their headers)."""
        return sum(_open(s, self.use_bos_index).num_tokens for s in self._shards)

    def input_dtypes(self) -> list[np.dtype[Any]]:
        """The token dtype of each shard, from its header (uint16 or uint32)."""
        return [_open(s, self.use_bos_index).dtype for s in self._shards]

    def locate(self, record: int, token: int) -> str:
        """The shard holding token ``token`` of the stream's record ``record``, and the
        token's position in the shard (an error path: BOS-aligned starts may be recomputed)."""
        t, mode, bos = self._seq_len, self.align, self.bos_token

        def files() -> Iterator[tuple[str, I64Array]]:
            for i, s in enumerate(self._shards):
                shard = _open(s, self.use_bos_index)
                cached = None if self._starts is None else self._starts[i]
                yield shard.path, shard.record_starts(t, mode, bos) if cached is None else cached

        return locate_record(files(), record, token, "shard")

    def drops(self) -> list[Drop]:
        """Shard tokens that no record holds, and why (see the module docstring)."""
        tokens = self.source_tokens - self.num_records * self._seq_len
        if not tokens:
            return []
        if self.align == "contiguous":
            detail = (
                f"the last num_tokens % {self._seq_len} tokens of each shard (records never "
                f"span shards)"
            )
            return [Drop("shard_tails", 0, tokens, detail)]
        detail = (
            f"tokens outside the records that start at a BOS token ({self.bos_token}): before "
            f"each shard's first BOS, from each record's end to the next BOS, and at each "
            f"shard's end"
        )
        return [Drop("bos_alignment", 0, tokens, detail)]

    def __repr__(self) -> str:
        return (
            f"NanoGPTSource({len(self._shards)} shards, seq_len={self._seq_len}, "
            f"align={self.align!r})"
        )
