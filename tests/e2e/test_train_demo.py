"""End to end: ``python -m zerobatch_adapters.train_demo`` writes a valid file and learns."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from zerobatch_adapters import train_demo

from tests.helpers import require
from zerobatch_core import BatchFileReader, ByteTokenizer, pack_documents, validate_file

STEP_LINE = re.compile(r"^step\s+(\d+)/\d+\s+epoch\s+\d+\s+loss\s+(\d+\.\d+)", re.M)


def run_demo(out: Path, *args: str, timeout: float = 120) -> str:
    """Run the demo in a fresh interpreter, as ``make demo`` does; return its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "zerobatch_adapters.train_demo", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def check_run(stdout: str, out: Path, steps: int) -> None:
    losses = [(int(s), float(v)) for s, v in STEP_LINE.findall(stdout)]
    assert losses, stdout
    assert losses[0][0] == 1
    assert losses[-1][0] == steps
    first, last = losses[0][1], losses[-1][1]
    assert 5.0 < first < 6.2, stdout  # about ln(257) = 5.55 before any training
    assert last < first - 1.5, stdout  # it learned far more than noise would explain
    assert re.search(r"data loader: .* = \d+\.\d+% of step time", stdout), stdout
    path = out / train_demo.FILE_NAME
    assert f"zerobatch inspect {path}" in stdout
    report = validate_file(path, deep=True)
    assert report.valid, report
    with BatchFileReader(path) as reader:
        assert (reader.batch_size, reader.seq_len, reader.seed) == (16, 129, 42)


def test_torch_demo_learns(tmp_path: Path) -> None:
    require("torch")
    out = tmp_path / "torch-out"
    stdout = run_demo(out, "--framework", "torch", "--steps", "60", "--sample-tokens", "40")
    check_run(stdout, out, 60)
    assert "sample (temperature" in stdout


def test_jax_demo_learns(tmp_path: Path) -> None:
    require("jax")
    out = tmp_path / "jax-out"
    # 40 steps still cross an epoch boundary (38 batches per epoch); XLA on CPU is slower.
    stdout = run_demo(out, "--framework", "jax", "--steps", "40", "--sample-tokens", "20")
    check_run(stdout, out, 40)


def test_help_imports_no_framework() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from zerobatch_adapters import train_demo\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        train_demo.main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_corpus_is_shipped_and_attributed() -> None:
    docs = train_demo.read_corpus()
    assert len(docs) >= 3
    total = sum(len(text.encode("utf-8")) for _, text in docs)
    assert 40_000 <= total <= 80_000
    for name, text in docs:
        title = text.splitlines()[0]
        assert "Public domain." in title, name
        assert text.endswith("\n") and not text.endswith("\n\n"), name


def test_written_records_are_the_packed_corpus(tmp_path: Path) -> None:
    """Every record in the file is one of the packed corpus records (shuffled, some dropped)."""
    info = train_demo.write_corpus_dataset(str(tmp_path), seq_len=32, batch_size=8, seed=3)
    tok = ByteTokenizer()
    packed = list(pack_documents((tok.encode(t) for _, t in train_demo.read_corpus()), 33))
    assert len(packed) == info.total_records
    with BatchFileReader(info.path) as reader:
        assert reader.num_batches == info.num_batches == info.total_records // 8
        stored = np.concatenate([reader.read_batch(i) for i in range(reader.num_batches)])
    stored_counts = Counter(r.tobytes() for r in stored)
    assert sum(stored_counts.values()) == info.num_batches * 8
    assert not stored_counts - Counter(r.tobytes() for r in packed)  # a sub-multiset
    starts = int((np.stack(packed) == tok.bos_id).sum())
    assert starts == len(train_demo.read_corpus())  # one BOS per document, all kept
