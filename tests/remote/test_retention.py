"""Retention of live datasets: storage stays bounded with checkpoints every k steps, and a
restore from any live checkpoint still finds all its data; ``reclaim`` is idempotent and safe
to interrupt; the command line runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader
from zerobatch_core.cli import main
from zerobatch_core.live.manifests import LiveError
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.retention import (
    reclaim,
    record_watermark,
    storage_bytes,
    watermark,
    watermarks,
)
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import LocalStore

SEGMENT = 4


def live_state(url: str, step: int) -> dict[str, Any]:
    """The state a loader of the live dataset at ``url`` saves at ``step`` (its watermark is
    ``step``: the global batch size is the stored one)."""
    with LiveSource(url, timeout=5) as source:
        return BatchNativeLoader(source, dtype="uint32").state_dict((0, step))  # type: ignore[arg-type]


def _train(url: str, total: int, k: int, keep: int) -> tuple[list[int], dict[int, Any]]:
    """Produce and consume ``total`` batches, checkpointing every ``k`` steps (keeping the
    newest ``keep``) and reclaiming after each; storage bytes after each reclaim, and the
    states of the checkpoints still live at the end."""
    producer = LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=2, segment_size=SEGMENT)
    source = LiveSource(url, timeout=30)
    loader = BatchNativeLoader(source, dtype="uint32")
    items = iter(loader)
    sizes: list[int] = []
    states: dict[int, Any] = {}
    produced = 0
    for step in range(1, total + 1):
        while produced < min(step + 8, total):  # producers run a little ahead
            producer.append(batch(0, produced))
            produced += 1
        producer.commit()
        assert identify(next(items)) == (0, step - 1)
        if step % k == 0:
            state = loader.state_dict()
            mark = record_watermark(url, "trainer", state, keep=keep)
            states[mark] = state
            states = {
                m: s for m, s in states.items() if m in watermarks(open_store(url))["trainer"]
            }
            reclaim(url)
            sizes.append(storage_bytes(url))
    producer.close()
    source.close()
    return sizes, states


@pytest.mark.parametrize("where", ["local", "s3"])
def test_storage_stays_bounded_and_live_checkpoints_find_their_data(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "s3":
        url = f"s3://{request.getfixturevalue('bucket')}/live"
    else:
        url = str(tmp_path / "live")
    k, keep, total = 5, 2, 80
    sizes, states = _train(url, total, k, keep)
    slot = 4096 + 4096  # one batch object of one batch: header and one slot
    # Retained: the live checkpoints' window, the unsealed tail, the producer's lead, plus
    # manifests and segments: a bound that does not grow with the steps trained.
    bound = (k * keep + 2 * SEGMENT + 10) * slot + 64 * 1024
    assert max(sizes[len(sizes) // 2 :]) <= bound, sizes
    assert sizes[-1] < total * slot / 2  # most of what was produced is gone
    assert len(states) == keep
    for mark, state in states.items():  # roll back to every live checkpoint
        with LiveSource(url, timeout=5) as source:
            loader = BatchNativeLoader(source, dtype="uint32")
            loader.load_state_dict(state)
            items = iter(loader)
            got = [identify(next(items)) for _ in range(total - mark)]
            assert got == [(0, i) for i in range(mark, total)]


def test_reclaim_is_idempotent_and_never_touches_data_without_watermarks(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        for i in range(12):
            p.append(batch(0, i))
    before = storage_bytes(url)
    report = reclaim(url)
    assert report.watermark is None and "batches" not in report.deleted
    assert report.deleted.get("manifests", 0) > 0  # only old manifest versions go
    state = live_state(url, 7)
    assert watermark(state) == 7
    record_watermark(url, "c-1", state)
    dry = reclaim(url, dry_run=True)
    assert dry.deleted.get("batches", 0) == 6 and storage_bytes(url) <= before
    first = reclaim(url)
    assert first.deleted["batches"] == 6 and first.start == 6  # whole segments below 7 only
    again = reclaim(url)
    assert again.deleted == {} and again.version == first.version
    with LiveSource(url) as source:
        assert source.start == 6
        with pytest.raises(LiveError, match="was reclaimed"):
            source.read_batch(5)
        assert identify(source.read_batch(6)) == (0, 6)


def test_an_interrupted_reclaim_leaves_a_readable_dataset(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        for i in range(10):
            p.append(batch(0, i))
    record_watermark(url, "c-1", live_state(url, 6))

    class StoppedError(Exception):
        pass

    class FailsOnDelete(LocalStore):
        deletes = 0

        def _delete(self, key: str) -> None:
            FailsOnDelete.deletes += 1
            if FailsOnDelete.deletes == 3:
                raise StoppedError
            super()._delete(key)

    with pytest.raises(Exception, match=r"delete failed|StoppedError"):
        reclaim(FailsOnDelete(url))
    with LiveSource(url) as source:
        assert [identify(source.read_batch(g)) for g in range(6, 10)] == [
            (0, i) for i in range(6, 10)
        ]
    reclaim(url)  # finishes the job
    assert reclaim(url).deleted == {}


def test_the_command_line_reclaims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        for i in range(8):
            p.append(batch(0, i))
    record_watermark(url, "c-1", live_state(url, 5))
    assert main(["dataset", "reclaim", url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["watermark"] == 5 and out["deleted"]["batches"] == 4
    assert main(["dataset", "reclaim", url]) == 0
    assert "nothing to reclaim" in capsys.readouterr().out
    assert main(["dataset", "reclaim", str(tmp_path / "nothing")]) != 0
