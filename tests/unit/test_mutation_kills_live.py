"""Tests written to kill surviving mutants of the live-dataset modules (live_source.py,
live.py, live_manifests.py): each pins a behaviour the other tests left open."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec.live import build_live_manifest, manifest_name

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader, Position, live_source
from zerobatch_core.live import LiveProducer
from zerobatch_core.live_manifests import ChainError, LiveError, LiveTimeoutError, ManifestChain
from zerobatch_core.live_source import LiveSource
from zerobatch_core.retention import reclaim, record_watermark
from zerobatch_core.storage import LocalStore, open_store


def _produce(path: str, sizes: Sequence[int], start: int = 0, segment_size: int = 64) -> None:
    """Append objects of ``sizes`` batches (items ``start`` on of producer 0), one commit each."""
    with LiveProducer(
        path, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=segment_size
    ) as p:
        i = start
        for n in sizes:
            p.append(np.stack([batch(0, i + k) for k in range(n)]))
            i += n


class _Clock:
    """A stand-in for the ``time`` module as ``live_source`` uses it: the clock stands still
    except while the waiting reader sleeps, so every pause it takes is recorded exactly."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) > 200:
            raise AssertionError(f"still polling after 200 pauses: {self.sleeps[-5:]}")
        self.now += seconds


# -- module constants and properties ---------------------------------------------------------
def test_the_default_timeout_is_the_documented_600_seconds(tmp_path: Path) -> None:
    """README ("Consumers"): a read past the committed end waits 600 s by default."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        assert source.timeout == 600.0


def test_a_live_loader_state_records_the_unending_epoch_as_2_to_the_62(tmp_path: Path) -> None:
    """A live source has ``2**62`` stored batches, and a loader state records that count
    (``num_batches``, an order key a restore must match): checkpoints saved by earlier runs
    over a live dataset keep loading only while the count stays the same."""
    path = str(tmp_path / "live")
    _produce(path, [2])
    with LiveSource(path) as source:
        assert len(source) == source.num_batches == 2**62
        loader = BatchNativeLoader(source, dtype="uint32")
        saved = dict(loader.state_dict(Position(0, 1)), num_batches=2**62)
        loader.load_state_dict(saved)
        assert identify(next(iter(loader))) == (0, 1)


def test_a_live_source_is_a_dataset(tmp_path: Path) -> None:
    """``is_dataset`` is a property that says True for a live dataset (not a single file)."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        assert source.is_dataset is True


def test_a_directory_without_a_descriptor_is_not_a_live_dataset(tmp_path: Path) -> None:
    """Opening a directory without ``live.json`` raises ``LiveError`` naming it, not a bare
    ``FileNotFoundError``."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LiveError, match=r"live\.json: not a live dataset"):
        LiveSource(str(empty))


# -- messages ---------------------------------------------------------------------------------
def test_a_reclaimed_batch_names_where_the_dataset_now_starts(tmp_path: Path) -> None:
    """A read below the first batch still listed raises at once, naming that first batch (not
    the end of the first object or the committed end)."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 7, segment_size=2)
    with LiveSource(path) as source:
        state = BatchNativeLoader(source, dtype="uint32").state_dict(Position(0, 4))
    record_watermark(path, "c-1", state)
    start = reclaim(path).start
    assert start == 4
    with LiveSource(path, timeout=0) as source:
        assert source.start == 4 and source.committed == 7
        with pytest.raises(LiveError, match=r"global batch 3 was reclaimed") as raised:
            source.read_batch(3)
        assert "(the dataset now starts at 4)" in str(raised.value)
        assert identify(source.read_batch(4)) == (0, 4)


def test_a_timeout_names_the_committed_end_and_the_version(tmp_path: Path) -> None:
    """``LiveTimeoutError`` names the committed end (past several objects) and the version."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2])
    with LiveSource(path, timeout=0) as source:
        with pytest.raises(LiveTimeoutError) as raised:
            source.read_batch(3)
        want = f"(committed: 3, manifest version {source.current.version})"
        assert want in str(raised.value)


# -- following new versions -------------------------------------------------------------------
def test_refresh_says_whether_a_new_version_was_read(tmp_path: Path) -> None:
    """``refresh`` is False when nothing new was committed, True when it read a new version."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        assert source.refresh() is False
        _produce(path, [2], start=1)
        assert source.refresh() is True
        assert source.committed == 3
        assert source.refresh() is False


def test_a_wait_keeps_waiting_when_new_versions_stop_short_of_the_batch(tmp_path: Path) -> None:
    """A wait for batch 5 that reads a version committing only up to 3 goes on waiting (and
    times out), rather than returning as if batch 5 were committed."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        _produce(path, [2], start=1)
        with pytest.raises(LiveTimeoutError, match="global batch 5 not committed"):
            source.wait_for(5, timeout=0)
        assert source.committed == 3


def test_a_timeout_of_zero_does_not_wait_even_on_a_coarse_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: a timeout of 0 does not wait. The deadline is reached when the clock shows it,
    so a clock that has not ticked since the wait began (a coarse one) still raises at once."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    clock = _Clock()
    monkeypatch.setattr(live_source, "time", clock)
    with (
        LiveSource(path) as source,
        pytest.raises(LiveTimeoutError, match="not committed after 0 s"),
    ):
        source.wait_for(1, timeout=0)
    assert clock.sleeps == []


def test_the_poll_interval_starts_at_10_ms_and_grows_by_half_up_to_half_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting polls first after 10 ms (the default ``poll``), each pause 1.5 times the one
    before, capped at 0.5 s, until the timeout."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    clock = _Clock()
    monkeypatch.setattr(live_source, "time", clock)
    with LiveSource(path) as source, pytest.raises(LiveTimeoutError):
        source.wait_for(1, timeout=3.0)
    want, pause, waited = [], 0.01, 0.0
    while waited < 3.0:
        want.append(pause)
        waited += pause
        pause = min(pause * 1.5, 0.5)
    assert clock.sleeps == pytest.approx(want)
    assert clock.sleeps[:3] == pytest.approx([0.01, 0.015, 0.0225])
    assert max(clock.sleeps) == 0.5


def test_committed_batches_from_the_first_listed_one_on_are_fetched_ahead(
    tmp_path: Path,
) -> None:
    """``ahead`` fetches the regions of committed batches in the background, the first
    listed batch included: no read of a committed batch is left to the reading thread."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2])

    class Recording(LocalStore):
        def __init__(self, root: str) -> None:
            super().__init__(root)
            self.threads: list[str] = []

        def _read_ranges(self, key: str, ranges: Any, coalesce: int) -> list[bytes]:
            if key.startswith("batches/"):
                self.threads.append(threading.current_thread().name)
            return super()._read_ranges(key, ranges, coalesce)

    store = Recording(path)
    with LiveSource(store) as source:
        steps = source.ahead(iter(range(3)), lambda g: [(g, 0, B, 0, T)])
        got = [identify(source.read_region(g, 0, B, 0, T)) for g in steps]
    assert got == [(0, 0), (0, 1), (0, 2)]
    assert store.threads and all(name.startswith("zb-get") for name in store.threads)


def test_batches_reclaimed_before_a_reader_saw_them_are_refused_not_misplaced(
    tmp_path: Path,
) -> None:
    """A reader that read up to batch 3, then finds only a version starting at 7 (retention
    reclaimed 3..6 and the versions listing them meanwhile), raises ``LiveError`` for batch 3
    instead of serving batch 7 in its place."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2], segment_size=2)
    with LiveSource(path, timeout=0) as source:
        assert source.committed == 3
        _produce(path, [1] * 9, start=3, segment_size=2)
        with LiveSource(path) as other:
            state = BatchNativeLoader(other, dtype="uint32").state_dict(Position(0, 8))
        record_watermark(path, "c-1", state)
        assert reclaim(path, keep_versions=1).start == 7
        with pytest.raises(LiveError, match=r"global batches 3\.\.6 were reclaimed") as raised:
            source.read_batch(3)
        assert "starts at 7" in str(raised.value)
        assert source.committed == 3


def test_a_version_whose_entry_crosses_the_known_end_is_refused(tmp_path: Path) -> None:
    """A version found after the reader's versions were all reclaimed, whose entry covers
    batches 2..3 where the versions read listed an object ending at 3, goes back on them:
    ``ChainError``, and nothing of it is served."""
    a, b = tmp_path / "a", tmp_path / "b"
    _produce(str(a), [1])
    shutil.copytree(a, b)
    _produce(str(a), [2], start=1)  # a lists [0, 1), [1, 3)
    _produce(str(b), [1, 2], start=1)  # b lists [0, 1), [1, 2), [2, 4)
    with LiveSource(str(a), timeout=0) as source:
        assert source.committed == 3
        newest = ManifestChain(open_store(str(b)), source.descriptor).latest()
        crafted = dataclasses.replace(newest, version=source.current.version + 10)
        for old in (a / "manifests").iterdir():
            old.unlink()
        for obj in (b / "batches" / "p-0").iterdir():
            if not (a / "batches" / "p-0" / obj.name).exists():
                shutil.copy(obj, a / "batches" / "p-0" / obj.name)
        open_store(str(a)).write(manifest_name(crafted.version), build_live_manifest(crafted))
        with pytest.raises(ChainError, match=r"global batches 2\.\.3 cross the end 3"):
            source.read_batch(3)
        assert source.committed == 3
