"""``DatasetReader``: a directory of LLMBATCH shards read as one sequence of slots.

Opening reads only the manifest (``SPEC.md`` section 12): shards are opened, and checked against
the manifest, the first time a slot of theirs is read, and at most ``max_open`` of them stay
open (least recently used first out), so a dataset of thousands of shards opens in
milliseconds and holds a bounded number of descriptors and mappings. Slot ``i`` of the dataset
is slot ``i - first`` of the shard whose range ``[first, first + num_batches)`` holds it.

Every slot has an XXH3-64 checksum in ``checksums.xxh3``. ``verify`` decides when reads check
it: ``"off"``, ``"first"`` (the first read of each slot in this process: the default) or
``"always"``. A mismatch raises ``DatasetError`` naming the shard and the slot, and the slot is
never served.

Every shard has the token dtype the manifest records (``dtype``: uint32 unless it says uint16);
``read_batch`` views have it (``token_dtype``), and a shard whose header has another is refused
(``shard_header_mismatch``).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import xxhash
from zerobatch_spec import DTYPE_NAMES, token_dtype
from zerobatch_spec.dataset import (
    CHECKSUM_BYTES,
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    DatasetCode,
    DatasetViolation,
    Manifest,
    Shard,
    bytes_xxh3,
    header_xxh3,
    parse_manifest,
)

from ..closing import Closing
from ..errors import DatasetError as DatasetError  # re-exported: where readers import it
from ..files.reader import BatchFileReader, LocalSlots
from ..order import ShardedBlockOrder, sharded_order
from ..stores.regular_files import read_regular_file, read_regular_head, read_regular_range
from .shard_table import IndexedShards, LazyShards, ListedShards, ShardTable

Verify = Literal["off", "first", "always"]
VERIFY_MODES: tuple[Verify, ...] = ("off", "first", "always")
DEFAULT_MAX_OPEN = 32
"""Shards kept open at once (each holds two descriptors, its own and its mapping's; a shard
closed while its read-ahead hint runs keeps them until the hint ends)."""
OPEN_AHEAD = 2
"""Shards opened ahead at once: the next block's while the current one's shard may still be
opening (blocks never cross shards, so two cover a loop that enters a new shard every block)."""

U32Array = npt.NDArray[np.uint32]

_OPENERS: dict[int, ThreadPoolExecutor] = {}
_OPENERS_LOCK = threading.Lock()


def _opener() -> ThreadPoolExecutor:
    """This process's shard-opening thread (one for every dataset; a forked child starts its own).

    Entering a shard costs system calls and header checks (stat, open, read, map, digest): on
    a loop over small shards that cost, paid on the loop's thread, would grow the per-batch cost
    with the shard count. The loader asks for the next block ahead of time, so the shard that
    block lives in is opened here while the current block is served.
    """
    pid = os.getpid()
    executor = _OPENERS.get(pid)
    if executor is None:
        with _OPENERS_LOCK:
            executor = _OPENERS.get(pid)
            if executor is None:
                _OPENERS.clear()  # a forked process's copy names its parent's thread
                executor = ThreadPoolExecutor(1, thread_name_prefix="zerobatch-shards")
                _OPENERS[pid] = executor
    return executor


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a dataset directory (it holds a manifest)."""
    return os.path.isfile(os.path.join(os.fspath(path), MANIFEST_NAME))


MANIFEST_LIMIT = 64 << 20
"""Largest ``manifest.json`` read (64 MiB, some 400,000 shards): a larger one is refused before
it is read (``SPEC.md`` 12.1 lets an implementation bound it), so a sparse or runaway file
cannot ask for more memory than a dataset's description needs."""


def read_manifest(directory: str | os.PathLike[str]) -> tuple[Manifest, bytes]:
    """The directory's checked manifest and its bytes; ``DatasetError`` for a broken one."""
    path = os.path.join(os.fspath(directory), MANIFEST_NAME)
    data = read_regular_file(path, MANIFEST_LIMIT)  # a FIFO is refused, not waited on
    parsed = parse_manifest(data)
    if isinstance(parsed, DatasetViolation):
        raise DatasetError(path, parsed)
    return parsed, data


class DatasetReader(LocalSlots, Closing):
    """A dataset directory's slots, read through lazily opened, manifest-checked shards.

    The surface matches ``BatchFileReader`` where the loader needs it (``batch_size``,
    ``seq_len``, ``num_batches``, ``seed``, ``read_batch``, ``read_ahead``, ``check_size``,
    ``close``), plus ``order`` (the dataset order), ``identity`` and ``locate``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: Verify = "first",
        max_open: int = DEFAULT_MAX_OPEN,
    ) -> None:
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be a positive integer, got {max_open!r}")
        self.path = os.fspath(path)
        self.manifest, data = read_manifest(self.path)
        self.manifest_sha256 = hashlib.sha256(data).hexdigest()
        self.verify: Verify = verify
        self.max_open = max_open
        # Slot numbers fit in int64: each shard has at most total_records <= 2**32 - 1 slots,
        # so 2**63 slots would take a manifest of 2**31 shards (hundreds of gigabytes).
        self.table: ShardTable = open_table(self.manifest, self.path)
        if not isinstance(self.table, ListedShards):  # entries read from the index as needed
            self.manifest = replace(self.manifest, shards=LazyShards(self.table))
        self._first = self.table.firsts
        # Bisect on ints (no array per call) where the list is small; searchsorted beyond, so
        # that a dataset of 100,000 shards holds no Python object per shard.
        small = len(self.table) <= BISECT_SHARDS
        self._first_list: list[int] | None = self._first.tolist() if small else None
        self._range_checksums: dict[int, npt.NDArray[np.uint64]] = {}
        self._open: OrderedDict[int, BatchFileReader] = OrderedDict()
        # Shards being opened ahead by ``read_ahead`` (at most ``OPEN_AHEAD``), oldest first,
        # and the process whose opening thread runs them.
        self._opening: OrderedDict[int, Future[BatchFileReader]] = OrderedDict()
        self._closing: list[Future[None]] = []  # shards past max_open, being closed
        self._pid = os.getpid()
        self._checksums: npt.NDArray[np.uint64] | None = None
        # Slots checked so far under "first", one array per shard made when the shard is
        # opened (its size checked against the manifest): the manifest's slot counts are only
        # claims until then, so nothing is sized from them before.
        self._verified: dict[int, npt.NDArray[np.bool_]] = {}
        self.bytes_read = 0
        """Bytes of slots this reader has handed out or verified (for accounting and tests)."""
        self._closed = False

    # -- shape -------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Records per slot (every shard's)."""
        return self.manifest.batch_size

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        return self.manifest.seq_len

    @property
    def num_batches(self) -> int:
        """Slots over all shards."""
        return int(self._first[-1])

    @property
    def seed(self) -> int:
        """The dataset's seed: the loader's default order seed."""
        return self.manifest.seed

    @property
    def dtype(self) -> int:
        """Token dtype code of every shard (the manifest's ``dtype``; 0: uint32, 1: uint16)."""
        return self.manifest.dtype

    @property
    def token_dtype(self) -> np.dtype[np.unsignedinteger]:
        """NumPy dtype of the stored tokens: what ``read_batch`` views have."""
        return token_dtype(self.manifest.dtype)

    @property
    def shards(self) -> Sequence[Shard]:
        """The manifest's shards, in dataset order."""
        return self.manifest.shards

    def __len__(self) -> int:
        return self.num_batches

    def order(self, block_size: int, seed: int, shuffle: bool) -> ShardedBlockOrder:
        """The dataset order (``SPEC.md`` section 14) with these parameters."""
        return sharded_order(self.table.counts, block_size, seed, shuffle)

    def identity(self) -> dict[str, Any]:
        """What a loader state records to refuse another dataset: the manifest's digest."""
        return {"dataset": self.manifest_sha256}

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, slot within the shard)`` of dataset slot ``index``."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"{self.path}: slot {index} out of range for {self.num_batches}")
        if self._first_list is not None:
            shard = bisect.bisect_right(self._first_list, index) - 1
            return shard, index - self._first_list[shard]
        shard = int(np.searchsorted(self._first, index, side="right")) - 1
        return shard, index - int(self._first[shard])

    # -- shards ------------------------------------------------------------------------------
    def shard_path(self, shard: int) -> str:
        """The file of shard number ``shard``."""
        return os.path.join(self.path, self.table.entry(shard).name)

    def slot_file(self, index: int) -> tuple[BatchFileReader, int]:
        """``(shard reader, slot in it)`` of dataset slot ``index`` (opened, not checksummed)."""
        shard, local = self.locate(index)
        return self.shard(shard), local

    def _fail(self, shard: int, code: DatasetCode, detail: str) -> DatasetError:
        entry = self.table.entry(shard)
        return DatasetError(self.shard_path(shard), DatasetViolation(code, entry.name, detail))

    def shard(self, shard: int) -> BatchFileReader:
        """The open reader of shard ``shard``, opened and checked against the manifest first."""
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        reader = self._open.get(shard)
        if reader is not None:
            self._open.move_to_end(shard)
            return reader
        pending = self._pending().pop(shard, None)
        # A shard opened ahead raises its own DatasetError here, if its open failed.
        reader = pending.result() if pending is not None else self._open_shard(shard)
        self._keep(shard, reader)
        return reader

    def _keep(self, shard: int, reader: BatchFileReader) -> None:
        """Hold ``reader`` open, closing the least recently used beyond ``max_open`` on the
        opening thread (unmapping costs the loop as much as mapping); ``close`` waits for them."""
        self._open[shard] = reader
        while len(self._open) > self.max_open:
            _, oldest = self._open.popitem(last=False)
            self._closing = [c for c in self._closing if not c.done()]
            self._closing.append(_opener().submit(oldest.close))

    def _pending(self) -> OrderedDict[int, Future[BatchFileReader]]:
        """The shards being opened ahead (none after a fork: the parent's thread will never
        answer this process)."""
        if self._pid != os.getpid():
            self._pid, self._opening, self._closing = os.getpid(), OrderedDict(), []
        return self._opening

    def _adopt(self, shard: int, pending: Future[BatchFileReader]) -> None:
        """Keep a shard opened ahead but not asked for yet; a failed open is dropped (asking
        for the shard opens it again and raises)."""
        try:
            reader = pending.result()
        except Exception:
            return
        if shard in self._open or self._closed:
            reader.close()
        else:
            self._keep(shard, reader)
            self._open.move_to_end(shard, last=False)  # first to go: nobody asked for it yet

    def _open_ahead(self, shard: int, start: int, stop: int) -> BatchFileReader:
        """On the opening thread: open and check a shard, and read its slots ahead."""
        reader = self._open_shard(shard)
        reader.read_ahead(start, stop)
        return reader

    def _open_shard(self, shard: int) -> BatchFileReader:
        entry, path = self.table.entry(shard), self.shard_path(shard)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            missing = "listed in the manifest, not found"
            raise self._fail(shard, DatasetCode.SHARD_MISSING, missing) from None
        except OSError as e:
            raise self._fail(shard, DatasetCode.SHARD_MISSING, f"cannot be read: {e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise self._fail(shard, DatasetCode.SHARD_MISSING, "not a regular file")
        if st.st_size != entry.size:
            raise self._fail(
                shard,
                DatasetCode.SHARD_SIZE_MISMATCH,
                f"file is {st.st_size} bytes, the manifest says {entry.size}",
            )
        try:
            reader = BatchFileReader(path)
        except OSError as e:  # a shard that exists but cannot be opened (permissions, ...)
            raise self._fail(shard, DatasetCode.SHARD_MISSING, f"cannot be read: {e}") from None
        h = reader.header
        if h.dtype != self.dtype:  # the digest below differs too; this names the field
            reader.close()
            raise self._fail(
                shard,
                DatasetCode.SHARD_HEADER_MISMATCH,
                f"header dtype {h.dtype} ({DTYPE_NAMES[h.dtype]}); the manifest says "
                f"{self.dtype} ({DTYPE_NAMES[self.dtype]})",
            )
        found = (h.batch_size, h.seq_len, h.num_batches, h.seed, h.total_records)
        want = (self.batch_size, self.seq_len, entry.num_batches, entry.seed, entry.total_records)
        digest = header_xxh3(reader.header_bytes)
        if found != want or digest != entry.header_xxh3:
            reader.close()
            raise self._fail(
                shard,
                DatasetCode.SHARD_HEADER_MISMATCH,
                f"header (batch_size, seq_len, num_batches, seed, total_records) = {found}, "
                f"xxh3 {digest}; the manifest says {want}, xxh3 {entry.header_xxh3}",
            )
        return reader

    # -- reading -----------------------------------------------------------------------------
    def read_batch(self, index: int) -> U32Array:
        """Dataset slot ``index`` as a read-only ``[batch_size, seq_len]`` view of the stored
        tokens (``token_dtype``).

        Checked against its checksum first if ``verify`` says so.
        """
        shard, local = self.locate(index)
        reader = self.shard(shard)
        if self.verify == "always":
            self._check_slot(reader, shard, local, index)
        elif self.verify == "first":
            seen = self._verified.get(shard)
            if seen is None:  # the shard is open: its slot count is its file's
                seen = self._verified[shard] = np.zeros(reader.num_batches, dtype=np.bool_)
            if not seen[local]:
                self._check_slot(reader, shard, local, index)
                seen[local] = True
        return reader.read_batch(local)

    def count(self, nbytes: int) -> None:
        """Account for ``nbytes`` of slot data a caller has read."""
        self.bytes_read += nbytes

    def checksums(self) -> npt.NDArray[np.uint64]:
        """Every slot's expected XXH3-64, checked against the manifest's digest on first use."""
        if self._checksums is None:
            path = os.path.join(self.path, CHECKSUMS_NAME)
            expected = self.num_batches * CHECKSUM_BYTES
            try:  # a FIFO is refused, not waited on; a larger file before it is read
                data = read_regular_file(path, expected)
            except OSError as e:  # missing, not a regular file, unreadable
                detail = "not found" if isinstance(e, FileNotFoundError) else f"unreadable: {e}"
                raise DatasetError(
                    path,
                    DatasetViolation(DatasetCode.CHECKSUMS_MISMATCH, CHECKSUMS_NAME, detail),
                ) from None
            digest = bytes_xxh3(data)
            if len(data) != expected or digest != self.manifest.checksums_xxh3:
                raise DatasetError(
                    path,
                    DatasetViolation(
                        DatasetCode.CHECKSUMS_MISMATCH,
                        CHECKSUMS_NAME,
                        f"{len(data)} bytes with xxh3 {digest}; the manifest says {expected} "
                        f"bytes with xxh3 {self.manifest.checksums_xxh3}",
                    ),
                )
            self._checksums = np.frombuffer(data, dtype="<u8")
        return self._checksums

    def _expected(self, shard: int, local: int, index: int) -> int:
        """Slot ``index``'s checksum: from the whole checksums file (version 1), or from the
        shard's range of it, checked against the index's digest of the range (version 2)."""
        if self.table.checksums_xxh3(shard) is None:
            return int(self.checksums()[index])
        found = self._range_checksums.get(shard)
        if found is None:
            path = os.path.join(self.path, CHECKSUMS_NAME)
            found = self.table.range_checksums(
                shard, path, lambda a, b: read_regular_range(path, a, b - a)
            )
            self._range_checksums[shard] = found
        return int(found[local])

    def _check_slot(self, reader: BatchFileReader, shard: int, local: int, index: int) -> None:
        got = file_slot_checksum(reader, local)
        self.bytes_read += reader.padded_batch_bytes
        want = self._expected(shard, local, index)
        if got != want:
            raise self._fail(
                shard,
                DatasetCode.CHECKSUM_MISMATCH,
                f"slot {local} (dataset slot {index}): xxh3 {got:016x}, the manifest's "
                f"checksums say {want:016x}",
            )

    def read_ahead(self, start: int, stop: int) -> None:
        """Have slots ``start..stop`` read in the background, shard by shard."""
        stop = min(stop, self.num_batches)
        while start < stop and not self._closed:
            shard, local = self.locate(start)
            n = min(stop - start, int(self._first[shard + 1]) - start)
            reader = self._open.get(shard)
            pending = self._pending()
            if reader is not None:
                reader.read_ahead(local, local + n)
            elif shard not in pending:
                while len(pending) >= OPEN_AHEAD:
                    self._adopt(*pending.popitem(last=False))
                if self.closed:  # by another thread meanwhile: open no shard it cannot close
                    return
                pending[shard] = _opener().submit(self._open_ahead, shard, local, local + n)
            start += n

    def check_size(self, index: int = 0) -> None:
        """Raise if the open shard holding slot ``index`` no longer has its size (one fstat)."""
        if self.num_batches:
            shard, _ = self.locate(index)
            reader = self._open.get(shard)
            if reader is not None:
                reader.check_size()

    # -- lifetime ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def close(self) -> None:
        """Close every open shard (views still held keep their mappings until dropped)."""
        self._closed = True
        pending = self._pending()
        while pending:
            with contextlib.suppress(Exception):
                pending.popitem()[1].result().close()
        while self._open:
            _, reader = self._open.popitem()
            reader.close()
        for closing in self._closing:
            closing.result()
        self._closing = []

    def __reduce__(self) -> tuple[Any, ...]:
        # Worker processes reopen the directory rather than inheriting open shards.
        return (_reopen, (self.path, self.verify, self.max_open))

    def __repr__(self) -> str:
        return (
            f"DatasetReader({self.path!r}, shards={len(self.shards)}, "
            f"num_batches={self.num_batches}, batch_size={self.batch_size}, "
            f"seq_len={self.seq_len}, dtype={DTYPE_NAMES[self.dtype]})"
        )


BISECT_SHARDS = 5000
"""Shards up to which slot lookups bisect a list of ints (faster per call than NumPy)."""


def open_table(manifest: Manifest, directory: str) -> ShardTable:
    """The shard table of a local dataset's manifest: its own list (version 1), or its index
    file's top, checked (version 2)."""
    if manifest.index is None:
        return ListedShards(manifest)
    path = os.path.join(directory, manifest.index.name)

    def read_head(n: int) -> tuple[bytes, int]:
        return read_regular_head(path, n)

    def read_range(start: int, end: int) -> bytes:
        data = read_regular_range(path, start, end - start)
        if len(data) != end - start:
            raise DatasetError(
                path,
                DatasetViolation(
                    DatasetCode.INDEX_MISMATCH, "index", "the file changed while it was read"
                ),
            )
        return data

    try:
        return IndexedShards(manifest, path, read_head, read_range)
    except OSError as e:
        detail = "not found" if isinstance(e, FileNotFoundError) else f"unreadable: {e}"
        raise DatasetError(
            path, DatasetViolation(DatasetCode.INDEX_MISSING, "index", detail)
        ) from None


def _reopen(path: str, verify: Verify, max_open: int) -> DatasetReader:
    return DatasetReader(path, verify=verify, max_open=max_open)


def open_source(
    path: str | os.PathLike[str], *, verify: Verify | None = None
) -> BatchFileReader | DatasetReader:
    """A reader for ``path``: a ``DatasetReader`` for a dataset directory, else a file reader.

    ``verify`` applies to datasets (default ``"first"``); single files carry no checksums.
    """
    if os.path.isdir(os.fspath(path)):
        return DatasetReader(path, verify=verify or "first")
    return BatchFileReader(path)


def file_slot_checksum(reader: BatchFileReader, index: int) -> int:
    """XXH3-64 of slot ``index`` of an open file: its tokens, then its padding."""
    digest = xxhash.xxh3_64()
    digest.update(reader.read_batch(index).data)
    digest.update(reader.slot_padding(index, index + 1).data)
    return int(digest.intdigest())


def slot_checksums(reader: BatchFileReader) -> npt.NDArray[np.uint64]:
    """The XXH3-64 of every slot of an open file, in slot order (for writing a manifest)."""
    out = np.empty(reader.num_batches, dtype=np.uint64)
    for i in range(reader.num_batches):
        out[i] = file_slot_checksum(reader, i)
    return out
