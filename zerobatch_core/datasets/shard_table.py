"""The shards of a dataset as a reader sees them, whichever manifest version describes them.

A version 1 manifest lists every shard: its table is in memory once the manifest is parsed. A
version 2 manifest names a shard index (``zerobatch_spec.index``, ``SPEC.md`` section 23): its
table reads the index's top at open (the shape, every shard's slot count as runs, the page
table) and a page of shard records the first time one of its shards is used, each checked
against its digest. Either way a reader gets the same three things: every shard's slot count
as one array (the order and slot lookups need nothing else), one shard's entry when it opens
the shard, and, for version 2, the digest of one shard's range of ``checksums.xxh3``, so that
a checked read fetches and checks only that range.

How bytes are read is the caller's: a local reader reads the index file, a remote one ranges
of the index object (``IndexSource``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import overload

import numpy as np
import numpy.typing as npt
from zerobatch_spec.dataset import (
    CHECKSUM_BYTES,
    CHECKSUMS_NAME,
    MANIFEST_VERSION_INDEXED,
    DatasetCode,
    DatasetViolation,
    Manifest,
    Shard,
    bytes_xxh3,
)
from zerobatch_spec.index import (
    HEAD_SIZE,
    IndexedShard,
    IndexTop,
    check_top,
    parse_page,
    parse_top,
    top_size,
)

from ..errors import DatasetError

TOP_READ = 64 << 10
"""Bytes of the index read at open in one request: the top of a dataset of up to about 170,000
shards (24 bytes per 64 shards), or the head that says how much more to read."""
PAGES_KEPT = 256
"""Pages of shard records kept parsed (least recently used out): 16,384 shards' entries."""
WINDOW = 1 << 20
"""Most bytes of pages read at once when a page is missing: the pages after it come along
(about 14,500 shards' records), so a rank that visits shards in random order, as a shuffled
order does, reads a 100,000-shard index in about a dozen requests however many steps it
takes."""
FIRST_WINDOW = 64 << 10
"""Bytes of the first window read after the first page; each later window doubles, up to
``WINDOW``, so that a rank's first steps read little of the index."""
WINDOWS_KEPT = 64
"""Windows of index bytes kept (least recently used out): 64 MiB, a 900,000-shard index."""

ReadHead = Callable[[int], tuple[bytes, int]]
"""``read_head(n)``: the index's first ``n`` bytes (fewer if it is shorter) and its size."""
ReadRange = Callable[[int, int], bytes]
"""``read_range(start, end)``: the index's bytes ``[start, end)``."""


class ShardTable:
    """Every shard's slot count, and each shard's entry on demand."""

    counts: npt.NDArray[np.int64]
    """Slot count of each shard, in dataset order."""
    firsts: npt.NDArray[np.int64]
    """Dataset slot of each shard's first slot, then the total (``len + 1`` values)."""

    def __len__(self) -> int:
        return int(self.counts.shape[0])

    def entry(self, shard: int) -> Shard:
        """Shard ``shard``'s entry (a version 2 table reads and checks its page first)."""
        raise NotImplementedError

    def checksums_xxh3(self, shard: int) -> str | None:
        """Digest of the shard's range of ``checksums.xxh3`` (version 2), or ``None``."""
        return None

    def entries(self) -> Iterator[Shard]:
        """Every shard's entry in dataset order (reads every page of an index)."""
        for i in range(len(self)):
            yield self.entry(i)

    def range_checksums(self, shard: int, where: str, read: ReadRange) -> npt.NDArray[np.uint64]:
        """Shard ``shard``'s slot checksums: its range of ``checksums.xxh3`` (read with
        ``read(start, end)`` from the file at ``where``), checked against the digest its
        index record gives (``SPEC.md`` 23.3), so that a checked read needs only that range.
        A range that cannot be read, is short or has another digest is ``checksums_mismatch``."""
        digest = self.checksums_xxh3(shard)
        start = int(self.firsts[shard]) * CHECKSUM_BYTES
        end = int(self.firsts[shard + 1]) * CHECKSUM_BYTES

        def fail(detail: str) -> DatasetError:
            violation = DatasetViolation(DatasetCode.CHECKSUMS_MISMATCH, CHECKSUMS_NAME, detail)
            return DatasetError(where, violation)

        try:
            data = read(start, end) if end > start else b""
        except OSError as e:  # missing, not a regular file, unreadable
            detail = "not found" if isinstance(e, FileNotFoundError) else f"unreadable: {e}"
            raise fail(detail) from None
        found = bytes_xxh3(data)
        if len(data) != end - start or found != digest:
            raise fail(
                f"bytes {start}..{end} (shard {shard}): {len(data)} read, xxh3 {found}; the "
                f"index says {end - start} bytes, xxh3 {digest}"
            )
        return np.frombuffer(data, dtype="<u8")


class ListedShards(ShardTable):
    """The shards a version 1 manifest lists."""

    def __init__(self, manifest: Manifest) -> None:
        self.shards = manifest.shards
        self.counts = np.fromiter(
            (s.num_batches for s in manifest.shards), np.int64, len(manifest.shards)
        )
        self.firsts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    def entry(self, shard: int) -> Shard:
        return self.shards[shard]

    def entries(self) -> Iterator[Shard]:
        return iter(self.shards)


class IndexedShards(ShardTable):
    """The shards a version 2 manifest's index lists, read as they are needed.

    ``where`` names the index in errors (its path or URL). Opening reads the top (``TOP_READ``
    bytes, then the rest of a larger top) and checks it against the manifest; ``entry`` reads
    and checks the page of a shard the first time one of its shards is asked for.
    """

    def __init__(
        self, manifest: Manifest, where: str, read_head: ReadHead, read_range: ReadRange
    ) -> None:
        assert manifest.version == MANIFEST_VERSION_INDEXED and manifest.index is not None
        self.where = where
        self._read_range = read_range
        head, size = read_head(TOP_READ)
        ref = manifest.index
        if size != ref.size:
            self._fail("index", f"{size} bytes, the manifest says {ref.size}")
        need = top_size(head) if len(head) >= HEAD_SIZE else None
        if need is not None and len(head) < need <= size:
            head += read_range(len(head), need)
        top = parse_top(head, size)
        if isinstance(top, DatasetViolation):
            raise DatasetError(where, top)
        mismatch = check_top(top, manifest)
        if mismatch is not None:
            raise DatasetError(where, mismatch)
        self.top: IndexTop = top
        # What the first read brought beyond the top (the first pages, or all of a small
        # index) serves those pages without another read.
        self._head = bytes(head)
        self.top_bytes = top.top_bytes
        self.counts = top.shard_batches()
        self.firsts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self._pages: OrderedDict[int, list[IndexedShard]] = OrderedDict()
        self._windows: OrderedDict[int, bytes] = OrderedDict()  # by first byte
        self._windows_read = 0
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()
        self.pages_read = 0
        """Reads of the index after its top (a window of pages each; for accounting and
        tests): pages that came with the top's read are not counted."""

    def _fail(self, where: str, detail: str) -> None:
        raise DatasetError(self.where, DatasetViolation(DatasetCode.INDEX_MISMATCH, where, detail))

    def _page(self, page: int) -> list[IndexedShard]:
        with self._lock:
            found = self._pages.get(page)
            if found is not None:
                self._pages.move_to_end(page)
                return found
        offset, length = int(self.top.pages[page, 0]), int(self.top.pages[page, 1])
        if offset + length <= len(self._head):
            data = self._head[offset : offset + length]
        else:
            data = self._window_bytes(page, offset, length)
        first = page * self.top.page_records
        parsed = parse_page(self.top, page, data, int(self.firsts[first]))
        if isinstance(parsed, DatasetViolation):
            raise DatasetError(self.where, parsed)
        with self._lock:
            self._pages[page] = parsed
            while len(self._pages) > PAGES_KEPT:
                self._pages.popitem(last=False)
        return parsed

    def _window_bytes(self, page: int, offset: int, length: int) -> bytes:
        """Page ``page``'s bytes (``offset``, ``length``), from a kept window of pages, or a
        new window read from this page on: the first read after the top is the page alone
        (a rank's first batch costs the top and one page), the next ``FIRST_WINDOW`` bytes,
        each later one twice the one before, up to ``WINDOW``. Misses read one at a time."""
        found = self._kept(offset, length)
        if found is not None:
            return found
        with self._read_lock:
            found = self._kept(offset, length)
            if found is not None:
                return found
            if not self.pages_read:
                start, end = offset, offset + length
            else:
                start, end = self._window_around(page, offset)
            data = self._read_range(start, end)
            with self._lock:
                self.pages_read += 1
                self._windows[start] = data
                while len(self._windows) > WINDOWS_KEPT:
                    self._windows.popitem(last=False)
        return data[offset - start : offset - start + length]

    def _window_around(self, page: int, offset: int) -> tuple[int, int]:
        """The next window to read for page ``page``: the whole pages that start in the
        aligned span of the window's size holding ``offset`` (the span doubles from
        ``FIRST_WINDOW`` with every window read, up to ``WINDOW``), this one included."""
        size = min(WINDOW, FIRST_WINDOW << min(self._windows_read, 16))
        self._windows_read += 1
        pages = self.top.pages
        span = (offset // size) * size
        first = min(page, int(np.searchsorted(pages[:, 0], span, side="left")))
        last = max(page, int(np.searchsorted(pages[:, 0], span + size, side="left")) - 1)
        return int(pages[first, 0]), int(pages[last, 0] + pages[last, 1])

    def _kept(self, offset: int, length: int) -> bytes | None:
        """The bytes ``offset .. offset + length`` from a kept window that holds them."""
        with self._lock:
            for start, data in self._windows.items():
                if start <= offset and offset + length <= start + len(data):
                    self._windows.move_to_end(start)
                    return data[offset - start : offset - start + length]
        return None

    def indexed(self, shard: int) -> IndexedShard:
        """Shard ``shard``'s record, its page read and checked if it was not."""
        if not 0 <= shard < len(self):
            raise IndexError(f"{self.where}: shard {shard} out of range for {len(self)}")
        page = self.top.page_of(shard)
        return self._page(page)[shard - page * self.top.page_records]

    def entry(self, shard: int) -> Shard:
        return self.indexed(shard).shard

    def checksums_xxh3(self, shard: int) -> str | None:
        return self.indexed(shard).checksums_xxh3


class LazyShards(Sequence[Shard]):
    """A table's shards as a sequence of entries, each read when it is asked for (what
    ``Manifest.shards`` is for a version 1 manifest, without reading every page up front)."""

    def __init__(self, table: ShardTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, i: int) -> Shard: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Shard]: ...

    def __getitem__(self, i: int | slice) -> Shard | Sequence[Shard]:
        if isinstance(i, slice):
            return [self.table.entry(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return self.table.entry(i)

    def __iter__(self) -> Iterator[Shard]:
        return self.table.entries()
