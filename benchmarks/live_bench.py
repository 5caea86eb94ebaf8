"""Live datasets: producer commits/s and consumer MB/s as the dataset grows to 10,000 batches,
for the adaptive commit cadence (DAC) and fixed cadences.

For each policy, a fresh live dataset on the loopback S3-compatible server (moto,
``tests/s3server.py``) receives ``--batches`` global batches of ``[8, 512]`` uint32 (16 KiB,
one object each) from ``--producers`` producer processes (an equal share each), while one
consumer process reads every batch as it is committed (a ``BatchNativeLoader`` over a
``LiveSource``: whole batches, each checked against its checksum, committed ones fetched
ahead). Producers log every commit attempt (time, the version's batch count, fragile window,
conflict); the consumer logs its progress. The report cuts the run into
buckets of 2,000 committed batches and gives, per bucket: producer commits/s, batches
committed/s, the conflict rate of attempts, the mean fragile window, and consumer MB/s.

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
    """A producer process: ``count`` batches, one log line per commit attempt."""
    import numpy as np

    from zerobatch_core.live.producer import LiveProducer

    segment = 10**6 if policy.endswith("unsealed") else 256
    cadence: Any = "adaptive" if policy.startswith("adaptive") else int(policy)
    p = LiveProducer(
        url, f"p-{producer}", batch_size=B, seq_len=T, cadence=cadence, segment_size=segment
    )
    attempts = commits = 0
    with open(log, "w") as out:

        def flush() -> None:
            nonlocal attempts, commits
            ok = p.stats.commits - commits  # attempts end in conflicts until the one that lands
            new = p.stats.windows[attempts:]
            for j, w in enumerate(new):
                line = {"t": time.time(), "window": w, "batches": p.base.batches}
                line["ok"] = j >= len(new) - ok
                out.write(json.dumps(line) + "\n")
            attempts, commits = len(p.stats.windows), p.stats.commits
            out.flush()

        for i in range(p.offset, count):
            row = np.arange(T, dtype=np.uint32) + np.uint32(producer * 10**6 + i)
            p.append(np.broadcast_to(row, (B, T)))
            flush()
        p.close()
        flush()
        out.write(json.dumps({"t": time.time(), "done": True, **_stats(p)}) + "\n")


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
    logs = [str(work / f"{policy}-p{k}.jsonl") for k in range(producers)]
    consumer_log = str(work / f"{policy}-consumer.jsonl")
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
        "buckets": buckets,
    }


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
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.worker:
        mode, *rest = args.worker
        if mode == "produce":
            produce(rest[0], int(rest[1]), int(rest[2]), rest[3], rest[4], int(rest[5]))
        else:
            consume(rest[0], int(rest[1]), rest[2])
        return 0
    from tests.s3server import S3Server, environment

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    results: dict[str, Any] = {"load_start": os.getloadavg()[0], "runs": []}
    server = S3Server()
    work = Path(tempfile.mkdtemp(prefix="live-bench-"))
    try:
        with environment(server.endpoint):
            if args.acceptance:
                results["acceptance"] = acceptance(server.endpoint, server, work)
                print(json.dumps(results["acceptance"], indent=2))
            elif args.retention:
                results["retention"] = retention(server)
                print(json.dumps(results["retention"], indent=2))
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
    print("  batches      commits/s  batches/s  conflicts  window ms  consumer MB/s")
    for b in r["buckets"]:
        mb = "-" if b["consumer_mb_s"] is None else f"{b['consumer_mb_s']:.2f}"
        print(
            f"  {b['batches']:<11}  {b['commits_s']:9.1f}  {b['batches_s']:9.1f}  "
            f"{b['conflict_rate']:9.0%}  {b['window_ms']:9.1f}  {mb:>13}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
