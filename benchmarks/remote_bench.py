"""Datasets on object storage: the loader's range reads against a plain sequential download,
bytes and requests per rank at D x C, and the two client candidates (obstore, s3fs).

A real S3-compatible server runs on loopback (moto's standalone server, a child process:
``tests/s3server.py``), holding a dataset of ``--batches`` stored batches of ``[32, 8192]``
uint32 (1 MiB each) in shards of 8 batches (moto copies a whole object for every
ranged GET, so smaller objects keep its per-request cost near what a real store's is).
Measured, each in this process, in order:

- **sequential download**: every shard object fetched whole with one GET, one after the other
  (what copying the dataset to local disk first costs): MB/s and requests.
- **ranged GETs, no loader**: every slot fetched as one range request by 16 threads: the
  server's ceiling for this access pattern.
- **loader, one rank**: ``BatchStream(url)`` iterates one epoch (whole slots, each checked
  against its checksum: ``verify="whole"``), the loop touching every byte: MB/s of batches
  served, requests, bytes fetched.
- **loader, rank 0 of D x C** (4x1, 2x2, 4x2): one epoch of the rank's share; the bytes the
  client fetched against the share (1 / (D x C) of the epoch, plus each shard's header once
  and the manifest) and its requests. A context-parallel rank's token chunk is a column range
  of every row, one range per row; with ``coalesce=64 KiB`` rows are merged into one request
  per batch, fetching the gaps between them too (fewer requests, more bytes).
- **clients**: the same reads through ``obstore`` (Rust ``object_store``: ``get_ranges``) and
  ``s3fs`` (``cat_ranges``, the fsspec convention): 64 concurrent 1 MiB ranges, and the 256
  per-row ranges (16 KiB each) of a context-parallel rank's share of 8 batches; MB/s and wall
  time and the GETs the server saw, median of ``--trials``, both through the counting proxy.
- **faults**: one epoch through a proxy that answers 10% of requests ``503 SlowDown``, drops
  5% of connections and cuts 5% of response bodies: the batches against a fault-free epoch
  (every one, once, in order) and the client's retries by reason.

Per-rank runs go through the counting proxy too (``tests/s3server.S3Proxy``), so the bytes and
GETs are the server's count; the throughput runs talk to the server directly.

::

    python benchmarks/remote_bench.py                    # 256 batches (256 MiB), ~2-4 min
    python benchmarks/remote_bench.py --batches 64 --json remote.json

The 1-minute load average is printed at the start and the end: the machine's 2 cores are
shared with the server, which is itself a Python process, so absolute MB/s are the server's
as much as the client's; the ratios in one run are what count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from tests.s3server import S3Proxy, S3Server, environment  # noqa: E402

B, T, SHARD = 32, 8192, 8
MB = 1e6


def _load() -> float:
    return os.getloadavg()[0]


def _dataset(directory: Path, batches: int) -> None:
    from zerobatch_core.datasets.build import write_sharded_dataset

    rng = np.random.default_rng(0)

    def blocks() -> Any:
        for start in range(0, batches * B, 4096):
            n = min(4096, batches * B - start)
            yield rng.integers(0, 50_000, (n, T), dtype=np.uint32)

    write_sharded_dataset(directory, blocks(), batch_size=B, seq_len=T, shard_batches=SHARD, seed=1)


def _upload(directory: Path, url: str) -> None:
    from zerobatch_core.stores.resolve import open_store

    store = open_store(url)
    for name in sorted(os.listdir(directory), key=lambda n: n == "manifest.json"):
        store.write(name, (directory / name).read_bytes())


def sequential_download(url: str) -> dict[str, Any]:
    from zerobatch_core.stores.resolve import open_store

    store = open_store(url)
    names = [n for n in store.list_keys() if n.endswith(".batch")]
    start = time.perf_counter()
    total = sum(len(store.read(n)) for n in names)
    wall = time.perf_counter() - start
    return {"mb_s": total / wall / MB, "requests": store.stats.requests, "bytes": total}


def ranged_gets(url: str, batches: int) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    from zerobatch_spec import padded_batch_bytes

    from zerobatch_core.stores.resolve import open_store

    store = open_store(url)
    slot = padded_batch_bytes(B, T)
    where = [(f"shard-{i // SHARD:05d}.batch", 4096 + (i % SHARD) * slot) for i in range(batches)]
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda w: store.read_ranges(w[0], [(w[1], w[1] + slot)]), where))
    wall = time.perf_counter() - start
    total = sum(len(p[0]) for p in got)
    return {"mb_s": total / wall / MB, "requests": store.stats.requests, "bytes": total}


def loader_epoch(url: str, dp: int, cp: int, coalesce: int = 0) -> dict[str, Any]:
    from zerobatch_core import BatchStream
    from zerobatch_core.datasets.remote import RemoteSource

    start = time.perf_counter()
    served = 0
    checksum = 0
    source = RemoteSource(url, coalesce=coalesce)
    with BatchStream(
        source, dtype="uint32", rank=0, world_size=dp, context_rank=0, context_size=cp
    ) as stream:
        for item in stream:
            checksum ^= int(np.bitwise_xor.reduce(item, axis=None))  # touch every byte
            served += item.nbytes
        stats = source.store.stats.snapshot()
        steps = len(stream)
    source.close()
    wall = time.perf_counter() - start
    return {
        "dp": dp,
        "cp": cp,
        "coalesce": coalesce,
        "mb_s": served / wall / MB,
        "served_bytes": served,
        "fetched_bytes": stats["bytes_read"],
        "requests": stats["requests"],
        "retries": stats["retries"],
        "steps": steps,
        "wall_s": wall,
    }


def clients(bucket: str, proxy: S3Proxy, trials: int) -> dict[str, Any]:
    """obstore ``get_ranges`` against s3fs ``cat_ranges``: the same ranges of the same objects,
    through the counting proxy (so both pay its cost, and physical requests are counted)."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    import s3fs
    from obstore.store import S3Store

    mib = 2**20
    blob = 9 * mib
    rng = np.random.default_rng(1)
    store = S3Store(bucket, endpoint=proxy.endpoint, client_options={"allow_http": True})
    keys = [f"clients/blob-{i}" for i in range(8)]
    for key in keys:
        obstore.put(store, key, rng.integers(0, 255, blob, dtype=np.uint8).tobytes())
    # 8 ranges of 1 MiB per object, 64 KiB apart (never adjacent: no client merges them).
    big = {k: [(i * (mib + 65536), i * (mib + 65536) + mib) for i in range(8)] for k in keys}
    # A context-parallel rank's half rows of 8 batches of [32, 8192]: 16 KiB every 32 KiB.
    row = T * 4
    small = {keys[0]: [(r * row, r * row + row // 2) for r in range(256)]}
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": proxy.endpoint}, skip_instance_cache=True)

    def run_obstore(plan: dict[str, list[tuple[int, int]]]) -> int:
        def one(key: str) -> int:
            ranges = plan[key]
            parts = obstore.get_ranges(
                store, key, starts=[a for a, _ in ranges], ends=[b for _, b in ranges], coalesce=0
            )
            return sum(len(p) for p in parts)

        with ThreadPoolExecutor(len(plan)) as pool:
            return sum(pool.map(one, plan))

    def run_s3fs(plan: dict[str, list[tuple[int, int]]]) -> int:
        paths = [f"{bucket}/{k}" for k, ranges in plan.items() for _ in ranges]
        starts = [a for ranges in plan.values() for a, _ in ranges]
        ends = [b for ranges in plan.values() for _, b in ranges]
        return sum(len(p) for p in fs.cat_ranges(paths, starts, ends))

    out: dict[str, Any] = {}
    for name, plan in (("64x1MiB", big), ("256x16KiB", small)):
        nbytes = sum(b - a for ranges in plan.values() for a, b in ranges)
        for client, fn in (("obstore", run_obstore), ("s3fs", run_s3fs)):
            fn(plan)  # warm the connections
            times, requests = [], []
            for _ in range(trials):
                proxy.reset()
                t0 = time.perf_counter()
                assert fn(plan) == nbytes
                times.append(time.perf_counter() - t0)
                requests.append(proxy.counts["gets"])
            wall = statistics.median(times)
            out[f"{client} {name}"] = {
                "wall_ms": wall * 1e3,
                "mb_s": nbytes / wall / MB,
                "requests": statistics.median(requests),
            }
    return out


def faults(url: str, server: S3Server) -> dict[str, Any]:
    """One epoch through a proxy answering 10% of requests 503 SlowDown, dropping 5% of
    connections before answering and cutting 5% of response bodies in half: the batches
    against a fault-free epoch, and the retries by reason."""
    from zerobatch_core import BatchStream

    with BatchStream(url, dtype="uint32", seed=3) as clean:
        expected = [np.array(item) for item in clean]
    faulty = S3Proxy(server.endpoint, slowdown=0.10, drop=0.05, cut=0.05, seed=11)
    try:
        with environment(faulty.endpoint), BatchStream(url, dtype="uint32", seed=3) as stream:
            start = time.perf_counter()
            served = [np.array(item) for item in stream]
            wall = time.perf_counter() - start
            stats = stream.loader.source.store.stats.snapshot()  # type: ignore[union-attr]
    finally:
        faulty.stop()
    same = len(served) == len(expected) and all(
        np.array_equal(a, b) for a, b in zip(served, expected, strict=True)
    )
    return {
        "batches": len(served),
        "identical_in_order": same,
        "requests_seen": faulty.counts["requests"],
        "injected": {k: faulty.counts[k] for k in ("slowdowns", "drops", "cuts")},
        "retries": stats["retries"],
        "retry_reasons": stats["retry_reasons"],
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=256)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    print(f"load average at start: {_load():.2f}")
    work = Path(tempfile.mkdtemp(prefix="remote-bench-"))
    server = S3Server()
    results: dict[str, Any] = {"load_start": _load(), "batches": args.batches}
    try:
        server.create_bucket("zb-bench")
        url = "s3://zb-bench/ds"
        _dataset(work / "ds", args.batches)
        with environment(server.endpoint):
            _upload(work / "ds", url)
            results["sequential"] = sequential_download(url)
            print(
                f"sequential download: {results['sequential']['mb_s']:.0f} MB/s, "
                f"{results['sequential']['requests']} requests"
            )
            results["ranged"] = ranged_gets(url, args.batches)
            print(
                f"ranged GETs of whole slots, 16 threads: {results['ranged']['mb_s']:.0f} MB/s, "
                f"{results['ranged']['requests']} requests"
            )
        proxy = S3Proxy(server.endpoint)
        with environment(proxy.endpoint):  # per rank: counted on the server side
            results["ranks"] = []
            for dp, cp, coalesce in ((1, 1, 0), (4, 1, 0), (2, 2, 0), (4, 2, 0), (4, 2, 65536)):
                proxy.reset()
                r = loader_epoch(url, dp, cp, coalesce)
                r["server_gets"] = proxy.counts["gets"]
                r["server_get_bytes"] = proxy.counts["get_bytes"]
                share = args.batches * B * T * 4 // (dp * cp)
                r["share_bytes"] = share
                r["overhead_bytes"] = r["fetched_bytes"] - share
                results["ranks"].append(r)
                print(
                    f"loader rank 0 of {dp}x{cp} (coalesce {coalesce}): {r['mb_s']:.0f} MB/s "
                    f"served, {r['wall_s']:.1f} s, server sent {r['server_get_bytes']} bytes in "
                    f"{r['server_gets']} GETs for a share of {share} (client: "
                    f"{r['fetched_bytes']} bytes in {r['requests']} ranges)"
                )
            results["clients"] = clients("zb-bench", proxy, args.trials)
            for name, r in results["clients"].items():
                print(
                    f"{name}: {r['mb_s']:.0f} MB/s, {r['wall_ms']:.1f} ms, {r['requests']:.0f} GETs"
                )
        proxy.stop()
        with environment(server.endpoint):
            results["faults"] = f = faults(url, server)
        print(
            f"faults: {f['batches']} batches, identical and in order: {f['identical_in_order']}; "
            f"injected {f['injected']} over {f['requests_seen']} requests; retries "
            f"{f['retries']} {f['retry_reasons']}"
        )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["load_end"] = _load()
    print(f"load average at end: {_load():.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
