"""Long fuzz run of the LLMBATCH reader: N mutants of valid files, each through every entry point.

Run from the repository root (``tests/fuzz/README.md`` has the figures of the last run)::

    .venv/bin/python -m tests.fuzz.fuzz_reader --mutants 1000000 --workers 2

Mutant ``i`` of a run is a pure function of ``(--seed, i)`` (``mutants.random_mutant``), so any
mutant can be rebuilt from its index. The mutants are split into chunks; each chunk runs in a
worker subprocess that writes each mutant to a scratch file (on ``/dev/shm`` when there is one)
and checks it with ``mutants.check``. A worker records the index it is working on in a small
shared status file, so when a worker dies by a signal (SIGBUS, SIGSEGV, ...) or stops making
progress, the parent knows which mutant did it: it counts the signal (or hang), saves that
input, and starts a new worker on the rest of the chunk. Exceptions that are not
``ZeroBatchError`` and disagreements with the spec's reference rules are counted and saved by
the worker. The run ends with a report of inputs tried, outcomes, and failures by kind, and
exits 1 if there was any failure.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from zerobatch_spec import ErrorCode

from tests.fuzz.mutants import add_worker_arguments, check, random_mutant

FAILURE_KINDS = ("exception", "disagreement", "signal", "hang")
"""What counts as a defect: a non-ZeroBatch exception, a disagreement with the spec, a process
killed by a signal, a mutant that made no progress within the hang limit."""

OUTCOMES = ("valid", "valid-deep-invalid", *(code.value for code in ErrorCode), *FAILURE_KINDS)
"""Every outcome a worker counts (``mutants.check``'s results and the failures)."""

STATUS = struct.Struct(f"<qq{len(OUTCOMES)}q")
"""A worker's status file, shared by ``mmap``: the mutant index it is on, how many mutants it has
finished, and its count of each outcome. The parent reads it even after the worker was killed."""


def scratch_root() -> str:
    """A tmpfs directory when the machine has one, so scratch writes never touch a disk."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def save_failure(out: str, seed: int, index: int, kind: str, detail: str) -> str:
    """Write mutant ``index`` (rebuilt from the seed) and what went wrong into ``out``."""
    base, ops, data = random_mutant(seed, index)
    stem = os.path.join(out, f"{kind}-{index}")
    with open(stem + ".batch", "wb") as f:
        f.write(data)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(
            {
                "seed": seed,
                "index": index,
                "kind": kind,
                "base": base,
                "ops": ops,
                "detail": detail,
            },
            f,
            indent=1,
            default=lambda b: b.hex() if isinstance(b, bytes) else str(b),
        )
    return stem + ".batch"


# -- worker ---------------------------------------------------------------------------------


def run_worker(
    seed: int, start: int, stop: int, status_path: str, out: str, crash_at: int = -1
) -> None:
    """Check mutants ``start..stop``, keeping the status file current after every mutant.

    Failures are saved to ``out`` and appended to ``<status_path>.failures`` (one JSON object a
    line) as they happen, so nothing is lost if a later mutant kills the process. ``crash_at``
    makes the worker send itself SIGBUS on that mutant: a check of the harness (the run must
    then report exactly one signal, at that index, and go on).
    """
    # Beside the status file, in the parent's work directory (tmpfs when there is one), which
    # the parent removes at the end even if this process is killed.
    path = status_path + ".batch"
    counts = [0] * len(OUTCOMES)
    slot = {name: i for i, name in enumerate(OUTCOMES)}
    with open(status_path, "r+b") as sf:
        status = mmap.mmap(sf.fileno(), STATUS.size)
    log = open(status_path + ".failures", "a", encoding="utf-8")  # noqa: SIM115
    try:
        for index in range(start, stop):
            STATUS.pack_into(status, 0, index, index - start, *counts)
            if index == crash_at:
                os.kill(os.getpid(), signal.SIGBUS)
            _, _, data = random_mutant(seed, index)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            try:
                counts[slot[check(path, data)]] += 1
                continue
            except AssertionError as e:
                kind, detail = "disagreement", f"{e}\n{traceback.format_exc()}"
            except Exception as e:  # anything but the oracle's outcomes is a defect
                kind, detail = "exception", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            counts[slot[kind]] += 1
            saved = save_failure(out, seed, index, kind, detail)
            failure = {"index": index, "kind": kind, "detail": detail[:2000], "saved": saved}
            log.write(json.dumps(failure) + "\n")
            log.flush()
        STATUS.pack_into(status, 0, stop, stop - start, *counts)
    finally:
        log.close()
        status.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


# -- parent ---------------------------------------------------------------------------------


@dataclass
class Job:
    """One worker process running mutants ``start..stop``."""

    start: int
    stop: int
    proc: subprocess.Popen[bytes]
    status_path: str
    stderr: IO[str]
    last_index: int = -1
    last_progress: float = field(default_factory=time.monotonic)
    hung: bool = False

    def status(self) -> tuple[int, int, dict[str, int]]:
        """The mutant the worker is on, how many it finished, and its outcome counts."""
        with open(self.status_path, "rb") as f:
            index, done, *counts = STATUS.unpack(f.read(STATUS.size))
        return index, done, dict(zip(OUTCOMES, counts, strict=True))


@dataclass
class Totals:
    tried: int = 0
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return self.outcomes[kind]


def chunks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    for first in range(start, stop, size):
        yield first, min(first + size, stop)


def launch(seed: int, start: int, stop: int, out: str, work: str, crash_at: int) -> Job:
    status_path = os.path.join(work, f"status-{start}")
    with open(status_path, "wb") as f:
        f.write(STATUS.pack(start, 0, *[0] * len(OUTCOMES)))
    stderr = open(os.path.join(work, f"stderr-{start}.txt"), "w+", encoding="utf-8")  # noqa: SIM115
    argv = [sys.executable, "-m", "tests.fuzz.fuzz_reader", "--worker"]
    argv += ["--seed", str(seed), "--start", str(start), "--stop", str(stop)]
    argv += ["--status", status_path, "--out", out, "--crash-at", str(crash_at)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
    return Job(start, stop, proc, status_path, stderr)


def finish(job: Job, seed: int, out: str, totals: Totals) -> tuple[int, int] | None:
    """Account for a worker that ended; return the range still to run if it died early."""
    rc = job.proc.returncode
    job.stderr.seek(0)
    err = job.stderr.read()
    job.stderr.close()
    index, done, counts = job.status()
    totals.outcomes.update(counts)
    totals.tried += done
    if os.path.exists(job.status_path + ".failures"):
        with open(job.status_path + ".failures", encoding="utf-8") as f:
            totals.failures.extend(json.loads(line) for line in f)
    if rc == 0 and done == job.stop - job.start:
        return None
    # Died (a signal, a kill after a hang, an error of the harness) while on mutant ``index``.
    kind = "hang" if job.hung else "signal" if rc < 0 else "exception"
    how = signal.Signals(-rc).name if rc < 0 else f"exit status {rc}"
    detail = f"worker ended ({how}) on mutant {index}\n{err[-4000:]}"
    saved = save_failure(out, seed, index, kind, detail)
    totals.outcomes[kind] += 1
    totals.failures.append({"index": index, "kind": kind, "detail": detail[:2000], "saved": saved})
    totals.tried += 1  # the mutant that ended it
    return (index + 1, job.stop) if index + 1 < job.stop else None


def run(args: argparse.Namespace) -> int:
    out = args.out or tempfile.mkdtemp(prefix="zerobatch-fuzz-failures-")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="zerobatch-fuzz-status-", dir=scratch_root())
    pending = collections.deque(chunks(0, args.mutants, args.chunk))
    running: list[Job] = []
    totals = Totals()
    began = time.monotonic()
    last_report = began
    try:
        while pending or running:
            while pending and len(running) < args.workers:
                start, stop = pending.popleft()
                running.append(launch(args.seed, start, stop, out, work, args.crash_at))
            time.sleep(0.2)
            now = time.monotonic()
            for job in list(running):
                if job.proc.poll() is None:
                    index = job.status()[0]
                    if index != job.last_index:
                        job.last_index, job.last_progress = index, now
                        continue
                    if now - job.last_progress <= args.hang_seconds:
                        continue
                    job.hung = True
                    job.proc.kill()
                    job.proc.wait()
                running.remove(job)
                rest = finish(job, args.seed, out, totals)
                if rest is not None:
                    pending.appendleft(rest)
            if now - last_report > args.report_seconds:
                last_report = now
                done = totals.tried + sum(j.status()[1] for j in running)
                rate = done / (now - began)
                print(
                    f"... {done:,} mutants, {rate:,.0f}/s, failures "
                    + ", ".join(f"{k} {totals.count(k)}" for k in FAILURE_KINDS),
                    flush=True,
                )
    finally:
        for job in running:
            job.proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - began
    summary = {
        "mutants": totals.tried,
        "seed": args.seed,
        "workers": args.workers,
        "wall_seconds": round(wall, 1),
        "outcomes": dict(sorted(totals.outcomes.items())),
        "failures": {k: totals.count(k) for k in FAILURE_KINDS},
        "failure_inputs": [f["saved"] for f in totals.failures],
    }
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(f"inputs tried: {totals.tried:,} (seed {args.seed}, {args.workers} worker(s))")
    print(f"wall time: {wall:,.1f} s ({totals.tried / wall:,.0f} mutants/s)")
    print("outcomes:")
    for name, n in sorted(totals.outcomes.items(), key=lambda kv: -kv[1]):
        if name not in FAILURE_KINDS and n:
            print(f"  {name:<24} {n:>10,}")
    print(f"non-ZeroBatch exceptions: {totals.count('exception')}")
    print(f"disagreements with the spec: {totals.count('disagreement')}")
    print(f"signals: {totals.count('signal')}")
    print(f"hangs: {totals.count('hang')}")
    for failure in totals.failures[:20]:
        print(
            f"  {failure['kind']} at mutant {failure['index']}: {failure['saved']}\n"
            f"    {failure['detail'][:300]}"
        )
    print(f"summary and failing inputs: {out}")
    return 1 if any(totals.count(k) for k in FAILURE_KINDS) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz.fuzz_reader",
        description="Fuzz the LLMBATCH reader with mutants of valid files (tests/fuzz/README.md).",
    )
    parser.add_argument("--mutants", type=int, default=1_000_000, help="default: %(default)s")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    parser.add_argument("--chunk", type=int, default=20_000, help="mutants per worker process")
    parser.add_argument("--out", default=None, help="where failing inputs and summary.json go")
    parser.add_argument("--hang-seconds", type=float, default=60.0, help="a mutant's time limit")
    parser.add_argument("--report-seconds", type=float, default=30.0, help="progress interval")
    parser.add_argument(
        "--crash-at",
        type=int,
        default=-1,
        help="harness self-check: the worker on this mutant kills itself with SIGBUS",
    )
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args.seed, args.start, args.stop, args.status, args.out, args.crash_at)
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
