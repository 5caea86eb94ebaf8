"""Validation of a dataset directory: its manifest, every shard against it, and with ``deep``
every slot's checksum and padding, every failure listed by shard and slot. One file's rules are
checked by ``files/validation.py``, which this builds on.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec.dataset import (
    CHECKSUM_ALGORITHM,
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    DatasetCode,
    Manifest,
    bytes_xxh3,
)

from ..errors import FormatError, ZeroBatchIOError
from ..files import validation as file_validation
from ..files.reader import BatchFileReader
from ..files.validation import ValidationReport as ValidationReport  # both kinds in one place
from ..files.validation import padding_violation
from ..files.validation import validate_file as validate_file
from .dataset import DatasetError, DatasetReader, file_slot_checksum


@dataclass(frozen=True)
class DatasetFailure:
    """One thing wrong with a dataset: a stable code, the shard and slot concerned, and what.

    ``code`` is a ``DatasetCode`` value (``shard_missing``, ``checksum_mismatch``, ...) or, for a
    shard that breaks a file rule, an ``ErrorCode`` value (``bad_magic``, ``nonzero_padding``).
    ``shard`` is the shard's file name (``None`` for the manifest and the checksums file),
    ``slot`` the slot within the shard and ``dataset_slot`` its index in the dataset (both
    ``None`` when the failure is not one slot's). ``where`` is the manifest field, shard field
    or file concerned.
    """

    code: str
    shard: str | None
    slot: int | None
    dataset_slot: int | None
    where: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "code": self.code,
            "shard": self.shard,
            "slot": self.slot,
            "dataset_slot": self.dataset_slot,
            "where": self.where,
            "detail": self.detail,
        }

    def __str__(self) -> str:
        place = self.shard or self.where
        if self.slot is not None:
            place += f" slot {self.slot} (dataset slot {self.dataset_slot})"
        return f"{place}: {self.code}: {self.detail}"


@dataclass(frozen=True)
class DatasetReport:
    """Outcome of validating a dataset directory: every failure found, in manifest order."""

    path: str
    deep: bool
    manifest: Manifest | None
    failures: tuple[DatasetFailure, ...] = ()
    shards_checked: int = 0
    slots_checked: int = 0

    @property
    def valid(self) -> bool:
        """Whether nothing failed."""
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form used by ``zerobatch validate --json`` on a dataset."""
        out: dict[str, Any] = {"path": self.path, "valid": self.valid, "deep": self.deep}
        m = self.manifest
        if m is not None:
            out["dataset"] = {
                "manifest_version": m.version,
                "shards": m.num_shards,
                "num_batches": m.num_batches,
                "batch_size": m.batch_size,
                "seq_len": m.seq_len,
                "dtype": m.dtype,
                "seed": m.seed,
                "checksum_algorithm": CHECKSUM_ALGORITHM,
            }
        out["shards_checked"] = self.shards_checked
        out["slots_checked"] = self.slots_checked
        out["failures"] = [f.as_dict() for f in self.failures]
        return out


def _dataset_failure(e: DatasetError, shard: str | None) -> DatasetFailure:
    return DatasetFailure(e.code.value, shard, None, None, e.where, e.detail)


def _file_failure(
    e: FormatError, shard: str, slot: int | None = None, first: int = 0
) -> DatasetFailure:
    where = f"{shard}: field {e.field}"
    return DatasetFailure(
        e.code.value, shard, slot, None if slot is None else first + slot, where, e.detail
    )


def _slot_failures(
    reader: BatchFileReader, name: str, first: int, sums: npt.NDArray[np.uint64] | None
) -> list[DatasetFailure]:
    """Every slot of one open shard whose padding is not zero or whose XXH3-64 is not the
    checksums file's (``sums``; ``None`` when that file is broken), chunk by chunk."""
    h = reader.header
    failures: list[DatasetFailure] = []
    step = max(1, file_validation.DEEP_CHUNK_BYTES // h.padded_batch_bytes)  # one setting
    for b0 in range(0, h.num_batches, step):
        b1 = min(b0 + step, h.num_batches)
        try:
            reader.check_size()  # a shard shrunk under the mapping: report, never fault
        except FormatError as e:
            failures.append(_file_failure(e, name))
            return failures
        pad = reader.slot_padding(b0, b1)
        bad = set(np.flatnonzero(pad.any(axis=1)).tolist()) if pad.size else set()
        for local in range(b0, b1):
            if local - b0 in bad:
                v = padding_violation(h, local, pad[local - b0])
                where = f"{name}: field {v.field}"
                failures.append(
                    DatasetFailure(v.code.value, name, local, first + local, where, v.detail)
                )
            if sums is None:
                continue
            got, want = file_slot_checksum(reader, local), int(sums[first + local])
            if got != want:
                failures.append(
                    DatasetFailure(
                        DatasetCode.CHECKSUM_MISMATCH.value,
                        name,
                        local,
                        first + local,
                        name,
                        f"slot {local} (dataset slot {first + local}): xxh3 {got:016x}, the "
                        f"checksums file says {want:016x}",
                    )
                )
    return failures


def validate_dataset(path: str | os.PathLike[str], deep: bool = False) -> DatasetReport:
    """Check a dataset directory and report every failure, naming the shard and the slot.

    Always: the manifest's rules (a broken manifest is the only failure reported: nothing else
    can be checked without it), the checksums file against the manifest's digest, every shard
    as ``DatasetReader`` opens it (present, the manifest's size, file rules 1-8, the manifest's
    header fields and digest), and ``extra_shard`` for each ``*.batch`` file in the directory
    that the manifest does not list. With ``deep``, also every slot of every shard that passed:
    its padding (``nonzero_padding``) and its XXH3-64 (``checksum_mismatch``), reading every
    byte once. A path that is not a directory with a manifest raises ``ZeroBatchIOError``.
    """
    p = os.fspath(path)
    if not os.path.isdir(p):
        raise ZeroBatchIOError(errno.ENOTDIR, "not a dataset directory", p)
    if not os.path.isfile(os.path.join(p, MANIFEST_NAME)):
        raise ZeroBatchIOError(
            errno.ENOENT, f"not a dataset: the directory has no {MANIFEST_NAME}", p
        )
    try:
        reader = DatasetReader(p, verify="off", max_open=4)
    except DatasetError as e:
        return DatasetReport(p, deep, None, (_dataset_failure(e, None),))
    failures: list[DatasetFailure] = []
    checked = slots = 0
    with reader:
        manifest = reader.manifest
        sums: npt.NDArray[np.uint64] | None = None
        try:
            sums = reader.checksums()
        except DatasetError as e:
            failures.append(_dataset_failure(e, None))
        except OSError as e:  # not a regular file, unreadable: no checksums to check against
            detail = f"cannot be read as the checksums file: {e.strerror or e}"
            code = DatasetCode.CHECKSUMS_MISMATCH.value
            failures.append(DatasetFailure(code, None, None, None, CHECKSUMS_NAME, detail))
        first = reader.table.firsts
        listed: set[str] = set()
        for i in range(len(reader.table)):
            try:
                shard = reader.table.entry(i)
            except DatasetError as e:  # a version 2 index's page: its shards cannot be read
                failures.append(_dataset_failure(e, None))
                continue
            if shard.name in listed:
                failures.append(
                    DatasetFailure(
                        DatasetCode.INDEX_MISMATCH.value,
                        shard.name,
                        None,
                        None,
                        f"shards[{i}].name",
                        f"{shard.name} is listed twice",
                    )
                )
            listed.add(shard.name)
            if sums is not None:
                failures.extend(_range_failure(reader, i, shard.name, sums))
            try:
                opened = reader.shard(i)
            except DatasetError as e:
                failures.append(_dataset_failure(e, shard.name))
                if e.code is DatasetCode.SHARD_SIZE_MISMATCH:
                    failures.extend(_own_rules(reader.shard_path(i), shard.name))
                continue
            except FormatError as e:
                failures.append(_file_failure(e, shard.name))
                continue
            checked += 1
            if deep:
                failures.extend(_slot_failures(opened, shard.name, int(first[i]), sums))
                slots += shard.num_batches
        own = {manifest.index.name} if manifest.index is not None else set()
        for name in sorted(os.listdir(p)):
            if name.endswith(".batch") and name not in listed and name not in own:
                failures.append(
                    DatasetFailure(
                        DatasetCode.EXTRA_SHARD.value,
                        name,
                        None,
                        None,
                        name,
                        f"{name} is in the directory but the manifest does not list it",
                    )
                )
    return DatasetReport(p, deep, manifest, tuple(failures), checked, slots)


def _range_failure(
    reader: DatasetReader, shard: int, name: str, sums: npt.NDArray[np.uint64]
) -> list[DatasetFailure]:
    """A version 2 shard whose range of the checksums file has another digest than its index
    record says (the file itself matched the manifest's digest)."""
    digest = reader.table.checksums_xxh3(shard)
    if digest is None:
        return []
    lo, hi = int(reader.table.firsts[shard]), int(reader.table.firsts[shard + 1])
    found = bytes_xxh3(sums[lo:hi].astype("<u8").tobytes())
    if found == digest:
        return []
    detail = f"shard {shard}'s range has xxh3 {found}; the index says {digest}"
    code = DatasetCode.CHECKSUMS_MISMATCH.value
    return [DatasetFailure(code, None, None, None, CHECKSUMS_NAME, f"{name}: {detail}")]


def _own_rules(path: str, name: str) -> list[DatasetFailure]:
    """A resized shard's own file-rule failure, if it breaks one (for a fuller report)."""
    try:
        with BatchFileReader(path):
            return []
    except FormatError as e:
        return [_file_failure(e, name)]
