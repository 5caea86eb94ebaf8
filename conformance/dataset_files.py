"""Datasets built by the rules of ``SPEC.md`` section 12 from ``zerobatch_spec`` alone.

The building blocks of the dataset vectors: shards written by the file writer's rule (section 7),
named and seeded as the sharded writer does, their checksums file and canonical manifest; the
small dataset every broken vector starts from; and the answer a broken dataset expects
(``PROTOCOL.md``). Never the core's writer: the vectors test it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_UINT32, HEADER_SIZE, Header, parse_header
from zerobatch_spec.dataset import (
    CHECKSUM_BYTES,
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    SHARD_NAME_FORMAT,
    Manifest,
    Shard,
    Source,
    build_manifest,
    bytes_xxh3,
    header_xxh3,
    parse_manifest,
    shard_seed,
    slot_checksum,
)

from .vector import Vector, assemble, pseudo_tokens

DATASET_SUFFIX = ".dataset"
"""Name ending of a dataset vector's input directory (``PROTOCOL.md``)."""


Files = dict[str, bytes | None]
"""A dataset directory's entries: name to bytes, ``None`` for a folder (holding a README)."""


Records = npt.NDArray[np.uint32]


def shard_bytes(
    records: Records, batch_size: int, seq_len: int, seed: int, dtype: int = DTYPE_UINT32
) -> bytes:
    """The LLMBATCH file the file writer (section 7) makes of ``records`` with ``seed``, its
    tokens of dtype code ``dtype``."""
    total = int(records.shape[0])
    header = Header(batch_size, seq_len, total // batch_size, seed, total, dtype=dtype)
    return assemble(header, records)


def slot_sums(data: bytes) -> list[int]:
    """XXH3-64 of every slot of a shard, padding included, in slot order."""
    h = parse_header(data[:HEADER_SIZE])
    size = h.padded_batch_bytes
    return [
        slot_checksum(data[HEADER_SIZE + i * size : HEADER_SIZE + (i + 1) * size])
        for i in range(h.num_batches)
    ]


def checksums_file(sums: Sequence[int]) -> bytes:
    """The checksums file: one little-endian u64 per dataset slot."""
    return b"".join(int(v).to_bytes(CHECKSUM_BYTES, "little") for v in sums)


def shard_entry(name: str, data: bytes, records: tuple[int, int] | None) -> Shard:
    """The manifest's entry for a shard file ``data`` named ``name``."""
    h = parse_header(data[:HEADER_SIZE])
    return Shard(
        name, h.num_batches, h.seed, h.total_records, len(data), header_xxh3(data), records
    )


def build_dataset(
    batch_size: int,
    seq_len: int,
    seed: int,
    shards: Sequence[tuple[str, bytes, tuple[int, int] | None]],
    sources: Sequence[Source] = (),
    dtype: int = DTYPE_UINT32,
) -> Files:
    """A dataset's files: the shards (all of dtype code ``dtype``), the checksums of all their
    slots, and the manifest."""
    sums = checksums_file([v for _, data, _ in shards for v in slot_sums(data)])
    entries = tuple(shard_entry(name, data, records) for name, data, records in shards)
    manifest = Manifest(
        batch_size, seq_len, seed, entries, bytes_xxh3(sums), tuple(sources), dtype=dtype
    )
    files: Files = {name: data for name, data, _ in shards}
    files[CHECKSUMS_NAME] = sums
    files[MANIFEST_NAME] = build_manifest(manifest)
    return files


def sharded(
    records: Records,
    batch_size: int,
    seq_len: int,
    shard_batches: int,
    seed: int,
    sources: Sequence[Source] = (),
    dtype: int = DTYPE_UINT32,
) -> Files:
    """The sharded writer's dataset (section 12): consecutive ranges of
    ``shard_batches * batch_size`` records, shard ``i`` written with ``shard_seed(seed, i)``,
    every shard of dtype code ``dtype``."""
    per_shard = shard_batches * batch_size
    shards = []
    for i, first in enumerate(range(0, int(records.shape[0]), per_shard)):
        part = records[first : first + per_shard]
        data = shard_bytes(part, batch_size, seq_len, shard_seed(seed, i), dtype)
        shards.append((SHARD_NAME_FORMAT.format(i), data, (first, first + int(part.shape[0]))))
    return build_dataset(batch_size, seq_len, seed, shards, sources, dtype)


def manifest_of(files: Files) -> Manifest:
    """The parsed manifest of a dataset this module built."""
    data = files[MANIFEST_NAME]
    assert data is not None
    parsed = parse_manifest(data)
    assert isinstance(parsed, Manifest), parsed
    return parsed


def with_manifest(files: Files, edit: Callable[[Manifest], Manifest]) -> Files:
    """``files`` with the canonical manifest of ``edit(manifest)``."""
    return {**files, MANIFEST_NAME: build_manifest(edit(manifest_of(files)))}


def records_of(count: int, seq_len: int, salt: int, dtype: int = DTYPE_UINT32) -> Records:
    """``count`` pseudo-random records of ``seq_len`` tokens over dtype ``dtype``'s range."""
    return pseudo_tokens(count * seq_len, salt, dtype).reshape(count, seq_len)


BASE_BATCH_SIZE, BASE_SEQ_LEN, BASE_SEED = 2, 3, 3


def base_records(dtype: int = DTYPE_UINT32) -> Records:
    """The 7 input records of the base dataset (over dtype ``dtype``'s range: for uint16 the
    low 16 bits of the uint32 base's tokens)."""
    return records_of(7, BASE_SEQ_LEN, salt=77, dtype=dtype)


def base() -> Files:
    """The dataset every broken vector starts from: shards of 2 and 1 batches (of 2 x 3
    tokens, so every slot is padded), 7 records from one source, one dropped."""
    source = Source("input.bin", (0, 7))
    return sharded(base_records(), BASE_BATCH_SIZE, BASE_SEQ_LEN, 2, BASE_SEED, [source])


SHARD0, SHARD1 = SHARD_NAME_FORMAT.format(0), SHARD_NAME_FORMAT.format(1)


def failure(code: str, where: str | None = None, slot: int | None = None) -> dict[str, Any]:
    """The protocol's answer for a dataset that breaks a rule (``PROTOCOL.md``)."""
    out: dict[str, Any] = {"valid": False, "error": code}
    if where is not None:
        out["where"] = where
    if slot is not None:
        out["slot"] = slot
    return out


def broken(
    vid: str,
    comment: str,
    code: str,
    where: str | None,
    files: Files,
    flags: Sequence[str] = (),
    slot: int | None = None,
) -> Vector:
    """A dataset vector whose first failure is ``code`` at ``where`` (and ``slot``)."""
    return Vector(
        vid,
        comment,
        ["dataset", "dataset-invalid", code, *flags],
        DATASET_SUFFIX,
        None,
        failure(code, where, slot),
        tree=dict(files),
    )


def without(files: Files, *names: str) -> Files:
    """``files`` without ``names``."""
    return {k: v for k, v in files.items() if k not in names}
