"""MosaicML Streaming MDS shards: read as written, cut into records, and every bad input refused.

Datasets are written by ``tests/mds_writer.py``, which lays shards and ``index.json`` out as
Streaming's ``MDSWriter`` does (Streaming itself cannot be imported here). Tokens read back are
compared with the arrays that were written, and records with a plain NumPy cut of them.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.mds_writer import compress, merge_index, read_reference, write_mds
from zerobatch_core.errors import IngestError, MissingDependencyError
from zerobatch_core.ingest import mds
from zerobatch_core.ingest.formats import FormatOptions, detect_format, open_token_files
from zerobatch_core.ingest.mds import MDSShard, expand_mds, is_mds
from zerobatch_core.ingest.token_files import TokenFile, TokenFileSource

Arrays = list[npt.NDArray[Any]]


def _samples(
    encoding: str, dtype: str, n: int, seed: int, *, empties: bool = False
) -> list[npt.NDArray[Any]]:
    """Token arrays of random lengths (a fixed length for a fixed-shape encoding); with
    ``empties`` the first, the last and every fifth one are empty."""
    rng = np.random.default_rng(seed)
    fixed = encoding.count(":") == 2
    top = min(int(np.iinfo(dtype).max), 60_000)
    out = []
    for i in range(n):
        length = 6 if fixed else int(rng.integers(1, 40))
        if empties and (i in (0, n - 1) or i % 5 == 2):
            length = 0
        out.append(rng.integers(0, top, length).astype(dtype))
    return out


def write(
    root: Path,
    encoding: str,
    tokens: Arrays,
    *,
    compression: str | None = None,
    size_limit: int = 700,
    column: str = "input_ids",
) -> list[Arrays]:
    """``tokens`` as an MDS dataset at ``root`` (with an ``id`` str column before the token
    column and a fixed-size ``len`` int column after it); returns each shard's arrays."""
    samples = [
        {
            "id": f"doc-{i}",
            column: t.tobytes() if encoding == "bytes" else t,
            "len": len(t),
        }
        for i, t in enumerate(tokens)
    ]
    columns = {"id": "str", column: encoding, "len": "int"}
    index = write_mds(root, columns, samples, compression=compression, size_limit=size_limit)
    out, at = [], 0
    for shard in index["shards"]:
        out.append(tokens[at : at + shard["samples"]])
        at += shard["samples"]
    return out


def _concat(arrays: Arrays, dtype: Any) -> npt.NDArray[Any]:
    return np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, dtype)


def _starts(arrays: Arrays) -> npt.NDArray[np.int64]:
    return np.cumsum([0] + [a.size for a in arrays])[:-1].astype(np.int64)


def check_reads(shard: TokenFile, arrays: Arrays, seed: int = 0) -> None:
    """Whole reads, random ascending ranges and document starts against the written arrays."""
    whole = _concat(arrays, shard.dtype)
    assert shard.num_tokens == whole.size
    got = shard.read_tokens(0, shard.num_tokens)
    assert got.dtype == shard.dtype and np.array_equal(got, whole)
    assert np.array_equal(shard.document_starts(), _starts(arrays))
    rng = np.random.default_rng(seed)
    for _ in range(5):
        cuts = np.sort(rng.integers(0, whole.size + 1, 6))
        pieces = [shard.read_tokens(int(a), int(b)) for a, b in itertools.pairwise(cuts)]
        assert np.array_equal(np.concatenate(pieces), whole[cuts[0] : cuts[-1]])
    assert shard.read_tokens(whole.size, whole.size).size == 0


ENCODINGS = [
    pytest.param("ndarray:int32", "int32", None, id="ndarray-int32"),
    pytest.param("ndarray:uint16", "uint16", None, id="ndarray-uint16"),
    pytest.param("ndarray", "uint16", None, id="ndarray-dtypeless"),
    pytest.param("ndarray:uint32:6", "uint32", None, id="ndarray-fixed-shape"),
    pytest.param("bytes", "int32", "int32", id="bytes-int32"),
    pytest.param("bytes", "uint16", "uint16", id="bytes-uint16"),
    pytest.param("bytes", "int64", "<i8", id="bytes-int64"),
]


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize(("encoding", "dtype", "given"), ENCODINGS)
def test_shards_read_as_written(
    tmp_path: Path, encoding: str, dtype: str, given: str | None, compression: str | None
) -> None:
    tokens = _samples(encoding, dtype, 60, seed=len(encoding), empties=encoding == "bytes")
    per_shard = write(tmp_path, encoding, tokens, compression=compression)
    assert len(per_shard) > 3
    shards = expand_mds(tmp_path, dtype=given)
    assert [s.num_samples for s in shards] == [len(a) for a in per_shard]
    for i, (shard, arrays) in enumerate(zip(shards, per_shard, strict=True)):
        assert shard.dtype == np.dtype(dtype)
        assert shard.path.endswith(".mds.zstd" if compression else ".mds")
        check_reads(shard, arrays, seed=i)
        shard.close()


def test_empty_samples_share_their_start(tmp_path: Path) -> None:
    tokens = [np.zeros(0, np.uint16), np.arange(3, dtype=np.uint16), np.zeros(0, np.uint16)]
    tokens += [np.zeros(0, np.uint16), np.arange(5, 9, dtype=np.uint16), np.zeros(0, np.uint16)]
    (arrays,) = write(tmp_path, "bytes", tokens, size_limit=0)
    (shard,) = expand_mds(tmp_path, dtype="uint16")
    assert list(shard.document_starts()) == [0, 0, 3, 3, 3, 7]
    check_reads(shard, arrays)
    src = TokenFileSource([shard], 2, "documents")
    assert np.array_equal(np.concatenate(list(src.iter_blocks())), [[0, 1], [5, 6]])


def test_an_empty_dataset_shard_and_an_empty_shard(tmp_path: Path) -> None:
    """Streaming flushes an empty shard when the first sample is over the size limit."""
    tokens = [np.arange(40, dtype=np.int32), np.arange(3, dtype=np.int32)]
    per_shard = write(tmp_path, "ndarray:int32", tokens, size_limit=100)
    assert len(per_shard[0]) == 0
    shards = expand_mds(tmp_path)
    assert shards[0].num_tokens == 0 and shards[0].document_starts().size == 0
    for shard, arrays in zip(shards, per_shard, strict=True):
        check_reads(shard, arrays)


def numpy_records(arrays: Arrays, seq_len: int, layout: str) -> npt.NDArray[np.uint32]:
    """The records of one file, cut with plain NumPy and a loop over document starts."""
    whole = _concat(arrays, np.int64).astype(np.int64)
    if layout == "contiguous":
        n = whole.size // seq_len
        return whole[: n * seq_len].reshape(n, seq_len).astype(np.uint32)
    rows, pos = [], 0
    for s in sorted(set(_starts(arrays).tolist())):
        if s >= pos and s < whole.size:
            if s + seq_len > whole.size:
                break
            rows.append(whole[s : s + seq_len])
            pos = s + seq_len
    return np.array(rows, dtype=np.uint32).reshape(len(rows), seq_len)


@pytest.mark.parametrize("layout", ["contiguous", "documents"])
@pytest.mark.parametrize(
    ("encoding", "dtype", "compression"),
    [("ndarray:uint16", "uint16", None), ("ndarray", "int32", "zstd"), ("bytes", "uint32", "gz")],
)
def test_records_match_a_numpy_cut(
    tmp_path: Path, layout: str, encoding: str, dtype: str, compression: str | None
) -> None:
    tokens = _samples(encoding, dtype, 80, seed=7, empties=encoding == "bytes")
    per_shard = write(tmp_path, encoding, tokens, compression=compression, size_limit=900)
    given = dtype if encoding == "bytes" else None
    for seq_len, chunk in ((1, None), (7, 3), (33, None)):
        src = TokenFileSource(expand_mds(tmp_path, dtype=given), seq_len, layout, chunk)  # type: ignore[arg-type]
        expected = [numpy_records(a, seq_len, layout) for a in per_shard]
        assert src.record_counts() == [e.shape[0] for e in expected]
        blocks = list(src.iter_blocks())
        got = np.concatenate(blocks) if blocks else np.zeros((0, seq_len), np.uint32)
        assert np.array_equal(got, np.concatenate(expected))
        assert src.source_tokens == sum(t.size for t in tokens)
        src.close()


def test_dtypeless_samples_of_several_dtypes_and_shapes(tmp_path: Path) -> None:
    tokens: Arrays = [
        np.arange(6, dtype=np.uint16).reshape(2, 3),
        np.array([-1, 70_000], dtype=np.int32),
        np.arange(300, dtype=np.uint8).astype(np.uint8).reshape(3, 2, 50),
        np.array([5], dtype=np.int8),
    ]
    write(tmp_path, "ndarray", tokens, size_limit=0)
    (shard,) = expand_mds(tmp_path)
    assert shard.dtype == np.dtype(np.int32)
    check_reads(shard, tokens)
    with pytest.raises(IngestError, match=r"sample 0 .* holds uint16 tokens, but dtype int32"):
        expand_mds(tmp_path, dtype="int32")

    other = tmp_path / "wide"
    write(other, "ndarray", [np.arange(2, dtype=np.uint64), np.arange(2, dtype=np.int64)])
    with pytest.raises(IngestError, match="no integer dtype holds"):
        expand_mds(other)


def test_fixed_dtype_arrays_of_any_shape_are_flattened(tmp_path: Path) -> None:
    big = np.arange(70_000, dtype=np.uint32) % 1000  # a uint32 shape entry (70,000 > 2**16)
    tokens: Arrays = [np.arange(12, dtype=np.uint32).reshape(3, 4), big, big[:600].reshape(300, 2)]
    write(tmp_path, "ndarray:uint32", tokens, size_limit=0)
    (shard,) = expand_mds(tmp_path)
    check_reads(shard, tokens)


@pytest.mark.parametrize("compression", ["zstd:7", "gz", "bz2:1"])
def test_compressions(tmp_path: Path, compression: str) -> None:
    tokens = _samples("ndarray:uint16", "uint16", 50, seed=3)
    per_shard = write(tmp_path, "ndarray:uint16", tokens, compression=compression)
    for shard, arrays in zip(expand_mds(tmp_path), per_shard, strict=True):
        check_reads(shard, arrays)


def test_decompressed_copies_are_bounded_and_dropped(tmp_path: Path) -> None:
    tokens = _samples("ndarray:int32", "int32", 60, seed=4)
    per_shard = write(tmp_path, "ndarray:int32", tokens, compression="zstd")
    shards = expand_mds(tmp_path)
    assert len(shards) > mds.KEEP_DECOMPRESSED + 2
    held = [s for s in shards if s._copy is not None]
    assert len(held) <= mds.KEEP_DECOMPRESSED
    for shard, arrays in zip(shards, per_shard, strict=True):
        half = shard.num_tokens // 2
        assert np.array_equal(shard.read_tokens(0, half), _concat(arrays, np.int32)[:half])
        assert sum(s._copy is not None for s in shards) <= mds.KEEP_DECOMPRESSED
        shard.read_tokens(half, shard.num_tokens)
        assert shard._copy is None  # the last token read: the copy is gone
    for shard in shards:
        shard.close()


def test_the_raw_file_beside_a_compressed_one_is_read(tmp_path: Path) -> None:
    """Streaming's cache keeps the decompressed ``.mds`` beside the ``.mds.zstd``."""
    tokens = _samples("ndarray:uint16", "uint16", 20, seed=5)
    per_shard = write(tmp_path, "ndarray:uint16", tokens, compression="zstd", size_limit=0)
    import zstandard

    for zipped in tmp_path.glob("*.zstd"):
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(zipped.read_bytes())
        zipped.with_suffix("").write_bytes(raw)
        zipped.unlink()  # the raw file alone suffices
    shards = expand_mds(tmp_path)
    assert all(not s.compressed and s.path.endswith(".mds") for s in shards)
    for shard, arrays in zip(shards, per_shard, strict=True):
        check_reads(shard, arrays)


def test_nested_and_merged_datasets(tmp_path: Path) -> None:
    a = write(tmp_path / "part-0", "ndarray:uint16", _samples("x", "uint16", 30, seed=1))
    b = write(tmp_path / "part-1", "ndarray:uint16", _samples("x", "uint16", 30, seed=2))
    (tmp_path / "notes").mkdir()  # a sub-directory without an index is passed over
    nested = expand_mds(tmp_path)
    assert len(nested) == len(a) + len(b)
    for shard, arrays in zip(nested, a + b, strict=True):
        check_reads(shard, arrays)

    deeper = tmp_path / "deeper"
    write(deeper / "x" / "y", "ndarray:uint16", _samples("x", "uint16", 5, seed=3))
    assert len(expand_mds(deeper)) == 1

    merge_index(tmp_path, ["part-0", "part-1"])
    merged = expand_mds(tmp_path)
    assert [s.path for s in merged] == [s.path for s in nested]
    assert is_mds(tmp_path)
    with pytest.raises(IngestError, match="listed twice"):
        expand_mds([tmp_path, tmp_path / "part-1"])
    globbed = expand_mds(str(tmp_path / "part-*"))
    assert [s.path for s in globbed] == [s.path for s in nested]


def test_detection(tmp_path: Path) -> None:
    write(tmp_path / "ds", "ndarray:uint16", _samples("x", "uint16", 5, seed=1))
    assert is_mds(tmp_path / "ds") and is_mds(tmp_path / "ds" / "index.json")
    assert is_mds(tmp_path)  # the dataset is a sub-directory
    assert detect_format(str(tmp_path / "ds")) == "mds"
    assert not is_mds(tmp_path / "ds" / "shard.00000.mds")
    assert not is_mds(tmp_path / "missing")
    other = tmp_path / "other"
    other.mkdir()
    assert not is_mds(other)
    (other / "index.json").write_text('{"version": 2, "shards": [{"format": "json"}]}')
    assert not is_mds(other)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "index.json")
    assert not is_mds(fifo)  # refused without blocking


def test_opened_through_the_format_table(tmp_path: Path) -> None:
    tokens = _samples("bytes", "uint32", 20, seed=9)
    per_shard = write(tmp_path, "bytes", tokens, column="tokens")
    files = open_token_files("mds", [str(tmp_path)], FormatOptions("tokens", "uint32"))
    assert all(isinstance(f, MDSShard) and isinstance(f, TokenFile) for f in files)
    for shard, arrays in zip(files, per_shard, strict=True):
        check_reads(shard, arrays)


def test_zstandard_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "ndarray:uint16", _samples("x", "uint16", 5, seed=1), compression="zstd")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(MissingDependencyError, match=r"zstandard.*zerobatch\[formats\]"):
        expand_mds(tmp_path)


def test_memory_does_not_follow_the_shard_size(tmp_path: Path) -> None:
    """A 16 MiB shard (zstd) opens and reads in windows with a few MiB of Python memory."""
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 50_000, 4200).astype(np.uint32) for _ in range(1024)]
    write(tmp_path, "ndarray:uint32", tokens, compression="zstd", size_limit=1 << 26)
    tracemalloc.start()
    try:
        (shard,) = expand_mds(tmp_path)
        opened = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        step = 1 << 16
        for start in range(0, shard.num_tokens, step):
            shard.read_tokens(start, min(start + step, shard.num_tokens))
        reading = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert shard.num_tokens * 4 >= 16 << 20
    print(f"open peak {opened:,} B, reading peak {reading:,} B")
    assert opened < 6 << 20, opened
    assert reading < 6 << 20, reading


# -- bad inputs ---------------------------------------------------------------------------------


def _index(root: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((root / "index.json").read_text())
    return result


def _save(root: Path, index: dict[str, Any]) -> None:
    (root / "index.json").write_text(json.dumps(index))


def _edit(root: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    index = _index(root)
    fn(index)
    _save(root, index)


def _shard0(index: dict[str, Any]) -> dict[str, Any]:
    shard: dict[str, Any] = index["shards"][0]
    return shard


def _patch(path: Path, offset: int, data: bytes) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset : offset + len(data)] = data
    path.write_bytes(bytes(blob))


def _u32(value: int) -> bytes:
    return int(value).to_bytes(4, "little")


def _offsets(path: Path) -> npt.NDArray[np.int64]:
    blob = path.read_bytes()
    n = int.from_bytes(blob[:4], "little")
    return np.frombuffer(blob[4 : 8 + 4 * n], "<u4").astype(np.int64)


def _fix_raw_bytes(root: Path) -> None:
    size = (root / "shard.00000.mds").stat().st_size
    _edit(root, lambda ix: _shard0(ix)["raw_data"].update(bytes=size))


def _truncate(root: Path, keep: int, fix: bool = False) -> None:
    path = root / "shard.00000.mds"
    path.write_bytes(path.read_bytes()[:keep])
    if fix:
        _fix_raw_bytes(root)


def _append(root: Path, data: bytes) -> None:
    with (root / "shard.00000.mds").open("ab") as f:
        f.write(data)
    _fix_raw_bytes(root)


def _huge_count(root: Path) -> None:
    """``num_samples`` 2**32 - 1 in the shard and in the index."""
    _patch(root / "shard.00000.mds", 0, _u32(2**32 - 1))
    _edit(root, lambda ix: _shard0(ix).update(samples=2**32 - 1))


def _rezip(root: Path, raw: bytes, *, cut: int = 0, raw_bytes: int | None = None) -> None:
    """Shard 0 of a zstd dataset replaced by ``raw`` compressed (``cut`` bytes short), with
    ``zip_data.bytes`` fitted and ``raw_data.bytes`` set to ``raw_bytes``."""
    data = compress("zstd", raw)
    data = data[: len(data) - cut]
    (root / "shard.00000.mds.zstd").write_bytes(data)

    def fit(ix: dict[str, Any]) -> None:
        _shard0(ix)["zip_data"]["bytes"] = len(data)
        _shard0(ix)["raw_data"]["bytes"] = len(raw) if raw_bytes is None else raw_bytes

    _edit(root, fit)


def _raw_of_zip(root: Path) -> bytes:
    import zstandard

    blob = (root / "shard.00000.mds.zstd").read_bytes()
    return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(blob))


def _set_sample_size(root: Path) -> None:
    """The first variable size of sample 1 (the ``id`` column's) one larger."""
    path = root / "shard.00000.mds"
    at = int(_offsets(path)[1])
    size = int.from_bytes(path.read_bytes()[at : at + 4], "little")
    _patch(path, at, _u32(size + 1))


def _token_column_at(root: Path, sample: int) -> int:
    """Where sample ``sample``'s token column starts in shard 0 (``id``, ``input_ids`` and
    ``len`` columns: two size prefixes, then the ``id`` bytes)."""
    path = root / "shard.00000.mds"
    at = int(_offsets(path)[sample])
    id_size = int.from_bytes(path.read_bytes()[at : at + 4], "little")
    return at + 8 + id_size


def _fifo_shard(root: Path) -> None:
    (root / "shard.00000.mds").unlink()
    os.mkfifo(root / "shard.00000.mds")


BASES: dict[str, tuple[str, str | None, str | None]] = {
    "ndarray": ("ndarray:uint16", None, None),
    "dtypeless": ("ndarray", None, None),
    "zstd": ("ndarray:uint16", "zstd", None),
    "bytes": ("bytes", None, "uint32"),
}
"""The valid dataset each bad input starts from: encoding, compression, dtype option."""

SHARD, ZIP, INDEX = "shard.00000.mds", "shard.00000.mds.zstd", "index.json"

BAD: list[Any] = [
    # index.json
    ("ndarray", INDEX, lambda r: (r / INDEX).write_text("{not json"), ["not a JSON MDS index"]),
    ("ndarray", INDEX, lambda r: (r / INDEX).write_bytes(b"\xff\xfe"), ["not a JSON"]),
    ("ndarray", INDEX, lambda r: _save(r, [1, 2]), ["expected a JSON object"]),  # type: ignore[arg-type]
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: ix.update(version=3)), ["version"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: ix.pop("shards")), ["field shards"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).pop("samples")),
     ["shards[0].samples: missing"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).pop("raw_data")),
     ["shards[0].raw_data: missing"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).pop("column_sizes")),
     ["shards[0].column_sizes: missing"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(samples=-1)),
     ["shards[0].samples", "expected an integer"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(samples=True)),
     ["shards[0].samples"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(format="json")),
     ["format", "only MDS"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(column_sizes=[None])),
     ["lists of one length"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["column_sizes"].__setitem__(1, 8)),
     ["column_sizes[1]", "expected null"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["raw_data"].update(
        basename="../outside.mds")), ["relative path"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(compression="zstd")),
     ["zip_data"]),
    ("zstd", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(compression="br:11")),
     ["not read by ZeroBatch"]),
    ("zstd", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(compression="lz4")),
     ["unknown compression"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["column_encodings"].__setitem__(
        1, "ndarray:uint16:x")), ["shape"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["column_encodings"].__setitem__(
        1, "tokens16")), ["unknown MDS encoding"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["column_encodings"].__setitem__(
        1, "pkl")), ["pickle", "never unpickles"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["column_encodings"].__setitem__(
        1, "str")), ["does not hold token arrays"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["column_encodings"].__setitem__(
        1, "ndarray:float32")), ["token ids are integers"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix)["column_names"].__setitem__(
        1, "text")), ["no token column 'input_ids'", "text (ndarray:uint16)"]),
    ("ndarray", INDEX, lambda r: _edit(r, lambda ix: _shard0(ix).update(
        samples=_shard0(ix)["samples"] + 1)), ["field num_samples", ".samples)"]),
    # the shard file
    ("ndarray", SHARD, lambda r: (r / SHARD).unlink(), ["does not exist"]),
    ("ndarray", SHARD, _fifo_shard, ["not a regular file"]),
    ("ndarray", SHARD, lambda r: _truncate(r, 100), ["truncated shard"]),
    ("ndarray", SHARD, lambda r: _truncate(r, 2, fix=True), ["num_samples", "2 bytes"]),
    ("ndarray", SHARD, lambda r: _truncate(r, 300, fix=True), ["the shard's end"]),
    ("ndarray", SHARD, lambda r: _append(r, b"\0"), ["the shard's end"]),
    ("ndarray", SHARD, lambda r: _patch(r / SHARD, 0, _u32(7)), ["num_samples", "got 7"]),
    ("ndarray", SHARD, _huge_count, ["offsets table"]),
    ("ndarray", SHARD, lambda r: _patch(r / SHARD, 4, _u32(0)), ["offsets[0]", "offsets table"]),
    ("ndarray", SHARD, lambda r: _patch(r / SHARD, 4 + 4 * len(_offsets(r / SHARD)) - 4,
                                        _u32(10**6)), ["the last sample ends at 1,000,000"]),
    ("ndarray", SHARD, lambda r: _patch(r / SHARD, 8, _u32(10**6)), ["offsets[2]", "below"]),
    ("ndarray", SHARD, _set_sample_size, ["sample 1", "add up"]),
    ("ndarray", SHARD, lambda r: _patch(r / SHARD, _token_column_at(r, 1), bytes([9 << 2])),
     ["sample 1 column 'input_ids'", "array header"]),
    ("ndarray", SHARD, lambda r: _patch(r / SHARD, _token_column_at(r, 1) + 1, b"\xff"),
     ["sample 1 column 'input_ids'", "shape"]),
    ("dtypeless", SHARD, lambda r: _patch(r / SHARD, _token_column_at(r, 1), b"\x07"),
     ["sample 1 column 'input_ids'", "unknown dtype code 7"]),
    ("dtypeless", SHARD, lambda r: _patch(r / SHARD, _token_column_at(r, 1), b"\x22"),
     ["sample 1 column 'input_ids'", "float"]),
    ("bytes", SHARD, lambda r: _patch(r / SHARD, int(_offsets(r / SHARD)[0]) + 4, _u32(6)),
     ["sample 0", "add up"]),
    # compressed shards
    ("zstd", ZIP, lambda r: _rezip(r, _raw_of_zip(r), cut=7),
     ["zstd stream ends after", "cut short"]),
    ("zstd", ZIP, lambda r: _rezip(r, _raw_of_zip(r) + b"\0"), ["the shard's end"]),
    ("zstd", ZIP, lambda r: _rezip(r, _raw_of_zip(r), raw_bytes=len(_raw_of_zip(r)) - 1),
     ["decompresses to more than", "raw_data.bytes"]),
    ("zstd", ZIP, lambda r: (r / ZIP).write_bytes((r / ZIP).read_bytes()[:-3]),
     ["truncated shard"]),
    ("zstd", ZIP, lambda r: _patch(r / ZIP, 0, b"\0\0\0\0"), ["not a valid zstd stream"]),
    ("zstd", ZIP, lambda r: (r / ZIP).unlink(), ["does not exist", "shard.00000.mds"]),
]  # fmt: skip


@pytest.mark.parametrize(("base", "named", "mutate", "fragments"), BAD)
def test_bad_input_gives_one_ingest_error(
    tmp_path: Path, base: str, named: str, mutate: Callable[[Path], Any], fragments: list[str]
) -> None:
    encoding, compression, dtype = BASES[base]
    tokens = _samples(encoding, "uint16" if dtype is None else dtype, 40, seed=11)
    write(tmp_path, encoding, tokens, compression=compression)
    expand_mds(tmp_path, dtype=dtype)  # valid before the mutation
    mutate(tmp_path)
    with pytest.raises(IngestError) as caught:
        shards = expand_mds(tmp_path, dtype=dtype)
        for s in shards:
            s.read_tokens(0, s.num_tokens)
    message = str(caught.value)
    assert str(tmp_path / named) in message, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("encoding", "dtype", "match"),
    [
        ("bytes", None, "does not say its dtype"),
        ("bytes", ">u2", "little-endian"),
        ("bytes", "float32", "tokens are integers"),
        ("bytes", "not-a-dtype", "not a NumPy dtype"),
        ("ndarray:uint16", "int32", "holds uint16 tokens, but dtype int32 was given"),
    ],
)
def test_dtype_option(tmp_path: Path, encoding: str, dtype: str | None, match: str) -> None:
    write(tmp_path, encoding, _samples("x", "uint16", 5, seed=1))
    with pytest.raises(IngestError, match=match):
        expand_mds(tmp_path, dtype=dtype)


def test_inputs_that_are_not_datasets(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="does not exist"):
        expand_mds(tmp_path / "missing")
    with pytest.raises(IngestError, match=r"no index\.json in it"):
        expand_mds(tmp_path)
    with pytest.raises(IngestError, match="no MDS input matches"):
        expand_mds(str(tmp_path / "x*"))
    with pytest.raises(IngestError, match="no MDS inputs"):
        expand_mds([])
    os.mkfifo(tmp_path / "index.json")
    with pytest.raises(IngestError, match="not a regular file"):
        expand_mds(tmp_path)


def test_reference_reader_agrees(tmp_path: Path) -> None:
    """The fuzz oracle's reference decoder gives back what was written."""
    tokens = _samples("ndarray", "int32", 30, seed=2)
    per_shard = write(tmp_path, "ndarray", tokens, compression="zstd")
    ref = read_reference(str(tmp_path / "index.json"))
    assert all(
        np.array_equal(_concat(r, np.int32), _concat(a, np.int32))
        for r, a in zip(ref, per_shard, strict=True)
    )
