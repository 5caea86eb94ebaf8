"""The chain rule (``successor_violation``, ``SPEC.md`` section 18.4): every version that a
commit, a seal or a trim produces follows from its predecessor, and each rule broken once is
named; watermark documents carry the dataset's id."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise

import pytest
from zerobatch_spec.live import (
    LiveCode,
    LiveManifest,
    LiveViolation,
    Producer,
    Segment,
    SegmentRef,
    build_watermark,
    commit_entries,
    empty_manifest,
    parse_segment,
    parse_watermark,
    seal,
    successor_violation,
    trim,
)

from tests.unit.test_live_spec import D, digest, entry


def chain() -> tuple[list[LiveManifest], dict[str, Segment]]:
    """Versions as producers and retention make them: two producers, seals, a trim."""
    versions = [empty_manifest(D, "p-0", "00000000")]
    segments: dict[str, Segment] = {}
    offsets = {"p-0": 0, "p-1": 0}
    for i in range(9):
        pid = f"p-{i % 2}"
        sealed, objects = seal(versions[-1], D.segment_size, digest)
        for name, data in objects:
            found = parse_segment(data, D)
            assert not isinstance(found, LiveViolation)
            segments[name] = found
        n = 1 + i % 3
        m, _ = commit_entries(sealed, pid, [entry(pid, offsets[pid], n)], f"{i + 1:08d}")
        offsets[pid] += n
        versions.append(m)
        if i == 6:
            t = trim(versions[-1], 6)
            assert t is not versions[-1]
            versions.append(replace(t, version=t.version + 1, writer="reclaim"))
    return versions, segments


def test_every_version_of_a_real_chain_follows_from_its_predecessor() -> None:
    versions, segments = chain()
    assert any(m.segments for m in versions) and versions[-1].start > 0
    for prev, nxt in pairwise(versions):
        assert successor_violation(prev, nxt, lambda r: segments.get(r.name)) is None, nxt.version


def _pair(sealing: bool = True) -> tuple[LiveManifest, LiveManifest]:
    """A commit that also seals (after earlier seals), or a commit that keeps a tail entry."""
    versions, _ = chain()
    for prev, nxt in pairwise(versions):
        if prev.segments and len(nxt.segments) > len(prev.segments) and sealing:
            return prev, nxt
        if not sealing and len(nxt.segments) == len(prev.segments) and prev.tail and nxt.tail:
            return prev, nxt
    raise AssertionError("no such commit in the chain")


def _break(rule: str) -> Callable[[LiveManifest, LiveManifest], LiveManifest]:
    def far_ahead(p: LiveManifest, n: LiveManifest) -> LiveManifest:
        huge = 2**60
        return replace(
            n, batches=huge, start=huge, segments=(), tail=(), producers={"p-0": Producer(huge, 1)}
        )

    def changed_segment(p: LiveManifest, n: LiveManifest) -> LiveManifest:
        refs = list(n.segments)
        refs[0] = replace(refs[0], xxh3="f" * 16)
        return replace(n, segments=tuple(refs))

    def wrong_seal(p: LiveManifest, n: LiveManifest) -> LiveManifest:
        refs = list(n.segments)
        refs[-1] = replace(refs[-1], entries=refs[-1].entries + 5)
        return replace(n, segments=tuple(refs))

    def dropped_entry(p: LiveManifest, n: LiveManifest) -> LiveManifest:
        return replace(n, tail=n.tail[1:])

    def offset_jump(p: LiveManifest, n: LiveManifest) -> LiveManifest:
        pid = n.tail[-1].producer
        s = n.producers[pid]
        return replace(n, producers={**n.producers, pid: Producer(s.offset + 100, s.commits)})

    def commits(p: LiveManifest, n: LiveManifest) -> LiveManifest:
        pid = n.tail[-1].producer
        s = n.producers[pid]
        return replace(n, producers={**n.producers, pid: Producer(s.offset, s.commits + 3)})

    def vanished(p: LiveManifest, n: LiveManifest) -> LiveManifest:
        gone = next(x for x in p.producers if x != n.tail[-1].producer)
        return replace(n, producers={k: v for k, v in n.producers.items() if k != gone})

    rules: dict[str, Callable[[LiveManifest, LiveManifest], LiveManifest]] = {
        "manifest": lambda p, n: replace(n, version=n.version + 5),
        "id": lambda p, n: replace(n, dataset_id="f" * 32),
        "batches": lambda p, n: replace(n, batches=p.batches - 1),
        "start": far_ahead,
        "segments[0]": changed_segment,
        "seal": wrong_seal,
        "tail[0]": dropped_entry,
        "offset": offset_jump,
        "commits": commits,
        "producers": vanished,
    }
    return rules[rule]


@pytest.mark.parametrize(
    ("rule", "where"),
    [
        ("manifest", "manifest"),
        ("id", "id"),
        ("batches", "batches"),
        ("start", "tail[0]"),  # the far-ahead version: the tail it should keep is gone
        ("segments[0]", "segments[0]"),
        ("seal", "segments["),
        ("tail[0]", "tail[0]"),
        ("offset", ".offset"),
        ("commits", ".commits"),
        ("producers", "producers.p-"),
    ],
)
def test_each_rule_broken_once_is_named(rule: str, where: str) -> None:
    prev, nxt = _pair(rule != "tail[0]")
    assert successor_violation(prev, nxt) is None
    found = successor_violation(prev, _break(rule)(prev, nxt))
    assert found is not None and found.code is LiveCode.NOT_SUCCESSOR
    assert where in found.where, found


def test_a_sealed_segment_must_hold_the_entries_it_seals() -> None:
    prev, nxt = _pair()
    ref = nxt.segments[-1]

    def forged(r: SegmentRef) -> Segment | None:
        real = Segment(D.dataset_id, r.first, prev.tail[: r.entries])
        if r.name != ref.name:
            return real
        return replace(real, entries=tuple(replace(e, seed=1) for e in real.entries))

    found = successor_violation(prev, nxt, forged)
    assert found is not None and "does not hold the tail entries" in found.detail


def test_a_trim_may_drop_only_whole_leading_segments() -> None:
    versions, _ = chain()
    m = versions[-1]
    assert len(m.segments) >= 2
    nxt = replace(m, version=m.version + 1, writer="reclaim")
    good = replace(nxt, segments=m.segments[1:], start=m.segments[1].first)
    assert successor_violation(m, good) is None
    middle = replace(nxt, segments=(m.segments[0], *m.segments[2:]))
    assert successor_violation(m, middle) is not None
    moved = replace(nxt, start=m.start + 1)
    found = successor_violation(m, moved)
    assert found is not None and found.where == "start"


def test_watermark_documents_carry_the_dataset_id() -> None:
    assert parse_watermark(build_watermark(D.dataset_id, 12)) == (D.dataset_id, 12)
    assert parse_watermark(b'{"batch": 3}\n') == (None, 3)  # written before the id
    for bad in (b'{"ba', b"[]", b'{"batch": -1}', b'{"id": "x", "batch": 1}'):
        assert isinstance(parse_watermark(bad), LiveViolation), bad
