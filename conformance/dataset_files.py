"""Datasets built by the rules of ``SPEC.md`` section 12 from ``zerobatch_spec`` alone.

The building blocks of the dataset vectors: shards written by the file writer's rule (section 7),
named and seeded as the sharded writer does, their checksums file and canonical manifest; the
small dataset every broken vector starts from; and the answer a broken dataset expects
(``PROTOCOL.md``). For version 2 (section 23) the same files described by a shard index, and
the pieces of an index to edit and seal again. Never the core's writer: the vectors test it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_UINT32, HEADER_SIZE, Header, parse_header
from zerobatch_spec.dataset import (
    CHECKSUM_BYTES,
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    MANIFEST_VERSION_INDEXED,
    SHARD_NAME_FORMAT,
    DatasetCode,
    DatasetViolation,
    IndexRef,
    Manifest,
    Shard,
    Source,
    build_manifest,
    bytes_xxh3,
    header_xxh3,
    parse_manifest,
    shard_file_name,
    shard_seed,
    slot_checksum,
)
from zerobatch_spec.index import (
    HEAD,
    HEAD_SIZE,
    INDEX_NAME,
    PAGE_ENTRY,
    PAGE_RECORDS,
    RECORD,
    RECORD_SIZE,
    RUN,
    IndexTop,
    build_index,
    check_top,
    iter_shards,
    parse_top,
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
    prefixes: int = 1,
) -> Files:
    """The sharded writer's dataset (section 12): consecutive ranges of
    ``shard_batches * batch_size`` records, shard ``i`` written with ``shard_seed(seed, i)``
    and named ``shard_file_name(i, prefixes)`` (23.1), every shard of dtype code ``dtype``."""
    per_shard = shard_batches * batch_size
    shards = []
    for i, first in enumerate(range(0, int(records.shape[0]), per_shard)):
        part = records[first : first + per_shard]
        data = shard_bytes(part, batch_size, seq_len, shard_seed(seed, i), dtype)
        shards.append((shard_file_name(i, prefixes), data, (first, first + int(part.shape[0]))))
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


# -- version 2: the shard index (section 23) -----------------------------------------------------


def indexed(
    files: Files,
    page_records: int = PAGE_RECORDS,
    index_name: str = INDEX_NAME,
    prefixes: int = 1,
) -> Files:
    """``files`` (a version 1 dataset this module built) described by a version 2 manifest and
    a shard index named ``index_name`` of ``page_records`` records a page, its names spread
    over ``prefixes`` key prefixes: the shards and the checksums file stay as they are."""
    manifest = manifest_of(files)
    sums = files[CHECKSUMS_NAME]
    assert sums is not None and manifest.index is None
    index = build_index(
        manifest.shards,
        sums,
        batch_size=manifest.batch_size,
        seq_len=manifest.seq_len,
        dtype=manifest.dtype,
        seed=manifest.seed,
        page_records=page_records,
        prefixes=prefixes,
    )
    top = parse_top(index, len(index))
    assert isinstance(top, IndexTop), top
    v2 = dataclasses.replace(
        manifest,
        shards=(),
        version=MANIFEST_VERSION_INDEXED,
        index=IndexRef(index_name, len(index), top.xxh3),
        shard_count=len(manifest.shards),
        declared_batches=manifest.num_batches,
        prefixes=prefixes,
    )
    return {**files, index_name: index, MANIFEST_NAME: build_manifest(v2)}


def index_name(files: Files) -> str:
    """The file name a version 2 dataset's manifest gives its index."""
    ref = manifest_of(files).index
    assert ref is not None
    return ref.name


def index_entries(files: Files) -> list[Shard]:
    """The shards a dataset this module built describes, in dataset order: its manifest's list
    (version 1), or every record of its index (version 2)."""
    manifest = manifest_of(files)
    if manifest.index is None:
        return list(manifest.shards)
    data = files[manifest.index.name]
    assert data is not None
    top = parse_top(data, len(data))
    assert isinstance(top, IndexTop), top
    entries = []
    for item in iter_shards(top, data):
        assert not isinstance(item, DatasetViolation), item
        entries.append(item.shard)
    return entries


HEAD_FIELDS = (
    "magic",
    "version",
    "flags",
    "shard_count",
    "num_batches",
    "batch_size",
    "seq_len",
    "dtype",
    "page_records",
    "seed",
    "run_count",
    "page_count",
    "prefixes",
    "reserved",
)
"""The head's fields before ``top_xxh3``, in order (``zerobatch_spec.index.HEAD``)."""

RECORD_FIELDS = (
    "num_batches",
    "size",
    "header_xxh3",
    "checksums_xxh3",
    "records_first",
    "records_last",
    "seed",
    "total_records",
    "name_offset",
    "name_length",
    "flags",
    "reserved",
)
"""A shard record's fields, in order (``zerobatch_spec.index.RECORD``)."""


@dataclasses.dataclass
class IndexParts:
    """An index taken apart to be edited: the head's fields (``HEAD_FIELDS``), the runs and
    each page's bytes. ``join`` puts it together again, sealed (page table and top digest
    computed) unless told otherwise."""

    head: dict[str, Any]
    runs: list[tuple[int, int]]
    pages: list[bytes]

    @classmethod
    def split(cls, data: bytes) -> IndexParts:
        """The parts of a valid index's bytes."""
        fields = HEAD.unpack_from(data)
        head = dict(zip(HEAD_FIELDS, fields[:-1], strict=True))
        at = HEAD_SIZE
        runs = []
        for _ in range(head["run_count"]):
            shards, batches = RUN.unpack_from(data, at)
            runs.append((int(shards), int(batches)))
            at += RUN.size
        pages = []
        for _ in range(head["page_count"]):
            offset, length, _digest = PAGE_ENTRY.unpack_from(data, at)
            pages.append(data[offset : offset + length])
            at += PAGE_ENTRY.size
        return cls(head, runs, pages)

    def join(
        self,
        table: Sequence[tuple[int, int, int]] | None = None,
        top_xxh3: int | None = None,
        counted: bool = True,
    ) -> bytes:
        """The index's bytes: the head (with ``run_count`` and ``page_count`` those of the
        lists when ``counted``), the runs, the page table (``table``, else each page's offset,
        length and digest) and the pages; ``top_xxh3`` the top's digest unless given."""
        head = dict(self.head)
        if counted:
            head.update(run_count=len(self.runs), page_count=len(self.pages))
        top = HEAD_SIZE + len(self.runs) * RUN.size + len(self.pages) * PAGE_ENTRY.size
        if table is None:
            entries, at = [], top
            for page in self.pages:
                entries.append((at, len(page), bytes_digest(page)))
                at += len(page)
            table = entries
        body = b"".join(RUN.pack(*run) for run in self.runs)
        body += b"".join(PAGE_ENTRY.pack(*entry) for entry in table)
        fields = [head[name] for name in HEAD_FIELDS]
        first = HEAD.pack(*fields, 0)[: HEAD_SIZE - 8]
        digest = bytes_digest(first + body) if top_xxh3 is None else top_xxh3
        return HEAD.pack(*fields, digest) + body + b"".join(self.pages)

    def record(self, shard: int, **fields: int) -> None:
        """Set fields of shard ``shard``'s record (its page's bytes change, names included)."""
        per = int(self.head["page_records"])
        page, j = divmod(shard, per)
        data = bytearray(self.pages[page])
        values = dict(zip(RECORD_FIELDS, RECORD.unpack_from(data, j * RECORD_SIZE), strict=True))
        values.update(fields)
        RECORD.pack_into(data, j * RECORD_SIZE, *(values[name] for name in RECORD_FIELDS))
        self.pages[page] = bytes(data)


def bytes_digest(data: bytes) -> int:
    """XXH3-64 of ``data`` as an integer (the index stores digests as u64)."""
    return int(bytes_xxh3(data), 16)


def index_parts(files: Files) -> IndexParts:
    """The parts of a version 2 dataset's index, to edit."""
    data = files[index_name(files)]
    assert data is not None
    return IndexParts.split(data)


def with_index(files: Files, data: bytes) -> Files:
    """``files`` with the index's bytes ``data``, and the manifest's ``index.size`` and
    ``index.xxh3`` those of ``data`` (its size, and the digest its head states): the
    manifest sealed over whatever the index holds."""
    name = index_name(files)
    stated = (
        int.from_bytes(data[HEAD_SIZE - 8 : HEAD_SIZE], "little") if len(data) >= HEAD_SIZE else 0
    )
    ref = IndexRef(name, len(data), f"{stated:016x}")
    out = {**files, name: data}
    return with_manifest(out, lambda m: dataclasses.replace(m, index=ref))


def resealed(files: Files, parts: IndexParts) -> Files:
    """``files`` with the index ``parts`` joined and sealed: every page's digest, the top's
    digest and the manifest's ``index.size`` and ``index.xxh3`` recomputed, so that only the
    edit itself is left to find."""
    return with_index(files, parts.join())


def index_violation(files: Files) -> DatasetViolation | None:
    """The first failure of a version 2 dataset's index (section 23.3) by the reference: at
    open its size, top and head against the manifest, then every page in order. Checks the
    vectors' expectations."""
    manifest = manifest_of(files)
    ref = manifest.index
    assert ref is not None
    data = files.get(ref.name)
    if data is None:
        return DatasetViolation(DatasetCode.INDEX_MISSING, "index", "no such regular file")

    def bad(where: str) -> DatasetViolation:
        return DatasetViolation(DatasetCode.INDEX_MISMATCH, where, "")

    if len(data) != ref.size:
        return bad("index")
    top = parse_top(data, len(data))
    if isinstance(top, DatasetViolation):
        return top
    mismatch = check_top(top, manifest)
    if mismatch is not None:
        return mismatch
    for item in iter_shards(top, data):
        if isinstance(item, DatasetViolation):
            return item
    return None
