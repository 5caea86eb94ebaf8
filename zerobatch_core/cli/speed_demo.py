"""``zerobatch demo``: write a small synthetic dataset, then time the core loader over it.

A speed check of the bare loader on this machine; the training demo lives in ``examples/``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from ..delivery.loader import BatchNativeLoader, OutputDType
from ..files.writer import write_batch_dataset


def _synthetic_records(
    records: int, seq_len: int, chunk: int = 1024
) -> Iterator[npt.NDArray[np.uint32]]:
    """Deterministic token blocks in a 50k vocabulary, a chunk of records at a time."""
    rng = np.random.default_rng(0)
    for start in range(0, records, chunk):
        n = min(chunk, records - start)
        yield rng.integers(0, 50_257, size=(n, seq_len), dtype=np.uint32)


def _batches(n: int) -> str:
    return f"{n:,} batch" if n == 1 else f"{n:,} batches"


def run_speed_demo(
    out_dir: str, records: int = 20_000, seq_len: int = 512, batch_size: int = 32
) -> int:
    """Write ``records`` synthetic records to ``out_dir/demo.batch`` (uint32) and
    ``out_dir/demo-uint16.batch`` (the same tokens as uint16, half the bytes), replacing the
    files an earlier run left there, and time two epochs of each file in every output dtype."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for stored in ("uint32", "uint16"):
        name = "demo.batch" if stored == "uint32" else f"demo-{stored}.batch"
        path = os.path.join(out_dir, name)
        t0 = time.perf_counter()
        n = write_batch_dataset(
            path,
            _synthetic_records(records, seq_len),
            records,
            batch_size,
            seq_len,
            seed=42,
            overwrite=True,  # the previous run's file: the demo's own scratch output
            dtype=stored,
        )
        dt = time.perf_counter() - t0
        size = os.path.getsize(path)
        print(
            f"wrote {path}: {_batches(n)} of [{batch_size}, {seq_len}] {stored}, "
            f"{size / 2**20:.1f} MiB in {dt:.2f} s ({size / dt / 2**20:.0f} MiB/s)"
        )
        paths.append((stored, path))
    for stored, path in paths:
        dtypes: tuple[OutputDType, ...] = ("native", "int32", "int64")
        for dtype in dtypes:
            loader = BatchNativeLoader(path, block_size=64, dtype=dtype)
            for mode in ("yield", "consume"):
                loader.set_epoch(0 if mode == "yield" else 1)
                checksum = 0
                t0 = time.perf_counter()
                for batch in loader:
                    if mode == "consume":
                        checksum += int(batch.sum(dtype=np.uint64))
                dt = time.perf_counter() - t0
                tokens = n * batch_size * seq_len
                shown = f"{stored}->{loader.dtype}"
                print(
                    f"  {shown:>13} {mode:>7}: {tokens / dt / 1e9:6.2f}G tokens/s "
                    f"({_batches(n)} in {dt * 1e3:.1f} ms)"
                )
            loader.reader.close()
    print(f"datasets kept in {out_dir}; inspect one with: zerobatch inspect {paths[0][1]}")
    return 0
