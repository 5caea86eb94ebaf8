"""uint16 token files (dtype 1) against uint32 (dtype 0): bytes, consume rates, remote bytes.

One corpus of GPT-2-sized ids (below 50,257) is written twice with the same seed, as a uint32
and as a uint16 file (and as datasets of shards for the remote part). The same batches are then
served from both, in the same process, interleaved trial by trial:

- **bytes**: the size of each file (what the page cache and the disk hold) and what one pass
  reads.
- **consume**: ``BatchNativeLoader`` over the whole file, the loop summing every token of every
  batch in the batch's own dtype (the loader suite's consume operation): ``int32`` from uint32
  (a bit-cast view) and from uint16 (widened by the loader's conversion stage), ``int64`` from
  both (widened), and the stored tokens as they are (``native``: uint32 or uint16 views).
  Targets: uint16 -> int32 at least the uint32 file's int32 view; uint16 -> int64 at least the
  uint32 file's int64.
- **remote**: a real S3-compatible server on loopback (moto, ``tests/s3server.py``); one rank of
  ``D x C`` ranks reads an epoch of each dataset through ``RemoteSource``, and the store's own
  counters give the bytes and requests it fetched.

Beside them, the machine's memcpy rate in the same process, so the figures can be read against
this machine's own memory bandwidth. Every token value of both files is checked equal before
anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import scratch_dir, settle, warm
from benchmarks.dataset_bench import _baseline

VOCAB = 50_257
"""GPT-2's vocabulary: every id fits in uint16."""
B, T = 32, 512


def _tokens(records: int, seq_len: int) -> Any:
    """``records`` rows of ``seq_len`` ids below ``VOCAB``, in blocks (bounded memory)."""
    rng = np.random.default_rng(0)
    for start in range(0, records, 8192):
        n = min(8192, records - start)
        yield rng.integers(0, VOCAB, (n, seq_len), dtype=np.uint32)


def _write_files(directory: Path, records: int) -> dict[str, Path]:
    from zerobatch_core import write_batch_file

    rows = np.concatenate(list(_tokens(records, T)))
    out = {}
    for dtype in ("uint32", "uint16"):
        path = directory / f"{dtype}.batch"
        write_batch_file(path, rows, B, seed=1, dtype=dtype)
        out[dtype] = path
    return out


def _write_datasets(directory: Path, records: int, seq_len: int, shard: int) -> dict[str, Path]:
    from zerobatch_core.datasets.build import write_sharded_dataset

    out = {}
    for dtype in ("uint32", "uint16"):
        path = directory / f"ds-{dtype}"
        write_sharded_dataset(
            path,
            _tokens(records, seq_len),
            batch_size=B,
            seq_len=seq_len,
            shard_batches=shard,
            seed=1,
            dtype=dtype,
        )
        out[dtype] = path
    return out


def _check_equal(paths: dict[str, Path]) -> None:
    """Every batch of the uint16 file equals the uint32 file's, value for value."""
    from zerobatch_core import BatchFileReader

    with BatchFileReader(paths["uint32"]) as wide, BatchFileReader(paths["uint16"]) as narrow:
        assert narrow.token_dtype.itemsize * 2 == wide.token_dtype.itemsize
        for i in range(len(wide)):
            if not np.array_equal(wide.read_batch(i), narrow.read_batch(i)):
                raise SystemExit(f"batch {i} differs between the uint32 and the uint16 file")


def _consume_pass(path: Path, dtype: str, epochs: int) -> dict[str, Any]:
    """``epochs`` passes of one loader over ``path`` in ``dtype``, summing every token (the
    first epoch maps the file's pages, as a training run's does)."""
    from zerobatch_core import BatchFileReader, BatchNativeLoader

    with BatchFileReader(path) as reader:
        loader = BatchNativeLoader(reader, dtype=dtype, shuffle=False)
        n = 0
        total = 0
        t0 = time.perf_counter()
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                total += int(batch.sum(dtype=batch.dtype))
                n += 1
        wall = time.perf_counter() - t0
        out_dtype = str(batch.dtype)
        del batch
    return {"tok_s": n * B * T / wall, "checksum": total, "out": out_dtype}


CASES = (
    ("uint32", "native"),
    ("uint16", "native"),
    ("uint32", "int32"),
    ("uint16", "int32"),
    ("uint32", "int64"),
    ("uint16", "int64"),
)


def local(paths: dict[str, Path], trials: int, epochs: int) -> dict[str, Any]:
    """Consume rates of every (file, output dtype) case, trials interleaved."""
    for p in paths.values():
        warm(p)
    rates: dict[str, list[float]] = {f"{f}->{d}": [] for f, d in CASES}
    outs: dict[str, str] = {}
    sums: dict[str, set[int]] = {}
    for _ in range(trials):
        for f, d in CASES:
            r = _consume_pass(paths[f], d, epochs)
            rates[f"{f}->{d}"].append(r["tok_s"])
            outs[f"{f}->{d}"] = r["out"]
            if d != "native":  # sums in the output dtype: equal for equal tokens
                sums.setdefault(d, set()).add(r["checksum"])
    if any(len(s) != 1 for s in sums.values()):
        raise SystemExit(f"the two files summed differently: {sums}")
    return {
        "tok_s": {k: statistics.median(v) for k, v in rates.items()},
        "all_tok_s": rates,
        "out_dtype": outs,
        "bytes": {f: p.stat().st_size for f, p in paths.items()},
    }


def remote(datasets: dict[str, Path], dp: int, cp: int) -> dict[str, Any]:
    """Bytes and requests one rank of ``dp x cp`` fetches for an epoch of each dataset."""
    from tests.s3server import S3Server, environment

    out: dict[str, Any] = {}
    server = S3Server()
    server.create_bucket("zb-dtype")
    try:
        with environment(server.endpoint):
            out = {d: _remote_epoch(f"s3://zb-dtype/{d}", p, dp, cp) for d, p in datasets.items()}
    finally:
        server.stop()
    return out


def _remote_epoch(url: str, directory: Path, dp: int, cp: int) -> dict[str, Any]:
    """Upload ``directory`` to ``url``, then one epoch of rank 0 of ``dp x cp`` from it."""
    from zerobatch_core import BatchStream
    from zerobatch_core.datasets.remote import RemoteSource
    from zerobatch_core.stores.resolve import open_store

    store = open_store(url)
    for name in sorted(os.listdir(directory), key=lambda n: n == "manifest.json"):
        store.write(name, (directory / name).read_bytes())
    store.close()
    source = RemoteSource(url)
    served = 0
    t0 = time.perf_counter()
    with BatchStream(
        source, dtype="int32", rank=0, world_size=dp, context_rank=0, context_size=cp
    ) as stream:
        for item in stream:
            served += int(item.size)
        stats = source.store.stats.snapshot()
    wall = time.perf_counter() - t0
    source.close()
    return {
        "fetched_bytes": stats["bytes_read"],
        "requests": stats["requests"],
        "tokens_served": served,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="records (default 100000)")
    parser.add_argument("--trials", type=int, default=7, help="interleaved trials (default 7)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per trial (default 4)")
    parser.add_argument(
        "--remote-batches",
        type=int,
        default=256,
        help="batches of the remote datasets (default 256)",
    )
    parser.add_argument("--dp", type=int, default=4, help="data-parallel ranks (default 4)")
    parser.add_argument("--cp", type=int, default=2, help="context-parallel ranks (default 2)")
    parser.add_argument("--json", type=Path, default=None, help="also write results (default none)")
    args = parser.parse_args(argv)

    work = scratch_dir("dtype-")
    try:
        t0 = time.perf_counter()
        paths = _write_files(work, args.records)
        datasets = _write_datasets(work, args.remote_batches * B, 8192, 8)
        settle()
        _check_equal(paths)
        print(f"wrote and checked in {time.perf_counter() - t0:.1f} s", flush=True)
        results: dict[str, Any] = {"baseline": _baseline(), "load": os.getloadavg()[0]}
        results["local"] = local(paths, args.trials, args.epochs)
        results["remote"] = remote(datasets, args.dp, args.cp)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    loc = results["local"]
    size32, size16 = loc["bytes"]["uint32"], loc["bytes"]["uint16"]
    print(f"memcpy {results['baseline']['memcpy_GBps']:.2f} GB/s; load {results['load']:.2f}")
    print(f"file bytes: uint32 {size32:,}, uint16 {size16:,} ({size16 / size32:.3f}x)")
    rate = loc["tok_s"]
    print("consume (sum of every token in the output dtype), median tok/s:")
    for f, d in CASES:
        key = f"{f}->{d}"
        gbps = rate[key] * np.dtype(loc["out_dtype"][key]).itemsize / 1e9
        print(
            f"  {key:15s} {rate[key] / 1e9:6.2f}G tok/s  "
            f"({loc['out_dtype'][key]}, {gbps:.1f} GB/s out)"
        )
    print(
        f"  targets: uint16->int32 / uint32->int32 = "
        f"{rate['uint16->int32'] / rate['uint32->int32']:.2f}x (>= 1); uint16->int64 / "
        f"uint32->int64 = {rate['uint16->int64'] / rate['uint32->int64']:.2f}x (>= 1)"
    )
    rem = results["remote"]
    ratio = rem["uint16"]["fetched_bytes"] / rem["uint32"]["fetched_bytes"]
    print(
        f"remote rank 0 of {args.dp}x{args.cp}: uint32 {rem['uint32']['fetched_bytes']:,} bytes in "
        f"{rem['uint32']['requests']} requests, uint16 {rem['uint16']['fetched_bytes']:,} bytes in "
        f"{rem['uint16']['requests']} requests ({ratio:.3f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
