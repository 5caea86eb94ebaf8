"""Shared test helpers: deterministic records whose rows identify their source index."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import record_source

from zerobatch_core.order import BlockOrder


def records(n: int, seq_len: int, dtype: type = np.uint32) -> npt.NDArray[np.integer]:
    """Row ``i`` is ``i * seq_len + arange(seq_len)``: every token, so every row, is unique."""
    return (np.arange(n * seq_len, dtype=np.int64).reshape(n, seq_len)).astype(dtype)


def expected_batches(
    source: npt.NDArray[np.integer], batch_size: int, seed: int
) -> npt.NDArray[np.uint32]:
    """What the spec says a file written from ``source`` holds: ``[num_batches, B, T]``."""
    n, t = source.shape
    nb = n // batch_size
    idx = [record_source(p, n, seed) for p in range(nb * batch_size)]
    return np.asarray(source, dtype=np.uint32)[idx].reshape(nb, batch_size, t)


def require(module: str) -> Any:
    """Import a framework for an adapter test: skip locally if it is missing, fail in CI.

    ``make test`` sets ``ZEROBATCH_REQUIRE_FRAMEWORKS=1``, where a missing framework is an
    error and any skipped test fails the run (see ``conftest.py``).
    """
    if os.environ.get("ZEROBATCH_REQUIRE_FRAMEWORKS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def items_with_states(loader: Any) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A core loader's items for one pass, each with the loader state right after it."""
    for item in loader:
        yield item, loader.state_dict()


Region = tuple[int, int, int, int, int]


class ArraySource:
    """Slots held in a ``[n, B, T]`` array, in a file's serving order (SPEC.md section 8)."""

    def __init__(self, slots: npt.NDArray[np.uint32], seed: int, *, views: bool, fetches: bool):
        self.slots = slots
        self.path = "<array>"
        self.fetches = fetches
        self.views = views
        self.seed = seed
        self.closed = False
        self.announced: list[Region] = []
        self.whole_rows: list[bool] = []
        self.checked: list[int] = []

    @property
    def batch_size(self) -> int:
        return int(self.slots.shape[1])

    @property
    def seq_len(self) -> int:
        return int(self.slots.shape[2])

    @property
    def num_batches(self) -> int:
        return int(self.slots.shape[0])

    def order(self, block_size: int, seed: int, shuffle: bool) -> BlockOrder:
        return BlockOrder(self.num_batches, block_size, seed, shuffle)

    def identity(self) -> dict[str, Any]:
        return {"array": int(self.slots.sum())}

    def read_batch(self, index: int) -> npt.NDArray[np.uint32]:
        return self.slots[index]

    def read_region(self, index: int, r0: int, r1: int, lo: int, hi: int) -> Any:
        return self.slots[index, r0:r1, lo:hi]

    def view_batches(self, start: int, stop: int) -> npt.NDArray[np.uint32] | None:
        return self.slots[start:stop] if self.views else None

    def slot_file(self, index: int) -> None:
        return None

    def read_ahead(self, start: int, stop: int) -> None:
        pass

    def check_size(self, index: int = 0) -> None:
        self.checked.append(index)

    def ahead(
        self,
        steps: Iterator[Any],
        regions: Callable[[Any], Sequence[Region]],
        *,
        whole_rows: bool = False,
    ) -> Iterator[Any]:
        self.whole_rows.append(whole_rows)
        for step in steps:
            if self.fetches:
                self.announced.extend(regions(step))
            yield step

    def close(self) -> None:
        self.closed = True
