"""The shard index of a version 2 dataset: ``shards.zbi`` (``SPEC.md`` section 23).

A version 1 manifest lists every shard in JSON: about 166 bytes a shard, read whole and parsed
whole by every reader before its first batch. A version 2 manifest is a few hundred bytes
whatever the shard count, and names the *shard index*, a binary file laid out so that a reader
fetches what it needs and checks what it fetched:

- the **top** (the head, the runs and the page table), read at open: the dataset's shape, the
  slot count of every shard as *runs* (consecutive shards with equal slot counts: one or two
  runs for a dataset the sharded writer made, whatever its size), and where each *page* of
  shard records lies, with the page's digest. The manifest records the top's digest.
- the **pages**: up to ``page_records`` shard records each (their fields as version 1's shard
  entries, plus the digest of the shard's range of ``checksums.xxh3``), followed by those
  shards' names. A reader fetches and checks a page the first time it uses one of its shards.

Parsing functions return the parsed value or the first ``DatasetViolation``; they never raise
on hostile bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import xxhash

from .dataset import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    MAX_PREFIXES,
    DatasetCode,
    DatasetViolation,
    Manifest,
    Shard,
    is_shard_name,
    shard_file_name,
)
from .layout import DEFINED_DTYPES, DTYPE_NAMES, HEADER_SIZE, U32_MAX, U64_MAX, expected_file_size

INDEX_NAME: Final = "shards.zbi"
"""The name writers give the shard index."""
INDEX_MAGIC: Final = b"ZBSHARDS"
INDEX_VERSION: Final = 1
"""The index layout's own version (the manifest's ``version`` 2 names this layout)."""
PAGE_RECORDS: Final = 64
"""Shard records per page as writers choose them: a page of generated names is 4,608 bytes."""
MAX_PAGE_RECORDS: Final = 65536
"""Largest ``page_records`` a reader accepts (a page then reads at most 21 MiB)."""

FLAG_GENERATED_NAMES: Final = 1
"""Head flag: shard ``i`` is named ``shard_file_name(i, prefixes)`` and pages hold no names."""
RECORD_FLAG_RECORDS: Final = 1
"""Record flag: the shard's input record range is known (``records_first``, ``records_last``)."""

HEAD: Final = struct.Struct("<8sIIQQIIIIQQQI44sQ")
"""magic, version, flags, shard_count, num_batches, batch_size, seq_len, dtype, page_records,
seed, run_count, page_count, prefixes, reserved (44 zero bytes), top_xxh3."""
HEAD_SIZE: Final = HEAD.size
RUN: Final = struct.Struct("<QQ")
"""A run: ``shards`` consecutive shards of ``num_batches`` slots each."""
PAGE_ENTRY: Final = struct.Struct("<QQQ")
"""A page table entry: the page's offset in the file, its length, its XXH3-64."""
RECORD: Final = struct.Struct("<QQQQQQIIIIII")
"""num_batches, size, header_xxh3, checksums_xxh3, records_first, records_last, seed,
total_records, name_offset, name_length, flags, reserved."""
RECORD_SIZE: Final = RECORD.size

_RUN_DTYPE: Final = np.dtype([("shards", "<u8"), ("num_batches", "<u8")])
_PAGE_DTYPE: Final = np.dtype([("offset", "<u8"), ("length", "<u8"), ("xxh3", "<u8")])


@dataclass(frozen=True)
class IndexTop:
    """The parsed, checked top of an index: what a reader needs before its first batch."""

    flags: int
    shard_count: int
    num_batches: int
    batch_size: int
    seq_len: int
    dtype: int
    page_records: int
    seed: int
    runs: npt.NDArray[np.uint64]
    """``[run_count, 2]``: shards, then their slot count, per run."""
    pages: npt.NDArray[np.uint64]
    """``[page_count, 3]``: offset, length and XXH3-64 of each page."""
    top_bytes: int
    """Bytes of the top (head, runs, page table): what a reader reads at open."""
    xxh3: str
    """The top's digest, as the manifest's ``index.xxh3`` records it."""
    prefixes: int = 1
    """The key prefixes generated names spread over (the head's ``prefixes``, 0 read as 1)."""

    @property
    def generated_names(self) -> bool:
        """Whether shard ``i`` is named by the sharded writer's rule."""
        return bool(self.flags & FLAG_GENERATED_NAMES)

    def shard_batches(self) -> npt.NDArray[np.int64]:
        """Every shard's slot count, in dataset order (one array, no per-shard objects)."""
        return np.repeat(self.runs[:, 1], self.runs[:, 0].astype(np.int64)).astype(np.int64)

    def page_of(self, shard: int) -> int:
        """The page holding shard ``shard``'s record."""
        return shard // self.page_records


def top_size(head: bytes) -> int | None:
    """Bytes of the top announced by a head (``None`` for bytes too short or counts so large
    that no index could hold them); a reader that read less reads the rest."""
    if len(head) < HEAD_SIZE:
        return None
    fields = HEAD.unpack_from(head)
    runs, pages = int(fields[10]), int(fields[11])
    if runs > U64_MAX // RUN.size or pages > U64_MAX // PAGE_ENTRY.size:
        return None
    return HEAD_SIZE + runs * RUN.size + pages * PAGE_ENTRY.size


def _bad(where: str, detail: str) -> DatasetViolation:
    return DatasetViolation(DatasetCode.INDEX_MISMATCH, where, detail)


def parse_top(data: bytes, file_size: int) -> IndexTop | DatasetViolation:
    """The index's top from ``data`` (at least its first ``top_size`` bytes), checked on its
    own: magic, version, flags, ranges, runs that add up, and a page table that tiles the rest
    of a file of ``file_size`` bytes. The caller compares it with the manifest
    (``check_top``)."""
    if len(data) < HEAD_SIZE:
        return _bad("index", f"{len(data)} bytes, shorter than the {HEAD_SIZE}-byte head")
    (
        magic,
        version,
        flags,
        shard_count,
        num_batches,
        batch_size,
        seq_len,
        dtype,
        page_records,
        seed,
        run_count,
        page_count,
        prefixes,
        reserved,
        _top_xxh3,
    ) = HEAD.unpack_from(data)
    if magic != INDEX_MAGIC:
        return _bad("index.magic", f"expected {INDEX_MAGIC!r}, found {magic!r}")
    if version != INDEX_VERSION:
        return _bad(
            "index.version", f"this reader knows index version {INDEX_VERSION}, found {version}"
        )
    if flags & ~FLAG_GENERATED_NAMES:
        return _bad("index.flags", f"unknown flags {flags:#x}")
    if reserved != bytes(len(reserved)):
        return _bad("index.reserved", "reserved bytes are not zero")
    if prefixes == 1 or prefixes > MAX_PREFIXES:
        return _bad("index.prefixes", f"expected 0 or 2 to {MAX_PREFIXES}, found {prefixes}")
    if prefixes and not flags & FLAG_GENERATED_NAMES:
        return _bad("index.prefixes", f"{prefixes} prefixes in an index of listed names")
    if not 1 <= page_records <= MAX_PAGE_RECORDS:
        return _bad("index.page_records", f"expected 1 to {MAX_PAGE_RECORDS}, found {page_records}")
    if batch_size < 1 or seq_len < 1:
        return _bad(
            "index.batch_size", f"batch_size {batch_size} and seq_len {seq_len} must be >= 1"
        )
    if dtype not in DTYPE_NAMES:
        return _bad("index.dtype", f"expected a token dtype code ({DEFINED_DTYPES}), found {dtype}")
    if page_count != -(-shard_count // page_records):
        return _bad(
            "index.page_count",
            f"{page_count} pages for {shard_count} shards of {page_records} a page",
        )
    size = top_size(data)
    if size is None or size > file_size:
        return _bad("index.run_count", f"the top does not fit in the {file_size}-byte index")
    if len(data) < size:
        return _bad("index", f"{len(data)} bytes read, the top has {size}")
    digest = xxhash.xxh3_64_intdigest(data[: HEAD_SIZE - 8] + data[HEAD_SIZE:size])
    if digest != _top_xxh3:
        return _bad(
            "index.top_xxh3", f"the top's digest is {digest:016x}, the head says {_top_xxh3:016x}"
        )
    runs = np.frombuffer(data, _RUN_DTYPE, run_count, HEAD_SIZE)
    runs = (
        np.stack([runs["shards"], runs["num_batches"]], axis=1)
        if run_count
        else np.zeros((0, 2), np.uint64)
    )
    shards = [int(v) for v in runs[:, 0]] if run_count <= 1 << 16 else None
    if run_count and int(runs[:, 0].min()) == 0:
        return _bad("index.runs", "a run of 0 shards")
    total_shards = int(runs[:, 0].astype(object).sum()) if shards is None else sum(shards)
    if total_shards != shard_count:
        return _bad("index.runs", f"runs cover {total_shards} shards, shard_count is {shard_count}")
    total = int((runs[:, 0].astype(object) * runs[:, 1].astype(object)).sum()) if run_count else 0
    if total != num_batches:
        return _bad("index.runs", f"runs hold {total} slots, num_batches is {num_batches}")
    if run_count and int(runs[:, 1].max()) > U32_MAX:
        # A shard's slots are at most its total_records, a u32 (section 12.2).
        return _bad(
            "index.runs", f"a run's shards have {int(runs[:, 1].max())} slots each, above 2^32 - 1"
        )
    table = np.frombuffer(data, _PAGE_DTYPE, page_count, HEAD_SIZE + run_count * RUN.size)
    pages = (
        np.stack([table["offset"], table["length"], table["xxh3"]], axis=1)
        if page_count
        else np.zeros((0, 3), np.uint64)
    )
    at = size
    for p in range(page_count):
        offset, length = int(pages[p, 0]), int(pages[p, 1])
        records = min(page_records, shard_count - p * page_records)
        if offset != at or length < records * RECORD_SIZE or offset + length > file_size:
            return _bad(
                f"index.pages[{p}]",
                f"page at {offset} of {length} bytes: pages follow the top in order, each at "
                f"least its {records} records ({records * RECORD_SIZE} bytes), within the file",
            )
        at = offset + length
    if at != file_size:
        return _bad("index", f"{file_size} bytes, the top and pages end at {at}")
    return IndexTop(
        flags,
        shard_count,
        num_batches,
        batch_size,
        seq_len,
        dtype,
        page_records,
        seed,
        runs.astype(np.uint64),
        pages.astype(np.uint64),
        size,
        f"{_top_xxh3:016x}",
        max(prefixes, 1),
    )


def check_top(top: IndexTop, manifest: Manifest) -> DatasetViolation | None:
    """The first way a parsed top disagrees with the version 2 manifest that names it (its
    digest, then the shape, dtype, seed and counts the head repeats), or ``None``. The size
    is the caller's to compare (``manifest.index.size`` against the file's)."""
    if manifest.index is not None and top.xxh3 != manifest.index.xxh3:
        return _bad(
            "index.top_xxh3",
            f"the top's digest is {top.xxh3}, the manifest says {manifest.index.xxh3}",
        )
    found = (
        top.batch_size,
        top.seq_len,
        top.dtype,
        top.seed,
        top.shard_count,
        top.num_batches,
        top.prefixes,
    )
    want = (
        manifest.batch_size,
        manifest.seq_len,
        manifest.dtype,
        manifest.seed,
        manifest.shard_count,
        manifest.declared_batches,
        manifest.prefixes,
    )
    if found != want:
        return _bad(
            "index",
            f"(batch_size, seq_len, dtype, seed, shard_count, num_batches, prefixes) = {found}; "
            f"the manifest says {want}",
        )
    return None


def parse_page(
    top: IndexTop, page: int, data: bytes, first_slot: int
) -> list[IndexedShard] | DatasetViolation:
    """The shard records of page ``page`` from its bytes, checked against its digest, the
    runs' slot counts and each entry's own rules (12.2's agreement and the name rule).
    ``first_slot`` is the dataset slot of the page's first shard."""
    _, length, digest = (int(v) for v in top.pages[page])
    where = f"index.pages[{page}]"
    if len(data) != length:
        return _bad(where, f"{len(data)} bytes read, the page has {length}")
    found = xxhash.xxh3_64_intdigest(data)
    if found != digest:
        return _bad(where, f"its digest is {found:016x}, the page table says {digest:016x}")
    first = page * top.page_records
    count = min(top.page_records, top.shard_count - first)
    counts = shard_batches_range(top, first, first + count)
    out: list[IndexedShard] = []
    slot = first_slot
    for j in range(count):
        i = first + j
        (
            n,
            size,
            header,
            checksums,
            r_first,
            r_last,
            seed,
            total,
            name_off,
            name_len,
            flags,
            reserved,
        ) = RECORD.unpack_from(data, j * RECORD_SIZE)
        w = f"shards[{i}]"
        if flags & ~RECORD_FLAG_RECORDS or reserved:
            return _bad(f"{w}.flags", f"unknown flags {flags:#x} or reserved {reserved:#x}")
        if n != int(counts[j]):
            return _bad(f"{w}.num_batches", f"{n}, the runs say {int(counts[j])}")
        if top.generated_names:
            if name_len or name_off:
                return _bad(f"{w}.name", "a name in an index of generated names")
            name = shard_file_name(i, top.prefixes)
        else:
            start = name_off
            end = start + name_len
            if not count * RECORD_SIZE <= start <= end <= length:
                return _bad(f"{w}.name", f"name at {start}..{end} lies outside the page's names")
            raw = data[start:end]
            name = raw.decode("ascii", errors="replace")
            if not is_shard_name(name) or name in (MANIFEST_NAME, CHECKSUMS_NAME, INDEX_NAME):
                return _bad(f"{w}.name", f"not a shard name: {raw[:60]!r}")
        records = (r_first, r_last) if flags & RECORD_FLAG_RECORDS else None
        if total < n * top.batch_size:
            return _bad(
                f"{w}.total_records",
                f"{name}: total_records {total} < num_batches {n} * batch_size {top.batch_size}",
            )
        want = expected_file_size(top.batch_size, top.seq_len, n, top.dtype)
        if size != want:
            return _bad(
                f"{w}.size",
                f"{name}: size {size}, expected {HEADER_SIZE} + num_batches * slot bytes = {want}",
            )
        if records is not None and not (r_first <= r_last and r_last - r_first == total):
            return _bad(
                f"{w}.records",
                f"{name}: records [{r_first}, {r_last}] do not cover total_records {total}",
            )
        shard = Shard(name, n, seed, total, size, f"{header:016x}", records)
        out.append(IndexedShard(i, slot, shard, f"{checksums:016x}"))
        slot += n
    return out


def shard_batches_range(top: IndexTop, start: int, stop: int) -> npt.NDArray[np.int64]:
    """Slot counts of shards ``start .. stop - 1`` from the runs."""
    ends = np.cumsum(top.runs[:, 0].astype(np.int64))
    out = np.empty(stop - start, np.int64)
    run = int(np.searchsorted(ends, start, side="right"))
    i = start
    while i < stop:
        end = min(stop, int(ends[run]))
        out[i - start : end - start] = int(top.runs[run, 1])
        i, run = end, run + 1
    return out


@dataclass(frozen=True)
class IndexedShard:
    """A shard's record: its number, first dataset slot, entry and checksum-range digest."""

    number: int
    first_slot: int
    shard: Shard
    checksums_xxh3: str
    """XXH3-64 of the shard's ``8 * num_batches`` bytes of ``checksums.xxh3``."""


def runs_of(counts: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive equal slot counts as ``(shards, num_batches)`` runs, as writers write them."""
    runs: list[tuple[int, int]] = []
    for n in counts:
        if runs and runs[-1][1] == n:
            runs[-1] = (runs[-1][0] + 1, n)
        else:
            runs.append((1, int(n)))
    return runs


def build_index(
    shards: Sequence[Shard],
    checksums: bytes,
    *,
    batch_size: int,
    seq_len: int,
    dtype: int,
    seed: int,
    page_records: int = PAGE_RECORDS,
    range_digests: Sequence[int] | None = None,
    prefixes: int = 1,
) -> bytes:
    """The index's bytes for ``shards`` (in dataset order) and the dataset's checksums file.

    Names are written as generated (no names in the pages) when every shard's name is the
    sharded writer's for its number (``shard_file_name(i, prefixes)``); ``prefixes`` above 1
    requires that. ``range_digests``, if given, are the digests of each
    shard's range of the checksums file, and ``checksums`` is then not read (a caller that
    knows them without holding the file: ``zerobatch plan``'s model of a dataset).
    """
    if not 1 <= page_records <= MAX_PAGE_RECORDS:
        raise ValueError(f"page_records must be in [1, {MAX_PAGE_RECORDS}], got {page_records}")
    counts = [s.num_batches for s in shards]
    total = sum(counts)
    if range_digests is None and len(checksums) != total * 8:
        raise ValueError(f"{len(checksums)} bytes of checksums for {total} slots")
    if not 1 <= prefixes <= MAX_PREFIXES:
        raise ValueError(f"prefixes must be in [1, {MAX_PREFIXES}], got {prefixes}")
    generated = all(s.name == shard_file_name(i, prefixes) for i, s in enumerate(shards))
    if prefixes > 1 and not generated:
        raise ValueError(f"{prefixes} prefixes need the names shard_file_name(i, {prefixes}) gives")
    runs = runs_of(counts)
    page_count = -(-len(shards) // page_records)
    pages: list[bytes] = []
    slot = 0
    for p in range(page_count):
        group = shards[p * page_records : (p + 1) * page_records]
        records = bytearray()
        names = bytearray()
        name_base = len(group) * RECORD_SIZE
        for j, s in enumerate(group):
            if range_digests is not None:
                digest = int(range_digests[p * page_records + j])
            else:
                digest = xxhash.xxh3_64_intdigest(checksums[slot * 8 : (slot + s.num_batches) * 8])
            slot += s.num_batches
            raw = b"" if generated else s.name.encode("ascii")
            offset = name_base + len(names) if raw else 0
            names += raw
            known = s.records is not None
            r_first, r_last = s.records if s.records is not None else (0, 0)
            records += RECORD.pack(
                s.num_batches,
                s.size,
                int(s.header_xxh3, 16),
                digest,
                r_first,
                r_last,
                s.seed,
                s.total_records,
                offset,
                len(raw),
                RECORD_FLAG_RECORDS if known else 0,
                0,
            )
        pages.append(bytes(records + names))
    top_size_ = HEAD_SIZE + len(runs) * RUN.size + page_count * PAGE_ENTRY.size
    table = bytearray()
    at = top_size_
    for page in pages:
        table += PAGE_ENTRY.pack(at, len(page), xxhash.xxh3_64_intdigest(page))
        at += len(page)
    body = b"".join(RUN.pack(k, n) for k, n in runs) + bytes(table)
    fields = (
        INDEX_MAGIC,
        INDEX_VERSION,
        FLAG_GENERATED_NAMES if generated else 0,
        len(shards),
        total,
        batch_size,
        seq_len,
        dtype,
        page_records,
        seed,
        len(runs),
        page_count,
        prefixes if prefixes > 1 else 0,
        bytes(44),
    )
    head = HEAD.pack(*fields, 0)
    digest = xxhash.xxh3_64_intdigest(head[: HEAD_SIZE - 8] + body)
    head = HEAD.pack(*fields, digest)
    return head + body + b"".join(pages)


def iter_shards(top: IndexTop, data: bytes) -> Iterator[IndexedShard | DatasetViolation]:
    """Every shard of a whole index's bytes, page by page (validation and inspection); the
    first broken page ends the iteration with its violation."""
    slot = 0
    for p in range(top.pages.shape[0]):
        offset, length = int(top.pages[p, 0]), int(top.pages[p, 1])
        parsed = parse_page(top, p, data[offset : offset + length], slot)
        if isinstance(parsed, DatasetViolation):
            yield parsed
            return
        for entry in parsed:
            yield entry
            slot += entry.shard.num_batches
