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
    DatasetCode,
    Manifest,
    Shard,
    Source,
    bytes_xxh3,
    dataset_epoch_key,
    dataset_epoch_order,
    shard_seed,
)

from .dataset_files import (
    BASE_BATCH_SIZE,
    BASE_SEED,
    BASE_SEQ_LEN,
    DATASET_SUFFIX,
    SHARD0,
    SHARD1,
    Files,
    Records,
    base,
    base_records,
    broken,
    build_dataset,
    checksums_file,
    failure,
    manifest_of,
    records_of,
    shard_bytes,
    sharded,
    slot_sums,
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
    digests: list[str] = []
    for shard in manifest.shards:
        data = files[shard.name]
        assert data is not None
        digests += batch_digests(data, parse_header(data[:HEADER_SIZE]))
    orders = []
    for block_size, seed, epoch, shuffle in DATASET_ORDER_CASES:
        key_seed = manifest.seed if seed is None else seed
        order = dataset_epoch_order(manifest.shard_batches, block_size, key_seed, epoch, shuffle)
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
        "shard_batches": manifest.shard_batches,
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
) -> dict[str, Any]:
    """What the golden test gives the sharded writer to reproduce a vector byte for byte (the
    dtype code only where it is not 0, as in a file's writer input)."""
    return {
        "dataset_writer_input": {
            "records": records.tolist(),
            "batch_size": batch_size,
            "seq_len": seq_len,
            "shard_batches": shard_batches,
            "seed": seed,
            "sources": [{"path": s.path, "records": list(s.records)} for s in sources],
            **({"dtype": dtype} if dtype != DTYPE_UINT32 else {}),
        }
    }


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
) -> Vector:
    """A valid dataset the sharded writer makes of ``count`` pseudo-random records."""
    records = records_of(count, seq_len, salt=1000 + seed + count, dtype=dtype)
    files = sharded(records, batch_size, seq_len, shard_batches, seed, sources, dtype)
    extra = writer_input(records, batch_size, seq_len, shard_batches, seed, sources, dtype)
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
