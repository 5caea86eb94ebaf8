"""Megatron-LM indexed datasets: what Megatron writes reads back, records cut right, bad files
refused with an ``IngestError`` naming the file and the rule.

Corpora are written by Megatron's own ``IndexedDatasetBuilder`` (skipped where megatron-core is
not installed) and by the fuzz module's minimal writer (``tests/fuzz/fuzz_megatron.py``), which
is checked here to write the same bytes; every token and document start is checked against the
lists the corpus was built from, and every record against a plain NumPy cut of them.
"""

from __future__ import annotations

import os
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.fuzz.fuzz_megatron import reference_records, write_dataset
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest import megatron, token_files
from zerobatch_core.ingest.megatron import (
    MegatronFile,
    expand_megatron,
    is_megatron,
    megatron_prefix,
)
from zerobatch_core.ingest.token_files import Layout, TokenFile, TokenFileSource

Docs = list[list[list[int]]]
"""Documents, each a list of sequences (``add_item`` calls), each a list of token ids."""

CODES: dict[type, int] = {
    np.uint8: 1,
    np.int8: 2,
    np.int16: 3,
    np.int32: 4,
    np.int64: 5,
    np.uint16: 8,
}


@pytest.fixture(scope="module")
def indexed() -> ModuleType:
    """Megatron's ``indexed_dataset`` module (the tests that use it skip without it)."""
    module: ModuleType = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    return module


def corpus(seed: int, high: int) -> Docs:
    """Documents of varied lengths: an empty sequence, an empty document, documents of one and
    of several sequences, one long document."""
    rng = np.random.default_rng(seed)

    def seq(n: int) -> list[int]:
        return [int(t) for t in rng.integers(0, high, n)]

    docs: Docs = [[seq(5)], [seq(3), [], seq(4)], [], [seq(1)], [seq(200)], [[]]]
    docs += [[seq(int(n)) for n in rng.integers(0, 30, int(k))] for k in rng.integers(1, 5, 12)]
    return docs


def flatten(docs: Docs) -> tuple[npt.NDArray[np.int64], list[int]]:
    """The token stream and each document's start position."""
    tokens: list[int] = []
    starts = []
    for doc in docs:
        starts.append(len(tokens))
        for s in doc:
            tokens.extend(s)
    return np.array(tokens, dtype=np.int64), starts


def build(indexed: ModuleType, prefix: Path, docs: Docs, dtype: type[np.integer[Any]]) -> Path:
    """``prefix.bin`` / ``prefix.idx`` written by Megatron's builder: ``add_item`` per sequence
    and ``end_document`` per document, except the first, given whole to ``add_document``."""
    import torch

    builder = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    first = docs[0]
    builder.add_document([t for s in first for t in s], [len(s) for s in first])
    for doc in docs[1:]:
        for s in doc:
            builder.add_item(torch.tensor(s, dtype=torch.int64))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return prefix


def write_own(prefix: Path, docs: Docs, code: int = 8, modes: list[int] | None = None) -> Path:
    """The same dataset by the fuzz module's writer (no torch needed)."""
    sequences = [s for doc in docs for s in doc]
    index = [0]
    for doc in docs:
        index.append(index[-1] + len(doc))
    idx, data = write_dataset(sequences, index, code, modes)
    Path(f"{prefix}.idx").write_bytes(idx)
    Path(f"{prefix}.bin").write_bytes(data)
    return prefix


def check_reads(f: MegatronFile, docs: Docs) -> None:
    tokens, starts = flatten(docs)
    assert f.num_tokens == tokens.size
    assert f.document_count == len(docs)
    assert f.sequence_count == sum(len(d) for d in docs)
    assert np.array_equal(f.read_tokens(0, f.num_tokens).astype(np.int64), tokens)
    rng = np.random.default_rng(1)
    for _ in range(50):
        a, b = sorted(rng.integers(0, tokens.size + 1, 2).tolist())
        got = f.read_tokens(a, b)
        assert got.dtype == f.dtype and np.array_equal(got.astype(np.int64), tokens[a:b])
    got_starts = f.document_starts()
    assert got_starts.dtype == np.int64 and got_starts.tolist() == starts


# --- what Megatron writes --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8, np.int16])
def test_reads_what_megatron_wrote(indexed: ModuleType, tmp_path: Path, dtype: type) -> None:
    high = min(int(np.iinfo(dtype).max), 2**31 - 1)
    docs = corpus(3, high)
    prefix = build(indexed, tmp_path / "corpus_text_document", docs, dtype)
    for path in (prefix, f"{prefix}.idx", f"{prefix}.bin"):
        f = MegatronFile(path)
        assert isinstance(f, TokenFile)
        assert f.path == f"{prefix}.bin" and f.idx_path == f"{prefix}.idx"
        assert f.side_files() == [f"{prefix}.idx"]
        assert f.dtype == np.dtype(dtype).newbyteorder("<") and f.dtype_code == CODES[dtype]
        assert not f.multimodal
        check_reads(f, docs)


def test_agrees_with_megatrons_own_reader(indexed: ModuleType, tmp_path: Path) -> None:
    """``IndexedDataset`` (mmap'ed) gives the same sequences and document index."""
    docs = corpus(5, 50_000)
    prefix = build(indexed, tmp_path / "c", docs, np.uint16)
    theirs = indexed.IndexedDataset(str(prefix))
    f = MegatronFile(prefix)
    ours = f.read_tokens(0, f.num_tokens)
    parts = [np.asarray(theirs[i]) for i in range(len(theirs))]
    assert np.array_equal(np.concatenate(parts), ours)
    lengths = np.concatenate([[0], np.cumsum([p.size for p in parts])])
    assert f.document_starts().tolist() == lengths[theirs.document_indices[:-1]].tolist()


def test_own_writer_writes_megatrons_bytes(indexed: ModuleType, tmp_path: Path) -> None:
    for dtype, code in ((np.uint16, 8), (np.int32, 4), (np.uint8, 1)):
        docs = corpus(7, int(np.iinfo(dtype).max))
        build(indexed, tmp_path / "m", docs, dtype)
        write_own(tmp_path / "o", docs, code)
        for suffix in (".idx", ".bin"):
            assert (tmp_path / f"m{suffix}").read_bytes() == (tmp_path / f"o{suffix}").read_bytes()


def test_datasets_concatenated_by_add_index(indexed: ModuleType, tmp_path: Path) -> None:
    """``add_index`` (Megatron's merge) extends the pointers and the document index."""
    import torch

    a, b = corpus(11, 1000), corpus(12, 1000)
    build(indexed, tmp_path / "a", a, np.int32)
    build(indexed, tmp_path / "b", b, np.int32)
    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "ab.bin"), dtype=np.int32)
    builder.add_index(str(tmp_path / "a"))
    builder.add_index(str(tmp_path / "b"))
    builder.add_item(torch.tensor([7, 8, 9]))
    builder.end_document()
    builder.finalize(str(tmp_path / "ab.idx"))
    check_reads(MegatronFile(tmp_path / "ab"), [*a, *b, [[7, 8, 9]]])


def test_multimodal_index_with_text_modes(indexed: ModuleType, tmp_path: Path) -> None:
    """Sequence modes after the document index: all text (0) reads; another mode is refused."""
    import torch

    for mode, ok in ((0, True), (1, False)):
        builder = indexed.IndexedDatasetBuilder(
            str(tmp_path / f"mm{mode}.bin"), dtype=np.int32, multimodal=True
        )
        builder.add_item(torch.tensor([1, 2, 3]))
        builder.add_item(torch.tensor([4, 5]), mode)
        builder.end_document()
        builder.finalize(str(tmp_path / f"mm{mode}.idx"))
        if ok:
            f = MegatronFile(tmp_path / "mm0")
            assert f.multimodal
            check_reads(f, [[[1, 2, 3], [4, 5]]])
        else:
            with pytest.raises(IngestError, match=r"mm1\.idx: field sequence_modes\[1\]: .*got 1"):
                MegatronFile(tmp_path / "mm1")


# --- records ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "documents"])
@pytest.mark.parametrize(("seq_len", "chunk"), [(1, None), (3, 1), (7, 2), (64, None)])
def test_records_are_a_plain_cut_of_each_file(
    tmp_path: Path, layout: Layout, seq_len: int, chunk: int | None
) -> None:
    """Two datasets (uint16 and int32) through ``TokenFileSource``: each file's records are
    its own cut (consecutive windows, or the document rule of ``token_files.py``)."""
    docs_a, docs_b = corpus(21, 60_000), corpus(22, 2**31 - 1)
    files = [
        MegatronFile(write_own(tmp_path / "a", docs_a, 8)),
        MegatronFile(write_own(tmp_path / "b", docs_b, 4)),
    ]
    expected = []
    for docs in (docs_a, docs_b):
        tokens, starts = flatten(docs)
        expected.append(reference_records(tokens, starts, seq_len, layout))
    src = TokenFileSource(files, seq_len, layout, chunk)
    assert src.record_counts() == [e.shape[0] for e in expected]
    blocks = list(src.iter_blocks())
    got = np.concatenate(blocks) if blocks else np.zeros((0, seq_len), np.uint32)
    assert got.dtype == np.uint32
    assert np.array_equal(got.astype(np.int64), np.concatenate(expected))
    assert src.source_tokens == sum(f.num_tokens for f in files)
    dropped = sum(d.tokens for d in src.drops())
    assert dropped == src.source_tokens - got.shape[0] * seq_len


def test_small_windows_cut_the_same_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = corpus(23, 60_000)
    f = MegatronFile(write_own(tmp_path / "a", docs))
    tokens, starts = flatten(docs)
    monkeypatch.setattr(token_files, "WINDOW_BYTES", 10)
    for layout in token_files.LAYOUTS:
        blocks = list(TokenFileSource([f], 5, layout, 3).iter_blocks())
        want = reference_records(tokens, starts, 5, layout)
        assert np.array_equal(np.concatenate(blocks).astype(np.int64), want)


def test_tokens_outside_uint32_are_refused_when_cutting(tmp_path: Path) -> None:
    """Signed dtypes may hold negative ids, int64 ids past 2**32 - 1: the record cut names it."""
    write_own(tmp_path / "neg", [[[1, 2, -5, 3]]], code=2)
    write_own(tmp_path / "big", [[[1, 2, 3]], [[2**32, 4]]], code=5)
    for name, at, value in (("neg", 2, -5), ("big", 3, 2**32)):
        f = MegatronFile(tmp_path / name)
        with pytest.raises(IngestError, match=rf"{name}\.bin: token {at} is {value}, outside"):
            list(TokenFileSource([f], 1).iter_blocks())


# --- bounded work ----------------------------------------------------------------------------


@pytest.mark.parametrize(("chunk", "gather"), [(1, 1), (2, 1), (3, 2), (5, 3)])
def test_chunk_sizes_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, gather: int
) -> None:
    docs = corpus(31, 60_000)
    prefix = write_own(tmp_path / "a", docs)
    monkeypatch.setattr(megatron, "INDEX_CHUNK_ENTRIES", chunk)
    monkeypatch.setattr(megatron, "GATHER_ENTRIES", gather)
    check_reads(MegatronFile(prefix), docs)
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    struct.pack_into("<q", idx, pointer_at(idx, 5), 12345)
    Path(f"{prefix}.idx").write_bytes(idx)
    with pytest.raises(IngestError, match=r"field sequence_pointers\[5\]: expected \d+ "):
        MegatronFile(prefix)


def test_memory_is_bounded_by_the_chunk_not_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200,000 sequences (a 4 MB index): opening holds one chunk of entries at a time, and
    ``document_starts`` its result (8 bytes a document) and one window of pointers."""
    n = 200_000
    sequences = [[i % 60_000] for i in range(n)]
    documents = [*range(0, n, 4), n]
    idx, data = write_dataset(sequences, documents, 8)
    (tmp_path / "big.idx").write_bytes(idx)
    (tmp_path / "big.bin").write_bytes(data)
    monkeypatch.setattr(megatron, "INDEX_CHUNK_ENTRIES", 2**10)
    monkeypatch.setattr(megatron, "GATHER_ENTRIES", 2**10)
    tracemalloc.start()
    try:
        f = MegatronFile(tmp_path / "big")
        _, open_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        starts = f.document_starts()
        _, starts_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f.num_tokens == n and starts.tolist() == documents[:-1]
    assert open_peak < 2**18  # the index is 4 MB; a chunk of 1,024 entries is 12 KiB
    assert starts_peak < starts.nbytes + 2**18


def test_huge_counts_are_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    write_own(tmp_path / "a", corpus(41, 1000))
    idx = bytearray((tmp_path / "a.idx").read_bytes())
    for s, n in ((2**64 - 1, 2), (2**40, 1), (3, 2**63), (2**61, 2**61)):
        struct.pack_into("<QQ", idx, 18, s, n)
        (tmp_path / "a.idx").write_bytes(idx)
        tracemalloc.start()
        try:
            with pytest.raises(IngestError, match=rf"a\.idx: field size: sequence_count {s} "):
                MegatronFile(tmp_path / "a")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 2**16


# --- bad inputs ------------------------------------------------------------------------------

DOCS: Docs = [[[5, 1, 2], [3, 4]], [], [[9, 9, 9, 9], [], [6]], [[7, 8]]]
"""The corrupted corpus: 6 sequences (lengths 3, 2, 4, 0, 1, 2), 4 documents, uint16."""
S = 6


def pointer_at(idx: bytes | bytearray, i: int) -> int:
    s: int = struct.unpack_from("<Q", idx, 18)[0]
    return 34 + 4 * s + 8 * i


def length_at(i: int) -> int:
    return 34 + 4 * i


def document_at(i: int) -> int:
    return 34 + 12 * S + 8 * i


def set_lengths(idx: bytearray, lengths: list[int], item: int = 2) -> None:
    """Lengths replaced and the pointers made consistent with them (so only they are odd)."""
    pointers = np.concatenate([[0], np.cumsum(np.array(lengths) * item)[:-1]])
    idx[34 : 34 + 4 * S] = np.array(lengths, "<i4").tobytes()
    idx[34 + 4 * S : 34 + 12 * S] = pointers.astype("<i8").tobytes()


Corrupt = Callable[[bytearray, bytearray], None]


def _pack(fmt: str, at: int, value: int) -> Corrupt:
    def go(idx: bytearray, data: bytearray) -> None:
        struct.pack_into(fmt, idx, at, value)

    return go


def _cut_idx(n: int) -> Corrupt:
    def go(idx: bytearray, data: bytearray) -> None:
        del idx[n:]

    return go


def _lengths(lengths: list[int]) -> Corrupt:
    return lambda idx, data: set_lengths(idx, lengths)


def _magic(magic: bytes) -> Corrupt:
    def go(idx: bytearray, data: bytearray) -> None:
        idx[: len(magic)] = magic

    return go


def _cut_bin(n: int) -> Corrupt:
    def go(idx: bytearray, data: bytearray) -> None:
        del data[n:]

    return go


def _append(where: str, n: int) -> Corrupt:
    def go(idx: bytearray, data: bytearray) -> None:
        (idx if where == "idx" else data).extend(b"\x01" * n)

    return go


def _documents(values: list[int]) -> Corrupt:
    def go(idx: bytearray, data: bytearray) -> None:
        idx[document_at(0) : document_at(len(values))] = np.array(values, "<i8").tobytes()

    return go


def _counts(s: int, n: int) -> Corrupt:
    def go(idx: bytearray, data: bytearray) -> None:
        struct.pack_into("<QQ", idx, 18, s, n)
        del idx[34 + 12 * s + 8 * n :]

    return go


CORRUPT = [
    pytest.param(_cut_idx(0), "idx", r"field header: .*got a 0-byte file", id="empty-idx"),
    pytest.param(_cut_idx(20), "idx", r"field header: .*truncated index", id="idx-cut-in-header"),
    pytest.param(_cut_idx(33), "idx", r"field header: expected at least 34 bytes", id="idx-33"),
    pytest.param(_cut_idx(60), "idx", r"field size: .*got 60 \(truncated index", id="idx-cut"),
    pytest.param(_cut_idx(-1), "idx", r"field size: .*truncated index", id="idx-last-byte"),
    pytest.param(_append("idx", 3), "idx", r"field size: .*trailing bytes", id="idx-trailing"),
    pytest.param(_magic(b"MMIDIDX\x00\x01"), "idx", r"field magic \(bytes 0-8\)", id="magic"),
    pytest.param(_magic(b"TNTIDX\x00\x00"), "idx", r"legacy non-mmap", id="legacy-magic"),
    pytest.param(_pack("<Q", 9, 2), "idx", r"field version .*expected 1, got 2", id="version-2"),
    pytest.param(_pack("<Q", 9, 2**64 - 1), "idx", r"field version .*got 18446", id="version-max"),
    pytest.param(_pack("<B", 17, 0), "idx", r"field dtype code .*got 0$", id="code-0"),
    pytest.param(_pack("<B", 17, 9), "idx", r"field dtype code .*8 \(uint16\), got 9", id="code-9"),
    pytest.param(_pack("<B", 17, 255), "idx", r"field dtype code .*got 255", id="code-255"),
    pytest.param(_pack("<B", 17, 6), "idx", r"code 6 is float64; .*not a token", id="float64"),
    pytest.param(_pack("<B", 17, 7), "idx", r"code 7 is float32; .*not a token", id="float32"),
    pytest.param(_counts(0, 0), "idx", r"field document_count .*at least 1", id="no-doc-entries"),
    pytest.param(_pack("<Q", 18, 7), "idx", r"field size: sequence_count 7 ", id="count+1"),
    pytest.param(
        _lengths([3, 2, -4, 0, 1, 2]), "idx", r"sequence_lengths\[2\]: .*got -4", id="neg"
    ),
    pytest.param(
        _pack("<q", 34 + 4 * S, 2),
        "idx",
        r"field sequence_pointers\[0\]: expected 0 \(the first sequence starts at byte 0",
        id="first-pointer",
    ),
    pytest.param(
        _pack("<q", 34 + 4 * S + 8 * 3, 16),
        "idx",
        r"sequence_pointers\[3\]: expected 18 \(where sequence 2 ends.*got 16",
        id="pointer-overlap",
    ),
    pytest.param(
        _pack("<q", 34 + 4 * S + 8 * 5, 2**62),
        "idx",
        r"sequence_pointers\[5\]: expected 20 .*got 4611686018427387904",
        id="pointer-far-past-bin",
    ),
    pytest.param(
        _lengths([3, 2, 4, 0, 1, 200]),
        "bin",
        r"field size: sequence 5 of .*\.idx ends at byte 420, past the end of the 24-byte",
        id="sequence-past-bin",
    ),
    pytest.param(_cut_bin(13), "bin", r"sequence 2 of .* ends at byte 18, past the end", id="cut"),
    pytest.param(_cut_bin(0), "bin", r"sequence 0 of .* past the end of the 0-byte", id="empty"),
    pytest.param(_append("bin", 2), "bin", r"field size: expected 24 bytes .*2 trailing", id="t"),
    pytest.param(_documents([1]), "idx", r"document_index\[0\]: expected 0 .*got 1", id="doc0"),
    pytest.param(
        _documents([0, 3, 2]), "idx", r"document_index\[2\]: expected >= .* = 3 .*got 2", id="desc"
    ),
    pytest.param(
        _documents([0, -1]), "idx", r"document_index\[1\]: expected >= .* = 0 .*got -1", id="neg-d"
    ),
    pytest.param(
        _documents([0, 2, 7]), "idx", r"document_index\[2\]: expected at most .* 6, got 7", id="7"
    ),
    pytest.param(
        _documents([0, 2, 2, 5, 5]),
        "idx",
        r"document_index\[4\]: expected sequence_count 6 .*got 5 \(sequences added after the "
        r"last end_document\(\), or .*old merge_file_",
        id="last-short",
    ),
]


@pytest.mark.parametrize(("corrupt", "where", "message"), CORRUPT)
def test_corrupt_datasets_are_refused(
    tmp_path: Path, corrupt: Corrupt, where: str, message: str
) -> None:
    prefix = write_own(tmp_path / "c", DOCS)
    assert MegatronFile(prefix).num_tokens == 12
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    data = bytearray(Path(f"{prefix}.bin").read_bytes())
    corrupt(idx, data)
    Path(f"{prefix}.idx").write_bytes(idx)
    Path(f"{prefix}.bin").write_bytes(data)
    with pytest.raises(IngestError, match=message) as e:
        MegatronFile(prefix)
    assert str(e.value).startswith(f"{prefix}.{where}: "), str(e.value)


def test_a_fairseq_index_is_named(tmp_path: Path) -> None:
    """fairseq's MMapIndexedDataset: same magic and version, no document count or index."""
    lengths = np.array([3, 2], "<i4")
    idx = struct.pack("<9sQBQ", b"MMIDIDX\x00\x00", 1, 8, 2) + lengths.tobytes()
    idx += np.array([0, 6], "<i8").tobytes()
    (tmp_path / "f.idx").write_bytes(idx)
    (tmp_path / "f.bin").write_bytes(bytes(10))
    with pytest.raises(IngestError, match=r"f\.idx: field size: .*fairseq's MMapIndexedDataset"):
        MegatronFile(tmp_path / "f")


def test_missing_or_irregular_files_are_named(tmp_path: Path) -> None:
    prefix = write_own(tmp_path / "c", DOCS)
    os.remove(f"{prefix}.bin")
    with pytest.raises(IngestError, match=r"c\.bin: data file of Megatron dataset .* not exist"):
        MegatronFile(prefix)
    os.remove(f"{prefix}.idx")
    os.mkfifo(f"{prefix}.bin")
    with pytest.raises(IngestError, match=r"c\.idx: index file of Megatron dataset .* not exist"):
        MegatronFile(f"{prefix}.bin")
    os.remove(f"{prefix}.bin")
    write_own(tmp_path / "c", DOCS)
    os.remove(f"{prefix}.bin")
    os.mkfifo(f"{prefix}.bin")  # opening a FIFO would block: refused before any open
    with pytest.raises(IngestError, match=r"c\.bin: data file .* is not a regular file"):
        MegatronFile(prefix)


def test_bin_truncated_after_opening_is_an_ingest_error(tmp_path: Path) -> None:
    """Positioned reads, never a map: a ``.bin`` cut short under the reader raises, no SIGBUS."""
    prefix = write_own(tmp_path / "c", corpus(51, 60_000))
    f = MegatronFile(prefix)
    assert f.read_tokens(0, 10).size == 10
    os.truncate(f"{prefix}.bin", 100)
    with pytest.raises(IngestError, match=r"c\.bin: truncated while reading"):
        f.read_tokens(0, f.num_tokens)
    with pytest.raises(IngestError, match=r"c\.bin: truncated while reading"):
        list(TokenFileSource([f], 8).iter_blocks())
    os.truncate(f"{prefix}.idx", 40)
    with pytest.raises(IngestError, match=r"c\.idx: truncated while reading"):
        f.document_starts()


def test_index_rewritten_after_opening_is_an_ingest_error(tmp_path: Path) -> None:
    prefix = write_own(tmp_path / "c", DOCS)
    f = MegatronFile(prefix)
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    struct.pack_into("<q", idx, document_at(2), 9)
    Path(f"{prefix}.idx").write_bytes(idx)
    with pytest.raises(IngestError, match=r"c\.idx: field document_index.*changed since"):
        f.document_starts()


def test_read_tokens_refuses_ranges_outside_the_stream(tmp_path: Path) -> None:
    f = MegatronFile(write_own(tmp_path / "c", DOCS))
    assert f.read_tokens(12, 12).size == 0
    for a, b in ((-1, 3), (3, 2), (0, 13)):
        with pytest.raises(IngestError, match=rf"c\.bin: tokens \[{a}, {b}\) are not within"):
            f.read_tokens(a, b)


def test_an_empty_dataset_reads_as_nothing(tmp_path: Path) -> None:
    f = MegatronFile(write_own(tmp_path / "e", []))
    assert (f.num_tokens, f.sequence_count, f.document_count) == (0, 0, 0)
    assert f.read_tokens(0, 0).size == 0 and f.document_starts().size == 0
    assert TokenFileSource([f], 4, "documents").num_records == 0


# --- paths -----------------------------------------------------------------------------------


def test_expand_megatron(tmp_path: Path) -> None:
    for name in ("b", "a", "c"):
        write_own(tmp_path / name, DOCS)
    (tmp_path / "shard.bin").write_bytes(bytes(1024))  # a nanoGPT shard and its BOS index
    (tmp_path / "shard.bos.idx").write_bytes(bytes(8))
    (tmp_path / "notes.txt").write_text("not a dataset")
    want = [str(tmp_path / n) for n in ("a", "b", "c")]
    assert expand_megatron(str(tmp_path / "*.idx")) == want
    assert expand_megatron(str(tmp_path / "[abc].bin")) == want
    assert expand_megatron(str(tmp_path / "[abc]")) == want  # a pattern of prefixes
    with pytest.raises(IngestError, match=r"shard\.idx: index file of Megatron dataset"):
        expand_megatron(str(tmp_path / "*"))  # the nanoGPT shard.bin has no shard.idx
    assert expand_megatron([tmp_path / "c.bin", tmp_path / "a.idx", tmp_path / "b"]) == [
        want[2],
        want[0],
        want[1],
    ]


def test_expand_megatron_errors_name_the_file(tmp_path: Path) -> None:
    write_own(tmp_path / "a", DOCS)
    write_own(tmp_path / "b", DOCS)
    os.remove(tmp_path / "b.bin")
    with pytest.raises(IngestError, match=r"b\.bin: data file of Megatron dataset .*b does not"):
        expand_megatron(str(tmp_path / "*.idx"))
    with pytest.raises(IngestError, match=r"x\.idx: index file of Megatron dataset .*x does not"):
        expand_megatron(str(tmp_path / "x"))
    with pytest.raises(IngestError, match=r"a: Megatron dataset listed twice"):
        expand_megatron([tmp_path / "a.idx", tmp_path / "a.bin"])
    with pytest.raises(IngestError, match=r"zz\*: no Megatron dataset .* matches"):
        expand_megatron(str(tmp_path / "zz*"))
    with pytest.raises(IngestError, match="no Megatron datasets given"):
        expand_megatron([])


def test_is_megatron(tmp_path: Path) -> None:
    write_own(tmp_path / "a", DOCS)
    (tmp_path / "shard.bin").write_bytes(bytes(1024))  # nanoGPT: no .idx beside it
    (tmp_path / "other.bin").write_bytes(bytes(16))
    (tmp_path / "other.idx").write_bytes(b"not megatron")
    (tmp_path / "old.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(40))
    (tmp_path / "shard.bos.idx").write_bytes(bytes(8))
    os.mkfifo(tmp_path / "fifo.idx")
    yes = ["a", "a.idx", "a.bin", "old", "old.bin", "other.idx", "*.bin", "a*"]
    no = ["shard.bin", "shard", "other.bin", "other", "shard.bos.idx", "missing", "fifo", "zz*"]
    for name in yes:
        assert is_megatron(tmp_path / name), name
    for name in no:
        assert not is_megatron(tmp_path / name), name
    assert megatron_prefix("d/x.idx") == megatron_prefix("d/x.bin") == megatron_prefix("d/x")
