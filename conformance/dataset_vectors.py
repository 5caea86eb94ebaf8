"""Dataset conformance vectors (``SPEC.md`` sections 12 to 15), built from ``zerobatch_spec`` alone.

A dataset vector's input is a directory ``<id>.dataset`` holding a manifest, a checksums file and
shards, built by ``dataset_files`` with the rules of section 12, never by the core's writer. The
expected answers are those of ``PROTOCOL.md``: for a valid dataset its shape, its per-slot
SHA-256 and pinned dataset orders; for a broken one the first failure in section 13's order,
with the manifest field or shard (``where``) and the slot. This module makes the valid datasets,
the shard, checksums and slot failures and the query vectors; ``manifest_vectors`` the manifest
rules.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

from zerobatch_spec import (
    DTYPE_UINT16,
    DTYPE_UINT32,
    HEADER_SIZE,
    U32_MAX,
    U64_MAX,
    ErrorCode,
    Header,
    build_header,
    parse_header,
)
from zerobatch_spec.dataset import (
    CHECKSUM_BYTES,
    CHECKSUMS_NAME,
    DATASET_KEY_TAG,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    MANIFEST_VERSION_INDEXED,
    SHARD_NAME_FORMAT,
    DatasetCode,
    Manifest,
    Shard,
    Source,
    bytes_xxh3,
    dataset_epoch_key,
    dataset_epoch_order,
    shard_file_name,
    shard_seed,
)
from zerobatch_spec.index import (
    HEAD_SIZE,
    INDEX_NAME,
    PAGE_ENTRY,
    RECORD_SIZE,
    RUN,
    IndexTop,
    parse_top,
)

from .dataset_files import (
    BASE_BATCH_SIZE,
    BASE_SEED,
    BASE_SEQ_LEN,
    DATASET_SUFFIX,
    SHARD0,
    SHARD1,
    Files,
    IndexParts,
    Records,
    base,
    base_records,
    broken,
    build_dataset,
    bytes_digest,
    checksums_file,
    failure,
    index_entries,
    index_parts,
    index_violation,
    indexed,
    manifest_of,
    records_of,
    resealed,
    shard_bytes,
    sharded,
    slot_sums,
    with_index,
    with_manifest,
    without,
)
from .manifest_vectors import manifest_vectors
from .vector import (
    INVALID_QUERY,
    Vector,
    batch_digests,
    invalid_query_vector,
    query_vector,
)

DATASET_ORDER_CASES: tuple[tuple[int, int | None, int, bool], ...] = (
    (1, None, 0, True),
    (2, None, 1, True),
    (3, U64_MAX, 2**63, True),
    (256, None, 0, True),
    (2, None, 0, False),
)
"""(block_size, seed, epoch, shuffle) of the orders each valid dataset vector pins; a seed of
``None`` is the manifest's."""


UNREADABLE_PATH = ErrorCode.UNREADABLE_PATH.value


def describe(files: Files) -> dict[str, Any]:
    """The protocol's answer for a valid dataset, and the orders the runner asks for."""
    raw = files[MANIFEST_NAME]
    assert raw is not None
    manifest = manifest_of(files)
    shards = index_entries(files)  # the manifest's list, or (version 2) the index's records
    shard_batches = [s.num_batches for s in shards]
    assert sum(shard_batches) == manifest.num_batches
    digests: list[str] = []
    for shard in shards:
        data = files[shard.name]
        assert data is not None
        digests += batch_digests(data, parse_header(data[:HEADER_SIZE]))
    orders = []
    for block_size, seed, epoch, shuffle in DATASET_ORDER_CASES:
        key_seed = manifest.seed if seed is None else seed
        order = dataset_epoch_order(shard_batches, block_size, key_seed, epoch, shuffle)
        orders.append(
            {
                "block_size": block_size,
                "seed": key_seed,
                "epoch": epoch,
                "shuffle": shuffle,
                "order": [int(v) for v in order],
            }
        )
    return {
        "valid": True,
        "batch_size": manifest.batch_size,
        "seq_len": manifest.seq_len,
        "dtype": manifest.dtype,
        "seed": manifest.seed,
        "num_batches": manifest.num_batches,
        "shard_batches": shard_batches,
        "manifest_sha256": hashlib.sha256(raw).hexdigest(),
        "batch_sha256": digests,
        "dataset_orders": orders,
    }


def valid_dataset(
    vid: str, comment: str, files: Files, flags: Sequence[str], extra: dict[str, Any] | None = None
) -> Vector:
    """A valid dataset vector: ``files`` and the answer ``describe`` gives for them."""
    return Vector(
        vid,
        comment,
        ["dataset", "dataset-valid", *flags],
        DATASET_SUFFIX,
        None,
        describe(files),
        extra or {},
        tree=dict(files),
    )


def writer_input(
    records: Records,
    batch_size: int,
    seq_len: int,
    shard_batches: int,
    seed: int,
    sources: Sequence[Source] = (),
    dtype: int = DTYPE_UINT32,
    version: int = MANIFEST_VERSION,
    prefixes: int = 1,
) -> dict[str, Any]:
    """What the golden test gives the sharded writer to reproduce a vector byte for byte (the
    dtype code only where it is not 0, as in a file's writer input, the manifest version
    only where it is not 1, and the key prefixes only where they are not 1)."""
    return {
        "dataset_writer_input": {
            "records": records.tolist(),
            "batch_size": batch_size,
            "seq_len": seq_len,
            "shard_batches": shard_batches,
            "seed": seed,
            "sources": [{"path": s.path, "records": list(s.records)} for s in sources],
            **({"dtype": dtype} if dtype != DTYPE_UINT32 else {}),
            **manifest_version_key(version),
            **({"prefixes": prefixes} if prefixes != 1 else {}),
        }
    }


def manifest_version_key(version: int) -> dict[str, int]:
    """A writer input's ``manifest_version``, stated only where it is not 1."""
    return {} if version == MANIFEST_VERSION else {"manifest_version": version}


def written(
    vid: str,
    comment: str,
    count: int,
    batch_size: int,
    seq_len: int,
    shard_batches: int,
    seed: int,
    flags: Sequence[str],
    sources: Sequence[Source] = (),
    dtype: int = DTYPE_UINT32,
    version: int = MANIFEST_VERSION,
    prefixes: int = 1,
) -> Vector:
    """A valid dataset the sharded writer makes of ``count`` pseudo-random records (``version``
    2: described by a shard index, its names spread over ``prefixes`` key prefixes)."""
    records = records_of(count, seq_len, salt=1000 + seed + count, dtype=dtype)
    files = sharded(records, batch_size, seq_len, shard_batches, seed, sources, dtype, prefixes)
    if version == MANIFEST_VERSION_INDEXED:
        files = indexed(files, prefixes=prefixes)
    extra = writer_input(
        records, batch_size, seq_len, shard_batches, seed, sources, dtype, version, prefixes
    )
    return valid_dataset(vid, comment, files, ["writer", *flags], extra)


def valid_datasets() -> Iterator[Vector]:
    """Valid datasets: made by the sharded writer, described files, unknown keys."""
    yield written(
        "dataset-valid-three-shards",
        "sharded writer: 11 records of 3 tokens, 2 per batch, 2 batches per shard: shards of 4, "
        "4 and 3 records (one dropped), two sources (one path not ASCII)",
        11,
        2,
        3,
        2,
        7,
        ["padding", "remainder", "sources"],
        (Source("corpus/part-a.bin", (0, 6)), Source("corpus/donn\u00e9es.bin", (6, 11))),
    )
    yield written(
        "dataset-valid-empty-last-shard",
        "sharded writer: 8 records, 3 per batch, 1 batch per shard: the last shard holds 2 "
        "records and no batch",
        8,
        3,
        2,
        1,
        0,
        ["empty-shard", "remainder"],
    )
    yield written(
        "dataset-valid-one-shard",
        "sharded writer: 129 records of 16 tokens, 64 per batch (4 KiB batches, no padding), in "
        "one shard of 2 batches",
        129,
        64,
        16,
        8,
        U32_MAX,
        ["one-shard", "no-padding", "remainder", "seed"],
    )
    yield written(
        "dataset-valid-no-shards",
        "sharded writer given no records: no shard, an empty checksums file, 0 batches",
        0,
        2,
        3,
        4,
        5,
        ["no-shards", "zero-batches"],
    )
    # Files described as they are (create_dataset): own seeds, names in the given order, an
    # empty shard in the middle, a name that does not end in .batch, no record ranges.
    batch_size, seq_len = 2, 5
    parts = [("part_1.batch", 7, 21), ("empty.batch", 1, 22), ("Part-0.data", 4, 23)]
    shards = [
        (name, shard_bytes(records_of(n, seq_len, salt), batch_size, seq_len, salt), None)
        for name, n, salt in parts
    ]
    files = build_dataset(batch_size, seq_len, 9, shards)
    yield valid_dataset(
        "dataset-valid-described-files",
        "existing files described as a dataset, in the order given: 3, 0 and 2 batches (an "
        "empty shard in the middle), each with its own seed; dataset seed 9",
        files,
        ["empty-shard", "described"],
        {"dataset_create_input": {"names": [n for n, _, _ in parts], "seed": 9}},
    )
    yield written(
        "dataset-valid-uint16",
        "sharded writer, dtype 1: 11 records of 3 uint16 tokens, 2 per batch, 2 batches per "
        'shard: shards of 4, 4 and 3 records (one dropped); the manifest says "dtype": 1',
        11,
        2,
        3,
        2,
        7,
        ["uint16", "padding", "remainder", "sources"],
        (Source("train.bin", (0, 11)),),
        DTYPE_UINT16,
    )
    yield written(
        "dataset-valid-uint16-no-padding",
        "sharded writer, dtype 1: 33 records of 128 uint16 tokens, 16 per batch (4096 bytes, "
        "no padding; as uint32 they would fill 8192), 1 batch per shard: the last shard holds "
        "one record and no batch",
        33,
        16,
        128,
        1,
        0,
        ["uint16", "no-padding", "remainder", "empty-shard"],
        dtype=DTYPE_UINT16,
    )
    u16_parts = [("b.batch", 5, 31), ("a.batch", 2, 32)]
    u16_shards = [
        (
            name,
            shard_bytes(records_of(n, 7, salt, DTYPE_UINT16), 1, 7, salt, DTYPE_UINT16),
            None,
        )
        for name, n, salt in u16_parts
    ]
    yield valid_dataset(
        "dataset-valid-uint16-described-files",
        "two uint16 files of 1 x 7 tokens described as a dataset, in the order given: 5 and 2 "
        "batches; dataset seed 4",
        build_dataset(1, 7, 4, u16_shards, dtype=DTYPE_UINT16),
        ["uint16", "described", "padding"],
        {"dataset_create_input": {"names": [n for n, _, _ in u16_parts], "seed": 4}},
    )
    yield valid_dataset(
        "dataset-valid-unknown-keys-and-files",
        "keys the manifest does not define (a 30-digit integer, a float, nested values) are "
        "ignored, as are a null records range and files that are not *.batch",
        unknown_keys(base()),
        ["unknown-keys"],
    )


def unknown_keys(files: Files) -> Files:
    """``files`` with a manifest full of keys and a directory with files a reader ignores."""
    raw = files[MANIFEST_NAME]
    assert raw is not None
    doc = json.loads(raw)
    doc["comment"] = "written by another tool"
    doc["x-count"] = 123456789012345678901234567890
    doc["x-nested"] = {"a": [1, -2, 1.5e300, {"b": None, "c": True}]}
    doc["checksums"]["note"] = "slot order"
    doc["shards"][0]["x-origin"] = {"host": "n1"}
    doc["shards"][1]["records"] = None
    doc["sources"][0]["x-bytes"] = 42
    manifest = (json.dumps(doc, indent=2) + "\n").encode()
    return {
        **files,
        MANIFEST_NAME: manifest,
        "README.txt": b"A dataset directory may hold other files.\n",
        "shard-00002.batch.tmp": b"not a shard: the name does not end in .batch\n",
    }


def flip_slot_byte(data: bytes, slot: int, offset: int, mask: int) -> bytes:
    """``data`` with byte ``offset`` of slot ``slot`` XORed with ``mask``."""
    h = parse_header(data[:HEADER_SIZE])
    at = HEADER_SIZE + slot * h.padded_batch_bytes + offset
    return data[:at] + bytes([data[at] ^ mask]) + data[at + 1 :]


def set_checksum(files: Files, index: int, value: int, update_manifest: bool) -> Files:
    """``files`` with dataset slot ``index``'s checksum replaced (and the manifest's digest of
    the checksums file updated to match, if asked)."""
    sums = files[CHECKSUMS_NAME]
    assert sums is not None
    at = index * CHECKSUM_BYTES
    new = sums[:at] + value.to_bytes(CHECKSUM_BYTES, "little") + sums[at + CHECKSUM_BYTES :]
    out = {**files, CHECKSUMS_NAME: new}
    return with_checksums_digest(out) if update_manifest else out


def with_checksums_digest(files: Files) -> Files:
    """``files`` with the manifest's digest set to that of the checksums file present."""
    sums = files[CHECKSUMS_NAME]
    assert sums is not None
    digest = bytes_xxh3(sums)
    return with_manifest(files, lambda m: dataclasses.replace(m, checksums_xxh3=digest))


def recomputed(files: Files) -> Files:
    """``files`` with the checksums file (and its digest) recomputed from the shards present."""
    manifest = manifest_of(files)
    sums: list[int] = []
    for shard in manifest.shards:
        data = files[shard.name]
        assert data is not None
        sums += slot_sums(data)
    return with_checksums_digest({**files, CHECKSUMS_NAME: checksums_file(sums)})


def shard_vectors() -> Iterator[Vector]:
    """Shards that do not match the manifest (section 13, rules 7 to 11)."""
    files = base()
    s0, s1 = files[SHARD0], files[SHARD1]
    assert s0 is not None and s1 is not None
    h0 = parse_header(s0[:HEADER_SIZE])
    yield broken(
        "dataset-shard-missing",
        "the manifest lists shard-00001.batch; the directory lacks it",
        DatasetCode.SHARD_MISSING.value,
        SHARD1,
        without(files, SHARD1),
        ["shard"],
    )
    yield broken(
        "dataset-shard-not-a-file",
        "shard-00001.batch is a directory",
        DatasetCode.SHARD_MISSING.value,
        SHARD1,
        {**files, SHARD1: None},
        ["shard"],
    )
    size = DatasetCode.SHARD_SIZE_MISMATCH.value
    for name, comment, target, data, flags in (
        (
            "truncated",
            "shard-00000.batch lacks its last slot",
            SHARD0,
            s0[: -h0.padded_batch_bytes],
            [],
        ),
        (
            "one-byte-extra",
            "shard-00001.batch has one trailing byte",
            SHARD1,
            s1 + b"\x00",
            ["off-by-one"],
        ),
        (
            "empty-file",
            "shard-00001.batch is empty: its size is checked before its header",
            SHARD1,
            b"",
            ["rule-order"],
        ),
    ):
        yield broken(
            f"dataset-shard-{name}",
            comment,
            size,
            target,
            {**files, target: data},
            ["shard", *flags],
        )
    yield broken(
        "dataset-shard-bad-magic",
        "shard-00001.batch has the manifest's size but magic LLMBATCX: file rule 2",
        ErrorCode.BAD_MAGIC.value,
        SHARD1,
        {**files, SHARD1: b"LLMBATCX" + s1[8:]},
        ["shard"],
    )
    other_count = Header(h0.batch_size, h0.seq_len, h0.num_batches - 1, h0.seed, h0.total_records)
    yield broken(
        "dataset-shard-header-num-batches",
        "shard-00000.batch has the manifest's size but its header says one batch: file rule 7",
        ErrorCode.SIZE_MISMATCH.value,
        SHARD0,
        {**files, SHARD0: rebuilt_header(s0, other_count)},
        ["shard"],
    )
    mismatch = DatasetCode.SHARD_HEADER_MISMATCH.value
    other_seed = shard_seed(BASE_SEED, 0) ^ 1
    reseeded = shard_bytes(base_records()[:4], BASE_BATCH_SIZE, BASE_SEQ_LEN, other_seed)
    yield broken(
        "dataset-shard-header-seed",
        "shard-00000.batch rewritten with another seed: a valid file of the same size",
        mismatch,
        SHARD0,
        {**files, SHARD0: reseeded},
        ["shard"],
    )
    other_shape = shard_bytes(records_of(1, 6, salt=5), 1, 6, 0)  # 1 x 6: a 4096-byte slot too
    assert len(other_shape) == len(s1)
    yield broken(
        "dataset-shard-other-shape",
        "shard-00001.batch replaced by a valid 1 x 6 file of the same size",
        mismatch,
        SHARD1,
        {**files, SHARD1: other_shape},
        ["shard"],
    )

    def wrong_digest(m: Manifest) -> Manifest:
        first, second = m.shards
        digest = second.header_xxh3[:-1] + ("0" if second.header_xxh3[-1] != "0" else "1")
        second = Shard(
            second.name,
            second.num_batches,
            second.seed,
            second.total_records,
            second.size,
            digest,
            second.records,
        )
        return Manifest(
            m.batch_size, m.seq_len, m.seed, (first, second), m.checksums_xxh3, m.sources
        )

    yield from dtype_shard_vectors()
    yield broken(
        "dataset-shard-header-digest",
        "the manifest's header_xxh3 of shard-00001.batch differs from its header; fields agree",
        mismatch,
        SHARD1,
        with_manifest(files, wrong_digest),
        ["shard"],
    )


def dtype_shard_vectors() -> Iterator[Vector]:
    """Shards of the other dtype, where the slot sizes agree (2 x 3 tokens fit one page either
    way), so that only the header (rule 10) tells them apart."""
    mismatch = DatasetCode.SHARD_HEADER_MISMATCH.value
    files = base()
    records = base_records(DTYPE_UINT16)[4:]  # shard-00001.batch's records, low 16 bits
    seed = shard_seed(BASE_SEED, 1)
    narrow = shard_bytes(records, BASE_BATCH_SIZE, BASE_SEQ_LEN, seed, DTYPE_UINT16)
    assert len(narrow) == len(files[SHARD1] or b"")
    yield broken(
        "dataset-shard-uint16-in-uint32-dataset",
        "shard-00001.batch replaced by a dtype 1 file of its shape, seed and record count (the "
        "low 16 bits of its tokens): the same size, a valid file, but not the manifest's dtype",
        mismatch,
        SHARD1,
        {**files, SHARD1: narrow},
        ["shard", "uint16"],
    )
    narrow_records = base_records(DTYPE_UINT16)
    u16 = sharded(narrow_records, BASE_BATCH_SIZE, BASE_SEQ_LEN, 2, BASE_SEED, (), DTYPE_UINT16)
    wide = shard_bytes(narrow_records[:4], BASE_BATCH_SIZE, BASE_SEQ_LEN, shard_seed(BASE_SEED, 0))
    assert len(wide) == len(u16[SHARD0] or b"")
    yield broken(
        "dataset-shard-uint32-in-uint16-dataset",
        'a "dtype": 1 dataset whose shard-00000.batch is the same records as a dtype 0 file: '
        "the same size, a valid file, but its dtype is not the manifest's",
        mismatch,
        SHARD0,
        {**u16, SHARD0: wide},
        ["shard", "uint16"],
    )


def rebuilt_header(data: bytes, header: Header) -> bytes:
    """``data`` with its header replaced by ``header``'s bytes."""
    return build_header(header) + data[HEADER_SIZE:]


def checksum_vectors() -> Iterator[Vector]:
    """A checksums file that does not match the manifest (rule 6) or a slot (rule 12)."""
    files = base()
    sums = files[CHECKSUMS_NAME]
    assert sums is not None
    code = DatasetCode.CHECKSUMS_MISMATCH.value
    for name, comment, changed in (
        ("missing", "no checksums.xxh3", without(files, CHECKSUMS_NAME)),
        ("not-a-file", "checksums.xxh3 is a directory", {**files, CHECKSUMS_NAME: None}),
        (
            "short",
            "checksums.xxh3 lacks its last entry",
            {**files, CHECKSUMS_NAME: sums[:-CHECKSUM_BYTES]},
        ),
        (
            "altered",
            "one entry of checksums.xxh3 altered; the manifest's digest is the original's",
            set_checksum(files, 1, 7, False),
        ),
        (
            "extra-entry",
            "checksums.xxh3 has one entry too many, and the manifest's digest is of that file",
            with_checksums_digest({**files, CHECKSUMS_NAME: sums + sums[:CHECKSUM_BYTES]}),
        ),
    ):
        yield broken(
            f"dataset-checksums-{name}", comment, code, CHECKSUMS_NAME, changed, ["checksums"]
        )
    yield broken(
        "dataset-checksums-wrong-entry",
        "dataset slot 2's entry altered and the manifest's digest updated to match: slot 0 of "
        "shard-00001.batch fails its checksum",
        DatasetCode.CHECKSUM_MISMATCH.value,
        SHARD1,
        set_checksum(files, 2, 7, True),
        ["checksums", "deep"],
        slot=0,
    )


def slot_vectors() -> Iterator[Vector]:
    """Slots that fail deep validation, and a file the manifest does not list."""
    files = base()
    s0, s1 = files[SHARD0], files[SHARD1]
    assert s0 is not None and s1 is not None
    raw = parse_header(s1[:HEADER_SIZE]).raw_batch_bytes  # the first padding byte of a slot
    corrupt = flip_slot_byte(s0, 1, 5, 0xFF)
    yield broken(
        "dataset-slot-corrupt-token",
        "one token byte of slot 1 of shard-00000.batch flipped",
        DatasetCode.CHECKSUM_MISMATCH.value,
        SHARD0,
        {**files, SHARD0: corrupt},
        ["slot", "deep"],
        slot=1,
    )
    padded = flip_slot_byte(s1, 0, raw, 1)
    yield broken(
        "dataset-slot-nonzero-padding",
        "a padding byte of slot 0 of shard-00001.batch set, and the checksums computed over it",
        ErrorCode.NONZERO_PADDING.value,
        SHARD1,
        recomputed({**files, SHARD1: padded}),
        ["slot", "deep"],
        slot=0,
    )
    yield broken(
        "dataset-extra-shard",
        "shard-00002.batch (left by an earlier write) is in the directory, not in the manifest",
        DatasetCode.EXTRA_SHARD.value,
        "shard-00002.batch",
        {**files, "shard-00002.batch": s1},
        ["deep"],
    )
    order: list[tuple[str, str, str, str, Files, int | None]] = [
        (
            "checksums-before-shards",
            "checksums.xxh3 and shard-00001.batch both missing",
            DatasetCode.CHECKSUMS_MISMATCH.value,
            CHECKSUMS_NAME,
            without(files, CHECKSUMS_NAME, SHARD1),
            None,
        ),
        (
            "slot-before-next-shard",
            "slot 1 of shard-00000.batch corrupted and shard-00001.batch missing: one shard at a "
            "time, its slots before the next shard",
            DatasetCode.CHECKSUM_MISMATCH.value,
            SHARD0,
            without({**files, SHARD0: corrupt}, SHARD1),
            1,
        ),
        (
            "padding-before-checksum",
            "a padding byte of slot 0 of shard-00001.batch set, checksums not recomputed: the "
            "padding is checked before the checksum",
            ErrorCode.NONZERO_PADDING.value,
            SHARD1,
            {**files, SHARD1: padded},
            0,
        ),
        (
            "shard-before-extra",
            "shard-00001.batch missing and an unlisted stray.batch present",
            DatasetCode.SHARD_MISSING.value,
            SHARD1,
            {**without(files, SHARD1), "stray.batch": s1},
            None,
        ),
        (
            "slot-before-extra",
            "slot 0 of shard-00001.batch corrupted and an unlisted stray.batch present",
            DatasetCode.CHECKSUM_MISMATCH.value,
            SHARD1,
            {**files, SHARD1: flip_slot_byte(s1, 0, 0, 1), "stray.batch": s1},
            0,
        ),
    ]
    for name, comment, code, where, changed, slot in order:
        yield broken(
            f"dataset-rule-order-{name}", comment, code, where, changed, ["rule-order"], slot
        )


def unreadable_vectors() -> Iterator[Vector]:
    """Paths with no dataset to check: answered ``unreadable_path``."""
    flags = ["dataset", "dataset-invalid", UNREADABLE_PATH]
    expected = failure(UNREADABLE_PATH)
    yield Vector(
        "dataset-unreadable-missing",
        "the dataset directory does not exist",
        flags,
        DATASET_SUFFIX,
        None,
        expected,
    )
    yield Vector(
        "dataset-unreadable-not-a-directory",
        "the dataset path is a regular file",
        flags,
        DATASET_SUFFIX,
        b"not a dataset: a dataset is a directory\n",
        expected,
    )
    yield Vector(
        "dataset-unreadable-no-manifest",
        "shards and checksums but no manifest.json: a write that stopped before its last step",
        flags,
        DATASET_SUFFIX,
        None,
        expected,
        tree=without(base(), MANIFEST_NAME),
    )


def dataset_vectors() -> Iterator[Vector]:
    """Every dataset vector, in index order."""
    yield from valid_datasets()
    yield from manifest_vectors()
    yield from shard_vectors()
    yield from checksum_vectors()
    yield from slot_vectors()
    yield from unreadable_vectors()
    yield from indexed_vectors()


# -- version 2: datasets described by a shard index (section 23) ---------------------------------


def indexed_vectors() -> Iterator[Vector]:
    """Version 2 datasets: valid ones, then indexes that fail at open (size, head against the
    manifest, top, runs, page table), at a shard's first use (a page and its records), and on
    checked reads (a shard's range of ``checksums.xxh3``), and the directory's own checks."""
    yield from valid_indexed_datasets()
    yield from index_open_vectors()
    yield from index_page_vectors()
    yield from indexed_dataset_vectors()


V2 = "v2"
"""Flag of every vector about a version 2 dataset (its manifest or its index)."""


def described_indexed(
    vid: str,
    comment: str,
    shape: tuple[int, int],
    parts: Sequence[tuple[str, int, int]],
    seed: int,
    flags: Sequence[str],
    dtype: int = DTYPE_UINT32,
) -> Vector:
    """A valid version 2 dataset describing files ``parts`` (name, records, file seed) of
    ``shape`` (batch_size, seq_len), each with its own records and no record range."""
    batch_size, seq_len = shape
    shards = [
        (
            name,
            shard_bytes(records_of(n, seq_len, salt, dtype), batch_size, seq_len, salt, dtype),
            None,
        )
        for name, n, salt in parts
    ]
    files = indexed(build_dataset(batch_size, seq_len, seed, shards, dtype=dtype))
    create = {
        "names": [name for name, _, _ in parts],
        "seed": seed,
        **manifest_version_key(MANIFEST_VERSION_INDEXED),
    }
    return valid_dataset(
        vid, comment, files, [V2, "described", *flags], {"dataset_create_input": create}
    )


def valid_indexed_datasets() -> Iterator[Vector]:
    """Valid version 2 datasets: the sharded writer's (one run, two runs, none, uint16),
    described files (names in the pages, more than one page), and what readers must accept
    that writers do not write (another page size, another index name, unknown keys)."""
    yield written(
        "dataset-valid-v2-two-runs",
        "sharded writer, version 2: 11 records of 3 tokens, 2 per batch, 2 batches per shard: "
        "shards of 2, 2 and 1 batches, so the runs (2 shards, 2 slots) and (1 shard, 1 slot)",
        11,
        2,
        3,
        2,
        7,
        [V2, "padding", "remainder", "sources"],
        (Source("corpus/part-a.bin", (0, 6)), Source("corpus/part-b.bin", (6, 11))),
        version=MANIFEST_VERSION_INDEXED,
    )
    yield written(
        "dataset-valid-v2-one-run",
        "sharded writer, version 2: 12 records of 5 tokens, 2 per batch, 2 batches per shard: "
        "three equal shards, one run",
        12,
        2,
        5,
        2,
        11,
        [V2, "padding"],
        version=MANIFEST_VERSION_INDEXED,
    )
    yield written(
        "dataset-valid-v2-no-shards",
        "sharded writer given no records, version 2: an index of its head alone (no runs, no "
        "pages), an empty checksums file",
        0,
        2,
        3,
        4,
        5,
        [V2, "no-shards", "zero-batches"],
        version=MANIFEST_VERSION_INDEXED,
    )
    yield written(
        "dataset-valid-v2-uint16",
        "sharded writer, dtype 1, version 2: the manifest and the index head say dtype 1; 9 "
        "records of 3 uint16 tokens, 2 per batch, 2 batches per shard",
        9,
        2,
        3,
        2,
        3,
        [V2, "uint16", "padding", "remainder"],
        dtype=DTYPE_UINT16,
        version=MANIFEST_VERSION_INDEXED,
    )
    yield written(
        "dataset-valid-v2-prefixes-4",
        "sharded writer, version 2, names spread over 4 key prefixes: 9 records of 3 tokens, 2 "
        "per batch, 1 batch per shard: 0-shard-00000.batch, 1-shard-00001.batch, "
        "2-shard-00002.batch, 3-shard-00003.batch (generated names; the manifest and the "
        "index head say 4)",
        9,
        2,
        3,
        1,
        6,
        [V2, "prefixes", "padding", "remainder"],
        version=MANIFEST_VERSION_INDEXED,
        prefixes=4,
    )
    yield written(
        "dataset-valid-v2-prefixes-17",
        "sharded writer, version 2, names spread over 17 key prefixes (two hexadecimal digits, "
        "00 to 10): 3 shards, 00-shard-00000.batch to 02-shard-00002.batch",
        6,
        2,
        3,
        1,
        2,
        [V2, "prefixes"],
        version=MANIFEST_VERSION_INDEXED,
        prefixes=17,
    )
    yield described_indexed(
        "dataset-valid-v2-names-in-pages",
        "existing files described as a version 2 dataset: names other than the sharded "
        "writer's, so the page holds them after its records; 3, 0, 2 and 1 batches (three "
        "runs and an empty shard), no record ranges",
        (2, 5),
        [("b-1.batch", 7, 41), ("a.batch", 1, 42), ("Part_0.data", 4, 43), ("z.batch", 2, 44)],
        13,
        ["empty-shard"],
    )
    # 66 files named as the sharded writer names them: the first of 2 slots, 64 of none (a
    # header alone) and the last of 1: runs (1, 2), (64, 0), (1, 1), and two pages.
    many = [(SHARD_NAME_FORMAT.format(i), 1, 100 + i) for i in range(66)]
    many[0] = (many[0][0], 5, 100)
    many[-1] = (many[-1][0], 2, 165)
    yield described_indexed(
        "dataset-valid-v2-two-pages",
        "66 existing files with the sharded writer's names (so generated names): 2 slots, 64 "
        "empty shards, 1 slot; more than 64 shards, so a second page of 2 records",
        (2, 3),
        many,
        17,
        ["empty-shard", "pages"],
    )
    three = sharded(records_of(11, 3, salt=19), 2, 3, 2, 8)
    yield valid_dataset(
        "dataset-valid-v2-page-records-2",
        "the sharded writer's 3 shards in an index of 2 records a page (writers choose 64, "
        "readers accept 1 to 65536): pages of 2 records and 1",
        indexed(three, page_records=2),
        [V2, "pages"],
    )
    yield valid_dataset(
        "dataset-valid-v2-index-named-batch",
        "the index named index.batch: a name ending in .batch that is not a shard, which "
        "validation does not report as extra_shard",
        indexed(base(), index_name="index.batch"),
        [V2, "index-name"],
    )
    yield valid_dataset(
        "dataset-valid-v2-unknown-keys",
        "a version 2 manifest with keys it does not define, at the top and inside index and "
        "checksums, and files that are not *.batch",
        indexed_unknown_keys(indexed(base())),
        [V2, "unknown-keys"],
    )


def indexed_unknown_keys(files: Files) -> Files:
    """``files`` with a version 2 manifest full of keys a reader ignores, and other files."""
    raw = files[MANIFEST_NAME]
    assert raw is not None
    doc = json.loads(raw)
    doc["comment"] = "written by another tool"
    doc["shards"] = "listed in the index"  # a version 1 key means nothing in version 2
    doc["index"]["x-pages"] = [{"offset": 1}]
    doc["checksums"]["note"] = "slot order"
    doc["x-count"] = 123456789012345678901234567890
    manifest = (json.dumps(doc, indent=2) + "\n").encode()
    return {**files, MANIFEST_NAME: manifest, "README.txt": b"Other files are ignored.\n"}


def index_broken(
    vid: str,
    comment: str,
    where: str,
    files: Files,
    flags: Sequence[str] = (),
    code: DatasetCode = DatasetCode.INDEX_MISMATCH,
) -> Vector:
    """A version 2 dataset whose index breaks a rule of section 23.3 (``code`` at ``where``),
    the expectation checked against the reference."""
    found = index_violation(files)
    assert found is not None and (found.code, found.where) == (code, where), (vid, found)
    return broken(vid, comment, code.value, where, files, [V2, "index", *flags])


def index_open_vectors() -> Iterator[Vector]:
    """Indexes a reader refuses at open: missing, sized otherwise than the manifest says, a
    head that disagrees with the manifest or breaks a range, a top whose digest is not the
    manifest's, runs that do not add up, a page table that does not tile the file."""
    files = indexed(base())
    data = files[INDEX_NAME]
    assert data is not None
    missing = DatasetCode.INDEX_MISSING
    yield index_broken(
        "dataset-index-missing",
        "the manifest names shards.zbi; the directory lacks it",
        "index",
        without(files, INDEX_NAME),
        code=missing,
    )
    yield index_broken(
        "dataset-index-not-a-file",
        "shards.zbi is a directory",
        "index",
        {**files, INDEX_NAME: None},
        code=missing,
    )
    yield index_broken(
        "dataset-index-one-byte-extra",
        "shards.zbi has one trailing byte; the manifest's index.size is the original's",
        "index",
        {**files, INDEX_NAME: data + b"\0"},
        ["off-by-one"],
    )
    yield index_broken(
        "dataset-index-size-in-manifest",
        "the manifest's index.size is one byte short of the file's",
        "index",
        with_manifest(files, lambda m: with_ref(m, size=len(data) - 1)),
        ["off-by-one"],
    )
    yield index_broken(
        "dataset-index-empty",
        "shards.zbi is empty, and the manifest says so: shorter than a head",
        "index",
        with_index(files, b""),
    )
    yield index_broken(
        "dataset-index-top-cut",
        "shards.zbi cut after its head and 8 bytes, the manifest's size and digest updated: "
        "the runs and page table the head announces do not fit",
        "index.run_count",
        with_index(files, data[: HEAD_SIZE + 8]),
    )
    yield index_broken(
        "dataset-index-manifest-digest",
        "the manifest's index.xxh3 differs from the top's digest; the index is whole",
        "index.top_xxh3",
        with_manifest(files, lambda m: with_ref(m, xxh3=f"{bytes_digest(b'other'):016x}")),
    )
    parts = index_parts(files)
    yield index_broken(
        "dataset-index-head-digest",
        "the head's top_xxh3 is not the digest of its top (the manifest states the head's value)",
        "index.top_xxh3",
        with_index(files, parts.join(top_xxh3=bytes_digest(b"other"))),
    )
    altered = IndexParts(parts.head, [(1, 2), (1, 1)], parts.pages)
    changed = bytearray(altered.join())
    changed[HEAD_SIZE + RUN.size + 8] ^= 1  # the second run's slot count: 1 becomes 0
    yield index_broken(
        "dataset-index-run-altered",
        "a byte of the runs changed after the top was sealed, the manifest's digest the "
        "original's: the top's digest no longer matches",
        "index.top_xxh3",
        {**files, INDEX_NAME: bytes(changed)},
    )
    heads: list[tuple[str, str, str, str, object, list[str]]] = [
        ("magic", "magic ZBSHARDX", "index.magic", "magic", b"ZBSHARDX", []),
        ("version-0", "index version 0", "index.version", "version", 0, []),
        ("version-2", "index version 2 (from the future)", "index.version", "version", 2, []),
        ("flags", "head flag bit 1 set", "index.flags", "flags", 3, []),
        ("flags-high", "head flag bit 31 set", "index.flags", "flags", 1 << 31, []),
        (
            "reserved",
            "a reserved head byte set",
            "index.reserved",
            "reserved",
            bytes(43) + b"\1",
            [],
        ),
        ("prefixes-1", "head prefixes 1 (0 or 2 and above)", "index.prefixes", "prefixes", 1, []),
        (
            "prefixes-above",
            "head prefixes 65537 (at most 65536)",
            "index.prefixes",
            "prefixes",
            65537,
            ["off-by-one"],
        ),
        (
            "prefixes-unstated",
            "head prefixes 4 (generated names), the manifest states none",
            "index",
            "prefixes",
            4,
            ["prefixes"],
        ),
        ("page-records-0", "page_records 0", "index.page_records", "page_records", 0, []),
        (
            "page-records-above",
            "page_records 65537 (at most 65536)",
            "index.page_records",
            "page_records",
            65537,
            ["off-by-one"],
        ),
        (
            "batch-size-0",
            "head batch_size 0 (and the manifest's 2)",
            "index.batch_size",
            "batch_size",
            0,
            [],
        ),
        ("dtype-2", "head dtype 2: not a token dtype", "index.dtype", "dtype", 2, []),
        ("batch-size", "head batch_size 3, the manifest's 2", "index", "batch_size", 3, []),
        ("seq-len", "head seq_len 4, the manifest's 3", "index", "seq_len", 4, []),
        ("dtype", "head dtype 1, the manifest's 0 (absent)", "index", "dtype", 1, ["uint16"]),
        ("seed", "head seed 4, the manifest's 3", "index", "seed", 4, []),
    ]
    for name, comment, where, field, value, flags in heads:
        head = IndexParts({**parts.head, field: value}, parts.runs, parts.pages)
        yield index_broken(
            f"dataset-index-head-{name}",
            f"{comment}; the top's digest and the manifest sealed over it",
            where,
            resealed(files, head),
            flags,
        )
    listed = IndexParts({**parts.head, "flags": 0, "prefixes": 4}, parts.runs, parts.pages)
    yield index_broken(
        "dataset-index-head-prefixes-listed-names",
        "head prefixes 4 without the generated-names flag (prefixes name generated names "
        "only); the top's digest and the manifest sealed over it",
        "index.prefixes",
        resealed(files, listed),
        ["prefixes"],
    )
    yield index_broken(
        "dataset-index-manifest-prefixes",
        "the manifest's prefixes 4, the index head's 0 (none)",
        "index",
        with_manifest(files, lambda m: dataclasses.replace(m, prefixes=4)),
        ["prefixes"],
    )
    spread = indexed(sharded(records_of(8, 3, salt=23), 2, 3, 1, 5, prefixes=4), prefixes=4)
    yield broken(
        "dataset-prefixes-shard-unprefixed",
        "a dataset of names spread over 4 prefixes whose shard 1 is stored as "
        "shard-00001.batch, without its prefix: the index names 1-shard-00001.batch",
        DatasetCode.SHARD_MISSING.value,
        shard_file_name(1, 4),
        {
            **without(spread, shard_file_name(1, 4)),
            SHARD_NAME_FORMAT.format(1): spread[shard_file_name(1, 4)],
        },
        [V2, "prefixes"],
    )
    yield index_broken(
        "dataset-index-manifest-shard-count",
        "the manifest's shard_count 3, the index's 2",
        "index",
        with_manifest(files, lambda m: dataclasses.replace(m, shard_count=3)),
    )
    yield index_broken(
        "dataset-index-manifest-num-batches",
        "the manifest's num_batches 4, the index's 3",
        "index",
        with_manifest(files, lambda m: dataclasses.replace(m, declared_batches=4)),
    )
    yield index_broken(
        "dataset-index-page-count",
        "head page_count 2 for 2 shards of 64 a page (1 page)",
        "index.page_count",
        with_index(
            files,
            IndexParts({**parts.head, "page_count": 2}, parts.runs, parts.pages).join(
                counted=False
            ),
        ),
    )
    runs: list[tuple[str, str, list[tuple[int, int]], list[str]]] = [
        ("shards", "runs of 1 and 2 shards: 3 shards, shard_count is 2", [(1, 2), (2, 1)], []),
        ("slots", "runs of 2 + 2 slots, num_batches is 3", [(1, 2), (1, 2)], []),
        ("zero-shards", "a run of 0 shards between the two", [(1, 2), (0, 5), (1, 1)], []),
        (
            "shards-wrap",
            "runs of 2^64 - 1 shards of 0 slots and 3 of 1: 2^64 + 2 shards, which wraps to "
            "shard_count 2 in u64, and 3 slots",
            [(U64_MAX, 0), (3, 1)],
            ["overflow"],
        ),
        (
            "slots-wrap",
            "runs of 1 shard of 2^63 slots and 1 of 2^63 + 3: 2^64 + 3 slots, which wraps to "
            "num_batches 3 in u64",
            [(1, 2**63), (1, 2**63 + 3)],
            ["overflow"],
        ),
    ]
    for name, comment, new_runs, flags in runs:
        yield index_broken(
            f"dataset-index-runs-{name}",
            f"{comment}; the top sealed over it",
            "index.runs",
            resealed(files, IndexParts(parts.head, new_runs, parts.pages)),
            flags,
        )
    wide = U32_MAX + 1
    widened = {**parts.head, "num_batches": wide + 1}
    yield index_broken(
        "dataset-index-runs-slots-above-u32",
        "a run of shards of 2^32 slots (a shard has at most 2^32 - 1, its total_records), the "
        "head's and the manifest's num_batches 2^32 + 1 to match",
        "index.runs",
        with_manifest(
            resealed(files, IndexParts(widened, [(1, wide), (1, 1)], parts.pages)),
            lambda m: dataclasses.replace(m, declared_batches=wide + 1),
        ),
        ["overflow"],
    )
    yield from page_table_vectors()


def with_ref(manifest: Manifest, **fields: Any) -> Manifest:
    """``manifest`` with fields of its ``index`` replaced."""
    assert manifest.index is not None
    return dataclasses.replace(manifest, index=dataclasses.replace(manifest.index, **fields))


def page_table_vectors() -> Iterator[Vector]:
    """Page tables that do not tile the index after its top (the base dataset in pages of one
    record: two pages)."""
    files = indexed(base(), page_records=1)
    parts = index_parts(files)
    top = HEAD_SIZE + len(parts.runs) * RUN.size + len(parts.pages) * PAGE_ENTRY.size
    p0, p1 = parts.pages
    d0, d1 = bytes_digest(p0), bytes_digest(p1)
    at = top + len(p0)
    cases: list[tuple[str, str, str, list[tuple[int, int, int]], bytes]] = [
        (
            "gap",
            "page 1 starts one byte after page 0 ends",
            "index.pages[1]",
            [(top, len(p0), d0), (at + 1, len(p1) - 1, bytes_digest(p1[1:]))],
            b"",
        ),
        (
            "overlap",
            "page 1 starts one byte before page 0 ends",
            "index.pages[1]",
            [(top, len(p0), d0), (at - 1, len(p1) + 1, bytes_digest(p0[-1:] + p1))],
            b"",
        ),
        (
            "first-offset",
            "page 0 starts 8 bytes after the top",
            "index.pages[0]",
            [(top + 8, len(p0) - 8, bytes_digest(p0[8:])), (at, len(p1), d1)],
            b"",
        ),
        (
            "short-page",
            "page 0 of 71 bytes: shorter than its one 72-byte record",
            "index.pages[0]",
            [
                (top, len(p0) - 1, bytes_digest(p0[:-1])),
                (at - 1, len(p1) + 1, bytes_digest(p0[-1:] + p1)),
            ],
            b"",
        ),
        (
            "beyond-file",
            "page 1 ends one byte after the file",
            "index.pages[1]",
            [(top, len(p0), d0), (at, len(p1) + 1, d1)],
            b"",
        ),
        (
            "trailing-bytes",
            "8 bytes after the last page",
            "index",
            [(top, len(p0), d0), (at, len(p1), d1)],
            bytes(8),
        ),
    ]
    for name, comment, where, table, tail in cases:
        yield index_broken(
            f"dataset-index-pages-{name}",
            f"two pages of one record each: {comment}; the top and the manifest sealed over it",
            where,
            with_index(files, parts.join(table=table) + tail),
            ["pages"],
        )


def index_page_vectors() -> Iterator[Vector]:
    """Pages a reader refuses at the first use of one of their shards (section 23.3): a page
    whose digest is not the table's, records whose flags, slot counts or names break 23.2,
    records that disagree as 12.2's entries would. Each edit but the first is sealed."""
    files = indexed(base())
    data = files[INDEX_NAME]
    assert data is not None
    flipped = bytearray(data)
    flipped[-1] ^= 1  # the last record's reserved field: only the page digest tells
    yield index_broken(
        "dataset-index-page-digest",
        "a byte of page 0 changed; the page table keeps the original's digest",
        "index.pages[0]",
        {**files, INDEX_NAME: bytes(flipped)},
        ["page"],
    )
    two = indexed(base(), page_records=1)
    second = index_parts(two)
    original = second.join()
    second.record(1, seed=1)
    table = [
        (int(o), n, bytes_digest(p))
        for (o, n, _), p in zip(page_table(original), second.pages, strict=True)
    ]
    table[1] = page_table(original)[1]
    yield index_broken(
        "dataset-index-page-1-digest",
        "pages of one record: page 1's seed changed, its digest in the table the original's; "
        "page 0 and shard-00000.batch are whole",
        "index.pages[1]",
        with_index(two, second.join(table=table)),
        ["page", "pages"],
    )
    records: list[tuple[str, str, int, dict[str, int], str, list[str]]] = [
        ("flags", "record flag bit 1 set", 0, {"flags": 3}, "shards[0].flags", []),
        ("reserved", "a record's reserved field 1", 1, {"reserved": 1}, "shards[1].flags", []),
        (
            "num-batches",
            "shards[0]'s num_batches 1, its run says 2",
            0,
            {"num_batches": 1},
            "shards[0].num_batches",
            ["off-by-one"],
        ),
        (
            "name-with-generated",
            "a name length of 5 in an index of generated names",
            1,
            {"name_offset": 144, "name_length": 5},
            "shards[1].name",
            [],
        ),
        (
            "total-records",
            "shards[0]'s total_records 3 < num_batches 2 * batch_size 2",
            0,
            {"total_records": 3, "records_last": 3},
            "shards[0].total_records",
            ["off-by-one"],
        ),
        (
            "size",
            "shards[1]'s size one slot larger",
            1,
            {"size": 3 * HEADER_SIZE},
            "shards[1].size",
            [],
        ),
        (
            "records-span",
            "shards[1]'s records [4, 6]: 2 records, total_records is 3",
            1,
            {"records_last": 6},
            "shards[1].records",
            ["off-by-one"],
        ),
        (
            "records-reversed",
            "shards[1]'s records [8, 7]",
            1,
            {"records_first": 8},
            "shards[1].records",
            [],
        ),
    ]
    for name, comment, shard, fields, where, flags in records:
        parts = index_parts(files)
        parts.record(shard, **fields)
        yield index_broken(
            f"dataset-index-record-{name}",
            f"{comment}; the page's digest, the top and the manifest sealed over it",
            where,
            resealed(files, parts),
            ["page", *flags],
        )
    yield from name_vectors()
    parts = index_parts(files)
    parts.head["flags"] = 0
    yield index_broken(
        "dataset-index-names-flag-cleared",
        "the generated-names flag cleared: the pages hold no names (name_length 0 at 0)",
        "shards[0].name",
        resealed(files, parts),
        ["page"],
    )


def page_table(data: bytes) -> list[tuple[int, int, int]]:
    """The page table of a valid index's bytes."""
    top = parse_top(data, len(data))
    assert isinstance(top, IndexTop), top
    return [(int(o), int(n), int(d)) for o, n, d in top.pages]


def custom_named() -> Files:
    """The base dataset's shards named ``a.batch`` and ``b-1.batch``, in a version 2 dataset:
    the page holds the names after the records."""
    files = base()
    s0, s1 = files[SHARD0], files[SHARD1]
    assert s0 is not None and s1 is not None
    shards = [("a.batch", s0, (0, 4)), ("b-1.batch", s1, (4, 7))]
    return indexed(build_dataset(BASE_BATCH_SIZE, BASE_SEQ_LEN, BASE_SEED, shards))


def name_vectors() -> Iterator[Vector]:
    """Names in pages that break the name rule or lie outside the page's names."""
    files = custom_named()
    names_at = 2 * RECORD_SIZE  # after the page's two records: "a.batch", then "b-1.batch"
    cases: list[tuple[str, str, int, dict[str, int], bytes, str]] = [
        ("slash", 'shards[1]\'s name "b/1.batch"', 1, {}, b"b/1.batch", "shards[1].name"),
        ("dot", 'shards[0]\'s name ".", one byte', 0, {"name_length": 1}, b".", "shards[0].name"),
        ("empty", "shards[0]'s name_length 0", 0, {"name_length": 0}, b"", "shards[0].name"),
        (
            "in-records",
            "shards[1]'s name at offset 0, inside the records",
            1,
            {"name_offset": 0},
            b"",
            "shards[1].name",
        ),
        (
            "beyond-page",
            "shards[1]'s name runs one byte past the page's end",
            1,
            {"name_length": 10},
            b"",
            "shards[1].name",
        ),
        (
            "not-ascii",
            "shards[0]'s name with a byte above 0x7f",
            0,
            {},
            b"\xe1.batch",
            "shards[0].name",
        ),
    ]
    for name, comment, shard, fields, raw, where in cases:
        parts = index_parts(files)
        if raw:
            page = parts.pages[0]
            start = names_at if shard == 0 else names_at + len("a.batch")
            parts.pages[0] = page[:start] + raw + page[start + len(raw) :]
        parts.record(shard, **fields)
        yield index_broken(
            f"dataset-index-name-{name}",
            f"names in the page: {comment}; sealed",
            where,
            resealed(files, parts),
            ["page"],
        )
    long_name = b"x" * 250 + b".batch"
    parts = index_parts(files)
    parts.record(0, name_offset=len(parts.pages[0]), name_length=len(long_name))
    parts.pages[0] += long_name
    yield index_broken(
        "dataset-index-name-256",
        "shards[0]'s name of 256 bytes, appended to the page; sealed",
        "shards[0].name",
        resealed(files, parts),
        ["page"],
    )
    parts = index_parts(files)
    parts.head["flags"] = 1
    yield index_broken(
        "dataset-index-name-in-generated",
        "the generated-names flag set over a page that holds names",
        "shards[0].name",
        resealed(files, parts),
        ["page"],
    )


def indexed_dataset_vectors() -> Iterator[Vector]:
    """Version 2 failures past the index: a shard's range of the checksums file against its
    record (checked reads), the shards against their records, the directory's entries, and
    several failures at once."""
    files = indexed(base())
    sums = files[CHECKSUMS_NAME]
    s0, s1 = files[SHARD0], files[SHARD1]
    assert sums is not None and s0 is not None and s1 is not None
    ranges = DatasetCode.CHECKSUMS_MISMATCH.value
    parts = index_parts(files)
    parts.record(1, checksums_xxh3=bytes_digest(b"other"))
    yield broken(
        "dataset-v2-checksums-range-digest",
        "shards[1]'s checksums_xxh3 differs from the digest of its range of checksums.xxh3 "
        "(the page, top and manifest sealed): its first checked read fails",
        ranges,
        CHECKSUMS_NAME,
        resealed(files, parts),
        [V2, "checksums", "deep"],
    )
    yield broken(
        "dataset-v2-checksums-wrong-entry",
        "dataset slot 2's entry altered and the manifest's digest of the whole file updated: "
        "shard-00001.batch's range no longer has its record's digest (version 1 reports the "
        "slot's checksum_mismatch instead)",
        ranges,
        CHECKSUMS_NAME,
        set_checksum(files, 2, 7, True),
        [V2, "checksums", "deep"],
    )
    yield broken(
        "dataset-v2-checksums-missing",
        "no checksums.xxh3 in a version 2 dataset",
        ranges,
        CHECKSUMS_NAME,
        without(files, CHECKSUMS_NAME),
        [V2, "checksums"],
    )
    yield broken(
        "dataset-v2-shard-missing",
        "the index lists shard-00001.batch; the directory lacks it",
        DatasetCode.SHARD_MISSING.value,
        SHARD1,
        without(files, SHARD1),
        [V2, "shard"],
    )
    header = index_parts(files)
    header.record(1, header_xxh3=bytes_digest(b"other"))
    yield broken(
        "dataset-v2-shard-header-digest",
        "shards[1]'s header_xxh3 in the index differs from its header's; the fields agree",
        DatasetCode.SHARD_HEADER_MISMATCH.value,
        SHARD1,
        resealed(files, header),
        [V2, "shard"],
    )
    yield broken(
        "dataset-v2-slot-corrupt-token",
        "one token byte of slot 1 of shard-00000.batch flipped",
        DatasetCode.CHECKSUM_MISMATCH.value,
        SHARD0,
        {**files, SHARD0: flip_slot_byte(s0, 1, 5, 0xFF)},
        [V2, "slot", "deep"],
        slot=1,
    )
    yield broken(
        "dataset-v2-extra-shard",
        "shard-00002.batch is in the directory, not in the index",
        DatasetCode.EXTRA_SHARD.value,
        "shard-00002.batch",
        {**files, "shard-00002.batch": s1},
        [V2, "deep"],
    )
    named = indexed(base(), index_name="index.batch")
    yield broken(
        "dataset-v2-extra-shard-beside-index-batch",
        "the index named index.batch (not reported) and an unlisted stray.batch (reported)",
        DatasetCode.EXTRA_SHARD.value,
        "stray.batch",
        {**named, "stray.batch": s1},
        [V2, "deep", "index-name"],
    )
    page = bytearray(files[INDEX_NAME] or b"")
    page[-1] ^= 1
    bad_page = {**files, INDEX_NAME: bytes(page)}
    two = indexed(base(), page_records=1)
    later = index_parts(two)
    later.record(1, flags=2)
    order: list[tuple[str, str, str, str, Files, int | None]] = [
        (
            "index-before-checksums",
            "shards.zbi and checksums.xxh3 both missing: the index is read at open",
            DatasetCode.INDEX_MISSING.value,
            "index",
            without(files, INDEX_NAME, CHECKSUMS_NAME),
            None,
        ),
        (
            "checksums-before-page",
            "checksums.xxh3 missing and page 0's digest wrong: rule 6 before the first shard",
            ranges,
            CHECKSUMS_NAME,
            without(bad_page, CHECKSUMS_NAME),
            None,
        ),
        (
            "page-before-shard",
            "page 0's digest wrong and shard-00000.batch missing: the page is checked before "
            "the shard is opened",
            DatasetCode.INDEX_MISMATCH.value,
            "index.pages[0]",
            without(bad_page, SHARD0),
            None,
        ),
        (
            "slot-before-next-page",
            "pages of one record: slot 1 of shard-00000.batch corrupted and page 1's record "
            "flags wrong (sealed): shard 0's slots before shard 1's page",
            DatasetCode.CHECKSUM_MISMATCH.value,
            SHARD0,
            {**resealed(two, later), SHARD0: flip_slot_byte(s0, 1, 5, 0xFF)},
            1,
        ),
        (
            "range-before-slot",
            "shards[1]'s checksums_xxh3 wrong (sealed) and slot 0 of shard-00001.batch "
            "corrupted: the range is checked before the slot's checksum",
            ranges,
            CHECKSUMS_NAME,
            {**resealed(files, parts), SHARD1: flip_slot_byte(s1, 0, 0, 1)},
            None,
        ),
    ]
    for name, comment, code, where, changed, slot in order:
        yield broken(
            f"dataset-v2-rule-order-{name}",
            comment,
            code,
            where,
            changed,
            [V2, "rule-order"],
            slot,
        )


def order_query(
    shards: list[int], block_size: int, seed: int, epoch: int, shuffle: bool
) -> dict[str, Any]:
    """A ``dataset_order`` query."""
    return {
        "op": "dataset_order",
        "shard_batches": shards,
        "block_size": block_size,
        "seed": seed,
        "epoch": epoch,
        "shuffle": shuffle,
    }


def dataset_query_vectors() -> Iterator[Vector]:
    """``dataset_order``, ``dataset_epoch_key`` and ``shard_seed`` queries, and malformed ones."""
    example = [3, 0, 5, 1]
    orders: list[tuple[str, str, list[int], int, int, int, bool]] = [
        ("section-15-e0", "SPEC.md section 15's example, epoch 0", example, 2, 42, 0, True),
        ("section-15-e1", "SPEC.md section 15's example, epoch 1", example, 2, 42, 1, True),
        ("section-15-unshuffled", "unshuffled: storage order", example, 2, 42, 0, False),
        (
            "block-beyond-shards",
            "block_size 10: one block per non-empty shard",
            example,
            10,
            42,
            0,
            True,
        ),
        (
            "one-slot-shards",
            "40 shards of one slot, block_size 4: every block is one slot",
            [1] * 40,
            4,
            7,
            3,
            True,
        ),
        ("no-shards", "no shards: an empty order", [], 1, 0, 0, True),
        ("empty-shards", "only empty shards: an empty order", [0, 0, 0], 2, 0, 0, True),
        (
            "u64-extremes",
            "block_size, seed and epoch 2^64-1",
            [3, 0, 2],
            U64_MAX,
            U64_MAX,
            U64_MAX,
            True,
        ),
        (
            "mixed",
            "five shards (one empty), block_size 16, seed 2^40+5, epoch 2^63",
            [100, 37, 0, 200, 1],
            16,
            2**40 + 5,
            2**63,
            True,
        ),
        ("seed0-e1", "seed 0, epoch 1: differs from seed 1, epoch 0", [5, 3], 1, 0, 1, True),
        ("seed1-e0", "seed 1, epoch 0: differs from seed 0, epoch 1", [5, 3], 1, 1, 0, True),
    ]
    for name, comment, shards, bs, seed, epoch, shuffle in orders:
        result = dataset_epoch_order(shards, bs, seed, epoch, shuffle)
        yield query_vector(
            f"dataset-order-{name}",
            comment,
            order_query(shards, bs, seed, epoch, shuffle),
            [int(v) for v in result],
        )
    yield query_vector(
        "dataset-order-extra-keys",
        "unknown keys in a query are ignored",
        {**order_query(example, 2, 42, 0, True), "comment": "ignored", "x": [1, {"y": None}]},
        [int(v) for v in dataset_epoch_order(example, 2, 42, 0)],
    )
    for seed, epoch, comment in (
        (0, 0, "seed 0, epoch 0"),
        (0, 1, "seed 0, epoch 1 (seed ^ epoch would be 1)"),
        (1, 0, "seed 1, epoch 0 (seed ^ epoch would be 1)"),
        (42, 0, "seed 42, epoch 0"),
        (42, 1, "seed 42, epoch 1"),
        (U64_MAX, U64_MAX, "seed and epoch 2^64-1"),
        (DATASET_KEY_TAG, 0, "seed = the tag: mix64(0) = 0, then key 0"),
        (2**40 + 5, 2**63, "seed 2^40+5, epoch 2^63"),
    ):
        yield query_vector(
            f"dataset-epoch-key-s{seed}-e{epoch}",
            comment,
            {"op": "dataset_epoch_key", "seed": seed, "epoch": epoch},
            dataset_epoch_key(seed, epoch),
        )
    for seed, shard in ((0, 0), (0, 1), (7, 0), (7, 2), (U32_MAX, 99999), (U64_MAX, U64_MAX)):
        yield query_vector(
            f"shard-seed-s{seed}-i{shard}",
            f"file seed of shard {shard} of a dataset written with seed {seed}",
            {"op": "shard_seed", "seed": seed, "shard": shard},
            shard_seed(seed, shard),
        )
    good = order_query([3, 2], 2, 1, 0, True)
    key = {"op": "dataset_epoch_key", "seed": 1, "epoch": 0}
    seed_q = {"op": "shard_seed", "seed": 1, "shard": 0}
    bad: list[tuple[str, str, object]] = [
        (
            "shard-batches-missing",
            "dataset_order without shard_batches",
            {k: v for k, v in good.items() if k != "shard_batches"},
        ),
        ("shard-batches-integer", "shard_batches 5, not a list", {**good, "shard_batches": 5}),
        ("shard-batches-string-entry", 'shard_batches ["3"]', {**good, "shard_batches": ["3"]}),
        ("shard-batches-negative", "shard_batches [-1]", {**good, "shard_batches": [-1]}),
        (
            "shard-batches-above-u64",
            "shard_batches [2^64]",
            {**good, "shard_batches": [U64_MAX + 1]},
        ),
        (
            "shard-batches-sum-above-u64",
            "shard_batches [2^64-1, 1]: the total exceeds u64",
            {**good, "shard_batches": [U64_MAX, 1]},
        ),
        (
            "shuffle-missing",
            "dataset_order without shuffle",
            {k: v for k, v in good.items() if k != "shuffle"},
        ),
        ("shuffle-integer", "shuffle 1, not a boolean", {**good, "shuffle": 1}),
        ("shuffle-string", 'shuffle "true"', {**good, "shuffle": "true"}),
        ("dataset-order-block-size-0", "dataset_order block_size 0", {**good, "block_size": 0}),
        (
            "dataset-epoch-key-seed-above-u64",
            "dataset_epoch_key seed 2^64",
            {**key, "seed": U64_MAX + 1},
        ),
        (
            "dataset-epoch-key-missing-epoch",
            "dataset_epoch_key without epoch",
            {k: v for k, v in key.items() if k != "epoch"},
        ),
        ("shard-seed-negative", "shard_seed shard -1", {**seed_q, "shard": -1}),
        ("shard-seed-shard-above-u64", "shard_seed shard 2^64", {**seed_q, "shard": U64_MAX + 1}),
        (
            "shard-seed-missing-seed",
            "shard_seed without seed",
            {k: v for k, v in seed_q.items() if k != "seed"},
        ),
    ]
    for name, comment, query in bad:
        vector = invalid_query_vector(f"invalid-query-{name}", comment, query)
        assert vector.expected == {"error": INVALID_QUERY}
        yield vector
