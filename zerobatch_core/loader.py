"""``BatchNativeLoader``: block-shuffled, resumable iteration over one LLMBATCH file.

An epoch serves every batch once: blocks of ``block_size`` consecutive batches in the order
``SPEC.md`` pins (keyed by ``seed XOR epoch``), and batches in file order inside a block, so
reads stay sequential for the kernel's read-ahead while the block order changes every epoch.
The position in that order is a cursor ``(epoch, step)``; ``state_dict`` saves it as plain
integers and ``load_state_dict`` resumes at exactly the next batch, in any process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from zerobatch_spec.shuffle import MASK64

from .errors import StateError
from .order import BlockOrder
from .reader import BatchFileReader

OutputDType = Literal["uint32", "int32", "int64"]
STATE_FORMAT = "zerobatch.BatchNativeLoader"
STATE_VERSION = 1
DEFAULT_BLOCK_SIZE = 256


def _u64(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    v = int(value)
    if not 0 <= v <= MASK64:
        raise ValueError(f"{name} must be in [0, 2**64), got {v}")
    return v


class BatchNativeLoader:
    """Iterate an LLMBATCH file's batches in block-shuffled order, one epoch per pass.

    ``dtype`` picks the output: ``"uint32"`` (zero-copy view, the default), ``"int32"``
    (zero-copy view, exact for ids below 2**31) or ``"int64"`` (a new array per batch).
    ``seed`` defaults to the seed stored in the file. ``shuffle=False`` serves file order.

    The loader advances its cursor as it hands out batches: after the last batch of epoch ``e``
    the cursor is ``(e + 1, 0)``, so a plain second ``for`` loop sees the next epoch's order.
    ``set_epoch(e)`` moves to the start of epoch ``e`` (and keeps the position if ``e`` is
    already the current epoch, so the usual ``set_epoch`` loop resumes correctly).

    >>> loader = BatchNativeLoader("train.batch", block_size=64)  # doctest: +SKIP
    >>> for epoch in range(3):  # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         train_step(batch)
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | BatchFileReader,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        dtype: OutputDType = "uint32",
    ) -> None:
        self.reader = path if isinstance(path, BatchFileReader) else BatchFileReader(path)
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
            raise TypeError(f"block_size must be an integer, got {type(block_size).__name__}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if dtype not in ("uint32", "int32", "int64"):
            raise ValueError(f"dtype must be 'uint32', 'int32' or 'int64', got {dtype!r}")
        self.block_size = int(block_size)
        self.shuffle = bool(shuffle)
        self.seed = _u64("seed", self.reader.seed if seed is None else seed)
        self.dtype: OutputDType = dtype
        self._epoch = _u64("epoch", epoch)
        self._step = 0
        self.order = BlockOrder(self.reader.num_batches, self.block_size, self.seed, self.shuffle)

    # -- order -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch."""
        return self.reader.num_batches

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._epoch

    @property
    def step(self) -> int:
        """Batches already served in the current epoch."""
        return self._step

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is already the current epoch)."""
        e = _u64("epoch", epoch)
        if e != self._epoch:
            self._epoch, self._step = e, 0

    def epoch_order(self, epoch: int | None = None) -> npt.NDArray[np.int64]:
        """Batch indices of a whole epoch in serving order (default: the current epoch)."""
        return self.order.epoch_order(self._epoch if epoch is None else _u64("epoch", epoch))

    def _indices(self, epoch: int, start: int) -> Iterator[int]:
        """Batch indices of ``epoch`` from ``start`` on; each next block is read ahead."""
        spans = self.order.spans(epoch, start)
        current = next(spans, None)
        if current is not None:
            self.reader.prefetch(current.start, current.stop)
        while current is not None:
            upcoming = next(spans, None)
            if upcoming is not None:  # read the next block while this one is served
                self.reader.prefetch(upcoming.start, upcoming.stop)
            yield from range(current.start, current.stop)
            current = upcoming

    # -- iteration -------------------------------------------------------------------------
    def _read(self, index: int) -> npt.NDArray[Any]:
        if self.dtype == "uint32":
            return self.reader.read_batch(index)
        if self.dtype == "int32":
            return self.reader.read_batch_int32(index)
        return self.reader.read_batch_int64(index)

    def __iter__(self) -> Iterator[npt.NDArray[Any]]:
        """Serve the rest of the current epoch, advancing the cursor with every batch.

        Moving the cursor from outside (``set_epoch``, ``load_state_dict``) ends the pass.
        """
        epoch, n = self._epoch, self.reader.num_batches
        expected = self._step
        for index in self._indices(epoch, expected):
            if (self._epoch, self._step) != (epoch, expected):
                return
            batch = self._read(index)
            expected += 1
            self._step = expected
            if expected == n:
                self._epoch, self._step = epoch + 1, 0
            yield batch

    # -- checkpointing ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor and what it depends on, as JSON-serialisable plain values."""
        h = self.reader.header
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "step": self._step,
            "seed": self.seed,
            "block_size": self.block_size,
            "shuffle": self.shuffle,
            "num_batches": h.num_batches,
            "batch_size": h.batch_size,
            "seq_len": h.seq_len,
            "file_seed": h.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the cursor saved by ``state_dict``; the order parameters must match."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError(f"not a {STATE_FORMAT} state: {state!r:.200}")
        if state.get("version") != STATE_VERSION:
            raise StateError(f"unsupported loader state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in (
            "seed",
            "block_size",
            "shuffle",
            "num_batches",
            "batch_size",
            "seq_len",
            "file_seed",
        ):
            if state.get(key) != mine[key]:
                raise StateError(
                    f"{self.reader.path}: state has {key}={state.get(key)!r} but this loader "
                    f"has {key}={mine[key]!r}"
                )
        epoch, step = state.get("epoch"), state.get("step")
        e = _u64("epoch", epoch)
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= len(self):
            raise StateError(f"state step {step!r} is outside [0, {len(self)}]")
        if step == len(self) and step > 0:
            e, step = e + 1, 0  # a finished epoch is the start of the next
        self._epoch, self._step = _u64("epoch", e), step
