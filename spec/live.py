"""Live datasets: a dataset that grows while it is read (``SPEC.md`` sections 16 to 19).

Producers append *global batches* as LLMBATCH objects and publish them by creating the next
*manifest version* with a conditional create; readers see only what a manifest version lists,
in its order. This module is the reference for the objects' names, the descriptor, the
manifest and segment documents (parsing with rules in order, canonical bytes), the commit rule
(``commit_entries``: how a producer's entries extend a manifest exactly once) and sealing
(``seal``: how the manifest's size stays bounded).

Layout under a live dataset's root:

* ``live.json``: the descriptor (shape, seed, dataset id, segment size), created once.
* ``manifests/<v>.json``: manifest version ``v`` (20 decimal digits); version 0 lists nothing.
* ``segments/<first>.json``: a sealed run of entries starting at global batch ``first``.
* ``batches/<producer>/<offset>-<nonce>.batch``: batch objects (LLMBATCH files).
* ``watermarks/<consumer>/<batch>.json``: the live checkpoints' watermarks (section 19).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Final

from .dataset import _json_constant, _json_int, _json_object
from .layout import DEFINED_DTYPES, DTYPE_UINT32, U32_MAX, U64_MAX, dtype_field, expected_file_size

DESCRIPTOR_NAME: Final = "live.json"
MANIFESTS_PREFIX: Final = "manifests/"
SEGMENTS_PREFIX: Final = "segments/"
BATCHES_PREFIX: Final = "batches/"
WATERMARKS_PREFIX: Final = "watermarks/"

DESCRIPTOR_FORMAT: Final = "zerobatch.live"
MANIFEST_FORMAT: Final = "zerobatch.live.manifest"
SEGMENT_FORMAT: Final = "zerobatch.live.segment"
LIVE_VERSION: Final = 1
"""The version of sections 16-19: descriptor, manifest and segment layouts and the commit rule."""

DEFAULT_SEGMENT_SIZE: Final = 256
"""Entries per sealed segment unless the descriptor says otherwise."""

_PRODUCER = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")
_NONCE = re.compile(r"\A[0-9a-f]{8,32}\Z")
_HEX16 = re.compile(r"\A[0-9a-f]{16}\Z")
_ID = re.compile(r"\A[0-9a-f]{32}\Z")


class LiveCode(str, Enum):
    """Stable error codes of live documents (``SPEC.md`` section 18)."""

    NOT_JSON = "live_not_json"
    BAD_FORMAT = "live_bad_format"
    UNSUPPORTED_VERSION = "live_unsupported_version"
    BAD_FIELD = "live_bad_field"
    NOT_CONTIGUOUS = "live_not_contiguous"
    BAD_PRODUCER = "live_bad_producer"
    NOT_SUCCESSOR = "live_not_successor"
    """A version that does not follow from its predecessor (section 18.4)."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class LiveViolation:
    """One broken rule of a live document: its code, the field, and what was found."""

    code: LiveCode
    where: str
    detail: str


class LiveDocumentError(ValueError):
    """Raised by the ``parse_*`` functions' strict variants; carries the violation."""

    def __init__(self, violation: LiveViolation) -> None:
        self.violation = violation
        super().__init__(f"{violation.code.value}: {violation.where}: {violation.detail}")


@dataclass(frozen=True)
class Descriptor:
    """``live.json``: what every manifest version of the dataset shares."""

    batch_size: int
    seq_len: int
    seed: int
    dataset_id: str
    segment_size: int = DEFAULT_SEGMENT_SIZE
    dtype: int = DTYPE_UINT32
    """Token dtype code of every batch object (``"dtype"`` in ``live.json``, absent for 0)."""


@dataclass(frozen=True)
class Entry:
    """One batch object as a manifest lists it.

    It holds global batches ``first .. first + num_batches - 1`` and is items ``offset ..
    offset + num_batches - 1`` of its producer's stream. ``checksums`` are its slots'
    XXH3-64 digests in slot order.
    """

    name: str
    first: int
    num_batches: int
    producer: str
    offset: int
    seed: int
    total_records: int
    size: int
    header_xxh3: str
    checksums: tuple[str, ...]

    @property
    def end(self) -> int:
        """The global batch after the entry's last."""
        return self.first + self.num_batches


@dataclass(frozen=True)
class SegmentRef:
    """A sealed segment as a manifest lists it: its first global batch, batches, entries
    and the digest of its bytes."""

    name: str
    first: int
    num_batches: int
    entries: int
    xxh3: str

    @property
    def end(self) -> int:
        return self.first + self.num_batches


@dataclass(frozen=True)
class Producer:
    """A producer's committed state: the offset of its next item, and its commits."""

    offset: int
    commits: int


@dataclass(frozen=True)
class LiveManifest:
    """Manifest version ``version`` of a live dataset.

    ``start`` is the first global batch still listed (0 until retention trims: section 19);
    ``segments`` then ``tail`` list every entry from ``start`` to ``batches`` in order.
    """

    dataset_id: str
    version: int
    batches: int
    start: int
    segments: tuple[SegmentRef, ...]
    tail: tuple[Entry, ...]
    producers: dict[str, Producer]
    writer: str
    nonce: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Segment:
    """A sealed run of entries (``segments/<first>.json``)."""

    dataset_id: str
    first: int
    entries: tuple[Entry, ...]


# -- names -----------------------------------------------------------------------------------
def manifest_name(version: int) -> str:
    """The key of manifest version ``version``: ``manifests/`` + 20 digits + ``.json``."""
    return f"{MANIFESTS_PREFIX}{version:020d}.json"


def segment_name(first: int) -> str:
    """The key of the segment starting at global batch ``first``."""
    return f"{SEGMENTS_PREFIX}{first:020d}.json"


def batch_name(producer: str, offset: int, nonce: str) -> str:
    """The key of a producer's batch object starting at its stream offset ``offset``."""
    return f"{BATCHES_PREFIX}{producer}/{offset:020d}-{nonce}.batch"


def watermark_name(consumer: str, batch: int) -> str:
    """The key of ``consumer``'s watermark at global batch ``batch`` (section 19)."""
    return f"{WATERMARKS_PREFIX}{consumer}/{batch:020d}.json"


def parse_watermark_name(key: str) -> tuple[str, int] | None:
    """``(consumer, batch)`` of a watermark key, or ``None`` if ``key`` is not one."""
    m = re.fullmatch(r"watermarks/([A-Za-z0-9_-]{1,64})/(\d{20})\.json", key)
    return (m.group(1), int(m.group(2))) if m else None


def parse_segment_name(key: str) -> int | None:
    """The first global batch a segment key names, or ``None`` if ``key`` is not one."""
    m = re.fullmatch(r"segments/(\d{20})\.json", key)
    return int(m.group(1)) if m else None


def parse_manifest_name(key: str) -> int | None:
    """The version a manifest key names, or ``None`` if ``key`` is not one."""
    m = re.fullmatch(r"manifests/(\d{20})\.json", key)
    return int(m.group(1)) if m else None


def parse_batch_name(key: str) -> tuple[str, int] | None:
    """``(producer, offset)`` of a batch object key, or ``None`` if ``key`` is not one."""
    m = re.fullmatch(r"batches/([A-Za-z0-9_-]{1,64})/(\d{20})-[0-9a-f]{8,32}\.batch", key)
    return (m.group(1), int(m.group(2))) if m else None


def check_producer_id(producer: str) -> str:
    """``producer`` if it is a valid producer id (1-64 of ``A-Z a-z 0-9 _ -``)."""
    if not isinstance(producer, str) or not _PRODUCER.match(producer):
        raise ValueError(
            f"producer id must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-', got "
            f"{producer!r:.80}"
        )
    return producer


# -- parsing ---------------------------------------------------------------------------------
class _FailError(Exception):
    def __init__(self, code: LiveCode, where: str, detail: str) -> None:
        self.violation = LiveViolation(code, where, detail)


def _object(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object under 12.1's rules, or ``live_not_json``."""
    try:
        obj = json.loads(
            data.decode("utf-8"),
            parse_int=_json_int,
            parse_constant=_json_constant,
            object_pairs_hook=_json_object,
        )
    except (ValueError, RecursionError) as e:
        raise _FailError(LiveCode.NOT_JSON, "document", f"not UTF-8 JSON: {e}") from e
    if not isinstance(obj, dict):
        raise _FailError(LiveCode.NOT_JSON, "document", "expected a JSON object")
    return obj


def _load(data: bytes, fmt: str) -> dict[str, Any]:
    obj = _object(data)
    if obj.get("format") != fmt:
        raise _FailError(
            LiveCode.BAD_FORMAT, "format", f"expected {fmt!r}, found {obj.get('format')!r:.60}"
        )
    version = obj.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version != LIVE_VERSION:
        raise _FailError(
            LiveCode.UNSUPPORTED_VERSION,
            "version",
            f"this reader knows version {LIVE_VERSION}, found {version!r:.60}",
        )
    return obj


def _int(obj: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _FailError(
            LiveCode.BAD_FIELD,
            where + key,
            f"expected an integer in [{low}, {high}], found {value!r:.60}",
        )
    return value


def _str(obj: dict[str, Any], key: str, where: str, pattern: re.Pattern[str]) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not pattern.match(value):
        raise _FailError(
            LiveCode.BAD_FIELD,
            where + key,
            f"expected a string matching {pattern.pattern}, found {value!r:.60}",
        )
    return value


def _entry(obj: object, where: str, d: Descriptor) -> Entry:
    if not isinstance(obj, dict):
        raise _FailError(LiveCode.BAD_FIELD, where, "expected an object")
    w = where + "."
    name = obj.get("name")
    producer = _str(obj, "producer", w, _PRODUCER)
    first = _int(obj, "first", w, 0, U64_MAX)
    n = _int(obj, "num_batches", w, 1, U64_MAX)
    offset = _int(obj, "offset", w, 0, U64_MAX)
    seed = _int(obj, "seed", w, 0, U32_MAX)
    total = _int(obj, "total_records", w, 0, U32_MAX)
    size = _int(obj, "size", w, 4096, U64_MAX)
    digest = _str(obj, "header_xxh3", w, _HEX16)
    sums = obj.get("checksums")
    if not isinstance(sums, list) or not all(isinstance(c, str) and _HEX16.match(c) for c in sums):
        raise _FailError(LiveCode.BAD_FIELD, w + "checksums", "expected a list of 16-digit digests")
    if not isinstance(name, str) or parse_batch_name(name) != (producer, offset):
        raise _FailError(
            LiveCode.BAD_FIELD,
            w + "name",
            f"expected batches/{producer}/<offset {offset}, 20 digits>-<nonce>.batch, found "
            f"{name!r:.100}",
        )
    if len(sums) != n:
        raise _FailError(
            LiveCode.BAD_FIELD, w + "checksums", f"{len(sums)} digests for {n} batches"
        )
    if total < n * d.batch_size:
        raise _FailError(
            LiveCode.BAD_FIELD,
            w + "total_records",
            f"{total} records cannot fill {n} batches of {d.batch_size}",
        )
    if size != expected_file_size(d.batch_size, d.seq_len, n, d.dtype):
        raise _FailError(
            LiveCode.BAD_FIELD,
            w + "size",
            f"{size} bytes; {n} batches of [{d.batch_size}, {d.seq_len}] take "
            f"{expected_file_size(d.batch_size, d.seq_len, n, d.dtype)}",
        )
    return Entry(name, first, n, producer, offset, seed, total, size, digest, tuple(sums))


def _entries(items: object, where: str, first: int, d: Descriptor) -> tuple[Entry, ...]:
    """Entries that follow one another from global batch ``first``."""
    if not isinstance(items, list):
        raise _FailError(LiveCode.BAD_FIELD, where, "expected a list of entries")
    out = []
    at = first
    for i, obj in enumerate(items):
        e = _entry(obj, f"{where}[{i}]", d)
        if e.first != at:
            raise _FailError(
                LiveCode.NOT_CONTIGUOUS,
                f"{where}[{i}].first",
                f"expected global batch {at} (right after the entry before), found {e.first}",
            )
        at = e.end
        out.append(e)
    return tuple(out)


def _descriptor(obj: dict[str, Any]) -> Descriptor:
    return Descriptor(
        _int(obj, "batch_size", "", 1, U32_MAX),
        _int(obj, "seq_len", "", 1, U32_MAX),
        _int(obj, "seed", "", 0, U64_MAX),
        _str(obj, "id", "", _ID),
        _int(obj, "segment_size", "", 1, 1 << 20),
        _dtype(obj),
    )


def _dtype(obj: dict[str, Any]) -> int:
    """The optional ``dtype`` field: a defined token dtype code, 0 (uint32) when absent."""
    code = dtype_field(obj)
    if code is None:
        raise _FailError(
            LiveCode.BAD_FIELD,
            "dtype",
            f"expected a token dtype code ({DEFINED_DTYPES}), found {obj['dtype']!r:.60}",
        )
    return code


def parse_descriptor(data: bytes) -> Descriptor | LiveViolation:
    """The descriptor in ``data``, or the first rule it breaks (section 17)."""
    try:
        return _descriptor(_load(data, DESCRIPTOR_FORMAT))
    except _FailError as e:
        return e.violation


def parse_live_manifest(data: bytes, descriptor: Descriptor) -> LiveManifest | LiveViolation:
    """Manifest version bytes, checked against the dataset's descriptor (section 18's rules
    in order), or the first rule they break."""
    try:
        return _manifest(_load(data, MANIFEST_FORMAT), descriptor)
    except _FailError as e:
        return e.violation


def _manifest(obj: dict[str, Any], d: Descriptor) -> LiveManifest:
    dataset_id = _str(obj, "id", "", _ID)
    if dataset_id != d.dataset_id:
        raise _FailError(
            LiveCode.BAD_FIELD, "id", f"{dataset_id} is not the descriptor's {d.dataset_id}"
        )
    version = _int(obj, "manifest", "", 0, U64_MAX)
    batches = _int(obj, "batches", "", 0, U64_MAX)
    start = _int(obj, "start", "", 0, U64_MAX)
    writer = _str(obj, "writer", "", _PRODUCER)
    nonce = _str(obj, "nonce", "", _NONCE)
    refs_obj = obj.get("segments")
    if not isinstance(refs_obj, list):
        raise _FailError(LiveCode.BAD_FIELD, "segments", "expected a list of segments")
    refs = []
    at = start
    for i, r in enumerate(refs_obj):
        w = f"segments[{i}]."
        if not isinstance(r, dict):
            raise _FailError(LiveCode.BAD_FIELD, w[:-1], "expected an object")
        first = _int(r, "first", w, 0, U64_MAX)
        n = _int(r, "batches", w, 1, U64_MAX)
        count = _int(r, "entries", w, 1, U64_MAX)
        digest = _str(r, "xxh3", w, _HEX16)
        name = r.get("name")
        if name != segment_name(first):
            raise _FailError(LiveCode.BAD_FIELD, w + "name", f"expected {segment_name(first)!r}")
        if first != at:
            raise _FailError(
                LiveCode.NOT_CONTIGUOUS,
                w + "first",
                f"expected global batch {at} (right after what comes before), found {first}",
            )
        at = first + n
        refs.append(SegmentRef(name, first, n, count, digest))
    tail = _entries(obj.get("tail"), "tail", at, d)
    end = tail[-1].end if tail else at
    if end != batches:
        raise _FailError(
            LiveCode.NOT_CONTIGUOUS,
            "batches",
            f"{batches}, but the segments and tail end at global batch {end}",
        )
    producers_obj = obj.get("producers")
    if not isinstance(producers_obj, dict):
        raise _FailError(LiveCode.BAD_FIELD, "producers", "expected an object")
    producers: dict[str, Producer] = {}
    for pid, state in producers_obj.items():
        w = f"producers.{pid}"
        if not _PRODUCER.match(pid) or not isinstance(state, dict):
            raise _FailError(LiveCode.BAD_FIELD, w, "expected a producer id and an object")
        producers[pid] = Producer(
            _int(state, "offset", w + ".", 0, U64_MAX), _int(state, "commits", w + ".", 0, U64_MAX)
        )
    for i, e in enumerate(tail):
        state = producers.get(e.producer)
        if state is None or e.offset + e.num_batches > state.offset:
            raise _FailError(
                LiveCode.BAD_PRODUCER,
                f"tail[{i}].offset",
                f"items {e.offset}..{e.offset + e.num_batches - 1} of producer {e.producer}, "
                f"whose committed offset is {state.offset if state else 'absent'}",
            )
    known = {
        "format", "version", "id", "manifest", "batches", "start", "segments", "tail",
        "producers", "writer", "nonce",
    }  # fmt: skip
    extra = {k: v for k, v in obj.items() if k not in known}
    return LiveManifest(
        dataset_id, version, batches, start, tuple(refs), tail, producers, writer, nonce, extra
    )


def parse_segment(data: bytes, descriptor: Descriptor) -> Segment | LiveViolation:
    """A segment's bytes, or the first rule they break."""
    try:
        obj = _load(data, SEGMENT_FORMAT)
        dataset_id = _str(obj, "id", "", _ID)
        first = _int(obj, "first", "", 0, U64_MAX)
        entries = _entries(obj.get("entries"), "entries", first, descriptor)
        if not entries:
            raise _FailError(LiveCode.BAD_FIELD, "entries", "a segment holds at least one entry")
        return Segment(dataset_id, first, entries)
    except _FailError as e:
        return e.violation


# -- canonical bytes -------------------------------------------------------------------------
def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")


def entry_object(e: Entry) -> dict[str, Any]:
    """An entry's JSON object, fields in section 18's order."""
    return {
        "name": e.name,
        "first": e.first,
        "num_batches": e.num_batches,
        "producer": e.producer,
        "offset": e.offset,
        "seed": e.seed,
        "total_records": e.total_records,
        "size": e.size,
        "header_xxh3": e.header_xxh3,
        "checksums": list(e.checksums),
    }


def build_descriptor(d: Descriptor) -> bytes:
    """The descriptor's canonical bytes."""
    return _dumps(
        {
            "format": DESCRIPTOR_FORMAT,
            "version": LIVE_VERSION,
            "id": d.dataset_id,
            "batch_size": d.batch_size,
            "seq_len": d.seq_len,
            **({"dtype": d.dtype} if d.dtype != DTYPE_UINT32 else {}),
            "seed": d.seed,
            "segment_size": d.segment_size,
        }
    )


def build_live_manifest(m: LiveManifest) -> bytes:
    """A manifest version's canonical bytes (compact JSON, fields in section 18's order)."""
    return _dumps(
        {
            "format": MANIFEST_FORMAT,
            "version": LIVE_VERSION,
            "id": m.dataset_id,
            "manifest": m.version,
            "batches": m.batches,
            "start": m.start,
            "segments": [
                {
                    "name": r.name,
                    "first": r.first,
                    "batches": r.num_batches,
                    "entries": r.entries,
                    "xxh3": r.xxh3,
                }
                for r in m.segments
            ],
            "tail": [entry_object(e) for e in m.tail],
            "producers": {
                p: {"offset": s.offset, "commits": s.commits}
                for p, s in sorted(m.producers.items())
            },
            "writer": m.writer,
            "nonce": m.nonce,
            **m.extra,
        }
    )


def build_segment(s: Segment) -> bytes:
    """A segment's canonical bytes: the same entries always give the same bytes."""
    return _dumps(
        {
            "format": SEGMENT_FORMAT,
            "version": LIVE_VERSION,
            "id": s.dataset_id,
            "first": s.first,
            "entries": [entry_object(e) for e in s.entries],
        }
    )


# -- the commit rule -------------------------------------------------------------------------
def empty_manifest(d: Descriptor, writer: str, nonce: str) -> LiveManifest:
    """Manifest version 0: nothing committed."""
    return LiveManifest(d.dataset_id, 0, 0, 0, (), (), {}, writer, nonce)


class CommitConflictError(ValueError):
    """A producer's entries that cannot extend a manifest: a gap or an overlap in its stream."""


def commit_entries(
    base: LiveManifest, producer: str, entries: Sequence[Entry], writer_nonce: str
) -> tuple[LiveManifest, list[Entry]]:
    """Manifest version ``base.version + 1``: ``base`` with ``producer``'s ``entries`` appended
    (section 18, the commit rule), and the entries appended.

    ``entries`` are the producer's pending objects in stream order, with ``first`` not yet
    assigned. Those whose items ``base`` already has (``offset + num_batches <=`` the
    producer's committed offset) are dropped: a restarted producer, or one that lost a race,
    never commits an item twice. The next one must start exactly at the committed offset,
    and each further one where the previous ends; anything else is a ``CommitConflictError``.
    """
    state = base.producers.get(producer, Producer(0, 0))
    at, offset = base.batches, state.offset
    added: list[Entry] = []
    for e in entries:
        if e.offset + e.num_batches <= state.offset:
            continue  # already committed
        if e.offset != offset:
            raise CommitConflictError(
                f"producer {producer}: pending items start at {e.offset}, but its committed "
                f"stream ends at {offset} ({'a gap' if e.offset > offset else 'an overlap'})"
            )
        added.append(replace(e, first=at))
        at += e.num_batches
        offset += e.num_batches
    producers = dict(base.producers)
    producers[producer] = Producer(offset, state.commits + (1 if added else 0))
    manifest = replace(
        base,
        version=base.version + 1,
        batches=at,
        tail=base.tail + tuple(added),
        producers=producers,
        writer=producer,
        nonce=writer_nonce,
    )
    return manifest, added


def seal(
    manifest: LiveManifest, segment_size: int, digest: Any
) -> tuple[LiveManifest, list[tuple[str, bytes]]]:
    """Move whole runs of ``segment_size`` entries from the tail into sealed segments.

    Returns the new manifest and the segment objects ``(name, bytes)`` to write before the
    version that lists them. Writers seal a *committed* version (the base of their commit,
    before their own entries are appended): a segment's bytes then depend only on committed
    entries, which never change, so every writer that seals the same run writes the same
    object, and a commit that loses its race leaves nothing that differs. ``digest`` maps bytes
    to their 16-digit XXH3-64.
    """
    tail, refs, objects = list(manifest.tail), list(manifest.segments), []
    while len(tail) >= segment_size:
        run, tail = tail[:segment_size], tail[segment_size:]
        segment = Segment(manifest.dataset_id, run[0].first, tuple(run))
        data = build_segment(segment)
        name = segment_name(run[0].first)
        refs.append(
            SegmentRef(name, run[0].first, run[-1].end - run[0].first, len(run), digest(data))
        )
        objects.append((name, data))
    return replace(manifest, segments=tuple(refs), tail=tuple(tail)), objects


def trim(manifest: LiveManifest, keep_from: int) -> LiveManifest:
    """``manifest`` without the sealed segments that end at or before global batch
    ``keep_from`` (section 19): what retention may stop listing."""
    refs = tuple(r for r in manifest.segments if r.end > keep_from)
    if len(refs) == len(manifest.segments):
        return manifest
    start = refs[0].first if refs else manifest.batches - sum(e.num_batches for e in manifest.tail)
    return replace(manifest, segments=refs, start=start)


def live_entries(segments: Iterable[Segment], tail: Iterable[Entry]) -> list[Entry]:
    """Every entry of some segments then a tail, in order."""
    out = [e for s in segments for e in s.entries]
    out.extend(tail)
    return out


# -- the chain of versions (section 18.4) ----------------------------------------------------
def successor_violation(
    prev: LiveManifest,
    nxt: LiveManifest,
    segment: Callable[[SegmentRef], Segment | None] | None = None,
) -> LiveViolation | None:
    """The first rule of section 18.4 by which version ``nxt`` does not follow from ``prev``,
    or ``None`` when it does.

    A version follows from its predecessor when it is what a commit (18.3) or a trim (section
    19) of the predecessor can produce: the next number and the same id; the predecessor's
    sealed segments less a leading run of them, then new segments that seal a leading run of
    the predecessor's tail; the rest of that tail unchanged, then the entries added, from the
    predecessor's ``batches`` on; ``start`` at the first thing listed; and each producer's
    offset grown by exactly the batches of its added entries (which continue its stream), its
    commits by one if it added any. ``segment`` (optional) reads a segment a new reference
    names (``None`` if it was reclaimed since), to check that it holds exactly the tail
    entries it seals. A retention run that
    checks this for every version present trusts the newest only if it follows from the oldest
    (the anchor), so one crafted or mistaken version can stop retention but never steer it.
    """

    def fail(where: str, detail: str) -> LiveViolation:
        return LiveViolation(LiveCode.NOT_SUCCESSOR, where, detail)

    if nxt.dataset_id != prev.dataset_id:
        return fail("id", f"{nxt.dataset_id}, but version {prev.version} has {prev.dataset_id}")
    if nxt.version != prev.version + 1:
        return fail("manifest", f"{nxt.version} does not follow version {prev.version}")
    if nxt.batches < prev.batches:
        return fail("batches", f"{nxt.batches}: shrinks from {prev.batches}")
    old = prev.segments
    dropped = old.index(nxt.segments[0]) if nxt.segments and nxt.segments[0] in old else len(old)
    kept = len(old) - dropped
    for i in range(kept):
        if i >= len(nxt.segments) or nxt.segments[i] != old[dropped + i]:
            return fail(
                f"segments[{i}]",
                f"differs from version {prev.version}'s segment {old[dropped + i].name} (a "
                "version keeps the segments it does not trim as they are)",
            )
    tail, sealed = prev.tail, 0
    for i in range(kept, len(nxt.segments)):
        ref = nxt.segments[i]
        at = sealed
        sealed += ref.entries
        if at >= len(tail) or ref.first != tail[at].first or sealed > len(tail):
            return fail(
                f"segments[{i}]",
                f"{ref.name} ({ref.entries} entries) does not seal entries of version "
                f"{prev.version}'s tail ({len(tail) - at} left to seal)",
            )
        if ref.end != tail[sealed - 1].end:
            return fail(
                f"segments[{i}].batches",
                f"{ref.num_batches}: the tail entries it seals cover "
                f"{tail[sealed - 1].end - ref.first}",
            )
        found = segment(ref) if segment is not None else None
        if found is not None and found.entries != tail[at:sealed]:
            return fail(f"segments[{i}]", f"{ref.name} does not hold the tail entries it seals")
    rest = tail[sealed:]
    for i, e in enumerate(rest):
        if i >= len(nxt.tail) or nxt.tail[i] != e:
            return fail(
                f"tail[{i}]",
                f"entry {e.name} of version {prev.version} was removed or changed (tail "
                "entries leave the tail only by sealing)",
            )
    added = nxt.tail[len(rest) :]
    if added and added[0].first != prev.batches:
        return fail("tail", f"entries added at {added[0].first}, not at {prev.batches}")
    if nxt.segments:
        expected = nxt.segments[0].first
    else:
        expected = nxt.tail[0].first if nxt.tail else prev.batches
    if nxt.start != expected:
        return fail(
            "start",
            f"{nxt.start}: the first batch it lists is {expected} (start moves only by "
            f"trimming segments version {prev.version} listed)",
        )
    for pid in prev.producers:
        if pid not in nxt.producers:
            return fail(f"producers.{pid}", f"disappears after version {prev.version}")
    by_producer: dict[str, list[Entry]] = {}
    for e in added:
        by_producer.setdefault(e.producer, []).append(e)
    for pid in sorted(nxt.producers):
        state, before = nxt.producers[pid], prev.producers.get(pid, Producer(0, 0))
        at = before.offset
        for e in by_producer.get(pid, []):
            if e.offset != at:
                return fail(
                    f"producers.{pid}",
                    f"an added entry starts at offset {e.offset}, its stream was at {at}",
                )
            at += e.num_batches
        if state.offset != at:
            return fail(
                f"producers.{pid}.offset",
                f"{state.offset}: version {prev.version} has {before.offset} and the entries "
                f"added hold {at - before.offset} more",
            )
        commits = before.commits + (1 if pid in by_producer else 0)
        if state.commits != commits:
            return fail(f"producers.{pid}.commits", f"{state.commits}, expected {commits}")
    return None


# -- watermarks (section 19) -----------------------------------------------------------------
def build_watermark(dataset_id: str, batch: int) -> bytes:
    """A watermark object's canonical bytes: the dataset's id and the global batch."""
    return _dumps({"id": dataset_id, "batch": batch})


def parse_watermark(data: bytes) -> tuple[str | None, int] | LiveViolation:
    """``(dataset id, batch)`` of a watermark object, the id ``None`` for one written before
    watermarks carried it (``{"batch": n}``), or the first rule it breaks."""
    try:
        obj = _object(data)
        batch = _int(obj, "batch", "", 0, U64_MAX)
        if "id" not in obj:
            return None, batch
        return _str(obj, "id", "", _ID), batch
    except _FailError as e:
        return e.violation
