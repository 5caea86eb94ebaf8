"""``zerobatch demo``: a speed check of this machine (the loader over a synthetic file).

The training demo lives in ``examples/``, outside the package.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import UsageError, positive


def cmd_demo(args: argparse.Namespace) -> int:
    from .speed_demo import run_speed_demo

    if args.records < args.batch_size:
        raise UsageError(
            f"--records {args.records} is fewer than --batch-size {args.batch_size}: the demo "
            f"file would hold no batch"
        )
    return run_speed_demo(
        args.out, records=args.records, seq_len=args.seq_len, batch_size=args.batch_size
    )


def register(sub: Any) -> None:
    """Add ``demo`` to ``sub``, the subparsers of ``zerobatch``."""
    p = sub.add_parser(
        "demo",
        help="write a synthetic dataset and time the loader over it (tokens/s)",
        description="Write a synthetic LLMBATCH file of random tokens into --out (replacing the "
        "one a previous run left there), then time the core loader over it in each output "
        "dtype, yielding batches and consuming them. A speed check of this machine; the "
        "training demo lives in examples/.",
        epilog="examples:\n  zerobatch demo\n  zerobatch demo --records 100000 --seq-len 1024",
    )
    p.add_argument("--out", default="demo-output", metavar="DIR", help="directory for demo.batch")
    p.add_argument("--records", type=positive, default=20_000, metavar="N", help="records to write")
    p.add_argument("--seq-len", type=positive, default=512, metavar="T", help="tokens per record")
    p.add_argument("--batch-size", type=positive, default=32, metavar="B", help="records per batch")
    p.set_defaults(func=cmd_demo)
