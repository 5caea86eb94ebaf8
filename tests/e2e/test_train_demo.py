"""End to end: ``python examples/train_demo.py`` writes a valid file and learns, in both frameworks.

The demo lives outside every package: it runs as a script, in a fresh interpreter, exactly as
``make demo`` runs it; its framework-independent module ``demo_common`` is loaded from its file.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import numpy as np

from tests.helpers import require
from zerobatch_core import BatchFileReader, ByteTokenizer, pack_documents, validate_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPT = EXAMPLES / "train_demo.py"
STEP_LINE = re.compile(r"^step\s+(\d+)/\d+\s+epoch\s+\d+\s+loss\s+(\d+\.\d+)", re.M)


def load_demo_common() -> ModuleType:
    """``examples/demo_common.py`` as a module (it imports no sibling, so it loads alone)."""
    spec = importlib.util.spec_from_file_location("demo_common", EXAMPLES / "demo_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


demo_common = load_demo_common()


def run_demo(out: Path, *args: str, timeout: float = 900) -> str:
    """Run the demo script in a fresh interpreter, as ``make demo`` does; return its output.

    The demo's time budget is lifted (``--seconds``): these tests check that every step runs
    and the model learns, which must hold however busy the machine is.
    """
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--seconds", "3600", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def check_run(stdout: str, out: Path, steps: int) -> list[tuple[int, float]]:
    """The run logged every step up to ``steps``, learned, timed the loader, wrote a valid file."""
    losses = [(int(s), float(v)) for s, v in STEP_LINE.findall(stdout)]
    assert losses, stdout
    assert losses[0][0] == 1
    assert losses[-1][0] == steps
    first, last = losses[0][1], losses[-1][1]
    assert 5.0 < first < 6.2, stdout  # about ln(257) = 5.55 before any training
    assert last < first - 1.5, stdout  # it learned far more than noise would explain
    assert re.search(r"data loader: .* = \d+\.\d+% of step time", stdout), stdout
    path = out / demo_common.FILE_NAME
    assert f"zerobatch inspect {path}" in stdout
    report = validate_file(path, deep=True)
    assert report.valid, report
    with BatchFileReader(path) as reader:
        assert (reader.batch_size, reader.seq_len, reader.seed) == (16, 129, 42)
    return losses


def test_torch_demo_learns(tmp_path: Path) -> None:
    require("torch")
    out = tmp_path / "torch-out"
    stdout = run_demo(out, "--framework", "torch", "--steps", "60", "--sample-tokens", "40")
    check_run(stdout, out, 60)
    assert "torch.optim.AdamW" in stdout
    assert "sample (temperature" in stdout


def test_jax_demo_learns(tmp_path: Path) -> None:
    require("jax")
    require("optax")
    out = tmp_path / "jax-out"
    # 40 steps still cross an epoch boundary (38 batches per epoch); XLA on CPU is slower.
    stdout = run_demo(out, "--framework", "jax", "--steps", "40", "--sample-tokens", "20")
    check_run(stdout, out, 40)
    assert "optax.adamw" in stdout
    assert "sample (temperature" in stdout


def test_same_seed_same_losses(tmp_path: Path) -> None:
    """Two runs with the same arguments log the same loss at every step."""
    require("torch")
    args = ("--framework", "torch", "--steps", "8", "--log-every", "1", "--sample-tokens", "0")
    runs = [STEP_LINE.findall(run_demo(tmp_path / f"run{i}", *args)) for i in range(2)]
    assert len(runs[0]) == 8
    assert runs[0] == runs[1]


def test_help_imports_no_framework() -> None:
    """``--help`` answers without importing any framework (they load once one is chosen)."""
    code = (
        "import contextlib, io, runpy, sys\n"
        f"sys.path.insert(0, {str(EXAMPLES)!r})\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
        "with contextlib.redirect_stdout(io.StringIO()) as text:\n"
        "    try:\n"
        f"        runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert '--framework' in text.getvalue(), text.getvalue()\n"
        "print(sorted(m for m in ('torch', 'jax', 'optax', 'tensorflow') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_no_package_ships_the_demo() -> None:
    """The demo and its corpus sit in ``examples/`` only, outside the installable packages."""
    import zerobatch_adapters

    installed = {p.name for p in Path(zerobatch_adapters.__file__).parent.iterdir()}
    assert not installed & {"train_demo.py", "corpus"}, installed
    assert demo_common.CORPUS_DIR == EXAMPLES / "corpus"


def test_corpus_is_attributed() -> None:
    docs = demo_common.read_corpus()
    assert len(docs) >= 3
    total = sum(len(text.encode("utf-8")) for _, text in docs)
    assert 40_000 <= total <= 80_000
    for name, text in docs:
        title = text.splitlines()[0]
        assert "Public domain." in title, name
        assert text.endswith("\n") and not text.endswith("\n\n"), name


def test_written_records_are_the_packed_corpus(tmp_path: Path) -> None:
    """Every record in the file is one of the packed corpus records (shuffled, some dropped)."""
    info = demo_common.write_corpus_dataset(str(tmp_path), seq_len=32, batch_size=8, seed=3)
    tok = ByteTokenizer()
    docs = demo_common.read_corpus()
    packed = list(pack_documents((tok.encode(t) for _, t in docs), 33))
    assert len(packed) == info.total_records
    with BatchFileReader(info.path) as reader:
        assert reader.num_batches == info.num_batches == info.total_records // 8
        stored = np.concatenate([reader.read_batch(i) for i in range(reader.num_batches)])
    stored_counts = Counter(r.tobytes() for r in stored)
    assert sum(stored_counts.values()) == info.num_batches * 8
    assert not stored_counts - Counter(r.tobytes() for r in packed)  # a sub-multiset
    starts = int((np.stack(packed) == tok.bos_id).sum())
    assert starts == len(docs)  # one BOS per document, all kept
