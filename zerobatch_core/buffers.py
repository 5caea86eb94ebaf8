"""Reused output arrays for the converting (int64) paths.

A fresh 128 KiB array per batch costs more than the conversion into it: the allocator hands
large blocks back to the kernel when they are freed, so every new batch faults in fresh pages.
A ``BufferPool`` keeps a few arrays and hands one out again only when nothing outside the pool
refers to it any more (no batch, view, or tensor made from it is alive), so reuse can never
overwrite data a caller still holds: a caller who keeps every batch simply gets new arrays.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import numpy.typing as npt

DEFAULT_CAPACITY = 8


class BufferPool:
    """Arrays of one shape and dtype, reused once their previous holder has let go of them.

    Whether an array is free is read from its reference count: a view, a slice or a
    ``torch.from_numpy`` tensor of it holds a reference to it, so any of those keeps it busy.
    Up to ``capacity`` arrays are kept; when all are busy a new, unpooled array is returned.
    """

    def __init__(
        self, shape: tuple[int, ...], dtype: npt.DTypeLike, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.capacity = capacity
        self._buffers: list[npt.NDArray[Any]] = []
        # References an idle pooled array has, as counted by ``_refs`` (the pool's list entry
        # plus the call's own argument); measured rather than assumed.
        probe: list[npt.NDArray[Any]] = [np.empty(0, self.dtype)]
        self._idle = _refs(probe, 0)

    def take(self) -> npt.NDArray[Any]:
        """An array of the pool's shape and dtype that nobody else holds (contents undefined)."""
        buffers = self._buffers
        for i in range(len(buffers)):
            if _refs(buffers, i) <= self._idle:
                return buffers[i]
        array = np.empty(self.shape, self.dtype)
        if len(buffers) < self.capacity:
            buffers.append(array)
        return array

    def __len__(self) -> int:
        """Arrays kept for reuse."""
        return len(self._buffers)


def _refs(buffers: list[npt.NDArray[Any]], i: int) -> int:
    return sys.getrefcount(buffers[i])


def convert_into(
    pool: BufferPool | None, source: npt.NDArray[Any], dtype: npt.DTypeLike
) -> npt.NDArray[Any]:
    """``source`` converted to ``dtype`` in a pooled array of its shape (or a new one)."""
    if pool is None or pool.shape != source.shape:
        return source.astype(dtype)
    out = pool.take()
    np.copyto(out, source, casting="safe")
    return out
