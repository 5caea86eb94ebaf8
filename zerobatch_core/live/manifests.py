"""Reading a live dataset's manifest versions and segments from its store.

Producers, consumers and retention share this: finding the newest version (a listing once,
then probing ``v + 1``, ``v + 2``, ... as versions appear), reading and checking versions
against the descriptor, and reading sealed segments, which never change and are kept once
read.

Producers and consumers follow only a *verified* chain of versions (``SPEC.md`` section
18.4): ``latest`` and ``follow`` accept a version only if it follows from the one before it
(``successor_violation``), so one crafted or mistaken version (a version ``v + 1`` with huge
``start``, ``batches`` or producer offsets, or a version numbered far ahead of the others) is
never served from or committed on: ``ChainError`` names its key and the rule it breaks. The
check costs no extra request while following (each version is read in order anyway); opening
reads one more version, the predecessor of the newest, and checks the listing has no gap.
Following lists the versions only when asked to or when the reader's own version is gone
(``follow``), so an idle reader's poll does not grow with the versions retention keeps.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import pairwise

import xxhash
from zerobatch_spec.live import (
    MANIFESTS_PREFIX,
    Descriptor,
    Entry,
    LiveCode,
    LiveManifest,
    LiveViolation,
    Segment,
    SegmentRef,
    manifest_name,
    parse_live_manifest,
    parse_manifest_name,
    parse_segment,
    successor_violation,
)

from ..errors import ZeroBatchError
from ..stores.store import Store

SEGMENT_CACHE = 64
"""Segments kept in memory by one chain (least recently used first out)."""
_REFUSED = (
    " (SPEC.md section 18.4: readers serve nothing from it and producers commit nothing on it "
    "until it is removed by hand)"
)


class LiveError(ZeroBatchError, ValueError):
    """A live dataset that cannot be read or extended as asked (names the store and why)."""


class LiveTimeoutError(LiveError, TimeoutError):
    """A consumer waited longer than its timeout for a batch no producer has committed yet."""


class ChainError(LiveError):
    """A manifest version that does not follow from its predecessor (``SPEC.md`` section
    18.4), or one that follows a gap in the versions present: names the version's key and the
    rule broken. Consumers serve nothing from it, producers commit nothing on it and retention
    deletes nothing (retention also raises it when the newest version no longer lists batches
    a live checkpoint needs); the chain stays broken until the version is removed by hand."""


class ManifestChain:
    """The manifest versions and segments of one live dataset in ``store``."""

    def __init__(self, store: Store, descriptor: Descriptor) -> None:
        self.store = store
        self.descriptor = descriptor
        self._segments: OrderedDict[str, tuple[str, Segment]] = OrderedDict()
        """Segments read, by name: the digest of their bytes and what they hold."""
        self._lock = threading.Lock()
        self.reads = 0
        """Manifest versions read (for the benchmark's accounting)."""

    def read(self, version: int) -> LiveManifest | None:
        """Version ``version``, or ``None`` if it does not exist (not yet, or reclaimed)."""
        key = manifest_name(version)
        try:
            data = self.store.read(key)
        except FileNotFoundError:
            return None
        self.reads += 1
        found = parse_live_manifest(data, self.descriptor)
        if isinstance(found, LiveViolation):
            raise LiveError(
                f"{self.store.where(key)}: {found.code.value}: {found.where}: {found.detail}"
            )
        if found.version != version:
            raise LiveError(f"{self.store.where(key)}: holds manifest version {found.version}")
        return found

    def versions(self) -> list[int]:
        """Every manifest version in the store, ascending (a listing)."""
        found = (parse_manifest_name(k) for k in self.store.list_keys(MANIFESTS_PREFIX))
        return sorted(v for v in found if v is not None)

    def latest(self) -> LiveManifest:
        """The newest version, verified (the first look at a dataset; ``ChainError`` if the
        chain is broken).

        A listing gives the versions present; they must be contiguous (retention deletes the
        oldest first and producers create ``v + 1`` only once ``v`` exists, so a gap means a
        version was written out of turn). The newest is read and checked to follow from its
        predecessor where one is present (the one extra read), then the versions created since
        the listing are read and checked in turn (``follow``).
        """
        for _ in range(8):  # a version listed then reclaimed before it is read: list again
            versions = self.versions()
            if not versions:
                raise LiveError(f"{self.store.url}: a live dataset without manifest versions")
            self._check_contiguous(versions)
            newest = self.read(versions[-1])
            if newest is None:
                continue
            if len(versions) > 1:
                prev = self.read(newest.version - 1)
                if prev is None:
                    continue
                self.check(prev, newest)
            newer = self.follow(newest, list_on_gap=False)
            return newer[-1] if newer else newest
        raise LiveError(f"{self.store.url}: manifest versions keep disappearing while listed")

    def after(self, version: int, *, list_on_gap: bool = True) -> list[LiveManifest]:
        """The versions after ``version`` that exist now, in order (reads ``v + 1``, ``v + 2``,
        ... until one is missing). Retention may have deleted versions in between: if
        ``version + 1`` is missing, a listing finds any newer ones (``list_on_gap``).

        Nothing here checks that a version follows from the one before it: producers and
        consumers use ``follow``, retention checks the chain itself."""
        out: list[LiveManifest] = []
        v = version + 1
        while True:
            found = self.read(v)
            if found is None:
                break
            out.append(found)
            v += 1
        if not out and list_on_gap:
            newer = [x for x in self.versions() if x > version]
            if newer:
                found = self.read(newer[-1])
                if found is not None:
                    out.append(found)
                    out.extend(self.after(found.version, list_on_gap=False))
        return out

    def follow(
        self, prev: LiveManifest, *, list_on_gap: bool = True, probe: bool = True
    ) -> list[LiveManifest]:
        """The versions after ``prev`` (a version already accepted) that exist now, in order,
        each checked to follow from the one before it (``ChainError`` at the first that does
        not). Reads ``v + 1``, ``v + 2``, ... until one is missing, so following producers
        costs no request beyond the reads ``after`` makes.

        If ``prev.version + 1`` is missing and ``list_on_gap``, retention may have deleted it
        while this reader was away. Versions are created in order and deleted oldest first,
        so while ``prev`` itself exists ``prev.version + 1`` was never deleted: with ``probe``
        (the default) one request asks whether ``prev`` exists, and only if it does not are
        the versions listed. An idle poll thus costs two requests however many versions
        exist. The price: a version numbered past a gap while ``prev`` is present (written
        out of turn, never by a producer or retention) is not seen by such a poll; it is
        never served from, and is refused at the next listing (``probe=False``, which
        ``LiveSource`` makes from time to time while it waits, and before it times out).

        A listing looks for newer versions. Newer versions while ``prev`` or an older version
        is still present mean a gap in the middle of the chain (``ChainError``). Newer
        versions with every version up to ``prev.version + 1`` gone mean retention deleted
        them while this reader was away: the newest is then taken as on a first look
        (``latest``), and must not hold fewer batches, an earlier ``start`` or a smaller
        producer offset than ``prev``.
        """
        out: list[LiveManifest] = []
        last = prev
        while (found := self.read(last.version + 1)) is not None:
            self.check(last, found)
            out.append(found)
            last = found
        if out or not list_on_gap:
            return out
        if probe and self.store.exists(manifest_name(prev.version)):
            return []
        versions = self.versions()
        newer = [v for v in versions if v > prev.version]
        if not newer:
            return []
        if newer[0] == prev.version + 1:  # created since the read above
            return self.follow(prev, list_on_gap=False)
        if versions[0] <= prev.version:
            raise ChainError(
                f"{self.store.where(manifest_name(newer[0]))}: "
                f"{LiveCode.NOT_SUCCESSOR.value}: manifest: version {newer[0]} follows a gap "
                f"(version {prev.version + 1} is missing while version {versions[0]} is "
                f"present){_REFUSED}"
            )
        anchor = self.latest()
        self._check_continues(prev, anchor)
        return [anchor]

    def check(self, prev: LiveManifest, nxt: LiveManifest) -> None:
        """Raise ``ChainError`` unless ``nxt`` follows from ``prev`` (``successor_violation``).

        The segments a new version seals are compared with ``prev``'s tail only when this
        chain already holds them (reading them would cost a request per commit; their digest
        is checked against each reference whenever they are read)."""
        try:
            violation = successor_violation(prev, nxt, self._cached_segment)
        except LiveError as e:
            raise ChainError(
                f"{self.store.where(manifest_name(nxt.version))}: "
                f"{LiveCode.NOT_SUCCESSOR.value}: segments: {e}{_REFUSED}"
            ) from None
        if violation is not None:
            raise ChainError(
                f"{self.store.where(manifest_name(nxt.version))}: {violation.code.value}: "
                f"{violation.where}: {violation.detail}: it does not follow from version "
                f"{prev.version}{_REFUSED}"
            )

    def _cached_segment(self, ref: SegmentRef) -> Segment | None:
        """The segment ``ref`` names if this chain holds it already (checked against ``ref``),
        else ``None``: never a request."""
        with self._lock:
            held = ref.name in self._segments
        return self.segment(ref) if held else None

    def _check_contiguous(self, versions: list[int]) -> None:
        """Raise ``ChainError`` at the first gap in ``versions`` (ascending)."""
        if versions[-1] - versions[0] + 1 == len(versions):
            return
        for below, above in pairwise(versions):
            if above != below + 1:
                raise ChainError(
                    f"{self.store.where(manifest_name(above))}: "
                    f"{LiveCode.NOT_SUCCESSOR.value}: manifest: version {above} follows a gap "
                    f"(version {below + 1} is missing while version {below} is present)"
                    f"{_REFUSED}"
                )

    def _check_continues(self, prev: LiveManifest, anchor: LiveManifest) -> None:
        """Raise ``ChainError`` if ``anchor``, found after the versions between it and
        ``prev`` were reclaimed, goes back on what ``prev`` committed."""
        back = [
            f"batches {anchor.batches} < {prev.batches}" if anchor.batches < prev.batches else "",
            f"start {anchor.start} < {prev.start}" if anchor.start < prev.start else "",
        ]
        for pid, state in prev.producers.items():
            now = anchor.producers.get(pid)
            if now is None or now.offset < state.offset:
                back.append(
                    f"producers.{pid}.offset {now.offset if now else None} < {state.offset}"
                )
        wrong = [b for b in back if b]
        if anchor.dataset_id != prev.dataset_id:
            wrong.insert(0, f"id {anchor.dataset_id} is not {prev.dataset_id}")
        if wrong:
            raise ChainError(
                f"{self.store.where(manifest_name(anchor.version))}: "
                f"{LiveCode.NOT_SUCCESSOR.value}: {wrong[0]}: it goes back on version "
                f"{prev.version}{_REFUSED}"
            )

    def segment(self, ref: SegmentRef) -> Segment:
        """The sealed segment ``ref`` names, checked against its digest and its reference
        (a segment kept from an earlier read is checked against each new reference too)."""
        with self._lock:
            cached = self._segments.get(ref.name)
            if cached is not None:
                self._segments.move_to_end(ref.name)
        where = self.store.where(ref.name)
        if cached is not None:
            digest, found = cached
            if digest != ref.xxh3:
                raise LiveError(f"{where}: xxh3 {digest}, the manifest says {ref.xxh3}")
        else:
            try:
                data = self.store.read(ref.name)
            except FileNotFoundError:
                raise LiveError(
                    f"{where}: a segment the manifest lists is missing (reclaimed since that "
                    "version was read, or deleted from the dataset)"
                ) from None
            digest = f"{xxhash.xxh3_64_intdigest(data):016x}"
            if digest != ref.xxh3:
                raise LiveError(f"{where}: xxh3 {digest}, the manifest says {ref.xxh3}")
            parsed = parse_segment(data, self.descriptor)
            if isinstance(parsed, LiveViolation):
                raise LiveError(f"{where}: {parsed.code.value}: {parsed.where}: {parsed.detail}")
            found = parsed
        last = found.entries[-1]
        if found.first != ref.first or last.end != ref.end or len(found.entries) != ref.entries:
            raise LiveError(f"{where}: does not hold what the manifest's reference says")
        if cached is None:
            with self._lock:
                self._segments[ref.name] = (digest, found)
                while len(self._segments) > SEGMENT_CACHE:
                    self._segments.popitem(last=False)
        return found

    def entries(self, manifest: LiveManifest, since: int = 0) -> list[Entry]:
        """Every entry of ``manifest`` that holds global batches at or after ``since``."""
        out: list[Entry] = []
        for ref in manifest.segments:
            if ref.end > since:
                out.extend(e for e in self.segment(ref).entries if e.end > since)
        out.extend(e for e in manifest.tail if e.end > since)
        return out
