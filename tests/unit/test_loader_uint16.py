"""The loader on uint16 (dtype 1) sources: which dtype each output has, what is a view and what
a pooled copy, and that every output holds the values the uint32 twin of the source serves.

Each uint16 file or dataset here is the byte-for-byte spec twin of a uint32 one written by the
writer (``tests/narrow.py``), so both hold the same tokens in the same slots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import records
from tests.narrow import narrow_dataset, narrow_file
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    BatchStream,
    write_batch_file,
    write_sharded_dataset,
)
from zerobatch_core.delivery.buffers import ChunkStage
from zerobatch_core.delivery.sources import source_token_dtype

B, T = 4, 8
U16, U32 = np.dtype("<u2"), np.dtype("<u4")


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A uint32 file of 60 unique records (15 batches of [4, 8]) and its uint16 twin."""
    wide, narrow = tmp_path / "u32.batch", tmp_path / "u16.batch"
    write_batch_file(wide, records(60, T), B, seed=5)
    narrow_file(wide, narrow)
    return wide, narrow


@pytest.fixture
def datasets(tmp_path: Path) -> tuple[Path, Path]:
    """A uint32 dataset of 4 shards (3, 3, 3 and 1 batches) and its uint16 twin."""
    wide = tmp_path / "ds32"
    write_sharded_dataset(wide, [records(42, T)], batch_size=B, seq_len=T, shard_batches=3, seed=2)
    return wide, narrow_dataset(wide, tmp_path / "ds16")


def _arrays(item: Any) -> list[np.ndarray]:
    if isinstance(item, dict):
        return [item[k] for k in sorted(item)]
    return list(item) if isinstance(item, tuple) else [item]


def _owns_mapping(array: np.ndarray, reader: BatchFileReader) -> bool:
    """Whether ``array`` is a view of the reader's mapped file."""
    return np.shares_memory(array, reader.read_batches(0, reader.num_batches))


def test_the_stored_tokens_are_uint16_and_native_serves_them_as_views(
    pair: tuple[Path, Path],
) -> None:
    wide, narrow = pair
    with BatchFileReader(narrow) as reader:
        assert reader.token_dtype == U16 and source_token_dtype(reader) == U16
        loader = BatchNativeLoader(reader, shuffle=False)
        assert (loader.dtype, loader.token_dtype, loader.label_dtype) == ("uint16", U16, "int64")
        items = list(loader)
        assert all(i.dtype == U16 and _owns_mapping(i, reader) for i in items)
        np.testing.assert_array_equal(np.stack(items), reader.read_batches(0, 15))
    uint32 = BatchNativeLoader(wide)
    assert (uint32.dtype, uint32.token_dtype) == ("uint32", U32)


@pytest.mark.parametrize("dtype", ["uint32", "int32", "int64"])
def test_wider_outputs_are_pooled_copies_with_the_uint32_files_values(
    pair: tuple[Path, Path], dtype: str
) -> None:
    wide, narrow = pair
    with BatchFileReader(narrow) as reader:
        loader = BatchNativeLoader(reader, dtype=dtype, seed=3, block_size=2)  # type: ignore[arg-type]
        got = [np.array(i) for i in loader]
        again = list(loader)  # kept items: none is overwritten by a later one
        assert all(i.dtype == np.dtype(dtype) and not _owns_mapping(i, reader) for i in again)
        want = list(BatchNativeLoader(wide, dtype=dtype, seed=3, block_size=2, epoch=1))  # type: ignore[arg-type]
        assert len(again) == len(want) == 15
        for a, b in zip(again, want, strict=True):
            np.testing.assert_array_equal(a, b)
        first = list(BatchNativeLoader(wide, dtype=dtype, seed=3, block_size=2))  # type: ignore[arg-type]
        for a, b in zip(got, first, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_int64_converts_on_the_stage_thread_and_int32_on_the_callers(
    pair: tuple[Path, Path],
) -> None:
    _, narrow = pair
    wide_out = BatchNativeLoader(narrow, dtype="int64")
    it = iter(wide_out)
    next(it)
    assert isinstance(wide_out._stage, ChunkStage)  # a thread converts ahead (may be done)
    del it
    narrow_out = BatchNativeLoader(narrow, dtype="int32")
    it = iter(narrow_out)
    first = next(it)
    assert narrow_out._stage is None and first.dtype == np.int32
    # The caller's chunk buffers are reused once nothing holds their items.
    (pool,) = narrow_out._pools()
    for _ in it:
        pass
    assert 0 < len(pool) <= pool.capacity


def test_a_uint32_source_is_never_narrowed(pair: tuple[Path, Path]) -> None:
    wide, narrow = pair
    narrowing = r"u32\.batch: dtype='uint16' would narrow the stored uint32 tokens"
    with pytest.raises(ValueError, match=narrowing):
        BatchNativeLoader(wide, dtype="uint16")
    with pytest.raises(ValueError, match="label_dtype='uint16' would narrow"):
        BatchNativeLoader(wide, next_token=True, label_dtype="uint16")
    with pytest.raises(ValueError, match="dtype must be one of 'native', 'uint16', 'uint32'"):
        BatchNativeLoader(narrow, dtype="float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label_dtype must be one of 'int64'"):
        BatchNativeLoader(narrow, label_dtype="int32")  # type: ignore[arg-type]
    assert BatchNativeLoader(narrow, dtype="uint16").dtype == "uint16"


def test_states_of_uint32_sources_do_not_depend_on_the_output_dtype(
    pair: tuple[Path, Path],
) -> None:
    wide, narrow = pair
    states = []
    for dtype in ("native", "uint32", "int32", "int64"):
        loader = BatchNativeLoader(wide, dtype=dtype, seed=1)  # type: ignore[arg-type]
        it = iter(loader)
        next(it), next(it)
        states.append(loader.state_dict())
        del it
    assert all(s == states[0] for s in states)
    assert set(states[0]) == {
        "format", "version", "epoch", "step", "num_workers", "worker", "origin", "seed",
        "block_size", "shuffle", "num_batches", "batch_size", "seq_len", "file_seed",
        "global_batch_size", "samples", "skip_steps", "source",
    }  # fmt: skip
    # A uint16 twin is another file: its state names it, and resumes only there.
    twin = BatchNativeLoader(narrow, dtype="int32", seed=1)
    resumed = BatchNativeLoader(narrow, dtype="int64", seed=1)
    it = iter(twin)
    next(it), next(it)
    resumed.load_state_dict(twin.state_dict())
    np.testing.assert_array_equal(next(iter(resumed)), next(it))


def test_bytes_read_count_the_stored_token_size(pair: tuple[Path, Path]) -> None:
    wide, narrow = pair
    w = BatchNativeLoader(wide, dtype="int32", next_token=True)
    n = BatchNativeLoader(narrow, dtype="int32", next_token=True)
    assert w.bytes_per_step == B * T * 4 and n.bytes_per_step == B * T * 2
    for loader in (w, n):
        for _ in loader:
            pass
    assert n.bytes_read * 2 == w.bytes_read == 15 * B * T * 4


@pytest.mark.parametrize("label_dtype", ["int64", "uint32", "native"])
@pytest.mark.parametrize("dtype", ["native", "int32", "int64", "uint32"])
def test_next_token_pairs_and_document_layouts_match_the_uint32_files(
    tmp_path: Path, dtype: str, label_dtype: str
) -> None:
    rows = records(48, T) % 7  # token 0 is the BOS of many short documents
    wide, narrow = tmp_path / "w.batch", tmp_path / "n.batch"
    write_batch_file(wide, rows, B, seed=8)
    narrow_file(wide, narrow)
    kw: dict[str, Any] = {"dtype": dtype, "label_dtype": label_dtype, "next_token": True}
    for extra in ({}, {"bos_id": 0}):
        a = list(BatchNativeLoader(wide, block_size=3, **kw, **extra))
        b = list(BatchNativeLoader(narrow, block_size=3, **kw, **extra))
        for x, y in zip(a, b, strict=True):
            for p, q in zip(_arrays(x), _arrays(y), strict=True):
                np.testing.assert_array_equal(p, q)
        inputs, labels = (b[0]["inputs"], b[0]["labels"]) if extra else b[0]
        assert inputs.dtype == (U16 if dtype == "native" else np.dtype(dtype))
        assert labels.dtype == {"int64": np.int64, "uint32": U32, "native": U16}[label_dtype]


def test_a_bos_id_no_uint16_token_can_hold_is_refused(pair: tuple[Path, Path]) -> None:
    wide, narrow = pair
    with pytest.raises(ValueError, match=r"bos_id 65536 cannot occur in uint16 tokens"):
        BatchNativeLoader(narrow, bos_id=65536)
    assert BatchNativeLoader(narrow, bos_id=65535).bos_id == 65535
    assert BatchNativeLoader(wide, bos_id=65536).bos_id == 65536


@pytest.mark.parametrize("dtype", ["native", "int32", "int64"])
def test_datasets_of_uint16_shards_serve_the_uint32_datasets_values(
    datasets: tuple[Path, Path], dtype: str
) -> None:
    wide, narrow = datasets
    for kw in ({}, {"global_batch_size": 2}, {"rank": 1, "world_size": 2, "next_token": True}):
        a = list(BatchNativeLoader(wide, dtype=dtype, verify="always", block_size=2, **kw))  # type: ignore[arg-type]
        b = list(BatchNativeLoader(narrow, dtype=dtype, verify="always", block_size=2, **kw))  # type: ignore[arg-type]
        assert len(a) == len(b) > 0
        for x, y in zip(a, b, strict=True):
            for p, q in zip(_arrays(x), _arrays(y), strict=True):
                np.testing.assert_array_equal(p, q)
                if dtype != "native":
                    assert p.dtype == q.dtype


def test_the_stream_serves_int32_by_default_and_resolves_native(pair: tuple[Path, Path]) -> None:
    wide, narrow = pair
    with BatchStream(narrow) as s16, BatchStream(wide) as s32:
        assert s16.dtype == s32.dtype == "int32"
        for a, b in zip(s16, s32, strict=True):
            assert a.dtype == b.dtype == np.int32
            np.testing.assert_array_equal(a, b)
    with BatchStream(narrow, dtype="native") as native:
        assert native.dtype == native.loader.dtype == "uint16"
        assert next(iter(native)).dtype == U16
    with BatchStream(narrow, dtype="uint16") as named:
        assert named.dtype == "uint16"


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_skipped_steps_worker_splits_and_resumes_match_the_uint32_file(
    pair: tuple[Path, Path], dtype: str
) -> None:
    wide, narrow = pair
    kw: dict[str, Any] = {"dtype": dtype, "seed": 9, "block_size": 4, "skip_steps": [(3, 5)]}
    for worker in range(2):
        loaders = [BatchNativeLoader(p, **kw) for p in (wide, narrow)]
        for loader in loaders:
            loader.split_workers(worker, 2)
        a, b = (list(loader) for loader in loaders)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(x, y)
    # Interrupted mid-pass and resumed in a new loader: the rest of the pass, then the next.
    first = BatchNativeLoader(narrow, **kw)
    it = iter(first)
    head = [np.array(next(it)) for _ in range(5)]
    resumed = BatchNativeLoader(narrow, **kw)
    resumed.load_state_dict(first.state_dict())
    rest = [np.array(i) for i in resumed] + [np.array(i) for i in resumed]
    whole = [np.array(i) for i in BatchNativeLoader(wide, **kw)]
    again = BatchNativeLoader(wide, **kw, epoch=1)
    whole += [np.array(i) for i in again]
    assert len(head) + len(rest) == len(whole)
    for x, y in zip(head + rest, whole, strict=True):
        np.testing.assert_array_equal(x, y)
