"""Tokens/s and peak memory per worker of ``convert --engine ray`` against the local ``convert``.

One synthetic parquet corpus (``_common.documents``, row groups of 1024 documents, about 2 MiB
of text each, so one Ray unit per row group) and a byte-level BPE (vocab 8192) trained on 4 MiB
of it, as in ``ingest_throughput.py``. Each trial runs, each in a fresh child process, with the
corpus and ``tokenizer.json`` in the page cache and dirty pages flushed before it:

``local``  ``convert(..., workers=1, shard_batches=N)``: the reference (the Rust tokenizer uses
           every core of this one process).
``ray``    ``convert_with_ray`` with ``--workers`` tokenizer actors of one CPU each on a local
           Ray cluster the child starts (``ray.init(num_cpus=os.cpu_count())``) before the
           clock starts; the cluster's start-up is reported apart.

Throughput is document tokens (BOS excluded) per second of wall time of the conversion call.
Peak memory: for ``local`` the child's ``ru_maxrss`` (``os.wait4``); for ``ray`` each Ray
worker process (a descendant of the child whose command line starts with ``ray::``: tokenizer
actors, write and output tasks) is polled every 0.1 s for its ``VmHWM`` (peak RSS, which counts
the pages of Ray's shared-memory object store the worker touched) and ``RssAnon`` (its own
heap; the largest sample). The ratios printed are Ray over local: tokens/s, and the largest
worker's peak over the local child's peak. The first trial's outputs are compared byte for
byte (manifest and checksums, which pin every shard's header and every batch)::

    python benchmarks/ray_convert_bench.py                  # 32 MiB corpus, 2 trials, 2 workers
    python benchmarks/ray_convert_bench.py --mb 64 --trials 3 --json bench-output/ray.json

Generated files live in a temporary directory under ``bench-output/`` and are removed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import (
    MIB,
    documents,
    median,
    run_child,
    scratch_dir,
    settle,
    take_bytes,
    train_bpe,
    warm,
    write_text_corpora,
)

SEQ_LEN = 1024
BATCH_SIZE = 8
SCRIPT = Path(__file__).resolve()
OUR_TASKS = ("TokenizeUnits", "Write")
"""Titles of the Ray worker processes that ran the conversion (the rest are Ray's own actors
and agents, listed apart)."""


# --- children ---------------------------------------------------------------------------------


def _child_generate(payload: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(payload["workdir"])
    spec = train_bpe(take_bytes(documents(), 4 * MIB), workdir / "tokenizer.json")
    (corpus,) = write_text_corpora([Path(payload["corpus"])], [payload["bytes"]], "parquet")
    return {"spec": spec, "documents": corpus.documents, "text_bytes": corpus.text_bytes}


def _child_local(payload: dict[str, Any]) -> dict[str, Any]:
    from zerobatch_core import convert

    start = time.perf_counter()
    summary = convert(
        [payload["corpus"]],
        payload["output"],
        seq_len=SEQ_LEN,
        batch_size=BATCH_SIZE,
        tokenizer=payload["spec"],
        shard_batches=payload["shard_batches"],
        workers=1,
    )
    return {
        "seconds": time.perf_counter() - start,
        "tokens": summary.packing["tokens"],
        "records": summary.records,
    }


def _status(pid: int) -> dict[str, int]:
    """``VmHWM`` and ``RssAnon`` of process ``pid`` in bytes (empty once it has exited)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "RssAnon"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root``, with its command line."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found.keys()
        for pid in frontier:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                found[pid] = ""
    return found


class _WorkerPeaks:
    """Poll the Ray worker processes under this one for their ``VmHWM`` and ``RssAnon``."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.peaks: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, cmd in _descendants(os.getpid()).items():
                if not cmd.startswith("ray::"):
                    continue
                now = _status(pid)
                peak = self.peaks.setdefault(pid, {"VmHWM": 0, "RssAnon": 0, "title": cmd})
                for key, value in now.items():
                    peak[key] = max(peak[key], value)
                peak["title"] = cmd if cmd.strip() != "ray::IDLE" else peak["title"]
            self._stop.wait(self.interval_s)

    def __enter__(self) -> _WorkerPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _child_ray(payload: dict[str, Any]) -> dict[str, Any]:
    import ray

    from zerobatch_core.ingest.ray_convert import convert_with_ray

    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t0
    with _WorkerPeaks() as peaks:
        start = time.perf_counter()
        summary = convert_with_ray(
            [payload["corpus"]],
            payload["output"],
            seq_len=SEQ_LEN,
            batch_size=BATCH_SIZE,
            tokenizer=payload["spec"],
            shard_batches=payload["shard_batches"],
            workers=payload["workers"],
            show_progress=False,
        )
        seconds = time.perf_counter() - start
        time.sleep(0.3)  # a last sample of the output tasks' workers
    ray.shutdown()
    workers = [p for p in peaks.peaks.values() if p["VmHWM"]]
    return {
        "seconds": seconds,
        "init_seconds": init_s,
        "tokens": summary.packing["tokens"],
        "records": summary.records,
        "workers": workers,
    }


def child(payload: dict[str, Any]) -> None:
    """Run one measurement and print its JSON report as the last line of stdout."""
    role = payload["role"]
    report = {"generate": _child_generate, "local": _child_local, "ray": _child_ray}[role](payload)
    print(json.dumps(report))


# --- orchestration ----------------------------------------------------------------------------


def _load_average() -> float:
    return os.getloadavg()[0]


def _ours(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The worker processes that ran the conversion's tasks: tokenizer actors, write tasks."""
    return [w for w in run["workers"] if any(k in w["title"] for k in OUR_TASKS)]


def _trials(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['seconds']:.2f}" for r in runs)


def _same_output(a: Path, b: Path) -> bool:
    """The two datasets have the same manifest and checksums (hence headers and batches)."""
    return all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in ("manifest.json", "checksums.xxh3")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=32, help="MiB of text in the corpus")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="Ray tokenizer actors")
    parser.add_argument("--shard-batches", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return 0

    workdir = scratch_dir("ray-convert-")
    load_start = _load_average()
    began = time.perf_counter()
    try:
        corpus = workdir / "corpus.parquet"
        gen = run_child(
            SCRIPT,
            {"role": "generate", "workdir": str(workdir), "corpus": str(corpus),
             "bytes": int(args.mb * MIB)},
        )  # fmt: skip
        spec = gen.report["spec"]
        runs: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
        for trial in range(args.trials):
            for role in ("local", "ray"):
                out = workdir / f"{role}-{trial}"
                payload = {"role": role, "corpus": str(corpus), "spec": spec,
                           "output": str(out), "shard_batches": args.shard_batches,
                           "workers": args.workers}  # fmt: skip
                warm(corpus)
                warm(workdir / "tokenizer.json")
                settle()
                res = run_child(SCRIPT, payload)
                runs[role].append({**res.report, "maxrss": res.maxrss_bytes, "wall": res.wall_s})
            if trial == 0:
                identical = _same_output(workdir / "local-0", workdir / "ray-0")
            for role in ("local", "ray"):
                shutil.rmtree(workdir / f"{role}-{trial}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_end = _load_average()

    local, ray_runs = runs["local"], runs["ray"]
    tokens = local[0]["tokens"]
    assert all(r["tokens"] == tokens for r in local + ray_runs), "token counts differ"
    local_tps = median([tokens / r["seconds"] for r in local])
    ray_tps = median([tokens / r["seconds"] for r in ray_runs])
    local_peak = median([r["maxrss"] for r in local])
    worker_peak = median([max(w["VmHWM"] for w in _ours(r)) for r in ray_runs])
    worker_anon = median([max(w["RssAnon"] for w in _ours(r)) for r in ray_runs])
    init_s = median([r["init_seconds"] for r in ray_runs])

    print(
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node()}, {os.cpu_count()} CPUs, load average {load_start:.2f} -> "
        f"{load_end:.2f}, {time.perf_counter() - began:.0f} s"
    )
    print(
        f"corpus: {gen.report['documents']:,} documents, {gen.report['text_bytes'] / MIB:.1f} MiB "
        f"text, {tokens:,} tokens; seq_len {SEQ_LEN}, batch {BATCH_SIZE}, "
        f"shard {args.shard_batches} batches; {args.trials} trials, medians"
    )
    print(f"{'engine':<8}{'seconds':>10}{'Mtok/s':>9}{'peak MiB':>10}   per trial (s)")
    print(
        f"{'local':<8}{median([r['seconds'] for r in local]):>10.2f}{local_tps / 1e6:>9.3f}"
        f"{local_peak / MIB:>10.1f}   {_trials(local)}"
    )
    print(
        f"{'ray':<8}{median([r['seconds'] for r in ray_runs]):>10.2f}{ray_tps / 1e6:>9.3f}"
        f"{worker_peak / MIB:>10.1f}   {_trials(ray_runs)}"
        f"  (+{init_s:.1f} s ray.init)"
    )
    for r in ray_runs[:1]:
        for w in sorted(r["workers"], key=lambda w: -w["VmHWM"]):
            print(
                f"  {'worker' if w in _ours(r) else 'ray own':<7} {w['title'][:48]:<48} "
                f"peak {w['VmHWM'] / MIB:7.1f} MiB, anon {w['RssAnon'] / MIB:7.1f} MiB"
            )
    print(
        f"ray / local: {ray_tps / local_tps:.2f}x tokens/s with {args.workers} workers; "
        f"largest worker peak {worker_peak / local_peak:.2f}x the local process's "
        f"(own heap, RssAnon: {worker_anon / MIB:.1f} MiB)"
    )
    print(f"outputs byte-identical: {identical}")
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs, "corpus": gen.report,
                                         "identical": identical}, indent=1))  # fmt: skip
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
