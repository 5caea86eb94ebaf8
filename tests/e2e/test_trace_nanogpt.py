"""``zerobatch trace`` on a dataset converted from nanoGPT shards names the right source records.

nanoGPT ``.bin`` shards are written here byte by byte (``int32[256]`` header: magic, version,
num_tokens and, for the newer magic, the token width; then the tokens), converted with
``zerobatch convert --shard-size``, and traced with ``zerobatch trace --json``. Each record the
trace names is read straight from its ``.bin`` file (contiguous records: tokens
``[k * seq_len, (k + 1) * seq_len)`` after the 1024-byte header) and compared with the rows the
loader serves at that step to that rank, restricted to the rank's token columns.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from zerobatch_core import BatchNativeLoader, Position
from zerobatch_core.cli import main

LEGACY_MAGIC, MAGIC = 20240520, 278895051
T, B = 64, 8


def write_bin(path: Path, tokens: npt.NDArray[np.integer], itemsize: int) -> None:
    header = np.zeros(256, dtype="<i4")
    header[:4] = (LEGACY_MAGIC if itemsize == 2 else MAGIC), 1, tokens.size, itemsize
    dtype = "<u2" if itemsize == 2 else "<u4"
    path.write_bytes(header.tobytes() + tokens.astype(dtype).tobytes())


def read_record(path: str, k: int) -> npt.NDArray[np.int64]:
    """Record ``k`` of a nanoGPT shard, cut contiguously: its tokens ``[k * T, (k + 1) * T)``."""
    header = np.fromfile(path, dtype="<i4", count=256)
    itemsize = 2 if header[0] == LEGACY_MAGIC else int(header[3])
    assert (k + 1) * T <= header[2], (path, k)
    dtype = "<u2" if itemsize == 2 else "<u4"
    return np.fromfile(path, dtype=dtype, count=T, offset=1024 + k * T * itemsize).astype(np.int64)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nanogpt")
    rng = np.random.default_rng(12)
    shapes = [(50_257, 9_000, 2), (50_257, 4_131, 2), (200_000, 12_800, 4), (50_257, 6_500, 2)]
    for i, (vocab, n, itemsize) in enumerate(shapes):
        write_bin(root / f"fineweb_train_{i:06d}.bin", rng.integers(0, vocab, n), itemsize)
    out = root / "ds"
    proc = subprocess.run(
        [sys.executable, "-m", "zerobatch_core", "convert", str(root / "fineweb_train_*.bin"),
         str(out), "--seq-len", str(T), "--batch-size", str(B), "--shard-size", "5",
         "--seed", "3", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["shards"] == 13 and summary["batches"] == 63  # 505 records, 1 dropped
    return out


def cli_trace(*argv: object) -> dict[str, Any]:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        assert main(["trace", *(str(a) for a in argv), "--json"]) == 0
    result: dict[str, Any] = json.loads(buffer.getvalue())
    return result


def columns(c: int, size: int, zigzag: bool) -> list[list[int]]:
    """Context rank ``c``'s token columns, from the rule itself (merged when adjacent)."""
    if not zigzag:
        return [[c * T // size, (c + 1) * T // size]]
    chunk = T // (2 * size)
    lo, hi = [c * chunk, (c + 1) * chunk], [(2 * size - 1 - c) * chunk, (2 * size - c) * chunk]
    return [[lo[0], hi[1]]] if lo[1] == hi[0] else [lo, hi]


LAYOUTS = [
    # rank, world size, context rank, context size, zig-zag, global batch size
    (0, 1, 0, 1, False, None),
    (1, 2, 0, 1, False, None),
    (3, 4, 1, 2, True, None),
    (2, 4, 0, 2, True, None),
    (1, 2, 1, 2, False, 2 * B),
    (0, 2, 0, 1, False, B // 2),
]


@pytest.mark.parametrize(("rank", "of", "cr", "cs", "zigzag", "g"), LAYOUTS)
def test_trace_names_the_source_records_the_loader_serves(
    dataset: Path, rank: int, of: int, cr: int, cs: int, zigzag: bool, g: int | None
) -> None:
    coords: dict[str, Any] = {"rank": rank, "world_size": of, "context_rank": cr}
    coords.update(context_size=cs, zigzag=zigzag, global_batch_size=g)
    flags = ["--rank", rank, "--of", of, "--context-rank", cr, "--context-size", cs]
    flags += ["--zigzag"] * zigzag + (["--global-batch-size", g] if g else [])
    for epoch in (0, 2):
        loader = BatchNativeLoader(dataset, epoch=epoch, **coords)
        steps = len(loader)
        for step in sorted({0, 1, steps // 2, steps - 1}):
            trace = cli_trace(dataset, "--step", step, "--epoch", epoch, *flags)
            assert (trace["step"], trace["epoch"], trace["steps_per_epoch"]) == (step, epoch, steps)
            assert trace["columns"] == columns(cr, cs, zigzag)
            source = np.stack(
                [
                    read_record(o["file"], o["file_record"])
                    for piece in trace["pieces"]
                    for o in piece["origins"]
                ]
            )
            want = np.concatenate([source[:, lo:hi] for lo, hi in trace["columns"]], axis=1)
            loader.seek(Position(epoch, step))
            served = np.asarray(next(iter(loader)))
            assert served.shape == (loader.per_step, sum(hi - lo for lo, hi in trace["columns"]))
            np.testing.assert_array_equal(served, want)


def test_trace_as_a_process_names_files_and_records(dataset: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "zerobatch_core", "trace", str(dataset), "--step", "10",
         "--rank", "1", "--of", "2", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(proc.stdout)
    assert trace == cli_trace(dataset, "--step", 10, "--rank", 1, "--of", 2)
    (piece,) = trace["pieces"]
    assert piece["rows"] == [B // 2, B]
    for o in piece["origins"]:
        assert Path(o["file"]).name.startswith("fineweb_train_") and o["file_record"] >= 0
    text = subprocess.run(
        [sys.executable, "-m", "zerobatch_core", "trace", str(dataset), "--step", "10"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    first = trace["pieces"][0]
    assert f"{first['shard']} slot {first['slot']} (dataset slot {first['dataset_slot']})" in text
    assert "fineweb_train_" in text and " record " in text
