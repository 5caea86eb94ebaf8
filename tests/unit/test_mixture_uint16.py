"""Mixtures of sources of different token dtypes: ``native`` serves the widest, uint16
components are widened to it, and every output equals the mixture of the uint32 twins."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import records
from tests.narrow import narrow_dataset, narrow_file
from zerobatch_core import BatchNativeLoader, BatchStream, Mixture, write_batch_file
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.delivery.mixture import MixtureSource

T, G = 6, 4
U16, U32 = np.dtype("<u2"), np.dtype("<u4")


@pytest.fixture
def twins(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """Three sources, each as uint32 and as its uint16 twin: ``(uint32, uint16)``."""
    out = {}
    a = tmp_path / "a.batch"
    write_batch_file(a, records(4 * 9, T), batch_size=4, seed=1)
    out["a"] = (a, tmp_path / "a16.batch")
    narrow_file(a, out["a"][1])
    b = tmp_path / "b"
    rows = records(2 * 13, T) + 1000
    write_sharded_dataset(b, [rows], batch_size=2, seq_len=T, shard_batches=3, seed=2)
    out["b"] = (b, narrow_dataset(b, tmp_path / "b16"))
    c = tmp_path / "c.batch"
    write_batch_file(c, records(8 * 4, T) + 2000, batch_size=8, seed=3)
    out["c"] = (c, tmp_path / "c16.batch")
    narrow_file(c, out["c"][1])
    return out


def _mixture(parts: dict[str, Path]) -> Mixture:
    return Mixture([(n, p, w) for (n, p), w in zip(parts.items(), (5, 3, 2), strict=True)],
                   global_batch_size=G, steps=40)  # fmt: skip


def _items(source: Any, **kw: Any) -> list[list[np.ndarray]]:
    loader = BatchNativeLoader(source, block_size=2, **kw)
    out = []
    for item in loader:
        out.append([np.array(x) for x in (item if isinstance(item, tuple) else (item,))])
    loader.source.close()
    return out


@pytest.mark.parametrize("narrowed", [("b",), ("a", "c"), ("a", "b", "c")])
@pytest.mark.parametrize("dtype", ["native", "int32", "int64"])
def test_a_mixture_serves_its_uint32_twins_values(
    twins: dict[str, tuple[Path, Path]], narrowed: tuple[str, ...], dtype: str
) -> None:
    wide = _mixture({n: p[0] for n, p in twins.items()})
    mixed = _mixture({n: p[1] if n in narrowed else p[0] for n, p in twins.items()})
    with MixtureSource(mixed) as source:
        every = len(narrowed) == len(twins)
        assert source.token_dtype == (U16 if every else U32)
    want = (U16 if every else U32) if dtype == "native" else np.dtype(dtype)
    for kw in ({}, {"next_token": True, "rank": 1, "world_size": 2}):
        a, b = _items(wide, dtype=dtype, **kw), _items(mixed, dtype=dtype, **kw)
        assert len(a) == len(b) == 40
        for x, y in zip(a, b, strict=True):
            for p, q in zip(x, y, strict=True):
                np.testing.assert_array_equal(p, q)
                assert q.shape == p.shape
            assert y[0].dtype == want


def test_steps_of_a_widened_component_are_not_served_from_its_file(
    twins: dict[str, tuple[Path, Path]],
) -> None:
    mixed = _mixture({"a": twins["a"][0], "b": twins["b"][0], "c": twins["c"][1]})
    with MixtureSource(mixed) as source:
        loader = BatchNativeLoader(source, block_size=2)
        names = [source.component_name(step) for step in range(40)]
        files = [source.slot_file(step) for step in range(40)]
        items = list(loader)
        assert loader.dtype == "uint32" and all(i.dtype == U32 for i in items)
        # Component "c" (uint16, stored batches of 8: a step is half of one) is read and
        # widened; component "a" (uint32, stored batches of 4 = G) is its file's slot.
        assert {n for n, f in zip(names, files, strict=True) if f is not None} == {"a"}
        assert all(f is None for n, f in zip(names, files, strict=True) if n == "c")
        assert "c" in names


def test_a_stream_over_a_mixed_mixture_serves_int32(twins: dict[str, tuple[Path, Path]]) -> None:
    mixed = _mixture({"a": twins["a"][1], "b": twins["b"][0], "c": twins["c"][1]})
    wide = _mixture({n: p[0] for n, p in twins.items()})
    with BatchStream(mixed, block_size=2) as s, BatchStream(wide, block_size=2) as w:
        assert s.dtype == "int32"
        for x, y in zip(s, w, strict=True):
            assert x.dtype == y.dtype == np.int32
            np.testing.assert_array_equal(x, y)


def test_wider_outputs_open_components_at_their_first_use(
    twins: dict[str, tuple[Path, Path]],
) -> None:
    mixed = _mixture({"a": twins["a"][0], "b": twins["b"][1], "c": twins["c"][1]})
    loader = BatchNativeLoader(mixed, dtype="int32", block_size=2)
    source = loader.source
    assert isinstance(source, MixtureSource)
    assert set(source._opened) == {0} and source.token_dtype == U32
    # A worker's copy serves what the parent's loader was built for, opening nothing more.
    twin = pickle.loads(pickle.dumps(source))
    assert twin.token_dtype == U32 and set(twin._opened) == {0}
    wide = _mixture({n: p[0] for n, p in twins.items()})
    want = _items(wide, dtype="int32")
    got = [[np.array(i)] for i in loader]
    for x, y in zip(got, want, strict=True):
        np.testing.assert_array_equal(x[0], y[0])
    twin.close()
    source.close()
    # "native" opens every component to learn the widest dtype.
    native = BatchNativeLoader(_mixture({n: p[1] for n, p in twins.items()}))
    assert native.dtype == "uint16" and set(native.source._opened) == {0, 1, 2}  # type: ignore[attr-defined]
    native.source.close()
