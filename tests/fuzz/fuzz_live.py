"""Long fuzz run of live datasets: mutants of ``live.json``, manifest versions, segments and
watermarks, read and reclaimed.

Run from the repository root (``tests/fuzz/README.md`` has the figures of the last run)::

    nice -n 10 .venv/bin/python -m tests.fuzz.fuzz_live --mutants 50000 --workers 2

The base is a small local live dataset (``mutants.live_base``): one producer's 12 batches,
committed one by one and sealed in segments of 2, and a consumer ``c-1`` whose checkpoint
(recorded with ``record_watermark``) reads from batch 7. A mutant changes its documents
(JSON-aware and byte-level mutations, a crafted version far ahead of the real ones, a version
that drops committed entries, watermarks beyond the committed end, ``record_watermark`` of a
state from another dataset or beyond the end, FIFOs, stray objects; ``mutants.py`` lists
them). Every mutant goes through: a ``LiveSource`` that reads what it lists (each batch served
must be one whole batch of the base), the loader over it, ``zerobatch inspect`` and
``zerobatch validate --deep --json``, the hostile ``record_watermark`` calls, then
``reclaim(dry_run=True)`` and a real ``reclaim`` on the mutant (itself a copy).

On top of the campaign outcomes (``harness.py``), a real reclaim that deletes a batch object
that the unmutated dataset's reclaim keeps is a finding of its own kind, **loss**: retention
must never delete data because of a crafted or mistaken document.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from itertools import islice
from typing import Any

import numpy as np

from tests.fuzz.fuzz_datasets import run_command
from tests.fuzz.harness import Campaign, Step, campaign_main, run_entries
from tests.fuzz.mutants import (
    LIVE_BATCHES,
    Op,
    apply_live,
    live_base,
    live_identify,
    materialize,
    random_live_mutant,
)

READ_LIMIT = 16
"""Global batches a ``LiveSource`` reads from its start at most (a crafted version can claim
2^64 of them)."""

_KEPT: dict[str, set[str]] = {}


def legitimate(op: Op) -> bool:
    """Whether ``op`` changes the live checkpoints as a consumer may: a watermark deleted
    (its checkpoint was), or one added inside the committed range."""
    if op[0] == "remove":
        return str(op[1]).startswith("watermarks/")
    return bool(op[0] == "mark" and 0 <= op[2] <= LIVE_BATCHES)


def kept_batches(ops: list[Op]) -> set[str]:
    """The batch objects a real ``reclaim`` keeps in the unmutated base with only the
    legitimate watermark changes of ``ops`` (computed once per set of changes)."""
    changes = [op for op in ops if legitimate(op)]
    key = json.dumps(changes)
    if key not in _KEPT:
        from zerobatch_core.live.retention import reclaim

        with tempfile.TemporaryDirectory() as tmp:
            materialize(apply_live(live_base(), changes), tmp)
            reclaim(tmp)
            _KEPT[key] = set(batch_keys(tmp))
    return _KEPT[key]


def batch_keys(root: str) -> list[str]:
    """Every regular file under ``root/batches``, as a store key."""
    out = []
    for directory, _, names in os.walk(os.path.join(root, "batches")):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(os.path.relpath(path, root).replace(os.sep, "/"))
    return out


def _read(root: str) -> None:
    """Read every batch the newest version lists (at most ``READ_LIMIT``); each must be a
    whole batch of the base, with the base's uint32 tokens: a descriptor whose dtype a mutant
    changed must get its batch objects refused, never read with another token width."""
    from zerobatch_core.live.source import LiveSource

    with LiveSource(root, timeout=0.2) as source:
        for g in range(source.start, min(source.committed, source.start + READ_LIMIT)):
            got = source.read_batch(g)
            assert live_identify(got) is not None, f"global batch {g}: not a batch of the base"
            assert got.dtype == source.token_dtype == np.uint32, (
                f"global batch {g}: {got.dtype} tokens from a {source.token_dtype} source"
            )


def _loader(root: str, index: int) -> None:
    """The loader over the mutant from its first listed batch, a few steps; one mutant in
    four with a global batch size of half a stored batch (two steps a batch)."""
    from zerobatch_core import BatchNativeLoader
    from zerobatch_core.live.source import LiveSource

    with LiveSource(root, timeout=0.2) as source:
        b = source.batch_size  # the descriptor's, which a mutant may have changed
        split = 2 if index % 4 == 0 and b % 2 == 0 else 1
        steps = max(0, min(source.committed - source.start, 3)) * split
        loader = BatchNativeLoader(source, dtype="int64", global_batch_size=b // split)
        if source.start:
            loader.load_state_dict(
                {
                    **loader.state_dict(),
                    "step": split * source.start,
                    "samples": source.start * b,
                }
            )
        for item in islice(iter(loader), steps):
            assert item.shape == (b // split, source.seq_len), item.shape


def _record(root: str, ops: list[Op]) -> None:
    """``record_watermark`` with each hostile state of the mutant (``("record", ...)`` ops),
    keeping one watermark: a refusal is a ZeroBatch error."""
    from zerobatch_core import BatchNativeLoader
    from zerobatch_core.errors import ZeroBatchError
    from zerobatch_core.live.retention import record_watermark
    from zerobatch_core.live.source import LiveSource

    records = [op for op in ops if op[0] == "record"]
    if not records:
        return
    state: dict[str, Any] = {}
    try:
        with LiveSource(root, timeout=0.2) as source:
            state = BatchNativeLoader(source).state_dict()
    except (ZeroBatchError, OSError):  # the source's own failures count under "source"
        state = {"format": "zerobatch.BatchNativeLoader", "version": 1}
    for _, samples, batch_size, foreign in records:
        hostile = {**state, "samples": samples, "batch_size": batch_size}
        hostile["step"] = samples // batch_size if batch_size > 0 else samples
        if foreign:
            hostile["source"] = {"live": "f" * 32}
        record_watermark(root, "c-1", hostile, keep=1)


def _reclaim(root: str, ops: list[Op], lost: list[str]) -> None:
    """A real ``reclaim``; ``lost`` gets the batch objects it deleted that the unmutated
    dataset's reclaim keeps (with the mutant's legitimate watermark changes)."""
    from zerobatch_core.live.retention import reclaim

    keep = kept_batches(ops)
    before = set(batch_keys(root))
    try:
        reclaim(root)
    finally:
        lost.extend(sorted((before - set(batch_keys(root))) & keep))


def check_live(
    root: str, index: int, ops: list[Op], at: Callable[[int], None]
) -> list[tuple[str, str, str]]:
    """Every live entry point on the mutant at ``root``, reclaim last."""
    from zerobatch_core.cli import UsageError
    from zerobatch_core.live.retention import reclaim

    usage = (UsageError,)
    lost: list[str] = []
    steps: list[Step] = [
        ("source", lambda: _read(root), ()),
        ("loader", lambda: _loader(root, index), ()),
        ("inspect", lambda: run_command(["inspect", "--json", root]), usage),
        ("validate", lambda: run_command(["validate", "--deep", "--json", root]), usage),
        ("record", lambda: _record(root, ops), ()),
        ("reclaim-dry", lambda: reclaim(root, dry_run=True), ()),
        ("reclaim", lambda: _reclaim(root, ops, lost), ()),
    ]
    results = run_entries(steps, at)
    if lost:  # the real reclaim, last, deleted what it must keep
        entry, _, detail = results[-1]
        detail = (
            f"DataLoss: reclaim deleted {len(lost)} batch object(s) the unmutated "
            f"dataset's reclaim keeps: {', '.join(lost[:4])}\n{detail}"
        )
        results[-1] = (entry, "loss", detail)
    return results


LIVE = Campaign(
    module="tests.fuzz.fuzz_live",
    mutant=random_live_mutant,
    bases=lambda: (live_base(),),
    apply=apply_live,
    entries=("source", "loader", "inspect", "validate", "record", "reclaim-dry", "reclaim"),
    check=check_live,
)


if __name__ == "__main__":
    raise SystemExit(campaign_main(LIVE, mutants=50_000))
