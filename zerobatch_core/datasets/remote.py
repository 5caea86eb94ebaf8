"""``RemoteSource``: an LLMBATCH file or dataset in a store, read with byte-range requests.

The loader asks its source for *regions*: rows ``r0..r1`` and columns ``lo..hi`` of one stored
batch (``BatchNativeLoader._read_region``). A local reader slices its mapping; this source
fetches exactly those bytes: one range per row, or one range for whole rows, merged when close
together and issued concurrently. The loader also hands it the coming steps
(``BatchNativeLoader._ahead``), and the source keeps fetching them on a thread pool up to
``prefetch_bytes`` ahead of the training loop, so a rank's reads overlap its steps and a rank
of ``D x C`` fetches its ``1 / (D x C)`` share of every step, nothing else. Byte ranges are
computed with the source's token size (``token_dtype``: the header's, the manifest's or the
live descriptor's dtype), so a uint16 source's rank fetches half the bytes of a uint32 one's
for the same tokens, and its arrays are uint16.

**Opening** reads the manifest only (a dataset: ``manifest.json``) or the header and size (a
file). A shard is checked against the manifest at its first use, as ``DatasetReader`` does
(``SPEC.md`` section 13, rules 7-10: its size, then its header).

**Verification** (``verify``). A slot's checksum covers the whole slot, so it can be checked
only by a reader that fetches the whole slot:

* ``"whole"`` (the default for remote data): every fetch that covers a whole slot is checked
  before it is served (one rank, no context parallelism, whole stored batches per step). A
  single rank whose steps are smaller than a slot (``global_batch_size`` below the stored
  batch size, no context parallelism) reads every row of each slot over consecutive steps:
  its loader sets ``whole_rows``, and the slot is fetched whole once, checked, and its rows
  served from it, step by step, without fetching anything twice. A fetch of part of a slot
  by a rank that shares the slot with others (data or context parallelism, or a worker
  process serving only some of a rank's steps) cannot be checked and is served as fetched:
  TLS and the stores' own transfer checksums protect it in transit.
* ``"first"``: the first read of each slot by this reader fetches the *whole slot* and checks
  it, even if only part of it is needed (a ``D x C`` rank then fetches ``D x C`` times its
  share once per slot); later reads of the slot fetch only the region.
* ``"always"``: every read fetches and checks the whole slot.
* ``"off"``: nothing is checked.

A slot that fails its check raises ``DatasetError`` (``checksum_mismatch``) and is never
served. Single files carry no checksums, so for them only the header rules apply.

An optional local cache (``cache_dir``, ``cache_bytes``: ``range_cache.RangeCache``) keeps
fetched ranges of batch objects, which never change once written, on local disk, named by the
object's URL and the source's ``content_tag`` (the manifest's digest, a file's header digest
and size): one cache directory can serve datasets at the same URL on several endpoints, or a
dataset rewritten in place, without serving one's bytes for another's.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt
import xxhash
from zerobatch_spec import (
    DTYPE_NAMES,
    DTYPE_UINT32,
    HEADER_SIZE,
    Header,
    Violation,
    check_header,
    padded_batch_bytes,
    token_dtype,
)
from zerobatch_spec.dataset import (
    CHECKSUM_BYTES,
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    DatasetCode,
    DatasetViolation,
    Manifest,
    bytes_xxh3,
    header_xxh3,
    parse_manifest,
)

from ..closing import Closing
from ..errors import FormatError
from ..files.reader import file_identity
from ..order import BlockOrder, Order, sharded_order
from ..redaction import redact
from ..stores.range_cache import RangeCache
from ..stores.resolve import open_store
from ..stores.store import Store, split_url
from .dataset import DatasetError
from .shard_table import IndexedShards, LazyShards

RemoteVerify = Literal["off", "whole", "first", "always"]
REMOTE_VERIFY_MODES: tuple[RemoteVerify, ...] = ("off", "whole", "first", "always")
DEFAULT_PREFETCH_BYTES = 64 * 1024 * 1024
"""Bytes of coming steps fetched ahead of the loop by default."""
DEFAULT_THREADS = 16
"""Concurrent fetches (each may itself be several range requests)."""
MAX_AHEAD = 1024
"""Steps planned ahead at most, however small they are."""
FIRST_AHEAD = 2
"""Steps planned ahead of a pass's first step; the depth doubles with every step served (up to
``MAX_AHEAD``, within ``prefetch_bytes``), so that what a rank fetches before its first batch
is its first steps and what they need, not a thousand steps' shards and their metadata."""

U32Array = npt.NDArray[np.uint32]
Region = tuple[int, int, int, int, int]  # stored index, first row, end row, first column, end
S = TypeVar("S")


@dataclass
class BatchObject:
    """One LLMBATCH object of a source and what the manifest says about it.

    ``first`` is the source slot of its slot 0. ``size``, ``seed``, ``total_records`` and
    ``header_xxh3`` are ``None`` when nothing describes them (a single file).
    """

    key: str
    first: int
    num_batches: int
    size: int | None = None
    seed: int | None = None
    total_records: int | None = None
    header_xxh3: str | None = None
    checksums: tuple[str, ...] | None = None


class RemoteSource(Closing):
    """A file or dataset in a store, with the surface the loader uses (see the module docstring).

    ``source`` is a URL (``s3://bucket/data``, ``gs://...``, ``az://...``, ``http(s)://...``,
    ``file://...``), a path, or ``(store, key)``: a ``Store`` and the key of a file in it, or
    ``""`` for a dataset at the store's root. A URL whose ``manifest.json`` exists is a
    dataset, any other a file.
    """

    def __init__(
        self,
        source: str | tuple[Store, str],
        *,
        verify: RemoteVerify | None = None,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        threads: int = DEFAULT_THREADS,
        cache_dir: str | None = None,
        cache_bytes: int = 0,
        store_options: dict[str, str] | None = None,
        coalesce: int = 0,
    ) -> None:
        mode = "whole" if verify is None else verify
        if mode not in REMOTE_VERIFY_MODES:
            raise ValueError(f"verify must be one of {REMOTE_VERIFY_MODES}, got {verify!r}")
        if isinstance(prefetch_bytes, bool) or not isinstance(prefetch_bytes, int):
            raise ValueError(f"prefetch_bytes must be an integer, got {prefetch_bytes!r}")
        self.verify: RemoteVerify = mode
        self.prefetch_bytes = max(0, prefetch_bytes)
        self.coalesce = max(0, int(coalesce))
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="zb-get")
        self._pending: dict[Region, Future[U32Array]] = {}
        self._verified: set[int] = set()
        self._checked: set[int] = set()
        self._object_locks: dict[int, threading.Lock] = {}
        self._checksums: npt.NDArray[np.uint64] | None = None
        self._checksums_lock = threading.Lock()
        self._slots: OrderedDict[int, Future[U32Array]] = OrderedDict()
        self.whole_rows = False
        """Whether the reader reads every row of each slot it touches, in order (one rank, no
        context parallelism: set by the loader). Under ``"whole"``, a fetch of whole rows then
        fetches, checks and keeps the whole slot, and serves the rows from it."""
        self.cache = RangeCache(cache_dir, cache_bytes) if cache_dir else None
        self.manifest: Manifest | None = None
        self.header: Header | None = None
        self.dtype = DTYPE_UINT32
        """Token dtype code of every object (the file's header, the manifest's or the live
        descriptor's ``dtype``), set when the source is opened."""
        self.content_tag = ""
        """What the cache names entries by besides the object's URL: the manifest's digest of
        a dataset, the header's and the size of a file, a live dataset's id. The same URL on
        another endpoint, or a dataset rewritten in place, has another tag, so a shared cache
        directory never serves one's bytes for the other's."""
        self._closed = False
        try:
            if isinstance(source, tuple):
                self.store, key = source
                self.path = self.store.where(key) if key else self.store.url
            else:
                self._url = source  # as given, credentials included: only for reopening
                # Shown in messages: a URL without user information, a path as given.
                self.path = redact(source) if "://" in source else source
                self.store, key = self._locate(source, store_options)
            self._objects: list[BatchObject] = []
            self._firsts: list[int] = [0]
            # A version 2 dataset's shards, read from its index as they are used (its objects
            # are made on demand, so nothing per shard exists for shards never read).
            self.table: IndexedShards | None = None
            self._indexed: dict[int, BatchObject] = {}
            self._range_sums: dict[int, npt.NDArray[np.uint64]] = {}
            self._open(key)
        except BaseException:
            self._pool.shutdown(wait=False)
            raise
        self.bytes_read = 0
        """Bytes of slot data this source has served (for accounting and tests)."""

    def _locate(self, url: str, options: dict[str, str] | None) -> tuple[Store, str]:
        """The store and key of ``url``: its own root for a dataset, its parent for a file."""
        store = open_store(url, options=options)
        if store.exists(MANIFEST_NAME):
            return store, ""
        parent, name = split_url(url)
        store.close()
        return open_store(parent, options=options), name

    def _open(self, key: str) -> None:
        """Read the manifest (a dataset) or the header (a file)."""
        if not key:
            self._open_dataset()
            return
        prefix, size = self.store.read_head(key, HEADER_SIZE)
        checked = check_header(prefix, size)
        if isinstance(checked, Violation):
            raise FormatError(self.path, checked)
        self.header = checked
        self.content_tag = f"file {header_xxh3(prefix[:HEADER_SIZE])} {size}"
        self._set_shape(checked.batch_size, checked.seq_len, checked.seed, checked.dtype)
        self._add(BatchObject(key, 0, checked.num_batches, size))
        self._checked.add(0)

    def _open_dataset(self) -> None:
        data = self.store.read(MANIFEST_NAME)
        parsed = parse_manifest(data)
        if isinstance(parsed, DatasetViolation):
            raise DatasetError(self.store.where(MANIFEST_NAME), parsed)
        self.manifest = parsed
        self.manifest_sha256 = hashlib.sha256(data).hexdigest()
        self.content_tag = f"dataset {self.manifest_sha256}"
        self._set_shape(parsed.batch_size, parsed.seq_len, parsed.seed, parsed.dtype)
        if parsed.index is not None:
            self._open_index(parsed)
            return
        first = 0
        for s in parsed.shards:
            entry = BatchObject(
                s.name, first, s.num_batches, s.size, s.seed, s.total_records, s.header_xxh3
            )
            self._add(entry)
            first += s.num_batches

    def _open_index(self, manifest: Manifest) -> None:
        """A version 2 dataset: the index's top (one request of ``TOP_READ`` bytes, or two
        for a larger top), checked against the manifest; pages are read as shards are used."""
        assert manifest.index is not None
        key = manifest.index.name
        where = self.store.where(key)

        def read_head(n: int) -> tuple[bytes, int]:
            return self.store.read_head(key, n)

        def read_range(start: int, end: int) -> bytes:
            return self.store.read_ranges(key, [(start, end)])[0]

        try:
            self.table = IndexedShards(manifest, where, read_head, read_range)
        except FileNotFoundError:
            violation = DatasetViolation(DatasetCode.INDEX_MISSING, "index", "not found")
            raise DatasetError(where, violation) from None
        self.manifest = replace(manifest, shards=LazyShards(self.table))
        self._firsts = [0, int(self.table.firsts[-1])]  # bounds only: ``locate`` searches

    def _set_shape(self, batch_size: int, seq_len: int, seed: int, dtype: int) -> None:
        """The shape, seed and token dtype every object of the source has; the byte sizes of a
        slot and of a token follow from them (a uint16 slot is half a uint32 one, padding
        aside, so a rank fetches half the bytes for the same tokens)."""
        self._shape = (batch_size, seq_len, seed)
        self.dtype = dtype
        self._token_dtype = token_dtype(dtype)
        self._token_bytes = self._token_dtype.itemsize
        self._slot_bytes = padded_batch_bytes(batch_size, seq_len, dtype)

    def _add(self, entry: BatchObject) -> None:
        """Append an object whose slots follow the last one's."""
        self._objects.append(entry)
        self._firsts.append(entry.first + entry.num_batches)

    # -- shape -------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Records per slot."""
        return self._shape[0]

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        return self._shape[1]

    @property
    def seed(self) -> int:
        """The file's or dataset's seed: the loader's default order seed."""
        return self._shape[2]

    @property
    def num_batches(self) -> int:
        """Slots over all objects."""
        return self._firsts[-1]

    @property
    def is_dataset(self) -> bool:
        """Whether this is a dataset (its identity is its manifest's), not a single file."""
        return self.manifest is not None

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def __len__(self) -> int:
        return self.num_batches

    @property
    def token_dtype(self) -> np.dtype[np.unsignedinteger]:
        """NumPy dtype of the stored tokens: what ``read_region`` arrays have."""
        return self._token_dtype

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot, padding included."""
        return self._slot_bytes

    def order(self, block_size: int, seed: int, shuffle: bool) -> Order:
        """The serving order: a dataset's (``SPEC.md`` section 14) or a file's (section 8)."""
        if self.manifest is None:
            return BlockOrder(self.num_batches, block_size, seed, shuffle)
        if self.table is not None:
            return sharded_order(self.table.counts, block_size, seed, shuffle)
        return sharded_order(self.manifest.shard_batches, block_size, seed, shuffle)

    def identity(self) -> dict[str, Any]:
        """The identity a local copy has in loader states, so a state saved on a local copy
        loads here and the other way round: a dataset's manifest digest, as ``DatasetReader``
        gives it, or a file's fingerprint (``files.reader.file_identity``)."""
        if self.manifest is None:
            assert self.header is not None  # a file: opening read its header
            return file_identity(self.header, self.read_batch)
        return {"dataset": self.manifest_sha256}

    def locate(self, index: int) -> tuple[int, int]:
        """``(object number, slot within it)`` of slot ``index``."""
        if not self._firsts[0] <= index < self._firsts[-1]:
            index = self._missing(index)
        if self.table is not None:
            firsts = self.table.firsts
            n = int(np.searchsorted(firsts, index, side="right")) - 1
            return n, index - int(firsts[n])
        n = bisect.bisect_right(self._firsts, index) - 1
        return n, index - self._firsts[n]

    def _missing(self, index: int) -> int:
        """Called for a slot outside the known objects: raise (a live source waits instead)."""
        raise IndexError(f"{self.path}: slot {index} out of range for {self.num_batches}")

    # -- the loader's surface (``delivery.sources.BatchSource``) ----------------------------
    fetches = True
    """Reads are fetches: the loader converts on its own thread and announces regions ahead."""

    def view_batches(self, start: int, stop: int) -> None:
        """``None``: slots are fetched, never views of a mapping."""
        return None

    def slot_file(self, index: int) -> None:
        """``None``: no local file holds the slots."""
        return None

    def read_ahead(self, start: int, stop: int) -> None:
        """Nothing: a remote source fetches the regions the loader announces (``ahead``)."""

    def check_size(self, index: int = 0) -> None:
        """Nothing to check: objects are checked at their first use and never mapped."""

    def read_batch(self, index: int) -> U32Array:
        """Slot ``index`` as a read-only ``[batch_size, seq_len]`` array of the stored tokens
        (``token_dtype``; fetched whole)."""
        return self.read_region(index, 0, self.batch_size, 0, self.seq_len)

    def read_region(self, index: int, r0: int, r1: int, lo: int, hi: int) -> U32Array:
        """Rows ``r0..r1``, columns ``lo..hi`` of slot ``index`` (read-only, ``token_dtype``),
        from the prefetched fetch of that region if there is one, else fetched now."""
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        region = (index, r0, r1, lo, hi)
        with self._lock:
            future = self._pending.pop(region, None)
        out = future.result() if future is not None else self._fetch(region)
        self.bytes_read += out.nbytes
        return out

    def ahead(
        self,
        steps: Iterator[S],
        regions: Callable[[S], Sequence[Region]],
        *,
        whole_rows: bool | None = None,
    ) -> Iterator[S]:
        """``steps`` unchanged, each step's ``regions`` fetched in the background first, up to
        ``prefetch_bytes`` ahead of the one the caller is at (at least one step ahead; a pass
        starts ``FIRST_AHEAD`` steps ahead and doubles that with every step served).

        Regions of slots that cannot be fetched yet (a live dataset's uncommitted batches) are
        scheduled as soon as they can, in order. ``whole_rows``, if given, sets the attribute
        of that name: whether the caller reads every row of each slot it touches, in order.
        """
        if whole_rows is not None:
            self.whole_rows = whole_rows
        queue: deque[tuple[S, int]] = deque()
        unscheduled: deque[Region] = deque()
        scheduled: list[Region] = []
        waiting = 0
        depth = FIRST_AHEAD  # steps ahead, doubled with every step served, up to MAX_AHEAD
        size = self._token_bytes
        try:
            for step in steps:
                wanted = list(regions(step))
                nbytes = sum((r[2] - r[1]) * (r[4] - r[3]) * size for r in wanted)
                unscheduled.extend(wanted)
                while unscheduled and self._available(unscheduled[0][0]):
                    region = unscheduled.popleft()
                    self._schedule(region)
                    scheduled.append(region)
                queue.append((step, nbytes))
                waiting += nbytes
                while queue and (waiting > self.prefetch_bytes or len(queue) > depth):
                    item, n = queue.popleft()
                    waiting -= n
                    depth = min(MAX_AHEAD, 2 * depth)
                    yield item
                if len(scheduled) > 4 * MAX_AHEAD:
                    scheduled = scheduled[-2 * MAX_AHEAD :]
            while queue:
                yield queue.popleft()[0]
        finally:  # a pass that ends early drops what it asked for
            with self._lock:
                for region in scheduled:
                    future = self._pending.pop(region, None)
                    if future is not None:
                        future.cancel()

    def _available(self, index: int) -> bool:
        """Whether slot ``index`` can be fetched now (a live source's may not exist yet)."""
        return index < self.num_batches

    def _schedule(self, region: Region) -> None:
        with self._lock:
            if region not in self._pending:
                self._pending[region] = self._pool.submit(self._fetch, region)

    # -- fetching ----------------------------------------------------------------------------
    def _fetch(self, region: Region) -> U32Array:
        """The region's tokens: fetched as ranges, or as the checked whole slot (see the module
        docstring's verification modes)."""
        index, r0, r1, lo, hi = region
        b, t = self.batch_size, self.seq_len
        if not (0 <= r0 <= r1 <= b and 0 <= lo <= hi <= t):
            raise IndexError(f"{self.path}: region rows {r0}..{r1}, columns {lo}..{hi} of {b}x{t}")
        n, local = self.locate(index)
        entry = self._object(n)
        whole = r0 == 0 and r1 == b and lo == 0 and hi == t
        mode = self.verify
        check = self._has_checksums() and (
            mode == "always"
            or (mode == "first" and index not in self._verified)
            or (mode == "whole" and whole)
        )
        start = HEADER_SIZE + local * self.slot_bytes
        rows = lo == 0 and hi == t and not whole
        if rows and mode == "whole" and self.whole_rows and self._has_checksums():
            return self._slot_rows(index, entry, local)[r0:r1]
        if check or whole:
            slot = self._get(entry.key, [(start, start + self.slot_bytes)])[0]
            if check:
                self._check_slot(index, entry, local, slot)
            tokens = np.frombuffer(slot, dtype=self._token_dtype, count=b * t).reshape(b, t)
            out: U32Array = tokens[r0:r1, lo:hi]
            return out
        size = self._token_bytes
        row = t * size
        if lo == 0 and hi == t:
            ranges = [(start + r0 * row, start + r1 * row)]
        else:
            ranges = [
                (start + r * row + lo * size, start + r * row + hi * size) for r in range(r0, r1)
            ]
        parts = self._get(entry.key, ranges)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        flat = np.frombuffer(data, dtype=self._token_dtype)
        return flat.reshape(r1 - r0, hi - lo)

    def _slot_rows(self, index: int, entry: BatchObject, local: int) -> U32Array:
        """Slot ``index`` fetched whole and checked once for the steps that read its rows one
        after the other; the slots of the steps fetched ahead are kept (least recently used
        out past ``prefetch_bytes`` of them). A slot that fails its check is not kept: every
        later read fetches it again and raises again."""
        with self._lock:
            future = self._slots.get(index)
            owner = future is None
            if future is None:
                future = self._slots[index] = Future()
                limit = 2 + self.prefetch_bytes // self.slot_bytes
                while len(self._slots) > limit:
                    self._slots.popitem(last=False)
            else:
                self._slots.move_to_end(index)
        if owner:
            b, t = self.batch_size, self.seq_len
            start = HEADER_SIZE + local * self.slot_bytes
            try:
                slot = self._get(entry.key, [(start, start + self.slot_bytes)])[0]
                self._check_slot(index, entry, local, slot)
            except BaseException as error:
                with self._lock:
                    if self._slots.get(index) is future:
                        del self._slots[index]
                future.set_exception(error)
                raise
            tokens = np.frombuffer(slot, dtype=self._token_dtype, count=b * t).reshape(b, t)
            future.set_result(tokens)
        return future.result()

    def _get(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Ranges of an object, through the cache when there is one."""
        if self.cache is None:
            return self.store.read_ranges(key, ranges, self.coalesce)
        name = f"{self.store.where(key)} {self.content_tag}"
        found = [self.cache.get(name, r) for r in ranges]
        missing = [r for r, part in zip(ranges, found, strict=True) if part is None]
        parts = self.store.read_ranges(key, missing, self.coalesce)
        fetched = dict(zip(missing, parts, strict=True))
        for r, part in fetched.items():
            self.cache.put(name, r, part)
        return [
            part if part is not None else fetched[r] for r, part in zip(ranges, found, strict=True)
        ]

    def _entry(self, n: int) -> BatchObject:
        """What the metadata says of object ``n`` (for a version 2 dataset, from its page of
        the index, read and checked first if need be)."""
        return self._objects[n] if self.table is None else self._indexed_object(n)

    def _object(self, n: int) -> BatchObject:
        """Object ``n``, checked against its entry at its first use (rules 7-10)."""
        entry = self._entry(n)
        if n in self._checked:
            return entry
        with self._lock:
            once = self._object_locks.setdefault(n, threading.Lock())
        with once:  # concurrent fetches of a new object check it once
            if n not in self._checked:
                self._check_object(n, entry)
        return entry

    def _indexed_object(self, n: int) -> BatchObject:
        """Shard ``n`` of a version 2 dataset, from its page of the index (read and checked the
        first time one of the page's shards is used)."""
        found = self._indexed.get(n)
        if found is not None:
            return found
        assert self.table is not None
        s = self.table.entry(n)
        first = int(self.table.firsts[n])
        entry = BatchObject(
            s.name, first, s.num_batches, s.size, s.seed, s.total_records, s.header_xxh3
        )
        with self._lock:
            return self._indexed.setdefault(n, entry)

    def _check_object(self, n: int, entry: BatchObject) -> None:
        if self.table is not None:
            # A version 2 shard is read without its header (``SPEC.md`` 23.3): its header's
            # fields are its index record's, which its page's digest checked; a shard shorter
            # than its record says fails the range read that reaches past its end, and
            # checked reads check every byte they serve.
            with self._lock:
                self._checked.add(n)
            return
        where = self.store.where(entry.key)

        def fail(code: DatasetCode, detail: str) -> DatasetError:
            return DatasetError(where, DatasetViolation(code, entry.key, detail))

        try:  # the size and the header in one request; the size is checked first
            prefix, size = self.store.read_head(entry.key, HEADER_SIZE)
        except FileNotFoundError:
            raise fail(DatasetCode.SHARD_MISSING, "listed in the manifest, not found") from None
        if entry.size is not None and size != entry.size:
            raise fail(
                DatasetCode.SHARD_SIZE_MISMATCH,
                f"object is {size} bytes, the manifest says {entry.size}",
            )
        checked = check_header(prefix, size)
        if isinstance(checked, Violation):
            raise FormatError(where, checked)
        if checked.dtype != self.dtype:  # every object has the source's token dtype
            raise fail(
                DatasetCode.SHARD_HEADER_MISMATCH,
                f"header dtype {checked.dtype} ({DTYPE_NAMES[checked.dtype]}); the manifest "
                f"says {self.dtype} ({DTYPE_NAMES[self.dtype]})",
            )
        found = (checked.batch_size, checked.seq_len, checked.num_batches)
        found_entry = (checked.seed, checked.total_records, header_xxh3(prefix[:HEADER_SIZE]))
        want = (self.batch_size, self.seq_len, entry.num_batches)
        want_entry = (entry.seed, entry.total_records, entry.header_xxh3)
        if found != want or (entry.seed is not None and found_entry != want_entry):
            raise fail(
                DatasetCode.SHARD_HEADER_MISMATCH,
                f"header (batch_size, seq_len, num_batches) = {found}, (seed, total_records, "
                f"xxh3) = {found_entry}; the manifest says {want}, {want_entry}",
            )
        with self._lock:
            self._checked.add(n)

    def validate(self, *, deep: bool = False) -> list[str]:
        """Every failure of the source's objects, as messages: each object's size and header
        against the manifest (rules 7-10), and with ``deep`` every slot's checksum (rule 12),
        reading every slot once. An empty list means valid."""
        failures: list[str] = []
        first, end = self._firsts[0], self._firsts[-1]
        count = len(self._objects) if self.table is None else len(self.table)
        for n in range(count):
            try:
                entry = self._object(n)
            except (DatasetError, FormatError) as e:
                failures.append(str(e))
                continue
            if not deep or not self._has_checksums():
                continue
            for local in range(entry.num_batches):
                index = entry.first + local
                if not first <= index < end:
                    continue
                start = HEADER_SIZE + local * self.slot_bytes
                slot = self._get(entry.key, [(start, start + self.slot_bytes)])[0]
                try:
                    self._check_slot(index, entry, local, slot)
                except DatasetError as e:
                    failures.append(str(e))
        return failures

    # -- checksums ---------------------------------------------------------------------------
    def _has_checksums(self) -> bool:
        return self.manifest is not None

    def slot_checksum(self, index: int) -> int:
        """Slot ``index``'s expected XXH3-64 (``checksums.xxh3``, checked on first use: the
        whole file, or for a version 2 dataset the range of the slot's shard only)."""
        if self.table is not None:
            n, local = self.locate(index)
            found = self._range_sums.get(n)
            if found is None:
                with self._checksums_lock:
                    found = self._range_sums.get(n)
                    if found is None:
                        found = self._range_sums[n] = self._read_range_checksums(n)
            return int(found[local])
        if self._checksums is None:
            with self._checksums_lock:  # concurrent fetches read the file once
                if self._checksums is None:
                    self._checksums = self._read_checksums()
        return int(self._checksums[index])

    def _read_checksums(self) -> npt.NDArray[np.uint64]:
        """``checksums.xxh3``, checked against the manifest's length and digest."""
        data = self.store.read(CHECKSUMS_NAME)
        expected = self.num_batches * CHECKSUM_BYTES
        assert self.manifest is not None
        digest = bytes_xxh3(data)
        if len(data) != expected or digest != self.manifest.checksums_xxh3:
            raise DatasetError(
                self.store.where(CHECKSUMS_NAME),
                DatasetViolation(
                    DatasetCode.CHECKSUMS_MISMATCH,
                    CHECKSUMS_NAME,
                    f"{len(data)} bytes with xxh3 {digest}; the manifest says {expected} "
                    f"bytes with xxh3 {self.manifest.checksums_xxh3}",
                ),
            )
        return np.frombuffer(data, dtype="<u8")

    def _read_range_checksums(self, n: int) -> npt.NDArray[np.uint64]:
        """Shard ``n``'s range of ``checksums.xxh3``, checked against its index record."""
        assert self.table is not None
        return self.table.range_checksums(
            n,
            self.store.where(CHECKSUMS_NAME),
            lambda a, b: self.store.read_ranges(CHECKSUMS_NAME, [(a, b)])[0],
        )

    def _check_slot(self, index: int, entry: BatchObject, local: int, slot: bytes) -> None:
        got = xxhash.xxh3_64_intdigest(slot)
        want = self.slot_checksum(index)
        if got != want:
            raise DatasetError(
                self.store.where(entry.key),
                DatasetViolation(
                    DatasetCode.CHECKSUM_MISMATCH,
                    entry.key,
                    f"slot {local} (dataset slot {index}): xxh3 {got:016x}, the checksums "
                    f"say {want:016x}",
                ),
            )
        with self._lock:
            self._verified.add(index)

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the fetches in flight and release the store's connections."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            pending, self._pending = self._pending, {}
            self._slots.clear()
        for future in pending.values():
            future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Worker processes reopen the URL rather than inheriting threads and connections.
        return (_reopen, (getattr(self, "_url", self.path), self.verify, self.prefetch_bytes))

    def __repr__(self) -> str:
        kind = "dataset" if self.is_dataset else "file"
        return (
            f"RemoteSource({self.path!r}, {kind}, num_batches={self.num_batches}, "
            f"batch_size={self.batch_size}, seq_len={self.seq_len}, "
            f"dtype={DTYPE_NAMES[self.dtype]})"
        )


def _reopen(path: str, verify: RemoteVerify, prefetch_bytes: int) -> RemoteSource:
    return RemoteSource(path, verify=verify, prefetch_bytes=prefetch_bytes)
