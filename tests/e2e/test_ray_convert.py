"""Text conversion on a real local Ray cluster (``ray.init(num_cpus=2)`` in this process).

A parquet corpus of about 300,000 BPE tokens, generated and tokenized here (the BPE model is
trained on it), goes through ``convert_with_ray``: the dataset must be byte-identical to the
local ``convert`` of the same corpus (every shard, the checksums and the manifest) with 1, 2
and 4 tokenizer actors; every adapter (NumPy, PyTorch, JAX, tf.data) reads it; undoing each
shard's permutation and splitting the record stream at BOS gives the documents back. Faults are
injected into the Datasink's own tasks through subclasses (Ray workers import this module by
name): a write task that raises an ``OSError`` once and a shard task killed with ``os._exit``
in the middle of its write are retried and the committed dataset is unchanged, with no
duplicate or orphan shard; a shard task killed on every attempt fails the job, which leaves no
manifest, no shard and no work directory. The command line (``--engine ray``) converts JSONL
with a tiktoken tokenizer in ``pad`` mode to the same single file as the local engine.

Isolation: Ray runs in this process; the adapters read the dataset in child processes, one per
framework, so Ray, PyTorch, JAX and TensorFlow never share a process.
"""

from __future__ import annotations

import base64
import errno
import filecmp
import json
import logging
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import record_source

from tests.helpers import require
from tests.unit.bpe import train_bpe
from zerobatch_core import DatasetReader, IngestError, convert
from zerobatch_core.cli import main
from zerobatch_core.ingest.dtypes import plan_text_dtype, tokenizer_ids
from zerobatch_core.ingest.units import plan_units
from zerobatch_core.tokenization import load_tokenizer

ray = require("ray")
ray_convert = pytest.importorskip("zerobatch_core.ingest.ray_convert")

ROOT = Path(__file__).resolve().parents[2]
BOS = "<|bos|>"
SEQ_LEN, BATCH, SHARD_BATCHES, SEED = 128, 8, 32, 2024
FILES, DOCS_PER_FILE, ROW_GROUP = 3, 1200, 150


def _corpus() -> list[str]:
    """Deterministic documents of varied length (a few far longer than a record), Unicode,
    whitespace runs, an empty document and a literal BOS string that must stay text."""
    rng = random.Random(15)
    words = ["the", "cat", "sat", "on", "mat", "data", "token", "batch", "zero", "naïve"]
    words += ["café", "日本語", "テキスト", "🎉", "—", "x1", "42", "ray", "shard", "commit"]
    docs = []
    for i in range(FILES * DOCS_PER_FILE):
        n = rng.choice([2, 10, 40, 90]) if i % 97 else 900
        sep = rng.choice([" ", " ", "  ", "\n", "\t"])
        docs.append(sep.join(rng.choice(words) for _ in range(n)))
    docs[5] = ""
    docs[8] = f"a literal {BOS} marker inside the text"
    return docs


CORPUS = _corpus()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local Ray cluster of 2 CPUs in this process, for the whole module."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    """The corpus as parquet files of several row groups each, and a BPE model trained on it."""
    pa = require("pyarrow")
    pq = require("pyarrow.parquet")
    hf = require("tokenizers")
    root = tmp_path_factory.mktemp("corpus")
    paths = []
    for f in range(FILES):
        part = CORPUS[f * DOCS_PER_FILE : (f + 1) * DOCS_PER_FILE]
        path = root / f"part-{f:03d}.parquet"
        pq.write_table(
            pa.table({"id": range(len(part)), "text": part}), path, row_group_size=ROW_GROUP
        )
        paths.append(str(path))
    spec = train_bpe(hf, CORPUS, root / "tokenizer.json", BOS, vocab_size=500)
    return paths, spec


@pytest.fixture(scope="module")
def local(corpus: tuple[list[str], str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local engine's dataset of the corpus: the reference every Ray output must equal."""
    paths, spec = corpus
    out = tmp_path_factory.mktemp("local") / "train"
    summary = convert(
        paths,
        str(out),
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        seed=SEED,
        tokenizer=spec,
        shard_batches=SHARD_BATCHES,
    )
    assert summary.shards is not None and summary.shards > 5
    assert 250_000 < summary.tokens < 400_000
    (out.parent / "summary.json").write_text(json.dumps(_comparable(summary)))
    return out


def _comparable(summary: Any) -> dict[str, Any]:
    """A summary without what differs between runs: the output path and the timings."""
    d: dict[str, Any] = summary.as_dict()
    for key in ("output", "seconds", "tokens_per_second"):
        d.pop(key)
    return d


def same_tree(a: Path, b: Path) -> None:
    """Both directories hold the same file names with the same bytes, nothing else."""
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), name


def ray_convert_corpus(corpus: tuple[list[str], str], out: Path, **kw: Any) -> Any:
    paths, spec = corpus
    return ray_convert.convert_with_ray(
        paths,
        str(out),
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        seed=SEED,
        tokenizer=spec,
        shard_batches=SHARD_BATCHES,
        show_progress=False,
        **kw,
    )


@pytest.fixture(scope="module")
def two_workers(
    cluster: Any, corpus: tuple[list[str], str], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("ray2") / "train"
    ray_convert_corpus(corpus, out, workers=2, cpus_per_worker=0.5)
    return out


# --- determinism -------------------------------------------------------------------------------


def test_dataset_is_byte_identical_to_local_for_1_2_and_4_workers(
    cluster: Any,
    corpus: tuple[list[str], str],
    local: Path,
    two_workers: Path,
    tmp_path: Path,
) -> None:
    same_tree(two_workers, local)
    expected = json.loads((local.parent / "summary.json").read_text())
    for workers in (1, 4):
        out = tmp_path / f"w{workers}"
        summary = ray_convert_corpus(corpus, out, workers=workers, cpus_per_worker=1 / workers)
        same_tree(out, local)
        assert json.loads(json.dumps(_comparable(summary))) == expected


# --- acceptance: every adapter reads it, and the documents come back ---------------------------

ADAPTER_CHILD = r"""
import math, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[1])
name, path, out = sys.argv[2], Path(sys.argv[3]), sys.argv[4]
if name == "jax":
    import jax
    from zerobatch_adapters.jax import JaxBatchIterator, default_sharding
    from zerobatch_core import DatasetReader
    rows = DatasetReader(path).batch_size
    devices = jax.devices()
    sharding = default_sharding(devices[: math.gcd(len(devices), rows)])
    adapter = JaxBatchIterator(path, sharding=sharding, shuffle=False)
else:
    from tests.adapters.contract_adapters import make
    adapter = make(name, path, shuffle=False)
batches = [np.array(b.numpy() if hasattr(b, "numpy") else b) for b in adapter]
adapter.close()
np.save(out, np.stack(batches).astype(np.int64))
"""


def test_every_adapter_reads_the_dataset(two_workers: Path, tmp_path: Path) -> None:
    names = {"numpy": "numpy", "torch-loader": "torch", "jax": "jax", "tensorflow": "tensorflow"}
    for module in names.values():
        if module != "numpy":
            require(module)
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    children = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-c",
                ADAPTER_CHILD,
                str(ROOT),
                name,
                str(two_workers),
                str(tmp_path / f"{name}.npy"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in names
    }
    with DatasetReader(two_workers) as ds:
        want = np.stack([ds.read_batch(i) for i in range(ds.num_batches)]).astype(np.int64)
    for name, child in children.items():
        output, _ = child.communicate(timeout=300)
        assert child.returncode == 0, f"{name}: {output}"
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), want, err_msg=name)


def test_records_decode_to_the_documents(two_workers: Path, corpus: tuple[list[str], str]) -> None:
    """Undo every shard's permutation and put the records at their place in the record stream
    (the manifest's ``records`` ranges); split the stream at BOS: the documents come back, up to
    the first record the last shard's batch remainder dropped."""
    tok = load_tokenizer(corpus[1])
    with DatasetReader(two_workers) as ds:
        manifest = ds.manifest
        last = manifest.shards[-1].records
        assert last is not None
        stream = np.full((last[1], SEQ_LEN), -1, dtype=np.int64)
        for i, shard in enumerate(manifest.shards):
            assert shard.records is not None
            first = shard.records[0]
            reader = ds.shard(i)
            for b in range(shard.num_batches):
                for r, row in enumerate(reader.read_batch(b)):
                    stream[
                        first + record_source(b * BATCH + r, shard.total_records, shard.seed)
                    ] = row
    assert [s.path for s in manifest.sources] == [os.path.abspath(p) for p in corpus[0]]
    missing = np.flatnonzero((stream < 0).any(axis=1))
    assert missing.size == last[1] % BATCH and (missing >= last[0]).all()
    tokens = stream[: missing.min() if missing.size else len(stream)].ravel()
    starts = np.flatnonzero(tokens == tok.bos_id)
    assert starts[0] == 0
    pieces = np.split(tokens, starts)[1:]
    complete = pieces[:-1]
    assert len(complete) > 0.8 * len(CORPUS)
    for i, piece in enumerate(complete):
        assert tok.decode(piece) == CORPUS[i], i
    assert len(pieces) == np.count_nonzero(tokens == tok.bos_id)  # the literal BOS stayed text


# --- faults ------------------------------------------------------------------------------------


def _first_time(marker: str) -> bool:
    """True exactly once per marker path, across processes (``O_EXCL``)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class FaultySink(ray_convert.LLMBatchDatasink):
    """Writing unit 2's segment raises ``EIO`` once; shard 1's first attempt is killed with
    ``os._exit`` after its first block went to the file writer (or on every attempt, with
    ``kill_always``), noting whether ``shard-00001.batch`` existed at that moment."""

    def __init__(self, *args: Any, markers: str, kill_always: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.markers, self.kill_always = markers, kill_always

    def store_segment(self, unit: int, data: bytes) -> None:
        if unit == 2 and _first_time(os.path.join(self.markers, "eio")):
            raise OSError(errno.EIO, "injected I/O error")
        super().store_segment(unit, data)

    def output_records(self, plan: dict[str, Any]) -> Iterator[npt.NDArray[np.uint32]]:
        for k, block in enumerate(super().output_records(plan)):
            yield block
            if plan["index"] == 1 and k == 0:
                with open(os.path.join(self.markers, "kills"), "a") as f:
                    visible = os.path.exists(os.path.join(self.path, plan["name"]))
                    f.write(f"{int(visible)}\n")
                if self.kill_always or _first_time(os.path.join(self.markers, "killed")):
                    os._exit(1)


def _faulty_run(corpus: tuple[list[str], str], out: Path, markers: Path, **kw: Any) -> FaultySink:
    paths, spec = corpus
    units, files = plan_units(paths)
    assert len(units) == FILES * math.ceil(DOCS_PER_FILE / ROW_GROUP)
    tok = load_tokenizer(spec)  # the dtype the local engine's "auto" writes for it
    dtype = plan_text_dtype(tokenizer_ids(tok, None), "auto", tok.name).code
    sink = FaultySink(
        out,
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        seed=SEED,
        shard_batches=SHARD_BATCHES,
        files=files,
        num_units=len(units),
        inputs=paths,
        concurrency=2,
        markers=str(markers),
        dtype=dtype,
        **kw,
    )
    segments = ray_convert.segments_dataset(
        units, load_tokenizer(spec).to_json(), SEQ_LEN, workers=1, cpus_per_worker=0.5
    )
    segments.write_datasink(sink, ray_remote_args=sink.remote_args, concurrency=2)
    return sink


def test_retried_and_killed_tasks_leave_the_same_dataset(
    cluster: Any, corpus: tuple[list[str], str], local: Path, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "faulty"
    sink = _faulty_run(corpus, out, markers)
    assert (markers / "eio").exists() and (markers / "killed").exists()
    # Killed mid-write: the shard had no name yet, and its retry wrote it once.
    assert (markers / "kills").read_text().split() == ["0", "0"]
    same_tree(out, local)  # no duplicate, no orphan, no work directory: the same dataset
    assert sink.result is not None and sink.result.manifest is not None
    names = [s.name for s in sink.result.manifest.shards]
    assert len(names) == len(set(names))


def test_a_task_killed_on_every_attempt_fails_the_job_and_leaves_nothing(
    cluster: Any, corpus: tuple[list[str], str], tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "failed"
    with pytest.raises(Exception) as info:
        _faulty_run(corpus, out, markers, kill_always=True, max_retries=1)
    assert "died" in str(info.value) or "exit" in str(info.value).lower(), info.value
    assert (markers / "kills").read_text().split() == ["0", "0"]  # the attempt and one retry
    assert os.listdir(out) == []  # no manifest, no checksums, no shard, no work directory


# --- the command line --------------------------------------------------------------------------


def test_cli_engine_ray_jsonl_tiktoken_pad_matches_local(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ranks = {bytes([b]): b for b in range(256)}
    for merge in (b"th", b"the", b" t", b" the", b"at", b"cat", b"ta", b"da"):
        ranks[merge] = len(ranks)
    rank_file = tmp_path / "tiny.tiktoken"
    rank_file.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    spec = f"tiktoken:{rank_file}?pattern=o200k_base&bos=<|endoftext|>&eos=<|endoftext|>"
    sources = []
    for f in range(2):
        path = tmp_path / f"docs-{f}.jsonl"
        lines = [json.dumps({"text": d}) for d in CORPUS[f * 300 : (f + 1) * 300]]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        sources.append(str(path))
    opts = [
        "--seq-len",
        "64",
        "--batch-size",
        "4",
        "--seed",
        "9",
        "--mode",
        "pad",
        "--tokenizer",
        spec,
        "--json",
    ]
    assert main(["convert", *sources, str(tmp_path / "local.batch"), *opts]) == 0
    capsys.readouterr()
    ray_opts = ["--engine", "ray", "--workers", "2"]
    assert main(["convert", *sources, str(tmp_path / "ray.batch"), *opts, *ray_opts]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["batches"] == 150 and summary["packing"]["mode"] == "pad"
    assert filecmp.cmp(tmp_path / "local.batch", tmp_path / "ray.batch", shallow=False)
    assert sorted(os.listdir(tmp_path)) == [
        "docs-0.jsonl",
        "docs-1.jsonl",
        "local.batch",
        "ray.batch",
        "tiny.tiktoken",
    ]


def test_cli_engine_ray_errors(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n', encoding="utf-8")
    out = str(tmp_path / "out")
    argv = ["convert", str(bad), out, "--seq-len", "8", "--batch-size", "1", "--engine", "ray"]
    assert main([*argv, "--shard-size", "2"]) == 1
    assert "bad.jsonl: line 2: field 'text' is int, expected a string" in capsys.readouterr().err
    assert not os.path.exists(out) or os.listdir(out) == []
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.arange(100, dtype=np.uint32))
    assert (
        main(
            ["convert", str(tokens), out, "--seq-len", "8", "--batch-size", "1", "--engine", "ray"]
        )
        == 2
    )
    assert "converts text sources only, not npy" in capsys.readouterr().err
    assert main([*argv[:-2], "--address", "auto"]) == 2
    assert "--address applies only to --engine ray" in capsys.readouterr().err


def test_missing_ray_is_exit_3(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("hello", encoding="utf-8")
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from zerobatch_core.cli import main\n"
        f"sys.exit(main(['convert', {str(src)!r}, {str(tmp_path / 'o.batch')!r}, '--seq-len', "
        "'2', '--batch-size', '1', '--engine', 'ray']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 3, done.stderr
    assert "pip install 'zerobatch[ray]'" in done.stderr


def test_a_parquet_column_is_checked_before_the_job(tmp_path: Path) -> None:
    pa, pq = require("pyarrow"), require("pyarrow.parquet")
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "n": [1, 2]}), path)
    with pytest.raises(IngestError, match=r"one\.parquet: no column 'body'"):
        plan_units([str(path)], text_field="body")
    with pytest.raises(IngestError, match=r"one\.parquet: column 'n' has type int64"):
        plan_units([str(path)], text_field="n")
