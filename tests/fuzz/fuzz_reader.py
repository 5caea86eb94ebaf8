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
exits 1 if there was any failure. The workers, their status files and the run loop are
``harness.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os

from zerobatch_spec import ErrorCode

from tests.fuzz.harness import (
    Fleet,
    Layout,
    Worker,
    attempt,
    parser,
    run_saving,
    sabotage,
    save_input,
    saved_failure,
    say_flushed,
    say_outcomes,
    say_saved_failures,
    serve,
)
from tests.fuzz.mutants import check, random_mutant

FAILURE_KINDS = ("exception", "disagreement", "signal", "hang")
"""What counts as a defect: a non-ZeroBatch exception, a disagreement with the spec, a process
killed by a signal, a mutant that made no progress within the hang limit."""

OUTCOMES = ("valid", "valid-deep-invalid", *(code.value for code in ErrorCode), *FAILURE_KINDS)
"""Every outcome a worker counts (``mutants.check``'s results and the failures)."""

FLEET = Fleet("tests.fuzz.fuzz_reader", Layout(OUTCOMES), FAILURE_KINDS, label="failures")


def save_failure(out: str, seed: int, index: int, kind: str, detail: str) -> str:
    """Write mutant ``index`` (rebuilt from the seed) and what went wrong into ``out``."""
    base, ops, data = random_mutant(seed, index)
    record = {"seed": seed, "index": index, "kind": kind, "base": base, "ops": ops}
    return save_input(out, record | {"detail": detail}, data, ".batch") + ".batch"


# -- worker ---------------------------------------------------------------------------------


def run_worker(args: argparse.Namespace) -> int:
    """Check mutants ``--start..--stop``, keeping the status file current after every mutant.

    Failures are saved to ``--out`` and logged for the parent as they happen, so nothing is
    lost if a later mutant kills the process. ``--crash-at`` makes the worker send itself
    SIGBUS on that mutant: a check of the harness (the run must then report exactly one
    signal, at that index, and go on).
    """

    def step(worker: Worker, index: int) -> None:
        sabotage(index, args.crash_at)
        _, _, data = random_mutant(args.seed, index)
        path = os.path.join(worker.scratch, "mutant.batch")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        kind, detail = attempt(lambda: check(path, data), FAILURE_KINDS)
        worker.count(kind)
        if kind in FAILURE_KINDS:
            worker.failure(saved_failure(save_failure, args.out, args.seed, index, kind, detail))

    return serve(FLEET.layout, args, step)


# -- parent ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    result, out = run_saving(FLEET, args, save_failure, "zerobatch-fuzz-failures-", say_flushed)
    totals = result.totals
    summary = {
        **result.figures(args),
        "outcomes": dict(sorted(totals.counts.items())),
        "failures": {k: totals.counts[k] for k in FAILURE_KINDS},
        "failure_inputs": [f["saved"] for f in totals.failures],
    }
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    result.head(print, args)
    outcomes = sorted(
        (k for k in OUTCOMES if k not in FAILURE_KINDS), key=lambda k: -totals.counts[k]
    )
    say_outcomes(print, totals.counts, outcomes, 24)
    print(f"non-ZeroBatch exceptions: {totals.counts['exception']}")
    print(f"disagreements with the spec: {totals.counts['disagreement']}")
    print(f"signals: {totals.counts['signal']}")
    print(f"hangs: {totals.counts['hang']}")
    say_saved_failures(print, totals.failures)
    print(f"summary and failing inputs: {out}")
    return 1 if any(totals.counts[k] for k in FAILURE_KINDS) else 0


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "tests.fuzz.fuzz_reader",
        "Fuzz the LLMBATCH reader with mutants of valid files (tests/fuzz/README.md).",
        mutants=1_000_000,
        chunk=20_000,
        hang_seconds=60.0,
        out=True,
    )
    p.add_argument(
        "--crash-at",
        type=int,
        default=-1,
        help="harness self-check: the worker on this mutant kills itself with SIGBUS",
    )
    args = p.parse_args(argv)
    if args.worker:
        return run_worker(args)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
