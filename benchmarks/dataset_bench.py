"""Sharded datasets: open time and per-batch cost against the shard count, checksum verification,
and bytes read per rank under data and context parallelism, against this machine's memcpy.

One data set of ``--batches`` stored batches (default 20,000 of ``[32, 512]`` uint32, 1.25 GiB)
is written as a dataset of 1, 100, 1,000 and 10,000 shards (the same tokens, cut into that many
files; each layout's shards are written once with the file writer and described with
``create_dataset``). Every measurement then runs in a fresh child process
(``_common.run_child``) on a warm page cache:

- **open**: ``DatasetReader`` (reads the manifest) plus ``BatchNativeLoader`` construction,
  median of 5 opens in one child; the first batch's latency separately.
- **shard reopen**: opening one shard file, requesting its read-ahead, reading a batch and
  closing it, what the loader does for each shard it enters once more than ``max_open`` (32)
  shards have been opened (median over up to 200 shards).
- **per batch**: one epoch of the loader (``verify="off"``, ``block_size`` 256), median of
  ``--trials`` epochs, in two modes: ``yield`` (the loop takes each batch view and does
  nothing) and ``consume`` (it sums every token, the loader benchmark's consume operation).
  ``vs in-RAM`` is the consume pass over the same sum on 256 batches already in RAM, measured
  in the same child; ``vs memcpy`` is the consume rate in tokens/s over the memcpy rate
  (64 MiB copies, bytes/s over 4) measured in a child of the same run.
- **verify**: the 100-shard layout read with ``verify="off"``, ``"first"`` and ``"always"``, a
  fresh reader per trial: epoch 0 (``"first"`` checks every slot) and epoch 1 (``"first"``
  checks nothing), per-batch time as a ratio to ``"off"`` in the same epoch and mode; the
  modes alternate within each of ``2 * trials + 1`` trials and the median is kept.
- **ranks**: on the 100-shard layout, every rank of ``D x C`` = 4x1, 2x2, 4x2 and 4x2 zig-zag
  iterates one epoch; ``loader.bytes_read`` over the epoch's global-batch bytes is each rank's
  share (``1 / (D x C)``), and the ranks' shares sum to the whole. Each rank's time per step
  is printed beside it.

::

    python benchmarks/dataset_bench.py                      # 20,000 batches, ~2-3 min here
    python benchmarks/dataset_bench.py --batches 4000 --trials 5 --json ds.json

The 1-minute load average is printed at the start and the end: this machine's 2 cores are
shared, and ratios inside one run are what count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import MIB, fit_to_disk, run_child, scratch_dir, warm

BATCH, SEQ = 32, 512
SHARD_COUNTS = (1, 100, 1_000, 10_000)
VERIFY_MODES = ("off", "first", "always")
RANK_LAYOUTS = (  # (D, C, zigzag)
    (4, 1, False),
    (2, 2, False),
    (4, 2, False),
    (4, 2, True),
)
BLOCK_RECORDS = 2048


# --- children -----------------------------------------------------------------------------------


def _build(directory: Path, batches: int, shards: int) -> dict[str, Any]:
    """Write ``batches`` stored batches as ``shards`` files of equal size, then the manifest.

    Token ``i`` of the data set is ``i mod 2**32``, so every layout holds the same tokens.
    """
    import numpy as np

    from zerobatch_core import create_dataset, write_batch_dataset

    per = batches // shards
    records_per = per * BATCH
    t0 = time.perf_counter()
    directory.mkdir(parents=True)
    # Each shard is written alone in a staging directory, then renamed into the dataset: the
    # writer sweeps its output directory for stale temporaries on every write, which in a
    # directory of thousands of shards would cost more than the writes themselves.
    stage = directory.parent / f"{directory.name}.stage"
    stage.mkdir()
    for k in range(shards):
        first = k * records_per

        def blocks(first: int = first) -> Any:
            for r in range(first, first + records_per, BLOCK_RECORDS):
                n = min(BLOCK_RECORDS, first + records_per - r)
                yield (
                    np.arange(r * SEQ, (r + n) * SEQ, dtype=np.uint64)
                    .astype(np.uint32)
                    .reshape(n, SEQ)
                )

        name = f"part-{k:05d}.batch"
        write_batch_dataset(stage / name, blocks(), records_per, BATCH, SEQ, seed=k)
        os.rename(stage / name, directory / name)
    stage.rmdir()
    written = time.perf_counter() - t0
    t0 = time.perf_counter()
    create_dataset(directory, seed=7)
    return {"write_s": written, "create_s": time.perf_counter() - t0}


def _baseline() -> dict[str, Any]:
    """memcpy of 64 MiB (and of one batch's 64 KiB) in this process: the machine's own rate."""
    import numpy as np

    big = np.random.default_rng(0).integers(0, 2**32, size=64 * MIB // 4, dtype=np.uint32)
    dst = np.empty_like(big)
    np.copyto(dst, big)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        np.copyto(dst, big)
        times.append(time.perf_counter() - t0)
    small, out = big[: BATCH * SEQ].copy(), np.empty(BATCH * SEQ, np.uint32)
    t0 = time.perf_counter()
    for _ in range(20_000):
        np.copyto(out, small)
    small_s = time.perf_counter() - t0
    return {
        "memcpy_GBps": big.nbytes / statistics.median(times) / 1e9,
        "memcpy_64KiB_GBps": 20_000 * small.nbytes / small_s / 1e9,
    }


def _epoch(loader: Any, epoch: int, consume: bool) -> tuple[float, int]:
    loader.set_epoch(epoch)
    n = 0
    t0 = time.perf_counter()
    if consume:
        for b in loader:
            b.sum(dtype=b.dtype)
            n += 1
    else:
        for _ in loader:
            n += 1
    return time.perf_counter() - t0, n


def _shards(directory: Path, trials: int) -> dict[str, Any]:
    import numpy as np

    from zerobatch_core import BatchFileReader, BatchNativeLoader, DatasetReader

    for name in os.listdir(directory):
        warm(directory / name)
    opens, firsts = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        reader = DatasetReader(directory, verify="off")
        loader = BatchNativeLoader(reader)
        t1 = time.perf_counter()
        next(iter(loader))
        firsts.append(time.perf_counter() - t1)
        opens.append(t1 - t0)
        reader.close()
    reader = DatasetReader(directory, verify="off")
    loader = BatchNativeLoader(reader)
    tokens = reader.batch_size * reader.seq_len
    _epoch(loader, 0, consume=False)  # maps every shard once
    reopen = []
    for i in range(min(200, len(reader.shards))):  # what the loader does per shard it enters
        t0 = time.perf_counter()
        shard = BatchFileReader(reader.shard_path(i))
        shard.read_ahead(0, shard.num_batches)
        shard.read_batch(0)
        shard.close()
        reopen.append(time.perf_counter() - t0)
    result: dict[str, Any] = {
        "open_s": statistics.median(opens),
        "first_open_s": opens[0],
        "first_batch_s": statistics.median(firsts),
        "shard_reopen_s": statistics.median(reopen),
        "shards": len(reader.shards),
    }
    for mode in ("yield", "consume"):
        rates = []
        for trial in range(trials):
            seconds, n = _epoch(loader, 1 + trial, consume=mode == "consume")
            rates.append(n * tokens / seconds)
        result[f"{mode}_tok_s"] = statistics.median(rates)
        result[f"{mode}_us_per_batch"] = tokens / statistics.median(rates) * 1e6
    in_ram = np.stack([np.array(reader.read_batch(i)) for i in range(min(256, len(reader)))])
    rates = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(4):
            for b in in_ram:
                b.sum(dtype=b.dtype)
        rates.append(4 * in_ram.size / (time.perf_counter() - t0))
    result["in_ram_consume_tok_s"] = statistics.median(rates)
    return result


def _verify(directory: Path, trials: int) -> dict[str, Any]:
    """Per-batch time of each verify mode; modes interleaved within every trial, so that the
    load of a shared machine drifts over all of them alike."""
    from zerobatch_core import BatchNativeLoader, DatasetReader

    for name in os.listdir(directory):
        warm(directory / name)
    times: dict[str, list[float]] = {}
    for _ in range(trials):
        for consume in (False, True):
            kind = "consume" if consume else "yield"
            for mode in VERIFY_MODES:
                loader = BatchNativeLoader(DatasetReader(directory, verify=mode))
                for epoch in (0, 1):
                    seconds, n = _epoch(loader, epoch, consume)
                    times.setdefault(f"{mode}_{kind}_epoch{epoch}_us", []).append(seconds / n * 1e6)
                loader.source.close()
    return {key: statistics.median(values) for key, values in times.items()}


def _ranks(directory: Path) -> dict[str, Any]:
    from zerobatch_core import BatchNativeLoader, DatasetReader

    for name in os.listdir(directory):
        warm(directory / name)
    reader = DatasetReader(directory, verify="off")
    step_bytes = reader.batch_size * reader.seq_len * 4
    out: dict[str, Any] = {}
    for d, c, zigzag in RANK_LAYOUTS:
        shares, times = [], []
        for r in range(d):
            for k in range(c):
                loader = BatchNativeLoader(
                    reader,
                    rank=r,
                    world_size=d,
                    context_rank=k,
                    context_size=c,
                    zigzag=zigzag,
                )
                t0 = time.perf_counter()
                steps = sum(1 for _ in loader)
                times.append((time.perf_counter() - t0) / steps * 1e6)
                shares.append(loader.bytes_read / (steps * step_bytes))
        key = f"{d}x{c}{' zig-zag' if zigzag else ''}"
        out[key] = {
            "share_min": min(shares),
            "share_max": max(shares),
            "share_sum": sum(shares),
            "expected": 1 / (d * c),
            "us_per_step_median": statistics.median(times),
        }
    reader.close()
    return out


def child(payload: dict[str, Any]) -> dict[str, Any]:
    role, directory = payload["role"], Path(payload.get("dir", "."))
    if role == "build":
        return _build(directory, int(payload["batches"]), int(payload["shards"]))
    if role == "baseline":
        return _baseline()
    if role == "shards":
        return _shards(directory, int(payload["trials"]))
    if role == "verify":
        return _verify(directory, int(payload["trials"]))
    if role == "ranks":
        return _ranks(directory)
    raise ValueError(f"unknown role {role!r}")


# --- the run ------------------------------------------------------------------------------------


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def _rate(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def report(results: dict[str, Any]) -> list[str]:
    """The run's tables and ratios, as printed."""
    lines: list[str] = []
    base = results["baseline"]
    memcpy_tok_s = base["memcpy_GBps"] * 1e9 / 4
    lines.append(
        f"memcpy {base['memcpy_GBps']:.2f} GB/s ({_rate(memcpy_tok_s)} uint32 tok/s; one 64 KiB "
        f"batch {base['memcpy_64KiB_GBps']:.2f} GB/s)"
    )
    lines.append("")
    lines.append(
        f"{'shards':>7} {'build s':>8} {'open ms':>8} {'1st batch ms':>12} {'reopen us':>9} "
        f"{'yield tok/s':>12} "
        f"{'us/batch':>9} {'consume tok/s':>14} {'vs in-RAM':>10} {'vs memcpy':>10}"
    )
    layouts = results["layouts"]
    one = layouts[str(SHARD_COUNTS[0])]
    for count in SHARD_COUNTS:
        r = layouts.get(str(count))
        if r is None:
            continue
        build = r["build"]["write_s"] + r["build"]["create_s"]
        lines.append(
            f"{count:>7,} {build:>8.1f} {r['open_s'] * 1e3:>8.2f} "
            f"{r['first_batch_s'] * 1e3:>12.3f} "
            f"{r['shard_reopen_s'] * 1e6:>9.0f} "
            f"{_rate(r['yield_tok_s']):>12} {r['yield_us_per_batch']:>9.2f} "
            f"{_rate(r['consume_tok_s']):>14} "
            f"{r['consume_tok_s'] / r['in_ram_consume_tok_s']:>9.2f}x "
            f"{r['consume_tok_s'] / memcpy_tok_s:>9.2f}x"
        )
    for count in SHARD_COUNTS[1:]:
        r = layouts.get(str(count))
        if r is None:
            continue
        lines.append(
            f"{count:,} shards / 1 shard: open {r['open_s'] / one['open_s']:.2f}x, per batch "
            f"{r['yield_us_per_batch'] / one['yield_us_per_batch']:.2f}x (yield), "
            f"{one['consume_tok_s'] / r['consume_tok_s']:.2f}x (consume)"
        )
    v = results["verify"]
    lines.append("")
    lines.append(
        f"verify (100 shards), us per batch and ratio to off: "
        f"{'yield e0':>14} {'yield e1':>14} {'consume e0':>14} {'consume e1':>14}"
    )
    for mode in VERIFY_MODES:
        cells = []
        for kind in ("yield", "consume"):
            for epoch in (0, 1):
                us = v[f"{mode}_{kind}_epoch{epoch}_us"]
                off = v[f"off_{kind}_epoch{epoch}_us"]
                cells.append(f"{us:7.2f} {us / off:5.2f}x")
        lines.append(f"  {mode:<49} " + " ".join(f"{c:>14}" for c in cells))
    lines.append("")
    lines.append("bytes read per rank / global batch bytes, over one epoch (100 shards):")
    for key, r in results["ranks"].items():
        lines.append(
            f"  {key:<18} min {r['share_min']:.4f} max {r['share_max']:.4f} (1/(DxC) = "
            f"{r['expected']:.4f}), all ranks {r['share_sum']:.4f}; {r['us_per_step_median']:.2f} "
            f"us/step per rank"
        )
    return lines


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20_000, help="stored batches in all")
    parser.add_argument("--trials", type=int, default=3, help="timed epochs per measurement")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if any(args.batches % n for n in SHARD_COUNTS):
        parser.error(f"--batches must be a multiple of {SHARD_COUNTS[-1]}")
    script = Path(__file__).resolve()
    work = scratch_dir("dataset-bench-")
    size_mib = args.batches * BATCH * SEQ * 4 / MIB
    fit_to_disk(size_mib, len(SHARD_COUNTS) * 1.05, work, "dataset_bench")
    results: dict[str, Any] = {
        "argv": sys.argv[1:],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_start": _load(),
        "batches": args.batches,
        "layouts": {},
    }
    started = time.perf_counter()
    print(f"load average {results['load_start']}; {args.batches:,} batches of [{BATCH}, {SEQ}]")
    try:
        results["baseline"] = run_child(script, {"role": "baseline"}).report
        for count in SHARD_COUNTS:
            directory = work / f"shards-{count}"
            build = run_child(
                script,
                {"role": "build", "dir": str(directory), "batches": args.batches, "shards": count},
            ).report
            payload = {"role": "shards", "dir": str(directory), "trials": args.trials}
            layout = run_child(script, payload).report
            layout["build"] = build
            results["layouts"][str(count)] = layout
            print(f"  {count:,} shards measured ({time.perf_counter() - started:.0f} s)")
            if count == 100:
                trials = 2 * args.trials + 1  # the smallest differences of the run
                payload = {"role": "verify", "dir": str(directory), "trials": trials}
                results["verify"] = run_child(script, payload).report
                results["ranks"] = run_child(
                    script, {"role": "ranks", "dir": str(directory)}
                ).report
            if count != 100:
                shutil.rmtree(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_end"] = _load()
    results["seconds"] = time.perf_counter() - started
    print()
    print("\n".join(report(results)))
    print(
        f"\nload average {results['load_start']} at the start, {results['load_end']} at the end; "
        f"{results['seconds']:.0f} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
