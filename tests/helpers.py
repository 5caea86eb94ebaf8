"""Shared test helpers: deterministic records whose rows identify their source index."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import record_source


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
