"""The machinery every fuzz run of ``tests/fuzz`` shares, and the CI tests' scaffolding.

A run splits its mutants into chunks; each chunk runs in a worker subprocess (``python -m
<the fuzzer's module> --worker``) that keeps a small status file, shared with the parent
through ``mmap``, current: the mutant it is on, the stage of that mutant it is in (an entry
point; -1 when the fuzzer has none), how many mutants it finished, and a count per *slot* (an
outcome, or an ``(entry point, result)`` pair). So when a worker dies by a signal (SIGBUS,
SIGSEGV, an abort in C++ code) or makes no progress for the hang limit, the parent knows the
mutant and the stage, counts it, and starts a new worker on the rest of the chunk. Failures a
worker sees itself are appended to ``<status>.failures``, one JSON object a line, as they
happen, so nothing is lost if a later mutant kills the process.

What a fuzzer brings:

* a ``Fleet``: its module, the slots its workers count (``Layout``), which of them are
  findings, and how its progress line reads;
* the worker's step, ``step(worker, index)``, run by ``serve`` for each mutant of the chunk;
* what the parent records for a mutant that ended a worker (``died(ended)``), given to
  ``run_workers``;
* its command line: ``parser`` gives the options every run has.

The *campaigns* (dataset directories, live datasets, MDS, Atlas: mutants of a directory tree,
each through several entry points) share a whole front end here: ``Campaign`` and
``campaign_main``. The reader, Hugging Face and Megatron runs, which count one outcome per
mutant, use the machinery directly.
"""

from __future__ import annotations

import argparse
import collections
import json
import mmap
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tests.fuzz.mutants import OUTSIDE, Op, Tree, materialize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository root, where workers run (``python -m tests.fuzz...``)."""

ADDRESS_SPACE = 2 << 30
"""A worker's ``RLIMIT_AS`` (``limit_address_space``): a mutant that asks for more gets a
``MemoryError`` (pyarrow: an ``ArrowMemoryError``) instead of swapping."""


def scratch_root() -> str:
    """A tmpfs directory when the machine has one, so scratch writes never touch a disk."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def limit_address_space() -> None:
    """Put this process under ``ADDRESS_SPACE``."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def chunks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    for first in range(start, stop, size):
        yield first, min(first + size, stop)


# -- status files ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """What a worker's status file says."""

    index: int
    """The mutant the worker is on (its ``stop`` once it finished)."""
    stage: int
    """The stage of that mutant it is in, -1 when none."""
    done: int
    """Mutants finished."""
    counts: dict[Hashable, int]


class Layout:
    """A worker's status file: the mutant it is on, its stage, mutants finished, and a count per
    slot, as little-endian int64s. The parent reads it even after the worker was killed."""

    def __init__(self, slots: Sequence[Hashable]) -> None:
        self.slots = tuple(slots)
        self.where = {slot: i for i, slot in enumerate(self.slots)}
        self.struct = struct.Struct(f"<qqq{len(self.slots)}q")

    def create(self, path: str, start: int) -> None:
        with open(path, "wb") as f:
            f.write(self.struct.pack(start, -1, 0, *[0] * len(self.slots)))

    def read(self, path: str) -> Status:
        with open(path, "rb") as f:
            index, stage, done, *counts = self.struct.unpack(f.read(self.struct.size))
        return Status(index, stage, done, dict(zip(self.slots, counts, strict=True)))


def kind_of(slot: Hashable) -> Hashable:
    """The outcome a slot counts: the slot itself, or the result of an ``(entry, result)``."""
    return slot[-1] if isinstance(slot, tuple) else slot


# -- worker side -----------------------------------------------------------------------------


class Worker:
    """A worker process's side of its status file, and a scratch directory beside it (in the
    run's work directory, which the parent removes at the end even if this process is
    killed)."""

    def __init__(self, layout: Layout, status_path: str, start: int) -> None:
        self.layout, self.start = layout, start
        self.counts = [0] * len(layout.slots)
        with open(status_path, "r+b") as sf:
            self._status = mmap.mmap(sf.fileno(), layout.struct.size)
        self._log = open(status_path + ".failures", "a", encoding="utf-8")  # noqa: SIM115
        self.scratch = tempfile.mkdtemp(prefix="m-", dir=os.path.dirname(status_path))

    def at(self, index: int, stage: int = -1) -> None:
        """Record that this worker is on mutant ``index``, stage ``stage``."""
        done = index - self.start
        self.layout.struct.pack_into(self._status, 0, index, stage, done, *self.counts)

    def count(self, slot: Hashable) -> None:
        self.counts[self.layout.where[slot]] += 1

    def failure(self, record: dict[str, Any]) -> None:
        """Append a failure to the log the parent reads when this worker ends."""
        self._log.write(json.dumps(record, default=str) + "\n")
        self._log.flush()

    def close(self) -> None:
        self._log.close()
        self._status.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def serve(layout: Layout, args: argparse.Namespace, step: Callable[[Worker, int], None]) -> int:
    """The worker process: ``step(worker, index)`` for mutants ``args.start..args.stop``, the
    status file current before each; stops early if the run that started it is gone."""
    worker = Worker(layout, args.status, args.start)
    parent = os.getppid()
    try:
        for index in range(args.start, args.stop):
            if os.getppid() != parent:  # the run was killed: stop instead of running orphaned
                return 0
            worker.at(index)
            step(worker, index)
        worker.at(args.stop)
    finally:
        worker.close()
    return 0


def sabotage(
    index: int,
    crash_at: int,
    hang_at: int = -1,
    crash: Callable[[], object] = lambda: os.kill(os.getpid(), signal.SIGBUS),
) -> None:
    """The harness's self-checks: on mutant ``crash_at`` the worker crashes (SIGBUS unless
    ``crash`` says otherwise), on ``hang_at`` it hangs; the run must count one signal or hang
    there and go on with the rest of the chunk."""
    if index == crash_at:
        crash()
    if index == hang_at:
        time.sleep(3600)


def attempt(fn: Callable[[], str], findings: Sequence[str]) -> tuple[str, str]:
    """``fn``'s outcome (and no detail), or the finding its exception is, with the traceback:
    a disagreement (``AssertionError``), a ``MemoryError`` when ``memory`` is a finding of the
    run, else an exception."""
    try:
        return fn(), ""
    except AssertionError as e:
        return "disagreement", f"{e}\n{traceback.format_exc()}"
    except Exception as e:  # anything but the oracle's outcomes is a failure
        kind = "memory" if isinstance(e, MemoryError) and "memory" in findings else "exception"
        return kind, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


def save_input(
    out: str,
    record: dict[str, Any],
    data: bytes,
    suffix: str,
) -> str:
    """Save a failing mutant as ``<kind>-<index><suffix>`` in ``out``, with ``record`` (seed,
    index, kind, base, ops, detail) beside it as ``.json``; the path without the suffix."""
    stem = os.path.join(out, f"{record['kind']}-{record['index']}")
    with open(stem + suffix, "wb") as f:
        f.write(data)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(
            record, f, indent=1, default=lambda b: b.hex() if isinstance(b, bytes) else str(b)
        )
    return stem


# -- parent side -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """How a fuzzer's parent runs its workers."""

    module: str
    """The fuzzer's module, run as ``python -m <module> --worker ...``."""
    layout: Layout
    findings: tuple[str, ...]
    """The outcomes (or results) that are defects: listed in the progress line."""
    label: str = "findings"
    """What the progress line calls them."""
    rate_digits: int = 0
    """Decimals of the progress line's mutants per second."""
    poll_seconds: float = 0.2


@dataclass
class Job:
    """One worker process running mutants ``start..stop``."""

    start: int
    stop: int
    proc: subprocess.Popen[bytes]
    status_path: str
    stderr: IO[str]
    layout: Layout
    last: tuple[int, int] = (-1, -1)
    last_progress: float = field(default_factory=time.monotonic)
    hung: bool = False

    def status(self) -> Status:
        return self.layout.read(self.status_path)


@dataclass(frozen=True)
class Ended:
    """A worker that ended before finishing its range: the mutant (and stage) it was on."""

    index: int
    stage: int
    kind: str
    """``hang`` (killed by the parent), ``signal`` or ``exception`` (an error of the harness)."""
    returncode: int
    stderr: str

    @property
    def how(self) -> str:
        rc = self.returncode
        return signal.Signals(-rc).name if rc < 0 else f"exit status {rc}"

    def describe(self) -> str:
        return f"worker ended ({self.how}) on mutant {self.index}\n{self.stderr[-4000:]}"


@dataclass
class Totals:
    tried: int = 0
    counts: collections.Counter[Any] = field(default_factory=collections.Counter)
    """A count per slot: an outcome, or an ``(entry, result)`` pair."""
    failures: list[dict[str, Any]] = field(default_factory=list)

    def findings(self, kind: str) -> int:
        return sum(n for slot, n in self.counts.items() if kind_of(slot) == kind)


@dataclass
class Run:
    """What ``run_workers`` gives: the totals, the wall time, and why it stopped early (``""``
    when it did not)."""

    totals: Totals
    wall: float
    stopped: str

    def figures(self, args: argparse.Namespace) -> dict[str, Any]:
        """The head of a run's summary."""
        return {
            "mutants": self.totals.tried,
            "seed": args.seed,
            "workers": args.workers,
            "wall_seconds": round(self.wall, 1),
        }

    def head(
        self,
        say: Callable[[str], None],
        args: argparse.Namespace,
        noun: str = "inputs tried",
        rate_digits: int = 0,
    ) -> None:
        """The first two lines of a run's report: mutants and wall time."""
        tried, wall = self.totals.tried, self.wall
        say(f"{noun}: {tried:,} (seed {args.seed}, {args.workers} worker(s))")
        say(f"wall time: {wall:,.1f} s ({tried / max(wall, 1e-9):,.{rate_digits}f} mutants/s)")


def say_outcomes(say: Callable[[str], None], counts: Any, names: Sequence[str], width: int) -> None:
    """The outcomes part of a report: each of ``names`` that was counted, in that order."""
    say("outcomes:")
    for name in names:
        if counts[name]:
            say(f"  {name:<{width}} {counts[name]:>10,}")


def say_saved_failures(say: Callable[[str], None], failures: list[dict[str, Any]]) -> None:
    """The first 20 failures, each with where its input was saved."""
    for failure in failures[:20]:
        say(f"  {failure['kind']} at mutant {failure['index']}: {failure['saved']}")
        say(f"    {failure['detail'][:300]}")


def launch(fleet: Fleet, seed: int, start: int, stop: int, work: str, extra: list[str]) -> Job:
    status_path = os.path.join(work, f"status-{start}")
    fleet.layout.create(status_path, start)
    stderr = open(os.path.join(work, f"stderr-{start}.txt"), "w+", encoding="utf-8")  # noqa: SIM115
    argv = [sys.executable, "-m", fleet.module, "--worker", "--seed", str(seed)]
    argv += ["--start", str(start), "--stop", str(stop), "--status", status_path, *extra]
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
    return Job(start, stop, proc, status_path, stderr, fleet.layout)


def _collect(job: Job, totals: Totals) -> Status:
    """Add what a worker that ended finished (its counts, its failures) to ``totals``."""
    status = job.status()
    totals.counts.update(status.counts)
    totals.tried += status.done
    failures = job.status_path + ".failures"
    if os.path.exists(failures):
        with open(failures, encoding="utf-8") as f:
            totals.failures.extend(json.loads(line) for line in f)
        os.remove(failures)
    return status


def _finish(
    job: Job, totals: Totals, died: Callable[[Ended], tuple[Hashable, dict[str, Any]]]
) -> tuple[int, int] | None:
    """Account for a worker that ended; return the range still to run if it died early."""
    rc = job.proc.returncode
    job.stderr.seek(0)
    err = job.stderr.read()
    job.stderr.close()
    status = _collect(job, totals)
    if rc == 0 and status.done == job.stop - job.start:
        return None
    kind = "hang" if job.hung else "signal" if rc < 0 else "exception"
    slot, failure = died(Ended(status.index, status.stage, kind, rc, err))
    totals.counts[slot] += 1
    totals.failures.append(failure)
    totals.tried += 1  # the mutant that ended it
    return (status.index + 1, job.stop) if status.index + 1 < job.stop else None


def _stuck(job: Job, now: float, hang_seconds: float) -> bool:
    """Whether a running worker has been on one mutant for more than ``hang_seconds``."""
    status = job.status()
    if (status.index, status.stage) != job.last:
        if status.index != job.last[0]:
            job.last_progress = now
        job.last = (status.index, status.stage)
        return False
    return now - job.last_progress > hang_seconds


def run_workers(
    fleet: Fleet,
    args: argparse.Namespace,
    extra: list[str],
    died: Callable[[Ended], tuple[Hashable, dict[str, Any]]],
    say: Callable[[str], None],
    max_seconds: float | None = None,
) -> Run:
    """Run mutants ``0..args.mutants`` in chunks of ``args.chunk`` on ``args.workers`` worker
    processes (each given ``extra`` on its command line), killing a worker that makes no
    progress for ``args.hang_seconds`` and printing progress every ``args.report_seconds``.

    ``died(ended)`` gives the slot to count and the failure to record for the mutant that
    ended a worker early. With ``max_seconds`` (0: no limit) the run stops after that long, or
    at a keyboard interrupt, and counts what each worker finished; without it an interrupt
    ends the run.
    """
    name = fleet.module.rsplit(".", 1)[-1].replace("_", "-")
    work = tempfile.mkdtemp(prefix=f"zerobatch-{name}-", dir=scratch_root())
    pending = collections.deque(chunks(0, args.mutants, args.chunk))
    running: list[Job] = []
    totals = Totals()
    began = last_report = time.monotonic()
    stopped = ""
    try:
        while pending or running:
            if max_seconds and time.monotonic() - began > max_seconds:
                stopped = f"time limit of {max_seconds:g} s"
                break
            while pending and len(running) < args.workers:
                start, stop = pending.popleft()
                running.append(launch(fleet, args.seed, start, stop, work, extra))
            time.sleep(fleet.poll_seconds)
            now = time.monotonic()
            for job in list(running):
                if job.proc.poll() is None:
                    if not _stuck(job, now, args.hang_seconds):
                        continue
                    job.hung = True
                    job.proc.kill()
                    job.proc.wait()
                running.remove(job)
                rest = _finish(job, totals, died)
                if rest is not None:
                    pending.appendleft(rest)
            if now - last_report > args.report_seconds:
                last_report = now
                done = totals.tried + sum(j.status().done for j in running)
                say(
                    f"... {done:,} mutants, {done / (now - began):,.{fleet.rate_digits}f}/s, "
                    f"{fleet.label} "
                    + ", ".join(f"{k} {totals.findings(k)}" for k in fleet.findings)
                )
    except KeyboardInterrupt:
        if max_seconds is None:
            raise
        stopped = "interrupted"
    finally:
        for job in running:  # stopped early: count what each worker finished
            job.proc.kill()
            job.proc.wait()
            if stopped:
                job.stderr.close()
                _collect(job, totals)
        shutil.rmtree(work, ignore_errors=True)
    return Run(totals, time.monotonic() - began, stopped)


def say_flushed(line: str) -> None:
    print(line, flush=True)


SaveFailure = Callable[[str, int, int, str, str], str]
"""``save(out, seed, index, kind, detail)``: save failing mutant ``index`` of seed ``seed`` and
what went wrong into ``out``; returns the path it was saved at."""


def saved_failure(
    save: SaveFailure, out: str, seed: int, index: int, kind: str, detail: str
) -> dict[str, Any]:
    """A failure as a run that saves failing inputs lists it, its input saved into ``out``."""
    saved = save(out, seed, index, kind, detail)
    return {"index": index, "kind": kind, "detail": detail[:2000], "saved": saved}


def run_saving(
    fleet: Fleet,
    args: argparse.Namespace,
    save: SaveFailure,
    prefix: str,
    say: Callable[[str], None],
) -> tuple[Run, str]:
    """``run_workers`` for a run that saves each failing input into ``--out`` (without it, a
    new temporary directory named ``prefix...``), its workers told ``--out`` and
    ``--crash-at``; the run and the directory."""
    out = args.out or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(out, exist_ok=True)

    def died(ended: Ended) -> tuple[Hashable, dict[str, Any]]:
        detail = ended.describe()
        return ended.kind, saved_failure(save, out, args.seed, ended.index, ended.kind, detail)

    extra = ["--out", out, "--crash-at", str(args.crash_at)]
    return run_workers(fleet, args, extra, died, say), out


# -- command line ----------------------------------------------------------------------------


def parser(
    module: str,
    description: str,
    *,
    mutants: int,
    chunk: int,
    hang_seconds: float,
    report_seconds: float = 30.0,
    out: bool = False,
) -> argparse.ArgumentParser:
    """A fuzzer's command line with the options every run has (``--out`` when ``out``), and
    the hidden ones by which a run hands a worker process its mutants (``--start`` to
    ``--stop``) and the file it reports progress in (``--status``)."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    p.add_argument("--mutants", type=int, default=mutants, help="default: %(default)s")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    p.add_argument("--chunk", type=int, default=chunk, help="mutants per worker process")
    if out:
        p.add_argument("--out", default=None, help="where failing inputs and summary.json go")
    p.add_argument("--hang-seconds", type=float, default=hang_seconds, help="a mutant's time limit")
    p.add_argument("--report-seconds", type=float, default=report_seconds, help="progress interval")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--status", default=None, help=argparse.SUPPRESS)
    return p


# -- campaigns: mutants of a tree, each through several entry points ---------------------------

RESULTS = ("ok", "error", "exception", "memory", "disagreement", "loss", "signal", "hang")
"""What one entry point of one mutant can give: it works, a ZeroBatch error, or a finding."""

FINDINGS = ("exception", "memory", "disagreement", "loss", "signal", "hang")
"""The results that are defects."""

ROOT_DOCUMENTS = ("manifest.json", "live.json")
"""The document that makes a directory a dataset or a live dataset: without it the path is
not one, and ``FileNotFoundError`` (as for any missing path) is a valid answer."""


@dataclass(frozen=True)
class Campaign:
    """One fuzz target: how to draw mutant ``i`` and how to check it, entry point by entry
    point."""

    module: str
    mutant: Callable[[int, int], tuple[int, list[Op], Tree]]
    entries: tuple[str, ...]
    bases: Callable[[], tuple[Tree, ...]]
    apply: Callable[[Tree, list[Op]], Tree]
    check: Callable[[str, int, list[Op], Callable[[int], None]], list[tuple[str, str, str]]]
    """``check(root, index, ops, at)``: runs every entry point on mutant ``index`` (``ops``)
    materialised at ``root``, calling ``at(k)`` before entry point ``k``; returns ``(entry,
    result, detail)`` per entry point."""

    @property
    def fleet(self) -> Fleet:
        slots = [(e, r) for e in self.entries for r in RESULTS]
        return Fleet(self.module, Layout(slots), FINDINGS, rate_digits=1)


def outcome(
    fn: Callable[[], Any], allowed: tuple[type[BaseException], ...] = ()
) -> tuple[str, str]:
    """Run ``fn``: ``("ok", "")``, ``("error", message)`` for a ZeroBatch error (or
    ``allowed``, or ``FileNotFoundError`` of the root document), or a finding with its
    traceback."""
    from zerobatch_core import ZeroBatchError

    accepted: tuple[type[BaseException], ...] = (ZeroBatchError, *allowed)
    try:
        fn()
    except MemoryError as e:
        return "memory", _describe(e)
    except accepted as e:
        return "error", f"{type(e).__name__}: {str(e)[:300]}"
    except FileNotFoundError as e:
        # The path is not a dataset at all (no manifest, no descriptor): the library's answer
        # for any path that does not exist, as ``open`` gives it. Anything else missing (a
        # segment or an object a manifest lists) is the dataset's fault and a finding.
        if os.path.basename(str(e.filename)) in ROOT_DOCUMENTS:
            return "error", f"{type(e).__name__}: {str(e)[:300]}"
        return "exception", _describe(e)
    except AssertionError as e:
        return "disagreement", _describe(e)
    except Exception as e:
        return "exception", _describe(e)
    return "ok", ""


Step = tuple[str, Callable[[], object], tuple[type[BaseException], ...]]
"""An entry point of a campaign's check: its name, what it runs, and the exceptions besides
ZeroBatch's own that count as its refusals (``outcome``)."""


def run_entries(steps: Sequence[Step], at: Callable[[int], None]) -> list[tuple[str, str, str]]:
    """``(entry, result, detail)`` of each step in order, calling ``at(k)`` before step
    ``k``."""
    results = []
    for k, (entry, fn, allowed) in enumerate(steps):
        at(k)
        result, detail = outcome(fn, allowed)
        results.append((entry, result, detail))
    return results


def _describe(e: BaseException) -> str:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{type(e).__name__}: {str(e)[:500]}\n{text[-6000:]}"


def top_frame(detail: str) -> str:
    """The innermost frame of ZeroBatch's own code in a traceback (else the innermost)."""
    frames = [line.strip() for line in detail.splitlines() if line.strip().startswith("File ")]
    own = [f for f in frames if "zerobatch_" in f or "/spec/" in f]
    chosen = (own or frames or ["?"])[-1]
    return chosen.replace(os.getcwd() + "/", "")


def build_mutant(campaign: Campaign, seed: int, index: int, root: str) -> tuple[list[Op], Tree]:
    """Materialise mutant ``index`` at ``root`` (``outside.batch`` beside it)."""
    _, ops, tree = campaign.mutant(seed, index)
    build_tree(tree, root)
    return ops, tree


def build_tree(tree: Tree, root: str) -> None:
    """Materialise ``tree`` at ``root``, with ``outside.batch`` beside it."""
    with open(os.path.join(os.path.dirname(root), "outside.batch"), "wb") as f:
        f.write(OUTSIDE)
    os.makedirs(root)
    materialize(tree, root)


def campaign_worker(campaign: Campaign, args: argparse.Namespace) -> int:
    """Check mutants ``args.start..args.stop`` under the address-space limit; each finding is
    logged for the parent."""
    limit_address_space()

    def step(worker: Worker, index: int) -> None:
        root = os.path.join(worker.scratch, "ds")
        ops, _ = build_mutant(campaign, args.seed, index, root)
        for entry, result, detail in campaign.check(
            root, index, ops, lambda k: worker.at(index, k)
        ):
            worker.count((entry, result))
            if result in FINDINGS:
                worker.failure({"index": index, "entry": entry, "kind": result, "detail": detail})
        shutil.rmtree(root, ignore_errors=True)

    return serve(campaign.fleet.layout, args, step)


def record_findings(
    campaign: Campaign, seed: int, failures: list[dict[str, Any]], findings: str, repro: str
) -> int:
    """Append the findings not yet listed in ``findings`` (by entry point, exception type and
    top frame), saving each one's mutant under ``repro``; returns how many were new."""
    keys_path = findings + ".keys.json"
    known: dict[str, str] = {}
    if os.path.exists(keys_path):
        with open(keys_path, encoding="utf-8") as f:
            known = json.load(f)
    new = 0
    for failure in failures:
        detail = failure["detail"]
        first = detail.splitlines()[0] if detail else ""
        exc = first.split(":", 1)[0] if failure["kind"] not in ("hang", "signal") else ""
        frame = re.sub(r", line \d+", "", top_frame(detail))  # lines move as code changes
        key = f"{campaign.module}|{failure['entry']}|{failure['kind']}|{exc}|{frame}"
        if key in known:
            continue
        ident = f"{campaign.module.rsplit('_', 1)[-1]}-{len(known) + 1:03d}"
        known[key] = ident
        new += 1
        where = os.path.join(repro, ident)
        _, ops, tree = campaign.mutant(seed, failure["index"])
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
        for name, data in tree[0].items():
            if name.endswith((".json", ".xxh3")) or len(data) < 1 << 16:
                path = os.path.join(where, "files", *name.split("/"))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
        with open(os.path.join(where, "mutant.json"), "w", encoding="utf-8") as f:
            json.dump({"seed": seed, "index": failure["index"], "ops": ops,
                       "special": tree[1], **failure}, f, indent=1, default=str)  # fmt: skip
        command = f".venv/bin/python -m {campaign.module} --replay {seed}:{failure['index']}"
        with open(findings, "a", encoding="utf-8") as f:
            f.write(
                f"\n## {ident}: {failure['kind']} in {failure['entry']} "
                f"({campaign.module.rsplit('.', 1)[-1]})\n\n"
                f"- exception: `{first[:300]}`\n- top frame: `{top_frame(detail)[:300]}`\n"
                f"- mutations: `{json.dumps(ops, default=str)[:600]}`"
                + (f"; special files {tree[1]}" if tree[1] else "")
                + f"\n- reproduce (from /work/main): `{command}`\n- saved: `{where}/`\n"
            )
    with open(keys_path, "w", encoding="utf-8") as f:
        json.dump(known, f, indent=1)
    return new


def run_campaign(campaign: Campaign, args: argparse.Namespace) -> int:
    def died(ended: Ended) -> tuple[Hashable, dict[str, Any]]:
        stage, kind, rc = ended.stage, ended.kind, ended.returncode
        entry = campaign.entries[stage] if 0 <= stage < len(campaign.entries) else "build"
        how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
        detail = (
            f"worker ended ({how}, {kind}) on mutant {ended.index}, entry point {entry}\n"
            f"{ended.stderr[-3000:]}"
        )
        return (entry, kind), {"index": ended.index, "entry": entry, "kind": kind, "detail": detail}

    result = run_workers(campaign.fleet, args, [], died, say_flushed, args.max_seconds)
    totals, stopped = result.totals, result.stopped
    if stopped:
        print(f"stopped early ({stopped}): the figures cover the mutants finished")
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            json.dump(
                {
                    **result.figures(args),
                    "stopped": stopped or None,
                    "results": {f"{e}:{r}": n for (e, r), n in sorted(totals.counts.items())},
                    "findings": {k: totals.findings(k) for k in FINDINGS},
                    "failures": [
                        {k: f[k] for k in ("index", "entry", "kind")}
                        | {"detail": f["detail"][:400]}
                        for f in totals.failures[:50]
                    ],
                },
                f,
                indent=1,
            )
    new = 0
    if args.findings:
        os.makedirs(args.repro, exist_ok=True)
        new = record_findings(campaign, args.seed, totals.failures, args.findings, args.repro)
    result.head(print, args, rate_digits=1)
    print("results by entry point:")
    for entry in campaign.entries:
        row = {r: totals.counts[entry, r] for r in RESULTS if totals.counts[entry, r]}
        print(f"  {entry:<14} " + ", ".join(f"{r} {n:,}" for r, n in row.items()))
    for kind in FINDINGS:
        print(f"{kind}: {totals.findings(kind)}")
    print(f"distinct findings new to {args.findings}: {new}" if args.findings else "")
    return 1 if any(totals.findings(k) for k in FINDINGS) else 0


def replay_campaign(campaign: Campaign, spec: str, ops_json: str | None = None) -> int:
    """Rebuild mutant ``SEED:INDEX`` (with ``ops_json``: base ``INDEX`` modulo the number of
    bases, with those mutations) in a scratch directory under the address-space limit and run
    every entry point on it, printing each result and its message or traceback. Exits 1 on a
    finding."""
    seed, index = (int(part) for part in spec.split(":"))
    limit_address_space()
    work = tempfile.mkdtemp(prefix="zerobatch-replay-")
    findings = 0
    try:
        root = os.path.join(work, "ds")
        if ops_json is None:
            ops, _ = build_mutant(campaign, seed, index, root)
        else:
            ops = [tuple(op) for op in json.loads(ops_json)]
            bases = campaign.bases()
            build_tree(campaign.apply(bases[index % len(bases)], ops), root)
        print(f"mutant {seed}:{index} at {root}\nops: {json.dumps(ops, default=str)}")
        for entry, result, detail in campaign.check(root, index, ops, lambda k: None):
            print(f"{entry}: {result}")
            findings += result in FINDINGS
            if detail:
                print(detail)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if findings else 0


def campaign_main(campaign: Campaign, argv: list[str] | None = None, mutants: int = 100_000) -> int:
    """A campaign's command line (``tests/fuzz/README.md`` lists its options)."""
    p = parser(
        campaign.module,
        "Fuzz ZeroBatch's metadata readers with mutants (tests/fuzz/README.md).",
        mutants=mutants,
        chunk=2_000,
        hang_seconds=10.0,
    )
    p.add_argument(
        "--findings", default=None, help="markdown file the distinct findings are appended to"
    )
    p.add_argument(
        "--repro", default="fuzz-repro", help="where each distinct finding's mutant is saved"
    )
    p.add_argument("--replay", default=None, metavar="SEED:INDEX", help="run one mutant")
    p.add_argument(
        "--ops",
        default=None,
        metavar="JSON",
        help="with --replay 0:BASE, run base BASE with these mutations (a JSON list)",
    )
    p.add_argument("--summary", default=None, help="write the run's figures as JSON here")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=0.0,
        help="stop after this long, reporting the mutants finished (default: no limit)",
    )
    args = p.parse_args(argv)
    if args.replay:
        return replay_campaign(campaign, args.replay, args.ops)
    if args.worker:
        return campaign_worker(campaign, args)
    return run_campaign(campaign, args)


# -- CI tests --------------------------------------------------------------------------------


def run_module(
    module: str, argv: Sequence[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m module argv`` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def first_mutants(module: str, mutants: int, workers: int) -> dict[str, Any]:
    """Run a campaign's first ``mutants`` mutants of seed 0 (``workers`` workers, one chunk
    each); check that all ran without a finding, and return the run's summary."""
    with tempfile.TemporaryDirectory() as tmp:
        summary_path = os.path.join(tmp, "summary.json")
        argv = ["--mutants", str(mutants), "--workers", str(workers)]
        argv += ["--chunk", str(mutants // workers), "--summary", summary_path]
        argv += ["--report-seconds", "1000", "--max-seconds", "240"]
        done = run_module(module, argv, 300)
        assert os.path.exists(summary_path), done.stdout + done.stderr
        with open(summary_path, encoding="utf-8") as f:
            summary: dict[str, Any] = json.load(f)
    assert summary["mutants"] == mutants
    assert not any(summary["findings"].values()), json.dumps(summary["failures"], indent=1)
    assert done.returncode == 0, done.stdout + done.stderr
    return summary


def assert_both_sides(summary: dict[str, Any], entries: Sequence[str] | None = None) -> None:
    """Every entry point (of ``entries``, else of the summary) both worked and refused (a
    fuzzer whose mutants all fail the first rule would pass while testing nothing)."""
    results = summary["results"]
    for entry in entries or sorted({key.split(":")[0] for key in results}):
        reached = {r for r in ("ok", "error") if results.get(f"{entry}:{r}", 0)}
        assert reached == {"ok", "error"}, (entry, results)


def replay_attack(
    module: str, base: int, ops: list[list[object]], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run base ``base`` of a campaign with mutations ``ops`` through every entry point
    (``--replay 0:BASE --ops``); fail the test if it blocks or reports a finding."""
    import pytest

    argv = ["--replay", f"0:{base}", "--ops", json.dumps(ops)]
    try:
        done = run_module(module, argv, timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"{ops}: no result within {timeout:g} s (an entry point blocks): {e.stdout!r:.2000}"
        )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return done
