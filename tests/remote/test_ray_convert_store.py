"""Ray conversion straight to an object store: ``convert_with_ray`` and ``zerobatch convert
--engine ray`` with an ``s3://`` output, against a real S3-compatible server (moto on loopback,
``conftest.py``) and a local Ray cluster of 2 CPUs in this process.

The corpus (parquet files of several row groups), its BPE tokenizer and the local engine's
dataset of it are ``tests/e2e/test_ray_convert.py``'s fixtures, and so is ``FaultySink``. The
dataset on the store must hold exactly the local dataset's files as objects, byte for byte
(every shard, ``checksums.xxh3`` and ``manifest.json``), and nothing else: the segments' work
prefix is gone. A job whose shard task is killed on every attempt leaves no object at all, so
no manifest. The command line refuses shards an unfinished job left unless ``--overwrite``, and
refuses a dataset already at the URL with ``--overwrite`` too (an object store cannot replace
one atomically), leaving it as it was. Bad outputs are named before any work starts.

The Ray workers open the store from their own environment: the cluster's ``runtime_env`` gives
them the server's endpoint and the test credentials, as a deployment gives every node its own.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import test_ray_convert as reference
from tests.e2e.test_ray_convert import BATCH, SEED, SEQ_LEN, SHARD_BATCHES, FaultySink, _comparable
from tests.helpers import require
from tests.s3server import CREDENTIALS, S3Server
from zerobatch_core import WriteError
from zerobatch_core.cli import main
from zerobatch_core.errors import ZeroBatchError
from zerobatch_core.ingest.units import plan_units
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.tokenization import load_tokenizer

ray = require("ray")
ray_convert = pytest.importorskip("zerobatch_core.ingest.ray_convert")

Corpus = tuple[list[str], str]

corpus = reference.corpus
"""The parquet corpus and its BPE tokenizer spec (a module fixture, requested by name)."""
local = reference.local
"""The local engine's dataset of the corpus, the reference (a module fixture)."""


@pytest.fixture(scope="module")
def cluster(s3_server: S3Server) -> Iterator[Any]:
    """A local Ray cluster of 2 CPUs whose workers reach the S3 test server. Workers take their
    environment from the cluster, not from this process's later changes (``bucket``'s)."""
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ALLOW_HTTP": "true"}
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.ERROR,
        runtime_env={"env_vars": env},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def same_objects(url: str, local: Path) -> None:
    """The store at ``url`` holds exactly the files of the directory ``local``, as objects of
    the same names with the same bytes."""
    store = open_store(url)
    names = sorted(os.listdir(local))
    assert store.list_keys() == names
    for name in names:
        assert store.read(name) == (local / name).read_bytes(), name


def convert_args(corpus: Corpus, url: str) -> list[str]:
    """``zerobatch convert`` of the corpus to ``url`` with the reference dataset's options."""
    paths, spec = corpus
    text = ["--tokenizer", spec]
    shape = ["--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH), "--seed", str(SEED)]
    ray_opts = ["--engine", "ray", "--workers", "2"]
    return ["convert", *paths, url, *shape, *text, "--shard-size", str(SHARD_BATCHES), *ray_opts]


def test_ray_to_s3_is_byte_identical_to_the_local_dataset(
    cluster: Any, corpus: Corpus, local: Path, bucket: str
) -> None:
    paths, spec = corpus
    url = f"s3://{bucket}/data/train"
    summary = ray_convert.convert_with_ray(
        paths,
        url,
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        seed=SEED,
        tokenizer=spec,
        shard_batches=SHARD_BATCHES,
        workers=2,
        cpus_per_worker=0.5,
        show_progress=False,
    )
    same_objects(url, local)  # every shard, the checksums and the manifest; no work prefix
    expected = json.loads((local.parent / "summary.json").read_text())
    assert json.loads(json.dumps(_comparable(summary))) == expected
    assert summary.output == url


def test_a_job_killed_on_every_attempt_leaves_no_manifest_on_the_store(
    cluster: Any, corpus: Corpus, bucket: str, tmp_path: Path
) -> None:
    """Unit 2's segment put fails once (retried); shard 1's task is killed twice, which fails
    the job: the shards other tasks put, the checksums and the segments are deleted."""
    paths, spec = corpus
    url = f"s3://{bucket}/failed"
    markers = tmp_path / "markers"
    markers.mkdir()
    units, files = plan_units(paths)
    sink = FaultySink(
        url,
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        seed=SEED,
        shard_batches=SHARD_BATCHES,
        files=files,
        num_units=len(units),
        inputs=paths,
        concurrency=2,
        max_retries=1,
        markers=str(markers),
        kill_always=True,
    )
    segments = ray_convert.segments_dataset(
        units, load_tokenizer(spec).to_json(), SEQ_LEN, workers=1, cpus_per_worker=0.5
    )
    with pytest.raises(Exception) as info:
        segments.write_datasink(sink, ray_remote_args=sink.remote_args, concurrency=2)
    assert "died" in str(info.value) or "exit" in str(info.value).lower(), info.value
    assert (markers / "eio").exists()  # the failed segment put was retried
    assert len((markers / "kills").read_text().split()) == 2  # the attempt and one retry
    assert open_store(url).list_keys() == []  # no manifest, checksums, shard or segment


def test_cli_converts_to_s3_and_refuses_what_is_already_there(
    cluster: Any, corpus: Corpus, local: Path, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{bucket}/cli/train"
    open_store(url).write("shard-00099.batch", b"a shard an unfinished job left")
    argv = [*convert_args(corpus, url), "--json"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds shard objects (shard-00099.batch, ...) but no manifest.json" in err, err
    assert "--overwrite" in err
    assert main([*argv, "--overwrite"]) == 0  # replaces the leftover: it is no dataset
    summary = json.loads(capsys.readouterr().out)
    assert summary["output"] == url
    expected = json.loads((local.parent / "summary.json").read_text())
    assert summary["shards"] == expected["shards"] and summary["batches"] == expected["batches"]
    same_objects(url, local)  # the leftover shard is gone
    for extra in ([], ["--overwrite"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert "already a dataset (it has a manifest.json)" in err, err
        assert "never replaced, --overwrite or not" in err
        same_objects(url, local)


def test_bad_outputs_are_named_before_any_work(
    bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "docs.txt"
    source.write_text("a few words to convert\n", encoding="utf-8")
    shape = {"seq_len": 4, "batch_size": 1, "show_progress": False}
    with pytest.raises(WriteError, match=r"an object-store output is a dataset: pass shard_batch"):
        ray_convert.convert_with_ray([str(source)], f"s3://{bucket}/one.batch", **shape)
    with pytest.raises(ZeroBatchError, match=r"unknown URL scheme 'nope'"):
        ray_convert.convert_with_ray([str(source)], "nope://x/y", shard_batches=1, **shape)
    with pytest.raises(ZeroBatchError, match=rf"s3://{bucket}-missing/x"):
        ray_convert.convert_with_ray(
            [str(source)], f"s3://{bucket}-missing/x", shard_batches=1, **shape
        )
    argv = ["convert", str(source), f"s3://{bucket}/x", "--seq-len", "4", "--batch-size", "1"]
    assert main([*argv, "--engine", "ray"]) == 2
    assert "an object-store output is a dataset: pass --shard-size N" in capsys.readouterr().err
    assert main([*argv, "--shard-size", "1"]) == 2
    assert "with --engine ray --shard-size N" in capsys.readouterr().err
    assert open_store(f"s3://{bucket}").list_keys() == []
