"""``zerobatch inspect`` and ``zerobatch validate`` of local files and dataset directories.

One module for both: they take the same ``PATH`` and answer the same question at two depths
(what a file or dataset says it holds; whether it holds it). A URL or a live dataset is handed
to ``inspect_validate_remote``, whose reports keep these keys and words.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from zerobatch_spec import DTYPE_NAMES as DTYPE_NAMES  # the name of each code (cli exports it)
from zerobatch_spec import padded_batch_bytes
from zerobatch_spec.dataset import CHECKSUM_ALGORITHM, MANIFEST_FORMAT, Manifest

from ..datasets.dataset import DatasetError, DatasetReader
from ..datasets.validation import DatasetReport, validate_dataset
from ..delivery.mixture import is_mixture_file
from ..errors import FormatError
from ..files.reader import BatchFileReader
from ..files.validation import validate_file
from . import inspect_validate_remote, mixture
from .common import EXIT_INVALID, EXIT_OK, dataset_directory, plural, print_table, report_invalid


def dtype_text(code: int) -> str:
    """A token dtype code as ``inspect`` and ``validate`` show it: ``"1 (uint16)"``."""
    return f"{code} ({DTYPE_NAMES.get(code, 'unknown')})"


def _dataset_info(reader: DatasetReader) -> tuple[dict[str, Any], Manifest]:
    """What ``inspect`` shows of an open dataset (every shard entry read: a version 2
    dataset's index is read whole)."""
    m = reader.manifest
    batches = [s.num_batches for s in m.shards]
    records = sum(s.total_records for s in m.shards)
    info: dict[str, Any] = {
        "path": reader.path,
        "format": MANIFEST_FORMAT,
        "version": m.version,
        "shards": m.num_shards,
        "num_batches": m.num_batches,
        "batch_size": m.batch_size,
        "seq_len": m.seq_len,
        "seed": m.seed,
        "dtype": m.dtype,
        "dtype_name": DTYPE_NAMES[m.dtype],
        "padded_batch_bytes": padded_batch_bytes(m.batch_size, m.seq_len, m.dtype),
        "size": sum(s.size for s in m.shards),
        "tokens": m.num_batches * m.batch_size * m.seq_len,
        "total_records": records,
        "dropped_records": records - m.num_batches * m.batch_size,
        "shard_batches_min": min(batches, default=0),
        "shard_batches_max": max(batches, default=0),
        "checksum_algorithm": CHECKSUM_ALGORITHM,
        "checksums_xxh3": m.checksums_xxh3,
    }
    if m.index is not None:
        info["index"] = m.index.name
        info["index_size"] = m.index.size
        info["index_xxh3"] = m.index.xxh3
        info["prefixes"] = m.prefixes
    info["manifest_sha256"] = reader.manifest_sha256
    info["sources"] = len(m.sources)
    return info, m


def _inspect_dataset(args: argparse.Namespace) -> int:
    dataset_directory(args.file)
    try:
        reader = DatasetReader(args.file, verify="off")
    except DatasetError as e:
        error = {"code": e.code.value, "field": e.where, "detail": e.detail}
        return report_invalid("inspect", e.path, error, e, args.json)
    try:
        with reader:
            info, m = _dataset_info(reader)
    except DatasetError as e:  # a version 2 index's page, read as its shards are listed
        error = {"code": e.code.value, "field": e.where, "detail": e.detail}
        return report_invalid("inspect", e.path, error, e, args.json)
    if args.json:
        info["shard_list"] = [
            {
                "name": s.name,
                "num_batches": s.num_batches,
                "seed": s.seed,
                "total_records": s.total_records,
                "size": s.size,
                "records": None if s.records is None else list(s.records),
            }
            for s in m.shards
        ]
        info["source_list"] = [{"path": s.path, "records": list(s.records)} for s in m.sources]
        print(json.dumps(info))
        return EXIT_OK
    shown = {k: v for k, v in info.items() if k != "dtype_name"}
    shown["dtype"] = dtype_text(m.dtype)
    print_table(shown)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    if is_mixture_file(args.file):
        return mixture.inspect(args)
    if inspect_validate_remote.handles(args.file):  # a URL, or a live dataset
        return inspect_validate_remote.inspect(args)
    if os.path.isdir(args.file):
        return _inspect_dataset(args)
    try:
        reader = BatchFileReader(args.file)
    except FormatError as e:
        error = {"code": e.code.value, "field": e.field, "detail": e.detail}
        return report_invalid("inspect", e.path, error, e, args.json)
    with reader:
        h = reader.header
        info = {
            "path": reader.path,
            **h.as_dict(),
            "dtype_name": DTYPE_NAMES.get(h.dtype, "unknown"),
            "raw_batch_bytes": h.raw_batch_bytes,
            "padded_batch_bytes": h.padded_batch_bytes,
            "padding_fraction": 1 - h.raw_batch_bytes / h.padded_batch_bytes,
            "file_size": h.file_size,
            "tokens": h.num_batches * h.batch_size * h.seq_len,
            "dropped_records": h.total_records - h.num_batches * h.batch_size,
        }
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    shown = {k: v for k, v in info.items() if k != "dtype_name"}
    shown["dtype"] = dtype_text(h.dtype)
    print_table(shown)
    return EXIT_OK


def _print_dataset_report(report: DatasetReport) -> None:
    if report.valid:
        m = report.manifest
        assert m is not None
        mode = (
            "checked: manifest, shards, every slot's checksum and padding"
            if report.deep
            else "checked: manifest, checksums file, shard headers and sizes"
        )
        print(
            f"OK {report.path}: dataset of {plural(len(m.shards), 'shard')}, "
            f"{plural(m.num_batches, 'batch')} of [{m.batch_size}, {m.seq_len}] "
            f"{DTYPE_NAMES[m.dtype]} ({mode})"
        )
        return
    print(f"INVALID {report.path}: {plural(len(report.failures), 'failure')}")
    for failure in report.failures:
        print(f"  {failure}")


def cmd_validate(args: argparse.Namespace) -> int:
    if is_mixture_file(args.file):
        return mixture.validate(args, cmd_validate)
    if inspect_validate_remote.handles(args.file):  # a URL, or a live dataset
        return inspect_validate_remote.validate(args)
    if os.path.isdir(args.file):
        dataset_directory(args.file)
        dataset = validate_dataset(args.file, deep=args.deep)
        if args.json:
            print(json.dumps(dataset.as_dict()))
        else:
            _print_dataset_report(dataset)
        return EXIT_OK if dataset.valid else EXIT_INVALID
    report = validate_file(args.file, deep=args.deep)
    if args.json:
        print(json.dumps(report.as_dict()))
    elif report.valid:
        h = report.header
        assert h is not None
        mode = "header, size and padding" if report.deep else "header and size"
        print(
            f"OK {report.path}: {plural(h.num_batches, 'batch')} of "
            f"[{h.batch_size}, {h.seq_len}] {DTYPE_NAMES[h.dtype]} ({mode} checks)"
        )
    else:
        print(f"INVALID {report.path}: {report.code}: field {report.field}: {report.detail}")
    return EXIT_OK if report.valid else EXIT_INVALID


def register(sub: Any) -> None:
    """Add ``inspect`` and ``validate`` to ``sub``, the subparsers of ``zerobatch``."""
    p = sub.add_parser(
        "inspect",
        help="print a file's header fields and sizes",
        description="Print the header fields of an LLMBATCH file and the sizes derived from "
        "them: bytes per batch slot, padding, file size, tokens, and the records the writer "
        "dropped. Only the header is read, so it is instant on any file. A file that fails "
        "the header or size checks is reported as invalid (exit 1).\n\n"
        "For a dataset directory, the manifest's summary: shards, slots, batch shape, seed, "
        "size and checksum algorithm (--json adds every shard and source); only the manifest "
        "is read.\n\n"
        "PATH may also be a URL (s3://, gs://, az://, http(s)://, file://) of a file or a "
        "dataset, a live dataset (URL or directory), or a mixture file (JSON): its blend and "
        "each component's shape.",
        epilog="examples:\n"
        "  zerobatch inspect train.batch\n"
        "  zerobatch inspect train.batch --json\n"
        "  zerobatch inspect data/train/\n"
        "  zerobatch inspect s3://bucket/data/train",
    )
    p.add_argument(
        "file", metavar="PATH", help="the .batch file, dataset directory or URL to describe"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (default: text)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "validate",
        help="check a file against the format specification",
        description="Check an LLMBATCH file against the specification (spec/SPEC.md): the "
        "header rules and the exact file size and, with --deep, that the padding bytes of "
        "every batch slot are zero (this reads the whole file). Prints OK, or INVALID with "
        "the error code, the field and what was found.\n\n"
        "For a dataset directory: the manifest, the checksums file, and every shard against "
        "the manifest (present, size, header, file rules) and, with --deep, every slot's "
        "checksum and padding; *.batch files the manifest does not list are extra_shard. "
        "Every failure is listed with its shard and slot.\n\n"
        "PATH may also be a URL (s3://, gs://, az://, http(s)://, file://) of a file or a "
        "dataset, or a live dataset: every object against the manifest and, with --deep, "
        "every slot's checksum. A mixture file (JSON): every component as above, then that "
        "they fit together.",
        epilog="examples:\n"
        "  zerobatch validate train.batch\n"
        "  zerobatch validate train.batch --deep --json\n"
        "  zerobatch validate --deep data/train/\n"
        "  zerobatch validate --deep s3://bucket/data/train\n\n"
        "exit status: 0 valid, 1 invalid, 2 the path cannot be read.",
    )
    p.add_argument(
        "file", metavar="PATH", help="the .batch file, dataset directory or URL to check"
    )
    p.add_argument(
        "--deep",
        action="store_true",
        help="also read every slot: its padding bytes, and in a dataset its checksum "
        "(default: the header and file size only)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON object, with the error code if invalid "
        "(default: one line of text)",
    )
    p.set_defaults(func=cmd_validate)
