"""``zerobatch plan``: the requests a job makes reading a dataset, before the job runs."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from .common import EXIT_OK, UsageError, plural, positive


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}")
    return value


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def _by_object(kinds: dict[str, dict[str, float]], per_step: bool) -> str:
    parts = []
    for kind, c in kinds.items():
        requests = f"{c['requests']:.3g}" if per_step else f"{c['requests']:,.0f}"
        parts.append(f"{kind} {requests} ({_size(c['bytes'])})")
    return ", ".join(parts) or "nothing"


def cmd_plan(args: argparse.Namespace) -> int:
    from ..delivery.planning import plan

    if args.global_batch_size is not None and args.global_batch_size % args.ranks:
        raise UsageError(
            f"--global-batch-size {args.global_batch_size} is not a multiple of --ranks "
            f"{args.ranks}"
        )
    try:
        found = plan(
            args.path,
            ranks=args.ranks,
            context=args.context,
            step_seconds=args.step_seconds,
            global_batch_size=args.global_batch_size,
            verify=args.verify,
            steps=args.steps,
            block_size=args.block_size,
        )
    except ValueError as e:
        if type(e) is ValueError:  # the job's shape does not fit the dataset's
            raise UsageError(str(e)) from e
        raise
    info: dict[str, Any] = found.as_dict()
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    rank, job = info["per_rank"], info["job"]
    print(
        f"dataset {found.url}: manifest version {found.version}, "
        f"{plural(found.shards, 'shard')}, {plural(found.num_batches, 'batch')}"
    )
    print(
        f"job: {found.job_ranks:,} ranks ({found.ranks:,} data-parallel x {found.context} "
        f"context-parallel), a step every {found.step_seconds:g} s"
    )
    startup = rank["startup"]
    print(
        f"per rank, before its first batch: {startup['requests']:,} requests, "
        f"{_size(startup['bytes'])}: {_by_object(startup['by_object'], False)}"
    )
    step = rank["per_step"]
    print(
        f"per rank, per step (over {step['steps_simulated']} steps): "
        f"{step['requests']:.3g} requests, {_size(step['bytes'])}: "
        f"{_by_object(step['by_object'], True)}"
    )
    print(
        f"job: {job['startup_requests']:,} requests and {_size(job['startup_bytes'])} at "
        f"start; {job['requests_per_second']:,.0f} GET/s and "
        f"{_size(job['bytes_per_second'])}/s in steady state"
    )
    prefixes = job["key_prefixes"]
    shown_prefixes = ", ".join(prefixes if len(prefixes) <= 4 else [*prefixes[:3], "..."])
    if len(prefixes) > 4:
        shown_prefixes += f", {prefixes[-1]}"
    print(
        f"key prefixes: {len(prefixes)} ({shown_prefixes or 'none'}), "
        f"{job['requests_per_second_busiest_prefix']:,.0f} GET/s on the busiest"
    )
    for warning in found.warnings:
        print(f"warning: {warning}")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add ``plan`` to ``sub``, the subparsers of ``zerobatch``."""
    p = sub.add_parser(
        "plan",
        help="count the requests a job makes reading a dataset, before it runs",
        description="Run the loader of a few sample ranks of a job over a model of DATASET "
        "(its manifest and index, read from the store; shard contents made up, not fetched) "
        "and count every request: per rank before its first batch and per step, then for "
        "the whole job, with the request rate per key prefix against what the store "
        "documents (Amazon S3: 5,500 GET/s per prefix; Google Cloud Storage: about 5,000 "
        "reads/s per bucket at first; Azure: 20,000 requests/s per account). Only the "
        "dataset's metadata is read.",
        epilog="examples:\n"
        "  zerobatch plan s3://bucket/train --ranks 512\n"
        "  zerobatch plan s3://bucket/train --ranks 2048 --context 2 --step-seconds 0.5 "
        "--global-batch-size 4096\n"
        "  zerobatch plan data/train --ranks 8 --json",
    )
    p.add_argument("path", metavar="DATASET", help="a dataset's URL or directory")
    p.add_argument(
        "--ranks",
        type=positive,
        required=True,
        metavar="D",
        help="data-parallel ranks of the job (required)",
    )
    p.add_argument(
        "--context", type=positive, default=1, metavar="C", help="context-parallel ranks"
    )
    p.add_argument(
        "--step-seconds",
        type=_seconds,
        default=1.0,
        metavar="S",
        help="seconds between steps, for the request rates (default: 1)",
    )
    p.add_argument(
        "--global-batch-size",
        type=positive,
        default=None,
        metavar="G",
        help="samples per step over all ranks (default: the stored batch size)",
    )
    p.add_argument(
        "--verify",
        choices=["off", "whole", "first", "always"],
        default=None,
        help="the ranks' checksum checks, as the loader takes them (default: whole)",
    )
    p.add_argument(
        "--block-size",
        type=positive,
        default=None,
        metavar="N",
        help="stored batches per shuffled block, as given to the loader (default: 256)",
    )
    p.add_argument(
        "--steps",
        type=positive,
        default=64,
        metavar="K",
        help="steps simulated per sample rank (default: 64)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (default: text)")
    p.set_defaults(func=cmd_plan)
