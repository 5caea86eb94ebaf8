"""Retention of a live dataset: watermarks recorded with checkpoints, and ``reclaim``.

A consumer that saves a checkpoint records a *watermark* beside the data: the first global
batch a restore from that checkpoint reads (``watermark(state)``), as the object
``watermarks/<consumer>/<batch>.json`` holding the dataset's id and that batch
(``record_watermark``). The watermarks present are the *live checkpoints*: a consumer deletes
the watermark of a checkpoint it deletes (``record_watermark(..., keep=k)`` keeps its newest
``k``, as checkpoint rotation does). ``record_watermark`` refuses a state saved for another
dataset, a state whose ``samples`` disagrees with its ``step``, and a watermark beyond the
committed end, and writes the new watermark before it rotates old ones out.

``reclaim`` deletes what no live checkpoint can roll back to (``SPEC.md`` section 19), below
``W``, the smallest trusted watermark, and only from a verified chain of versions:

0. It reads every manifest version present and checks that each follows from its predecessor
   (``successor_violation``, section 18.4), the oldest present being the anchor. A version
   that does not, or a newest version that no longer lists batches from ``W`` on, stops it:
   ``ChainError`` names the version and the rule, and nothing is committed or deleted (in
   ``dry_run`` too). A crafted or mistaken version can block retention, never steer it.
   Watermarks lying beyond the committed end are ignored and reported; ones that name another
   dataset or have no readable id (written by an older version, damaged, or copied from
   elsewhere) still protect their batch, and are reported: a damaged id looks like another
   dataset's, and only a person can tell which it is.
1. It commits a manifest version that no longer lists the sealed segments ending at or before
   ``W`` (the same conditional create as producers; a conflict rebases and retries). Until that
   version exists nothing is deleted.
2. It then deletes the segment objects and batch objects that the newest version does not list
   and that lie before its first listed batch, the batch objects of producer offsets already
   committed that no version lists (written by a producer that died before committing them),
   the production records (section 22) of objects no longer listed, except the one each
   producer resumes from (its committed offset), manifest versions older than the newest
   ``keep_versions``, and, in a directory, temporary files that writers killed mid-write left
   (older than ``STALE_TEMPORARY_SECONDS``). Keys that are not the layout's names are reported
   and never touched.

With no trusted watermark, no batch data is reclaimed. Deletes are idempotent and each step
only removes what the newest version no longer reaches, so ``reclaim`` can be interrupted at
any point and run again, by anyone, at any time.
"""

from __future__ import annotations

import bisect
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field, replace
from typing import Any

from zerobatch_spec import HEADER_SIZE
from zerobatch_spec.dataset import header_xxh3
from zerobatch_spec.live import (
    BATCHES_PREFIX,
    DESCRIPTOR_NAME,
    SEGMENTS_PREFIX,
    WATERMARKS_PREFIX,
    Descriptor,
    Entry,
    LiveManifest,
    LiveViolation,
    Segment,
    SegmentRef,
    build_live_manifest,
    build_watermark,
    check_producer_id,
    manifest_name,
    parse_batch_name,
    parse_descriptor,
    parse_segment_name,
    parse_watermark,
    parse_watermark_name,
    successor_violation,
    trim,
    watermark_name,
)

from ..stores.resolve import open_store
from ..stores.store import LocalStore, Store
from .manifests import ChainError as ChainError
from .manifests import LiveError, ManifestChain
from .production import PRODUCTION_PREFIX, parse_batches_key

RECLAIM_WRITER = "reclaim"
"""The writer id retention's manifest versions carry."""
STALE_TEMPORARY_SECONDS = 3600.0
"""Age after which ``reclaim`` removes a directory store's temporary file: a writer finishes
one in seconds, so one this old was left by a writer that was killed."""
REPORTED_KEYS = 20
"""Ignored keys a report names (it counts them all)."""
_TEMPORARY = re.compile(r"\A\..+\.[0-9a-f]{12}\.tmp\Z")


class WatermarkError(LiveError):
    """A watermark ``record_watermark`` refuses: a state of another dataset, an inconsistent
    state, or a batch beyond what is committed."""


class LiveNotFoundError(LiveError, FileNotFoundError):
    """The live dataset's directory does not exist (a path that cannot be read)."""


def _descriptor(store: Store) -> Descriptor:
    try:
        data = store.read(DESCRIPTOR_NAME)
    except FileNotFoundError:
        if isinstance(store, LocalStore) and not os.path.isdir(store.root):
            raise LiveNotFoundError(f"{store.root}: no such directory") from None
        raise LiveError(f"{store.where(DESCRIPTOR_NAME)}: not a live dataset") from None
    descriptor = parse_descriptor(data)
    if isinstance(descriptor, LiveViolation):
        raise LiveError(f"{store.where(DESCRIPTOR_NAME)}: {descriptor.code.value}")
    return descriptor


def _state_int(state: dict[str, Any], key: str, low: int) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise WatermarkError(
            f"not a loader state of a live dataset: {key} is {value!r:.60}, expected an "
            f"integer of at least {low}"
        )
    return value


def watermark(state: dict[str, Any]) -> int:
    """The first global batch a restore from loader state ``state`` reads."""
    if not isinstance(state, dict):
        raise WatermarkError(f"not a loader state of a live dataset: {state!r:.200}")
    return _state_int(state, "samples", 0) // _state_int(state, "batch_size", 1)


def _checked_watermark(store: Store, descriptor: Descriptor, state: dict[str, Any]) -> int:
    """``watermark(state)`` of a state this dataset's loader saved, consistent in itself."""
    mark = watermark(state)
    where = store.where(DESCRIPTOR_NAME)
    mine = {"live": descriptor.dataset_id}
    if state.get("source") != mine:
        raise WatermarkError(
            f"{where}: the state was saved for another dataset (its source is "
            f"{state.get('source')!r:.120}, this live dataset is {mine!r}): a watermark is "
            "recorded only for a checkpoint of this dataset"
        )
    if state["batch_size"] != descriptor.batch_size or state.get("seq_len") != descriptor.seq_len:
        raise WatermarkError(
            f"{where}: the state's batch_size {state['batch_size']!r} and seq_len "
            f"{state.get('seq_len')!r:.40} are not this dataset's {descriptor.batch_size} and "
            f"{descriptor.seq_len}"
        )
    step = _state_int(state, "step", 0)
    size = _state_int(state, "global_batch_size", 1)
    if state.get("epoch", 0) != 0 or state["samples"] != step * size:
        raise WatermarkError(
            f"{where}: an inconsistent state: samples {state['samples']} is not step {step} "
            f"x global_batch_size {size} in epoch 0 (epoch {state.get('epoch')!r:.40})"
        )
    return mark


def record_watermark(
    dataset: str | Store, consumer: str, state: dict[str, Any], *, keep: int | None = None
) -> int:
    """Record the checkpoint ``state`` of ``consumer`` as a watermark; with ``keep``, delete
    the consumer's watermarks beyond its newest ``keep`` (the checkpoints it deleted).
    Returns the watermark.

    ``WatermarkError`` (and nothing written or deleted) for a state saved for another dataset,
    one whose ``samples`` is not ``step * global_batch_size``, or one beyond the committed end
    (the newest version's ``batches``). The new watermark is written before any old one is
    deleted; rotation counts only this dataset's watermarks at or below the committed end
    (another dataset's, or a damaged one, is left to ``reclaim``'s report)."""
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    store = open_store(dataset)
    check_producer_id(consumer)
    descriptor = _descriptor(store)
    mark = _checked_watermark(store, descriptor, state)
    committed = ManifestChain(store, descriptor).latest().batches
    if mark > committed:
        raise WatermarkError(
            f"{store.where(watermark_name(consumer, mark))}: watermark {mark} is beyond the "
            f"committed end {committed}: the state was not saved reading this dataset"
        )
    store.write(watermark_name(consumer, mark), build_watermark(descriptor.dataset_id, mark))
    if keep is not None:
        mine = []
        for key in store.list_keys(f"{WATERMARKS_PREFIX}{consumer}/"):
            found = parse_watermark_name(key)
            if found is None or found[0] != consumer or found[1] > committed:
                continue
            reason = _untrusted(store, key, found[1], descriptor.dataset_id, committed)
            if reason is None or reason.startswith(_LEGACY):
                mine.append(found[1])
        for batch in sorted(mine)[: max(0, len(mine) - keep)]:
            if batch != mark:
                store.delete(watermark_name(consumer, batch))
    return mark


def release_watermark(dataset: str | Store, consumer: str, batch: int) -> None:
    """Delete ``consumer``'s watermark at ``batch`` (its checkpoint was deleted)."""
    open_store(dataset).delete(watermark_name(consumer, batch))


def watermarks(store: Store) -> dict[str, list[int]]:
    """Every consumer's recorded watermarks (by their keys; their content is not read)."""
    out: dict[str, list[int]] = {}
    for key in store.list_keys(WATERMARKS_PREFIX):
        found = parse_watermark_name(key)
        if found is not None:
            out.setdefault(found[0], []).append(found[1])
    return {k: sorted(v) for k, v in out.items()}


_LEGACY = "unverified: "
_IGNORED = "ignored: "


def _untrusted(store: Store, key: str, batch: int, dataset_id: str, committed: int) -> str | None:
    """Why the watermark ``key`` is not trusted as it stands (``None``: it is).

    ``"ignored: ..."``: it does not count (it lies beyond the committed end: no checkpoint of
    this dataset can need it). ``"unverified: ..."``: it counts by its key's batch, which
    protects more, never less (another dataset's id, which a damaged id also looks like; no
    id: written before watermarks carried one; or content that cannot be read)."""
    if batch > committed:
        return f"{_IGNORED}beyond the committed end {committed}"
    try:
        found = parse_watermark(store.read(key))
    except FileNotFoundError:
        return f"{_IGNORED}deleted while read"
    if isinstance(found, LiveViolation):
        return f"{_LEGACY}{found.code.value}: {found.where}: {found.detail}"
    owner, content = found
    if owner is not None and owner != dataset_id:
        return f"{_LEGACY}recorded for another dataset ({owner}), or its id is damaged"
    if content != batch:
        return f"{_LEGACY}its content says batch {content}, its key {batch}"
    if owner is None:
        return f"{_LEGACY}no dataset id (written before watermarks carried one)"
    return None


@dataclass
class ReclaimReport:
    """What one ``reclaim`` run found and did."""

    watermark: int | None
    version: int
    start: int
    deleted: dict[str, int] = field(default_factory=dict)
    deleted_bytes: int = 0
    dry_run: bool = False
    committed: int = 0
    """The newest verified version's ``batches``."""
    versions_checked: int = 0
    """Manifest versions read and checked as a chain from the oldest present."""
    ignored_watermarks: dict[str, str] = field(default_factory=dict)
    """Watermark keys that did not count, and why (beyond the committed end)."""
    unverified_watermarks: dict[str, str] = field(default_factory=dict)
    """Watermark keys that counted by their key's batch without a verified id, and why."""
    ignored_keys: list[str] = field(default_factory=list)
    """Keys under the layout's prefixes that are not its names (never deleted)."""
    ignored_count: int = 0
    kept_batches: dict[str, str] = field(default_factory=dict)
    """Unlisted batch objects of committed offsets kept because the object listed for their
    offset is missing or is not what its entry says, and why."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "watermark": self.watermark,
            "version": self.version,
            "start": self.start,
            "committed": self.committed,
            "deleted": dict(self.deleted),
            "deleted_bytes": self.deleted_bytes,
            "dry_run": self.dry_run,
            "versions_checked": self.versions_checked,
            "ignored_watermarks": dict(self.ignored_watermarks),
            "unverified_watermarks": dict(self.unverified_watermarks),
            "ignored_keys": list(self.ignored_keys),
            "ignored_key_count": self.ignored_count,
            "kept_batches": dict(self.kept_batches),
        }

    def warnings(self) -> list[str]:
        """One line per finding a person should look at."""
        out = [f"watermark {k} {why}" for k, why in self.ignored_watermarks.items()]
        out += [f"watermark {k} {why}" for k, why in self.unverified_watermarks.items()]
        out += [f"batch object {k} {why}" for k, why in self.kept_batches.items()]
        if self.ignored_count:
            shown = ", ".join(self.ignored_keys)
            more = self.ignored_count - len(self.ignored_keys)
            out.append(
                f"{self.ignored_count} keys that are not live-dataset names were left alone: "
                f"{shown}{f' and {more} more' if more > 0 else ''}"
            )
        return out


def verified_chain(chain: ManifestChain) -> list[LiveManifest]:
    """Every manifest version present, oldest first, each checked to follow from the one
    before it (``successor_violation``, ``SPEC.md`` section 18.4), then the versions created
    since the listing. ``ChainError`` names the first version that does not follow (or does
    not parse). Versions a concurrent ``reclaim`` deletes while they are read (always the
    oldest first) make it list again."""
    store = chain.store

    def segment(ref: SegmentRef) -> Segment | None:
        if not store.exists(ref.name):
            return None  # reclaimed since: the versions after it no longer list it
        return chain.segment(ref)

    def check(prev: LiveManifest, nxt: LiveManifest) -> None:
        try:
            violation = successor_violation(prev, nxt, segment)
        except LiveError as e:
            raise ChainError(f"{e} (retention refuses to delete anything)") from None
        if violation is not None:
            raise ChainError(
                f"{store.where(manifest_name(nxt.version))}: {violation.code.value}: "
                f"{violation.where}: {violation.detail}: it does not follow from version "
                f"{prev.version}, so retention refuses to delete anything until the versions "
                "are checked by hand (SPEC.md section 19)"
            )

    def read(version: int) -> LiveManifest | None:
        try:
            return chain.read(version)
        except LiveError as e:
            raise ChainError(f"{e} (retention refuses to delete anything)") from None

    for _ in range(8):
        versions = chain.versions()
        if not versions:
            raise LiveError(f"{store.url}: a live dataset without manifest versions")
        found: list[LiveManifest] = []
        for v in versions:
            m = read(v)
            if m is None:
                if found:
                    break  # deleted since the listing: list again
                continue
            if found:
                check(found[-1], m)
            found.append(m)
        else:
            if not found:
                continue
            v = found[-1].version + 1
            while (m := read(v)) is not None:
                check(found[-1], m)
                found.append(m)
                v += 1
            return found
    raise LiveError(f"{store.url}: manifest versions keep disappearing while listed")


def _trusted_watermarks(
    store: Store, dataset_id: str, committed: int, report: ReclaimReport
) -> list[tuple[int, str]]:
    """``(batch, key)`` of every watermark that counts; the others go into ``report``.

    ``LiveError`` if the listing stepped past a key the store's client cannot hold (a ``.``,
    ``..`` or empty segment: ``unlisted``): such a key fails the client's whole listing page,
    so the watermarks listed beside it may be missing, and a missing watermark would let
    retention delete batches its checkpoint needs."""
    before = set(getattr(store, "unlisted", ()))
    keys = store.list_keys(WATERMARKS_PREFIX)
    hiding = sorted(set(getattr(store, "unlisted", ())) - before)
    if hiding:
        raise LiveError(
            f"{', '.join(store.where(k) for k in hiding)}: a key the object-store client cannot "
            "list (a '.', '..' or empty segment) among the watermarks hides the watermarks "
            "listed beside it, so retention refuses to delete anything until it is removed"
        )
    out = []
    for key in keys:
        found = parse_watermark_name(key)
        if found is None:
            continue
        reason = _untrusted(store, key, found[1], dataset_id, committed)
        if reason is not None and reason.startswith(_IGNORED):
            if reason != f"{_IGNORED}deleted while read":
                report.ignored_watermarks[key] = reason
            continue
        if reason is not None:
            report.unverified_watermarks[key] = reason
        out.append((found[1], key))
    for key in _odd_watermarks(store):  # present, but no object a listing shows
        found = parse_watermark_name(key)
        if found is not None and found[1] <= committed:
            report.unverified_watermarks[key] = f"{_LEGACY}not a regular file"
            out.append((found[1], key))
    return sorted(out)


def _odd_watermarks(store: Store) -> list[str]:
    """Keys of a directory store's watermark entries that are not regular files (a FIFO, a
    socket, a device): a listing leaves them out and reading them is refused, yet each stands
    for a checkpoint as much as a damaged watermark does, so it still protects its batch."""
    if not isinstance(store, LocalStore):
        return []
    root = os.path.join(store.root, WATERMARKS_PREFIX)
    out = []
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            try:
                mode = os.stat(path).st_mode
            except OSError:
                mode = 0  # a dangling link: no checkpoint behind it
            if mode and not stat.S_ISREG(mode):
                out.append(os.path.relpath(path, store.root).replace(os.sep, "/"))
    return sorted(out)


def reclaim(
    dataset: str | Store, *, keep_versions: int = 4, dry_run: bool = False, timeout: float = 60.0
) -> ReclaimReport:
    """Delete what no live checkpoint can roll back to (see the module docstring)."""
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be at least 1, got {keep_versions}")
    store = open_store(dataset)
    descriptor = _descriptor(store)
    chain = ManifestChain(store, descriptor)
    versions = verified_chain(chain)
    latest = versions[-1]
    report = ReclaimReport(None, latest.version, latest.start, dry_run=dry_run)
    report.committed = latest.batches
    report.versions_checked = len(versions)
    marks = _trusted_watermarks(store, descriptor.dataset_id, latest.batches, report)
    low = marks[0][0] if marks else None
    if low is not None and low < latest.start:
        raise ChainError(
            f"{store.where(manifest_name(latest.version))}: the newest version starts at "
            f"global batch {latest.start}, but the live checkpoint of {marks[0][1]} reads from "
            f"{low}: retention refuses to delete anything while a checkpoint needs batches no "
            "version lists (release that watermark if its checkpoint is gone)"
        )
    if low is not None and not dry_run:
        latest = _commit_trim(store, chain, latest, low, timeout)
    elif low is not None:
        latest = trim(latest, low)
    report.watermark, report.version, report.start = low, latest.version, latest.start

    def drop(kind: str, key: str) -> None:
        try:
            size = store.size(key)
        except FileNotFoundError:
            return
        if not dry_run:
            store.delete(key)
        report.deleted[kind] = report.deleted.get(kind, 0) + 1
        report.deleted_bytes += size

    def ignore(key: str) -> None:
        report.ignored_count += 1
        if len(report.ignored_keys) < REPORTED_KEYS:
            report.ignored_keys.append(key)

    listed = chain.entries(latest)
    referenced = {e.name for e in listed}
    segments = {r.name for r in latest.segments}
    for key in store.list_keys(SEGMENTS_PREFIX):
        first = parse_segment_name(key)
        if first is None:
            ignore(key)
        elif key not in segments and first < latest.start:
            drop("segments", key)
    holder = _ListedHolder(store, listed)
    for key in store.list_keys(BATCHES_PREFIX):
        found = parse_batch_name(key)
        if found is None:
            ignore(key)
            continue
        if key in referenced:
            continue
        state = latest.producers.get(found[0])
        if state is None or found[1] >= state.offset:
            continue  # a pending append
        doubt = holder.doubt(*found)
        if doubt is None:
            drop("batches", key)
        else:
            report.kept_batches[key] = doubt
    ends = {(e.producer, e.offset + e.num_batches) for e in listed}
    for key in store.list_keys(PRODUCTION_PREFIX):
        found = parse_batches_key(key)
        if found is None:
            continue  # a producer's configuration record, or a name not ours: kept
        state = latest.producers.get(found[0])
        if state is not None and found[1] < state.offset and found not in ends:
            drop("production", key)  # its object was trimmed; the resume cursor is kept
    for version in chain.versions():
        if version <= latest.version - keep_versions:
            drop("manifests", manifest_name(version))
    for key in sorted(getattr(store, "unlisted", ())):  # names the store's client cannot hold
        ignore(key)
    if isinstance(store, LocalStore):
        for name, size in _stale_temporaries(store.root, time.time() - STALE_TEMPORARY_SECONDS):
            if not dry_run:
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    continue
            report.deleted["temporaries"] = report.deleted.get("temporaries", 0) + 1
            report.deleted_bytes += size
    return report


class _ListedHolder:
    """Which listed entry holds a producer's offset, and whether its object is really there.

    A batch object that no version lists but whose offset its producer has committed is the
    leftover of a producer that died before committing it, and another object holds that
    offset, or it was trimmed. Before such an object is deleted, the listed object that holds
    its offset must exist as its entry describes it (size and header digest): a version that
    names a missing object for a committed offset (a mistaken or crafted entry name) must not
    turn the only copy of that batch into a "leftover"."""

    def __init__(self, store: Store, listed: list[Entry]) -> None:
        self.store = store
        self.by_producer: dict[str, list[Entry]] = {}
        for e in listed:
            self.by_producer.setdefault(e.producer, []).append(e)
        for entries in self.by_producer.values():
            entries.sort(key=lambda e: e.offset)
        self.checked: dict[str, str | None] = {}

    def doubt(self, producer: str, offset: int) -> str | None:
        """Why the leftover of ``producer`` at ``offset`` must be kept (``None``: it need not)."""
        entries = self.by_producer.get(producer, [])
        i = bisect.bisect_right([e.offset for e in entries], offset) - 1
        if i < 0 or offset >= entries[i].offset + entries[i].num_batches:
            return None  # no listed entry holds it: trimmed, or a dead producer's append
        entry = entries[i]
        if entry.name not in self.checked:
            self.checked[entry.name] = self._check(entry)
        return self.checked[entry.name]

    def _check(self, entry: Entry) -> str | None:
        try:
            head, size = self.store.read_head(entry.name, HEADER_SIZE)
        except FileNotFoundError:
            return f"kept: its offset is listed as {entry.name}, which is missing"
        if size != entry.size or header_xxh3(head) != entry.header_xxh3:
            return f"kept: its offset is listed as {entry.name}, which does not match its entry"
        return None


def _stale_temporaries(root: str, before: float) -> list[tuple[str, int]]:
    """``(path, size)`` of each temporary file of a directory store (the names
    ``LocalStore`` gives them) last modified before ``before``: regular files only, links
    not followed."""
    out = []
    for directory, _, files in os.walk(root):
        for name in files:
            if not _TEMPORARY.match(name):
                continue
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:  # removed since the directory was listed
                continue  # by another run: nothing left to remove
            if stat.S_ISREG(info.st_mode) and info.st_mtime < before:
                out.append((path, info.st_size))
    return out


def _commit_trim(
    store: Store, chain: ManifestChain, latest: LiveManifest, low: int, timeout: float
) -> LiveManifest:
    """The newest version, after committing one that stops listing what lies below ``low``.
    Versions that producers commit meanwhile are checked to follow as ``verified_chain``
    checks them (``ChainError`` otherwise)."""
    deadline = time.monotonic() + timeout
    while True:
        if latest.start > low:
            raise ChainError(
                f"{store.where(manifest_name(latest.version))}: starts at global batch "
                f"{latest.start}, after the lowest watermark {low}: retention refuses to "
                "delete anything"
            )
        trimmed = trim(latest, low)
        if trimmed is latest:
            return latest
        candidate = replace(
            trimmed, version=latest.version + 1, writer=RECLAIM_WRITER, nonce=secrets.token_hex(8)
        )
        if store.create(manifest_name(candidate.version), build_live_manifest(candidate)):
            return candidate
        if time.monotonic() > deadline:
            raise LiveError(f"{store.url}: reclaim could not commit a trimmed version in time")
        newer_versions = chain.after(latest.version, list_on_gap=False)
        if not newer_versions:  # reclaimed meanwhile by another run: check the chain again
            latest = verified_chain(chain)[-1]
            continue
        prev = latest
        for newer in newer_versions:
            violation = successor_violation(prev, newer)
            if violation is not None:
                raise ChainError(
                    f"{store.where(manifest_name(newer.version))}: {violation.code.value}: "
                    f"{violation.where}: {violation.detail}: it does not follow from version "
                    f"{prev.version}, so retention refuses to delete anything"
                )
            prev = newer
        latest = prev


def storage_bytes(dataset: str | Store) -> int:
    """Bytes of every object of the dataset (a listing and a size per object)."""
    store = open_store(dataset)
    return sum(store.size(key) for key in store.list_keys())
