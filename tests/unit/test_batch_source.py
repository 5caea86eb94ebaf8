"""``BatchSource``: the loader serves any object with the protocol's members, as it serves a file.

An in-memory source (slots in a NumPy array, the file's serving order) is served by the loader
and the stream exactly as the LLMBATCH file holding the same slots, in every capability
combination (views of one mapping or not, fetched or not), with exact resume; the readers
ZeroBatch opens are all ``BatchSource``s; and the delivery modules name no reader class.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import ArraySource, records
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    BatchSource,
    BatchStream,
    DatasetReader,
    write_batch_file,
)
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import RemoteSource
from zerobatch_core.delivery.sources import open_reader

B, T, N, SEED = 4, 9, 23, 5


@pytest.fixture
def file(tmp_path: Path) -> Path:
    path = tmp_path / "f.batch"
    write_batch_file(path, records(B * N, T), batch_size=B, seed=SEED)
    return path


def _array(path: Path, *, views: bool, fetches: bool) -> ArraySource:
    with BatchFileReader(path) as reader:
        slots = np.array(reader.read_batches(0, reader.num_batches))
        return ArraySource(slots, reader.seed, views=views, fetches=fetches)


def _items(loader: BatchNativeLoader, epochs: int = 2) -> list[Any]:
    out = []
    for _ in range(epochs):
        for item in loader:
            out.append(_plain(item))
    return out


def _plain(item: Any) -> Any:
    if isinstance(item, dict):
        return {k: np.array(v) for k, v in item.items()}
    if isinstance(item, tuple):
        return tuple(np.array(v) for v in item)
    return np.array(item)


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for k in x:
                assert x[k].dtype == y[k].dtype
                np.testing.assert_array_equal(x[k], y[k])
        elif isinstance(x, tuple):
            for u, v in zip(x, y, strict=True):
                assert u.dtype == v.dtype
                np.testing.assert_array_equal(u, v)
        else:
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


OPTIONS: list[dict[str, Any]] = [
    {},
    {"dtype": "int64"},
    {"dtype": "int32", "next_token": True},
    {"next_token": True, "label_dtype": "uint32"},
    {"dtype": "int64", "next_token": True, "block_size": 3},
    {"rank": 1, "world_size": 2, "dtype": "int64"},
    {"global_batch_size": 8, "world_size": 2, "rank": 0},
    {"global_batch_size": 2, "next_token": True},
    {"context_rank": 1, "context_size": 2, "zigzag": True, "next_token": True},
    {"bos_id": 3, "dtype": "int64"},
    {"skip_steps": [(2, 5)], "shuffle": False},
]


@pytest.mark.parametrize("views,fetches", list(itertools.product([True, False], repeat=2)))
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "default")
def test_loader_serves_any_source_as_it_serves_the_file(
    file: Path, views: bool, fetches: bool, options: dict[str, Any]
) -> None:
    source = _array(file, views=views, fetches=fetches)
    assert isinstance(source, BatchSource)
    from_file = BatchNativeLoader(file, **options)
    from_array = BatchNativeLoader(source, **options)
    assert from_array.order.__class__ is from_file.order.__class__
    _same(_items(from_array), _items(from_file))
    assert from_array.bytes_read == from_file.bytes_read
    assert source.checked, "the loader checks sizes at block starts"
    if fetches:  # steps and their regions are announced through ahead() first
        assert source.whole_rows and len(source.announced) > 0
        assert all(
            0 <= r[0] < N and r[1] < r[2] <= B and r[3] < r[4] <= T for r in source.announced
        )
    else:
        assert source.announced == []
    from_file.source.close()
    assert not source.closed  # a source handed in stays open: its owner closes it


@pytest.mark.parametrize("views", [True, False])
def test_resume_on_another_source_kind(file: Path, views: bool) -> None:
    """A state saved by a loader over the source resumes exactly there, and mid-epoch."""
    source = _array(file, views=views, fetches=not views)
    loader = BatchNativeLoader(source, dtype="int64", next_token=True, block_size=2)
    full = _items(loader.copy(), epochs=1)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    assert state["source"] == {"array": int(source.slots.sum())}
    again = BatchNativeLoader(
        _array(file, views=views, fetches=not views), dtype="int64", next_token=True, block_size=2
    )
    again.load_state_dict(state)
    _same(_items(again, epochs=1), full[7:])


def test_stream_serves_any_source(file: Path) -> None:
    source = _array(file, views=False, fetches=True)
    with (
        BatchStream(source, dtype="int64", next_token=True, prefetch=2) as s,
        BatchStream(file, dtype="int64", next_token=True, prefetch=2) as f,
    ):
        _same([_plain(i) for i in s], [_plain(i) for i in f])
    assert not source.closed


def test_every_reader_is_a_batch_source(file: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    write_sharded_dataset(
        ds, [records(B * N, T)], batch_size=B, seq_len=T, shard_batches=5, seed=SEED
    )
    opened = [
        BatchFileReader(file),
        DatasetReader(ds),
        open_reader(file.as_uri()),
        open_reader(ds.as_uri()),
    ]
    try:
        for reader in opened:
            assert isinstance(reader, BatchSource)
            assert open_reader(reader) is reader  # an open source is used as it is
        assert isinstance(opened[2], RemoteSource) and opened[2].fetches
        assert not opened[0].fetches and not opened[1].fetches
        # A file's identity is the same read locally or through a store, as a dataset's is.
        assert opened[0].identity() == opened[2].identity()
        assert opened[1].identity() == opened[3].identity()
        assert opened[0].identity() != opened[1].identity()
        # Regions are the same tokens whichever reader serves them.
        for reader, same in zip(opened, [opened[0], opened[1], opened[0], opened[1]], strict=True):
            region = reader.read_region(7, 1, 3, 2, 6)
            np.testing.assert_array_equal(region, same.read_batch(7)[1:3, 2:6])
        # Only a single mapping gives runs of slots as one view; the file holding a slot.
        assert opened[0].view_batches(2, 5) is not None
        assert all(r.view_batches(2, 5) is None for r in opened[1:])
        f, slot = opened[1].slot_file(12)
        assert (f.path, slot) == (opened[1].shard_path(2), 2)
        assert opened[0].slot_file(-1) == (opened[0], N - 1)
        assert opened[2].slot_file(0) is None
    finally:
        for reader in opened:
            reader.close()


def test_delivery_names_no_reader_class() -> None:
    """The loader and the stream depend on the protocol, not on reader classes."""
    root = Path(__file__).resolve().parents[2] / "zerobatch_core" / "delivery"
    classes = {"BatchFileReader", "DatasetReader", "RemoteSource", "LiveSource"}
    for name in ("loader.py", "stream.py"):
        tree = ast.parse((root / name).read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not used & classes, f"{name} names {sorted(used & classes)}"
