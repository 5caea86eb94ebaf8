"""``write_batch_dataset`` throughput against the disk's sequential write rate, and its peak RSS.

For each size (default 64, 256 and 1024 MiB of uint32 tokens: 1x, 4x, 16x), a fresh child
streams synthetic ``[k, 512]`` record blocks (generated on the fly from a seeded counter, so
the source costs no I/O and almost no memory) into ``write_batch_dataset`` and reports the
output bytes per second of wall time, from the first record to the renamed, fsynced file. Right
before it, another child writes the same number of bytes with plain 8 MiB ``write`` calls and
one ``fsync`` (the disk's sequential write rate, measured the same way); the ratio is taken per
pair because this machine's virtual disk varies several-fold over minutes. Peak RSS is each
child's ``ru_maxrss`` (``os.wait4``) next to a baseline child that only imports ZeroBatch::

    python benchmarks/writer_bench.py                  # 64, 256, 1024 MiB
    python benchmarks/writer_bench.py --sizes-mib 32 128 --json writer.json

With ``total_records`` known (as here) the writer places each record in one pass: records
are sorted by the output window they belong to and appended, packed, to that window's byte
range; each window is then permuted in memory and written in place, and its writeback starts
at once (``sync_file_range``). The page cache sees every byte twice, the disk once.
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

from _common import MIB, REPO, run_child, scratch_dir

SEQ = 512
BATCH = 32
BLOCK_RECORDS = 2048  # 4 MiB of tokens per block handed to the writer


def _child(payload: dict[str, Any]) -> dict[str, Any]:
    role, out, n_bytes = payload["role"], Path(payload["out"]), int(payload["bytes"])
    if role == "baseline":
        import zerobatch_core  # noqa: F401

        return {}
    if role == "disk":
        chunk = bytes(8 * MIB)
        t0 = time.perf_counter()
        with open(out, "wb", buffering=0) as f:
            left = n_bytes
            while left > 0:
                left -= f.write(chunk[: min(len(chunk), left)])
            os.fsync(f.fileno())
        dt = time.perf_counter() - t0
        os.unlink(out)
        return {"seconds": dt, "bytes": n_bytes}
    import numpy as np

    from zerobatch_core import write_batch_dataset

    records = n_bytes // (SEQ * 4)

    def blocks() -> Any:
        base = np.arange(BLOCK_RECORDS * SEQ, dtype=np.uint32).reshape(BLOCK_RECORDS, SEQ)
        for start in range(0, records, BLOCK_RECORDS):
            k = min(BLOCK_RECORDS, records - start)
            yield base[:k] + np.uint32(start % 50_000)

    t0 = time.perf_counter()
    nb = write_batch_dataset(out, blocks(), records, batch_size=BATCH, seq_len=SEQ, seed=1)
    dt = time.perf_counter() - t0
    size = os.path.getsize(out)
    os.unlink(out)
    return {"seconds": dt, "bytes": size, "num_batches": nb}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(_child(json.loads(sys.argv[2]))), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--trials", type=int, default=3, help="pairs (disk, writer) per size")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    work = scratch_dir("writer-bench")
    script = Path(__file__).resolve()
    out = work / "out.batch"
    base = run_child(script, {"role": "baseline", "out": str(out), "bytes": 0})
    rows: list[dict[str, Any]] = []
    for mib in a.sizes_mib:
        n_bytes = mib * MIB
        ratios, disk_rates, write_rates, rss = [], [], [], []
        for _ in range(a.trials):
            d = run_child(script, {"role": "disk", "out": str(out), "bytes": n_bytes})
            w = run_child(script, {"role": "writer", "out": str(out), "bytes": n_bytes})
            disk = d.report["bytes"] / d.report["seconds"]
            wr = w.report["bytes"] / w.report["seconds"]
            disk_rates.append(disk)
            write_rates.append(wr)
            ratios.append(wr / disk)
            rss.append(w.maxrss_bytes)
        row = {
            "size_mib": mib,
            "disk_MBps": [r / 1e6 for r in disk_rates],
            "writer_MBps": [r / 1e6 for r in write_rates],
            "ratio_median": statistics.median(ratios),
            "peak_rss_mib": max(rss) / MIB,
        }
        rows.append(row)
        print(
            f"{mib:6d} MiB  disk {statistics.median(disk_rates) / 1e6:7.0f} MB/s  writer "
            f"{statistics.median(write_rates) / 1e6:7.0f} MB/s  ratio {row['ratio_median']:.2f}x"
            f"  peak RSS {row['peak_rss_mib']:.0f} MiB",
            flush=True,
        )
    peaks = [r["peak_rss_mib"] for r in rows]
    print(
        f"baseline child (imports only) {base.maxrss_bytes / MIB:.0f} MiB; writer peak RSS "
        f"spread over sizes {max(peaks) - min(peaks):.1f} MiB"
    )
    result = {
        "rows": rows,
        "baseline_rss_mib": base.maxrss_bytes / MIB,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "repo": str(REPO),
    }
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
