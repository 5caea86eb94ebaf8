"""``zerobatch write`` (a [records, seq_len] .npy array) and ``zerobatch convert`` (nanoGPT
shards, .npy token arrays, text), the commands that write LLMBATCH files and datasets.

One module for both: they share the output options, the checks of OUTPUT before anything is
read, the progress display and the summary, and ``write`` is ``convert`` of one .npy array.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from zerobatch_spec.dataset import MAX_PREFIXES

from ..errors import MissingDependencyError
from ..stores.store import is_url
from .common import (
    EXIT_OK,
    ProgressDisplay,
    UsageError,
    add_manifest_version,
    add_shard_prefixes,
    check_output_argument,
    check_readable,
    positive,
    readable_inputs,
    shown,
    u32,
)

if TYPE_CHECKING:
    from ..ingest.convert import ConvertSummary


def _print_summary(args: argparse.Namespace, summary: ConvertSummary) -> None:
    """The summary of ``write`` and ``convert``: JSON, text, or nothing (``--quiet``)."""
    if args.json:
        print(json.dumps(summary.as_dict()))
    elif not args.quiet:
        print("\n".join(summary.lines()))


def _npy_shape(path: str) -> list[int]:
    """The shape of the ``.npy`` array at ``path`` (mapped, not read; object arrays refused)."""
    check_readable(path)
    try:
        loaded: Any = np.load(path, mmap_mode="r")
    except (ValueError, EOFError) as e:
        raise UsageError(f"{path}: not a readable .npy array: {e}") from e
    if not isinstance(loaded, np.ndarray):
        raise UsageError(f"{path}: expected one .npy array, got a {type(loaded).__name__}")
    return [int(d) for d in loaded.shape]


def cmd_write(args: argparse.Namespace) -> int:
    from ..ingest.convert import convert

    shape = _npy_shape(args.input)
    if len(shape) == 1:
        raise UsageError(
            f"{args.input}: write needs a [records, seq_len] array, this one is flat "
            f"({shape[0]:,} tokens); cut it into records with: "
            f"zerobatch convert {args.input} {args.output} --seq-len T --batch-size "
            f"{args.batch_size}"
        )
    if len(shape) != 2:
        raise UsageError(f"{args.input}: write needs a [records, seq_len] array, got {shape}")
    width = shape[1]
    if args.seq_len is not None and args.seq_len != width:
        raise UsageError(
            f"--seq-len {args.seq_len}, but the records of {args.input} have {width} tokens "
            f"(shape {shape})"
        )
    if width == 0:
        raise UsageError(f"{args.input}: records have 0 tokens (shape {shape})")
    check_output_argument(args, [args.input])
    _check_manifest_version(args)
    with ProgressDisplay(args, width, sys.stderr) as progress:
        summary = convert(
            [glob.escape(args.input)],
            args.output,
            seq_len=width,
            batch_size=args.batch_size,
            seed=args.seed,
            progress=progress,
            kind="npy",
            overwrite=args.overwrite,
            allow_empty=args.allow_empty,
            shard_batches=args.shard_batches,
            dtype=args.dtype,
            manifest_version=args.manifest_version,
            prefixes=args.prefixes,
        )
    _print_summary(args, summary)
    return EXIT_OK


def cmd_convert(args: argparse.Namespace) -> int:
    from ..ingest.convert import convert

    if args.address is not None and args.engine != "ray":
        raise UsageError("--address applies only to --engine ray")
    inputs = readable_inputs(args.sources, datasets=True)
    _check_manifest_version(args)
    if args.engine == "ray":
        if args.manifest_version != 1:
            raise UsageError(
                "--manifest-version 2 is written by the local engine; --engine ray writes "
                "version 1 datasets"
            )
        _check_ray_output(args, inputs)
        return _convert_with_ray(args, inputs)
    if is_url(args.output):
        raise UsageError(
            f"{shown(args.output)}: the local engine writes local files and directories, not "
            "URLs; write a dataset to an object store with --engine ray --shard-size N, or "
            "write locally, then copy it"
        )
    check_output_argument(args, inputs)
    with ProgressDisplay(args, args.seq_len, sys.stderr) as progress:
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
            workers=args.workers or 1,
            align=args.align,
            bos_token=args.bos_token,
            column=args.column,
            column_dtype=args.column_dtype,
            overwrite=args.overwrite,
            allow_empty=args.allow_empty,
            shard_batches=args.shard_batches,
            dtype=args.dtype,
            manifest_version=args.manifest_version,
            prefixes=args.prefixes,
        )
    _print_summary(args, summary)
    return EXIT_OK


def _check_manifest_version(args: argparse.Namespace) -> None:
    """A manifest version is a dataset's: refused for a single file's output."""
    if args.manifest_version != 1 and args.shard_batches is None:
        raise UsageError(
            "--manifest-version applies to datasets: pass --shard-size N (a single LLMBATCH "
            "file has no manifest)"
        )
    if args.prefixes > MAX_PREFIXES:
        raise UsageError(f"--shard-prefixes {args.prefixes}: at most {MAX_PREFIXES:,}")
    if args.prefixes != 1 and args.manifest_version != 2:
        raise UsageError(
            "--shard-prefixes needs --manifest-version 2 (a version 1 manifest records no key "
            "prefixes)"
        )


def _check_ray_output(args: argparse.Namespace, inputs: Sequence[str]) -> None:
    """The output checks of ``convert --engine ray`` made before anything is read: a path's are
    the local engine's; an object-store URL must name a dataset (``--shard-size``). What a URL
    already holds is checked by ``convert_with_ray``, which opens the store, before its job
    starts (a ``file://`` URL: as the path it is)."""
    if not is_url(args.output):
        check_output_argument(args, inputs)
    elif args.shard_batches is None and not args.output.lower().startswith("file://"):
        raise UsageError(
            f"{shown(args.output)}: an object-store output is a dataset: pass --shard-size N "
            "(a single LLMBATCH file is written to a local path)"
        )


def _convert_with_ray(args: argparse.Namespace, inputs: Sequence[str]) -> int:
    """``convert --engine ray``: the text pipeline on a Ray cluster, with Ray's progress display
    (``ray_convert``; the output is the local engine's, byte for byte)."""
    from ..ingest.convert import detect_kind

    kind = args.kind or detect_kind(inputs)
    if kind != "text" or args.align != "contiguous" or args.bos_token is not None:
        raise UsageError(
            f"--engine ray converts text sources only, not {kind} (nor --align, --bos-token); "
            "convert token sources (nanoGPT, .npy, Megatron, Hugging Face, MDS, Atlas) with "
            "the local engine"
        )
    try:
        from ..ingest.ray_convert import convert_with_ray
    except ImportError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        raise MissingDependencyError("ray", "ray", "converting with --engine ray") from e
    summary = convert_with_ray(
        args.sources,
        args.output,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        seed=args.seed,
        tokenizer=args.tokenizer,
        mode=args.mode,
        pad_id=args.pad_id,
        text_field=args.text_field,
        per_line=args.per_line,
        shard_batches=args.shard_batches,
        overwrite=args.overwrite,
        allow_empty=args.allow_empty,
        workers=args.workers,
        address=args.address,
        show_progress=not (args.quiet or args.json),
        kind=args.kind,
        dtype=args.dtype,
    )
    _print_summary(args, summary)
    return EXIT_OK


def _add_shape_options(p: argparse.ArgumentParser, seq_len_help: str, required: bool) -> None:
    """``--batch-size`` and ``--seq-len`` of ``write`` and ``convert``."""
    p.add_argument(
        "--batch-size",
        type=positive,
        required=True,
        metavar="B",
        help="records per batch: the training batch size (required)",
    )
    p.add_argument("--seq-len", type=positive, required=required, metavar="T", help=seq_len_help)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """The options ``write`` and ``convert`` share: the seed, what may be written, printing."""
    p.add_argument(
        "--seed",
        type=u32,
        default=0,
        metavar="S",
        help="shuffle seed in [0, 2**32 - 1]; the same input and seed give the same file",
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "uint16", "uint32"],
        default="auto",
        help="how tokens are stored: uint16 (half the bytes; ids up to 65,535), uint32, or auto: "
        "uint16 when every token fits (text: the tokenizer's vocabulary and BOS/pad ids; token "
        "files: 16-bit inputs, or the largest id written), else uint32 (default: auto); the "
        "summary says which was written and why",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUTPUT if it exists (default: refuse); an input is never replaced",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="write a file of 0 batches when the input fills no batch (default: refuse)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing but errors: no progress display, no summary (default: progress "
        "on a terminal, then a summary)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object, also with --quiet (default: text)",
    )
    p.add_argument(
        "--shard-size",
        dest="shard_batches",
        type=positive,
        default=None,
        metavar="N",
        help="write OUTPUT as a dataset directory of shards of N batches each, with a manifest "
        "naming the input file of every record range (default: one file)",
    )
    add_manifest_version(p)
    add_shard_prefixes(p)


def register(sub: Any) -> None:
    """Add ``write`` and ``convert`` to ``sub``, the subparsers of ``zerobatch``."""
    p = sub.add_parser(
        "write",
        help="write a [records, seq_len] token array (.npy) as an LLMBATCH file",
        description="Shuffle the records (rows) of a 2-D integer .npy array with --seed, group "
        "them into batches of --batch-size records and write them as an LLMBATCH file. "
        "Records that do not fill a last batch are dropped; the summary says how many. With "
        "--shard-size, OUTPUT is a dataset directory of shards instead.\n\n"
        "For a flat 1-D token array, nanoGPT .bin shards or text, use 'zerobatch convert'.",
        epilog="examples:\n"
        "  zerobatch write tokens.npy train.batch --batch-size 32\n"
        "  zerobatch write tokens.npy train.batch --batch-size 32 --seed 7 --overwrite\n"
        "  zerobatch write tokens.npy data/train --batch-size 32 --shard-size 1000",
    )
    p.add_argument(
        "input",
        metavar="INPUT",
        help=".npy file of integer tokens in [0, 2**32 - 1], shape [records, seq_len]",
    )
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="the .batch file to write (with --shard-size, the dataset directory)",
    )
    _add_shape_options(
        p, "tokens per record, checked against the array (default: the array's width)", False
    )
    _add_output_options(p)
    p.set_defaults(func=cmd_write)

    p = sub.add_parser(
        "convert",
        help="convert nanoGPT shards, .npy token arrays or text to an LLMBATCH file",
        description="Convert nanoGPT .bin shards, .npy token arrays or text (.parquet, .jsonl, "
        ".json, .txt) into one shuffled LLMBATCH file. The kind of source comes from the "
        "file suffixes (or --kind). Token streams are cut into records of --seq-len tokens; "
        "text is first tokenized (--tokenizer) and packed into records (--mode). Memory stays "
        "bounded whatever the corpus size, and OUTPUT appears only once it is complete.\n\n"
        "With --shard-size N, OUTPUT is a dataset directory: shards of N batches and a "
        "manifest (written last) that records which input file gave which records; text "
        "packed across files counts a record as its first token's file.\n\n"
        "Parquet files and the hf: and tiktoken: tokenizers need the text extra:\n"
        "  pip install 'zerobatch[text]'",
        epilog="examples:\n"
        "  zerobatch convert 'data/fineweb_train_*.bin' train.batch --seq-len 1024 "
        "--batch-size 32\n"
        "  zerobatch convert tokens.npy train.batch --seq-len 512 --batch-size 16\n"
        "  zerobatch convert 'data/*.bin' data/train --seq-len 1024 --batch-size 32 "
        "--shard-size 1000\n"
        "  zerobatch convert 'corpus/*.parquet' train.batch --seq-len 2048 --batch-size 16 \\\n"
        "      --tokenizer 'hf:tokenizer.json?bos=<|endoftext|>' --workers 8\n"
        "  zerobatch convert notes.txt train.batch --seq-len 256 --batch-size 8 --per-line\n"
        "  zerobatch convert 'corpus/*.parquet' data/train --seq-len 2048 --batch-size 16 \\\n"
        "      --shard-size 1000 --engine ray --address auto\n"
        "  zerobatch convert '/mnt/corpus/*.parquet' s3://bucket/data/train --seq-len 2048 \\\n"
        "      --batch-size 16 --shard-size 1000 --engine ray --address auto\n\n"
        "tokenizer specs (--tokenizer):\n"
        "  byte                            UTF-8 bytes, BOS 256, no files needed\n"
        "  hf:PATH/tokenizer.json?bos=TOK  a Hugging Face tokenizers model (&eos=TOK too)\n"
        "  tiktoken:PATH/NAME.tiktoken     a local tiktoken rank file (?bos=TOK&eos=TOK)\n"
        "  tiktoken:NAME                   a standard encoding in tiktoken's local cache\n\n"
        "Quote glob patterns, so that the shell does not expand them.",
    )
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="input files or quoted glob patterns, all of one kind, read in the order given",
    )
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="the .batch file to write (with --shard-size, the dataset directory; with "
        "--shard-size and --engine ray, also an object-store URL: s3://bucket/prefix, gs://, "
        "az://)",
    )
    _add_shape_options(p, "tokens per record: the training sequence length (required)", True)
    p.add_argument(
        "--kind",
        "--format",
        dest="kind",
        choices=["nanogpt", "npy", "text", "megatron", "hf", "mds", "atlas"],
        default=None,
        help="the kind of every source (default: detected: .bin nanoGPT, .npy, .parquet .jsonl "
        ".json .txt text; a Megatron PREFIX (.bin + .idx), a Hugging Face save_to_disk "
        "directory or .arrow file, parquet with a token column, an MDS directory, an Atlas "
        "directory)",
    )
    _add_output_options(p)
    text = p.add_argument_group("text sources")
    text.add_argument(
        "--tokenizer", default="byte", metavar="SPEC", help="see 'tokenizer specs' below"
    )
    text.add_argument(
        "--mode",
        choices=["pack", "pad"],
        default="pack",
        help="pack: documents, each starting with BOS, run on across records and nothing is "
        "padded; pad: one record per document, cut at --seq-len or filled up with --pad-id",
    )
    text.add_argument(
        "--pad-id",
        type=u32,
        default=None,
        metavar="ID",
        help="--mode pad only: the padding token id (default: the tokenizer's EOS id)",
    )
    text.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="the parquet column or JSON field holding each document",
    )
    text.add_argument(
        "--per-line",
        action="store_true",
        help="plain text: one document per line (default: one document per file)",
    )
    text.add_argument(
        "--workers",
        type=positive,
        default=None,
        metavar="N",
        help="tokenizer processes (default: 1), or with --engine ray tokenizer actors (default: "
        "one per CPU of the cluster); the output is the same for any N",
    )
    engine = p.add_argument_group("engine")
    engine.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: this machine; ray: text sources tokenized and written by Ray Data tasks "
        "across a Ray cluster (pip install 'zerobatch[ray]'), the same output byte for byte; "
        "the inputs must be at the same paths on every node, the output may be an object-store "
        "URL, written by the tasks straight to the store (no shared mount; each node's "
        "environment gives the store's credentials). A dataset already at a URL is refused, "
        "--overwrite or not (an object store cannot replace it in one step); --overwrite there "
        "only replaces shards an unfinished job left",
    )
    engine.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="--engine ray: the cluster to join, as ray.init(address=...) takes it: 'auto', "
        "HOST:PORT or ray://HOST:10001 (default: RAY_ADDRESS if set, else a new local cluster "
        "for this command)",
    )
    nanogpt = p.add_argument_group("token sources (nanoGPT, Megatron, Hugging Face, MDS, Atlas)")
    nanogpt.add_argument(
        "--align",
        choices=["contiguous", "bos", "documents"],
        default="contiguous",
        help="contiguous: cut records one after another (each file on its own); bos (nanoGPT): "
        "start every record at a --bos-token; documents (Megatron, Hugging Face, MDS, Atlas): "
        "start every record at a document",
    )
    nanogpt.add_argument(
        "--column",
        default="input_ids",
        metavar="NAME",
        help="Hugging Face, MDS, Atlas: the column (or field) holding each document's token ids "
        "(default: input_ids)",
    )
    nanogpt.add_argument(
        "--column-dtype",
        default=None,
        metavar="DTYPE",
        help="MDS bytes columns: the tokens' dtype, e.g. uint16, int32 (default: none; ndarray "
        "columns carry their own)",
    )
    nanogpt.add_argument(
        "--bos-token",
        type=u32,
        default=None,
        metavar="ID",
        help="the token id that starts a document (default: none; --align bos needs one)",
    )
    p.set_defaults(func=cmd_convert)
