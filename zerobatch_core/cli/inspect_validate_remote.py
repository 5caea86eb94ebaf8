"""``zerobatch inspect`` and ``zerobatch validate`` of URLs and live datasets.

``inspect_validate`` hands a source here when it is a URL (``s3://``, ``gs://``, ``az://``,
``http(s)://``, ``file://``) or a live dataset directory; the output follows the local
commands' (the same keys where they mean the same, plus what a remote or live source adds).
A source whose manifest, header or live metadata breaks a rule is reported as the local
commands report one (``validate``: an ``INVALID`` report, or with ``--json`` a JSON report;
``inspect``: a line on stderr, and with ``--json`` a JSON object), exit status 1; a source
that cannot be reached or does not exist is an ``OSError``, exit status 2 (``cli.main``).
URLs are always shown redacted (no user information). A module of its own because opening a
remote or live source, and what its report adds, is a concern the local commands do not have.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from zerobatch_spec import DTYPE_NAMES, padded_batch_bytes

from ..datasets.dataset import DatasetError
from ..datasets.remote import RemoteSource
from ..delivery.sources import is_live, open_reader
from ..errors import FormatError
from ..live.manifests import LiveError
from ..live.retention import watermarks
from ..live.source import LiveSource
from ..redaction import redact
from ..stores.store import is_url
from .common import EXIT_INVALID, EXIT_OK, print_table, report_invalid, shown


def handles(path: str) -> bool:
    """Whether ``path`` is for this module: a URL, or a local live dataset."""
    return is_url(path) or is_live(path)


BROKEN = (DatasetError, FormatError, LiveError)
"""What opening a source raises when its manifest, header or live metadata breaks a rule."""


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
            manifest_version=d.version,
            **({"prefixes": d.prefixes} if d.index is not None else {}),
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
    info["dtype"] = source.dtype
    info["dtype_name"] = DTYPE_NAMES[source.dtype]
    info["padded_batch_bytes"] = padded_batch_bytes(b, t, source.dtype)
    return info


def _shown(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` as the text table shows it: the dtype as its code and name (``1 (uint16)``)."""
    shown = {k: v for k, v in info.items() if k != "dtype_name"}
    shown["dtype"] = f"{info['dtype']} ({info['dtype_name']})"
    return shown


def inspect(args: argparse.Namespace) -> int:
    """``zerobatch inspect URL``: what the manifest (or header) says; nothing else is read."""
    try:
        source = _open(args.file)
    except BROKEN as e:
        return report_invalid("inspect", shown(args.file), _error(e), e, args.json)
    with source:
        info = _info(source)
    if args.json:
        print(json.dumps(info))
    else:
        print_table(_shown(info))
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
            f"[{info['batch_size']}, {info['seq_len']}] {info['dtype_name']} (checked: {mode})"
        )
    else:
        print(f"INVALID {info['path']}: {len(failures)} failures")
        for failure in failures:
            print(f"  {failure}")
    return EXIT_OK if valid else EXIT_INVALID
