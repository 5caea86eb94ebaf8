"""SIGKILL and Ctrl-C (SIGINT) at random points of the two commands that replace a dataset:
every outcome is the old dataset or the new one, whole, and the next write leaves nothing
behind.

Each trial starts a real ``python -m zerobatch_core`` process over an existing dataset,
``convert SRC DIR --shard-size N --overwrite`` (the new dataset has other shards, another
shard count and other records) or ``dataset create DIR FILE... --overwrite`` (the same files
in another order, with another seed), and signals it after a random delay drawn between the
interpreter's start-up time and a little more than an uninterrupted run, so signals land
while the new shards are written, around the checksums and manifest, around the swap and
while the replaced directory is removed. After each signal:

- the directory validates, deeply, and its manifest is the old one or the new one, byte for
  byte; it holds the new dataset's files only (``convert``) or the user's files, unchanged
  (``dataset create``);
- beside it there is nothing but a staging directory of a killed writer
  (``.NAME.zerobatch-new-*``), never a moved-aside dataset (``.NAME.zerobatch-old-*``)
  except in the two-rename fallback (forced in a third variant), where a signal between the
  renames leaves the directory missing and the old dataset whole beside it, which the next
  write refuses to overlook until it is moved back;
- the next write to the directory (which also resets it to the old dataset) removes every
  staging directory, and the directory holds only the dataset's files.

``ZEROBATCH_OVERWRITE_KILLS=K,I`` runs ``K`` kills and ``I`` interrupts per command (default
20 and 5; the fallback variant runs a quarter of them, at least 2 and 1).

The Ray engine's sharded overwrite (``LLMBatchDatasink``) stages and swaps the same way: a job
whose shard task fails leaves the old dataset whole, and a job that succeeds replaces it
(a subclass injects the failure; Ray workers import this module by name).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

from tests.e2e.test_writer_kills import hidden
from zerobatch_core import DatasetReader, convert, validate_dataset, write_batch_file
from zerobatch_core.datasets.build import create_dataset, write_sharded_dataset
from zerobatch_core.errors import WriteError

try:
    from zerobatch_core.ingest import ray_convert
except ImportError:  # no Ray: its test is skipped
    ray_convert = None

SEQ_LEN, BATCH_SIZE = 128, 8
RECORDS = 6 * 2**20 // (SEQ_LEN * 4)  # 6 MiB of tokens per dataset
KILLS, INTERRUPTS = (int(n) for n in os.environ.get("ZEROBATCH_OVERWRITE_KILLS", "20,5").split(","))


FALLBACK_TRIALS = (max(2, KILLS // 4), max(1, INTERRUPTS // 4))


def cli(*argv: object) -> list[str]:
    return [sys.executable, "-m", "zerobatch_core", *(str(a) for a in argv)]


FALLBACK = (
    "import sys\n"
    "from zerobatch_core import dataset_replace\n"
    "from zerobatch_core.cli import main\n"
    "dataset_replace.exchange_paths = lambda a, b: False\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)


def cli_fallback(*argv: object) -> list[str]:
    """The command with the one-step swap unavailable: the two-rename fallback."""
    return [sys.executable, "-c", FALLBACK, *(str(a) for a in argv)]


@dataclass
class Case:
    """One command replacing a dataset: how to run it, and how to put the old one back."""

    directory: Path
    argv: list[str]
    old: bytes
    """The old dataset's manifest."""
    reset: Callable[[], None]
    """The next write: rewrites the old dataset in place of whatever the trial left."""
    new: bytes = b""
    """The new dataset's manifest, from an uninterrupted run."""


def convert_case(root: Path, command: Callable[..., list[str]] = cli) -> Case:
    rng = np.random.default_rng(1)
    old_src, new_src = root / "old.npy", root / "new.npy"
    np.save(old_src, rng.integers(0, 2**31, (RECORDS, SEQ_LEN), dtype=np.uint32))
    np.save(new_src, rng.integers(0, 2**31, (RECORDS + 100, SEQ_LEN), dtype=np.uint32))
    out = root / "ds"
    kw = {"seq_len": SEQ_LEN, "batch_size": BATCH_SIZE, "seed": 3}

    def reset() -> None:
        convert([str(old_src)], str(out), shard_batches=40, overwrite=True, **kw)

    reset()
    argv = command(
        "convert", new_src, out, "--seq-len", SEQ_LEN, "--batch-size", BATCH_SIZE,
        "--shard-size", 16, "--seed", 4, "--overwrite", "--quiet",
    )  # fmt: skip
    return Case(out, argv, (out / MANIFEST_NAME).read_bytes(), reset)


def convert_fallback_case(root: Path) -> Case:
    return convert_case(root, cli_fallback)


def create_case(root: Path) -> Case:
    out = root / "files"
    out.mkdir()
    rng = np.random.default_rng(2)
    names = [f"part-{i}.batch" for i in range(4)]
    for i, name in enumerate(names):
        rows = rng.integers(0, 2**31, (RECORDS // 4, SEQ_LEN), dtype=np.uint32)
        write_batch_file(out / name, rows, BATCH_SIZE, seed=i)

    def reset() -> None:
        create_dataset(out, names, seed=1, overwrite=True)

    reset()
    argv = cli("dataset", "create", out, *reversed(names), "--seed", 2, "--overwrite", "--quiet")
    return Case(out, argv, (out / MANIFEST_NAME).read_bytes(), reset)


def beside(directory: Path) -> list[str]:
    return [n for n in hidden(directory.parent) if n.startswith(f".{directory.name}.")]


def startup_seconds() -> float:
    """How long the interpreter takes to reach the command (no signal before that is useful)."""
    start = time.perf_counter()
    subprocess.run(cli("--version"), check=True, capture_output=True)
    return time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize(
    "make",
    [convert_case, create_case, convert_fallback_case],
    ids=["convert", "dataset-create", "convert-fallback"],
)
def test_signals_during_an_overwrite_leave_the_old_or_the_new_dataset(
    tmp_path: Path, make: Callable[[Path], Case]
) -> None:
    case = make(tmp_path)
    files = sorted(os.listdir(case.directory))
    start = time.perf_counter()
    subprocess.run(case.argv, check=True, capture_output=True)
    span = time.perf_counter() - start  # an uninterrupted run: what the signals spread over
    case.new = (case.directory / MANIFEST_NAME).read_bytes()
    assert case.new != case.old and validate_dataset(case.directory, deep=True).valid
    case.reset()
    assert (case.directory / MANIFEST_NAME).read_bytes() == case.old and beside(
        case.directory
    ) == []

    rng = random.Random(make.__name__)
    low = startup_seconds()
    kills, interrupts = (
        (KILLS, INTERRUPTS) if make is not convert_fallback_case else FALLBACK_TRIALS
    )
    trials = [signal.SIGKILL] * kills + [signal.SIGINT] * interrupts
    rng.shuffle(trials)
    outcomes: dict[str, int] = {}
    for trial, sig in enumerate(trials):
        delay = rng.uniform(low, 1.1 * max(span, low))
        proc = subprocess.Popen(case.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        where = f"trial {trial}: {sig.name} after {delay:.3f} s (exit {proc.returncode})"
        if proc.returncode == 0:
            outcome = "finished"
            # Faster than when timed (a busy machine earlier, an idle one now): spread later
            # signals over less, starting earlier.
            span = min(span, delay)
            low = min(low, 0.8 * delay)
        elif proc.returncode == -signal.SIGKILL:
            outcome = "killed"
        else:
            assert sig == signal.SIGINT and proc.returncode in (130, -signal.SIGINT), (where, err)
            outcome = "interrupted"
        aside = [n for n in beside(case.directory) if ".zerobatch-old-" in n]
        if aside:  # the fallback cut between its two renames: the old dataset, whole, aside
            assert make is convert_fallback_case and len(aside) == 1, (where, aside)
            moved = case.directory.parent / aside[0]
            assert (moved / MANIFEST_NAME).read_bytes() in (case.old, case.new), where
            assert validate_dataset(moved, deep=True).valid, where
            with pytest.raises(WriteError, match="interrupted"):
                case.reset()  # refused until the user decides
            if not case.directory.exists():
                os.rename(moved, case.directory)  # the recovery README describes
            outcomes["moved aside"] = outcomes.get("moved aside", 0) + 1
        manifest = (case.directory / MANIFEST_NAME).read_bytes()
        assert manifest in (case.old, case.new), where
        state = "old" if manifest == case.old else "new"
        outcomes[f"{outcome}, {state}"] = outcomes.get(f"{outcome}, {state}", 0) + 1
        report = validate_dataset(case.directory, deep=True)
        assert report.valid, (where, [str(f) for f in report.failures[:3]])
        with DatasetReader(case.directory) as ds:
            listed = {s.name for s in ds.manifest.shards}
        if make is create_case:
            assert sorted(os.listdir(case.directory)) == files, where  # the user's files stay
        else:
            assert set(os.listdir(case.directory)) == listed | {MANIFEST_NAME, CHECKSUMS_NAME}
        for name in beside(case.directory):
            if ".zerobatch-old-" in name:  # the new dataset is in place: the old one's remains
                assert make is convert_fallback_case, f"{where}: {name} left"
                shutil.rmtree(case.directory.parent / name)
            else:
                assert ".zerobatch-new-" in name, f"{where}: {name} left beside the dataset"

        case.reset()  # the next write removes whatever a dead writer left
        assert beside(case.directory) == [], where
        assert (case.directory / MANIFEST_NAME).read_bytes() == case.old, where
    killed = sum(n for k, n in outcomes.items() if not k.startswith("finished"))
    assert killed >= len(trials) // 3, outcomes  # many trials really were cut short


# --- the Ray engine ------------------------------------------------------------------------------

if ray_convert is not None:

    class FailingSink(ray_convert.LLMBatchDatasink):
        """The shard task of output 1 raises, after output 0 may have been written."""

        def write_output(self, plan: dict[str, object]) -> dict[str, object]:
            if plan["index"] == 1:
                raise WriteError("injected failure of a shard task")
            result: dict[str, object] = super().write_output(plan)
            return result


def run_sink(sink: object, tokens: np.ndarray) -> None:
    """Drive ``sink`` as Ray Data would after the segments' write: one unit, then commit."""
    from ray.data.datasource import WriteResult

    assert ray_convert is not None and isinstance(sink, ray_convert.LLMBatchDatasink)
    sink.on_write_start()
    sink.store_segment(0, tokens.astype("<u4").tobytes())
    row = [0, len(tokens)] + [0] * len(ray_convert._COUNT_COLUMNS)
    sink.on_write_complete(WriteResult(1, tokens.nbytes, [json.dumps([row])]))


@pytest.mark.slow
def test_a_ray_overwrite_keeps_the_old_dataset_until_its_commit(tmp_path: Path) -> None:
    if ray_convert is None:
        pytest.skip("Ray is not installed")
    import ray

    out = tmp_path / "ds"
    old_rows = np.arange(48 * 16, dtype=np.uint32).reshape(48, 16)
    write_sharded_dataset(out, iter([old_rows]), batch_size=4, seq_len=16, shard_batches=3)
    old = (out / MANIFEST_NAME).read_bytes()
    (out / "notes.txt").write_text("mine")
    tokens = np.arange(16 * 40, dtype=np.uint32) + 7
    kw = {"seq_len": 16, "batch_size": 4, "shard_batches": 2, "seed": 5, "overwrite": True}
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        with pytest.raises(Exception, match="injected failure"):
            run_sink(FailingSink(out, **kw), tokens)
        assert (out / MANIFEST_NAME).read_bytes() == old and beside(out) == []
        assert validate_dataset(out, deep=True).valid and (out / "notes.txt").exists()

        sink = ray_convert.LLMBatchDatasink(out, **kw)
        run_sink(sink, tokens)
    finally:
        ray.shutdown()
    assert sink.result is not None and sink.result.manifest is not None
    listed = {s.name for s in sink.result.manifest.shards}
    assert len(listed) == 5 and validate_dataset(out, deep=True).valid
    assert set(os.listdir(out)) == listed | {MANIFEST_NAME, CHECKSUMS_NAME, "notes.txt"}
    assert beside(out) == []
