"""``zerobatch dataset``: its actions ``create`` (a manifest over LLMBATCH files in a directory)
and ``reclaim`` (deleting what no live checkpoint of a live dataset can roll back to).

The actions share the ``dataset`` parser, so they share a module.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from zerobatch_spec.dataset import MANIFEST_NAME

from ..errors import WriteError
from ..live.retention import ChainError, reclaim
from .common import EXIT_INVALID, EXIT_OK, UsageError, add_manifest_version, plural, u64
from .flags import Parser


def _shard_name(directory: str, path: str) -> str:
    """A ``FILE`` of ``dataset create`` as a name inside ``directory``: a bare name is one,
    a path must lie in the directory itself."""
    where, name = os.path.split(path)
    if where and os.path.realpath(where) != os.path.realpath(directory):
        raise UsageError(
            f"{path}: not in {directory}; a dataset's shards are files inside its directory "
            f"(move or link them there, or name them relative to it)"
        )
    return name


def cmd_dataset_create(args: argparse.Namespace) -> int:
    """``dataset create``: the names are checked against the manifest's name rule first (a
    usage error naming every bad one, nothing written), then ``create_dataset`` writes (and,
    with ``--overwrite``, swaps in) the manifest."""
    from ..datasets.build import create_dataset, dataset_shard_names

    directory = args.directory
    if not os.path.isdir(directory):
        raise UsageError(f"{directory}: no such directory")
    try:
        names = dataset_shard_names(
            directory, [_shard_name(directory, f) for f in args.files] or None
        )
    except WriteError as e:
        raise UsageError(str(e)) from e
    manifest = create_dataset(
        directory,
        names,
        seed=args.seed,
        overwrite=args.overwrite,
        manifest_version=args.manifest_version,
    )
    summary = {
        "path": os.path.join(directory, MANIFEST_NAME),
        "manifest_version": manifest.version,
        "shards": len(manifest.shards),
        "num_batches": manifest.num_batches,
        "batch_size": manifest.batch_size,
        "seq_len": manifest.seq_len,
        "seed": manifest.seed,
        "size": sum(s.size for s in manifest.shards),
    }
    if args.json:
        print(json.dumps(summary))
    elif not args.quiet:
        print(
            f"wrote {summary['path']}: {plural(len(manifest.shards), 'shard')}, "
            f"{plural(manifest.num_batches, 'batch')} of [{manifest.batch_size}, "
            f"{manifest.seq_len}], seed {manifest.seed}"
        )
    return EXIT_OK


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


def register(sub: Any) -> None:
    """Add ``dataset`` and its actions to ``sub``, the subparsers of ``zerobatch``."""
    p = sub.add_parser(
        "dataset",
        help="build dataset directories (manifests over LLMBATCH shards)",
        description="A dataset is a directory of LLMBATCH files (shards) of one batch size "
        "and sequence length, described by manifest.json (written last, atomically) and "
        "checksums.xxh3 (an XXH3-64 of every batch slot). 'zerobatch convert --shard-size' "
        "writes one; 'dataset create' describes files that already exist.",
        epilog="examples:\n  zerobatch dataset create data/train\n"
        "  zerobatch dataset create data/train part-0.batch part-1.batch --seed 7",
    )
    actions = p.add_subparsers(
        dest="action", required=True, metavar="ACTION", title="actions", parser_class=Parser
    )
    c = actions.add_parser(
        "create",
        help="write a manifest over LLMBATCH files in a directory",
        description="Describe LLMBATCH files inside DIR as a dataset: read every batch slot "
        "once to checksum it, then write checksums.xxh3 and manifest.json. The files must "
        "share batch_size and seq_len; their order is the dataset's.",
        epilog="examples:\n"
        "  zerobatch dataset create data/train\n"
        "  zerobatch dataset create data/train data/train/b.batch data/train/a.batch\n"
        "  zerobatch dataset create data/train --seed 7 --overwrite --json",
    )
    c.add_argument("directory", metavar="DIR", help="the directory holding the files")
    c.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="the shard files in dataset order, by name or as paths inside DIR "
        "(default: every *.batch file in DIR, sorted by name)",
    )
    c.add_argument(
        "--seed",
        type=u64,
        default=None,
        metavar="S",
        help="the dataset's order seed, the loader's default (default: the first file's seed)",
    )
    c.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the manifest of a directory that is already a dataset (default: refuse)",
    )
    add_manifest_version(c)
    c.add_argument("--quiet", action="store_true", help="print nothing but errors")
    c.add_argument("--json", action="store_true", help="print one JSON object (default: text)")
    c.set_defaults(func=cmd_dataset_create)
    _add_reclaim(actions)


def _add_reclaim(actions: Any) -> None:
    """Add the ``dataset reclaim`` action's parser to ``actions``."""
    c = actions.add_parser(
        "reclaim",
        help="delete what no live checkpoint of a live dataset can roll back to",
        description="Delete the batch objects, segments and manifest versions of a live "
        "dataset that lie below the lowest watermark its consumers recorded with their "
        "checkpoints (zerobatch_core.live.retention.record_watermark), after committing a "
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
