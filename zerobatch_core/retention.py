"""Retention of a live dataset: watermarks recorded with checkpoints, and ``reclaim``.

A consumer that saves a checkpoint records a *watermark* beside the data: the first global
batch a restore from that checkpoint reads (``watermark(state)``), as the object
``watermarks/<consumer>/<batch>.json`` (``record_watermark``). The watermarks present are the
*live checkpoints*: a consumer deletes the watermark of a checkpoint it deletes
(``record_watermark(..., keep=k)`` keeps its newest ``k``, as checkpoint rotation does).

``reclaim`` deletes what no live checkpoint can roll back to (``SPEC.md`` section 19), below
``W``, the smallest watermark:

1. It commits a manifest version that no longer lists the sealed segments ending at or before
   ``W`` (the same conditional create as producers; a conflict rebases and retries). Until that
   version exists nothing is deleted.
2. It then deletes the segment objects and batch objects that the newest version does not list
   and that lie before its first listed batch, the batch objects of producer offsets already
   committed that no version lists (written by a producer that died before committing them),
   and manifest versions older than the newest ``keep_versions``.

With no watermark at all, no batch data is reclaimed. Deletes are idempotent and each step
only removes what the newest version no longer reaches, so ``reclaim`` can be interrupted at
any point and run again, by anyone, at any time.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

from zerobatch_spec.live import (
    BATCHES_PREFIX,
    DESCRIPTOR_NAME,
    SEGMENTS_PREFIX,
    WATERMARKS_PREFIX,
    LiveManifest,
    LiveViolation,
    build_live_manifest,
    check_producer_id,
    manifest_name,
    parse_batch_name,
    parse_descriptor,
    parse_watermark_name,
    trim,
    watermark_name,
)

from .live_manifests import LiveError, ManifestChain
from .storage import Store, open_store

RECLAIM_WRITER = "reclaim"
"""The writer id retention's manifest versions carry."""


def watermark(state: dict[str, Any]) -> int:
    """The first global batch a restore from loader state ``state`` reads."""
    try:
        return int(state["samples"]) // int(state["batch_size"])
    except (KeyError, TypeError, ValueError):
        raise LiveError(f"not a loader state of a live dataset: {state!r:.200}") from None


def record_watermark(
    dataset: str | Store, consumer: str, state: dict[str, Any], *, keep: int | None = None
) -> int:
    """Record the checkpoint ``state`` of ``consumer`` as a watermark; with ``keep``, delete
    the consumer's watermarks beyond its newest ``keep`` (the checkpoints it deleted).
    Returns the watermark."""
    store = open_store(dataset)
    check_producer_id(consumer)
    mark = watermark(state)
    store.write(watermark_name(consumer, mark), f'{{"batch": {mark}}}\n'.encode())
    if keep is not None:
        mine = sorted(
            m for m in (parse_watermark_name(k) for k in store.list_keys(WATERMARKS_PREFIX))
            if m is not None and m[0] == consumer
        )  # fmt: skip
        for _, batch in mine[: max(0, len(mine) - keep)]:
            if batch != mark:
                store.delete(watermark_name(consumer, batch))
    return mark


def release_watermark(dataset: str | Store, consumer: str, batch: int) -> None:
    """Delete ``consumer``'s watermark at ``batch`` (its checkpoint was deleted)."""
    open_store(dataset).delete(watermark_name(consumer, batch))


def watermarks(store: Store) -> dict[str, list[int]]:
    """Every consumer's recorded watermarks."""
    out: dict[str, list[int]] = {}
    for key in store.list_keys(WATERMARKS_PREFIX):
        found = parse_watermark_name(key)
        if found is not None:
            out.setdefault(found[0], []).append(found[1])
    return {k: sorted(v) for k, v in out.items()}


@dataclass
class ReclaimReport:
    """What one ``reclaim`` run found and did."""

    watermark: int | None
    version: int
    start: int
    deleted: dict[str, int] = field(default_factory=dict)
    deleted_bytes: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "watermark": self.watermark,
            "version": self.version,
            "start": self.start,
            "deleted": dict(self.deleted),
            "deleted_bytes": self.deleted_bytes,
            "dry_run": self.dry_run,
        }


def reclaim(
    dataset: str | Store, *, keep_versions: int = 4, dry_run: bool = False, timeout: float = 60.0
) -> ReclaimReport:
    """Delete what no live checkpoint can roll back to (see the module docstring)."""
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be at least 1, got {keep_versions}")
    store = open_store(dataset)
    try:
        data = store.read(DESCRIPTOR_NAME)
    except FileNotFoundError:
        raise LiveError(f"{store.where(DESCRIPTOR_NAME)}: not a live dataset") from None
    descriptor = parse_descriptor(data)
    if isinstance(descriptor, LiveViolation):
        raise LiveError(f"{store.where(DESCRIPTOR_NAME)}: {descriptor.code.value}")
    chain = ManifestChain(store, descriptor)
    marks = [b for batches in watermarks(store).values() for b in batches]
    low = min(marks) if marks else None
    latest = chain.latest()
    if low is not None and not dry_run:
        latest = _commit_trim(store, chain, latest, low, timeout)
    elif low is not None:
        latest = trim(latest, low)
    report = ReclaimReport(low, latest.version, latest.start, dry_run=dry_run)

    def drop(kind: str, key: str) -> None:
        size = 0
        try:
            size = store.size(key)
        except FileNotFoundError:
            return
        if not dry_run:
            store.delete(key)
        report.deleted[kind] = report.deleted.get(kind, 0) + 1
        report.deleted_bytes += size

    listed = chain.entries(latest)
    referenced = {e.name for e in listed}
    segments = {r.name for r in latest.segments}
    for key in store.list_keys(SEGMENTS_PREFIX):
        if key not in segments and _segment_first(key) < latest.start:
            drop("segments", key)
    for key in store.list_keys(BATCHES_PREFIX):
        found = parse_batch_name(key)
        if found is None or key in referenced:
            continue
        state = latest.producers.get(found[0])
        if state is not None and found[1] < state.offset:
            drop("batches", key)
    for version in chain.versions():
        if version <= latest.version - keep_versions:
            drop("manifests", manifest_name(version))
    return report


def _segment_first(key: str) -> int:
    name = key[len(SEGMENTS_PREFIX) :].removesuffix(".json")
    return int(name) if name.isdigit() else -1


def _commit_trim(
    store: Store, chain: ManifestChain, latest: LiveManifest, low: int, timeout: float
) -> LiveManifest:
    """The newest version, after committing one that stops listing what lies below ``low``."""
    deadline = time.monotonic() + timeout
    while True:
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
        newer = chain.after(latest.version)
        latest = newer[-1] if newer else chain.latest()


def storage_bytes(dataset: str | Store) -> int:
    """Bytes of every object of the dataset (a listing and a size per object)."""
    store = open_store(dataset)
    return sum(store.size(key) for key in store.list_keys())
