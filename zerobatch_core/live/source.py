"""``LiveSource``: a live dataset read as the loader's source, following new versions.

A live dataset is served as one unending sequence of global batches in commit order: stored
batch ``i`` is global batch ``i`` of the manifest versions (``SPEC.md`` section 18), the same
for every rank, whichever version each rank happens to have read. The loader sees a source of
``LIVE_NUM_BATCHES`` stored batches whose order is the identity (``order`` ignores
``shuffle`` and ``block_size``: the producers decide the order), so every rank slices the same
global batch at every step (rows, token chunks: ``slicing.py``), a loader state is a position
in that sequence, and resuming from a checkpoint resumes exactly there.

A read of a global batch that no version lists yet waits: the source reads the versions that
appeared since (``ManifestChain.follow``), polling with a growing interval, until the batch is
committed or ``timeout`` seconds pass (``LiveTimeoutError``). Only verified versions are
served (``SPEC.md`` section 18.4): each version read must follow from the one before it, and
the newest at open from its predecessor. A crafted or mistaken version raises ``ChainError``
at once when the source would need it (never after waiting out the timeout); the batches of
the versions already accepted are still served. Reads are ``RemoteSource``'s:
byte ranges of just the rank's share, prefetched within ``prefetch_bytes`` (committed batches
only), each whole-slot fetch checked against the checksum its entry lists. Every batch object
has the token dtype the descriptor records (``live.json``'s ``dtype``: uint32 unless it says
uint16); an object whose header says otherwise is refused (``shard_header_mismatch``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from zerobatch_spec.live import (
    DESCRIPTOR_NAME,
    Descriptor,
    LiveCode,
    LiveManifest,
    LiveViolation,
    manifest_name,
    parse_descriptor,
)

from ..datasets.remote import BatchObject, RemoteSource, RemoteVerify
from ..order import BlockOrder, Order
from ..stores.resolve import open_store
from ..stores.store import Store
from .manifests import ChainError, LiveError, LiveTimeoutError, ManifestChain

LIVE_NUM_BATCHES = 2**62
"""The stored batches a loader sees in a live dataset: its one epoch never ends."""
DEFAULT_TIMEOUT = 600.0
"""Seconds a read waits for a batch to be committed before ``LiveTimeoutError``."""


class LiveSource(RemoteSource):
    """A live dataset (see the module docstring). ``dataset`` is a URL, a path or a ``Store``."""

    def __init__(
        self,
        dataset: str | Store,
        *,
        verify: RemoteVerify | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        poll: float = 0.01,
        **options: Any,
    ) -> None:
        store = open_store(dataset)
        self.timeout = float(timeout)
        self.poll = poll
        self._refresh_lock = threading.Lock()
        super().__init__((store, DESCRIPTOR_NAME), verify=verify, **options)

    def _open(self, key: str) -> None:
        try:
            data = self.store.read(DESCRIPTOR_NAME)
        except FileNotFoundError:
            raise LiveError(f"{self.store.where(DESCRIPTOR_NAME)}: not a live dataset") from None
        found = parse_descriptor(data)
        if isinstance(found, LiveViolation):
            raise LiveError(
                f"{self.store.where(DESCRIPTOR_NAME)}: {found.code.value}: {found.where}: "
                f"{found.detail}"
            )
        self.descriptor: Descriptor = found
        self.content_tag = f"live {found.dataset_id}"
        self._set_shape(found.batch_size, found.seq_len, found.seed, found.dtype)
        self.path = self.store.url
        self.chain = ManifestChain(self.store, found)
        self.current: LiveManifest = self.chain.latest()
        self._firsts = [self.current.start]
        self._extend(self.current, self.current.start)

    def _extend(self, manifest: LiveManifest, since: int) -> None:
        """Add the entries of ``manifest`` from global batch ``since`` (the end of the entries
        known) on. Each must start where the one before it ends: an entry across that end
        goes back on what an earlier version listed (``ChainError``); one after it means the
        batches between were reclaimed before this source read a version listing them
        (``LiveError``). Either way nothing is added, so no batch is served from the wrong
        slot."""
        for e in self.chain.entries(manifest, since):
            end = self._firsts[-1]
            if e.first < end:
                raise ChainError(
                    f"{self.store.where(manifest_name(manifest.version))}: "
                    f"{LiveCode.NOT_SUCCESSOR.value}: {e.name}: global batches {e.first}.."
                    f"{e.end - 1} cross the end {end} of the entries of version "
                    f"{self.current.version}: it goes back on what that version listed"
                )
            if e.first > end:
                raise LiveError(
                    f"{self.path}: global batches {end}..{e.first - 1} were reclaimed before "
                    f"this reader read a version listing them (manifest version "
                    f"{manifest.version} starts at {manifest.start})"
                )
            self._add(
                BatchObject(
                    e.name,
                    e.first,
                    e.num_batches,
                    e.size,
                    e.seed,
                    e.total_records,
                    e.header_xxh3,
                    e.checksums,
                )
            )
        self.current = manifest

    # -- shape and order ---------------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        """``LIVE_NUM_BATCHES``: the loader's epoch over a live dataset never ends."""
        return LIVE_NUM_BATCHES

    @property
    def committed(self) -> int:
        """Global batches committed in the newest version this source has read."""
        return self._firsts[-1]

    @property
    def start(self) -> int:
        """The first global batch still listed (earlier ones were reclaimed)."""
        return self._firsts[0]

    @property
    def is_dataset(self) -> bool:
        return True

    def order(self, block_size: int, seed: int, shuffle: bool) -> Order:
        """Commit order, whatever ``shuffle`` says: stored batch ``i`` is global batch ``i``."""
        return BlockOrder(LIVE_NUM_BATCHES, block_size, seed, False)

    def identity(self) -> dict[str, Any]:
        """The live dataset's id (from its descriptor)."""
        return {"live": self.descriptor.dataset_id}

    def _has_checksums(self) -> bool:
        return True

    def slot_checksum(self, index: int) -> int:
        n, local = self.locate(index)
        sums = self._objects[n].checksums
        assert sums is not None
        return int(sums[local], 16)

    # -- following new versions --------------------------------------------------------------
    def _available(self, index: int) -> bool:
        return self._firsts[0] <= index < self._firsts[-1]

    def _missing(self, index: int) -> int:
        if index < self.start:
            raise LiveError(
                f"{self.path}: global batch {index} was reclaimed (the dataset now starts at "
                f"{self._firsts[0]}): was it read from a checkpoint retention no longer keeps?"
            )
        self.wait_for(index)
        return index

    def refresh(self) -> bool:
        """Read the versions committed since the newest known one: whether any was."""
        with self._refresh_lock:
            newer = self.chain.follow(self.current)
            if not newer:
                return False
            self._extend(newer[-1], self._firsts[-1])
            return True

    def wait_for(self, index: int, timeout: float | None = None) -> None:
        """Return once global batch ``index`` is committed (``LiveTimeoutError`` after
        ``timeout`` seconds, by default the source's)."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        pause = self.poll
        while index >= self._firsts[-1]:
            if self.refresh():
                continue
            if time.monotonic() >= deadline:
                raise LiveTimeoutError(
                    f"{self.path}: global batch {index} not committed after {limit:g} s "
                    f"(committed: {self._firsts[-1]}, manifest version {self.current.version})"
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.path, self.verify, self.timeout))

    def __repr__(self) -> str:
        return (
            f"LiveSource({self.path!r}, committed={self.committed}, version="
            f"{self.current.version}, batch_size={self.batch_size}, seq_len={self.seq_len})"
        )


def _reopen(path: str, verify: RemoteVerify, timeout: float) -> LiveSource:
    return LiveSource(path, verify=verify, timeout=timeout)
