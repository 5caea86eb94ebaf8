"""``zerobatch trace``: what one step of the loader reads and which input records it came from.

Its options are the loader's order and slicing parameters, with the loader's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..delivery.loader import DEFAULT_BLOCK_SIZE
from ..delivery.provenance import DEFAULT_MAX_ROWS
from ..errors import ZeroBatchError
from .common import EXIT_OK, UsageError, check_readable, count, dataset_directory, positive, u64
from .flags import flag_message


def cmd_trace(args: argparse.Namespace) -> int:
    from ..delivery.provenance import trace_step
    from ..delivery.sources import is_live
    from ..stores.store import is_url

    if is_url(args.path) or is_live(args.path):
        pass  # a live dataset, or a store the trace opens itself
    elif os.path.isdir(args.path):
        dataset_directory(args.path)
    else:
        check_readable(args.path)
    try:
        trace = trace_step(
            args.path,
            args.step,
            epoch=args.epoch,
            block_size=args.block_size,
            seed=args.seed,
            shuffle=not args.no_shuffle,
            global_batch_size=args.global_batch_size,
            rank=args.rank,
            world_size=args.world_size,
            context_rank=args.context_rank,
            context_size=args.context_size,
            zigzag=args.zigzag,
            next_token=args.next_token,
            max_rows=args.max_rows,
        )
    except (ValueError, IndexError) as e:
        if isinstance(e, ZeroBatchError):  # the data's fault: a broken manifest or file
            raise
        raise UsageError(flag_message(str(e), args.option_flags)[0]) from e
    if args.json:
        print(json.dumps(trace.as_dict()))
    else:
        print("\n".join(trace.lines()))
    return EXIT_OK


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    """The order and slicing options of ``trace``: the loader's parameters and defaults."""
    p.add_argument(
        "--step",
        type=count,
        required=True,
        metavar="N",
        help="the step within the epoch (required)",
    )
    p.add_argument("--epoch", type=count, default=0, metavar="E", help="the epoch")
    p.add_argument("--rank", type=count, default=0, metavar="R", help="data-parallel rank")
    p.add_argument(
        "--of",
        dest="world_size",
        type=positive,
        default=1,
        metavar="D",
        help="data-parallel ranks (world size)",
    )
    p.add_argument(
        "--context-rank", type=count, default=0, metavar="C", help="context-parallel rank"
    )
    p.add_argument(
        "--context-size", type=positive, default=1, metavar="CS", help="context-parallel ranks"
    )
    p.add_argument(
        "--zigzag",
        action="store_true",
        help="context chunks c and 2C-1-c of 2C, the load-balanced split for causal attention "
        "(default: chunk c of C)",
    )
    p.add_argument(
        "--block-size",
        type=positive,
        default=DEFAULT_BLOCK_SIZE,
        metavar="B",
        help="stored batches per shuffled block, as given to the loader",
    )
    p.add_argument(
        "--seed",
        type=u64,
        default=None,
        metavar="S",
        help="order seed (default: the dataset's or file's seed, as the loader's)",
    )
    p.add_argument(
        "--no-shuffle", action="store_true", help="storage order (default: block-shuffled)"
    )
    p.add_argument(
        "--global-batch-size",
        type=positive,
        default=None,
        metavar="G",
        help="samples per step over all ranks (default: the stored batch size)",
    )
    p.add_argument(
        "--next-token",
        action="store_true",
        help="columns of (inputs, labels) pairs: each range is read one token further "
        "(default: whole tokens)",
    )
    p.add_argument(
        "--max-rows",
        type=positive,
        default=DEFAULT_MAX_ROWS,
        metavar="N",
        help="refuse a step of more than N rows for the rank, before tracing any (default: "
        "%(default)s)",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (default: text lines)"
    )


def register(sub: Any) -> None:
    """Add ``trace`` to ``sub``, the subparsers of ``zerobatch``."""
    p = sub.add_parser(
        "trace",
        help="show what a step reads and which input records it came from",
        description="For one step of the loader (the same order and slicing parameters, with "
        "the same defaults), print the stored batches it reads, the rows and token columns "
        "this rank gets, and for every row where it came from: its record in the shard, "
        "through the writer's record permutation, its input record, and from the manifest's "
        "sources the input file and the record's index in it. Only the manifest (or a "
        "file's header) is read.",
        epilog="examples:\n"
        "  zerobatch trace data/train --step 1200\n"
        "  zerobatch trace data/train --step 1200 --epoch 2 --rank 3 --of 8 --json\n"
        "  zerobatch trace data/train --step 7 --context-rank 1 --context-size 2 --zigzag\n"
        "  zerobatch trace blend.json --step 90000",
    )
    p.add_argument(
        "path",
        metavar="DATASET",
        help="a dataset directory, an LLMBATCH file, or a mixture file (the step's component "
        "first, then that component's own step)",
    )
    _add_trace_options(p)
    p.set_defaults(func=cmd_trace)
