"""Cross-implementation interoperability: ZeroBatch <-> seed-document implementation."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import zerobatch_core
from zerobatch_core import BatchFileReader, BatchNativeLoader, write_batch_dataset, write_batch_file

from . import seed_impl

U32_MAX = 2**32 - 1


def unique_records(n: int, seq_len: int) -> np.ndarray:
    """Row i = [i, i*7, i, i*7, ...] with a few extreme tokens mixed in.

    Every row has unique content (first token is the row index), so a row read back
    from a file identifies its source record.
    """
    rows = np.empty((n, seq_len), dtype=np.uint64)
    idx = np.arange(n, dtype=np.uint64)
    rows[:, 0::2] = idx[:, None]
    if seq_len > 1:
        rows[:, 1::2] = (idx * 7)[:, None]
    if seq_len >= 5:
        rows[:, 2] = 0
        rows[:, 3] = 2**31
        rows[:, 4] = U32_MAX
    return rows.astype(np.uint32)


def row_key(row: np.ndarray) -> bytes:
    return np.ascontiguousarray(row, dtype="<u4").tobytes()


def check_zb_file_with_seed_impl(
    path: Path, records: np.ndarray, batch_size: int, seed: int
) -> list[np.ndarray]:
    n, seq_len = records.shape
    hdr = seed_impl.read_header(path)
    assert hdr["magic"] == b"LLMBATCH"
    assert hdr["version"] == 1
    assert hdr["dtype"] == 0
    assert hdr["batch_size"] == batch_size
    assert hdr["seq_len"] == seq_len
    assert hdr["num_batches"] == n // batch_size
    assert hdr["total_records"] == n
    assert hdr["seed"] == seed

    batches = seed_impl.read_batches(path)
    assert len(batches) == n // batch_size
    # Padding after each batch must be zero.
    for pad in seed_impl.read_padding(path):
        assert not any(pad)

    with BatchFileReader(path) as reader:
        assert reader.num_batches == hdr["num_batches"]
        assert reader.padded_batch_bytes == seed_impl.padded_batch_bytes(batch_size, seq_len)
        for i, b in enumerate(batches):
            assert b.shape == (batch_size, seq_len)
            assert b.dtype == np.uint32
            np.testing.assert_array_equal(b, reader.read_batch(i))

    # Rows in the file: a duplicate-free subset of the input rows, of size nb*bs.
    source = {row_key(r) for r in records}
    assert len(source) == n
    seen = Counter(row_key(r) for b in batches for r in b)
    assert sum(seen.values()) == (n // batch_size) * batch_size
    assert all(c == 1 for c in seen.values())
    assert set(seen) <= source
    return batches


SHAPES = [
    # (num_records, batch_size, seq_len, seed)
    (10, 3, 5, 0),  # padded slot, remainder 1 dropped
    (9, 4, 256, 42),  # raw batch = 4096 bytes exactly, no padding
    (17, 2, 1, 7),  # tiny rows
    (33, 8, 300, U32_MAX),  # multi-page padded slot, max seed
    (5, 5, 1024, 123),  # one batch, multi-page exact
]


@pytest.mark.parametrize(("n", "batch_size", "seq_len", "seed"), SHAPES)
def test_zerobatch_writer_seed_reader(
    tmp_path: Path, n: int, batch_size: int, seq_len: int, seed: int
) -> None:
    records = unique_records(n, seq_len)
    path = tmp_path / "zb.batch"
    nb = write_batch_file(path, records, batch_size, seq_len=seq_len, seed=seed)
    assert nb == n // batch_size
    check_zb_file_with_seed_impl(path, records, batch_size, seed)


@pytest.mark.parametrize(("n", "batch_size", "seq_len", "seed"), SHAPES[:3])
def test_zerobatch_dataset_writer_seed_reader(
    tmp_path: Path, n: int, batch_size: int, seq_len: int, seed: int
) -> None:
    records = unique_records(n, seq_len)
    path = tmp_path / "zb_ds.batch"
    nb = write_batch_dataset(
        path,
        (r for r in records),
        total_records=n,
        batch_size=batch_size,
        seq_len=seq_len,
        seed=seed,
    )
    assert nb == n // batch_size
    check_zb_file_with_seed_impl(path, records, batch_size, seed)


def test_zerobatch_writer_int64_input_extreme_tokens(tmp_path: Path) -> None:
    # Same content given as int64 (the common tokenizer output dtype).
    records = unique_records(12, 5)
    path = tmp_path / "zb64.batch"
    write_batch_file(path, records.astype(np.int64), 4, seed=3)
    batches = check_zb_file_with_seed_impl(path, records, 4, 3)
    flat = np.concatenate(batches)
    assert {0, 2**31, U32_MAX} <= set(flat[:, 2:5].ravel().tolist())


def test_zerobatch_writer_zero_batches(tmp_path: Path) -> None:
    records = unique_records(3, 5)
    path = tmp_path / "empty.batch"
    assert write_batch_file(path, records, 4, seed=9, allow_empty=True) == 0
    assert path.stat().st_size == 4096
    hdr = seed_impl.read_header(path)
    assert hdr["num_batches"] == 0
    assert hdr["total_records"] == 3
    assert hdr["batch_size"] == 4
    assert hdr["seq_len"] == 5
    assert hdr["seed"] == 9
    assert seed_impl.read_batches(path) == []


def test_zerobatch_header_bytes_match_seed_pack(tmp_path: Path) -> None:
    records = unique_records(10, 5)
    path = tmp_path / "h.batch"
    write_batch_file(path, records, 3, seed=77)
    expected = seed_impl.pack_header(3, 5, 3, 77, 10)
    assert path.read_bytes()[:4096] == expected


# --------------------------------------------------------------------------------------
# seed_impl writer -> ZeroBatch reader
# --------------------------------------------------------------------------------------


def make_batches(num_batches: int, batch_size: int, seq_len: int) -> list[np.ndarray]:
    recs = unique_records(num_batches * batch_size, seq_len)
    return [recs[i * batch_size : (i + 1) * batch_size] for i in range(num_batches)]


@pytest.mark.parametrize(
    ("num_batches", "batch_size", "seq_len", "block_size"),
    [
        (4, 3, 5, 1),
        (3, 4, 256, 2),
        (7, 2, 1, 3),
        (5, 8, 300, 256),
        (1, 5, 1024, 1),
    ],
)
def test_seed_writer_zerobatch_reader(
    tmp_path: Path, num_batches: int, batch_size: int, seq_len: int, block_size: int
) -> None:
    batches = make_batches(num_batches, batch_size, seq_len)
    total = num_batches * batch_size + batch_size - 1  # dropped remainder < batch_size
    seed = 31337
    path = tmp_path / "seed.batch"
    seed_impl.write_file(path, batches, seed=seed, total_records=total)
    pbb = seed_impl.padded_batch_bytes(batch_size, seq_len)
    assert path.stat().st_size == 4096 + num_batches * pbb

    with BatchFileReader(path) as reader:
        assert reader.batch_size == batch_size
        assert reader.seq_len == seq_len
        assert reader.num_batches == num_batches
        assert len(reader) == num_batches
        assert reader.seed == seed
        assert reader.total_records == total
        assert reader.padded_batch_bytes == pbb
        for i, b in enumerate(batches):
            got = reader.read_batch(i)
            assert got.dtype == np.uint32
            assert got.shape == (batch_size, seq_len)
            np.testing.assert_array_equal(got, b)
            got64 = reader.read_batch_int64(i)
            assert got64.dtype == np.int64
            np.testing.assert_array_equal(got64, b.astype(np.int64))

    report = zerobatch_core.validate_file(path, deep=True)
    assert report.valid, report

    loader = BatchNativeLoader(path, block_size=block_size, shuffle=False)
    served = list(loader)
    assert len(served) == num_batches
    for got, b in zip(served, batches, strict=True):
        assert isinstance(got, np.ndarray)
        assert got.dtype == np.uint32
        assert got.shape == (batch_size, seq_len)
        np.testing.assert_array_equal(got, b)


def test_seed_writer_extreme_tokens(tmp_path: Path) -> None:
    b = np.array([[0, 1, 2**31 - 1, 2**31, U32_MAX]] * 3, dtype=np.uint32)
    path = tmp_path / "ext.batch"
    seed_impl.write_file(path, [b, b[::-1].copy()], seed=U32_MAX, total_records=6)
    with BatchFileReader(path) as reader:
        assert reader.seed == U32_MAX
        np.testing.assert_array_equal(reader.read_batch(0), b)
        np.testing.assert_array_equal(reader.read_batch(1), b[::-1])
        np.testing.assert_array_equal(
            reader.read_batch_int64(0)[0], [0, 1, 2**31 - 1, 2**31, U32_MAX]
        )
    assert zerobatch_core.validate_file(path, deep=True).valid


def test_seed_writer_zero_batches(tmp_path: Path) -> None:
    path = tmp_path / "empty_seed.batch"
    seed_impl.write_file(path, [], seed=5, total_records=2, batch_size=3, seq_len=5)
    assert path.stat().st_size == 4096
    with BatchFileReader(path) as reader:
        assert reader.num_batches == 0
        assert len(reader) == 0
        assert reader.batch_size == 3
        assert reader.seq_len == 5
        assert reader.total_records == 2
    assert zerobatch_core.validate_file(path, deep=True).valid
    assert list(BatchNativeLoader(path, block_size=1, shuffle=False)) == []


def test_seed_roundtrip_self_consistency(tmp_path: Path) -> None:
    batches = make_batches(3, 3, 5)
    path = tmp_path / "rt.batch"
    seed_impl.write_file(path, batches, seed=1, total_records=9)
    for got, b in zip(seed_impl.read_batches(path), batches, strict=True):
        np.testing.assert_array_equal(got, b)


# --------------------------------------------------------------------------------------
# Negative cross checks
# --------------------------------------------------------------------------------------


def test_appended_byte_rejected_by_both(tmp_path: Path) -> None:
    path = tmp_path / "bad.batch"
    seed_impl.write_file(path, make_batches(2, 3, 5), seed=0, total_records=6)
    with path.open("ab") as f:
        f.write(b"\x00")

    with pytest.raises(ValueError, match="size"):
        seed_impl.read_header(path)
    with pytest.raises(zerobatch_core.FormatError) as exc:
        BatchFileReader(path)
    assert exc.value.code.value == "size_mismatch"
    report = zerobatch_core.validate_file(path, deep=True)
    assert not report.valid
    assert report.code is not None
    assert report.code.value == "size_mismatch"


@pytest.mark.parametrize(
    ("offset", "value", "code"),
    [
        (0, b"X", "bad_magic"),
        (8, b"\x02", "unsupported_version"),
        (28, b"\x02", "unsupported_dtype"),
        (29, b"\x01", "unsupported_dtype"),  # dtype 256: the code is all four bytes
        (40, b"\x01", "nonzero_reserved"),
        (4095, b"\x01", "nonzero_reserved"),
    ],
)
def test_header_corruption_rejected_by_both(
    tmp_path: Path, offset: int, value: bytes, code: str
) -> None:
    path = tmp_path / "hdr.batch"
    seed_impl.write_file(path, make_batches(2, 3, 5), seed=0, total_records=6)
    data = bytearray(path.read_bytes())
    data[offset : offset + 1] = value
    path.write_bytes(bytes(data))

    with pytest.raises(ValueError):
        seed_impl.read_header(path)
    with pytest.raises(zerobatch_core.FormatError) as exc:
        BatchFileReader(path)
    assert exc.value.code.value == code


def test_truncated_file_rejected_by_both(tmp_path: Path) -> None:
    path = tmp_path / "trunc.batch"
    seed_impl.write_file(path, make_batches(2, 3, 5), seed=0, total_records=6)
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    with pytest.raises(ValueError):
        seed_impl.read_header(path)
    with pytest.raises(zerobatch_core.FormatError) as exc:
        BatchFileReader(path)
    assert exc.value.code.value == "size_mismatch"

    path.write_bytes(data[:100])
    with pytest.raises(ValueError):
        seed_impl.read_header(path)
    with pytest.raises(zerobatch_core.FormatError) as exc:
        BatchFileReader(path)
    assert exc.value.code.value == "truncated_header"


def test_nonzero_slot_padding(tmp_path: Path) -> None:
    # The seed document says writers zero-pad each slot; a deep validation flags
    # non-zero padding while the batch data itself stays readable by both readers.
    batches = make_batches(2, 3, 5)
    path = tmp_path / "pad.batch"
    seed_impl.write_file(path, batches, seed=0, total_records=6)
    data = bytearray(path.read_bytes())
    data[4096 + 3 * 5 * 4] = 1  # first padding byte of slot 0
    path.write_bytes(bytes(data))

    assert seed_impl.read_padding(path)[0][0] == 1
    for got, b in zip(seed_impl.read_batches(path), batches, strict=True):
        np.testing.assert_array_equal(got, b)
    with BatchFileReader(path) as reader:
        np.testing.assert_array_equal(reader.read_batch(0), batches[0])
    assert zerobatch_core.validate_file(path, deep=False).valid
    report = zerobatch_core.validate_file(path, deep=True)
    assert not report.valid
    assert report.code is not None
    assert report.code.value == "nonzero_padding"


def test_total_records_semantics(tmp_path: Path) -> None:
    batches = make_batches(2, 3, 5)
    # More source records than stored rows (dropped remainder, or a larger source).
    path = tmp_path / "tr_big.batch"
    seed_impl.write_file(path, batches, seed=0, total_records=100)
    assert seed_impl.read_header(path)["total_records"] == 100
    with BatchFileReader(path) as reader:
        assert reader.total_records == 100
    assert zerobatch_core.validate_file(path, deep=True).valid

    # Fewer source records than stored rows: the seed document states no rule here
    # (seed_impl accepts it); ZeroBatch rejects it as record_count_mismatch.
    path = tmp_path / "tr_small.batch"
    seed_impl.write_file(path, batches, seed=0, total_records=5)
    assert seed_impl.read_header(path)["total_records"] == 5
    with pytest.raises(zerobatch_core.FormatError) as exc:
        BatchFileReader(path)
    assert exc.value.code.value == "record_count_mismatch"


# -- dtype 1 (uint16 tokens): a reader of the seed document knows only code 0 -------------

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "vectors"
U16_VALID = sorted(p.name for p in VECTORS.glob("u16-valid-*.batch"))


def test_uint16_vectors_exist() -> None:
    assert len(U16_VALID) >= 10


@pytest.mark.parametrize("name", U16_VALID)
def test_seed_reader_rejects_every_valid_uint16_file_as_unsupported(name: str) -> None:
    """A version 1 reader that knows only dtype 0 must refuse a dtype 1 file by its dtype
    (SPEC.md rule 4), never read its slots as uint32, even where the sizes happen to agree."""
    path = VECTORS / name
    with pytest.raises(ValueError, match="unsupported dtype code: 1"):
        seed_impl.read_header(path)
    with pytest.raises(ValueError, match="unsupported dtype code: 1"):
        seed_impl.read_batches(path)
    with BatchFileReader(path) as reader:  # ZeroBatch reads it
        assert reader.dtype == 1 and reader.token_dtype == np.dtype(np.uint16)


def test_uint16_file_holds_the_seed_readers_tokens_at_half_the_width(tmp_path: Path) -> None:
    """The same batches as a dtype 0 file (seed writer) and a dtype 1 file (the seed layout
    with 2-byte tokens, built here by hand): ZeroBatch serves the same token values from both,
    the seed reader reads the first and refuses the second."""
    batches = [
        np.array([[0, 1, 255, 256, 65535], [65534, 7, 2**15, 2**15 - 1, 0], [9, 9, 9, 9, 9]]),
        np.array([[65535] * 5, [0] * 5, [1, 2, 3, 4, 5]]),
    ]
    wide = tmp_path / "wide.batch"
    seed_impl.write_file(wide, batches, seed=3, total_records=6)
    narrow = tmp_path / "narrow.batch"
    head = seed_impl.pack_header(3, 5, 2, 3, 6, dtype=1)
    slots = b"".join(
        np.ascontiguousarray(b, dtype="<u2").tobytes().ljust(seed_impl.PAGE_SIZE, b"\0")
        for b in batches
    )
    narrow.write_bytes(head + slots)
    assert narrow.stat().st_size == wide.stat().st_size  # 15 tokens fit one page either way
    with pytest.raises(ValueError, match="unsupported dtype code: 1"):
        seed_impl.read_header(narrow)
    seed_batches = seed_impl.read_batches(wide)
    with BatchFileReader(wide) as w, BatchFileReader(narrow) as n:
        for i, b in enumerate(batches):
            np.testing.assert_array_equal(seed_batches[i], b)
            assert n.read_batch(i).dtype == np.uint16 and w.read_batch(i).dtype == np.uint32
            np.testing.assert_array_equal(n.read_batch(i), w.read_batch(i))
            np.testing.assert_array_equal(n.read_batch_int64(i), w.read_batch_int64(i))
            np.testing.assert_array_equal(n.read_batch_int32(i), b)
    assert zerobatch_core.validate_file(narrow, deep=True).valid
    # Relabelling the uint32 file as dtype 1 keeps its size, but its tokens' high halves
    # become padding: only deep validation can tell.
    relabelled = bytearray(wide.read_bytes())
    relabelled[28] = 1
    forged = tmp_path / "forged.batch"
    forged.write_bytes(bytes(relabelled))
    assert zerobatch_core.validate_file(forged, deep=False).valid
    report = zerobatch_core.validate_file(forged, deep=True)
    assert report.code is not None and report.code.value == "nonzero_padding"


# -- datasets: a reader of manifest version 1 alone ----------------------------------------


def dataset_vectors(version: int) -> list[str]:
    """Dataset vectors whose manifest says ``version`` (JSON ones only)."""
    names = []
    for folder in sorted(VECTORS.glob("*.dataset")):
        manifest = folder / "manifest.json"
        if not manifest.is_file():
            continue
        try:
            doc = json.loads(manifest.read_bytes())
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("version") == version:
            names.append(folder.name)
    return names


V1_VALID = [
    e["id"]
    for e in json.loads((VECTORS / "index.json").read_text())["vectors"]
    if "dataset-valid" in e["flags"] and "uint16" not in e["flags"] and "v2" not in e["flags"]
]
V2_DATASETS = dataset_vectors(2)


def test_version_2_dataset_vectors_exist() -> None:
    assert len(V2_DATASETS) >= 100 and len(V1_VALID) >= 4


@pytest.mark.parametrize("name", V2_DATASETS)
def test_seed_reader_refuses_every_version_2_dataset_by_its_version(name: str) -> None:
    """A reader of manifest version 1 must refuse a version 2 manifest by its version (SPEC.md
    rule 3), valid or not: it never takes a dataset described by a shard index for one with no
    shards."""
    with pytest.raises(ValueError, match="manifest_unsupported_version"):
        seed_impl.read_dataset_shards(VECTORS / name)


@pytest.mark.parametrize("vid", V1_VALID)
def test_seed_reader_reads_every_valid_version_1_dataset(vid: str) -> None:
    """The same reader serves every valid version 1 dataset of dtype 0 with the vector's
    tokens, slot by slot in dataset order."""
    want = json.loads((VECTORS / f"{vid}.expected.json").read_text())["expected"]
    digests = [
        hashlib.sha256(np.ascontiguousarray(batch, dtype="<u4").tobytes()).hexdigest()
        for shard in seed_impl.read_dataset_shards(VECTORS / f"{vid}.dataset")
        for batch in seed_impl.read_batches(shard)
    ]
    assert digests == want["batch_sha256"]
