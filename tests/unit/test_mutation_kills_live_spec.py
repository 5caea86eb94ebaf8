"""Behaviours of the live-dataset reference (``spec/live.py``: names, descriptor, manifest and
segment documents, the commit and sealing rules) that mutation testing found unpinned
(tests/README.md, "Mutation testing")."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, replace
from typing import Any

import pytest
from zerobatch_spec.layout import U32_MAX, U64_MAX
from zerobatch_spec.live import (
    CommitConflictError,
    Descriptor,
    LiveCode,
    LiveManifest,
    LiveViolation,
    Producer,
    Segment,
    SegmentRef,
    batch_name,
    build_descriptor,
    build_live_manifest,
    build_segment,
    build_watermark,
    check_producer_id,
    commit_entries,
    empty_manifest,
    live_entries,
    manifest_name,
    parse_batch_name,
    parse_descriptor,
    parse_live_manifest,
    parse_manifest_name,
    parse_segment,
    parse_segment_name,
    parse_watermark,
    parse_watermark_name,
    seal,
    segment_name,
    successor_violation,
    trim,
    watermark_name,
)

from tests.unit.test_live_spec import D, digest, entry

# -- SPEC.md section 20: the live test values ------------------------------------------------
SPEC_ID = "5a42444154415345c0ffee0123456789"
SPEC_DESCRIPTOR = (
    b'{"format":"zerobatch.live","version":1,"id":"5a42444154415345c0ffee0123456789",'
    b'"batch_size":2,"seq_len":3,"seed":7,"segment_size":2}\n'
)
SPEC_MANIFEST = (
    b'{"format":"zerobatch.live.manifest","version":1,"id":"5a42444154415345c0ffee0123456789",'
    b'"manifest":2,"batches":3,"start":0,"segments":[],"tail":[{"name":"batches/p-0/'
    b'00000000000000000000-00000000.batch","first":0,"num_batches":1,"producer":"p-0",'
    b'"offset":0,"seed":0,"total_records":2,"size":8192,"header_xxh3":"5d8e2aa4ff690416",'
    b'"checksums":["a7e6713abfa9d16f"]},{"name":"batches/p-1/00000000000000000000-00000000.batch",'
    b'"first":1,"num_batches":2,"producer":"p-1","offset":0,"seed":0,"total_records":4,'
    b'"size":12288,"header_xxh3":"fc71a8f150cc6ad5","checksums":["93217710017d9feb",'
    b'"bceb901c34de05a2"]}],"producers":{"p-0":{"offset":1,"commits":1},"p-1":{"offset":2,'
    b'"commits":1}},"writer":"p-1","nonce":"00000002"}\n'
)


def test_spec_section_20_descriptor_and_manifest_parse_and_rebuild_byte_for_byte() -> None:
    """SPEC.md section 20's descriptor and manifest version 2 of ``live-valid-tail``."""
    d = parse_descriptor(SPEC_DESCRIPTOR)
    assert d == Descriptor(2, 3, 7, SPEC_ID, 2)
    assert build_descriptor(d) == SPEC_DESCRIPTOR
    m = parse_live_manifest(SPEC_MANIFEST, d)
    assert isinstance(m, LiveManifest)
    assert (m.version, m.batches, m.start, m.writer, m.nonce) == (2, 3, 0, "p-1", "00000002")
    assert [(e.first, e.end, e.producer, e.offset) for e in m.tail] == [
        (0, 1, "p-0", 0),
        (1, 3, "p-1", 0),
    ]
    assert m.producers == {"p-0": Producer(1, 1), "p-1": Producer(2, 1)}
    assert m.extra == {}
    assert build_live_manifest(m) == SPEC_MANIFEST


def test_spec_section_20_keys_and_watermark() -> None:
    """SPEC.md section 20's keys, built and parsed back, and its watermark's canonical bytes."""
    assert manifest_name(12) == "manifests/00000000000000000012.json"
    assert segment_name(256) == "segments/00000000000000000256.json"
    key = "batches/prep-3/00000000000000000040-0a1b2c3d4e5f6a7b.batch"
    assert batch_name("prep-3", 40, "0a1b2c3d4e5f6a7b") == key
    assert watermark_name("trainer", 1200) == "watermarks/trainer/00000000000000001200.json"
    assert parse_manifest_name("manifests/00000000000000000012.json") == 12
    assert parse_segment_name("segments/00000000000000000256.json") == 256
    assert parse_batch_name(key) == ("prep-3", 40)
    assert parse_watermark_name("watermarks/trainer/00000000000000001200.json") == (
        "trainer",
        1200,
    )
    wm = build_watermark(SPEC_ID, 1200)
    assert wm == b'{"id":"5a42444154415345c0ffee0123456789","batch":1200}\n'
    assert parse_watermark(wm) == (SPEC_ID, 1200)


@pytest.mark.parametrize(
    "key",
    [
        "segments/256.json",
        "segments/00000000000000000256.jsonx",
        "manifests/00000000000000000256.json",
        "watermarks/trainer/1200.json",
        "watermarks/a b/00000000000000001200.json",
        "watermarks/" + "a" * 65 + "/00000000000000001200.json",
        "batches/p/00000000000000000040-0a1b2c3.batch",
    ],
)
def test_keys_that_are_not_section_16_names_parse_to_none(key: str) -> None:
    """A key of another shape is no segment, watermark or batch name."""
    assert parse_segment_name(key) is None
    assert parse_watermark_name(key) is None
    assert parse_batch_name(key) is None


def test_ends_are_first_plus_batches() -> None:
    """An entry's and a segment reference's ``end`` is the global batch after their last."""
    assert replace(entry("p-0", 0, 3), first=4).end == 7
    assert SegmentRef(segment_name(5), 5, 3, 2, "0" * 16).end == 8


@pytest.mark.parametrize(
    ("producer", "ok"),
    [("a", True), ("A-z_09", True), ("p" * 64, True), ("", False), ("p" * 65, False),
     ("a b", False), ("p.0", False), (5, False)],
)  # fmt: skip
def test_producer_ids_are_1_to_64_of_the_documented_characters(producer: Any, ok: bool) -> None:
    """SPEC.md 17.2: a producer id is 1 to 64 characters of ``A-Z a-z 0-9 _ -``."""
    if ok:
        assert check_producer_id(producer) == producer
    else:
        with pytest.raises(ValueError, match="producer id must be"):
            check_producer_id(producer)


# -- the descriptor (17.1, checked as 18.2 says) ---------------------------------------------
def _descriptor_with(**change: Any) -> Descriptor | LiveViolation:
    obj = json.loads(build_descriptor(D))
    obj.update(change)
    return parse_descriptor(json.dumps(obj).encode())


@pytest.mark.parametrize(
    ("field", "value"),
    [("batch_size", 1), ("batch_size", U32_MAX), ("seq_len", 1), ("seq_len", U32_MAX),
     ("seed", 0), ("seed", U64_MAX), ("segment_size", 1), ("segment_size", 1 << 20)],
)  # fmt: skip
def test_descriptor_fields_at_their_limits_are_accepted(field: str, value: int) -> None:
    """SPEC.md 17.1's ranges include their ends."""
    found = _descriptor_with(**{field: value})
    assert isinstance(found, Descriptor) and getattr(found, field) == value


@pytest.mark.parametrize(
    ("change", "code", "where"),
    [
        ({"batch_size": 0}, LiveCode.BAD_FIELD, "batch_size"),
        ({"batch_size": U32_MAX + 1}, LiveCode.BAD_FIELD, "batch_size"),
        ({"seq_len": 0}, LiveCode.BAD_FIELD, "seq_len"),
        ({"seq_len": U32_MAX + 1}, LiveCode.BAD_FIELD, "seq_len"),
        ({"seed": -1}, LiveCode.BAD_FIELD, "seed"),
        ({"seed": U64_MAX + 1}, LiveCode.BAD_FIELD, "seed"),
        ({"segment_size": 0}, LiveCode.BAD_FIELD, "segment_size"),
        ({"segment_size": (1 << 20) + 1}, LiveCode.BAD_FIELD, "segment_size"),
        ({"segment_size": True}, LiveCode.BAD_FIELD, "segment_size"),
        ({"id": "0123456789ABCDEF0123456789ABCDEF"}, LiveCode.BAD_FIELD, "id"),
        ({"id": 5}, LiveCode.BAD_FIELD, "id"),
        ({"format": "zerobatch.live.manifest"}, LiveCode.BAD_FORMAT, "format"),
        ({"version": True}, LiveCode.UNSUPPORTED_VERSION, "version"),
        ({"version": 1.0}, LiveCode.UNSUPPORTED_VERSION, "version"),
        # two rules broken: the first in 18.2's order for descriptors is reported
        ({"format": "x", "version": 2}, LiveCode.BAD_FORMAT, "format"),
        ({"version": 2, "batch_size": 0}, LiveCode.UNSUPPORTED_VERSION, "version"),
        ({"batch_size": 0, "seq_len": 0}, LiveCode.BAD_FIELD, "batch_size"),
        ({"seq_len": 0, "seed": -1}, LiveCode.BAD_FIELD, "seq_len"),
        ({"seed": -1, "id": "x"}, LiveCode.BAD_FIELD, "seed"),
        ({"id": "x", "segment_size": 0}, LiveCode.BAD_FIELD, "id"),
    ],
)
def test_descriptor_rules_in_order(change: dict[str, Any], code: LiveCode, where: str) -> None:
    """One past a limit is refused naming the field; with two broken, the first is reported."""
    found = _descriptor_with(**change)
    assert isinstance(found, LiveViolation), found
    assert (found.code, found.where) == (code, where), found


# -- manifest versions (18.1, 18.2) ----------------------------------------------------------
def _tail_manifest() -> LiveManifest:
    """Version 2 as in SPEC.md section 20: p-0's one-batch entry, then p-1's two-batch one."""
    m, _ = commit_entries(empty_manifest(D, "p-0", "00000000"), "p-0", [entry("p-0", 0)], "1" * 8)
    m, _ = commit_entries(m, "p-1", [entry("p-1", 0, 2)], "2" * 8)
    return m


def _sealed_manifest() -> LiveManifest:
    """Segments of one batch at 0 and two batches at 1, then a tail entry at 3."""
    m, _ = commit_entries(
        empty_manifest(D, "p-0", "00000000"),
        "p-0",
        [entry("p-0", 0), entry("p-0", 1, 2)],
        "1" * 8,
    )
    m, _ = seal(m, 1, digest)
    m, _ = commit_entries(m, "p-0", [entry("p-0", 3)], "2" * 8)
    assert [(r.first, r.num_batches, r.entries) for r in m.segments] == [(0, 1, 1), (1, 2, 1)]
    return m


BASES = {"tail": _tail_manifest, "sealed": _sealed_manifest}


def _parse_changed(base: str, change: dict[str, Any]) -> LiveManifest | LiveViolation:
    """The base manifest's canonical object with ``change`` applied (dotted paths, list indexes
    as numbers), parsed."""
    obj = json.loads(build_live_manifest(BASES[base]()))
    for path, value in change.items():
        *parents, last = (int(p) if p.isdigit() else p for p in path.split("."))
        target = obj
        for p in parents:
            target = target[p]
        target[last] = value
    return parse_live_manifest(json.dumps(obj).encode(), D)


@pytest.mark.parametrize(
    ("base", "change"),
    [
        ("tail", {"manifest": 0}),
        ("tail", {"manifest": U64_MAX}),
        ("tail", {"nonce": "0" * 8}),
        ("tail", {"nonce": "0" * 32}),
        ("tail", {"writer": "w" * 64}),
        ("tail", {"tail.0.seed": U32_MAX}),
        ("tail", {"tail.0.total_records": U32_MAX}),
        ("tail", {"tail.1.total_records": 4}),
        ("tail", {"producers.p-0.offset": U64_MAX, "producers.p-0.commits": U64_MAX}),
        ("tail", {"producers.p-9": {"offset": 0, "commits": 0}}),
        ("tail", {"producers.p-0.commits": 0}),
        ("sealed", {"segments.0.entries": 1, "segments.1.entries": U64_MAX}),
        ("sealed", {"segments.0.first": 0, "segments.0.batches": 1}),
    ],
)
def test_manifest_fields_at_their_limits_are_accepted(base: str, change: dict[str, Any]) -> None:
    """SPEC.md 18.1's ranges include their ends; a producer with nothing listed may be
    recorded at offset 0; a segment reference's entry count is taken as written."""
    found = _parse_changed(base, change)
    assert isinstance(found, LiveManifest), found


def test_an_empty_version_0_round_trips() -> None:
    """Version 0 (no batches, start 0, nothing listed) parses and rebuilds to the same bytes."""
    data = build_live_manifest(empty_manifest(D, "p-0", "00000000"))
    m = parse_live_manifest(data, D)
    assert isinstance(m, LiveManifest) and (m.version, m.batches, m.start) == (0, 0, 0)
    assert build_live_manifest(m) == data


BAD_NAME = batch_name("p-0", 1, "deadbeef")


@pytest.mark.parametrize(
    ("base", "change", "code", "where", "detail"),
    [
        ("tail", {"format": "zerobatch.live"}, LiveCode.BAD_FORMAT, "format", ""),
        ("tail", {"version": True}, LiveCode.UNSUPPORTED_VERSION, "version", ""),
        ("tail", {"version": 1.0}, LiveCode.UNSUPPORTED_VERSION, "version", ""),
        ("tail", {"version": "1"}, LiveCode.UNSUPPORTED_VERSION, "version", ""),
        ("tail", {"version": 0}, LiveCode.UNSUPPORTED_VERSION, "version", ""),
        ("tail", {"id": "f" * 32}, LiveCode.BAD_FIELD, "id", "is not the descriptor's"),
        ("tail", {"id": 5}, LiveCode.BAD_FIELD, "id", "expected a string"),
        ("tail", {"manifest": -1}, LiveCode.BAD_FIELD, "manifest", ""),
        ("tail", {"manifest": U64_MAX + 1}, LiveCode.BAD_FIELD, "manifest", ""),
        ("tail", {"manifest": 1.0}, LiveCode.BAD_FIELD, "manifest", ""),
        ("tail", {"manifest": False}, LiveCode.BAD_FIELD, "manifest", ""),
        ("tail", {"batches": -1}, LiveCode.BAD_FIELD, "batches", ""),
        ("tail", {"start": -1}, LiveCode.BAD_FIELD, "start", ""),
        ("tail", {"writer": ""}, LiveCode.BAD_FIELD, "writer", ""),
        ("tail", {"writer": "w" * 65}, LiveCode.BAD_FIELD, "writer", ""),
        ("tail", {"nonce": "0" * 7}, LiveCode.BAD_FIELD, "nonce", ""),
        ("tail", {"nonce": "0" * 33}, LiveCode.BAD_FIELD, "nonce", ""),
        ("tail", {"nonce": "ABCDEF01"}, LiveCode.BAD_FIELD, "nonce", ""),
        ("tail", {"segments": "x"}, LiveCode.BAD_FIELD, "segments", ""),
        ("sealed", {"segments.0": 5}, LiveCode.BAD_FIELD, "segments[0]", "expected an object"),
        ("sealed", {"segments.0.first": -1}, LiveCode.BAD_FIELD, "segments[0].first", ""),
        ("sealed", {"segments.0.batches": 0}, LiveCode.BAD_FIELD, "segments[0].batches", ""),
        ("sealed", {"segments.0.entries": 0}, LiveCode.BAD_FIELD, "segments[0].entries", ""),
        ("sealed", {"segments.0.xxh3": "F" * 16}, LiveCode.BAD_FIELD, "segments[0].xxh3", ""),
        ("sealed", {"segments.0.name": segment_name(1)}, LiveCode.BAD_FIELD,
         "segments[0].name", "expected 'segments/00000000000000000000.json'"),
        ("sealed", {"segments.1.first": 2, "segments.1.name": segment_name(2)},
         LiveCode.NOT_CONTIGUOUS, "segments[1].first", "expected global batch 1"),
        ("sealed", {"start": 1}, LiveCode.NOT_CONTIGUOUS, "segments[0].first",
         "expected global batch 1"),
        ("sealed", {"segments.1.batches": 1}, LiveCode.NOT_CONTIGUOUS, "tail[0].first",
         "expected global batch 2"),
        ("sealed", {"batches": 5}, LiveCode.NOT_CONTIGUOUS, "batches",
         "5, but the segments and tail end at global batch 4"),
        ("tail", {"batches": 2}, LiveCode.NOT_CONTIGUOUS, "batches",
         "2, but the segments and tail end at global batch 3"),
        ("tail", {"tail": "x"}, LiveCode.BAD_FIELD, "tail", "expected a list of entries"),
        ("tail", {"tail.1": 5}, LiveCode.BAD_FIELD, "tail[1]", "expected an object"),
        ("tail", {"tail.0.producer": ""}, LiveCode.BAD_FIELD, "tail[0].producer", ""),
        ("tail", {"tail.0.producer": "p" * 65}, LiveCode.BAD_FIELD, "tail[0].producer", ""),
        ("tail", {"tail.0.producer": 5}, LiveCode.BAD_FIELD, "tail[0].producer", ""),
        ("tail", {"tail.0.first": -1}, LiveCode.BAD_FIELD, "tail[0].first", ""),
        ("tail", {"tail.1.first": 2}, LiveCode.NOT_CONTIGUOUS, "tail[1].first",
         "expected global batch 1"),
        ("tail", {"tail.0.num_batches": 0}, LiveCode.BAD_FIELD, "tail[0].num_batches", ""),
        ("tail", {"tail.0.offset": -1}, LiveCode.BAD_FIELD, "tail[0].offset", ""),
        ("tail", {"tail.0.seed": -1}, LiveCode.BAD_FIELD, "tail[0].seed", ""),
        ("tail", {"tail.0.seed": U32_MAX + 1}, LiveCode.BAD_FIELD, "tail[0].seed", ""),
        ("tail", {"tail.0.total_records": -1}, LiveCode.BAD_FIELD, "tail[0].total_records",
         "expected an integer in [0, 4294967295]"),
        ("tail", {"tail.0.total_records": U32_MAX + 1}, LiveCode.BAD_FIELD,
         "tail[0].total_records", "expected an integer in [0, 4294967295]"),
        ("tail", {"tail.0.total_records": 0}, LiveCode.BAD_FIELD, "tail[0].total_records",
         "0 records cannot fill 1 batches of 2"),
        ("tail", {"tail.0.total_records": 1}, LiveCode.BAD_FIELD, "tail[0].total_records",
         "1 records cannot fill 1 batches of 2"),
        ("tail", {"tail.1.total_records": 3}, LiveCode.BAD_FIELD, "tail[1].total_records",
         "3 records cannot fill 2 batches of 2"),
        ("tail", {"tail.0.size": 4095}, LiveCode.BAD_FIELD, "tail[0].size",
         "expected an integer in [4096, 18446744073709551615]"),
        ("tail", {"tail.0.size": 4096}, LiveCode.BAD_FIELD, "tail[0].size",
         "4096 bytes; 1 batches of [2, 3] take 8192"),
        ("tail", {"tail.1.size": 8192}, LiveCode.BAD_FIELD, "tail[1].size",
         "8192 bytes; 2 batches of [2, 3] take 12288"),
        ("tail", {"tail.0.header_xxh3": "0" * 15}, LiveCode.BAD_FIELD, "tail[0].header_xxh3",
         ""),
        ("tail", {"tail.0.checksums": "0" * 16}, LiveCode.BAD_FIELD, "tail[0].checksums",
         "expected a list"),
        ("tail", {"tail.0.checksums": [5]}, LiveCode.BAD_FIELD, "tail[0].checksums",
         "expected a list"),
        ("tail", {"tail.0.checksums": ["Z" * 16]}, LiveCode.BAD_FIELD, "tail[0].checksums",
         "expected a list"),
        ("tail", {"tail.1.checksums": ["0" * 16, 5]}, LiveCode.BAD_FIELD,
         "tail[1].checksums", "expected a list"),
        ("tail", {"tail.0.checksums": []}, LiveCode.BAD_FIELD, "tail[0].checksums",
         "0 digests for 1 batches"),
        ("tail", {"tail.1.checksums": ["0" * 16] * 3}, LiveCode.BAD_FIELD,
         "tail[1].checksums", "3 digests for 2 batches"),
        ("tail", {"tail.0.name": 5}, LiveCode.BAD_FIELD, "tail[0].name", ""),
        ("tail", {"tail.0.name": batch_name("p-1", 0, "deadbeef")}, LiveCode.BAD_FIELD,
         "tail[0].name", ""),
        ("tail", {"tail.0.name": BAD_NAME}, LiveCode.BAD_FIELD, "tail[0].name", ""),
        ("tail", {"producers": []}, LiveCode.BAD_FIELD, "producers", "expected an object"),
        ("tail", {"producers.p-0": 5}, LiveCode.BAD_FIELD, "producers.p-0", ""),
        ("tail", {"producers.a b": {"offset": 0, "commits": 0}}, LiveCode.BAD_FIELD,
         "producers.a b", ""),
        ("tail", {"producers.p-0.offset": -1}, LiveCode.BAD_FIELD, "producers.p-0.offset", ""),
        ("tail", {"producers.p-0.commits": -1}, LiveCode.BAD_FIELD, "producers.p-0.commits",
         ""),
        ("tail", {"producers": {"p-1": {"offset": 2, "commits": 1}}}, LiveCode.BAD_PRODUCER,
         "tail[0].offset", "items 0..0 of producer p-0, whose committed offset is absent"),
        ("tail", {"producers.p-0.offset": 0}, LiveCode.BAD_PRODUCER, "tail[0].offset",
         "items 0..0 of producer p-0, whose committed offset is 0"),
        ("tail", {"producers.p-1.offset": 1}, LiveCode.BAD_PRODUCER, "tail[1].offset",
         "items 0..1 of producer p-1, whose committed offset is 1"),
    ],
)  # fmt: skip
def test_one_rule_broken_is_reported_with_its_code_and_field(
    base: str, change: dict[str, Any], code: LiveCode, where: str, detail: str
) -> None:
    """SPEC.md 18.2: a value one past its limit, of another type, or disagreeing with its entry
    is refused with the rule's code, naming the field (and saying what was wrong)."""
    found = _parse_changed(base, change)
    assert isinstance(found, LiveViolation), found
    assert (found.code, found.where) == (code, where), found
    assert detail in found.detail, found


@pytest.mark.parametrize(
    ("base", "change", "where"),
    [
        ("tail", {"format": "x", "version": 2}, "format"),
        ("tail", {"version": 2, "id": "x"}, "version"),
        ("tail", {"id": "f" * 32, "manifest": -1}, "id"),
        ("tail", {"manifest": -1, "batches": -1}, "manifest"),
        ("tail", {"batches": -1, "start": -1}, "batches"),
        ("tail", {"start": -1, "writer": ""}, "start"),
        ("tail", {"writer": "", "nonce": ""}, "writer"),
        ("tail", {"nonce": "", "segments": "x"}, "nonce"),
        ("sealed", {"segments.0.first": -1, "segments.0.batches": 0}, "segments[0].first"),
        ("sealed", {"segments.0.batches": 0, "segments.0.entries": 0}, "segments[0].batches"),
        ("sealed", {"segments.0.entries": 0, "segments.0.xxh3": ""}, "segments[0].entries"),
        ("sealed", {"segments.0.xxh3": "", "segments.0.name": ""}, "segments[0].xxh3"),
        ("sealed", {"segments.0.name": "", "start": 1}, "segments[0].name"),
        ("sealed", {"segments.1.first": 9, "tail": "x"}, "segments[1].name"),
        ("tail", {"segments": "x", "tail": "x"}, "segments"),
        ("tail", {"tail.0.producer": "", "tail.0.first": -1}, "tail[0].producer"),
        ("tail", {"tail.0.first": -1, "tail.0.num_batches": 0}, "tail[0].first"),
        ("tail", {"tail.0.num_batches": 0, "tail.0.offset": -1}, "tail[0].num_batches"),
        ("tail", {"tail.0.offset": -1, "tail.0.seed": -1}, "tail[0].offset"),
        ("tail", {"tail.0.seed": -1, "tail.0.total_records": -1}, "tail[0].seed"),
        ("tail", {"tail.0.total_records": -1, "tail.0.size": 4095}, "tail[0].total_records"),
        ("tail", {"tail.0.size": 4095, "tail.0.header_xxh3": ""}, "tail[0].size"),
        ("tail", {"tail.0.header_xxh3": "", "tail.0.checksums": 5}, "tail[0].header_xxh3"),
        ("tail", {"tail.0.checksums": 5, "tail.0.name": 5}, "tail[0].checksums"),
        ("tail", {"tail.0.name": 5, "tail.0.checksums": []}, "tail[0].name"),
        ("tail", {"tail.0.checksums": [], "tail.0.total_records": 1}, "tail[0].checksums"),
        ("tail", {"tail.0.total_records": 1, "tail.0.size": 4096}, "tail[0].total_records"),
        ("tail", {"tail.0.size": 4096, "tail.0.first": 5}, "tail[0].size"),
        ("tail", {"tail.0.first": 5, "batches": 9}, "tail[0].first"),
        ("tail", {"batches": 9, "producers": []}, "batches"),
        ("tail", {"producers.p-0.commits": -1, "producers.p-1.offset": 0}, "producers.p-0.commits"),
        ("tail", {"tail.0.seed": -1, "producers": []}, "tail[0].seed"),
    ],
)  # fmt: skip
def test_the_first_rule_broken_in_section_18_2_order_is_reported(
    base: str, change: dict[str, Any], where: str
) -> None:
    """SPEC.md 18.2's order of checks: with two rules broken, the earlier one is reported."""
    found = _parse_changed(base, change)
    assert isinstance(found, LiveViolation), found
    assert found.where == where, found


def test_a_missing_field_is_a_bad_field() -> None:
    """SPEC.md 18.2: a field that is missing is ``live_bad_field``, naming it."""
    for key in ("manifest", "batches", "start", "writer", "nonce", "tail", "producers"):
        obj = json.loads(build_live_manifest(_tail_manifest()))
        del obj[key]
        found = parse_live_manifest(json.dumps(obj).encode(), D)
        assert isinstance(found, LiveViolation) and found.code is LiveCode.BAD_FIELD, key
        assert found.where == key, found


@pytest.mark.parametrize(
    "data",
    [b"\xff{}", b"{", b"[]", b"5", b"[" * 100_000, b'{"a":1,"a":1}', b'{"a":NaN}'],
)
def test_documents_that_are_not_json_objects_are_not_json(data: bytes) -> None:
    """SPEC.md 18.2: bytes that are not UTF-8 JSON (12.1's rules: no duplicate keys, no NaN; a
    nesting too deep to parse included), or not an object, are ``live_not_json`` for every
    document."""
    for found in (
        parse_descriptor(data),
        parse_live_manifest(data, D),
        parse_segment(data, D),
        parse_watermark(data),
    ):
        assert isinstance(found, LiveViolation), found
        assert (found.code, found.where) == (LiveCode.NOT_JSON, "document"), found


def test_unknown_keys_are_kept_and_written_after_the_known_ones() -> None:
    """SPEC.md 18.1: unknown keys are ignored by the rules, kept, and come after the known ones
    in canonical bytes."""
    obj = json.loads(build_live_manifest(_tail_manifest()))
    obj["zz"] = [1]
    obj = {"aa": {"b": 2}, **obj}
    m = parse_live_manifest(json.dumps(obj).encode(), D)
    assert isinstance(m, LiveManifest) and m.extra == {"aa": {"b": 2}, "zz": [1]}
    data = build_live_manifest(m)
    assert data.endswith(b'"nonce":"22222222","aa":{"b":2},"zz":[1]}\n')
    assert data.startswith(b'{"format":"zerobatch.live.manifest","version":1,')


def test_unknown_keys_do_not_make_versions_differ() -> None:
    """Two versions that differ only in unknown keys compare equal: the rules' fields are what
    a version is."""
    m = _tail_manifest()
    obj = json.loads(build_live_manifest(m))
    obj["zz"] = 1
    found = parse_live_manifest(json.dumps(obj).encode(), D)
    assert isinstance(found, LiveManifest) and found.extra == {"zz": 1}
    assert found == m


def _value(kind: str) -> tuple[object, str]:
    """A value of each document type, and one of its fields."""
    m = _sealed_manifest()
    return {
        "violation": (LiveViolation(LiveCode.BAD_FIELD, "id", "x"), "where"),
        "descriptor": (D, "segment_size"),
        "entry": (m.tail[0], "first"),
        "segment reference": (m.segments[0], "first"),
        "producer": (m.producers["p-0"], "offset"),
        "manifest": (m, "batches"),
        "segment": (Segment(D.dataset_id, 3, m.tail), "first"),
    }[kind]


@pytest.mark.parametrize(
    "kind",
    ["violation", "descriptor", "entry", "segment reference", "producer", "manifest", "segment"],
)
def test_documents_are_immutable_values(kind: str) -> None:
    """Violations, descriptors, entries, segment references, producer states, versions and
    segments cannot be changed once made (versions are shared between readers and writers)."""
    value, attribute = _value(kind)
    with pytest.raises(FrozenInstanceError):
        setattr(value, attribute, 0)


def test_canonical_bytes_order_producers_by_id() -> None:
    """SPEC.md 18.1: producers in ascending byte order of their ids, whatever order they were
    committed in."""
    m, _ = commit_entries(empty_manifest(D, "p-b", "00000000"), "p-b", [entry("p-b", 0)], "1" * 8)
    m, _ = commit_entries(m, "p-a", [entry("p-a", 0)], "2" * 8)
    m, _ = commit_entries(m, "P-c", [entry("P-c", 0)], "3" * 8)
    assert list(json.loads(build_live_manifest(m))["producers"]) == ["P-c", "p-a", "p-b"]


# -- segment objects -------------------------------------------------------------------------
def _segment_with(**change: Any) -> Segment | LiveViolation:
    m = _tail_manifest()
    obj = json.loads(build_segment(Segment(D.dataset_id, 0, m.tail)))
    obj.update(change)
    return parse_segment(json.dumps(obj).encode(), D)


def test_a_segment_round_trips() -> None:
    """A segment's canonical bytes parse back to it, and build to the same bytes."""
    m = _tail_manifest()
    data = build_segment(Segment(D.dataset_id, 0, m.tail))
    assert data.startswith(b'{"format":"zerobatch.live.segment","version":1,"id":"')
    found = parse_segment(data, D)
    assert found == Segment(D.dataset_id, 0, m.tail)
    assert build_segment(found) == data


@pytest.mark.parametrize(
    ("change", "code", "where"),
    [
        ({"entries": []}, LiveCode.BAD_FIELD, "entries"),
        ({"entries": "x"}, LiveCode.BAD_FIELD, "entries"),
        ({"first": -1}, LiveCode.BAD_FIELD, "first"),
        ({"first": 1}, LiveCode.NOT_CONTIGUOUS, "entries[0].first"),
        ({"id": "X"}, LiveCode.BAD_FIELD, "id"),
        ({"format": "zerobatch.live.manifest"}, LiveCode.BAD_FORMAT, "format"),
        ({"version": 2}, LiveCode.UNSUPPORTED_VERSION, "version"),
    ],
)
def test_segment_rules(change: dict[str, Any], code: LiveCode, where: str) -> None:
    """SPEC.md 18.2: a segment is checked like a tail from its ``first``, and holds at least one
    entry."""
    found = _segment_with(**change)
    assert isinstance(found, LiveViolation), found
    assert (found.code, found.where) == (code, where), found


# -- watermarks ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"batch":0}', (None, 0)),
        (b'{"batch":18446744073709551615}', (None, U64_MAX)),
        (b'{"id":"0123456789abcdef0123456789abcdef","batch":0}', (D.dataset_id, 0)),
    ],
)
def test_watermark_batches_at_their_limits_are_accepted(
    data: bytes, expected: tuple[str | None, int]
) -> None:
    """SPEC.md 19: a watermark's batch is a global batch, 0 to 2^64 - 1."""
    assert parse_watermark(data) == expected


@pytest.mark.parametrize(
    ("data", "where"),
    [(b'{"batch":-1}', "batch"), (b'{"batch":18446744073709551616}', "batch"),
     (b'{"batch":true}', "batch"), (b'{"id":null,"batch":1}', "id")],
)  # fmt: skip
def test_watermark_rules(data: bytes, where: str) -> None:
    """A watermark's batch out of range, or an id that is present but not one, is refused."""
    found = parse_watermark(data)
    assert isinstance(found, LiveViolation) and found.code is LiveCode.BAD_FIELD, found
    assert found.where == where


# -- the commit rule (18.3) ------------------------------------------------------------------
def test_a_new_producers_first_commit_counts_one() -> None:
    """A producer absent from the base starts at offset 0 with no commits: its first commit
    leaves it at the end of its entries with one commit."""
    m, added = commit_entries(
        empty_manifest(D, "w", "00000000"), "p-0", [entry("p-0", 0, 2)], "a" * 8
    )
    assert [e.first for e in added] == [0]
    assert m.producers == {"p-0": Producer(2, 1)}
    assert (m.version, m.batches, m.writer, m.nonce) == (1, 2, "p-0", "a" * 8)


def test_a_commit_of_several_entries_counts_one_commit() -> None:
    """Entries appended in one commit get consecutive global batches; the commit counts once."""
    base = _tail_manifest()
    m, added = commit_entries(base, "p-0", [entry("p-0", 1, 2), entry("p-0", 3, 1)], "b" * 8)
    assert [(e.first, e.end) for e in added] == [(3, 5), (5, 6)]
    assert m.tail == base.tail + tuple(added)
    assert m.producers == {"p-0": Producer(4, 2), "p-1": Producer(2, 1)}
    assert isinstance(parse_live_manifest(build_live_manifest(m), D), LiveManifest)
    assert successor_violation(base, m) is None


def test_a_restart_drops_what_is_committed_and_appends_the_rest() -> None:
    """SPEC.md 18.3 step 2: entries ending at or before the committed offset are dropped, and
    the pending ones after them are still appended."""
    base = _tail_manifest()  # p-1 committed items 0..1
    pending = [entry("p-1", 0, 2), entry("p-1", 2), entry("p-1", 3, 2)]
    m, added = commit_entries(base, "p-1", pending, "c" * 8)
    assert [(e.offset, e.first) for e in added] == [(2, 3), (3, 4)]
    assert m.producers["p-1"] == Producer(5, 2) and m.batches == 6


def test_a_commit_that_adds_nothing_keeps_the_producers_count() -> None:
    """A commit whose entries were all committed before still makes the next version, but
    counts no commit."""
    base = _tail_manifest()
    m, added = commit_entries(base, "p-1", [entry("p-1", 0, 2)], "d" * 8)
    assert added == [] and m.tail == base.tail and m.batches == base.batches
    assert m.producers == base.producers and m.version == base.version + 1
    assert successor_violation(base, m) is None


def test_a_conflict_names_the_producer_and_the_offsets() -> None:
    """A gap or an overlap says where the pending items start and where the stream ends."""
    base = _tail_manifest()
    with pytest.raises(CommitConflictError) as gap:
        commit_entries(base, "p-1", [entry("p-1", 3)], "e" * 8)
    assert str(gap.value) == (
        "producer p-1: pending items start at 3, but its committed stream ends at 2 (a gap)"
    )
    with pytest.raises(CommitConflictError) as overlap:
        commit_entries(base, "p-1", [entry("p-1", 1, 2)], "e" * 8)
    assert "start at 1, but its committed stream ends at 2 (an overlap)" in str(overlap.value)


# -- sealing and trimming --------------------------------------------------------------------
def _run(sizes: list[int]) -> LiveManifest:
    """One commit of p-0's entries of ``sizes`` batches each."""
    entries, offset = [], 0
    for n in sizes:
        entries.append(entry("p-0", offset, n))
        offset += n
    return commit_entries(empty_manifest(D, "p-0", "00000000"), "p-0", entries, "1" * 8)[0]


def test_a_tail_of_exactly_segment_size_entries_is_sealed_whole() -> None:
    """SPEC.md 18.3 step 1: a run of ``segment_size`` entries becomes one segment named by its
    first batch, covering its batches, with the digest of its canonical bytes."""
    m = _run([2, 1, 3])
    sealed, objects = seal(m, 3, digest)
    data = build_segment(Segment(D.dataset_id, 0, m.tail))
    assert objects == [(segment_name(0), data)]
    assert sealed.segments == (SegmentRef(segment_name(0), 0, 6, 3, digest(data)),)
    assert sealed.tail == () and sealed.batches == 6
    assert isinstance(parse_live_manifest(build_live_manifest(sealed), D), LiveManifest)
    assert seal(m, 4, digest) == (m, [])


def test_sealing_after_earlier_segments_appends_runs_and_keeps_the_rest() -> None:
    """Runs after existing segments start where the earlier ones end; the remainder stays."""
    m = _run([1, 2, 1, 3, 2])
    once, _ = seal(m, 3, digest)  # entries at 0, 1, 3: batches 0..3; entries at 4, 7 stay
    more = [entry("p-0", 9), entry("p-0", 10), entry("p-0", 11, 2)]
    m2, _ = commit_entries(once, "p-0", more, "2" * 8)
    twice, objects = seal(m2, 2, digest)
    assert [(r.first, r.num_batches, r.entries) for r in twice.segments] == [
        (0, 4, 3),
        (4, 5, 2),
        (9, 2, 2),
    ]
    assert [name for name, _ in objects] == [segment_name(4), segment_name(9)]
    assert [e.first for e in twice.tail] == [11]
    segs = [parse_segment(data, D) for _, data in objects]
    assert all(isinstance(s, Segment) for s in segs)
    assert live_entries([s for s in segs if isinstance(s, Segment)], twice.tail) == list(m2.tail)


def test_default_segment_size_seals_runs_of_256() -> None:
    """A descriptor made without ``segment_size`` (as a producer's default) seals every 256
    entries: 256 entries make one segment, 255 none."""
    size = Descriptor(1, 1, 0, D.dataset_id).segment_size
    m = _run([1] * 256)
    sealed, objects = seal(m, size, digest)
    assert len(objects) == 1 and sealed.segments[0].entries == 256 and sealed.tail == ()
    m = _run([1] * 255)
    assert seal(m, size, digest)[1] == []


def _three_segments() -> LiveManifest:
    """Segments at 0 (2 batches), 2 (3 batches) and 5 (2 batches), then a tail at 7 and 8."""
    m, _ = seal(_run([1, 1, 2, 1, 1, 1]), 2, digest)
    m, _ = commit_entries(m, "p-0", [entry("p-0", 7), entry("p-0", 8, 2)], "2" * 8)
    assert [(r.first, r.end) for r in m.segments] == [(0, 2), (2, 5), (5, 7)]
    assert [(e.first, e.end) for e in m.tail] == [(7, 8), (8, 10)]
    return m


def test_trim_drops_segments_ending_at_keep_from_and_starts_at_the_first_kept() -> None:
    """SPEC.md 19 step 1: segments whose range ends at or before the watermark go; ``start``
    is the first remaining segment's ``first``."""
    m = _three_segments()
    t = trim(m, 2)
    assert [r.first for r in t.segments] == [2, 5] and t.start == 2
    assert isinstance(parse_live_manifest(build_live_manifest(t), D), LiveManifest)
    assert trim(m, 1) is m
    assert trim(m, 4).start == 2
    assert trim(m, 5).start == 5


def test_trimming_every_segment_starts_at_the_tail() -> None:
    """With no segment left, ``start`` is the tail's first entry's ``first``."""
    m = _three_segments()
    t = trim(m, 7)
    assert t.segments == () and t.start == 7 and t.tail == m.tail
    assert isinstance(parse_live_manifest(build_live_manifest(t), D), LiveManifest)


# -- the chain of versions (18.4) ------------------------------------------------------------
def _next(m: LiveManifest, **change: Any) -> LiveManifest:
    return replace(m, version=m.version + 1, **change)


def test_a_version_that_loses_a_trailing_segment_does_not_follow() -> None:
    """A trim removes only a leading run of segments: one that drops the first and loses the
    last is refused, naming the lost segment."""
    m = _three_segments()
    found = successor_violation(m, _next(m, segments=m.segments[1:2], start=2))
    assert found is not None and found.code is LiveCode.NOT_SUCCESSOR
    assert found.where == "segments[1]"
    assert segment_name(5) in found.detail


def test_sealing_the_whole_tail_follows_and_sealing_past_it_does_not() -> None:
    """A new segment may seal every tail entry; one more reference after that, or one that
    counts more entries than the tail holds, does not follow."""
    m = _run([1, 2])
    sealed, _ = seal(m, 2, digest)
    nxt = _next(sealed)
    assert successor_violation(m, nxt) is None
    extra = SegmentRef(segment_name(3), 3, 1, 1, "0" * 16)
    found = successor_violation(m, _next(sealed, segments=(*sealed.segments, extra)))
    assert found is not None and found.where == "segments[1]", found
    assert "(0 left to seal)" in found.detail
    wide = replace(sealed.segments[0], entries=3)
    found = successor_violation(m, _next(sealed, segments=(wide,)))
    assert found is not None and found.where == "segments[0]", found
    assert "(2 left to seal)" in found.detail


def test_a_segment_that_starts_elsewhere_or_covers_other_batches_does_not_follow() -> None:
    """A new reference starts at the next unsealed tail entry and ends where its last ends."""
    m, _ = seal(_run([1, 1]), 2, digest)  # a segment at 0, then entries at 2, 3 and 5
    m, _ = commit_entries(m, "p-0", [entry("p-0", 2), entry("p-0", 3, 2), entry("p-0", 5)], "2" * 8)
    sealed, _ = seal(m, 2, digest)
    old, ref = sealed.segments
    assert (ref.first, ref.num_batches) == (2, 3) and successor_violation(m, _next(sealed)) is None
    moved = replace(ref, first=3, name=segment_name(3))
    found = successor_violation(m, _next(sealed, segments=(old, moved)))
    assert found is not None and found.where == "segments[1]", found
    short = replace(ref, num_batches=2)
    found = successor_violation(m, _next(sealed, segments=(old, short)))
    assert found is not None and found.where == "segments[1].batches", found
    assert found.detail == "2: the tail entries it seals cover 3"


def test_a_reclaimed_or_matching_segment_object_lets_the_version_follow() -> None:
    """A new segment the reader cannot read any more (``None``), or one holding exactly the
    entries it seals, does not stop the chain."""
    m = _run([1, 2, 1])
    sealed, objects = seal(m, 2, digest)
    found = parse_segment(objects[0][1], D)
    assert isinstance(found, Segment)
    assert successor_violation(m, _next(sealed), lambda r: None) is None
    assert successor_violation(m, _next(sealed), lambda r: found) is None


def test_a_version_that_drops_a_trailing_tail_entry_does_not_follow() -> None:
    """Tail entries leave the tail only by sealing: a version missing the last is refused."""
    m = _run([1, 2])
    found = successor_violation(m, _next(m, tail=m.tail[:1]))
    assert found is not None and found.where == "tail[1]", found


def test_entries_added_elsewhere_than_the_end_do_not_follow() -> None:
    """The first entry added starts at the predecessor's ``batches``."""
    base = _tail_manifest()
    m, added = commit_entries(base, "p-0", [entry("p-0", 1, 2), entry("p-0", 3)], "f" * 8)
    moved = tuple(replace(e, first=e.first + 1) for e in added)
    found = successor_violation(base, replace(m, tail=base.tail + moved, batches=m.batches + 1))
    assert found is not None and (found.where, found.detail) == (
        "tail",
        "entries added at 4, not at 3",
    )


def test_start_of_a_version_listing_nothing_is_the_predecessors_batches() -> None:
    """With no segment and no tail entry, ``start`` is the predecessor's ``batches``."""
    m = _run([1, 2])
    sealed, _ = seal(m, 2, digest)
    base = _next(sealed)  # segments only, empty tail
    assert base.tail == () and successor_violation(m, base) is None
    gone = _next(base, segments=(), start=3)
    assert successor_violation(base, gone) is None
    found = successor_violation(base, replace(gone, start=0))
    assert found is not None and found.where == "start", found
    assert found.detail.startswith("0: the first batch it lists is 3")
    nothing, _ = commit_entries(empty_manifest(D, "p-0", "00000000"), "p-0", [], "1" * 8)
    assert successor_violation(empty_manifest(D, "p-0", "00000000"), nothing) is None


def test_an_added_entry_must_continue_its_producers_stream() -> None:
    """Added entries of a producer start at its offset in the predecessor and follow one
    another; its offset grows by exactly their batches."""
    base = _tail_manifest()
    m, _ = commit_entries(base, "p-0", [entry("p-0", 1, 2)], "f" * 8)
    skipped = replace(m.tail[-1], offset=2, name=batch_name("p-0", 2, "deadbeef"))
    found = successor_violation(
        base,
        replace(m, tail=(*base.tail, skipped), producers={**m.producers, "p-0": Producer(4, 2)}),
    )
    assert found is not None and (found.where, found.detail) == (
        "producers.p-0",
        "an added entry starts at offset 2, its stream was at 1",
    )
    found = successor_violation(base, replace(m, producers={**m.producers, "p-0": Producer(5, 2)}))
    assert found is not None and (found.where, found.detail) == (
        "producers.p-0.offset",
        "5: version 2 has 1 and the entries added hold 2 more",
    )
    found = successor_violation(base, replace(m, producers={**m.producers, "p-1": Producer(2, 2)}))
    assert found is not None and (found.where, found.detail) == (
        "producers.p-1.commits",
        "2, expected 1",
    )


def test_a_new_producer_listed_without_entries_follows() -> None:
    """A producer new in a version, at offset 0 with no commits and nothing added, follows."""
    base = _tail_manifest()
    nxt = _next(base, producers={**base.producers, "p-9": Producer(0, 0)})
    assert successor_violation(base, nxt) is None
    found = successor_violation(
        base, _next(base, producers={**base.producers, "p-9": Producer(0, 1)})
    )
    assert found is not None and found.where == "producers.p-9.commits"
