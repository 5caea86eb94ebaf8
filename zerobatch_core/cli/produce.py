"""``zerobatch produce``: tokenize a share of a text corpus into a live dataset
(``ingest.produce``), on this machine or, with ``--engine ray``, as Ray tasks on a cluster.

SIGINT and SIGTERM stop a producer after the object it is writing, with everything appended
committed: the next run with the same arguments resumes there.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from .common import EXIT_OK, UsageError, positive, readable_inputs, u32

if TYPE_CHECKING:
    from ..ingest.produce import ProduceProgress, ProduceSummary


def cmd_produce(args: argparse.Namespace) -> int:
    inputs = readable_inputs(args.sources)
    options: dict[str, Any] = {
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "tokenizer": args.tokenizer,
        "mode": args.mode,
        "pad_id": args.pad_id,
        "text_field": args.text_field,
        "per_line": args.per_line,
        "kind": args.kind,
        "align": args.align,
        "bos_token": args.bos_token,
        "seed": args.seed,
        "epochs": args.epochs,
        "batches_per_object": args.batches_per_object,
        "workers": args.workers,
        "dtype": args.dtype,
    }
    if args.engine == "ray":
        if args.index is not None:
            raise UsageError(
                "--index applies to one producer; --engine ray runs all --producers of them"
            )
        try:
            from ..ingest.ray_produce import produce_with_ray
        except ImportError as e:
            from ..errors import MissingDependencyError

            raise MissingDependencyError("ray", "ray", "producing with --engine ray") from e
        summaries = produce_with_ray(
            inputs,
            args.dataset,
            producer_id=args.producer_id,
            producers=args.producers,
            address=args.address,
            **options,
        )
    else:
        if args.address is not None:
            raise UsageError("--address applies only to --engine ray")
        summaries = [_produce_here(args, inputs, options)]
    for summary in summaries:
        if args.json:
            print(json.dumps(summary.as_dict()))
        elif not args.quiet:
            print("\n".join(summary.lines()))
    return EXIT_OK


def _produce_here(
    args: argparse.Namespace, inputs: list[str], options: dict[str, Any]
) -> ProduceSummary:
    """One producer in this process, stopped cleanly by SIGINT or SIGTERM."""
    from ..ingest.produce import produce

    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    def progress(p: ProduceProgress) -> None:
        if args.verbose:
            print(f"committed {p.committed:,} batches", file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return produce(
            inputs,
            args.dataset,
            producer_id=args.producer_id,
            producers=args.producers,
            index=0 if args.index is None else args.index,
            stop=lambda: bool(stopping),
            on_commit=progress,
            **options,
        )
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def register(sub: Any) -> None:
    """Add ``produce`` to ``sub``, the subparsers of ``zerobatch``."""
    p = sub.add_parser(
        "produce",
        help="tokenize a share of a corpus into a live dataset, exactly once",
        description="Tokenize producer --index's share of the input units (every "
        "--producers-th parquet row group or JSONL/text file; for nanoGPT shards and .npy "
        "arrays, which hold tokens already, every --producers-th run of records), pack the "
        "documents into [--batch-size, --seq-len] batches as 'convert' does, and append them "
        "to the live dataset at DATASET (a directory or an object-store URL; created if it "
        "does not exist) while trainers read it. The producer loops over its share, each "
        "epoch in its own unit order, until --epochs are done or it is stopped (SIGINT, "
        "SIGTERM: it commits what it appended first). Restarted with the same --producer-id "
        "and arguments, it resumes after its committed batches: every document of its share "
        "is committed once per epoch. Other arguments under the same id are refused.\n\n"
        "With --engine ray, the --producers producers run as Ray tasks on a cluster, "
        "producer i as ID-i; a task that dies is retried and resumes the same way.",
        epilog="examples:\n"
        "  zerobatch produce 'corpus/*.parquet' s3://bucket/run --producer-id prep-0 \\\n"
        "      --producers 4 --index 0 --seq-len 2048 --batch-size 32 \\\n"
        "      --tokenizer 'tiktoken:gpt2' --epochs 1\n"
        "  zerobatch produce 'corpus/*.parquet' s3://bucket/run --producer-id prep \\\n"
        "      --producers 16 --seq-len 2048 --batch-size 32 --engine ray --address auto",
    )
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="inputs (.parquet, .jsonl, .json, .txt text; .bin nanoGPT shards; .npy arrays) "
        "or quoted glob patterns, all of one kind",
    )
    p.add_argument("dataset", metavar="DATASET", help="the live dataset: a directory or a URL")
    p.add_argument(
        "--producer-id",
        required=True,
        metavar="ID",
        help="this producer's stable name (1-64 of A-Z a-z 0-9 _ -); with --engine ray, the "
        "prefix of the producers' names (required)",
    )
    p.add_argument(
        "--producers",
        type=positive,
        default=1,
        metavar="N",
        help="producers sharing the inputs (default: 1)",
    )
    p.add_argument(
        "--index",
        type=int,
        default=None,
        metavar="I",
        help="which share this producer takes, in [0, N) (default: 0)",
    )
    p.add_argument(
        "--seq-len", type=positive, required=True, metavar="T", help="tokens per row (required)"
    )
    p.add_argument(
        "--batch-size",
        type=positive,
        required=True,
        metavar="B",
        help="rows per global batch (required)",
    )
    p.add_argument(
        "--tokenizer", default="byte", metavar="SPEC", help="as for 'convert' (default: byte)"
    )
    p.add_argument(
        "--mode", choices=["pack", "pad"], default="pack", help="as for 'convert' (default: pack)"
    )
    p.add_argument(
        "--pad-id",
        type=u32,
        default=None,
        metavar="ID",
        help="padding of --mode pad and of the last batch (default: the tokenizer's EOS id; "
        "without one, the rows after the last whole batch are dropped)",
    )
    p.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="parquet column or JSON field (default: text)",
    )
    p.add_argument("--per-line", action="store_true", help="plain text: a document per line")
    p.add_argument(
        "--kind",
        choices=["nanogpt", "npy", "text"],
        default=None,
        help="the kind of every source (default: from the suffixes, as for 'convert'); "
        "nanoGPT shards and .npy arrays are tokens already, cut into records of --seq-len",
    )
    p.add_argument(
        "--align",
        choices=["contiguous", "bos"],
        default="contiguous",
        help="nanoGPT shards: records one after another, or each starting at a --bos-token "
        "(default: contiguous)",
    )
    p.add_argument(
        "--bos-token",
        type=u32,
        default=None,
        metavar="ID",
        help="nanoGPT shards with --align bos: the token starting a document (default: none)",
    )
    p.add_argument(
        "--seed", type=u32, default=0, metavar="S", help="seed of the unit orders (default: 0)"
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "uint16", "uint32"],
        default="auto",
        help="how tokens are stored: uint16 (half the bytes; ids up to 65,535) or uint32; auto "
        "takes the live dataset's own dtype, or for a new one uint16 when the tokenizer's "
        "vocabulary (or 16-bit token files) and the pad id fit, else uint32 (default: auto)",
    )
    p.add_argument(
        "--epochs",
        type=positive,
        default=None,
        metavar="E",
        help="passes over the share (default: until stopped)",
    )
    p.add_argument(
        "--batches-per-object",
        type=positive,
        default=None,
        metavar="K",
        help="batches per stored object at most (default: about 4 MiB of tokens)",
    )
    p.add_argument(
        "--workers",
        type=positive,
        default=1,
        metavar="W",
        help="tokenizer processes per producer (default: 1)",
    )
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: one producer in this process; ray: all --producers as Ray tasks "
        "(default: local)",
    )
    p.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="--engine ray: the cluster to join (default: RAY_ADDRESS, else a local one)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--verbose", action="store_true", help="report each commit on stderr")
    p.set_defaults(func=cmd_produce)
