"""Retention that verifies before it deletes: a crafted or mistaken manifest version stops
``reclaim`` (local and S3, dry run and real) and deletes nothing; watermarks are tied to the
dataset and bounded by the committed end; odd keys, stale temporary files and a producer's
pending appends are handled; the command line's statuses."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from zerobatch_spec.live import (
    LiveManifest,
    Producer,
    build_live_manifest,
    manifest_name,
    watermark_name,
)

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader
from zerobatch_core.cli import main
from zerobatch_core.live.manifests import LiveError, ManifestChain
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.retention import (
    STALE_TEMPORARY_SECONDS,
    ChainError,
    WatermarkError,
    reclaim,
    record_watermark,
    watermarks,
)
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import Store


def produce(url: str, count: int, segment_size: int = 2) -> None:
    with LiveProducer(
        url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=segment_size
    ) as p:
        for i in range(count):
            p.append(batch(0, i))


def state_at(url: str, step: int) -> dict[str, Any]:
    """The state a loader of the live dataset at ``url`` saves at ``step`` (watermark
    ``step``)."""
    with LiveSource(url, timeout=5) as source:
        return BatchNativeLoader(source, dtype="uint32").state_dict((0, step))  # type: ignore[arg-type]


def snapshot(store: Store) -> dict[str, bytes]:
    return {k: store.read(k) for k in store.list_keys()}


def readable(url: str, first: int, end: int) -> bool:
    with LiveSource(url, timeout=5) as source:
        return [identify(source.read_batch(g)) for g in range(first, end)] == [
            (0, i) for i in range(first, end)
        ]


def latest(store: Store) -> LiveManifest:
    from zerobatch_core.live.retention import _descriptor

    return ManifestChain(store, _descriptor(store)).latest()


def craft_far_ahead(store: Store, version: int | None = None) -> int:
    """Create a valid-looking version far ahead of the real ones: huge ``start``,
    ``batches`` and offsets, no entries. Returns its number."""
    newest = latest(store)
    huge = 2**60
    crafted = replace(
        newest,
        version=newest.version + 1 if version is None else version,
        batches=huge,
        start=huge,
        segments=(),
        tail=(),
        producers={"p-0": Producer(huge, 1)},
        writer="p-0",
        nonce="0badc0de",
    )
    assert store.create(manifest_name(crafted.version), build_live_manifest(crafted))
    return crafted.version


@pytest.fixture(params=["local", "s3"])
def live_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('bucket')}/live"
    return str(tmp_path / "live")


@pytest.mark.parametrize("at", ["next", "far"])
def test_a_crafted_far_ahead_version_stops_reclaim_and_deletes_nothing(
    live_url: str, at: str
) -> None:
    produce(live_url, 10)
    record_watermark(live_url, "trainer", state_at(live_url, 8))
    store = open_store(live_url)
    craft_far_ahead(store, None if at == "next" else 10**15)
    before = snapshot(store)
    for dry_run in (True, False):
        with pytest.raises(ChainError, match="live_not_successor") as e:
            reclaim(live_url, dry_run=dry_run)
        assert "retention refuses" in str(e.value) and "manifests/" in str(e.value)
    assert snapshot(store) == before  # nothing committed, nothing deleted
    for key in before:
        if key.startswith("batches/"):
            assert store.exists(key)


def test_the_command_line_refuses_a_broken_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "live")
    produce(url, 6)
    record_watermark(url, "trainer", state_at(url, 5))
    store = open_store(url)
    craft_far_ahead(store)
    before = snapshot(store)
    assert main(["dataset", "reclaim", url, "--dry-run"]) == 1
    assert "live_not_successor" in capsys.readouterr().err
    assert main(["dataset", "reclaim", url, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["refused"] is True and "live_not_successor" in out["error"]
    assert snapshot(store) == before


def test_a_version_that_drops_what_a_checkpoint_needs_stops_reclaim(tmp_path: Path) -> None:
    """A version trimmed past the lowest watermark (by the rules a valid trim, but not one
    retention would make) stops reclaim before it deletes the batches it unlisted."""
    url = str(tmp_path / "live")
    produce(url, 10)
    record_watermark(url, "trainer", state_at(url, 3))
    store = open_store(url)
    newest = latest(store)
    trimmed = replace(
        newest,
        version=newest.version + 1,
        segments=newest.segments[3:],
        start=newest.segments[3].first,
        writer="reclaim",
    )
    assert store.create(manifest_name(trimmed.version), build_live_manifest(trimmed))
    before = snapshot(store)
    with pytest.raises(ChainError, match="refuses"):
        reclaim(url)
    assert snapshot(store) == before


def test_a_watermark_of_another_dataset_is_refused_and_the_real_ones_survive(
    tmp_path: Path,
) -> None:
    url, other = str(tmp_path / "live"), str(tmp_path / "other")
    produce(url, 10)
    produce(other, 40)
    record_watermark(url, "trainer", state_at(url, 4), keep=1)
    foreign = state_at(other, 30)  # a checkpoint of another run, under the same consumer
    with pytest.raises(WatermarkError, match="another dataset"):
        record_watermark(url, "trainer", foreign, keep=1)
    assert watermarks(open_store(url)) == {"trainer": [4]}
    report = reclaim(url)
    assert report.watermark == 4 and report.start <= 4
    assert readable(url, 4, 10)


def test_an_inconsistent_or_out_of_range_state_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    produce(url, 6)
    good = state_at(url, 4)
    with pytest.raises(WatermarkError, match="inconsistent"):
        record_watermark(url, "trainer", {**good, "samples": good["samples"] + 7 * B})
    with pytest.raises(WatermarkError, match="beyond the committed end"):
        record_watermark(url, "trainer", state_at(url, 50))
    with pytest.raises(WatermarkError):
        record_watermark(url, "trainer", {"samples": 4 * B, "batch_size": B})
    assert watermarks(open_store(url)) == {}
    assert record_watermark(url, "trainer", good) == 4


def test_watermarks_beyond_the_end_or_of_another_dataset_are_ignored_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "live")
    produce(url, 10)
    store = open_store(url)
    ident = latest(store).dataset_id
    far = watermark_name("rogue", 2**40)
    store.write(far, json.dumps({"id": ident, "batch": 2**40}).encode())
    before = snapshot(store)
    report = reclaim(url, dry_run=True)
    assert report.watermark is None and far in report.ignored_watermarks
    assert "beyond the committed end" in report.ignored_watermarks[far]
    report = reclaim(url)
    assert report.watermark is None and "batches" not in report.deleted
    assert all(store.exists(k) for k in before if k.startswith(("batches/", "segments/")))
    # Another dataset's id below the real one (copied in, or this dataset's id damaged: no
    # reader can tell) still protects its batch, and is named.
    record_watermark(url, "trainer", state_at(url, 7))
    foreign = watermark_name("other", 1)
    store.write(foreign, json.dumps({"id": "f" * 32, "batch": 1}).encode())
    assert main(["dataset", "reclaim", url]) == 0
    out = capsys.readouterr().out
    assert foreign in out and "another dataset" in out and far in out
    report = reclaim(url)
    assert report.watermark == 1 and foreign in report.unverified_watermarks
    assert readable(url, 1, 10)
    store.delete(foreign)  # the person who checked it found it was not this dataset's
    assert reclaim(url).watermark == 7


def test_a_watermark_without_an_id_still_protects_its_batch(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    produce(url, 10)
    store = open_store(url)
    record_watermark(url, "trainer", state_at(url, 9))
    legacy = watermark_name("old", 2)
    store.write(legacy, b'{"batch": 2}\n')  # written before watermarks carried the id
    damaged = watermark_name("torn", 3)
    store.write(damaged, b'{"ba')
    report = reclaim(url)
    assert report.watermark == 2 and report.start <= 2
    assert legacy in report.unverified_watermarks and damaged in report.unverified_watermarks
    assert readable(url, 2, 10)


def test_reclaim_statuses_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "live")
    produce(url, 4)
    with pytest.raises(SystemExit) as e:
        main(["dataset", "reclaim", url, "--keep-versions", "0"])
    assert e.value.code == 2 and "--keep-versions" in capsys.readouterr().err
    missing = str(tmp_path / "no-such-dir")
    assert main(["dataset", "reclaim", missing]) == 2
    assert "no-such-dir" in capsys.readouterr().err
    assert main(["dataset", "reclaim", url, "--keep-versions", "1"]) == 0


def test_keys_that_are_not_layout_names_are_reported_and_left_alone(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    produce(url, 8)
    record_watermark(url, "trainer", state_at(url, 6))
    store = open_store(url)
    odd = ["segments/notes.json", "segments/x/00000000000000000000.json", "batches/p-0/junk"]
    for key in odd:
        store.write(key, b"odd")
    report = reclaim(url)
    assert report.deleted.get("batches", 0) > 0 and report.deleted.get("segments", 0) > 0
    assert report.ignored_count == len(odd) and sorted(report.ignored_keys) == sorted(odd)
    assert all(store.exists(key) for key in odd)
    assert readable(url, 6, 8)


def test_keys_with_dot_or_empty_segments_under_the_prefix_do_not_stop_reclaim(
    bucket: str, s3_server: Any
) -> None:
    import boto3  # type: ignore[import-untyped]

    url = f"s3://{bucket}/live"
    produce(url, 8)
    record_watermark(url, "trainer", state_at(url, 6))
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    odd = [
        "segments/../x.json",
        "segments/./y.json",
        "segments//z.json",
        "batches/p-0/../w.batch",
        "manifests/./00000000000000000099.json",
    ]
    for key in odd:
        client.put_object(Bucket=bucket, Key=f"live/{key}", Body=b"odd")
    report = reclaim(url)
    assert report.deleted.get("batches", 0) > 0 and report.watermark == 6
    assert {"segments/../x.json", "batches/p-0/../w.batch"} <= set(report.ignored_keys)
    for key in odd:
        client.head_object(Bucket=bucket, Key=f"live/{key}")  # still there
    assert readable(url, 6, 8)


@pytest.mark.parametrize(
    "bad", [["watermarks/aab/../x.json"], ["watermarks//trainer/1.json", "watermarks/z/./1.json"]]
)
def test_a_key_that_hides_watermarks_makes_reclaim_refuse(
    bucket: str, s3_server: Any, bad: list[str]
) -> None:
    """The client fails a whole listing page on a key with a ``.``, ``..`` or empty segment,
    losing the good keys listed beside it: a watermark among them would go uncounted, and
    reclaim would delete the batches its checkpoint needs. So reclaim refuses, naming the
    key, and deletes nothing."""
    import boto3  # type: ignore[import-untyped]

    url = f"s3://{bucket}/live"
    produce(url, 8)
    record_watermark(url, "aaa", state_at(url, 2))  # sorts just before the bad key
    record_watermark(url, "trainer", state_at(url, 6))
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    for key in bad:
        client.put_object(Bucket=bucket, Key=f"live/{key}", Body=b"odd")
    before = sorted(open_store(url).list_keys("batches/"))
    with pytest.raises(LiveError, match=r"hides the watermarks") as caught:
        reclaim(url)
    assert all(key in str(caught.value) for key in bad)
    assert sorted(open_store(url).list_keys("batches/")) == before
    assert readable(url, 2, 8)
    for key in bad:
        client.delete_object(Bucket=bucket, Key=f"live/{key}")
    assert reclaim(url).watermark == 2


def test_stale_temporary_files_are_removed_and_fresh_ones_kept(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    produce(url, 4)
    stale = (
        tmp_path / "live" / "batches" / "p-0" / ".00000000000000000009-00aa.batch.0123456789ab.tmp"
    )
    fresh = tmp_path / "live" / "manifests" / ".00000000000000000099.json.abcdefabcdef.tmp"
    stale.write_bytes(b"x" * 100)
    fresh.write_bytes(b"y" * 10)
    old = time.time() - STALE_TEMPORARY_SECONDS - 60
    os.utime(stale, (old, old))
    report = reclaim(url, dry_run=True)
    assert report.deleted.get("temporaries") == 1 and stale.exists()
    report = reclaim(url)
    assert report.deleted.get("temporaries") == 1
    assert not stale.exists() and fresh.exists()


def test_reclaim_racing_a_pending_append_keeps_the_pending_objects(live_url: str) -> None:
    """Objects a producer wrote but has not committed (their offsets at or after its
    committed offset) survive a reclaim at the committed end, and commit afterwards."""
    producer = LiveProducer(live_url, "p-0", batch_size=B, seq_len=T, cadence=1000, segment_size=2)
    for i in range(6):
        producer.append(batch(0, i))
        producer.commit()  # one version each: the early entries get sealed
    for i in range(6, 9):
        producer.append(batch(0, i))  # written, not committed
    store = open_store(live_url)
    pending = [k for k in store.list_keys("batches/") if int(k.split("/")[2][:20]) >= 6]
    assert len(pending) == 3
    record_watermark(live_url, "trainer", state_at(live_url, 6))
    report = reclaim(live_url)
    assert report.deleted.get("batches", 0) > 0  # what lies below the watermark goes
    assert all(store.exists(k) for k in pending)
    producer.close()
    assert readable(live_url, 6, 9)


def test_a_committed_object_listed_under_another_name_is_kept(live_url: str) -> None:
    """The version that first lists a batch names an object that does not exist (one nonce
    digit changed): a valid successor on its own, so only the missing object can tell. The
    real object of that committed offset is unlisted, but it is the only copy of the batch:
    reclaim keeps it and says why (it used to delete it as a dead producer's leftover)."""
    produce(live_url, 6)
    store = open_store(live_url)
    newest = latest(store)
    real = newest.tail[-1]
    renamed = real.name[:-7] + ("0" if real.name[-7] != "0" else "1") + real.name[-6:]
    assert renamed != real.name and not store.exists(renamed)
    forged = replace(newest, tail=(*newest.tail[:-1], replace(real, name=renamed)))
    store.write(manifest_name(newest.version), build_live_manifest(forged))
    for dry_run in (True, False):
        report = reclaim(live_url, dry_run=dry_run)
        assert real.name in report.kept_batches
        assert "missing" in report.kept_batches[real.name]
        assert report.deleted.get("batches", 0) == 0
        assert any(real.name in line for line in report.warnings())
    assert store.exists(real.name)


def test_a_dead_producers_leftover_beside_its_committed_twin_is_still_reclaimed(
    live_url: str,
) -> None:
    """The rule above keeps only what a missing or mismatched listed object makes doubtful: a
    leftover at an offset whose listed object is whole is deleted as before."""
    produce(live_url, 4)
    store = open_store(live_url)
    real = latest(store).tail[-1]
    leftover = real.name[:-7] + ("0" if real.name[-7] != "0" else "1") + real.name[-6:]
    store.write(leftover, store.read(real.name))
    report = reclaim(live_url)
    assert report.kept_batches == {}
    assert report.deleted.get("batches") == 1
    assert not store.exists(leftover) and store.exists(real.name)


def test_a_watermark_that_is_not_a_regular_file_still_protects_its_batch(tmp_path: Path) -> None:
    """A checkpoint's watermark replaced by a FIFO is left out of listings and cannot be read,
    but it still stands for a checkpoint: it protects its batch, and is reported."""
    url = str(tmp_path / "live")
    produce(url, 10)
    record_watermark(url, "trainer", state_at(url, 9))
    odd = watermark_name("trainer", 3)
    os.mkfifo(tmp_path / "live" / odd)
    report = reclaim(url)
    assert report.watermark == 3 and report.start <= 3
    assert "not a regular file" in report.unverified_watermarks[odd]
    assert readable(url, 3, 10)
