"""Metadata files that are not regular files: a FIFO named ``manifest.json``,
``checksums.xxh3``, ``live.json`` or a live manifest version is refused at once, with an error
naming the file (SPEC.md sections 4 and 12, ``unreadable_path``), by the dataset reader, the
loader, the local store of live datasets and the ``validate``, ``inspect`` and ``dataset
reclaim`` commands, never waited on.

Each call runs in a thread with a deadline; one that blocks is released (the FIFO opened for
writing and closed, which gives the blocked reader an end of file) and the test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME, DatasetCode
from zerobatch_spec.live import DESCRIPTOR_NAME, manifest_name

from tests.helpers import records
from zerobatch_core import BatchNativeLoader, DatasetError, DatasetReader, ZeroBatchIOError
from zerobatch_core.cli import main
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.delivery.sources import open_reader
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.stores.store import LocalStore

B, T = 4, 5
DEADLINE = 10.0


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(48, T)], batch_size=B, seq_len=T, shard_batches=3, seed=2)
    return out


def fifo(path: Path) -> Path:
    """Replace the file ``path`` by a FIFO of the same name."""
    path.unlink()
    os.mkfifo(path)
    return path


def promptly(fn: Callable[[], Any], *fifos: Path) -> Any:
    """``fn()``'s result (or its exception, raised here), failing the test if it has not
    returned within ``DEADLINE`` seconds."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive():
        for path in fifos:  # a writer that opens and closes: the blocked read sees its end
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(DEADLINE)
        pytest.fail(f"blocked for {DEADLINE:g} s on a FIFO: {', '.join(map(str, fifos))}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def command(capsys: pytest.CaptureFixture[str], argv: list[str], *fifos: Path) -> tuple[int, str]:
    status = promptly(lambda: main(argv), *fifos)
    out = capsys.readouterr()
    return status, out.out + out.err


def test_a_fifo_checksums_file_is_refused_at_once(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sums = fifo(dataset / CHECKSUMS_NAME)
    for deep in ([], ["--deep"]):
        status, output = command(capsys, ["validate", *deep, str(dataset)], sums)
        assert status == 1 and "checksums_mismatch" in output and "FIFO" in output, output
    status, output = command(capsys, ["validate", "--json", str(dataset)], sums)
    report = json.loads(output)
    assert status == 1 and not report["valid"]
    assert [f["code"] for f in report["failures"]] == ["checksums_mismatch"]
    assert "not a regular file (a FIFO)" in report["failures"][0]["detail"]
    with DatasetReader(dataset, verify="first") as reader:
        with pytest.raises(DatasetError, match="FIFO") as caught:
            promptly(lambda: reader.read_batch(0), sums)
        assert caught.value.code is DatasetCode.CHECKSUMS_MISMATCH
        assert caught.value.path == str(sums)
    loader = BatchNativeLoader(dataset, dtype="uint32")
    with pytest.raises(DatasetError, match="checksums_mismatch"):
        promptly(lambda: next(iter(loader)), sums)


def test_a_fifo_manifest_is_refused_at_once(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = fifo(dataset / MANIFEST_NAME)
    with pytest.raises(ZeroBatchIOError, match="not a regular file") as caught:
        promptly(lambda: DatasetReader(dataset), manifest)
    assert caught.value.filename == str(manifest)
    for argv in (["validate", str(dataset)], ["inspect", "--json", str(dataset)]):
        status, output = command(capsys, argv, manifest)
        assert status == 2, output  # a path that cannot be read (README's table)
        assert f"{manifest}: not a regular file" in output, output


def test_local_store_reads_refuse_fifos(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write("a/key.json", b"{}")
    key = fifo(tmp_path / "a" / "key.json")
    reads: list[Callable[[], Any]] = [
        lambda: store.read("a/key.json"),
        lambda: store.read_ranges("a/key.json", [(0, 1)]),
        lambda: store.read_head("a/key.json", 16),
    ]
    for read in reads:
        with pytest.raises(ZeroBatchIOError, match=r"not a regular file \(a FIFO\)") as caught:
            promptly(read, key)
        assert caught.value.filename == str(key)
    with pytest.raises(ZeroBatchIOError, match=r"a directory"):
        store.read("a")
    store.write("a/real.json", b"{}")
    assert store.list_keys() == ["a/real.json"]  # a FIFO is no object: not listed
    assert store.stats.retries == 0  # refused for good: nothing to retry


def _live(tmp_path: Path) -> Path:
    path = tmp_path / "live"
    with LiveProducer(str(path), "p-0", batch_size=B, seq_len=T, cadence=1) as producer:
        for i in range(3):
            producer.append(np.full((B, T), i, dtype=np.uint32))
    return path


def test_live_metadata_fifos_are_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _live(tmp_path)
    versions = sorted((path / "manifests").iterdir())
    assert versions[-1].name == Path(manifest_name(len(versions) - 1)).name  # the newest
    latest = fifo(versions[-1])
    with pytest.raises(ZeroBatchIOError, match="not a regular file") as caught:
        promptly(lambda: open_reader(str(path)), latest)
    assert caught.value.filename == str(latest)
    for argv in (["validate", str(path)], ["inspect", str(path)]):
        status, output = command(capsys, argv, latest)
        assert status == 2 and f"{latest}: not a regular file" in output, output
    status, output = command(capsys, ["dataset", "reclaim", "--dry-run", str(path)], latest)
    assert status in (1, 2) and "not a regular file" in output, output  # no traceback
    descriptor = fifo(path / DESCRIPTOR_NAME)
    with pytest.raises(ZeroBatchIOError, match="not a regular file"):
        promptly(lambda: LocalStore(path).read(DESCRIPTOR_NAME), descriptor, latest)
    with pytest.raises(OSError):
        promptly(lambda: LiveProducer(str(path), "p-1"), descriptor, latest)
