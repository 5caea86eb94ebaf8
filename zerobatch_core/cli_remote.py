"""The command line's remote and live parts: ``inspect`` and ``validate`` of URLs and live
datasets, and ``zerobatch dataset reclaim``.

``cli.py`` hands a source here when it is a URL (``s3://``, ``gs://``, ``az://``,
``http(s)://``, ``file://``) or a live dataset directory; the output follows the local
commands' (the same keys where they mean the same, plus what a remote or live source adds).
A source whose manifest, header or live metadata breaks a rule is reported as the local
commands report one (``validate``: an ``INVALID`` report, or with ``--json`` a JSON report;
``inspect``: a line on stderr, and with ``--json`` a JSON object), exit status 1; a source
that cannot be reached or does not exist is an ``OSError``, exit status 2 (``cli.main``).
URLs are always shown redacted (no user information).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from zerobatch_spec import DTYPE_UINT32, padded_batch_bytes

from .dataset import DatasetError
from .errors import FormatError
from .live_manifests import LiveError
from .live_source import LiveSource
from .redaction import redact
from .remote import RemoteSource
from .retention import ChainError, reclaim, watermarks
from .sources import is_live, open_reader
from .storage import is_url

EXIT_OK, EXIT_INVALID = 0, 1


def handles(path: str) -> bool:
    """Whether ``path`` is for this module: a URL, or a local live dataset."""
    return is_url(path) or is_live(path)


BROKEN = (DatasetError, FormatError, LiveError)
"""What opening a source raises when its manifest, header or live metadata breaks a rule."""


def shown(path: str) -> str:
    """``path`` as messages and reports show it: a URL redacted, a local path as given."""
    return redact(path) if is_url(path) else path


def _open(path: str) -> RemoteSource:
    source = open_reader(path, verify="off")
    assert isinstance(source, RemoteSource)
    return source


def _error(e: Exception) -> dict[str, Any]:
    """The ``error`` object of a JSON report for ``e``, with the local commands' keys: a
    dataset's ``code``, ``field`` (the manifest field) and ``detail``; a file's ``code``,
    ``field`` and ``detail``; a live dataset's ``detail`` (its errors carry no code)."""
    if isinstance(e, DatasetError):
        return {"code": e.code.value, "field": e.where, "detail": e.detail}
    if isinstance(e, FormatError):
        return {"code": e.code.value, "field": e.field, "detail": e.detail}
    return {"code": None, "field": None, "detail": str(e)}


def _kind(e: Exception) -> str:
    """The ``kind`` (as ``_info`` says it) of a source whose opening raised ``e``."""
    if isinstance(e, DatasetError):
        return "dataset"
    if isinstance(e, FormatError):
        return "file"
    return "live"


def _info(source: RemoteSource) -> dict[str, Any]:
    b, t = source.batch_size, source.seq_len
    info: dict[str, Any] = {"path": redact(source.path) if is_url(source.path) else source.path}
    if isinstance(source, LiveSource):
        m = source.current
        info.update(
            kind="live",
            version=m.version,
            num_batches=source.committed,
            start=source.start,
            batch_size=b,
            seq_len=t,
            seed=source.seed,
            producers=len(m.producers),
            segments=len(m.segments),
            tail_entries=len(m.tail),
            dataset_id=source.descriptor.dataset_id,
            watermarks=sum(len(v) for v in watermarks(source.store).values()),
        )
    elif source.manifest is not None:
        d = source.manifest
        info.update(
            kind="dataset",
            shards=len(d.shards),
            num_batches=d.num_batches,
            batch_size=b,
            seq_len=t,
            seed=d.seed,
            size=sum(s.size for s in d.shards),
            manifest_sha256=source.manifest_sha256,
        )
    else:
        h = source.header
        assert h is not None
        info.update(kind="file", **h.as_dict(), file_size=h.file_size)
    info["dtype"] = DTYPE_UINT32
    info["padded_batch_bytes"] = padded_batch_bytes(b, t)
    return info


def inspect(args: argparse.Namespace) -> int:
    """``zerobatch inspect URL``: what the manifest (or header) says; nothing else is read."""
    try:
        source = _open(args.file)
    except BROKEN as e:
        if args.json:
            print(json.dumps({"path": shown(args.file), "valid": False, "error": _error(e)}))
        print(f"zerobatch inspect: {e}", file=sys.stderr)
        return EXIT_INVALID
    with source:
        info = _info(source)
    if args.json:
        print(json.dumps(info))
    else:
        width = max(len(k) for k in info)
        for k, v in info.items():
            print(f"{k:<{width}}  {v}")
    return EXIT_OK


def validate(args: argparse.Namespace) -> int:
    """``zerobatch validate URL``: every object against the manifest; ``--deep`` reads every
    slot and checks its checksum."""
    try:
        source = _open(args.file)
    except BROKEN as e:  # a broken manifest or header is an invalid source: a report, exit 1
        if args.json:
            report = {
                "path": shown(args.file),
                "kind": _kind(e),
                "valid": False,
                "deep": args.deep,
                "failures": [str(e)],
                "error": _error(e),
            }
            print(json.dumps(report))
        else:
            print(f"INVALID {shown(args.file)}: 1 failure")
            print(f"  {e}")
        return EXIT_INVALID
    with source:
        failures = source.validate(deep=args.deep)
        info = _info(source)
    valid = not failures
    if args.json:
        print(json.dumps({**info, "valid": valid, "deep": args.deep, "failures": failures}))
    elif valid:
        mode = "every slot's checksum" if args.deep else "object sizes and headers"
        print(
            f"OK {info['path']}: {info['kind']} of {info['num_batches']} batches of "
            f"[{info['batch_size']}, {info['seq_len']}] (checked: {mode})"
        )
    else:
        print(f"INVALID {info['path']}: {len(failures)} failures")
        for failure in failures:
            print(f"  {failure}")
    return EXIT_OK if valid else EXIT_INVALID


def cmd_dataset_reclaim(args: argparse.Namespace) -> int:
    """``zerobatch dataset reclaim URL``: delete what no live checkpoint can roll back to.

    A chain of manifest versions that does not verify (``ChainError``) deletes nothing and
    exits 1, with ``--dry-run`` too; with ``--json`` the refusal is one JSON object as well.
    Findings (watermarks ignored or unverified, keys left alone) are printed either way."""
    try:
        report = reclaim(args.dataset, keep_versions=args.keep_versions, dry_run=args.dry_run)
    except ChainError as e:
        if not args.json:
            raise
        print(json.dumps({"refused": True, "error": str(e), "dry_run": args.dry_run}))
        return EXIT_INVALID
    if args.json:
        print(json.dumps({"refused": False, **report.as_dict()}))
        return EXIT_OK
    for warning in report.warnings():
        print(f"warning: {warning}")
    verb = "would delete" if report.dry_run else "deleted"
    if not report.deleted:
        print(
            f"nothing to reclaim: manifest version {report.version}, first batch "
            f"{report.start}, lowest watermark {report.watermark} ({report.versions_checked} "
            "versions checked)"
        )
        return EXIT_OK
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(report.deleted.items()))
    print(
        f"{verb} {parts} ({report.deleted_bytes} bytes); lowest watermark "
        f"{report.watermark}, the dataset now starts at batch {report.start} "
        f"(manifest version {report.version}, {report.versions_checked} versions checked)"
    )
    return EXIT_OK


def add_reclaim(actions: Any, parser_class: Any) -> None:
    """The ``dataset reclaim`` action's parser."""
    c = actions.add_parser(
        "reclaim",
        help="delete what no live checkpoint of a live dataset can roll back to",
        description="Delete the batch objects, segments and manifest versions of a live "
        "dataset that lie below the lowest watermark its consumers recorded with their "
        "checkpoints (zerobatch_core.retention.record_watermark), after committing a "
        "manifest version that no longer lists them. It first checks that every manifest "
        "version present follows from the one before it (SPEC.md section 18.4) and deletes "
        "nothing (exit status 1, --dry-run too) if one does not. Watermarks of another "
        "dataset or beyond the committed end are ignored and reported. Without any watermark "
        "no batch is deleted. Idempotent and safe to interrupt: run it again at any time.",
        epilog="examples:\n  zerobatch dataset reclaim s3://bucket/run\n"
        "  zerobatch dataset reclaim data/live --dry-run --json",
    )
    c.add_argument("dataset", metavar="DATASET", help="the live dataset (a URL or a directory)")

    def at_least_one(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}")
        return value

    c.add_argument(
        "--keep-versions",
        type=at_least_one,
        default=4,
        metavar="N",
        help="manifest versions kept, the newest N (default: 4)",
    )
    c.add_argument("--dry-run", action="store_true", help="report what would go, delete nothing")
    c.add_argument("--json", action="store_true", help="print one JSON object (default: text)")
    c.set_defaults(func=cmd_dataset_reclaim)
