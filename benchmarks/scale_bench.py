"""Datasets of many shards: what opening one costs, locally and on object storage, against the
shard count.

Each dataset holds tiny shards (one stored batch of ``[4, 16]`` uint32 per shard by default:
a 4 KiB header and one 4 KiB slot), so the shard count alone grows: 1,000, 10,000 and 100,000
shards (``--shards``). Measured for each count, every figure in a **fresh child process**
(``_common.run_child``, so imports and resident memory start clean and ``ru_maxrss`` is the
child's own), ``--trials`` times, medians kept:

- **open**: ``open_reader(source)`` alone, the dataset open the loader makes (the manifest and
  nothing else): seconds, resident memory before and after, peak.

Peak memory is the child's own ``VmHWM``, read at each stage. Its ``ru_maxrss`` is kept in the
JSON too, but it starts at the parent's peak (``_common``'s module docstring), and the parent
runs the proxy, whose buffers hold whole responses (a manifest of 100,000 shards is 17 MB).
- **loader**: ``BatchNativeLoader(source, ...)`` construction, the first batch, the next
  ``--steps`` steps, for a rank with default settings and for rank 0 of ``world_size=4,
  context_size=2``: seconds, resident memory after each stage, peak (``ru_maxrss``).

``source`` is the dataset's directory (**local**, page cache warm) or an ``s3://`` URL on a
loopback S3-compatible server (**remote**: moto's server, ``tests/s3server.py``). Remote
children talk to the server through a counting proxy (``tests.s3server.S3Proxy``, extended
here to sort requests by object): every request and every response body byte the server sent,
counted at the server side, split into ``manifest.json``, ``checksums.xxh3``, shard headers
(ranges starting inside the header), slot reads (ranges past it) and anything else (the live
descriptor probe, by name). The child reads the proxy's counters at each stage through a
marker request that the proxy answers itself, so the counts are those of the moment the stage
ended: after the open, when the first batch is in hand (*startup*), after ``--steps`` steps.
The remote source fetches up to ``MAX_AHEAD`` (1,024) steps ahead of the loop from its first
step on, so the startup counts include the prefetch in flight when the first batch arrived
(a request is counted when it reaches the proxy, its bytes once the server has answered).
Requests and bytes *per step* are therefore taken in steady state: over ``--window`` steps
after the first ``--steps``, when the epoch is long enough for the prefetch window to stay
full; otherwise over the whole epoch (every step of it, less the open's requests).

**Building.** ``write_sharded_dataset`` writes every shard through the file writer, which
lists the output directory on each write (to remove temporaries of dead writers), so a
dataset of ``n`` shards costs ``O(n^2)`` directory entries: 1.5 s for 1,000 shards here, 32 s
for 10,000, far too long for 100,000. This benchmark writes the same dataset another way: each
shard with the public file writer (``write_batch_file``, same records, seed
``shard_seed(seed, i)``) alone in a staging directory, renamed into the dataset, then
``commit_manifest`` (checksums, then the manifest, as the sharded writer does). Every run
first checks, at 1,000 shards, that this gives byte for byte the manifest and checksums of
``write_sharded_dataset`` (which pin every shard header and slot). ``--cache DIR`` keeps the
built datasets between runs (reused when the manifest matches the shape and count asked for).
Every run uploads them to a fresh server, eight objects at a time, the manifest last.

::

    python benchmarks/scale_bench.py                                  # 1k, 10k, 100k: ~15 min
    python benchmarks/scale_bench.py --shards 1000,10000 --trials 1
    python benchmarks/scale_bench.py --cache bench-output/scale-cache --json scale.json

The 1-minute load average is printed at the start and the end: the server, the proxy and the
child share this machine's cores, so remote seconds are the server's as much as the client's.
Counts and bytes do not depend on the load; the scaling figures are slopes between the
smallest and the largest count.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import MIB, proc_status, run_child, scratch_dir, settle  # noqa: E402

from tests.s3server import S3Proxy, S3Server, environment  # noqa: E402

BATCH, SEQ = 4, 16
"""Stored batch shape: world_size 4 gives each rank one row, context_size 2 half of it."""
SEED = 1
TOKEN_RANGE = 50_000
SHARD_COUNTS = (1_000, 10_000, 100_000)
CHECK_SHARDS = 1_000
"""Shard count at which the fast build is compared with ``write_sharded_dataset``."""
UPLOAD_THREADS = 8
BUCKET = "zb-scale"
MARK = "__scale_bench_mark__"
"""Path prefix of the marker requests the counting proxy answers itself."""
RANKS: tuple[tuple[str, dict[str, int]], ...] = (
    ("1x1", {"rank": 0, "world_size": 1, "context_rank": 0, "context_size": 1}),
    ("4x2", {"rank": 0, "world_size": 4, "context_rank": 0, "context_size": 2}),
)
"""Loader settings measured: defaults, and rank 0 of ``D x C = 4 x 2``."""
EXTRAPOLATE_RANKS = 4 * 1024
"""The rank count of issue 25 (written so as not to read as the format's slot alignment)."""

# --- children -----------------------------------------------------------------------------------


def _records(count: int) -> Any:
    """``count`` records of ``SEQ`` random tokens (fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(0, TOKEN_RANGE, (count, SEQ), dtype=np.uint32)


def _spec_names() -> dict[str, Any]:
    """The format constants the parent needs, from the spec (the parent imports no NumPy)."""
    from zerobatch_spec import HEADER_SIZE
    from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

    return {"header_size": HEADER_SIZE, "manifest": MANIFEST_NAME, "checksums": CHECKSUMS_NAME}


def _reusable(directory: Path, shards: int, slots: int, version: int = 1) -> bool:
    """Whether ``directory`` holds a dataset of ``shards`` shards of ``slots`` ``[BATCH, SEQ]``
    slots each, with a manifest of ``version`` (a cached build)."""
    from zerobatch_spec.dataset import MANIFEST_NAME, DatasetViolation, parse_manifest

    try:
        parsed = parse_manifest((directory / MANIFEST_NAME).read_bytes())
    except OSError:
        return False
    if isinstance(parsed, DatasetViolation) or parsed.version != version:
        return False
    if (parsed.batch_size, parsed.seq_len, parsed.seed) != (BATCH, SEQ, SEED):
        return False
    if version == 2:
        return parsed.num_shards == shards and parsed.num_batches == shards * slots
    return len(parsed.shards) == shards and all(s.num_batches == slots for s in parsed.shards)


def _indexed_twin(source: Path, directory: Path) -> None:
    """``source``'s dataset with a version 2 manifest in ``directory``: the same shards and
    checksums (hard links), then its shard index and manifest (``commit_manifest``)."""
    import numpy as np
    from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME, Manifest, parse_manifest

    from zerobatch_core.datasets.build import commit_manifest

    manifest = parse_manifest((source / MANIFEST_NAME).read_bytes())
    assert isinstance(manifest, Manifest)
    directory.mkdir(parents=True)
    for s in manifest.shards:
        os.link(source / s.name, directory / s.name)
    sums = np.frombuffer((source / CHECKSUMS_NAME).read_bytes(), "<u8")
    shards = list(manifest.shards)
    per_shard, at = [], 0
    for s in shards:
        per_shard.append(sums[at : at + s.num_batches])
        at += s.num_batches
    commit_manifest(
        str(directory),
        shards,
        per_shard,
        manifest.batch_size,
        manifest.seq_len,
        manifest.seed,
        (),
        False,
        manifest_version=2,
    )


def _write_fast(directory: Path, shards: int, slots: int) -> None:
    """The dataset ``write_sharded_dataset`` writes from ``_records``, shard by shard with the
    file writer in a staging directory (see the module docstring)."""
    from zerobatch_spec.dataset import shard_seed

    from zerobatch_core import BatchFileReader, write_batch_file
    from zerobatch_core.datasets.build import SHARD_PATTERN, commit_manifest, describe_shard
    from zerobatch_core.datasets.dataset import slot_checksums

    per = slots * BATCH
    records = _records(shards * per)
    directory.mkdir(parents=True)
    stage = directory.parent / f".{directory.name}.stage"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    entries, checksums = [], []
    for i in range(shards):
        name = SHARD_PATTERN.format(i)
        staged = stage / name
        write_batch_file(staged, records[i * per : (i + 1) * per], BATCH, SEQ, shard_seed(SEED, i))
        with BatchFileReader(staged) as reader:
            entries.append(describe_shard(reader, name, (i * per, (i + 1) * per)))
            checksums.append(slot_checksums(reader))
        os.rename(staged, directory / name)
    stage.rmdir()
    commit_manifest(str(directory), entries, checksums, BATCH, SEQ, SEED, (), False)


def _warm(directory: Path) -> None:
    """Every file of ``directory`` read once, so local measurements start on a warm cache."""
    with os.scandir(directory) as entries:
        for entry in entries:
            with open(entry.path, "rb", buffering=0) as f:
                while f.read(8 * MIB):
                    pass


def _build(directory: Path, shards: int, slots: int, version: int = 1) -> dict[str, Any]:
    from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

    t0 = time.perf_counter()
    reused = _reusable(directory, shards, slots, version)
    if not reused:
        shutil.rmtree(directory, ignore_errors=True)
        if version == 2:  # the version 1 build's shards, described by an index
            plain = directory.parent / directory.name.removesuffix("-v2")
            if not _reusable(plain, shards, slots):
                shutil.rmtree(plain, ignore_errors=True)
                _write_fast(plain, shards, slots)
            _indexed_twin(plain, directory)
        else:
            _write_fast(directory, shards, slots)
        settle()
    build_s = time.perf_counter() - t0
    _warm(directory)
    return {
        "reused": reused,
        "build_s": build_s,
        "manifest_bytes": (directory / MANIFEST_NAME).stat().st_size,
        "checksums_bytes": (directory / CHECKSUMS_NAME).stat().st_size,
        "shard_bytes": (directory / "shard-00000.batch").stat().st_size,
        **_spec_names(),
    }


def _check(directory: Path) -> dict[str, Any]:
    """The fast build against ``write_sharded_dataset`` on the same records, ``CHECK_SHARDS``
    shards of one slot: manifest and checksums must be identical."""
    from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

    from zerobatch_core import write_sharded_dataset

    fast, library = directory / "fast", directory / "library"
    t0 = time.perf_counter()
    _write_fast(fast, CHECK_SHARDS, 1)
    fast_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_sharded_dataset(
        library,
        [_records(CHECK_SHARDS * BATCH)],
        batch_size=BATCH,
        seq_len=SEQ,
        shard_batches=1,
        seed=SEED,
    )
    library_s = time.perf_counter() - t0
    same = all(
        (fast / name).read_bytes() == (library / name).read_bytes()
        for name in (MANIFEST_NAME, CHECKSUMS_NAME)
    )
    shutil.rmtree(directory)
    return {"identical": same, "fast_s": fast_s, "library_s": library_s}


def _upload(directory: Path, url: str) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

    from zerobatch_core.stores.resolve import open_store

    store = open_store(url)
    names = [n for n in os.listdir(directory) if n not in (MANIFEST_NAME, CHECKSUMS_NAME)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        for _ in pool.map(lambda n: store.write(n, (directory / n).read_bytes()), names):
            pass
    for name in (CHECKSUMS_NAME, MANIFEST_NAME):  # the manifest last, as a writer commits
        store.write(name, (directory / name).read_bytes())
    store.close()
    return {"upload_s": time.perf_counter() - t0, "objects": len(names) + 2}


def _mark(endpoint: str | None, name: str) -> dict[str, Any] | None:
    """The counting proxy's counters now (``None`` for a local source)."""
    if endpoint is None:
        return None
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(f"{endpoint}/{MARK}/{name}", timeout=60) as response:
        counts: dict[str, Any] = json.loads(response.read())
    return counts


def _rss() -> dict[str, int]:
    return proc_status(("VmRSS", "RssAnon", "RssFile", "VmHWM"))


def _measure_open(source: str, endpoint: str | None) -> dict[str, Any]:
    from zerobatch_core.delivery.sources import open_reader

    marks = {"start": _mark(endpoint, "start")}
    rss = {"start": _rss()}
    t0 = time.perf_counter()
    reader = open_reader(source)
    open_s = time.perf_counter() - t0
    rss["open"] = _rss()
    marks["open"] = _mark(endpoint, "open")
    slots = reader.num_batches
    reader.close()
    return {"open_s": open_s, "slots": slots, "rss": rss, "marks": marks}


def _measure_loader(
    source: str, endpoint: str | None, ranks: dict[str, int], steps: int, window: int
) -> dict[str, Any]:
    import numpy as np

    from zerobatch_core import BatchNativeLoader
    from zerobatch_core.datasets.remote import MAX_AHEAD

    marks = {"start": _mark(endpoint, "start")}
    rss = {"start": _rss()}
    t0 = time.perf_counter()
    loader = BatchNativeLoader(
        source,
        rank=ranks["rank"],
        world_size=ranks["world_size"],
        context_rank=ranks["context_rank"],
        context_size=ranks["context_size"],
    )
    t1 = time.perf_counter()
    rss["open"] = _rss()
    marks["open"] = _mark(endpoint, "open")
    epoch = len(loader)
    items: Iterator[Any] = iter(loader)
    checksum = int(np.sum(next(items)))  # touch the batch
    t2 = time.perf_counter()
    rss["first"] = _rss()
    marks["first"] = _mark(endpoint, "first")
    steps = min(steps, epoch - 1)
    for _ in range(steps):
        checksum ^= int(np.sum(next(items)))
    t3 = time.perf_counter()
    rss["steps"] = _rss()
    marks["steps"] = _mark(endpoint, "steps")
    # Steady state needs the prefetch window to stay full to the window's end; a shorter
    # epoch is read to its end instead.
    steady = 1 + steps + window + MAX_AHEAD < epoch
    span = window if steady else epoch - 1 - steps
    for _ in range(span):
        checksum ^= int(np.sum(next(items)))
    t4 = time.perf_counter()
    marks["span"] = _mark(endpoint, "span")
    rss["span"] = _rss()
    loader.source.close()
    return {
        "construct_s": t1 - t0,
        "first_batch_s": t2 - t1,
        "steps": steps,
        "steps_s": t3 - t2,
        "span": "window" if steady else "epoch",
        "span_steps": span,
        "span_s": t4 - t3,
        "epoch_steps": epoch,
        "checksum": checksum,
        "rss": rss,
        "marks": marks,
    }


def child(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement (``--child JSON``)."""
    role = payload["role"]
    if role == "build":
        return _build(
            Path(payload["dir"]),
            int(payload["shards"]),
            int(payload["slots"]),
            int(payload.get("version", 1)),
        )
    if role == "check":
        return _check(Path(payload["dir"]))
    if role == "upload":
        return _upload(Path(payload["dir"]), payload["url"])
    if role == "open":
        return _measure_open(payload["source"], payload["mark"])
    if role == "loader":
        return _measure_loader(
            payload["source"],
            payload["mark"],
            payload["ranks"],
            payload["steps"],
            payload["window"],
        )
    raise ValueError(f"unknown role {role!r}")


# --- the counting proxy -------------------------------------------------------------------------


class KindProxy(S3Proxy):
    """``S3Proxy`` that also counts requests and response body bytes per kind of object, and
    answers ``GET /MARK/...`` itself with a snapshot of its counters (as JSON)."""

    def __init__(self, upstream: str, names: dict[str, Any]) -> None:
        self.names = names
        self._local = threading.local()
        self.kinds: dict[str, dict[str, int]] = {}
        super().__init__(upstream)

    def reset(self) -> None:
        """Zero every counter."""
        super().reset()
        with self._lock:
            self.kinds = {}

    def kind(self, method: str, path: str, range_header: str | None) -> str:
        """What a request reads: ``manifest``, ``checksums``, ``header``, ``slot`` or the
        object's name (a ``HEAD`` is counted under its object's kind, as ``... HEAD``)."""
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if name == self.names["manifest"]:
            kind = "manifest"
        elif name == self.names["checksums"]:
            kind = "checksums"
        elif name.endswith(".batch"):
            start = -1
            if range_header and range_header.startswith("bytes="):
                start = int(range_header[len("bytes=") :].split("-", 1)[0] or 0)
            if method == "HEAD":
                kind = "shard"
            elif start < 0:
                kind = "shard whole"
            else:
                kind = "header" if start < self.names["header_size"] else "slot"
        else:
            kind = name or "bucket"
        return f"{kind} HEAD" if method == "HEAD" else kind

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        """Answer a marker request, or forward and count by kind."""
        path = urllib.parse.urlsplit(handler.path).path
        if path.startswith(f"/{MARK}/"):
            with self._lock:
                body = json.dumps({"counts": self.counts, "kinds": self.kinds}).encode()
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        self._local.kind = self.kind(handler.command, path, handler.headers.get("Range"))
        try:
            super().handle(handler)
        finally:
            self._local.kind = None

    def _count(self, **amounts: int) -> None:
        super()._count(**amounts)
        kind = getattr(self._local, "kind", None)
        if kind is None:
            return
        with self._lock:
            entry = self.kinds.setdefault(kind, {"requests": 0, "bytes": 0})
            entry["requests"] += amounts.get("requests", 0)
            entry["bytes"] += amounts.get("get_bytes", 0)


# --- the parent ---------------------------------------------------------------------------------


def _load() -> float:
    return os.getloadavg()[0]


def _git() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown (no git)"
    if not head:
        return "unknown (not a git checkout)"
    return head + (" (with uncommitted changes)" if dirty else "")


def _median_tree(values: list[Any]) -> Any:
    """Medians of the numbers at each place of a list of equally shaped JSON trees."""
    first = values[0]
    if isinstance(first, dict):
        trees = [v if isinstance(v, dict) else {} for v in values]
        keys = set().union(*(t.keys() for t in trees))
        out = {}
        for k in sorted(keys):
            template = next(t[k] for t in trees if k in t)
            out[k] = _median_tree([t.get(k, _zero_like(template)) for t in trees])
        return out
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first
    return statistics.median(values)


def _zero_like(value: Any) -> Any:
    """What a missing entry of ``value``'s shape counts as: nothing."""
    if isinstance(value, dict):
        return {k: _zero_like(v) for k, v in value.items()}
    return 0 if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _delta(marks: dict[str, Any], end: str, start: str) -> dict[str, Any]:
    """Requests and bytes between two marks, in total and per kind."""
    a, b = marks[start], marks[end]
    kinds = {}
    for kind in set(a["kinds"]) | set(b["kinds"]):
        zero = {"requests": 0, "bytes": 0}
        x, y = a["kinds"].get(kind, zero), b["kinds"].get(kind, zero)
        kinds[kind] = {k: y[k] - x[k] for k in ("requests", "bytes")}
    return {
        "requests": b["counts"]["requests"] - a["counts"]["requests"],
        "bytes": b["counts"]["get_bytes"] - a["counts"]["get_bytes"],
        "kinds": kinds,
    }


def _summarize(report: dict[str, Any], maxrss: int) -> dict[str, Any]:
    """A child's report with its peak RSS and, for remote children, the counts per stage."""
    out = dict(report)
    rss = report["rss"]
    # The child's own high-water mark: its ru_maxrss also holds the parent's peak, which the
    # proxy's buffers raise (see _common's module docstring).
    out["peak_rss_mb"] = max(r.get("VmHWM", 0) for r in rss.values()) / MIB
    out["ru_maxrss_mb"] = maxrss / MIB
    out["rss_mb"] = {stage: r.get("VmRSS", 0) / MIB for stage, r in rss.items()}
    out["open_rss_delta_mb"] = (rss["open"]["VmRSS"] - rss["start"]["VmRSS"]) / MIB
    marks = out.pop("marks")
    out.pop("rss")
    if marks["start"] is None:
        return out
    out["at_open"] = _delta(marks, "open", "start")
    if "first" in marks:
        out["startup"] = _delta(marks, "first", "start")
        out["first_steps"] = _delta(marks, "steps", "start")
        span = _delta(marks, "span", "steps" if report["span"] == "window" else "open")
        span_steps = report["span_steps"] if report["span"] == "window" else report["epoch_steps"]
        out["span_counts"] = span
        out["requests_per_step"] = span["requests"] / max(1, span_steps)
        out["bytes_per_step"] = span["bytes"] / max(1, span_steps)
    return out


def _wait_for_hold(path: Path) -> None:
    while path.exists():
        print(f"{path} exists: waiting 30 s", flush=True)
        time.sleep(30)


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f}"


def _table(results: dict[str, Any]) -> list[str]:
    lines = []
    head = (
        f"{'shards':>7} {'where':>6} {'ranks':>5} {'open s':>7} {'loader s':>8} "
        f"{'first s':>7} {'100 steps s':>11} {'RSS MB':>6} {'open dRSS':>9} {'start req':>9} "
        f"{'start KiB':>9} {'100 req':>7} {'100 KiB':>8} {'req/step':>8} {'B/step':>7}"
    )
    lines.append(head)
    for count in results["counts"]:
        for where in ("local", "remote"):
            entry = results["figures"][str(count)][where]
            opened = entry["open"]
            for ranks, _ in RANKS:
                r = entry["loader"][ranks]
                startup = r.get("startup")
                per_step = r.get("requests_per_step")
                lines.append(
                    f"{count:>7,} {where:>6} {ranks:>5} {opened['open_s']:>7.3f} "
                    f"{r['construct_s']:>8.3f} {r['first_batch_s']:>7.3f} {r['steps_s']:>11.3f} "
                    f"{r['peak_rss_mb']:>6.0f} {r['open_rss_delta_mb']:>9.1f} "
                    + (
                        f"{startup['requests']:>9,.0f} {_kb(startup['bytes']):>9} "
                        f"{r['first_steps']['requests']:>7,.0f} "
                        f"{_kb(r['first_steps']['bytes']):>8} "
                        f"{per_step:>8.2f} {r['bytes_per_step']:>7.0f}"
                        if startup is not None and per_step is not None
                        else f"{'-':>9} {'-':>9} {'-':>7} {'-':>8} {'-':>8} {'-':>7}"
                    )
                )
    return lines


def _kinds_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "remote requests (bytes) by object, at the first batch / per step in steady state:",
        f"{'shards':>7} {'ranks':>5}  {'stage':<8} {'manifest':>18} {'checksums':>18} "
        f"{'headers':>16} {'slots':>14} {'HEAD+other':>12}",
    ]
    for count in results["counts"]:
        entry = results["figures"][str(count)]["remote"]
        for ranks, _ in RANKS:
            r = entry["loader"][ranks]
            steps = r["span_steps"] if r["span"] == "window" else r["epoch_steps"]
            for stage, counts, div in (
                ("startup", r["startup"], 1),
                (f"/step({r['span'][0]})", r["span_counts"], steps),
            ):
                kinds = counts["kinds"]

                def cell(
                    name: str, width: int, kinds: dict[str, Any] = kinds, div: int = div
                ) -> str:
                    k = kinds.get(name, {"requests": 0, "bytes": 0})
                    text = f"{k['requests'] / div:,.2f}" if div > 1 else f"{k['requests']:,}"
                    size = f"{k['bytes'] / div:,.0f}" if div > 1 else _kb(k["bytes"]) + "K"
                    return f"{text} ({size})".rjust(width)

                known = {"manifest", "checksums", "header", "slot"}
                other = sum(v["requests"] for k, v in kinds.items() if k not in known)
                lines.append(
                    f"{count:>7,} {ranks:>5}  {stage:<8} {cell('manifest', 18)} "
                    f"{cell('checksums', 18)} {cell('header', 16)} {cell('slot', 14)} "
                    f"{other / div:>12,.2f}"
                )
    return lines


def _scaling(results: dict[str, Any]) -> dict[str, Any]:
    """Slopes between the smallest and the largest shard count."""
    counts = results["counts"]
    lo, hi = counts[0], counts[-1]
    if lo == hi:
        return {}
    fig = results["figures"]
    per_k = 1000 / (hi - lo)
    out: dict[str, Any] = {
        "manifest_bytes_per_shard": (
            fig[str(hi)]["build"]["manifest_bytes"] - fig[str(lo)]["build"]["manifest_bytes"]
        )
        / (hi - lo),
        "checksums_bytes_per_shard": (
            fig[str(hi)]["build"]["checksums_bytes"] - fig[str(lo)]["build"]["checksums_bytes"]
        )
        / (hi - lo),
    }
    for where in ("local", "remote"):
        a, b = fig[str(lo)][where], fig[str(hi)][where]
        out[f"{where}_open_ms_per_1000_shards"] = (b["open"]["open_s"] - a["open"]["open_s"]) * (
            per_k * 1000
        )
        out[f"{where}_open_rss_mb_per_1000_shards"] = (
            b["open"]["open_rss_delta_mb"] - a["open"]["open_rss_delta_mb"]
        ) * per_k
        for ranks, _ in RANKS:
            x, y = a["loader"][ranks], b["loader"][ranks]
            out[f"{where}_{ranks}_construct_ms_per_1000_shards"] = (
                y["construct_s"] - x["construct_s"]
            ) * (per_k * 1000)
            out[f"{where}_{ranks}_first_batch_ms_per_1000_shards"] = (
                y["first_batch_s"] - x["first_batch_s"]
            ) * (per_k * 1000)
            out[f"{where}_{ranks}_peak_rss_mb_per_1000_shards"] = (
                y["peak_rss_mb"] - x["peak_rss_mb"]
            ) * per_k
            if where == "remote":
                out[f"remote_{ranks}_startup_bytes_per_shard"] = (
                    y["startup"]["bytes"] - x["startup"]["bytes"]
                ) / (hi - lo)
    return out


def _extrapolate(results: dict[str, Any]) -> dict[str, Any]:
    """Job start and first epoch at ``EXTRAPOLATE_RANKS`` ranks, from the largest count."""
    hi = results["counts"][-1]
    fig = results["figures"][str(hi)]
    out: dict[str, Any] = {"ranks": EXTRAPOLATE_RANKS, "shards": hi}
    for ranks, _ in RANKS:
        r = fig["remote"]["loader"][ranks]
        kinds = r["first_steps"]["kinds"]
        meta = sum(kinds.get(k, {"bytes": 0})["bytes"] for k in ("manifest", "checksums"))
        out[f"{ranks}_metadata_bytes_per_rank"] = meta
        out[f"{ranks}_metadata_bytes_job"] = meta * EXTRAPOLATE_RANKS
        heads = r["span_counts"]["kinds"].get("header", {"requests": 0})["requests"]
        steps = r["span_steps"] if r["span"] == "window" else r["epoch_steps"]
        out[f"{ranks}_header_requests_per_step"] = heads / max(1, steps)
        out[f"{ranks}_header_requests_first_epoch_job"] = (
            heads / max(1, steps) * r["epoch_steps"] * EXTRAPOLATE_RANKS
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", default=",".join(str(n) for n in SHARD_COUNTS))
    parser.add_argument("--slots", type=int, default=1, help="stored batches per shard")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--window", type=int, default=400)
    parser.add_argument("--cache", type=Path, default=None, help="keep built datasets here")
    parser.add_argument("--hold", type=Path, default=None, help="wait while this file exists")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--manifest-version",
        type=int,
        choices=[1, 2],
        default=1,
        help="the datasets' manifest version (2: a shard index; built from the version 1 "
        "datasets' shards)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    counts = sorted({int(n.replace("_", "")) for n in args.shards.split(",") if n.strip()})
    if args.hold is not None:
        _wait_for_hold(args.hold)
    script = Path(__file__).resolve()
    started = datetime.datetime.now(datetime.timezone.utc)
    results: dict[str, Any] = {
        "started_utc": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "load_start": _load(),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
        "commit": _git(),
        "counts": counts,
        "manifest_version": args.manifest_version,
        "shape": {"batch_size": BATCH, "seq_len": SEQ, "slots_per_shard": args.slots},
        "trials": args.trials,
        "steps": args.steps,
        "window": args.window,
        "figures": {str(n): {} for n in counts},
    }
    print(f"load average at start: {results['load_start']:.2f} ({results['started_utc']})")
    print(f"ZeroBatch {results['commit']}; {results['machine']}")
    suffix = "-v2" if args.manifest_version == 2 else ""
    work = args.cache if args.cache is not None else scratch_dir("scale-")
    work.mkdir(parents=True, exist_ok=True)
    server: S3Server | None = None
    proxy: KindProxy | None = None
    try:
        check = run_child(script, {"role": "check", "dir": str(work / "check")}).report
        results["writer_check"] = check
        print(
            f"build check at {CHECK_SHARDS:,} shards: write_sharded_dataset "
            f"{check['library_s']:.1f} s, staged file writes {check['fast_s']:.1f} s, "
            f"manifest and checksums identical: "
            f"{check['identical']}"
        )
        if not check["identical"]:
            raise SystemExit("the staged build differs from write_sharded_dataset's")
        names: dict[str, Any] = {}
        for n in counts:
            payload = {
                "role": "build",
                "dir": str(work / f"shards-{n}{suffix}"),
                "slots": args.slots,
                "version": args.manifest_version,
            }
            built = run_child(script, {**payload, "shards": n}).report
            names = {k: built.pop(k) for k in ("header_size", "manifest", "checksums")}
            results["figures"][str(n)]["build"] = built
            print(
                f"{n:>7,} shards: {'reused' if built['reused'] else 'built'} in "
                f"{built['build_s']:.1f} s; manifest {built['manifest_bytes']:,} bytes, "
                f"checksums {built['checksums_bytes']:,} bytes, shard {built['shard_bytes']:,}"
            )
        server = S3Server()
        server.create_bucket(BUCKET)
        with environment(server.endpoint):
            for n in counts:
                url = f"s3://{BUCKET}/shards-{n}"
                local = str(work / f"shards-{n}{suffix}")
                up = run_child(script, {"role": "upload", "dir": local, "url": url}).report
                results["figures"][str(n)]["upload"] = up
                print(
                    f"{n:>7,} shards: uploaded {up['objects']:,} objects in {up['upload_s']:.1f} s"
                )
        proxy = KindProxy(server.endpoint, names)
        raw: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
        with environment(proxy.endpoint):
            for trial in range(args.trials):
                for n in counts:
                    for where in ("local", "remote"):
                        remote = where == "remote"
                        source = (
                            f"s3://{BUCKET}/shards-{n}"
                            if remote
                            else str(work / f"shards-{n}{suffix}")
                        )
                        base = {
                            "source": source,
                            "mark": proxy.endpoint if remote else None,
                            "window": args.window,
                        }
                        jobs: list[tuple[str, dict[str, Any]]] = [("open", {"role": "open"})]
                        jobs += [
                            (ranks, {"role": "loader", "ranks": kw, "steps": args.steps})
                            for ranks, kw in RANKS
                        ]
                        for what, extra in jobs:
                            proxy.reset()
                            done = run_child(script, {**base, **extra})
                            s = _summarize(done.report, done.maxrss_bytes)
                            raw.setdefault((n, where, what), []).append(s)
                            print(
                                f"trial {trial + 1}: {n:>7,} {where:>6} {what:>4}: "
                                + (
                                    f"open {s['open_s']:.3f} s"
                                    if what == "open"
                                    else f"loader {s['construct_s']:.3f} s, first batch "
                                    f"{s['first_batch_s']:.3f} s"
                                )
                                + f", peak RSS {s['peak_rss_mb']:.0f} MB"
                                + (
                                    f", {s['startup']['requests']} requests to the first batch"
                                    if "startup" in s
                                    else ""
                                ),
                                flush=True,
                            )
        for (n, where, what), values in raw.items():
            entry = results["figures"][str(n)].setdefault(where, {"loader": {}})
            if what == "open":
                entry["open"] = _median_tree(values)
            else:
                entry["loader"][what] = _median_tree(values)
    finally:
        if proxy is not None:
            proxy.stop()
        if server is not None:
            server.stop()
        if args.cache is None:
            shutil.rmtree(work, ignore_errors=True)
    results["scaling"] = _scaling(results)
    results["extrapolation"] = _extrapolate(results)
    results["load_end"] = _load()
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    print()
    print("\n".join(_table(results)))
    print()
    print("\n".join(_kinds_table(results)))
    print()
    for key, value in results["scaling"].items():
        print(f"{key}: {value:,.2f}")
    for key, value in results["extrapolation"].items():
        print(f"{key}: {value:,.2f}" if isinstance(value, float) else f"{key}: {value:,}")
    print(f"load average at end: {results['load_end']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
