"""Long fuzz run of dataset metadata: mutants of manifests, checksums files and shard names.

Run from the repository root (``tests/fuzz/README.md`` has the figures of the last run)::

    nice -n 10 .venv/bin/python -m tests.fuzz.fuzz_datasets --mutants 100000 --workers 2

Mutant ``i`` of a run is a pure function of ``(--seed, i)`` (``mutants.random_dataset_mutant``):
one of two small valid dataset directories written by ZeroBatch's own writers, with one to
five JSON-aware or byte-level mutations (``mutants.py`` lists them). Each mutant is written to
a scratch directory (on ``/dev/shm`` when there is one), beside a valid LLMBATCH file
``outside.batch`` that traversal names and links point at, and goes through every entry point
that reads a dataset: the loader (a few items, then hostile states: a huge step, ``num_workers``
or ``skip_steps``), ``zerobatch validate --deep --json``, ``zerobatch inspect --json`` and
``zerobatch trace`` of two steps, each command run by its own function as ``main`` runs it.

Each worker process runs under a 2 GiB address-space limit (``RLIMIT_AS``). An entry point
may end in exactly two ways: it works, or it raises one of ZeroBatch's own errors (or, for a
command, the command line's usage error). Anything else is a *finding*: another exception, a
``MemoryError``, a worker killed by a signal, or a mutant that makes no progress for
``--hang-seconds`` (10 s). Findings are counted, saved (the mutant's files and a command that
replays it) and listed in the findings file, once per (entry point, exception type, top
frame). The run exits 1 if there was any finding.

``fuzz_live.py`` runs the same harness over live datasets.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import mmap
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from tests.fuzz.mutants import (
    OUTSIDE,
    Op,
    Tree,
    add_worker_arguments,
    apply_tree,
    dataset_bases,
    materialize,
    random_dataset_mutant,
)

ADDRESS_SPACE = 2 << 30
"""Each worker's ``RLIMIT_AS``: a mutant that asks for more gets a ``MemoryError``."""

RESULTS = ("ok", "error", "exception", "memory", "disagreement", "loss", "signal", "hang")
"""What one entry point of one mutant can give: it works, a ZeroBatch error, or a finding."""

FINDINGS = ("exception", "memory", "disagreement", "loss", "signal", "hang")
"""The results that are defects."""

ROOT_DOCUMENTS = ("manifest.json", "live.json")
"""The document that makes a directory a dataset or a live dataset: without it the path is
not one, and ``FileNotFoundError`` (as for any missing path) is a valid answer."""

HOSTILE_STATES: tuple[dict[str, Any], ...] = (
    {"step": 2**62},
    {"num_workers": 2**40, "worker": 2**40 - 1},
    {"num_workers": 2**62, "worker": 3, "step": 2**61},
    {"skip_steps": [[0, 2**41]]},
    {"skip_steps": [[1, 2**63]], "num_workers": 2, "worker": 1, "step": 3},
    {"skip_steps": [[i, i + 1] for i in range(0, 20_000, 2)]},
    {"epoch": 2**64 - 1},
    {"global_batch_size": 1, "step": 2**40},
    {"global_batch_size": 2**32 - 1},
    {"origin": 2**62, "step": 2**62},
)
"""Keys a hostile state changes in a state the loader saved itself."""


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


def scratch_root() -> str:
    """A tmpfs directory when the machine has one, so scratch writes never touch a disk."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


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


def _describe(e: BaseException) -> str:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{type(e).__name__}: {str(e)[:500]}\n{text[-6000:]}"


def top_frame(detail: str) -> str:
    """The innermost frame of ZeroBatch's own code in a traceback (else the innermost)."""
    frames = [line.strip() for line in detail.splitlines() if line.strip().startswith("File ")]
    own = [f for f in frames if "zerobatch_" in f or "/spec/" in f]
    chosen = (own or frames or ["?"])[-1]
    return chosen.replace(os.getcwd() + "/", "")


# -- the dataset checks -----------------------------------------------------------------------


def run_command(argv: list[str]) -> None:
    """Run a ``zerobatch`` command's function as ``main`` does, output discarded, exceptions
    raised (``main`` would turn them into an exit status and a message)."""
    from zerobatch_core.cli import build_parser

    args = build_parser().parse_args(argv)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        args.func(args)


def _loader(root: str, index: int) -> None:
    from zerobatch_core import BatchNativeLoader, OutputDType

    dtype: OutputDType = ("uint32", "int64")[index % 2]
    loader = BatchNativeLoader(root, dtype=dtype, block_size=1 + index % 3)
    try:
        items = iter(loader)
        for _ in range(3):
            next(items, None)
        saved = loader.state_dict()
        for k in (index % len(HOSTILE_STATES), (index // 7) % len(HOSTILE_STATES)):
            state = {**saved, **HOSTILE_STATES[k]}
            with contextlib.suppress(_zerobatch_errors()):
                loader.load_state_dict(state)
                items = iter(loader)
                for _ in range(2):
                    next(items, None)
    finally:
        loader.source.close()


def _zerobatch_errors() -> type[BaseException]:
    from zerobatch_core import ZeroBatchError

    return ZeroBatchError


def _skipping_loader(root: str, index: int) -> None:
    """A loader told to skip a range of 2^40+ steps, with another global batch size."""
    from zerobatch_core import BatchNativeLoader, DatasetReader

    with DatasetReader(root) as source:
        g = (source.batch_size * 2, 1, None)[index % 3]  # a multiple, a divisor, the same
        loader = BatchNativeLoader(source, global_batch_size=g, skip_steps=[(1, 2**41 + 1)])
        items = iter(loader)
        for _ in range(2):
            next(items, None)


def check_dataset(
    root: str, index: int, ops: list[Op], at: Callable[[int], None]
) -> list[tuple[str, str, str]]:
    """Every dataset entry point on the mutant at ``root`` (``index`` varies the loader's
    settings and the hostile states)."""
    from zerobatch_core.cli import UsageError

    usage = (UsageError,)
    steps: list[tuple[str, Callable[[], None], tuple[type[BaseException], ...]]] = [
        ("loader", lambda: _loader(root, index), ()),
        ("loader-skip", lambda: _skipping_loader(root, index), ()),
        ("validate", lambda: run_command(["validate", "--deep", "--json", root]), usage),
        ("inspect", lambda: run_command(["inspect", "--json", root]), usage),
        ("trace", lambda: run_command(["trace", root, "--step", "1", "--json"]), usage),
        (
            "trace-rank",
            lambda: run_command(
                ["trace", root, "--step", "0", "--rank", "1", "--of", "2", "--epoch", "3"]
            ),
            usage,
        ),
    ]
    results = []
    for k, (entry, fn, allowed) in enumerate(steps):
        at(k)
        result, detail = outcome(fn, allowed)
        results.append((entry, result, detail))
    return results


DATASETS = Campaign(
    module="tests.fuzz.fuzz_datasets",
    mutant=random_dataset_mutant,
    bases=dataset_bases,
    apply=apply_tree,
    entries=("loader", "loader-skip", "validate", "inspect", "trace", "trace-rank"),
    check=check_dataset,
)


# -- worker ----------------------------------------------------------------------------------


def status_struct(campaign: Campaign) -> struct.Struct:
    """A worker's status file: the mutant it is on, its entry point, mutants finished, and a
    count per (entry point, result)."""
    return struct.Struct(f"<qqq{len(campaign.entries) * len(RESULTS)}q")


def build_mutant(campaign: Campaign, seed: int, index: int, root: str) -> tuple[list[Op], Tree]:
    """Materialise mutant ``index`` at ``root`` (``outside.batch`` beside it)."""
    _, ops, tree = campaign.mutant(seed, index)
    build_tree(campaign, tree, root)
    return ops, tree


def build_tree(campaign: Campaign, tree: Tree, root: str) -> None:
    """Materialise ``tree`` at ``root``, with ``outside.batch`` beside it."""
    with open(os.path.join(os.path.dirname(root), "outside.batch"), "wb") as f:
        f.write(OUTSIDE)
    os.makedirs(root)
    materialize(tree, root)


def run_worker(campaign: Campaign, seed: int, start: int, stop: int, status_path: str) -> None:
    """Check mutants ``start..stop`` under the address-space limit, keeping the status file
    current; findings go to ``<status_path>.failures``, one JSON object a line."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    layout = status_struct(campaign)
    counts = [0] * (len(campaign.entries) * len(RESULTS))
    slot = {(e, r): i * len(RESULTS) + j for i, e in enumerate(campaign.entries)
            for j, r in enumerate(RESULTS)}  # fmt: skip
    work = tempfile.mkdtemp(prefix="m-", dir=os.path.dirname(status_path))
    with open(status_path, "r+b") as sf:
        status = mmap.mmap(sf.fileno(), layout.size)
    log = open(status_path + ".failures", "a", encoding="utf-8")  # noqa: SIM115
    parent = os.getppid()
    try:
        for index in range(start, stop):
            if os.getppid() != parent:  # the run was killed: stop instead of running orphaned
                return
            layout.pack_into(status, 0, index, -1, index - start, *counts)
            root = os.path.join(work, "ds")
            ops, _ = build_mutant(campaign, seed, index, root)

            def at(k: int, index: int = index) -> None:
                layout.pack_into(status, 0, index, k, index - start, *counts)

            for entry, result, detail in campaign.check(root, index, ops, at):
                counts[slot[entry, result]] += 1
                if result in FINDINGS:
                    failure = {"index": index, "entry": entry, "kind": result, "detail": detail}
                    log.write(json.dumps(failure, default=str) + "\n")
                    log.flush()
            shutil.rmtree(root, ignore_errors=True)
        layout.pack_into(status, 0, stop, -1, stop - start, *counts)
    finally:
        log.close()
        status.close()
        shutil.rmtree(work, ignore_errors=True)


# -- parent ----------------------------------------------------------------------------------


@dataclass
class Job:
    """One worker process running mutants ``start..stop``."""

    campaign: Campaign
    start: int
    stop: int
    proc: subprocess.Popen[bytes]
    status_path: str
    stderr: IO[str]
    last: tuple[int, int] = (-1, -1)
    last_progress: float = field(default_factory=time.monotonic)
    hung: bool = False

    def status(self) -> tuple[int, int, int, dict[tuple[str, str], int]]:
        """The mutant and entry point the worker is on, mutants finished, result counts."""
        layout = status_struct(self.campaign)
        with open(self.status_path, "rb") as f:
            index, stage, done, *counts = layout.unpack(f.read(layout.size))
        keys = [(e, r) for e in self.campaign.entries for r in RESULTS]
        return index, stage, done, dict(zip(keys, counts, strict=True))


@dataclass
class Totals:
    tried: int = 0
    results: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def findings(self, kind: str) -> int:
        return sum(n for (_, r), n in self.results.items() if r == kind)


def chunks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    for first in range(start, stop, size):
        yield first, min(first + size, stop)


def launch(campaign: Campaign, seed: int, start: int, stop: int, work: str) -> Job:
    layout = status_struct(campaign)
    status_path = os.path.join(work, f"status-{start}")
    with open(status_path, "wb") as f:
        f.write(layout.pack(start, -1, 0, *[0] * (len(campaign.entries) * len(RESULTS))))
    stderr = open(os.path.join(work, f"stderr-{start}.txt"), "w+", encoding="utf-8")  # noqa: SIM115
    argv = [sys.executable, "-m", campaign.module, "--worker", "--seed", str(seed)]
    argv += ["--start", str(start), "--stop", str(stop), "--status", status_path]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
    return Job(campaign, start, stop, proc, status_path, stderr)


def _count(job: Job, totals: Totals) -> tuple[int, int, int]:
    """Add what a worker that ended finished (its counts, its failures) to ``totals``;
    return its last mutant index, stage and the number of mutants it finished."""
    index, stage, done, counts = job.status()
    totals.results.update(counts)
    totals.tried += done
    failures = job.status_path + ".failures"
    if os.path.exists(failures):
        with open(failures, encoding="utf-8") as f:
            totals.failures.extend(json.loads(line) for line in f)
        os.remove(failures)
    return index, stage, done


def finish(job: Job, totals: Totals) -> tuple[int, int] | None:
    """Account for a worker that ended; return the range still to run if it died early."""
    rc = job.proc.returncode
    job.stderr.seek(0)
    err = job.stderr.read()
    job.stderr.close()
    index, stage, done = _count(job, totals)
    if rc == 0 and done == job.stop - job.start:
        return None
    kind = "hang" if job.hung else "signal" if rc < 0 else "exception"
    entry = job.campaign.entries[stage] if 0 <= stage < len(job.campaign.entries) else "build"
    how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
    detail = f"worker ended ({how}, {kind}) on mutant {index}, entry point {entry}\n{err[-3000:]}"
    totals.results[entry, kind] += 1
    totals.failures.append({"index": index, "entry": entry, "kind": kind, "detail": detail})
    totals.tried += 1  # the mutant that ended it
    return (index + 1, job.stop) if index + 1 < job.stop else None


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


def run(campaign: Campaign, args: argparse.Namespace) -> int:
    work = tempfile.mkdtemp(prefix="zerobatch-fuzz-meta-", dir=scratch_root())
    pending = collections.deque(chunks(0, args.mutants, args.chunk))
    running: list[Job] = []
    totals = Totals()
    began = time.monotonic()
    last_report = began
    stopped = ""
    try:
        while pending or running:
            if args.max_seconds and time.monotonic() - began > args.max_seconds:
                stopped = f"time limit of {args.max_seconds:g} s"
                break
            while pending and len(running) < args.workers:
                start, stop = pending.popleft()
                running.append(launch(campaign, args.seed, start, stop, work))
            time.sleep(0.2)
            now = time.monotonic()
            for job in list(running):
                if job.proc.poll() is None:
                    index, stage, _, _ = job.status()
                    if (index, stage) != job.last:
                        if index != job.last[0]:
                            job.last_progress = now
                        job.last = (index, stage)
                        continue
                    if now - job.last_progress <= args.hang_seconds:
                        continue
                    job.hung = True
                    job.proc.kill()
                    job.proc.wait()
                running.remove(job)
                rest = finish(job, totals)
                if rest is not None:
                    pending.appendleft(rest)
            if now - last_report > args.report_seconds:
                last_report = now
                done = totals.tried + sum(j.status()[2] for j in running)
                print(
                    f"... {done:,} mutants, {done / (now - began):,.1f}/s, findings "
                    + ", ".join(f"{k} {totals.findings(k)}" for k in FINDINGS),
                    flush=True,
                )
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        for job in running:  # stopped early: count what each worker finished
            job.proc.kill()
            job.proc.wait()
            if stopped:
                job.stderr.close()
                _count(job, totals)
        shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - began
    if stopped:
        print(f"stopped early ({stopped}): the figures cover the mutants finished")
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "mutants": totals.tried,
                    "seed": args.seed,
                    "workers": args.workers,
                    "wall_seconds": round(wall, 1),
                    "stopped": stopped or None,
                    "results": {f"{e}:{r}": n for (e, r), n in sorted(totals.results.items())},
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
    print(f"inputs tried: {totals.tried:,} (seed {args.seed}, {args.workers} worker(s))")
    print(f"wall time: {wall:,.1f} s ({totals.tried / wall:,.1f} mutants/s)")
    print("results by entry point:")
    for entry in campaign.entries:
        row = {r: totals.results[entry, r] for r in RESULTS if totals.results[entry, r]}
        print(f"  {entry:<14} " + ", ".join(f"{r} {n:,}" for r, n in row.items()))
    for kind in FINDINGS:
        print(f"{kind}: {totals.findings(kind)}")
    print(f"distinct findings new to {args.findings}: {new}" if args.findings else "")
    return 1 if any(totals.findings(k) for k in FINDINGS) else 0


def replay(campaign: Campaign, spec: str, ops_json: str | None = None) -> int:
    """Rebuild mutant ``SEED:INDEX`` (with ``ops_json``: base ``INDEX`` modulo the number of
    bases, with those mutations) in a scratch directory under the address-space limit and run
    every entry point on it, printing each result and its message or traceback. Exits 1 on a
    finding."""
    seed, index = (int(part) for part in spec.split(":"))
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    work = tempfile.mkdtemp(prefix="zerobatch-replay-")
    findings = 0
    try:
        root = os.path.join(work, "ds")
        if ops_json is None:
            ops, _ = build_mutant(campaign, seed, index, root)
        else:
            ops = [tuple(op) for op in json.loads(ops_json)]
            bases = campaign.bases()
            build_tree(campaign, campaign.apply(bases[index % len(bases)], ops), root)
        print(f"mutant {seed}:{index} at {root}\nops: {json.dumps(ops, default=str)}")
        for entry, result, detail in campaign.check(root, index, ops, lambda k: None):
            print(f"{entry}: {result}")
            findings += result in FINDINGS
            if detail:
                print(detail)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if findings else 0


def main(campaign: Campaign, argv: list[str] | None = None, mutants: int = 100_000) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {campaign.module}",
        description="Fuzz ZeroBatch's metadata readers with mutants (tests/fuzz/README.md).",
    )
    parser.add_argument("--mutants", type=int, default=mutants, help="default: %(default)s")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    parser.add_argument("--chunk", type=int, default=2_000, help="mutants per worker process")
    parser.add_argument("--hang-seconds", type=float, default=10.0, help="a mutant's time limit")
    parser.add_argument("--report-seconds", type=float, default=30.0, help="progress interval")
    parser.add_argument(
        "--findings", default=None, help="markdown file the distinct findings are appended to"
    )
    parser.add_argument(
        "--repro", default="fuzz-repro", help="where each distinct finding's mutant is saved"
    )
    parser.add_argument("--replay", default=None, metavar="SEED:INDEX", help="run one mutant")
    parser.add_argument(
        "--ops",
        default=None,
        metavar="JSON",
        help="with --replay 0:BASE, run base BASE with these mutations (a JSON list)",
    )
    parser.add_argument("--summary", default=None, help="write the run's figures as JSON here")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=0.0,
        help="stop after this long, reporting the mutants finished (default: no limit)",
    )
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.replay:
        return replay(campaign, args.replay, args.ops)
    if args.worker:
        run_worker(campaign, args.seed, args.start, args.stop, args.status)
        return 0
    return run(campaign, args)


if __name__ == "__main__":
    raise SystemExit(main(DATASETS))
