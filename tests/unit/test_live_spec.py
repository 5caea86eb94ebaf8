"""The live manifest reference (``zerobatch_spec.live``): canonical bytes, the rules in
order, the commit rule's exactly-once arithmetic, sealing and trimming."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from zerobatch_spec import expected_file_size
from zerobatch_spec.live import (
    CommitConflictError,
    Descriptor,
    Entry,
    LiveCode,
    LiveManifest,
    LiveViolation,
    batch_name,
    build_descriptor,
    build_live_manifest,
    commit_entries,
    empty_manifest,
    parse_batch_name,
    parse_descriptor,
    parse_live_manifest,
    parse_manifest_name,
    parse_segment,
    seal,
    trim,
)

D = Descriptor(2, 3, 7, "0123456789abcdef0123456789abcdef", 2)


def entry(producer: str, offset: int, n: int = 1) -> Entry:
    return Entry(
        batch_name(producer, offset, "deadbeef"),
        0,
        n,
        producer,
        offset,
        0,
        n * D.batch_size,
        expected_file_size(D.batch_size, D.seq_len, n),
        "0123456789abcdef",
        ("00000000000000aa",) * n,
    )


def digest(data: bytes) -> str:
    import xxhash

    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def test_commits_append_exactly_once_and_round_trip() -> None:
    m0 = empty_manifest(D, "p-0", "00000000")
    m1, added = commit_entries(m0, "p-0", [entry("p-0", 0), entry("p-0", 1, 2)], "11111111")
    assert [e.first for e in added] == [0, 1] and m1.batches == 3 and m1.version == 1
    assert m1.producers["p-0"].offset == 3
    m2, added = commit_entries(m1, "p-1", [entry("p-1", 0)], "22222222")
    assert added[0].first == 3
    # The same items again (a restart, a zombie): dropped, the version still advances.
    m3, added = commit_entries(m2, "p-0", [entry("p-0", 0), entry("p-0", 1, 2)], "33333333")
    assert added == [] and m3.batches == 3 + 1
    with pytest.raises(CommitConflictError, match="a gap"):
        commit_entries(m2, "p-0", [entry("p-0", 5)], "44444444")
    with pytest.raises(CommitConflictError, match="an overlap"):
        commit_entries(m2, "p-0", [entry("p-0", 2, 2)], "44444444")
    data = build_live_manifest(m2)
    assert parse_live_manifest(data, D) == m2
    assert build_live_manifest(parse_live_manifest(data, D)) == data  # type: ignore[arg-type]
    assert parse_descriptor(build_descriptor(D)) == D


def test_sealing_bounds_the_tail_and_trimming_drops_whole_segments() -> None:
    m = empty_manifest(D, "p-0", "00000000")
    objects = []
    for i in range(5):
        m, _ = commit_entries(m, "p-0", [entry("p-0", i)], f"{i:08d}")
        m, written = seal(m, D.segment_size, digest)
        objects += written
    assert len(m.tail) == 1 and [r.first for r in m.segments] == [0, 2]
    segment = parse_segment(objects[0][1], D)
    assert not isinstance(segment, LiveViolation) and segment.first == 0
    assert seal(m, D.segment_size, digest)[1] == []  # nothing more to seal
    assert parse_live_manifest(build_live_manifest(m), D) == m
    t = trim(m, 3)
    assert [r.first for r in t.segments] == [2] and t.start == 2
    assert parse_live_manifest(build_live_manifest(t), D) == t
    assert trim(m, 1) is m  # no whole segment below batch 1
    gone = trim(m, 100)
    assert gone.segments == () and gone.start == 4


def _code(m: LiveManifest, **change: object) -> str:
    obj = json.loads(build_live_manifest(m))
    obj.update(change)
    found = parse_live_manifest(json.dumps(obj).encode(), D)
    assert isinstance(found, LiveViolation)
    return f"{found.code.value} {found.where}"


def test_the_rules_name_the_field() -> None:
    m, _ = commit_entries(
        empty_manifest(D, "p-0", "00000000"), "p-0", [entry("p-0", 0)], "1234abcd"
    )
    assert parse_live_manifest(b"{", D) == LiveViolation(
        LiveCode.NOT_JSON,
        "document",
        parse_live_manifest(b"{", D).detail,  # type: ignore[union-attr]
    )
    assert _code(m, format="zerobatch.dataset") == "live_bad_format format"
    assert _code(m, version=2) == "live_unsupported_version version"
    assert _code(m, id="f" * 32) == "live_bad_field id"
    assert _code(m, batches=5) == "live_not_contiguous batches"
    assert _code(m, producers={}) == "live_bad_producer tail[0].offset"
    assert _code(m, nonce="XYZ") == "live_bad_field nonce"
    tail = json.loads(build_live_manifest(m))["tail"]
    assert _code(m, tail=[{**tail[0], "first": 1}]) == "live_not_contiguous tail[0].first"
    assert _code(m, tail=[{**tail[0], "size": 4096}]) == "live_bad_field tail[0].size"
    assert _code(m, tail=[{**tail[0], "checksums": []}]) == "live_bad_field tail[0].checksums"
    assert _code(m, tail=[{**tail[0], "name": "x.batch"}]) == "live_bad_field tail[0].name"


def test_names() -> None:
    assert parse_manifest_name("manifests/00000000000000000012.json") == 12
    assert parse_manifest_name("manifests/12.json") is None
    name = batch_name("p-1", 5, "0a1b2c3d")
    assert name == "batches/p-1/00000000000000000005-0a1b2c3d.batch"
    assert parse_batch_name(name) == ("p-1", 5)
    assert parse_batch_name("batches/p-1/5.batch") is None
    assert replace(entry("p-0", 0), first=4).end == 5
