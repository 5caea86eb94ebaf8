"""``zerobatch produce`` against the S3 test server: producer processes tokenizing a parquet
corpus into a live dataset while a consumer trains on it, producers SIGKILLed and restarted,
refused restarts, and the Ray engine with a producer task killed once."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import require
from tests.produce_corpus import PAD, committed_documents, producer_streams, write_corpus
from tests.unit.bpe import train_bpe
from zerobatch_core import BatchNativeLoader
from zerobatch_core.ingest.produce import ProduceProgress, produce
from zerobatch_core.live.source import LiveSource

ROOT = Path(__file__).resolve().parents[2]
T, B = 64, 4
FLAGS = ["--seq-len", str(T), "--batch-size", str(B), "--pad-id", str(PAD)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    root = tmp_path_factory.mktemp("corpus")
    texts = write_corpus(root, files=3, docs=600, row_group=17, seed=4)
    return str(root / "*.parquet"), texts


def _spawn(pattern: str, url: str, i: int, *extra: str) -> subprocess.Popen[bytes]:
    args = [pattern, url, "--producer-id", f"p{i}", "--producers", "3", "--index", str(i)]
    return subprocess.Popen(
        [sys.executable, "-m", "zerobatch_core.cli", "produce", *args, *FLAGS, *extra],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _finish(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]


def _streams(url: str) -> dict[str, list[bytes]]:
    return {p: [b.tobytes() for b in s] for p, s in producer_streams(url).items()}


def _reference(pattern: str, root: Path, epochs: int) -> dict[str, list[bytes]]:
    """The three producers' streams, run one after the other without interruption."""
    url = str(root / f"reference-{epochs}")
    if not Path(url).exists():
        for i in range(3):
            produce(
                pattern,
                url,
                producer_id=f"p{i}",
                producers=3,
                index=i,
                seq_len=T,
                batch_size=B,
                pad_id=PAD,
                epochs=epochs,
                batches_per_object=2,
            )
    return _streams(url)


def test_three_producers_feed_a_training_consumer(
    corpus: tuple[str, list[str]], bucket: str
) -> None:
    pattern, texts = corpus
    url = f"s3://{bucket}/run"
    procs = [
        _spawn(pattern, url, i, "--epochs", "1", "--batches-per-object", "2") for i in range(3)
    ]
    seen: list[bytes] = []
    weights = np.zeros(T, dtype=np.float64)  # a consumer that trains: one step per batch
    source = None
    deadline = time.monotonic() + 300
    while source is None:  # the first producer to start creates the dataset
        try:
            source = LiveSource(url, timeout=120)
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    with source:
        it = iter(BatchNativeLoader(source, dtype="int64"))
        while True:
            if all(p.poll() is not None for p in procs):
                source.refresh()
                if len(seen) == source.committed:
                    break
            batch = next(it)
            weights += 0.01 * (batch.mean(axis=0) - weights)
            seen.append(batch.astype(np.uint32).tobytes())
    _finish(procs)
    assert committed_documents(url) == collections.Counter(texts)
    with LiveSource(url) as after:  # what it trained on is the committed order
        # The dataset's dtype (uint16 for the byte tokenizer), read as the consumer's uint32.
        stored = [np.asarray(after.read_batch(g)) for g in range(after.committed)]
        assert seen == [b.astype(np.uint32).tobytes() for b in stored]
    assert np.isfinite(weights).all()


def test_producers_killed_and_restarted_commit_every_document_once(
    corpus: tuple[str, list[str]], bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pattern, texts = corpus
    url = f"s3://{bucket}/killed"
    extra = ("--epochs", "2", "--batches-per-object", "2")
    rng = random.Random(11)
    for _ in range(4):
        procs = [_spawn(pattern, url, i, *extra) for i in range(3)]
        time.sleep(rng.uniform(1.0, 3.0))
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    _finish([_spawn(pattern, url, i, *extra) for i in range(3)])
    assert committed_documents(url) == collections.Counter(texts * 2)
    assert _streams(url) == _reference(pattern, tmp_path_factory.getbasetemp(), 2)


def test_a_restart_with_another_tokenizer_or_seq_len_is_refused(
    corpus: tuple[str, list[str]], bucket: str, tmp_path: Path
) -> None:
    pattern, texts = corpus
    url = f"s3://{bucket}/refused"
    _finish([_spawn(pattern, url, 0, "--epochs", "1")])
    with LiveSource(url) as source:
        version, committed = source.current.version, source.committed
    hf = require("tokenizers")
    spec = train_bpe(hf, texts[:50], tmp_path / "tok.json", "<s>", vocab_size=300)
    for change, message in (
        (["--tokenizer", spec], "--tokenizer byte (now 'hf:"),
        (["--seq-len", str(2 * T)], "--seq-len 64 (now 128)"),
    ):
        args = [pattern, url, "--producer-id", "p0", "--producers", "3", "--index", "0"]
        flags = [*FLAGS, *change] if change[0] != "--seq-len" else [*FLAGS[2:], *change]
        done = subprocess.run(
            [sys.executable, "-m", "zerobatch_core.cli", "produce", *args, *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0
        assert "producer p0 was started with another configuration" in done.stderr
        assert message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    with LiveSource(url) as source:
        assert (source.current.version, source.committed) == (version, committed)


class KillOnce:
    """An ``on_commit`` that ends its worker process the first time, from one producer."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, progress: ProduceProgress) -> None:
        if progress.producer.endswith("-1") and progress.committed >= 3:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.close(fd)
            os._exit(1)


def test_ray_producers_with_a_task_killed_once(
    corpus: tuple[str, list[str]], bucket: str, tmp_path: Path
) -> None:
    ray = pytest.importorskip("ray")
    from zerobatch_core.ingest.ray_produce import produce_with_ray

    pattern, texts = corpus
    url = f"s3://{bucket}/ray"
    marker = str(tmp_path / "killed")
    options: dict[str, Any] = {"seq_len": T, "batch_size": B, "pad_id": PAD, "epochs": 1}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": _s3_environment()})
    try:
        summaries = produce_with_ray(
            pattern,
            url,
            producer_id="r",
            producers=2,
            batches_per_object=2,
            on_commit=KillOnce(marker),
            cpus_per_producer=1,
            **options,
        )
    finally:
        ray.shutdown()
    assert os.path.exists(marker)  # the task was killed, and its retry finished
    assert [s.producer for s in summaries] == ["r-0", "r-1"]
    assert summaries[1].resumed_at >= 3
    assert committed_documents(url) == collections.Counter(texts)
    reference = str(tmp_path / "reference")
    for i in range(2):
        produce(pattern, reference, producer_id=f"r-{i}", producers=2, index=i,
                batches_per_object=2, **options)  # fmt: skip
    assert _streams(url) == _streams(reference)


def _s3_environment() -> dict[str, str]:
    """The S3 settings of this test's environment, for Ray's worker processes."""
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


def test_sigterm_stops_a_producer_with_everything_appended_committed(
    corpus: tuple[str, list[str]], bucket: str
) -> None:
    pattern, _ = corpus
    url = f"s3://{bucket}/term"
    args = [pattern, url, "--producer-id", "p0", "--batches-per-object", "2", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "zerobatch_core.cli", "produce", *args, *FLAGS, "--verbose"],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("committed ")  # it runs, and has committed
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["finished"] is False and summary["committed"] > 0
    with LiveSource(url) as source:
        assert source.committed == summary["committed"]  # nothing left pending
    again = produce(pattern, url, producer_id="p0", seq_len=T, batch_size=B, pad_id=PAD,
                    batches_per_object=2, stop=lambda: True)  # fmt: skip
    assert again.resumed_at == summary["committed"]
