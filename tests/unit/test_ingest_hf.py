"""Hugging Face datasets with a token column (``ingest/hf_datasets.py``).

Corpora are built with the real ``datasets`` library (``Dataset.from_dict``, ``cast`` to each
integer width, ``save_to_disk`` in several shards, ``to_parquet``) and, for the odd shapes
``datasets`` does not write (IPC file format, ``fixed_size_list``, nulls), with pyarrow
directly. Every token, document start and record is checked against the source lists and a
plain NumPy cut; every corrupt input must give one ``IngestError`` naming the file and what is
wrong.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerobatch_core.errors import IngestError
from zerobatch_core.ingest import hf_datasets
from zerobatch_core.ingest.hf_datasets import (
    HFTokenFile,
    dataset_files,
    expand_hf,
    is_hf_dataset,
)
from zerobatch_core.ingest.token_files import LAYOUTS, TokenFile, TokenFileSource

Rows = list[list[int]]


def make_rows(seed: int, n: int, high: int) -> Rows:
    """``n`` documents of varied lengths (a fifth of them empty) of tokens below ``high``."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice([0, 1, 2, 5, 17, 40, 130], size=n)
    return [rng.integers(0, high, size=int(k)).tolist() for k in lengths]


def flat(rows: Rows) -> npt.NDArray[np.int64]:
    return np.array([t for r in rows for t in r], dtype=np.int64)


def starts_of(rows: Rows) -> npt.NDArray[np.int64]:
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return np.cumsum(lengths) - lengths


def numpy_records(
    tokens: npt.NDArray[Any], starts: npt.NDArray[np.int64], t: int, layout: str
) -> npt.NDArray[np.uint32]:
    """The records of one file, cut by hand: ``contiguous`` windows, or one record per
    document start at or after the end of the previous record (``token_files`` docstring)."""
    n = tokens.size
    if layout == "contiguous":
        at = list(range(0, n - t + 1, t))
    else:
        at, pos = [], 0
        for s in (int(x) for x in starts if x < n):
            if s < pos:
                continue
            if s + t > n:
                break
            at.append(s)
            pos = s + t
    out = np.array([tokens[a : a + t] for a in at], dtype=np.int64).reshape(len(at), t)
    return out.astype(np.uint32)


def source_records(files: list[HFTokenFile], t: int, layout: str) -> npt.NDArray[np.uint32]:
    src = TokenFileSource(files, t, layout, chunk_records=3)  # type: ignore[arg-type]
    blocks = list(src.iter_blocks())
    assert src.num_records == sum(b.shape[0] for b in blocks)
    return np.concatenate(blocks) if blocks else np.empty((0, t), np.uint32)


def check_file(f: TokenFile, rows: Rows, rng: np.random.Generator) -> None:
    """``f`` holds exactly ``rows``: whole, in random ascending ranges, and its starts."""
    want = flat(rows)
    assert f.num_tokens == want.size
    whole = f.read_tokens(0, f.num_tokens)
    assert whole.dtype == f.dtype and np.array_equal(whole.astype(np.int64), want)
    assert np.array_equal(f.document_starts(), starts_of(rows))
    for _ in range(3):
        cuts = np.sort(rng.integers(0, want.size + 1, size=12))
        for a, b in itertools.pairwise(cuts):
            got = f.read_tokens(int(a), int(b))
            assert got.dtype == f.dtype and np.array_equal(got.astype(np.int64), want[a:b])


def write_stream(path: Path, table: pa.Table, rows_per_batch: int = 3, **options: Any) -> Path:
    with pa.OSFile(str(path), "wb") as sink:
        opts = pa.ipc.IpcWriteOptions(**options)
        with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
            for batch in table.to_batches(max_chunksize=rows_per_batch):
                w.write_batch(batch)
    return path


def write_ipc_file(path: Path, table: pa.Table, rows_per_batch: int = 3) -> Path:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            w.write_batch(batch)
    return path


def token_table(rows: Rows, type_: pa.DataType, column: str = "input_ids") -> pa.Table:
    return pa.table({column: pa.array(rows, type=type_)})


# --- datasets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def datasets_lib() -> Iterator[Any]:
    ds = pytest.importorskip("datasets")
    ds.disable_progress_bars()
    yield ds


def hf_dataset(ds: Any, rows: Rows, dtype: str, column: str = "input_ids", **more: Any) -> Any:
    """A ``datasets.Dataset`` of ``rows`` in ``column``, cast to ``dtype``, beside ``more``."""
    table = ds.Dataset.from_dict({**more, column: rows})
    return table.cast_column(column, ds.Sequence(ds.Value(dtype)))


DTYPES = ("int16", "int32", "int64", "uint16", "uint8", "uint32", "uint64", "int8")


@pytest.mark.parametrize("dtype", DTYPES)
def test_save_to_disk_shards_read_as_their_source_lists(
    datasets_lib: Any, tmp_path: Path, dtype: str
) -> None:
    high = 100 if dtype.endswith("int8") else 30_000
    rows = make_rows(DTYPES.index(dtype), 90, high)
    hf_dataset(datasets_lib, rows, dtype).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    assert is_hf_dataset(tmp_path / "ds")
    files = expand_hf(tmp_path / "ds")
    state = json.loads((tmp_path / "ds" / "state.json").read_text())
    names = [e["filename"] for e in state["_data_files"]]
    assert [f.path for f in files] == [str(tmp_path / "ds" / n) for n in names]
    assert len(files) == 3
    rng = np.random.default_rng(7)
    first = 0
    for f in files:
        assert f.dtype == np.dtype(dtype) and f.container == "stream"
        mine = rows[first : first + f.num_rows]
        check_file(f, mine, rng)
        first += f.num_rows
    assert first == len(rows)
    assert files[0].side_files() == (
        str(tmp_path / "ds" / "state.json"),
        str(tmp_path / "ds" / "dataset_info.json"),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seq_len", [1, 7, 64])
def test_records_are_a_numpy_cut_of_each_file(
    datasets_lib: Any, tmp_path: Path, layout: str, seq_len: int
) -> None:
    rows = make_rows(11, 150, 50_000)
    ds = hf_dataset(datasets_lib, rows, "int32")
    ds.save_to_disk(str(tmp_path / "ds"), max_shard_size="2KB")
    files = expand_hf(str(tmp_path / "ds"))
    assert len(files) > 2
    want, first = [], 0
    for f in files:
        mine = rows[first : first + f.num_rows]
        first += f.num_rows
        want.append(numpy_records(flat(mine), starts_of(mine), seq_len, layout))
    got = source_records(files, seq_len, layout)
    assert np.array_equal(got, np.concatenate(want))
    assert got.shape[0] > 0


def test_parquet_from_to_parquet_in_row_groups(datasets_lib: Any, tmp_path: Path) -> None:
    rows = make_rows(3, 70, 60_000)
    hf_dataset(datasets_lib, rows, "int64").to_parquet(str(tmp_path / "a.parquet"), batch_size=16)
    assert pq.ParquetFile(tmp_path / "a.parquet").num_row_groups > 3
    (f,) = expand_hf(tmp_path / "a.parquet")
    assert f.container == "parquet" and f.unit_name == "row group"
    check_file(f, rows, np.random.default_rng(1))
    for layout in LAYOUTS:
        want = numpy_records(flat(rows), starts_of(rows), 9, layout)
        assert np.array_equal(source_records([f], 9, layout), want)
    assert not is_hf_dataset(tmp_path / "a.parquet")


def test_a_renamed_column_is_read_with_column(datasets_lib: Any, tmp_path: Path) -> None:
    rows = make_rows(5, 40, 1000)
    ds = hf_dataset(datasets_lib, rows, "uint16").rename_column("input_ids", "tokens")
    ds.save_to_disk(str(tmp_path / "ds"))
    (f,) = expand_hf(tmp_path / "ds", column="tokens")
    check_file(f, rows, np.random.default_rng(2))
    with pytest.raises(IngestError) as e:
        expand_hf(tmp_path / "ds")
    path = dataset_files(tmp_path / "ds")[0]
    assert str(e.value) == (
        f"{path}: no column 'input_ids' (columns: tokens); name the token column with column= "
        "(--column on the command line)"
    )


def test_other_columns_are_not_read(datasets_lib: Any, tmp_path: Path) -> None:
    rows = make_rows(6, 30, 500)
    texts = [f"document {i}" for i in range(len(rows))]
    ds = hf_dataset(datasets_lib, rows, "int32", text=texts)
    ds.save_to_disk(str(tmp_path / "ds"))
    assert ds.column_names == ["text", "input_ids"]
    (f,) = expand_hf(tmp_path / "ds")
    check_file(f, rows, np.random.default_rng(3))
    with pytest.raises(IngestError) as e:
        expand_hf(tmp_path / "ds", column="text")
    message = str(e.value)
    assert message.startswith(f"{f.path}: column 'text' has type string: text, not token ids")
    assert "tokenize it with a tokenizer" in message and "zerobatch convert" in message


def test_an_empty_dataset_has_no_files_and_an_empty_file_no_tokens(
    datasets_lib: Any, tmp_path: Path
) -> None:
    hf_dataset(datasets_lib, [], "int32").save_to_disk(str(tmp_path / "ds"))
    assert expand_hf(tmp_path / "ds") == []  # save_to_disk lists no data file
    full = tmp_path / "full"
    hf_dataset(datasets_lib, [[1, 2]], "int32").save_to_disk(str(full))
    assert [f.num_tokens for f in expand_hf([tmp_path / "ds", full])] == [2]
    path = write_stream(tmp_path / "e.arrow", token_table([], pa.list_(pa.int32())))
    (f,) = expand_hf(path)
    assert f.num_tokens == 0 and f.document_starts().size == 0
    assert f.read_tokens(0, 0).size == 0
    assert source_records([f], 4, "documents").shape == (0, 4)
    assert source_records([f], 4, "contiguous").shape == (0, 4)


def test_a_dataset_dict_names_its_splits(datasets_lib: Any, tmp_path: Path) -> None:
    ds = hf_dataset(datasets_lib, make_rows(1, 10, 100), "int32")
    datasets_lib.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    assert not is_hf_dataset(tmp_path / "dd")
    with pytest.raises(IngestError, match=r"dd: a DatasetDict directory .*splits: test, train"):
        expand_hf(tmp_path / "dd")
    assert len(expand_hf(tmp_path / "dd" / "train")) == 1


# --- containers and types written with pyarrow ------------------------------------------------


@pytest.mark.parametrize(
    "type_",
    [
        pa.list_(pa.int32()),
        pa.large_list(pa.uint16()),
        pa.list_(pa.uint64()),
        pa.large_list(pa.int8()),
    ],
    ids=str,
)
@pytest.mark.parametrize("container", ["stream", "file", "parquet"])
def test_every_container_and_list_type(tmp_path: Path, type_: pa.DataType, container: str) -> None:
    rows = make_rows(8, 25, 120)
    others = {"text": [f"row {i}" for i in range(len(rows))], "n": list(range(len(rows)))}
    table = pa.table({**others, "input_ids": pa.array(rows, type=type_)})  # the third column
    path = tmp_path / ("t.parquet" if container == "parquet" else "t.arrow")
    if container == "stream":
        write_stream(path, table, 4, compression="zstd")
    elif container == "file":
        write_ipc_file(path, table, 4)
    else:
        pq.write_table(table, path, row_group_size=6)
    (f,) = expand_hf(path)
    assert f.container == container and f.dtype == np.dtype(type_.value_type.to_pandas_dtype())
    check_file(f, rows, np.random.default_rng(4))


def test_fixed_size_lists_are_documents_of_one_length(tmp_path: Path) -> None:
    rows = [list(range(i, i + 5)) for i in range(0, 60, 5)]
    path = write_stream(tmp_path / "f.arrow", token_table(rows, pa.list_(pa.int64(), 5)), 5)
    (f,) = expand_hf(path)
    check_file(f, rows, np.random.default_rng(5))
    assert np.array_equal(source_records([f], 5, "documents"), np.array(rows, np.uint32))
    write_stream(tmp_path / "z.arrow", token_table([[]] * 3, pa.list_(pa.int64(), 0)))
    with pytest.raises(IngestError, match=r"z\.arrow: column 'input_ids' has type .*size 0"):
        expand_hf(tmp_path / "z.arrow")


def test_a_sliced_batch_reads_from_its_offset(tmp_path: Path) -> None:
    """Record batches whose list offsets do not start at 0 (slices written as they are)."""
    rows = make_rows(9, 30, 1000)
    table = token_table(rows, pa.list_(pa.int32()))
    path = tmp_path / "s.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for start in range(0, 30, 7):
            w.write_batch(table.slice(start, 7).to_batches()[0])
    (f,) = expand_hf(path)
    check_file(f, rows, np.random.default_rng(6))


def test_tokens_outside_u32_are_refused_naming_the_file(tmp_path: Path) -> None:
    for name, bad in (("neg.arrow", -1), ("big.arrow", 2**32)):
        rows = [[1, 2], [3, bad, 4]]
        path = write_stream(tmp_path / name, token_table(rows, pa.list_(pa.int64())))
        (f,) = expand_hf(path)
        with pytest.raises(IngestError) as e:
            source_records([f], 5, "contiguous")
        assert str(e.value) == f"{path}: token 3 is {bad}, outside [0, 2**32 - 1]"


def test_a_null_row_or_token_is_refused_naming_the_row(tmp_path: Path) -> None:
    rows: list[Any] = [[1], [2, 3], [4], None, [5]]
    for container, path in (
        ("stream", write_stream(tmp_path / "n.arrow", token_table(rows, pa.list_(pa.int32())))),
        ("parquet", tmp_path / "n.parquet"),
    ):
        if container == "parquet":
            pq.write_table(token_table(rows, pa.list_(pa.int32())), path, row_group_size=2)
        (f,) = expand_hf(path)
        with pytest.raises(IngestError) as e:
            f.read_tokens(0, f.num_tokens)
        assert str(e.value) == f"{path}: row 3: column 'input_ids' is null"
    rows = [[1], [2, 3], [4, None, 6]]
    path = write_stream(tmp_path / "t.arrow", token_table(rows, pa.list_(pa.int32())))
    with pytest.raises(IngestError) as e:
        expand_hf(path)[0].document_starts()
    assert str(e.value) == f"{path}: row 2: column 'input_ids': token 1 of the row is null"


@pytest.mark.parametrize(
    ("type_", "values", "what"),
    [
        (pa.list_(pa.float32()), [[1.0, 2.5]], "list<item: float>"),
        (pa.list_(pa.string()), [["a", "b"]], "list<item: string>: text, not token ids"),
        (pa.large_string(), ["some text"], "large_string: text, not token ids"),
        (pa.int64(), [7], "int64, expected a list of integers"),
        (pa.list_(pa.list_(pa.int32())), [[[1]]], "list<item: list<item: int32>>, expected"),
        (pa.list_(pa.bool_()), [[True]], "list<item: bool>, expected a list of integers"),
    ],
    ids=["floats", "strings", "text", "scalar", "nested", "bools"],
)
def test_a_column_that_is_not_token_lists_is_refused(
    tmp_path: Path, type_: pa.DataType, values: list[Any], what: str
) -> None:
    path = write_stream(tmp_path / "x.arrow", pa.table({"input_ids": pa.array(values, type_)}))
    with pytest.raises(IngestError) as e:
        expand_hf(path)
    assert str(e.value).startswith(f"{path}: column 'input_ids' has type {what}")


# --- corrupt files --------------------------------------------------------------------------


@pytest.fixture
def stream_file(tmp_path: Path) -> tuple[Path, Rows]:
    rows = make_rows(12, 60, 40_000)
    return write_stream(tmp_path / "c.arrow", token_table(rows, pa.list_(pa.int32())), 6), rows


def message_ends(path: Path) -> list[int]:
    """Byte offset of the end of each message of an Arrow stream (schema, batches, EOS)."""
    ends = []
    with pa.OSFile(str(path)) as f:
        reader = pa.ipc.open_stream(f)
        ends.append(f.tell())
        for _ in reader:
            ends.append(f.tell())
        ends.append(f.tell())
    return ends


@pytest.mark.parametrize("where", ["header", "mid-batch", "batch-boundary", "no-eos", "eos-half"])
def test_a_truncated_stream_is_refused_naming_the_file(
    stream_file: tuple[Path, Rows], where: str
) -> None:
    path, _ = stream_file
    data = path.read_bytes()
    ends = message_ends(path)
    cut = {
        "header": 20,
        "mid-batch": ends[2] + 30,
        "batch-boundary": ends[3],
        "no-eos": len(data) - 8,
        "eos-half": len(data) - 4,
    }[where]
    path.write_bytes(data[:cut])
    with pytest.raises(IngestError) as e:
        f = expand_hf(path)[0]
        f.read_tokens(0, f.num_tokens)
    message = str(e.value)
    assert message.startswith(f"{path}: ")
    if where in ("batch-boundary", "no-eos"):
        assert "without its end-of-stream marker" in message
    elif where == "header":
        assert "not a readable Arrow IPC stream" in message


def test_bytes_after_the_end_of_stream_are_refused(stream_file: tuple[Path, Rows]) -> None:
    path, _ = stream_file
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(bytes(16))
    with pytest.raises(IngestError) as e:
        expand_hf(path)[0].num_tokens  # noqa: B018
    assert str(e.value) == (
        f"{path}: 16 bytes after the Arrow stream's end-of-stream marker (at byte {size - 8:,})"
    )


@pytest.mark.parametrize("at", ["batch-boundary", "mid-batch"])
def test_a_stream_truncated_between_reads_is_refused(
    stream_file: tuple[Path, Rows], at: str
) -> None:
    path, rows = stream_file
    want = flat(rows)
    (f,) = expand_hf(path)
    n = f.num_tokens
    assert np.array_equal(f.read_tokens(0, 10), want[:10])  # the cursor is in batch 0
    ends = message_ends(path)
    data = path.read_bytes()
    path.write_bytes(data[: ends[4] if at == "batch-boundary" else ends[4] - 50])
    with pytest.raises(IngestError) as e:
        f.read_tokens(10, n)
    assert str(e.value).startswith(f"{path}: ")
    f.close()


@pytest.mark.parametrize("container", ["file", "parquet"])
def test_seekable_files_truncated_between_reads_are_refused(tmp_path: Path, container: str) -> None:
    rows = make_rows(13, 60, 1000)
    table = token_table(rows, pa.list_(pa.int32()))
    if container == "file":
        path = write_ipc_file(tmp_path / "c.arrow", table, 6)
    else:
        path = tmp_path / "c.parquet"
        pq.write_table(table, path, row_group_size=6)
    (f,) = expand_hf(path)
    n = f.num_tokens
    f.read_tokens(0, 5)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(IngestError) as e:
        f.read_tokens(5, n)
    assert str(e.value).startswith(f"{path}: ")
    with pytest.raises(IngestError, match="not a readable"):
        expand_hf(path)


def test_a_file_changed_between_passes_is_refused(stream_file: tuple[Path, Rows]) -> None:
    path, _ = stream_file
    (f,) = expand_hf(path)
    n = f.num_tokens
    other = make_rows(99, 60, 40_000)
    write_stream(path, token_table(other, pa.list_(pa.int32())), 6)
    with pytest.raises(IngestError, match="changed or was truncated since") as e:
        f.read_tokens(0, n)
    assert str(e.value).startswith(f"{path}: record batch 0: expected 6 rows")


def test_a_negative_length_in_the_metadata_is_refused_before_any_buffer_is_used(
    tmp_path: Path,
) -> None:
    """pyarrow's IPC reader takes a record batch whose child array length is -2**63 (one byte
    of its metadata set to 0x80) without complaint, and ``ListArray.flatten()`` of it aborts
    the process (pyarrow 26: ``data.cc:190 Check failed: (off) <= (length)``). The reader
    validates each column (``validate(full=True)``) before touching it."""
    table = token_table(make_rows(16, 12, 1000), pa.list_(pa.int32()))
    data = write_stream(tmp_path / "ok.arrow", table, 4).read_bytes()
    hits = []
    for at in range(len(data)):
        mutant = data[:at] + b"\x80" + data[at + 1 :]
        try:
            batch = pa.ipc.open_stream(pa.BufferReader(mutant)).read_next_batch()
            batch.validate(full=True)
        except (pa.ArrowException, OSError, StopIteration) as err:
            if "length is negative" in str(err):
                hits.append(mutant)
    assert hits, "no byte gives a negative length: the writer's layout changed"
    for i, mutant in enumerate(hits):
        path = tmp_path / f"neg-{i}.arrow"
        path.write_bytes(mutant)
        with pytest.raises(IngestError) as e:
            expand_hf(path)[0].num_tokens  # noqa: B018
        assert str(e.value).startswith(f"{path}: record batch 0 (rows from 0): cannot read")
        assert "length is negative" in str(e.value)


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage" * 20, bytes(64), b"\xff\xff\xff\xff" + bytes(60), b"ARROW1\x00\x00junk"],
    ids=["empty", "text", "zeros", "continuation", "file-magic"],
)
def test_garbage_in_place_of_an_arrow_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "g.arrow"
    path.write_bytes(content)
    with pytest.raises(IngestError) as e:
        f = expand_hf(path)[0]
        f.read_tokens(0, f.num_tokens)
    assert str(e.value).startswith(f"{path}: ")


def test_garbage_in_place_of_a_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "g.parquet"
    path.write_bytes(b"PAR1" + b"\x07" * 100)
    with pytest.raises(IngestError, match=r"g\.parquet: not a readable parquet file: "):
        expand_hf(path)


# --- save_to_disk directories -----------------------------------------------------------------


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A ``save_to_disk``-shaped directory written by hand (two stream files)."""
    d = tmp_path / "ds"
    d.mkdir()
    for i in range(2):
        rows = make_rows(20 + i, 10, 100)
        write_stream(d / f"data-0000{i}-of-00002.arrow", token_table(rows, pa.list_(pa.int32())))
    state: dict[str, Any] = {
        "_data_files": [{"filename": f"data-0000{i}-of-00002.arrow"} for i in (1, 0)],
        "_fingerprint": "x",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (d / "state.json").write_text(json.dumps(state))
    (d / "dataset_info.json").write_text("{}")
    return d


def test_state_json_gives_the_order(saved: Path) -> None:
    assert is_hf_dataset(saved)
    assert [os.path.basename(f.path) for f in expand_hf(str(saved))] == [
        "data-00001-of-00002.arrow",
        "data-00000-of-00002.arrow",
    ]


def edit_state(saved: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    state = json.loads((saved / "state.json").read_text())
    out = fn(state)
    (saved / "state.json").write_text(json.dumps(state if out is None else out))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["_data_files"].append({"filename": "gone.arrow"}), "_data_files[2]"),
        (lambda s: s.pop("_data_files") and None, "_data_files: expected a list of files, got no"),
        (lambda s: s.update(_data_files={}), "field _data_files: expected a list of files, got {}"),
        (lambda s: s.update(_data_files=[{"file": "x"}]), "[0].filename: expected a file"),
        (lambda s: s.update(_data_files=[{"filename": "../x.arrow"}]), "not a plain file"),
        (lambda s: s["_data_files"].append(s["_data_files"][0]), "is listed twice"),
        (lambda s: [1, 2], "expected a JSON object, got list"),
        (lambda s: s.update(_indices_data_files=[{"filename": "i.arrow"}]), "indices mapping"),
    ],
    ids=["missing-file", "no-list", "object", "no-name", "traversal", "twice", "list", "indices"],
)
def test_a_bad_state_json_is_refused(
    saved: Path, edit: Callable[[dict[str, Any]], Any], message: str
) -> None:
    edit_state(saved, edit)
    with pytest.raises(IngestError) as e:
        expand_hf(saved)
    assert str(e.value).startswith(f"{saved / 'state.json'}: ")
    assert message in str(e.value)


def test_a_missing_data_file_is_named(saved: Path) -> None:
    (saved / "data-00000-of-00002.arrow").unlink()
    with pytest.raises(IngestError) as e:
        expand_hf(saved)
    assert str(e.value) == (
        f"{saved / 'state.json'}: field _data_files[1].filename: "
        f"{saved / 'data-00000-of-00002.arrow'} does not exist"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"_data_files": [', "line 1, column 18: invalid JSON"),
        (b"\xff\xfe{}", "byte offset 0: invalid UTF-8"),
        (b"", "line 1, column 1: invalid JSON"),
    ],
)
def test_a_corrupt_state_json_is_refused(saved: Path, content: bytes, message: str) -> None:
    (saved / "state.json").write_bytes(content)
    with pytest.raises(IngestError) as e:
        expand_hf(saved)
    assert str(e.value).startswith(f"{saved / 'state.json'}: {message}")


def test_inputs_that_are_not_there(tmp_path: Path, saved: Path) -> None:
    with pytest.raises(IngestError, match=r"nothing\.arrow: Hugging Face input does not exist"):
        expand_hf(tmp_path / "nothing.arrow")
    with pytest.raises(IngestError, match=r"\*\.arrow: no Hugging Face input matches"):
        expand_hf(str(tmp_path / "*.arrow"))
    with pytest.raises(IngestError, match=r"no state\.json"):
        expand_hf(tmp_path)
    with pytest.raises(IngestError, match="listed twice"):
        expand_hf([saved, saved / "data-00000-of-00002.arrow"])
    with pytest.raises(IngestError, match="no Hugging Face inputs given"):
        expand_hf([])
    assert len(expand_hf(str(saved / "data-*.arrow"))) == 2
    assert not is_hf_dataset(tmp_path) and not is_hf_dataset(tmp_path / "nothing.arrow")
    assert is_hf_dataset(saved / "data-00000-of-00002.arrow")


# --- cursor, memory, imports ------------------------------------------------------------------


class CountingReader:
    """Counts the readers opened on a file (each open reads the file again from its start)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = 0
        real = HFTokenFile._open

        def counted(f: HFTokenFile) -> Any:
            self.opened += 1
            return real(f)

        monkeypatch.setattr(HFTokenFile, "_open", counted)


def test_ascending_reads_keep_one_cursor(
    stream_file: tuple[Path, Rows], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, rows = stream_file
    want = flat(rows)
    (f,) = expand_hf(path)
    n = f.num_tokens
    counter = CountingReader(monkeypatch)
    pieces = [f.read_tokens(a, min(n, a + 13)) for a in range(0, n, 13)]
    assert np.array_equal(np.concatenate(pieces), want)
    assert counter.opened == 1  # one reader, read forward once
    assert np.array_equal(f.read_tokens(0, 3), want[:3])  # backwards: a stream restarts
    assert counter.opened == 2
    f.document_starts()
    assert counter.opened == 3  # one pass for the starts, then cached
    f.document_starts()
    assert counter.opened == 3


def test_files_of_one_expansion_share_one_cursor(saved: Path) -> None:
    a, b = expand_hf(saved)
    a.read_tokens(0, 3)
    assert a._reader is not None and a._cached is not None
    b.read_tokens(0, 3)
    assert a._reader is None and a._cached is None and b._reader is not None
    a.read_tokens(3, 5)  # still readable: it reopens
    assert b._reader is None
    a.close()
    assert a._reader is None
    a.close()


def test_parquet_reads_only_the_token_column(tmp_path: Path) -> None:
    rows = make_rows(14, 30, 100)
    table = pa.table(
        {"input_ids": pa.array(rows, pa.list_(pa.int32())), "text": ["x" * 50] * len(rows)}
    )
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=7)
    (f,) = expand_hf(tmp_path / "p.parquet")
    check_file(f, rows, np.random.default_rng(15))
    assert f.num_rows == len(rows)


def test_the_module_imports_pyarrow_only_when_a_file_is_opened() -> None:
    code = (
        "import sys\n"
        "from zerobatch_core.ingest import hf_datasets\n"
        "hf_datasets.is_hf_dataset('.')\n"
        "print('pyarrow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ranges_outside_the_file_are_refused(stream_file: tuple[Path, Rows]) -> None:
    path, _ = stream_file
    (f,) = expand_hf(path)
    n = f.num_tokens
    with pytest.raises(IngestError, match=rf"tokens \[0, {n + 1}\) are outside the file's {n}"):
        f.read_tokens(0, n + 1)
    with pytest.raises(IngestError):
        f.read_tokens(5, 4)
    assert repr(f) == f"HFTokenFile({str(path)!r}, column='input_ids', stream)"
    assert hf_datasets.DEFAULT_COLUMN == "input_ids"


def test_a_unit_of_several_chunks_is_one_unit(tmp_path: Path) -> None:
    """A row group can come back as several chunks (sliced arrays, offsets not from 0)."""
    rows = make_rows(17, 20, 1000)
    path = write_stream(tmp_path / "s.arrow", token_table(rows, pa.list_(pa.int32())))
    (f,) = expand_hf(path)
    whole = pa.array(rows, pa.list_(pa.int32()))
    unit = f._decode([whole.slice(0, 7), whole.slice(7, 0), whole.slice(7, 13)], "here", 0)
    assert unit.rows == 20
    assert np.array_equal(unit.offsets[:-1], starts_of(rows))
    assert int(unit.offsets[-1]) == flat(rows).size
    assert np.array_equal(unit.tokens, flat(rows)) and unit.tokens.dtype == np.int32


def test_running_out_of_memory_in_a_unit_names_it(
    stream_file: tuple[Path, Rows], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = stream_file
    (f,) = expand_hf(path)

    def no_memory(*args: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(HFTokenFile, "_decode", no_memory)
    with pytest.raises(IngestError) as e:
        f.document_starts()
    assert str(e.value) == (
        f"{path}: record batch 0 (rows from 0): cannot read column 'input_ids': out of memory "
        "decoding this record batch (MemoryError)"
    )


MEMORY_PROBE = """
import json, os, sys
import numpy as np, pyarrow as pa
from zerobatch_core.ingest.hf_datasets import expand_hf
from zerobatch_core.ingest.token_files import TokenFileSource

path, batches, rows, row_len = sys.argv[1], 24, 64, 1000
schema = pa.schema([("text", pa.string()), ("input_ids", pa.list_(pa.int32()))])
with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
    for b in range(batches):
        values = pa.array(np.arange(rows * row_len, dtype=np.int32) + b)
        offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * row_len)
        tokens = pa.ListArray.from_arrays(offsets, values)
        w.write_batch(pa.record_batch([pa.array(["x" * 500] * rows), tokens], schema=schema))
pool = pa.default_memory_pool()
before = pool.max_memory()
for layout in ("contiguous", "documents"):
    src = TokenFileSource(expand_hf(path), 1000, layout)
    records = sum(b.shape[0] for b in src.iter_blocks())
    src.close()
print(json.dumps({"size": os.path.getsize(path), "batches": batches, "before": before,
                  "peak": pool.max_memory(), "records": records}))
"""


def test_reading_holds_one_record_batch_not_the_file(tmp_path: Path) -> None:
    """pyarrow's allocations (its pool's peak, in a fresh process) stay at about one record
    batch body while a file 24 batches long is scanned twice and cut into records."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(tmp_path / "big.arrow")],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got["records"] == 64 * 24
    body = got["size"] / got["batches"]
    assert got["peak"] - got["before"] < 3 * body < got["size"] / 4, got
