"""Live datasets on the S3-compatible test server and on local directories.

Concurrent producer processes, producers killed with SIGKILL and restarted, consumers killed
and restored, the conditional-create probe, and the loader over a live dataset. The counts are
small here (CI); ``ZEROBATCH_LIVE_FULL=1`` runs the acceptance counts (8 producers x 200
batches), as ``benchmarks/live_bench.py --acceptance`` does.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.remote.live_worker import B, T, batch, identify, tag
from zerobatch_core import BatchNativeLoader, BatchStream
from zerobatch_core.delivery.sources import open_reader
from zerobatch_core.live.manifests import LiveError, LiveTimeoutError, ManifestChain
from zerobatch_core.live.producer import (
    ConditionalCreateUnsupportedError,
    LiveProducer,
    probe_conditional_create,
)
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import LocalStore

FULL = os.environ.get("ZEROBATCH_LIVE_FULL") == "1"
ROOT = Path(__file__).resolve().parents[2]


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.remote.live_worker", *args],
        cwd=ROOT,
        env=dict(os.environ),
        stderr=subprocess.PIPE,
    )


def _committed(url: str) -> list[tuple[int, int]]:
    """Every committed batch's ``(producer, i)`` in the committed order."""
    with LiveSource(url) as source:
        return [identify(source.read_batch(g)) for g in range(source.committed)]


def _check_exactly_once(order: list[tuple[int, int]], producers: int, count: int) -> None:
    assert sorted(order) == [(p, i) for p in range(producers) for i in range(count)]
    for p in range(producers):  # each producer's stream keeps its own order
        assert [i for q, i in order if q == p] == list(range(count))


def test_a_producer_and_a_consumer_on_a_local_directory(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    with LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=2, segment_size=3) as p:
        for i in range(9):
            p.append(batch(0, i))
        p.append(np.stack([batch(0, 9), batch(0, 10)]))  # several batches in one object
    source = open_reader(path)
    assert isinstance(source, LiveSource)
    assert source.committed == 11
    manifest = source.current
    # Sealed: the tail holds fewer than a segment, plus what the last commit added.
    assert len(manifest.tail) < 3 + 2 and manifest.segments
    with BatchStream(source, dtype="uint32", rank=1, world_size=2, shuffle=True) as stream:
        it = iter(stream)
        rows = [np.array(next(it)) for _ in range(11)]
    for i, r in enumerate(rows):  # commit order, the rank's rows, whatever shuffle says
        assert np.array_equal(r, batch(0, i)[B // 2 :])
    source.timeout = 0.2
    with pytest.raises(LiveTimeoutError, match="global batch 11 not committed"):
        source.read_batch(11)
    source.close()


def test_a_restarted_producer_resumes_at_its_committed_offset(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    p = LiveProducer(path, "p-3", batch_size=B, seq_len=T, cadence=100)
    for i in range(5):
        p.append(batch(3, i))
    p.commit()
    p.append(batch(3, 5))  # appended, never committed: the process "dies" here
    again = LiveProducer(path, "p-3", cadence=1)
    assert again.offset == 5
    for i in range(again.offset, 8):
        again.append(batch(3, i))
    again.close()
    assert _committed(path) == [(3, i) for i in range(8)]
    # A zombie twin that commits items already committed drops them instead.
    p.commit()
    assert _committed(path) == [(3, i) for i in range(8)]


def test_the_probe_refuses_a_store_that_ignores_conditional_creates(tmp_path: Path) -> None:
    class IgnoresConditions(LocalStore):
        """A store whose conditional create overwrites, like a service ignoring If-None-Match."""

        def _create(self, key: str, data: bytes) -> bool:
            self._write(key, data)
            return True

    store = IgnoresConditions(tmp_path / "live")
    with pytest.raises(ConditionalCreateUnsupportedError, match="does not honour conditional"):
        probe_conditional_create(store)
    with pytest.raises(ConditionalCreateUnsupportedError):
        LiveProducer(store, "p-0", batch_size=B, seq_len=T)
    assert not (tmp_path / "live" / "live.json").exists()  # refused before writing anything
    probe_conditional_create(LocalStore(tmp_path / "honest"))


def test_the_probe_passes_on_the_s3_server_and_refuses_a_wrapped_one(bucket: str) -> None:
    store = open_store(f"s3://{bucket}/live")
    probe_conditional_create(store)
    assert store.list_keys() == []  # the probe leaves nothing behind

    class Wrapped(type(store)):  # type: ignore[misc]
        def _create(self, key: str, data: bytes) -> bool:
            self._write(key, data)
            return True

    wrapped = Wrapped(f"s3://{bucket}/live")
    with pytest.raises(ConditionalCreateUnsupportedError, match="If-None-Match"):
        probe_conditional_create(wrapped)


def test_bad_producer_input_is_named(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    with pytest.raises(LiveError, match="give batch_size and seq_len"):
        LiveProducer(path, "p-0")
    with pytest.raises(ValueError, match="producer id"):
        LiveProducer(path, "p/0", batch_size=B, seq_len=T)
    with LiveProducer(path, "p-0", batch_size=B, seq_len=T) as p:
        with pytest.raises(ValueError, match=r"append takes \[4, 16\]"):
            p.append(np.zeros((B, T + 1), dtype=np.uint32))
        with pytest.raises(ValueError, match="tokens must be integers"):
            p.append(np.full((B, T), -1))
    with pytest.raises(LiveError, match=r"holds \[4, 16\] batches"):
        LiveProducer(path, "p-1", batch_size=B, seq_len=8)


def test_concurrent_producer_processes_and_a_consumer(bucket: str) -> None:
    producers, count = (8, 200) if FULL else (4, 12)
    url = f"s3://{bucket}/live"
    LiveProducer(url, "setup", batch_size=B, seq_len=T).close()  # create it once
    procs = [_spawn("produce", url, f"p-{k}", str(count)) for k in range(producers)]
    seen: list[tuple[int, int]] = []
    versions: list[int] = []
    total = producers * count
    with LiveSource(url, timeout=120) as source:
        loader = BatchNativeLoader(source, dtype="uint32")
        it = iter(loader)
        while len(seen) < total:
            seen.append(identify(next(it)))  # only whole, committed batches are served
            versions.append(source.current.version)
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
    assert versions == sorted(versions)  # the consumer only moves forward
    _check_exactly_once(seen, producers, count)
    assert seen == _committed(url)  # what it saw is the committed order, as every rank sees it


def test_producers_killed_at_random_points_never_lose_or_duplicate(bucket: str) -> None:
    producers, count, kills = (3, 60, 6) if FULL else (2, 16, 3)
    url = f"s3://{bucket}/live"
    LiveProducer(url, "setup", batch_size=B, seq_len=T).close()
    rng = random.Random(5)
    for _ in range(kills):
        procs = [_spawn("produce", url, f"p-{k}", str(count), "2") for k in range(producers)]
        time.sleep(rng.uniform(0.5, 3.0))
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    procs = [_spawn("produce", url, f"p-{k}", str(count), "2") for k in range(producers)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
    _check_exactly_once(_committed(url), producers, count)


def test_a_consumer_killed_and_restored_resumes_exactly(tmp_path: Path, bucket: str) -> None:
    count = 40
    url = f"s3://{bucket}/live"
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=4) as p:
        for i in range(count):
            p.append(batch(0, i))
    state, out = tmp_path / "state.json", tmp_path / "served.txt"
    rng = random.Random(2)
    for _ in range(3):
        proc = _spawn("consume", url, str(state), str(out), str(count))
        time.sleep(rng.uniform(1.5, 3.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc = _spawn("consume", url, str(state), str(out), str(count))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    lines = [tuple(map(int, line.split())) for line in out.read_text().splitlines()]
    by_step: dict[int, tuple[int, int]] = {}
    for step, producer, i in lines:
        assert by_step.setdefault(step, (producer, i)) == (producer, i)  # a re-served step is
    assert sorted(by_step) == list(range(1, count + 1))  # the same batch; none skipped
    assert [by_step[s] for s in range(1, count + 1)] == [(0, i) for i in range(count)]
    assert json.loads(state.read_text())["step"] == count


def test_one_global_order_for_every_rank_and_any_version(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    early = None
    with LiveProducer(path, "p-1", batch_size=B, seq_len=T, cadence=1) as p:
        for i in range(6):
            p.append(batch(1, i))
            if i == 2:
                early = LiveSource(path)  # opened at an older version: follows the newer ones
    assert early is not None and early.committed == 3
    late = LiveSource(path)
    ranks = [BatchNativeLoader(s, rank=r, world_size=2) for r, s in ((0, early), (1, late))]
    for loader in ranks:
        got = [tag(1, i) for i in range(6)]
        items = iter(loader)
        assert [int(next(items)[0, 0]) for _ in range(6)] == got
    early.close()
    late.close()


def test_the_manifest_chain_reads_versions_and_segments(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    with LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        for i in range(5):
            p.append(batch(0, i))
    store = open_store(path)
    chain = ManifestChain(store, LiveSource(path).descriptor)
    latest = chain.latest()
    assert latest.batches == 5 and len(latest.segments) == 2 and len(latest.tail) == 1
    assert [e.first for e in chain.entries(latest)] == [0, 1, 2, 3, 4]
    assert [m.version for m in chain.after(latest.version - 2)] == [
        latest.version - 1,
        latest.version,
    ]


def test_a_commit_overwritten_by_a_racing_create_is_reported(tmp_path: Path) -> None:
    class Racy(LocalStore):
        """Passes the sequential probe, but a racing writer overwrites manifest versions."""

        def _create(self, key: str, data: bytes) -> bool:
            created = super()._create(key, data)
            if created and key.startswith("manifests/") and not key.endswith("0000.json"):
                self._write(key, data.replace(b'"writer":"p-0"', b'"writer":"p-9"'))
            return created

    producer = LiveProducer(Racy(tmp_path / "live"), "p-0", batch_size=B, seq_len=T, cadence=1)
    with pytest.raises(ConditionalCreateUnsupportedError, match="was overwritten"):
        producer.append(batch(0, 0))
