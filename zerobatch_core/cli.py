"""The ``zerobatch`` command line: inspect, validate, write, convert, demo, and plugged-in commands.

Exit status: 0 success (a valid file), 1 an invalid file or a failed check, 2 a usage error or
a file that cannot be opened.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

import numpy as np
from zerobatch_spec import U32_MAX

from .errors import FormatError, ZeroBatchError
from .reader import BatchFileReader
from .validation import validate_file
from .writer import write_batch_file

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def _fail(message: str, status: int) -> int:
    print(f"zerobatch: {message}", file=sys.stderr)
    return status


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        reader = BatchFileReader(args.file)
    except FormatError as e:
        if args.json:
            print(
                json.dumps(
                    {
                        "path": e.path,
                        "valid": False,
                        "error": {"code": e.code.value, "field": e.field, "detail": e.detail},
                    }
                )
            )
        return _fail(str(e), EXIT_INVALID)
    with reader:
        h = reader.header
        info = {
            "path": reader.path,
            **h.as_dict(),
            "raw_batch_bytes": h.raw_batch_bytes,
            "padded_batch_bytes": h.padded_batch_bytes,
            "padding_fraction": 1 - h.raw_batch_bytes / h.padded_batch_bytes,
            "file_size": h.file_size,
            "tokens": h.num_batches * h.batch_size * h.seq_len,
            "dropped_records": h.total_records - h.num_batches * h.batch_size,
        }
    if args.json:
        print(json.dumps(info))
    else:
        width = max(len(k) for k in info)
        for k, v in info.items():
            shown = f"{v:.4f}" if isinstance(v, float) else v
            print(f"{k:<{width}}  {shown}")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    report = validate_file(args.file, deep=args.deep)
    if args.json:
        print(json.dumps(report.as_dict()))
    elif report.valid:
        h = report.header
        assert h is not None
        mode = "deep" if args.deep else "header and size"
        print(
            f"OK {report.path}: {h.num_batches} batches of [{h.batch_size}, {h.seq_len}] "
            f"({mode} checks)"
        )
    else:
        print(f"INVALID {report.path}: {report.code}: field {report.field}: {report.detail}")
    return EXIT_OK if report.valid else EXIT_INVALID


def cmd_write(args: argparse.Namespace) -> int:
    try:
        tokens = np.load(args.input, mmap_mode="r")
    except ValueError as e:
        return _fail(f"{args.input}: not a readable .npy array: {e}", EXIT_USAGE)
    n = write_batch_file(
        args.output, tokens, batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed
    )
    print(
        f"wrote {args.output}: {n} batches of [{args.batch_size}, {tokens.shape[1]}] "
        f"from {tokens.shape[0]} records (seed {args.seed}, "
        f"{tokens.shape[0] - n * args.batch_size} dropped)"
    )
    return EXIT_OK


def cmd_convert(args: argparse.Namespace) -> int:
    from .ingest.convert import convert, progress_bar

    progress = None if args.quiet or args.json else progress_bar(args.seq_len)
    summary = convert(
        args.sources,
        args.output,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=progress,
        kind=args.kind,
        tokenizer=args.tokenizer,
        mode=args.mode,
        pad_id=args.pad_id,
        text_field=args.text_field,
        per_line=args.per_line,
        workers=args.workers,
        align=args.align,
        bos_token=args.bos_token,
    )
    if progress is not None:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(summary.as_dict()))
    else:
        print("\n".join(summary.lines()))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .speed_demo import run_speed_demo

    return run_speed_demo(
        args.out, records=args.records, seq_len=args.seq_len, batch_size=args.batch_size
    )


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _seed(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v <= U32_MAX:
        raise argparse.ArgumentTypeError(f"seed must be in [0, 2**32), got {v}")
    return v


COMMAND_PLUGINS = "zerobatch.commands"
"""Entry-point group of packages that add subcommands (``zerobatch_conformance`` adds
``conformance`` and ``probe``): the core finds them by name and never imports them itself."""


def _command_plugins() -> list[Callable[[Any], None]]:
    """The ``register(subparsers)`` functions of the installed command plugins."""
    found = []
    for entry in sorted(entry_points(group=COMMAND_PLUGINS), key=lambda e: e.name):
        try:
            found.append(entry.load())
        except ImportError as e:  # a broken plugin must not take the core's commands down
            print(f"zerobatch: command plugin {entry.name!r} not loaded: {e}", file=sys.stderr)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerobatch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="print a file's header and sizes")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("validate", help="check a file against the spec (exit 0 valid, 1 not)")
    p.add_argument("file")
    p.add_argument("--deep", action="store_true", help="also read every slot's padding")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("write", help="write a [records, seq_len] .npy array as an LLMBATCH file")
    p.add_argument("input", help=".npy file of integer tokens, shape [num_records, seq_len]")
    p.add_argument("output")
    p.add_argument("--batch-size", type=_positive, required=True)
    p.add_argument(
        "--seq-len",
        type=_positive,
        default=None,
        help="expected record length (default: taken from the array)",
    )
    p.add_argument("--seed", type=_seed, default=0)
    p.set_defaults(func=cmd_write)

    p = sub.add_parser(
        "convert",
        help="convert nanoGPT .bin shards, .npy arrays or text (parquet, jsonl, txt) to LLMBATCH",
    )
    p.add_argument("sources", nargs="+", help="input files or glob patterns (quote globs)")
    p.add_argument("output", help="the .batch file to write")
    p.add_argument("--seq-len", type=_positive, required=True)
    p.add_argument("--batch-size", type=_positive, required=True)
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument(
        "--kind",
        choices=["nanogpt", "npy", "text"],
        default=None,
        help="source kind (default: from the file suffixes)",
    )
    p.add_argument(
        "--tokenizer",
        default="byte",
        help="text only: byte | hf:PATH/tokenizer.json?bos=TOKEN | "
        "tiktoken:PATH.tiktoken (default: byte)",
    )
    p.add_argument(
        "--mode",
        choices=["pack", "pad"],
        default="pack",
        help="text only: pack documents across rows (default) or pad each one",
    )
    p.add_argument("--pad-id", type=int, default=None, help="text, pad mode: padding token")
    p.add_argument("--text-field", default="text", help="parquet column / JSONL field")
    p.add_argument("--per-line", action="store_true", help="plain text: one document per line")
    p.add_argument("--workers", type=_positive, default=1, help="tokenizer processes")
    p.add_argument(
        "--align",
        choices=["contiguous", "bos"],
        default="contiguous",
        help="nanoGPT only: cut records contiguously or starting at BOS tokens",
    )
    p.add_argument("--bos-token", type=int, default=None, help="nanoGPT only: the BOS id")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_convert)

    for register in _command_plugins():  # zerobatch conformance, zerobatch probe, ...
        register(sub)

    p = sub.add_parser("demo", help="write a small dataset and iterate it, printing tokens/s")
    p.add_argument("--out", default="demo-output")
    p.add_argument("--records", type=_positive, default=20_000)
    p.add_argument("--seq-len", type=_positive, default=512)
    p.add_argument("--batch-size", type=_positive, default=32)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except (ZeroBatchError, OSError) as e:
        return _fail(str(e), EXIT_USAGE if isinstance(e, OSError) else EXIT_INVALID)
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    raise SystemExit(main())
