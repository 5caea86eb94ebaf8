"""``LiveSource``: a live dataset read as the loader's source, following new versions.

A live dataset is served as one unending sequence of global batches in commit order: stored
batch ``i`` is global batch ``i`` of the manifest versions (``SPEC.md`` section 18), the same
for every rank, whichever version each rank happens to have read. The loader sees a source of
``LIVE_NUM_BATCHES`` stored batches whose order is the identity (``order`` ignores
``shuffle`` and ``block_size``: the producers decide the order), so every rank slices the same
global batch at every step (rows, token chunks: ``slicing.py``), a loader state is a position
in that sequence, and resuming from a checkpoint resumes exactly there.

**Opening** reads the descriptor, lists the versions and reads the newest and its predecessor
(``ManifestChain.latest``), and nothing else: its cost does not grow with the committed
length. A sealed segment is read the first time one of its global batches is needed (a read,
a fetch ahead, ``locate``, ``slot_checksum``), checked against its reference as it is read, so
a consumer resuming deep into the dataset reads the segment that holds its batch, not those
before it. The entries of the ``SPANS_KEPT`` segments used last are kept; older ones are
dropped and read again if needed, so a consumer that reads on for days holds the entries of a
bounded window, not of every batch it has read.

A read of a global batch that no version lists yet waits: the source reads the versions that
appeared since (``ManifestChain.follow``), polling with a growing interval, until the batch is
committed or ``timeout`` seconds pass (``LiveTimeoutError``). A poll costs two requests however
many versions exist (version ``v + 1``, then whether ``v`` is still there); the versions are
listed only after the source's own version was reclaimed, and otherwise ``LIST_FIRST``
seconds after opening, then at intervals doubling up to ``LIST_EVERY`` seconds, and before a
wait times out. Only verified versions are served (``SPEC.md`` section 18.4): each version
read must follow from the one before it, and the newest at open from its predecessor. A
crafted or mistaken version raises ``ChainError`` at once when the source reads it (never
after waiting out the timeout); one numbered past a gap while the source's own version is
present is noticed at the next listing (``ManifestChain.follow``), and never served from. The
batches of the versions already accepted are still served. Reads are ``RemoteSource``'s:
byte ranges of just the rank's share, prefetched within ``prefetch_bytes`` (committed batches
only), each whole-slot fetch checked against the checksum its entry lists. Every batch object
has the token dtype the descriptor records (``live.json``'s ``dtype``: uint32 unless it says
uint16); an object whose header says otherwise is refused (``shard_header_mismatch``).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict
from typing import Any

from zerobatch_spec import HEADER_SIZE
from zerobatch_spec.live import (
    DESCRIPTOR_NAME,
    Descriptor,
    Entry,
    LiveCode,
    LiveManifest,
    LiveViolation,
    SegmentRef,
    manifest_name,
    parse_descriptor,
)

from ..datasets.dataset import DatasetError
from ..datasets.remote import BatchObject, RemoteSource, RemoteVerify
from ..errors import FormatError
from ..order import BlockOrder, Order
from ..stores.resolve import open_store
from ..stores.store import Store
from .manifests import ChainError, LiveError, LiveTimeoutError, ManifestChain

LIVE_NUM_BATCHES = 2**62
"""The stored batches a loader sees in a live dataset: its one epoch never ends."""
DEFAULT_TIMEOUT = 600.0
"""Seconds a read waits for a batch to be committed before ``LiveTimeoutError``."""
SPANS_KEPT = 64
"""Sealed segments whose entries a source keeps (least recently used first out)."""
LIST_FIRST = 1.0
"""Seconds after opening before a waiting read first lists the versions (``follow``)."""
LIST_EVERY = 60.0
"""The longest interval between two listings of the versions while reads wait."""


class _Span:
    """Global batches ``first .. end - 1`` of a source and the objects that hold them: a sealed
    segment's (``ref``: read the first time one of its batches is needed, dropped and read
    again later if need be), or one tail entry's (``ref`` is ``None`` until a later version
    seals it). ``held`` is the objects and their first global batches, or ``None`` while
    unread. ``version`` is the manifest version that listed the span, ``after`` the one whose
    end it continues (for messages). ``known`` is the fingerprint of the tail entries a
    segment sealed (``_fingerprint``), which it must still hold when it is read again."""

    __slots__ = ("after", "end", "first", "held", "known", "lock", "ref", "version")

    def __init__(
        self,
        first: int,
        end: int,
        ref: SegmentRef | None,
        version: int,
        after: int,
        held: tuple[tuple[BatchObject, ...], list[int]] | None = None,
    ) -> None:
        self.first = first
        self.end = end
        self.ref = ref
        self.version = version
        self.after = after
        self.held = held
        self.known: int | None = None
        self.lock = threading.Lock()


def _fingerprint(objects: tuple[BatchObject, ...]) -> int:
    """A digest of what ``objects`` say, to compare a segment read again with the entries a
    source served before it dropped them."""
    return hash(
        tuple(
            (o.key, o.first, o.num_batches, o.size, o.seed, o.total_records, o.header_xxh3)
            + (o.checksums or ())
            for o in objects
        )
    )


def _batch_object(e: Entry) -> BatchObject:
    return BatchObject(
        e.name, e.first, e.num_batches, e.size, e.seed, e.total_records, e.header_xxh3, e.checksums
    )


class LiveSource(RemoteSource):
    """A live dataset (see the module docstring). ``dataset`` is a URL, a path or a ``Store``.

    Objects are numbered by their first global batch (``locate`` gives ``(first, slot)``), so
    a segment's objects keep their numbers, and their checks, when it is read again."""

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
        self._spans_lock = threading.Lock()
        self._index: tuple[list[int], list[_Span]] = ([], [])
        """The spans' first global batches and the spans, in order (replaced, never changed,
        so readers on other threads need no lock to search it)."""
        self._kept: OrderedDict[int, _Span] = OrderedDict()
        """Read segments' spans by first global batch, least recently used first."""
        self._unsealed = 0
        """The first global batch of the tail entries no version has sealed yet."""
        super().__init__((store, DESCRIPTOR_NAME), verify=verify, **options)
        self._listed_at = time.monotonic()
        self._list_gap = LIST_FIRST

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
        self._firsts = [self.current.start, self.current.start]  # bounds: start, committed
        self._unsealed = self.current.start
        self._extend(self.current, self.current.start)

    def _extend(self, manifest: LiveManifest, since: int) -> None:
        """Add what ``manifest`` lists from global batch ``since`` (the end of what is known)
        on: a span per sealed segment, unread, and one per tail entry. Each must start where
        the one before it ends: a tail entry across that end goes back on what an earlier
        version listed (``ChainError``; a segment across it is checked when it is read); one
        after it means the batches between were reclaimed before this source read a version
        listing them (``LiveError``). Either way nothing is added, so no batch is served from
        the wrong slot. Segments that seal tail entries already known take over their span,
        so those entries too can be dropped and read again."""
        starts, spans = list(self._index[0]), list(self._index[1])
        sealed, merged = self._seal(manifest, starts, spans)
        end, after = since, self.current.version
        for ref in manifest.segments:
            if ref.end <= end:
                continue
            if ref.first > end:
                raise self._reclaimed(end, ref.first, manifest)
            starts.append(end)
            spans.append(_Span(end, ref.end, ref, manifest.version, after))
            end = ref.end
        unsealed = end if end > since else self._unsealed
        for e in manifest.tail:
            if e.end <= end:
                continue
            if e.first < end:
                raise ChainError(
                    f"{self.store.where(manifest_name(manifest.version))}: "
                    f"{LiveCode.NOT_SUCCESSOR.value}: {e.name}: global batches {e.first}.."
                    f"{e.end - 1} cross the end {end} of the entries of version "
                    f"{after}: it goes back on what that version listed"
                )
            if e.first > end:
                raise self._reclaimed(end, e.first, manifest)
            obj = _batch_object(e)
            starts.append(e.first)
            spans.append(_Span(e.first, e.end, None, manifest.version, after, ((obj,), [e.first])))
            end = e.end
        with self._spans_lock:
            self._index = (starts, spans)  # published before the new end
            self._unsealed = max(unsealed, sealed)
            for span in merged:
                self._keep(span)
        self._firsts = [self._firsts[0], end]
        self.current = manifest

    def _seal(
        self, manifest: LiveManifest, starts: list[int], spans: list[_Span]
    ) -> tuple[int, list[_Span]]:
        """Replace the tail entries' spans that ``manifest``'s new segments seal with one span
        per segment, holding the same objects, in ``starts`` and ``spans``: the end of what is
        now sealed, and the new spans."""
        sealed, merged = self._unsealed, []
        for ref in manifest.segments:
            if ref.end <= sealed or ref.first < sealed or ref.end > self._firsts[-1]:
                continue
            i = bisect.bisect_left(starts, ref.first)
            j = bisect.bisect_left(starts, ref.end)
            run = spans[i:j]
            if not run or run[0].first != ref.first or run[-1].end != ref.end:
                break  # not on the tail entries' bounds: checked when the segment is read
            objects: list[BatchObject] = []
            for s in run:
                if s.ref is not None or s.held is None:
                    break
                objects.extend(s.held[0])
            else:
                span = _Span(ref.first, ref.end, ref, run[0].version, run[0].after)
                span.held = (tuple(objects), [o.first for o in objects])
                span.known = _fingerprint(span.held[0])
                starts[i:j] = [ref.first]
                spans[i:j] = [span]
                merged.append(span)
                sealed = ref.end
                continue
            break
        return sealed, merged

    def _reclaimed(self, end: int, first: int, manifest: LiveManifest) -> LiveError:
        return LiveError(
            f"{self.path}: global batches {end}..{first - 1} were reclaimed before "
            f"this reader read a version listing them (manifest version "
            f"{manifest.version} starts at {manifest.start})"
        )

    # -- spans -------------------------------------------------------------------------------
    def _keep(self, span: _Span) -> None:
        """Mark ``span`` used last; drop the entries of the segments used least recently past
        ``SPANS_KEPT`` (caller holds ``_spans_lock``)."""
        self._kept[span.first] = span
        self._kept.move_to_end(span.first)
        while len(self._kept) > SPANS_KEPT:
            _, old = self._kept.popitem(last=False)
            old.held = None  # a reader holding the objects keeps using them

    def _held(self, span: _Span) -> tuple[tuple[BatchObject, ...], list[int]]:
        """The objects of ``span`` and their first global batches, its segment read and checked
        first if need be."""
        held = span.held
        if held is None:
            with span.lock:  # one read per segment, whichever threads need it
                held = span.held
                if held is None:
                    held = span.held = self._read_span(span)
        if span.ref is not None:
            with self._spans_lock:
                self._keep(span)
        return held

    def _read_span(self, span: _Span) -> tuple[tuple[BatchObject, ...], list[int]]:
        """Read ``span``'s segment (checked against its reference): its entries from the
        span's first global batch, which must be where one of them starts."""
        assert span.ref is not None
        segment = self.chain.segment(span.ref)
        entries = [e for e in segment.entries if e.end > span.first]
        if entries[0].first != span.first:
            e = entries[0]
            raise ChainError(
                f"{self.store.where(manifest_name(span.version))}: "
                f"{LiveCode.NOT_SUCCESSOR.value}: {e.name}: global batches {e.first}.."
                f"{e.end - 1} cross the end {span.first} of the entries of version "
                f"{span.after}: it goes back on what that version listed"
            )
        objects = tuple(_batch_object(e) for e in entries)
        if span.known is not None and _fingerprint(objects) != span.known:
            raise ChainError(
                f"{self.store.where(span.ref.name)}: {LiveCode.NOT_SUCCESSOR.value}: it does "
                f"not hold the tail entries it seals (global batches {span.first}.."
                f"{span.end - 1}, served before from the tail of version {span.version})"
            )
        return objects, [o.first for o in objects]

    def _find(self, index: int) -> BatchObject:
        """The object holding global batch ``index`` (listed: ``start <= index < committed``)."""
        starts, spans = self._index
        span = spans[bisect.bisect_right(starts, index) - 1]
        objects, firsts = self._held(span)
        return objects[bisect.bisect_right(firsts, index) - 1]

    def locate(self, index: int) -> tuple[int, int]:
        """``(object, slot within it)`` of global batch ``index``: objects are numbered by
        their first global batch. Reads the segment that lists it if need be."""
        if not self._firsts[0] <= index < self._firsts[-1]:
            index = self._missing(index)
        found = self._find(index)
        return found.first, index - found.first

    def _entry(self, n: int) -> BatchObject:
        """The entry of the object whose first global batch is ``n`` (checked against it at
        its first use, ``SPEC.md`` section 18.2), its segment read if need be."""
        return self._find(n)

    def validate(self, *, deep: bool = False) -> list[str]:
        """Every failure of the objects the newest version read lists, as messages (each
        segment read and checked, each object's size and header against its entry, and with
        ``deep`` every slot's checksum). An empty list means valid."""
        failures: list[str] = []
        for span in self._index[1]:
            try:
                objects, _ = self._held(span)
            except LiveError as e:
                failures.append(str(e))
                continue
            for entry in objects:
                try:
                    self._object(entry.first)
                except (DatasetError, FormatError) as e:
                    failures.append(str(e))
                    continue
                for local in range(entry.num_batches if deep else 0):
                    start = HEADER_SIZE + local * self.slot_bytes
                    slot = self._get(entry.key, [(start, start + self.slot_bytes)])[0]
                    try:
                        self._check_slot(entry.first + local, entry, local, slot)
                    except DatasetError as e:
                        failures.append(str(e))
        return failures

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
        sums = self._find(n).checksums
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

    def refresh(self, *, listing: bool = False) -> bool:
        """Read the versions committed since the newest known one: whether any was. With
        ``listing``, the versions are listed if the next one is missing (a gap after this
        source's version is then found even while its version is still present)."""
        with self._refresh_lock:
            newer = self.chain.follow(self.current, probe=not listing)
            if not newer:
                return False
            self._extend(newer[-1], self._firsts[-1])
            return True

    def wait_for(self, index: int, timeout: float | None = None) -> None:
        """Return once global batch ``index`` is committed (``LiveTimeoutError`` after
        ``timeout`` seconds, by default the source's). Lists the versions when one is due (see
        the module docstring) and before giving up."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        pause = self.poll
        while index >= self._firsts[-1]:
            now = time.monotonic()
            listing = now >= deadline or now - self._listed_at >= self._list_gap
            if listing:
                self._listed_at = now
                self._list_gap = min(2 * self._list_gap, LIST_EVERY)
            if self.refresh(listing=listing):
                continue
            if now >= deadline:
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
