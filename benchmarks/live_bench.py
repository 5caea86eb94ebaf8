"""Live datasets: producer commits/s and consumer MB/s as the dataset grows to 10,000 batches,
for the adaptive commit cadence (DAC) and fixed cadences.

For each policy, a fresh live dataset on the loopback S3-compatible server (moto,
``tests/s3server.py``) receives ``--batches`` global batches of ``[8, 512]`` uint32 (16 KiB,
one object each) from ``--producers`` producer processes (an equal share each), while one
consumer process reads every batch as it is committed (a ``BatchNativeLoader`` over a
``LiveSource``: whole batches, each checked against its checksum, committed ones fetched
ahead). Producers log every commit attempt (its start and end, the version's batch count,
fragile window, conflict, whether the producer was closing, and the cadence's ``N``, window
estimate and gap after it) and, at the end, each batch's append-to-visible latency; the
consumer logs its progress (the logs' folder is printed). The report cuts the run into
buckets of 2,000 committed batches and gives, per bucket: producer commits/s, batches
committed/s, the conflict rate of attempts, the mean fragile window, and consumer MB/s.

``--scale 2,4,8,16`` runs the adaptive policy for each producer count and reports, per count:
the time to the last commit and to the last append, batches/s, commits, the conflict rate
overall, split into the cold start (before every producer has committed once: none can know
of the others yet), steady running and closing, and per bucket; commit latency P50/P95 (the
start of the first attempt that carried a commit's objects to the end of the one that landed
it) and visibility latency P50/P95 (a batch's append to the commit that made it visible);
and the consumer's MB/s. Then (``--startup`` alone, or ``--startup-marks`` after a scale
run) one producer fills a fresh dataset and, at 1,000, 5,000 and 10,000 committed batches, a
fresh consumer process opens it and reads its first batch: time, store requests and bytes
(the store's own counters), then times its idle poll (``refresh`` finding nothing new) and a
poll that lists the versions, and a second fresh consumer reads the last committed batch.
The BatchWeave paper's comparable figures are printed beside.

Policies: ``adaptive`` (DAC, default budgets: conflicts 10%, manifest I/O 25%) and ``k``
(commit every ``k`` appends). ``adaptive-unsealed`` is DAC on a manifest that is never sealed
into segments (``segment_size`` 10^6), whose size then grows with every batch: the case the
cadence has to adapt to. A policy that has not reached ``--batches`` after ``--time-limit``
seconds is stopped and reported as far as it got.

::

    python benchmarks/live_bench.py                                  # ~10-20 min here
    python benchmarks/live_bench.py --batches 2000 --policies adaptive,1 --json live.json
    python benchmarks/live_bench.py --acceptance   # 8 producers x 200 batches, then report
    python benchmarks/live_bench.py --retention    # storage with checkpoints every 10 steps
    python benchmarks/live_bench.py --scale 2,4,8,16 --time-limit 600   # DAC by producer count
    python benchmarks/live_bench.py --startup      # a fresh consumer at 1,000 / 5,000 / 10,000
    python benchmarks/live_bench.py --startup --startup-cadence 2 --startup-marks 2000,6000

The 1-minute load average is printed at the start and the end (2 shared cores; the server,
the producers and the consumer all run on them).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

B, T = 8, 512
BUCKET = 2000


def produce(url: str, producer: int, count: int, policy: str, log: str, total: int) -> None:
    """A producer process: ``count`` batches, one log line per commit attempt, then its
    totals and the append-to-visible latency of every batch it committed."""
    import numpy as np

    from zerobatch_core.live.producer import LiveProducer

    segment = 10**6 if policy.endswith("unsealed") else 256
    cadence: Any = "adaptive" if policy.startswith("adaptive") else int(policy)
    with open(log, "w") as out:
        logged = _logged(cadence, out)
        p = LiveProducer(
            url, f"p-{producer}", batch_size=B, seq_len=T, cadence=logged, segment_size=segment
        )
        logged.producer = p
        appended: list[float] = []
        visible: list[float] = []

        def landed() -> None:
            while len(visible) < p.committed:
                visible.append(logged.landed - appended[len(visible)])

        for i in range(p.offset, count):
            row = np.arange(T, dtype=np.uint32) + np.uint32(producer * 10**6 + i)
            appended.append(time.time())
            p.append(np.broadcast_to(row, (B, T)))
            landed()
        logged.closing = True
        appends_done = time.time()
        p.close()
        landed()
        final = {"t": time.time(), "done": True, "appends_done": appends_done, **_stats(p)}
        out.write(json.dumps({**final, "visible": visible}) + "\n")


def _logged(cadence: Any, out: Any) -> Any:
    """``cadence`` (``"adaptive"`` or ``k``) with every attempt it observes written to ``out``
    as a line: start and end (wall clock), fragile window, outcome, the version's batches,
    and the cadence's state after it (``n``: producers seen, ``w``: window average, ``gap``)."""
    from zerobatch_core.live.cadence import Cadence, make_cadence

    inner = make_cadence(cadence)

    class Logged(Cadence):
        def __init__(self) -> None:
            self.producer: Any = None
            self.closing = False
            self.landed = 0.0

        @property
        def gap(self) -> float:
            return float(getattr(inner, "gap", 0.0))

        def due(self, pending: int, now: float) -> bool:
            return inner.due(pending, now)

        def delay(self, now: float) -> float:
            return inner.delay(now)

        def start(self, window: float, writers: list[str], now: float) -> None:
            inner.start(window, writers, now)

        def contenders(self, producers: list[str], now: float) -> None:
            inner.contenders(producers, now)

        def observe(self, window: float, conflicted: bool, writers: list[str], now: float) -> None:
            inner.observe(window, conflicted, writers, now)
            t = time.time()
            if not conflicted:
                self.landed = t
            base = self.producer.base
            attempt = self.producer.stats.windows[-1]  # the whole attempt, catching up included
            line = {
                "t0": t - attempt,
                "t": t,
                "window": window,
                "attempt": attempt,
                "ok": not conflicted,
                "batches": base.batches,
                "version": base.version,
                "n": getattr(inner, "producers", 0),
                "w": getattr(inner, "window", 0.0),
                "gap": self.gap,
                "closing": self.closing,
            }
            out.write(json.dumps(line) + "\n")
            out.flush()

    return Logged()


def _stats(p: Any) -> dict[str, Any]:
    s = p.stats
    return {"attempts": s.attempts, "commits": s.commits, "conflicts": s.conflicts}


def consume(url: str, total: int, log: str) -> None:
    """The consumer process: a loader over the live dataset (committed batches fetched ahead
    of it), every batch in commit order, a log line every 100."""
    from zerobatch_core import BatchNativeLoader
    from zerobatch_core.live.source import LiveSource

    with LiveSource(url, timeout=600) as source, open(log, "w") as out:
        items = iter(BatchNativeLoader(source, dtype="uint32"))
        for g in range(total):
            next(items)
            if g % 100 == 99 or g == total - 1:
                out.write(json.dumps({"t": time.time(), "read": g + 1}) + "\n")
                out.flush()


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", *args], cwd=REPO, env=dict(os.environ)
    )


def run_policy(
    endpoint: str, server: Any, policy: str, producers: int, batches: int, limit: float, work: Path
) -> dict[str, Any]:
    from zerobatch_core.live.producer import LiveProducer

    bucket = f"zb-live-{secrets.token_hex(4)}"
    server.create_bucket(bucket)
    url = f"s3://{bucket}/live"
    segment = 10**6 if policy.endswith("unsealed") else 256
    LiveProducer(url, "setup", batch_size=B, seq_len=T, segment_size=segment).close()
    share = batches // producers
    total = share * producers
    logs = [str(work / f"{policy}-n{producers}-p{k}.jsonl") for k in range(producers)]
    consumer_log = str(work / f"{policy}-n{producers}-consumer.jsonl")
    start = time.time()
    procs = [
        _spawn("produce", url, str(k), str(share), policy, logs[k], str(total))
        for k in range(producers)
    ]
    consumer = _spawn("consume", url, str(total), consumer_log)
    stopped = False
    for proc in [*procs, consumer]:
        remaining = max(1.0, limit - (time.time() - start))
        try:
            proc.wait(remaining)
        except subprocess.TimeoutExpired:
            stopped = True
            proc.kill()
            proc.wait()
    return analyse(policy, start, logs, consumer_log, total, stopped)


def _lines(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def analyse(
    policy: str, start: float, logs: list[str], consumer_log: str, total: int, stopped: bool
) -> dict[str, Any]:
    attempts = sorted(
        (e for log in logs for e in _lines(log) if "window" in e), key=lambda e: e["t"]
    )
    finals = [e for log in logs for e in _lines(log) if e.get("done")]
    reads = _lines(consumer_log)
    buckets = []
    last_t = start
    for lo in range(0, total, BUCKET):
        hi = min(lo + BUCKET, total)
        inside = [e for e in attempts if lo < e["batches"] <= hi]
        if not inside:
            break
        end_t = max(e["t"] for e in inside)
        commits = sum(1 for e in inside if e["ok"])
        span = max(end_t - last_t, 1e-9)
        windows = [e["window"] for e in inside]
        got = [r for r in reads if lo < r["read"] <= hi]
        prev = [r for r in reads if r["read"] <= lo]
        consumer_mb_s = None
        if got:
            t0 = prev[-1]["t"] if prev else start
            nbytes = (got[-1]["read"] - (prev[-1]["read"] if prev else 0)) * B * T * 4
            consumer_mb_s = nbytes / max(got[-1]["t"] - t0, 1e-9) / 1e6
        buckets.append(
            {
                "batches": f"{lo}-{hi}",
                "commits_s": commits / span,
                "batches_s": (max(e["batches"] for e in inside) - lo) / span,
                "attempts": len(inside),
                "conflict_rate": 1 - commits / len(inside),
                "window_ms": statistics.mean(windows) * 1e3,
                "attempt_ms": statistics.mean(e.get("attempt", e["window"]) for e in inside) * 1e3,
                "consumer_mb_s": consumer_mb_s,
            }
        )
        last_t = end_t
    reached = max((e["batches"] for e in attempts), default=0)
    wall = (attempts[-1]["t"] - start) if attempts else 0.0
    return {
        "policy": policy,
        "reached": reached,
        "stopped": stopped,
        "wall_s": wall,
        "attempts": sum(f["attempts"] for f in finals) if finals else len(attempts),
        # Producers stopped at the time limit report no totals: count the attempts that landed.
        "commits": (
            sum(f["commits"] for f in finals) if finals else sum(1 for e in attempts if e["ok"])
        ),
        "consumer_read": reads[-1]["read"] if reads else 0,
        "consumer_mb_s": (
            reads[-1]["read"] * B * T * 4 / max(reads[-1]["t"] - start, 1e-9) / 1e6
            if reads
            else None
        ),
        "appends_done_s": (
            max(f["appends_done"] for f in finals) - start
            if finals and all("appends_done" in f for f in finals)
            else None
        ),
        "buckets": buckets,
        **_latencies(logs, finals),
        **_phases(logs),
    }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": at(0.5), "p95": at(0.95)}


def _latencies(logs: list[str], finals: list[dict[str, Any]]) -> dict[str, Any]:
    """Commit latency (the start of the first attempt that carried a commit's objects to the
    end of the attempt that landed it, lost races and their gaps included) and visibility
    latency (each batch's append to the end of the commit that made it visible)."""
    commit: list[float] = []
    for log in logs:
        first = None
        for e in _lines(log):
            if "window" not in e:
                continue
            first = e["t0"] if first is None else first
            if e["ok"]:
                commit.append(e["t"] - first)
                first = None
    visible = [v for f in finals for v in f.get("visible", [])]
    return {"commit_latency_s": _percentiles(commit), "visible_latency_s": _percentiles(visible)}


def _phases(logs: list[str]) -> dict[str, Any]:
    """Attempts and conflicts in three phases: before every producer has committed once (no
    producer can know of the others yet), while closing, and the rest."""
    lines = [(k, e) for k, log in enumerate(logs) for e in _lines(log) if "window" in e]
    lines.sort(key=lambda x: x[1]["t"])
    firsts: dict[int, float] = {}
    for k, e in lines:
        if e["ok"]:
            firsts.setdefault(k, e["t"])
    warm_at = max(firsts.values()) if len(firsts) == len(logs) else float("inf")
    out: dict[str, list[int]] = {"cold": [0, 0], "steady": [0, 0], "closing": [0, 0]}
    for _, e in lines:
        phase = "closing" if e["closing"] else "cold" if e["t"] <= warm_at else "steady"
        out[phase][0] += 1
        out[phase][1] += not e["ok"]
    return {"phases": {k: {"attempts": a, "conflicts": c} for k, (a, c) in out.items()}}


def startup_probe(url: str, log: str) -> None:
    """A fresh consumer process: open the live dataset and read its first global batch,
    timing each step and counting the store requests and bytes it took; then the idle poll
    (``refresh`` finding nothing new: ``POLLS`` of them, the median time and the requests of
    one), the poll with a listing of the versions (what every idle poll cost before polls
    stopped listing), and a second fresh consumer that reads the last committed batch (a
    resume deep into the dataset). Requests are the store's counters (requests answered "not
    found" left out), except the polls', which count every request."""
    from zerobatch_core.live.source import LiveSource
    from zerobatch_core.stores.resolve import open_store

    def counted(store: Any) -> list[int]:
        calls = [0]
        for name in ("_read", "_read_ranges", "_read_head", "_size", "_list"):
            inner = getattr(store, name)

            def call(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
                calls[0] += 1
                return _inner(*args, **kwargs)

            setattr(store, name, call)
        return calls

    def polls(source: Any, calls: list[int], n: int, listing: bool) -> tuple[float, float]:
        times = []
        before = calls[0]
        for _ in range(n):
            t = time.perf_counter()
            source.refresh(listing=listing)
            times.append(time.perf_counter() - t)
        return statistics.median(times), (calls[0] - before) / n

    store = open_store(url)
    calls = counted(store)
    t0 = time.perf_counter()
    source = LiveSource(store, timeout=30)
    t1 = time.perf_counter()
    opened = store.stats.snapshot()
    source.read_batch(source.start)
    t2 = time.perf_counter()
    first = store.stats.snapshot()
    manifest = source.current
    poll_s, poll_requests = polls(source, calls, POLLS, False)
    list_poll_s, list_poll_requests = polls(source, calls, 3, True)
    source.close()
    deep_store = open_store(url)
    t3 = time.perf_counter()
    with LiveSource(deep_store, timeout=30) as deep:
        deep.read_batch(deep.committed - 1)
    deep_s = time.perf_counter() - t3
    line = {
        "committed": source.committed,
        "version": manifest.version,
        "segments": len(manifest.segments),
        "tail": len(manifest.tail),
        "open_s": t1 - t0,
        "open_requests": opened["requests"],
        "open_bytes": opened["bytes_read"],
        "first_batch_s": t2 - t0,
        "first_batch_requests": first["requests"],
        "first_batch_bytes": first["bytes_read"],
        "poll_s": poll_s,
        "poll_requests": poll_requests,
        "list_poll_s": list_poll_s,
        "list_poll_requests": list_poll_requests,
        "deep_batch_s": deep_s,
        "deep_batch_requests": deep_store.stats.snapshot()["requests"],
        "deep_batch_bytes": deep_store.stats.snapshot()["bytes_read"],
    }
    with open(log, "w") as out:
        out.write(json.dumps(line) + "\n")


POLLS = 20
"""Idle polls a startup probe times."""


def startup(
    server: Any, marks: list[int], work: Path, cadence: Any = "adaptive"
) -> list[dict[str, Any]]:
    """One producer fills a fresh live dataset (``cadence``: adaptive, or a commit every
    ``k`` appends; ``[8, 512]`` batches, one object each, segments of 256 entries); at each
    mark a fresh consumer process opens it and reads its first batch (``startup_probe``),
    with nothing else running."""
    import numpy as np

    from zerobatch_core.live.producer import LiveProducer

    bucket = f"zb-start-{secrets.token_hex(4)}"
    server.create_bucket(bucket)
    url = f"s3://{bucket}/live"
    out = []
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, segment_size=256, cadence=cadence) as p:
        for mark in marks:
            for i in range(p.offset, mark):
                row = np.arange(T, dtype=np.uint32) + np.uint32(i)
                p.append(np.broadcast_to(row, (B, T)))
            p.commit()
            log = str(work / f"startup-{mark}.jsonl")
            _spawn("startup", url, log).wait()
            out.extend(_lines(log))
    return out


PAPER = [
    "BatchWeave paper (seed text, section 7.3): 32 producers on one CPU node, Baidu Object",
    "Storage, 5-hour run: DAC 431.9 MB/s at 96.3% commit success (3.7% of attempts lost);",
    "INCR 110.5 MB/s at 64.2%, FIXED100 107.5 MB/s at 64.3%, AIMD 79.0 MB/s at 95.5%,",
    "FIXED10 50.0 MB/s at 13.1%, Naive 7.1 MB/s at 9.0%. Producer sweep 8-128 producers, 300 s",
    "warmup excluded, 5-hour window; at 128 producers 1.42 / 7.03 / 16.0 GB/s for 100 KB /",
    "1000 KB / 10000 KB payloads. The conflict budget's value is not in the text we have; it",
    'says DAC\'s "measured conflict rate ... stays close to the target".',
]


def scale(
    server: Any,
    counts: list[int],
    batches: int,
    limit: float,
    marks: list[int],
    work: Path,
    startup_cadence: Any = "adaptive",
) -> dict[str, Any]:
    """The adaptive cadence for each producer count to ``batches``, then consumer startup at
    each mark of committed batches (the filling producer's cadence: ``startup_cadence``)."""
    runs = []
    for n in counts:
        r = run_policy(server.endpoint, server, "adaptive", n, batches, limit, work)
        r["producers"] = n
        r["load"] = os.getloadavg()[0]
        runs.append(r)
        _print(r)
    starts = startup(server, marks, work, startup_cadence) if marks else []
    _print_scale(runs, starts)
    return {"scale": runs, "startup": starts, "paper": PAPER}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def _print_scale(runs: list[dict[str, Any]], starts: list[dict[str, Any]]) -> None:
    print(
        "\nproducers  reached  total s  appends s  batches/s  commits  conflicts  cold  steady  "
        "closing  commit ms p50/p95  visible ms p50/p95  consumer MB/s"
    )
    for r in runs:
        ph = r["phases"]
        rate = 1 - r["commits"] / r["attempts"] if r["attempts"] else 0.0

        def share(k: str, ph: dict[str, Any] = ph) -> str:
            return f"{ph[k]['conflicts']}/{ph[k]['attempts']}"

        c, v = r["commit_latency_s"], r["visible_latency_s"]
        done = "-" if r["appends_done_s"] is None else f"{r['appends_done_s']:.0f}"
        mb = "-" if r["consumer_mb_s"] is None else f"{r['consumer_mb_s']:.2f}"
        print(
            f"{r['producers']:9d}  {r['reached']:7d}  {r['wall_s']:7.0f}  {done:>9}  "
            f"{r['reached'] / max(r['wall_s'], 1e-9):9.1f}  {r['commits']:7d}  {rate:9.0%}  "
            f"{share('cold'):>5}  {share('steady'):>6}  {share('closing'):>7}  "
            f"{_ms(c['p50']):>8}/{_ms(c['p95']):<8}  {_ms(v['p50']):>9}/{_ms(v['p95']):<8}  "
            f"{mb:>13}"
        )
        cuts = "  ".join(
            f"{b['batches']}: {b['conflict_rate']:.0%} of {b['attempts']}" for b in r["buckets"]
        )
        print(f"           conflicts by committed batches: {cuts}")
    if starts:
        print(
            "\nfresh consumer: committed  version  segments  tail  open ms  requests  bytes  "
            "first batch ms  requests  bytes  | idle poll ms  requests  listing poll ms  "
            "requests  | last batch ms  requests  bytes"
        )
        for s in starts:
            print(
                f"{s['committed']:26d}  {s['version']:7d}  {s['segments']:8d}  {s['tail']:4d}  "
                f"{s['open_s'] * 1e3:7.0f}  {s['open_requests']:8d}  {s['open_bytes']:5d}  "
                f"{s['first_batch_s'] * 1e3:14.0f}  {s['first_batch_requests']:8d}  "
                f"{s['first_batch_bytes']:5d}  | {s['poll_s'] * 1e3:12.1f}  "
                f"{s['poll_requests']:8.1f}  {s['list_poll_s'] * 1e3:15.1f}  "
                f"{s['list_poll_requests']:8.1f}  | {s['deep_batch_s'] * 1e3:13.0f}  "
                f"{s['deep_batch_requests']:8d}  {s['deep_batch_bytes']:5d}"
            )
    print()
    for line in PAPER:
        print(line)


def acceptance(endpoint: str, server: Any, work: Path) -> dict[str, Any]:
    """8 producer processes x 200 batches and a concurrent consumer (tests/remote/test_live)."""
    env = {**os.environ, "ZEROBATCH_LIVE_FULL": "1"}
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/remote/test_live.py", "-k",
         "concurrent or killed", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    return {"returncode": done.returncode, "wall_s": time.time() - t0, "tail": done.stdout[-600:]}


def retention(server: Any, total: int = 400, k: int = 10, keep: int = 2) -> dict[str, Any]:
    """Storage with checkpoints every ``k`` steps (the newest ``keep`` live) and a reclaim
    after each, on the S3 server: bytes stored after each reclaim against all produced, and a
    restore from every live checkpoint (``tests/remote/test_retention.py``'s loop)."""
    from tests.remote.test_retention import SEGMENT, _train

    bucket = f"zb-ret-{secrets.token_hex(4)}"
    server.create_bucket(bucket)
    url = f"s3://{bucket}/live"
    sizes, states = _train(url, total, k, keep)
    from zerobatch_core import BatchNativeLoader
    from zerobatch_core.live.source import LiveSource

    restored = 0
    for mark, state in states.items():
        with LiveSource(url, timeout=5) as source:
            loader = BatchNativeLoader(source, dtype="uint32")
            loader.load_state_dict(state)
            items = iter(loader)
            for _ in range(total - mark):
                next(items)
            restored += 1
    slot = 8192  # one batch object: its header and one slot of [4, 16]
    return {
        "steps": total,
        "checkpoint_every": k,
        "live_checkpoints": keep,
        "segment_size": SEGMENT,
        "produced_bytes": total * slot,
        "stored_bytes_after_reclaims": sizes,
        "max_stored_late": max(sizes[len(sizes) // 2 :]),
        "restores_from_live_checkpoints": restored,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--policies", default="adaptive,1,10,100,adaptive-unsealed")
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--acceptance", action="store_true")
    parser.add_argument("--retention", action="store_true")
    parser.add_argument(
        "--scale",
        default=None,
        help="producer counts (e.g. 2,4,8,16): the adaptive cadence for each, then startup",
    )
    parser.add_argument("--startup", action="store_true", help="consumer startup alone")
    parser.add_argument(
        "--startup-marks",
        default="1000,5000,10000",
        help="committed batches at which a fresh consumer starts (default 1000,5000,10000)",
    )
    parser.add_argument(
        "--startup-cadence",
        default="adaptive",
        help="the filling producer's cadence for --startup: adaptive, or k to commit every k "
        "appends (more versions; default adaptive)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.worker:
        mode, *rest = args.worker
        if mode == "produce":
            produce(rest[0], int(rest[1]), int(rest[2]), rest[3], rest[4], int(rest[5]))
        elif mode == "startup":
            startup_probe(rest[0], rest[1])
        else:
            consume(rest[0], int(rest[1]), rest[2])
        return 0
    from tests.s3server import S3Server, environment

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    results: dict[str, Any] = {"load_start": os.getloadavg()[0], "runs": []}
    server = S3Server()
    work = Path(tempfile.mkdtemp(prefix="live-bench-"))
    print(f"logs: {work}")
    try:
        with environment(server.endpoint):
            if args.acceptance:
                results["acceptance"] = acceptance(server.endpoint, server, work)
                print(json.dumps(results["acceptance"], indent=2))
            elif args.retention:
                results["retention"] = retention(server)
                print(json.dumps(results["retention"], indent=2))
            elif args.scale or args.startup:
                counts = [int(n) for n in args.scale.split(",")] if args.scale else []
                marks = [int(m) for m in args.startup_marks.split(",") if m]
                cadence = args.startup_cadence
                cadence = cadence if cadence == "adaptive" else int(cadence)
                results.update(
                    scale(server, counts, args.batches, args.time_limit, marks, work, cadence)
                )
            else:
                for policy in args.policies.split(","):
                    r = run_policy(
                        server.endpoint,
                        server,
                        policy,
                        args.producers,
                        args.batches,
                        args.time_limit,
                        work,
                    )
                    results["runs"].append(r)
                    _print(r)
    finally:
        server.stop()
    results["load_end"] = os.getloadavg()[0]
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _print(r: dict[str, Any]) -> None:
    state = "stopped at the time limit" if r["stopped"] else "done"
    print(
        f"\n{r['policy']}: {r['reached']} batches committed in {r['wall_s']:.0f} s ({state}), "
        f"{r['attempts']} attempts, {r['commits']} commits, consumer read {r['consumer_read']}"
    )
    print("  batches      commits/s  batches/s  conflicts  window ms  attempt ms  consumer MB/s")
    for b in r["buckets"]:
        mb = "-" if b["consumer_mb_s"] is None else f"{b['consumer_mb_s']:.2f}"
        print(
            f"  {b['batches']:<11}  {b['commits_s']:9.1f}  {b['batches_s']:9.1f}  "
            f"{b['conflict_rate']:9.0%}  {b['window_ms']:9.1f}  {b['attempt_ms']:10.1f}  {mb:>13}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
