"""nanoGPT ``.bin`` shards: header checks, ``.bos.idx``, record cutting, end to end.

Shards are written here byte for byte as the real tools write them (an ``int32[256]`` header,
then the tokens; a ``.bos.idx`` of int32 token positions beside the shard), and every record is
checked against a direct ``np.fromfile(path, offset=1024)`` read of the source tokens.
"""

from __future__ import annotations

import os
import tempfile
import tracemalloc
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zerobatch_spec import record_source

from tests.helpers import expected_batches
from zerobatch_core import BatchFileReader, write_batch_dataset
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest import nanogpt
from zerobatch_core.ingest.nanogpt import (
    Align,
    BinShard,
    NanoGPTSource,
    count_records,
    expand_shards,
    iter_records,
)
from zerobatch_core.ingest.source import RecordSource

LEGACY, NEW = 20240520, 278895051
BOS16, BOS32 = 50256, 100_000

# (name, magic, itemsize, bos token): the three layouts the readers must accept.
VARIANTS = [
    ("legacy-u16", LEGACY, 2, BOS16),
    ("new-u16", NEW, 2, BOS16),
    ("new-u32", NEW, 4, BOS32),
]


def write_shard(
    path: Path,
    tokens: npt.ArrayLike,
    *,
    magic: int = NEW,
    itemsize: int = 2,
    version: int = 1,
    num_tokens: int | None = None,
    header3: int | None = None,
) -> Path:
    """A shard as ``fineweb.py`` (legacy) or ``nanogpt_data_processor.py`` (new) writes it."""
    toks = np.asarray(tokens)
    header = np.zeros(256, dtype=np.int32)
    header[0] = magic
    header[1] = version
    header[2] = toks.size if num_tokens is None else num_tokens
    if header3 is not None:
        header[3] = header3
    elif magic == NEW:
        header[3] = itemsize
    dtype = {2: np.uint16, 4: np.uint32}.get(itemsize, np.uint8)
    with open(path, "wb") as f:
        header.tofile(f)
        toks.astype(dtype).tofile(f)
    return path


def write_bos_index(shard: Path, tokens: npt.ArrayLike, bos: int) -> Path:
    """The ``.bos.idx`` the readers consume: int32 token positions of every BOS, ascending."""
    path = shard.with_suffix(".bos.idx")
    np.flatnonzero(np.asarray(tokens) == bos).astype(np.int32).tofile(path)
    return path


def source_tokens(path: Path) -> npt.NDArray[np.integer]:
    """The tokens read directly from the file, independently of the code under test."""
    header = np.fromfile(path, dtype=np.int32, count=256)
    dtype = np.uint32 if header[0] == NEW and header[3] == 4 else np.uint16
    return np.fromfile(path, dtype=dtype, offset=1024)


def reference_bos_starts(tokens: npt.NDArray[np.integer], bos: int, seq_len: int) -> list[int]:
    """The seed's align_to_bos loop, token by token, taking ``seq_len`` tokens per record."""
    n, pos = len(tokens), 0
    starts: list[int] = []
    while True:
        while pos < n and int(tokens[pos]) != bos:
            pos += 1
        if pos + seq_len > n:
            return starts
        starts.append(pos)
        pos += seq_len


def documents(
    rng: np.random.Generator, n_docs: int, bos: int, high: int, prefix: int = 3
) -> npt.NDArray[np.int64]:
    """Tokens of ``n_docs`` documents of random length, each starting with ``bos``."""
    head = rng.integers(0, high, size=prefix)  # the tail of a document from a previous shard
    head[head == bos] = bos + 1
    parts = [head]
    for length in rng.integers(1, 60, size=n_docs):
        doc = rng.integers(0, high, size=int(length))
        doc[0] = bos
        parts.append(doc)
    return np.concatenate(parts)


def collect(blocks: Iterable[npt.NDArray[np.uint32]], seq_len: int) -> npt.NDArray[np.uint32]:
    out = list(blocks)
    for b in out:
        assert b.dtype == np.uint32 and b.ndim == 2 and b.shape[1] == seq_len
        assert b.flags.c_contiguous and b.flags.writeable
    return np.concatenate(out) if out else np.zeros((0, seq_len), dtype=np.uint32)


def make_variant_shards(
    tmp_path: Path, magic: int, itemsize: int, bos: int, index: bool, lengths: tuple[int, ...]
) -> list[Path]:
    rng = np.random.default_rng(magic + itemsize + len(lengths))
    high = 2**16 - 1 if itemsize == 2 else 2**32 - 1
    paths = []
    for i, docs in enumerate(lengths):
        toks = documents(rng, docs, bos, high)
        path = write_shard(tmp_path / f"shard_{i:03d}.bin", toks, magic=magic, itemsize=itemsize)
        if index:
            write_bos_index(path, toks, bos)
        paths.append(path)
    return paths


# --- reading every record back ------------------------------------------------------------


@pytest.mark.parametrize(("name", "magic", "itemsize", "bos"), VARIANTS)
def test_contiguous_records_are_the_source_windows_per_shard(
    tmp_path: Path, name: str, magic: int, itemsize: int, bos: int
) -> None:
    paths = make_variant_shards(tmp_path, magic, itemsize, bos, False, (40, 7, 25))
    seq_len = 37
    expected = []
    for p in paths:
        toks = source_tokens(p)
        n = len(toks) // seq_len  # the remainder of each shard is dropped, never carried over
        expected.append(toks[: n * seq_len].reshape(n, seq_len))
    want = np.concatenate(expected).astype(np.uint32)
    got = collect(iter_records(paths, seq_len), seq_len)
    np.testing.assert_array_equal(got, want)
    assert count_records(paths, seq_len) == len(want)
    if itemsize == 4:
        assert int(want.max()) > 2**16  # the uint32 width really is exercised


@pytest.mark.parametrize("index", [False, True], ids=["scan", "bos.idx"])
@pytest.mark.parametrize(("name", "magic", "itemsize", "bos"), VARIANTS)
def test_bos_records_match_the_reference_loop(
    tmp_path: Path, name: str, magic: int, itemsize: int, bos: int, index: bool
) -> None:
    paths = make_variant_shards(tmp_path, magic, itemsize, bos, index, (50, 3, 30))
    seq_len = 45
    rows = []
    for p in paths:
        toks = source_tokens(p)
        shard = BinShard(p)
        assert shard.has_bos_index is index
        np.testing.assert_array_equal(shard.bos_positions(bos), np.flatnonzero(toks == bos))
        rows += [toks[s : s + seq_len] for s in reference_bos_starts(toks, bos, seq_len)]
    want = np.array(rows, dtype=np.uint32).reshape(-1, seq_len)
    assert len(want) > 10
    for chunk in (1, 4, None):
        got = collect(iter_records(paths, seq_len, "bos", bos, chunk_records=chunk), seq_len)
        np.testing.assert_array_equal(got, want)
    assert (want[:, 0] == bos).all()
    assert count_records(paths, seq_len, "bos", bos) == len(want)


def mapped_paths() -> set[str]:
    """Files this process has memory-mapped now (Linux ``/proc/self/maps``)."""
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split()) == 6}


def test_shard_metadata_and_positioned_reads(tmp_path: Path) -> None:
    toks = np.arange(1000) % 600 + 70_000
    path = write_shard(tmp_path / "a.bin", toks, itemsize=4)
    shard = BinShard(path)
    assert (shard.magic, shard.version, shard.num_tokens) == (NEW, 1, 1000)
    assert shard.dtype == np.uint32 and shard.itemsize == 4
    np.testing.assert_array_equal(shard.read_tokens(), source_tokens(path))
    np.testing.assert_array_equal(shard.read_tokens(10, 25), source_tokens(path)[10:25])
    assert shard.read_tokens(990, 2000).size == 10 and shard.read_tokens(5, 5).size == 0
    legacy = BinShard(write_shard(tmp_path / "b.bin", toks % 9, magic=LEGACY, header3=4))
    assert legacy.dtype == np.uint16  # the legacy header[3] is unused, whatever it holds
    assert "num_tokens=1000" in repr(legacy)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
@pytest.mark.parametrize("align", ["contiguous", "bos"])
def test_shards_are_never_memory_mapped(tmp_path: Path, align: Align) -> None:
    """Reads are positioned reads: a shard truncated meanwhile cannot raise SIGBUS."""
    toks = documents(np.random.default_rng(1), 200, BOS16, 60_000)
    path = write_shard(tmp_path / "m.bin", toks)
    write_bos_index(path, toks, BOS16)
    src = NanoGPTSource(path, 16, align, BOS16 if align == "bos" else None, chunk_records=4)
    assert src.num_records > 0
    for _ in src.iter_blocks():
        assert not {str(path), str(path.with_suffix(".bos.idx"))} & mapped_paths()


@pytest.mark.parametrize("index", [False, True])
def test_small_reads_give_the_same_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: bool
) -> None:
    """Tiny read windows and index pieces: records spanning windows, many reads per block."""
    rng = np.random.default_rng(8)
    toks = documents(rng, 300, BOS16, 60_000)
    path = write_shard(tmp_path / "w.bin", toks)
    if index:
        write_bos_index(path, toks, BOS16)
    aligns: tuple[Align, ...] = ("contiguous", "bos")
    want = {align: collect(iter_records(path, 24, align, BOS16), 24) for align in aligns}
    monkeypatch.setattr(nanogpt, "SCAN_CHUNK_BYTES", 50)  # 25 tokens: about one record
    monkeypatch.setattr(nanogpt, "PIECE_BYTES", 6)
    source = source_tokens(path)
    for align, rows in want.items():
        got = collect(iter_records(path, 24, align, BOS16, chunk_records=5), 24)
        np.testing.assert_array_equal(got, rows)
        starts = BinShard(path).record_starts(24, align, BOS16)
        for row, s in zip(got, starts, strict=True):
            np.testing.assert_array_equal(row, source[s : s + 24])
    assert BinShard(path).bos_positions(BOS16).tolist() == np.flatnonzero(source == BOS16).tolist()


def test_blocks_respect_chunk_records_and_never_mix_shards(tmp_path: Path) -> None:
    paths = [write_shard(tmp_path / f"{i}.bin", np.arange(n) % 500) for i, n in enumerate((95, 48))]
    sizes = [b.shape[0] for b in iter_records(paths, 10, chunk_records=4)]
    assert sizes == [4, 4, 1, 4]  # 9 records in the first shard, 4 in the second
    sizes = [b.shape[0] for b in iter_records(paths, 10)]
    assert sizes == [9, 4]


def test_record_source_protocol_and_cached_bos_starts(tmp_path: Path) -> None:
    paths = make_variant_shards(tmp_path, NEW, 2, BOS16, False, (30, 30))
    src = NanoGPTSource(str(tmp_path / "shard_*.bin"), 20, "bos", BOS16, chunk_records=3)
    assert isinstance(src, RecordSource)
    assert src.shards == [str(p) for p in paths]
    direct = collect(iter_records(paths, 20, "bos", BOS16), 20)
    assert src.num_records == len(direct)
    np.testing.assert_array_equal(collect(src.iter_blocks(), 20), direct)
    flat = NanoGPTSource(paths, 20)
    assert flat.num_records == count_records(paths, 20)
    assert sum(b.shape[0] for b in flat.iter_blocks()) == flat.num_records


def test_empty_and_short_shards_give_no_records(tmp_path: Path) -> None:
    empty = write_shard(tmp_path / "e.bin", np.zeros(0, dtype=np.uint16))
    short = write_shard(tmp_path / "s.bin", [BOS16, 1, 2])
    assert BinShard(empty).num_tokens == 0
    aligns: tuple[Align, ...] = ("contiguous", "bos")
    for align in aligns:
        assert count_records([empty, short], 4, align, BOS16) == 0
        assert list(iter_records([empty, short], 4, align, BOS16)) == []


def test_bos_scan_and_iteration_use_bounded_memory(tmp_path: Path) -> None:
    n = 8 * 2**20  # 16 MiB of uint16 tokens
    toks = np.arange(n, dtype=np.int64) % 1000
    toks[:: 2**16] = 5000  # a BOS every 65536 tokens
    path = write_shard(tmp_path / "big.bin", toks)
    del toks
    shard = BinShard(path)
    tracemalloc.start()
    try:
        assert shard.bos_positions(5000).size == n // 2**16
        _, scan_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        total = sum(b.shape[0] for b in shard.iter_blocks(1024, "contiguous"))
        _, iter_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == n // 1024
    assert scan_peak < 8 * 2**20  # the whole shard would be 16 MiB, plus 8 MiB of booleans
    assert iter_peak < 12 * 2**20  # one ~4 MiB uint32 block (and its uint16 slice) at a time


# --- bad inputs: each error names the file and the field or position --------------------


def error_for(path: Path, bos_token: int | None = None) -> str:
    """The ``IngestError`` message for opening ``path`` (and finding BOS positions)."""
    with pytest.raises(IngestError) as info:
        shard = BinShard(path)
        if bos_token is not None:
            shard.bos_positions(bos_token)
    message = str(info.value)
    assert str(path) in message
    return message


def test_truncated_shard(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "t.bin", np.arange(100))
    os.truncate(path, 1024 + 150)
    msg = error_for(path)
    assert "num_tokens (header[2])" in msg and "1224 bytes" in msg and "got 1174 bytes" in msg
    assert "truncated" in msg
    os.truncate(path, 100)
    msg = error_for(path)
    assert "field header" in msg and "1024 bytes" in msg and "100-byte" in msg


def test_wrong_magic(tmp_path: Path) -> None:
    msg = error_for(write_shard(tmp_path / "m.bin", [1, 2], magic=12345))
    assert "magic (header[0])" in msg and f"{LEGACY} or {NEW}" in msg and "got 12345" in msg


def test_wrong_version(tmp_path: Path) -> None:
    msg = error_for(write_shard(tmp_path / "v.bin", [1, 2], version=2))
    assert "version (header[1])" in msg and "expected 1, got 2" in msg


def test_token_count_does_not_match_the_size(tmp_path: Path) -> None:
    msg = error_for(write_shard(tmp_path / "c.bin", np.arange(10), num_tokens=8))
    assert "num_tokens (header[2])" in msg and "1024 + 8 * 2 = 1040" in msg
    assert "got 1044 bytes (trailing bytes)" in msg
    msg = error_for(write_shard(tmp_path / "n.bin", [], num_tokens=-3))
    assert "num_tokens (header[2])" in msg and "got -3" in msg


def test_bad_itemsize(tmp_path: Path) -> None:
    msg = error_for(write_shard(tmp_path / "i.bin", np.arange(6), itemsize=3))
    assert "itemsize (header[3])" in msg and "got 3" in msg


def test_bos_index_entry_that_is_not_a_bos_token(tmp_path: Path) -> None:
    toks = np.array([BOS16, 1, 2, BOS16, 3, 4, 5, BOS16, 6])
    path = write_shard(tmp_path / "x.bin", toks)
    index = write_bos_index(path, toks, BOS16)
    np.array([0, 3, 5], dtype=np.int32).tofile(index)  # position 5 holds token 4
    msg = error_for(path, bos_token=BOS16)
    assert str(index) in msg and "entry 2" in msg and "token position 5" in msg
    assert "holds token 4" in msg
    # use_bos_index=False ignores the index and scans.
    scanned = BinShard(path, use_bos_index=False).bos_positions(BOS16)
    assert scanned.tolist() == [0, 3, 7]


def test_bos_index_in_byte_offsets_is_rejected(tmp_path: Path) -> None:
    """An index as the upstream BinaryDataWriter writes it: tell() + token index per write."""
    toks = np.array([BOS16, 1, 2, BOS16, 3] * 300)
    path = write_shard(tmp_path / "b.bin", toks)
    index = path.with_suffix(".bos.idx")
    (1024 + np.flatnonzero(toks == BOS16)).astype(np.int32).tofile(index)
    msg = error_for(path, bos_token=BOS16)
    assert str(index) in msg and "entry 0: token position 1024" in msg
    assert "token positions counted from the first token" in msg


def test_bos_index_out_of_range_unsorted_or_ragged(tmp_path: Path) -> None:
    toks = np.array([BOS16, 1, BOS16, 2])
    path = write_shard(tmp_path / "o.bin", toks)
    index = path.with_suffix(".bos.idx")
    np.array([0, 4], dtype=np.int32).tofile(index)
    assert "entry 1: position 4 is outside the shard's tokens [0, 4)" in error_for(
        path, bos_token=BOS16
    )
    np.array([2, 0], dtype=np.int32).tofile(index)
    assert "entry 1: position 0 does not follow position 2" in error_for(path, bos_token=BOS16)
    index.write_bytes(b"\0" * 6)
    assert "multiple of 4" in error_for(path, bos_token=BOS16)


def test_bos_index_entries_must_strictly_increase(tmp_path: Path) -> None:
    """Duplicated or decreasing entries, each a BOS position in range: the order is the fault."""
    toks = np.array([BOS16, 1, BOS16, BOS16, 4, BOS16, 6])
    path = write_shard(tmp_path / "d.bin", toks)
    index = path.with_suffix(".bos.idx")
    for entries, bad, message in [
        ([0, 0, 2], 1, "position 0 does not follow position 0"),
        ([5, 3], 1, "position 3 does not follow position 5"),
        ([0, 2, 3, 3, 5], 3, "position 3 does not follow position 3"),
    ]:
        np.array(entries, dtype=np.int32).tofile(index)
        msg = error_for(path, bos_token=BOS16)
        assert f"{index} (BOS index of {path}): entry {bad}: {message}" in msg
        assert "strictly increasing" in msg
    np.array([0, 2, 3, 5], dtype=np.int32).tofile(index)
    assert BinShard(path).bos_positions(BOS16).tolist() == [0, 2, 3, 5]


def test_argument_errors(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "a.bin", np.arange(50))
    with pytest.raises(IngestError, match="needs bos_token"):
        count_records(path, 8, "bos")
    with pytest.raises(IngestError, match="align must be"):
        iter_records(path, 8, "docs")  # type: ignore[arg-type]
    with pytest.raises(IngestError, match="seq_len"):
        iter_records(path, 0)
    with pytest.raises(IngestError, match="chunk_records"):
        iter_records(path, 8, chunk_records=0)
    with pytest.raises(IngestError, match="cannot occur in a shard of uint16"):
        count_records(path, 8, "bos", 70_000)


def test_expand_shards(tmp_path: Path) -> None:
    for name in ("c_002.bin", "c_000.bin", "c_001.bin"):
        write_shard(tmp_path / name, [1, 2, 3])
    pattern = str(tmp_path / "c_*.bin")
    assert [Path(p).name for p in expand_shards(pattern)] == ["c_000.bin", "c_001.bin", "c_002.bin"]
    explicit = [tmp_path / "c_002.bin", tmp_path / "c_000.bin"]
    assert expand_shards(explicit) == [str(p) for p in explicit]  # a list keeps its order
    with pytest.raises(IngestError, match=r"nomatch_\*\.bin: no shard file matches"):
        expand_shards(str(tmp_path / "nomatch_*.bin"))
    with pytest.raises(IngestError, match=r"missing\.bin: shard file does not exist"):
        expand_shards(tmp_path / "missing.bin")
    with pytest.raises(IngestError, match="listed twice"):
        count_records([pattern, tmp_path / "c_001.bin"], 2)


# --- end to end: shards -> write_batch_dataset -> BatchFileReader --------------------------


@pytest.mark.parametrize("align", ["contiguous", "bos"])
def test_end_to_end_through_the_streaming_writer(tmp_path: Path, align: Align) -> None:
    rng = np.random.default_rng(11)
    paths, bos, seq_len, batch_size, seed = [], 7, 33, 5, 1234
    for i, (magic, itemsize) in enumerate([(LEGACY, 2), (NEW, 2), (NEW, 4)]):
        toks = documents(rng, 40, bos, 60_000)
        path = write_shard(tmp_path / f"s{i}.bin", toks, magic=magic, itemsize=itemsize)
        if i == 1:
            write_bos_index(path, toks, bos)
        paths.append(path)
    bos_arg = bos if align == "bos" else None
    records = collect(iter_records(paths, seq_len, align, bos_arg), seq_len)
    count = count_records(paths, seq_len, align, bos_arg)
    assert count == len(records) and count > 2 * batch_size

    out = tmp_path / "out.batch"
    blocks: Iterator[npt.NDArray[np.uint32]] = iter_records(
        paths, seq_len, align, bos_arg, chunk_records=7
    )
    num_batches = write_batch_dataset(
        out, blocks, total_records=count, batch_size=batch_size, seq_len=seq_len, seed=seed
    )
    assert num_batches == count // batch_size
    with BatchFileReader(out) as reader:
        assert reader.total_records == count
        rows = np.array(reader.read_batches(0, len(reader))).reshape(-1, seq_len)
        np.testing.assert_array_equal(
            rows.reshape(num_batches, batch_size, seq_len),
            expected_batches(records, batch_size, seed),
        )
    # As a multiset: the file holds the records except the permuted-away remainder.
    kept = [record_source(p, count, seed) for p in range(num_batches * batch_size)]
    assert len(set(kept)) == len(kept) and count - len(kept) == count % batch_size

    def lex(a: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        return a[np.lexsort(a.T[::-1])]

    np.testing.assert_array_equal(lex(rows), lex(records[kept]))


# --- property: BOS-aligned records for random shards ---------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    doc_lengths=st.lists(st.integers(1, 40), min_size=0, max_size=25),
    prefix=st.integers(0, 12),
    seq_len=st.integers(1, 50),
    itemsize=st.sampled_from([2, 4]),
    legacy=st.booleans(),
    index=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_bos_records_start_with_bos_and_are_source_windows(
    doc_lengths: list[int],
    prefix: int,
    seq_len: int,
    itemsize: int,
    legacy: bool,
    index: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    bos = 3
    parts = [rng.integers(4, 1000, size=prefix)]
    for length in doc_lengths:
        doc = rng.integers(0, 1000, size=length)  # may hold extra BOS tokens inside
        doc[0] = bos
        parts.append(doc)
    toks = np.concatenate(parts).astype(np.int64)
    magic = LEGACY if legacy else NEW
    width = 2 if legacy else itemsize
    with tempfile.TemporaryDirectory() as tmp:
        path = write_shard(Path(tmp) / "p.bin", toks, magic=magic, itemsize=width)
        if index:
            write_bos_index(path, toks, bos)
        source = source_tokens(path)
        got = collect(iter_records(path, seq_len, "bos", bos, chunk_records=3), seq_len)
        starts = BinShard(path).record_starts(seq_len, "bos", bos)
        assert count_records(path, seq_len, "bos", bos) == len(got) == len(starts)
    assert starts.tolist() == reference_bos_starts(source, bos, seq_len)
    assert (got[:, 0] == bos).all() if len(got) else True
    for row, s in zip(got, starts, strict=True):
        np.testing.assert_array_equal(row, source[s : s + seq_len])
    assert (np.diff(starts) >= seq_len).all()
