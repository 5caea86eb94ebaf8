"""Reading a live dataset's manifest versions and segments from its store.

Producers, consumers and retention share this: finding the newest version (a listing once,
then probing ``v + 1``, ``v + 2``, ... as versions appear), reading and checking versions
against the descriptor, and reading sealed segments, which never change and are kept once
read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import xxhash
from zerobatch_spec.live import (
    MANIFESTS_PREFIX,
    Descriptor,
    Entry,
    LiveManifest,
    LiveViolation,
    Segment,
    SegmentRef,
    manifest_name,
    parse_live_manifest,
    parse_manifest_name,
    parse_segment,
)

from .errors import ZeroBatchError
from .storage import Store

SEGMENT_CACHE = 64
"""Segments kept in memory by one chain (least recently used first out)."""


class LiveError(ZeroBatchError, ValueError):
    """A live dataset that cannot be read or extended as asked (names the store and why)."""


class LiveTimeoutError(LiveError, TimeoutError):
    """A consumer waited longer than its timeout for a batch no producer has committed yet."""


class ManifestChain:
    """The manifest versions and segments of one live dataset in ``store``."""

    def __init__(self, store: Store, descriptor: Descriptor) -> None:
        self.store = store
        self.descriptor = descriptor
        self._segments: OrderedDict[str, Segment] = OrderedDict()
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
        """The newest version (a listing, then probing forward for versions created since)."""
        for _ in range(8):  # a version listed then reclaimed before it is read: list again
            versions = self.versions()
            if not versions:
                raise LiveError(f"{self.store.url}: a live dataset without manifest versions")
            newest = self.read(versions[-1])
            if newest is not None:
                newer = self.after(newest.version, list_on_gap=False)
                return newer[-1] if newer else newest
        raise LiveError(f"{self.store.url}: manifest versions keep disappearing while listed")

    def after(self, version: int, *, list_on_gap: bool = True) -> list[LiveManifest]:
        """The versions after ``version`` that exist now, in order (reads ``v + 1``, ``v + 2``,
        ... until one is missing). Retention may have deleted versions in between: if
        ``version + 1`` is missing, a listing finds any newer ones (``list_on_gap``)."""
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

    def segment(self, ref: SegmentRef) -> Segment:
        """The sealed segment ``ref`` names, checked against its digest and its reference."""
        with self._lock:
            cached = self._segments.get(ref.name)
            if cached is not None:
                self._segments.move_to_end(ref.name)
                return cached
        data = self.store.read(ref.name)
        digest = f"{xxhash.xxh3_64_intdigest(data):016x}"
        where = self.store.where(ref.name)
        if digest != ref.xxh3:
            raise LiveError(f"{where}: xxh3 {digest}, the manifest says {ref.xxh3}")
        found = parse_segment(data, self.descriptor)
        if isinstance(found, LiveViolation):
            raise LiveError(f"{where}: {found.code.value}: {found.where}: {found.detail}")
        last = found.entries[-1]
        if found.first != ref.first or last.end != ref.end or len(found.entries) != ref.entries:
            raise LiveError(f"{where}: does not hold what the manifest's reference says")
        with self._lock:
            self._segments[ref.name] = found
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
