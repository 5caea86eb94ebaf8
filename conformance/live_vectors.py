"""Live-dataset vectors (``SPEC.md`` sections 16-19): a descriptor and one manifest version.

Each vector is a directory ``<id>.live`` holding ``live.json`` and ``manifest.json``. Valid
vectors are built by the commit rule itself (``commit_entries``, ``seal``, ``trim``) from a
few producers' entries, written in canonical bytes, and pin what a reader must derive from
them: the version, the batch count, the first listed batch, the sealed segments, every tail
entry's place in the global order and each producer's committed offset. Invalid vectors
break one rule each, in section 18's order; every expectation is checked here against
``zerobatch_spec.live``'s parser, so a vector cannot state a rule the reference does not apply.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import xxhash
from zerobatch_spec import DTYPE_UINT16, DTYPE_UINT32, HEADER_SIZE, expected_file_size
from zerobatch_spec.live import (
    DESCRIPTOR_NAME,
    Descriptor,
    Entry,
    LiveManifest,
    LiveViolation,
    batch_name,
    build_descriptor,
    build_live_manifest,
    commit_entries,
    empty_manifest,
    parse_descriptor,
    parse_live_manifest,
    seal,
    trim,
)

from .vector import Vector

LIVE_SUFFIX = ".live"
MANIFEST_FILE = "manifest.json"
DESCRIPTOR = Descriptor(2, 3, 7, "5a42444154415345c0ffee0123456789", 2)
DESCRIPTOR16 = Descriptor(2, 2048, 7, "5a42444154415345c0ffee0123456789", 2, DTYPE_UINT16)
"""A live dataset of uint16 tokens whose batch objects are half the size they would be as
uint32 (2 x 2048 tokens: 8192 bytes, not 16384)."""


def _digest(data: bytes) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def _entry(
    producer: str, offset: int, n: int = 1, salt: int = 0, d: Descriptor = DESCRIPTOR
) -> Entry:
    sums = tuple(_digest(f"{producer}/{offset + i}/{salt}".encode()) for i in range(n))
    return Entry(
        batch_name(producer, offset, f"{offset + 16 * salt:08x}"),
        0,
        n,
        producer,
        offset,
        0,
        n * d.batch_size,
        expected_file_size(d.batch_size, d.seq_len, n, d.dtype),
        _digest(f"header {producer} {offset}".encode()),
        sums,
    )


def _commit(base: LiveManifest, producer: str, entries: list[Entry], nonce: int) -> LiveManifest:
    sealed, _ = seal(base, DESCRIPTOR.segment_size, _digest)
    manifest, _ = commit_entries(sealed, producer, entries, f"{nonce:08x}")
    return manifest


def history(d: Descriptor = DESCRIPTOR) -> list[LiveManifest]:
    """Manifest versions 0.. of three producers appending, sealing as writers do."""
    m = empty_manifest(d, "p-0", "00000000")
    out = [m]
    plan = [("p-0", 0, 1), ("p-1", 0, 2), ("p-0", 1, 1), ("p-2", 0, 1), ("p-1", 2, 1)]
    for k, (producer, offset, n) in enumerate(plan):
        m = _commit(m, producer, [_entry(producer, offset, n, d=d)], k + 1)
        out.append(m)
    return out


def answer(m: LiveManifest) -> dict[str, Any]:
    """What a reader answers for a valid manifest (``PROTOCOL.md``)."""
    return {
        "valid": True,
        "version": m.version,
        "batches": m.batches,
        "start": m.start,
        "segments": [[r.first, r.num_batches, r.entries] for r in m.segments],
        "entries": [[e.name, e.first, e.num_batches, e.producer, e.offset] for e in m.tail],
        "producers": {p: s.offset for p, s in sorted(m.producers.items())},
    }


def _vector(
    vid: str, comment: str, manifest: bytes, expected: dict[str, Any], descriptor: bytes
) -> Vector:
    flags = ["live", "live-valid"] if expected["valid"] else ["live", "live-invalid"]
    if not expected["valid"]:
        flags.append(str(expected["error"]))
    tree: dict[str, bytes | None] = {DESCRIPTOR_NAME: descriptor, MANIFEST_FILE: manifest}
    return Vector(vid, comment, flags, LIVE_SUFFIX, None, expected, tree=tree)


def valid(
    vid: str,
    comment: str,
    m: LiveManifest,
    data: bytes | None = None,
    d: Descriptor = DESCRIPTOR,
) -> Vector:
    raw = build_live_manifest(m) if data is None else data
    parsed = parse_live_manifest(raw, d)
    assert parsed == m, vid
    return _vector(vid, comment, raw, answer(m), build_descriptor(d))


def invalid(
    vid: str, comment: str, data: bytes, code: str, where: str, descriptor: bytes | None = None
) -> Vector:
    d = build_descriptor(DESCRIPTOR) if descriptor is None else descriptor
    found_d = parse_descriptor(d)
    if isinstance(found_d, LiveViolation):
        got_code, got_where = found_d.code.value, f"{DESCRIPTOR_NAME}:{found_d.where}"
    else:
        found = parse_live_manifest(data, found_d)
        assert isinstance(found, LiveViolation), vid
        got_code, got_where = found.code.value, found.where
    assert (got_code, got_where) == (code, where), (vid, got_code, got_where)
    return _vector(vid, comment, data, {"valid": False, "error": code, "where": where}, d)


def _doc(m: LiveManifest) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(build_live_manifest(m))
    return doc


def _dumps(doc: object) -> bytes:
    return (json.dumps(doc) + "\n").encode()


def _edit(m: LiveManifest, change: Callable[[dict[str, Any]], object]) -> bytes:
    doc = _doc(m)
    change(doc)
    return _dumps(doc)


def live_vectors() -> Iterator[Vector]:
    """Every live vector, valid ones first, then one per rule in section 18's order."""
    h = history()
    last = h[-1]
    yield valid("live-valid-version-0", "manifest version 0 of a new live dataset", h[0])
    yield valid(
        "live-valid-tail",
        "two commits of two producers, one object of two batches: entries in commit order",
        h[2],
    )
    yield valid(
        "live-valid-sealed",
        "five commits with segment_size 2: sealed segments, then the tail",
        last,
    )
    trimmed = trim(last, 3)
    assert trimmed.start > 0
    yield valid(
        "live-valid-trimmed",
        "retention stopped listing the segments below batch 3: start is their end",
        trimmed,
    )
    extra = _doc(h[2])
    extra["note"] = {"anything": [1, 2.5, None]}
    yield valid(
        "live-valid-unknown-keys",
        "an unknown top-level key is ignored, whatever its value",
        h[2],
        _dumps(extra),
    )
    m = h[2]
    yield invalid("live-not-json", "a truncated document", build_live_manifest(m)[:40],
                  "live_not_json", "document")  # fmt: skip
    yield invalid("live-not-json-duplicate-key", "a key given twice",
                  b'{"format": "zerobatch.live.manifest", "format": "x"}\n',
                  "live_not_json", "document")  # fmt: skip
    yield invalid("live-not-json-array", "a JSON array, not an object", b"[]\n",
                  "live_not_json", "document")  # fmt: skip
    yield invalid(
        "live-bad-format",
        "a static dataset's manifest format",
        _edit(m, lambda d: d.update(format="zerobatch.dataset")),
        "live_bad_format",
        "format",
    )
    versions: tuple[tuple[str, object], ...] = (
        ("2", 2),
        ("string", "1"),
        ("true", True),
        ("float", 1.0),
    )
    for name, value in versions:

        def set_version(d: dict[str, Any], v: object = value) -> None:
            d["version"] = v

        yield invalid(
            f"live-unsupported-version-{name}",
            f"version {json.dumps(value)}: only the JSON integer 1 is version 1",
            _edit(m, set_version),
            "live_unsupported_version",
            "version",
        )
    yield invalid(
        "live-bad-field-id-other-dataset",
        "the id of another dataset than the descriptor's",
        _edit(m, lambda d: d.update(id="f" * 32)),
        "live_bad_field",
        "id",
    )
    yield invalid(
        "live-bad-field-manifest-5000-digits",
        "a version number of 5000 digits",
        _edit(m, lambda d: d.update(manifest=0)).replace(
            b'"manifest": 0', b'"manifest": ' + b"9" * 5000
        ),
        "live_bad_field",
        "manifest",
    )
    yield invalid(
        "live-bad-field-nonce",
        "a nonce that is not 8 to 32 lowercase hexadecimal digits",
        _edit(m, lambda d: d.update(nonce="NONCE")),
        "live_bad_field",
        "nonce",
    )
    yield invalid(
        "live-bad-field-writer",
        "a writer id with a character outside the producer-id alphabet",
        _edit(m, lambda d: d.update(writer="p/0")),
        "live_bad_field",
        "writer",
    )
    yield invalid(
        "live-bad-field-segment-name",
        "a segment whose name is not segments/<first, 20 digits>.json",
        _edit(last, lambda d: d["segments"][0].update(name="segments/0.json")),
        "live_bad_field",
        "segments[0].name",
    )
    yield invalid(
        "live-not-contiguous-segment",
        "a segment that does not start where the one before it ends",
        _edit(
            last,
            lambda d: d["segments"][1].update(first=4, name="segments/00000000000000000004.json"),
        ),
        "live_not_contiguous",
        "segments[1].first",
    )
    yield invalid(
        "live-bad-field-entry-name",
        "an entry whose name is not its producer's and offset's",
        _edit(m, lambda d: d["tail"][1].update(name=batch_name("p-1", 1, "00000000"))),
        "live_bad_field",
        "tail[1].name",
    )
    yield invalid(
        "live-bad-field-entry-checksums",
        "an entry with fewer checksums than batches",
        _edit(m, lambda d: d["tail"][1]["checksums"].pop()),
        "live_bad_field",
        "tail[1].checksums",
    )
    yield invalid(
        "live-bad-field-entry-total-records",
        "an entry whose records cannot fill its batches",
        _edit(m, lambda d: d["tail"][0].update(total_records=1)),
        "live_bad_field",
        "tail[0].total_records",
    )
    yield invalid(
        "live-bad-field-entry-size",
        "an entry whose size is not its batches' file size",
        _edit(m, lambda d: d["tail"][0].update(size=HEADER_SIZE)),
        "live_bad_field",
        "tail[0].size",
    )
    yield invalid(
        "live-bad-field-entry-zero-batches",
        "an entry of no batch",
        _edit(m, lambda d: d["tail"][0].update(num_batches=0)),
        "live_bad_field",
        "tail[0].num_batches",
    )
    yield invalid(
        "live-not-contiguous-entry",
        "an entry that does not start where the one before it ends",
        _edit(m, lambda d: d["tail"][1].update(first=2)),
        "live_not_contiguous",
        "tail[1].first",
    )
    yield invalid(
        "live-not-contiguous-batches",
        "a batch count that is not where the last entry ends",
        _edit(m, lambda d: d.update(batches=9)),
        "live_not_contiguous",
        "batches",
    )
    yield invalid(
        "live-bad-producer-missing",
        "an entry of a producer the producer map does not hold",
        _edit(m, lambda d: d["producers"].pop("p-1")),
        "live_bad_producer",
        "tail[1].offset",
    )
    yield invalid(
        "live-bad-producer-behind",
        "a producer whose committed offset is behind its listed items",
        _edit(m, lambda d: d["producers"]["p-1"].update(offset=1)),
        "live_bad_producer",
        "tail[1].offset",
    )
    broken = json.loads(build_descriptor(DESCRIPTOR))
    broken["segment_size"] = 0
    yield invalid(
        "live-descriptor-bad-field",
        "a descriptor whose segment_size is 0",
        build_live_manifest(m),
        "live_bad_field",
        f"{DESCRIPTOR_NAME}:segment_size",
        _dumps(broken),
    )
    yield invalid(
        "live-descriptor-bad-format",
        "a descriptor of another format",
        build_live_manifest(m),
        "live_bad_format",
        f"{DESCRIPTOR_NAME}:format",
        _dumps({**broken, "format": "zerobatch.dataset"}),
    )
    yield from uint16_live_vectors()


def uint16_live_vectors() -> Iterator[Vector]:
    """A live dataset of uint16 tokens (``"dtype": 1`` in ``live.json``): valid, its entries
    sized for the other dtype, and descriptors whose dtype is not a defined code."""
    h16 = history(DESCRIPTOR16)
    yield valid(
        "live-valid-uint16",
        'a descriptor with "dtype": 1: entries of 2 x 2048 uint16 tokens, 8192 bytes a batch',
        h16[2],
        d=DESCRIPTOR16,
    )
    yield valid(
        "live-valid-uint16-sealed",
        "five commits of uint16 batch objects, sealed in segments of 2",
        h16[-1],
        d=DESCRIPTOR16,
    )
    u32 = dataclasses.replace(DESCRIPTOR16, dtype=DTYPE_UINT32)
    yield invalid(
        "live-uint16-entries-without-dtype",
        "uint16-sized entries under a descriptor without dtype (so uint32: 16384 bytes a batch)",
        build_live_manifest(h16[2]),
        "live_bad_field",
        "tail[0].size",
        build_descriptor(u32),
    )
    yield invalid(
        "live-uint32-entries-in-uint16-dataset",
        'uint32-sized entries under a descriptor with "dtype": 1 (8192 bytes a batch)',
        build_live_manifest(history(u32)[2]),
        "live_bad_field",
        "tail[0].size",
        build_descriptor(DESCRIPTOR16),
    )
    good = json.loads(build_descriptor(DESCRIPTOR16))
    for name, value in (("2", 2), ("string", "uint16"), ("true", True), ("null", None)):
        yield invalid(
            f"live-descriptor-dtype-{name}",
            f"a descriptor whose dtype is {json.dumps(value)}: only the JSON integers 0 and 1",
            build_live_manifest(h16[2]),
            "live_bad_field",
            f"{DESCRIPTOR_NAME}:dtype",
            _dumps({**good, "dtype": value}),
        )
