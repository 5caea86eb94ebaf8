"""``BatchNativeLoader``: block-shuffled, resumable, rank- and worker-aware iteration.

An epoch serves every batch once: blocks of ``block_size`` consecutive batches in the order
``SPEC.md`` pins (keyed by ``seed`` and ``epoch``), and batches in file order inside a block, so
reads stay sequential for the kernel's read-ahead while the block order changes every epoch.
The position in that order is a cursor ``(epoch, step)``; ``state_dict`` saves it as plain
integers and ``load_state_dict`` resumes at exactly the next batch, in any process.

A *pass* is one ``iter()`` over the loader: it serves the rest of the cursor's epoch. After the
epoch's last batch the cursor reads ``(epoch, num_batches)`` (epoch served, pass still open); it
moves to ``(epoch + 1, 0)`` when the pass ends, i.e. when the consumer asks for the item after the
last one. A loader restored from a state taken while a pass was open finishes that pass first
(with nothing left to serve) and then starts the next epoch, exactly as the uninterrupted run
would have: this is what lets a framework that restores its own pass (torchdata's
``StatefulDataLoader``) resume at the last batch of an epoch without replaying or skipping one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import islice
from typing import Any, Literal, NamedTuple, TypeGuard

import numpy as np
import numpy.typing as npt
from zerobatch_spec.layout import U32_MAX, U64_MAX

from .arguments import int_arg
from .buffers import BufferPool, convert_into
from .distributed import rank_rows
from .documents import document_layout
from .errors import StateError
from .order import BlockOrder
from .reader import BatchFileReader

OutputDType = Literal["uint32", "int32", "int64"]
OUTPUT_DTYPES: tuple[OutputDType, ...] = ("uint32", "int32", "int64")
STATE_FORMAT = "zerobatch.BatchNativeLoader"
STATE_VERSION = 1
U32Batch = npt.NDArray[np.uint32]
Item = Any  # one batch array, an (inputs, labels) pair of arrays, or a dict of arrays
DEFAULT_BLOCK_SIZE = 256
ORDER_KEYS = ("seed", "block_size", "shuffle", "num_batches", "batch_size", "seq_len", "file_seed")
"""State keys that must equal the loader's own for a state to load (``SPEC.md`` section 9)."""


class Position(NamedTuple):
    """A cursor value: the epoch of the next item and the steps of it already served.

    ``step >= num_batches`` means the epoch has been served and its pass is still open.
    """

    epoch: int
    step: int


def _u64(name: str, value: object) -> int:
    return int_arg(name, value, 0, U64_MAX)


class BatchNativeLoader:
    """Iterate an LLMBATCH file's batches in block-shuffled order, one epoch per pass.

    ``dtype`` picks the output: ``"uint32"`` (zero-copy view, the default), ``"int32"``
    (zero-copy view, exact for ids below 2**31) or ``"int64"`` (a copy per batch,
    in an array reused only once nothing refers to the previous batch made in it).
    ``seed`` defaults to the seed stored in the file. ``shuffle=False`` serves file order.
    With ``next_token=True`` each item is ``(inputs, labels)``: the batch without its last
    token (in ``dtype``) and without its first token (always int64, as cross-entropy wants).
    With ``bos_id`` set (packed rows whose documents start with that token), each item is a
    dict: ``tokens`` (or ``inputs`` and ``labels``) plus the document layout of the tokens (or
    inputs) as ``segment_ids``, ``positions`` and ``cu_seqlens`` (see ``documents.py``).

    Data parallelism: with ``world_size`` ranks, every rank walks the same order and gets its
    own ``batch_size // world_size`` contiguous rows of each batch, so one step of all ranks
    is one whole batch and no row is served twice. Worker processes of one rank split the
    steps instead (``split_workers``): worker ``w`` of ``k`` serves steps ``w, w + k, ...``, the
    round-robin order in which a PyTorch ``DataLoader`` collects them.

    The loader advances its cursor as it hands out items, and a pass that ends moves it to the
    next epoch, so a plain second ``for`` loop sees the next epoch's order. ``set_epoch(e)``
    moves to the start of epoch ``e`` (and keeps the position if ``e`` is already the current
    epoch, so the usual ``set_epoch`` loop resumes correctly). Moving the cursor from outside
    (``set_epoch``, ``load_state_dict``) ends a pass in progress.

    This is the core's low-level loader (NumPy arrays, explicit ranks, every argument checked).
    Training loops normally use a ``BatchStream`` (``stream.py``) or a framework adapter built on
    it, which add framework rank detection, read-ahead to devices and ``close``.

    >>> loader = BatchNativeLoader("train.batch", block_size=64)  # doctest: +SKIP
    >>> for epoch in range(3):  # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         train_step(batch)
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | BatchFileReader,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        dtype: OutputDType = "uint32",
        next_token: bool = False,
        rank: int = 0,
        world_size: int = 1,
        bos_id: int | None = None,
    ) -> None:
        if dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be 'uint32', 'int32' or 'int64', got {dtype!r}")
        block_size = int_arg("block_size", block_size, 1)
        seed = None if seed is None else _u64("seed", seed)
        epoch = _u64("epoch", epoch)
        bos_id = None if bos_id is None else int_arg("bos_id", bos_id, 0, U32_MAX)
        self.reader = path if isinstance(path, BatchFileReader) else BatchFileReader(path)
        if next_token and self.reader.seq_len < 2:
            raise ValueError(f"{self.reader.path}: next_token needs seq_len >= 2")
        self.rows = rank_rows(self.reader.batch_size, rank, world_size)
        self.block_size = block_size
        self.shuffle = bool(shuffle)
        self.seed = self.reader.seed if seed is None else seed
        self.dtype: OutputDType = dtype
        self.next_token = bool(next_token)
        self.bos_id = bos_id
        self.rank, self.world_size = rank, world_size
        self.order = BlockOrder(self.reader.num_batches, self.block_size, self.seed, self.shuffle)
        self._epoch, self._step = epoch, 0
        self._stride, self._phase = 1, 0
        self._serial = 0  # bumped by every new pass: an older pass still running ends
        # int64 outputs are written into reused arrays, never into one a caller still holds.
        rows, seq_len = self.batch_shape
        inputs_len = seq_len - 1 if self.next_token else seq_len
        self._inputs_pool = BufferPool((rows, inputs_len), np.int64) if dtype == "int64" else None
        self._labels_pool = BufferPool((rows, seq_len - 1), np.int64) if self.next_token else None

    # -- order -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Steps (batches of the file) per epoch, over all workers."""
        return self.reader.num_batches

    @property
    def epoch(self) -> int:
        """Epoch of the next item (of the open pass, if its epoch has just been served)."""
        return self._epoch

    @property
    def step(self) -> int:
        """Serving position of the next item in the current epoch."""
        return self._step

    @property
    def position(self) -> Position:
        """The cursor, ``(epoch, step)``."""
        return Position(self._epoch, self._step)

    @property
    def num_workers(self) -> int:
        """Worker processes the steps are split over (1 unless ``split_workers`` was called)."""
        return self._stride

    @property
    def worker(self) -> int:
        """This copy's worker index among ``num_workers``."""
        return self._phase

    @property
    def batch_shape(self) -> tuple[int, int]:
        """Shape of one rank's batch: ``(batch_size // world_size, seq_len)``."""
        return (self.rows.stop - self.rows.start, self.reader.seq_len)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is already the current epoch)."""
        e = _u64("epoch", epoch)
        if e != self._epoch:
            self._epoch, self._step = e, self._phase
            self._serial += 1

    def seek(self, position: Position) -> None:
        """Move the cursor to ``position`` (one of this copy's steps); ends a pass in progress."""
        self._epoch, self._step = position
        self._serial += 1

    def after(self, position: Position, steps: int = 1) -> Position:
        """The cursor after serving ``steps`` more items from ``position`` within its pass."""
        return Position(position.epoch, position.step + steps * self._stride)

    def next_pass(self, position: Position) -> Position:
        """Where a pass that ends at ``position`` leaves the cursor: the next epoch if served."""
        if position.step >= len(self):
            return Position(_next_epoch(position.epoch), self._phase)
        return position

    def split_workers(self, worker: int, num_workers: int) -> None:
        """Serve only steps ``worker, worker + num_workers, ...`` from the current cursor on.

        Called once in each worker process. A loader restored from a worker's own state keeps
        it; a state saved with a different worker layout cannot be split again.
        """
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} is outside num_workers {num_workers}")
        if (self._stride, self._phase) == (num_workers, worker):
            return
        if self._stride != 1:
            raise StateError(
                f"loader already split as worker {self._phase} of {self._stride}; cannot "
                f"become worker {worker} of {num_workers}"
            )
        self._stride, self._phase = num_workers, worker
        self._step += worker

    def epoch_order(self, epoch: int | None = None) -> npt.NDArray[np.int64]:
        """Batch indices of a whole epoch in serving order, all workers together."""
        return self.order.epoch_order(self._epoch if epoch is None else _u64("epoch", epoch))

    def _indices(self, epoch: int, start: int) -> Iterator[int]:
        """Batch indices of ``epoch`` from ``start`` on; each next block is read ahead."""
        spans = self.order.spans(epoch, start)
        current = next(spans, None)
        if current is not None:
            self.reader.read_ahead(current.start, current.stop)
        while current is not None:
            upcoming = next(spans, None)
            if upcoming is not None:  # read the next block while this one is served
                self.reader.read_ahead(upcoming.start, upcoming.stop)
            yield from range(current.start, current.stop)
            current = upcoming

    # -- iteration -------------------------------------------------------------------------
    def item(self, index: int) -> Item:
        """The item this loader serves for batch ``index`` (its rows, dtype and form)."""
        batch: U32Batch = self.reader.read_batch(index)[self.rows]
        if self.bos_id is not None:
            return self._documents_item(batch, self.bos_id)
        if not self.next_token:
            return self._convert(batch)
        return self._convert(batch[:, :-1]), convert_into(self._labels_pool, batch[:, 1:], np.int64)

    def _all_views(self) -> npt.NDArray[Any] | None:
        """Every batch as one ``[num_batches, rows, seq_len]`` view, when items are plain views."""
        if self.bos_id is not None or self.next_token or self.dtype == "int64":
            return None
        every = self.reader.read_batches(0, self.reader.num_batches)[:, self.rows]
        return every.view(np.int32) if self.dtype == "int32" else every

    def _convert(self, batch: U32Batch) -> npt.NDArray[Any]:
        """uint32 rows in the output dtype: views for uint32/int32, a pooled copy for int64."""
        if self.dtype == "uint32":
            return batch
        if self.dtype == "int32":
            return batch.view(np.int32)
        return convert_into(self._inputs_pool, batch, np.int64)

    def _documents_item(self, batch: U32Batch, bos_id: int) -> dict[str, npt.NDArray[Any]]:
        """The batch (or its next-token pair) with its document layout (``documents.py``)."""
        inputs = batch[:, :-1] if self.next_token else batch
        layout = document_layout(inputs, bos_id)
        item: dict[str, npt.NDArray[Any]] = (
            {
                "inputs": self._convert(inputs),
                "labels": convert_into(self._labels_pool, batch[:, 1:], np.int64),
            }
            if self.next_token
            else {"tokens": self._convert(batch)}
        )
        item["segment_ids"] = layout.segment_ids
        item["positions"] = layout.positions
        item["cu_seqlens"] = layout.cu_seqlens
        return item

    def __iter__(self) -> Iterator[Item]:
        """Serve the rest of the current epoch, advancing the cursor with every item.

        The pass ends, and the cursor moves to the next epoch, when the epoch is exhausted.
        Moving the cursor from outside (``set_epoch``, ``load_state_dict``) ends the pass.
        """
        self._serial += 1
        return self._pass(self._serial, self._epoch, self._step)

    def _pass(self, serial: int, epoch: int, start: int) -> Iterator[Item]:
        n, stride = len(self), self._stride
        expected = start
        if start < n:
            # Plain view outputs skip the per-item dispatch: one index into an [n, rows, T] view.
            views = self._all_views()
            for index in islice(self._indices(epoch, start), 0, None, stride):
                if self._step != expected or self._epoch != epoch or self._serial != serial:
                    return
                item = views[index] if views is not None else self.item(index)
                expected += stride
                self._step = expected
                yield item
        if (self._epoch, self._step, self._serial) == (epoch, expected, serial):  # not moved
            self._epoch, self._step = _next_epoch(epoch), self._phase

    # -- checkpointing ---------------------------------------------------------------------
    def state_dict(self, position: Position | None = None) -> dict[str, Any]:
        """The cursor (or ``position``) and what it depends on, as JSON-serialisable values."""
        h = self.reader.header
        epoch, step = self.position if position is None else position
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": epoch,
            "step": step,
            "num_workers": self._stride,
            "worker": self._phase,
            "seed": self.seed,
            "block_size": self.block_size,
            "shuffle": self.shuffle,
            "num_batches": h.num_batches,
            "batch_size": h.batch_size,
            "seq_len": h.seq_len,
            "file_seed": h.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the cursor saved by ``state_dict``; the order parameters must match.

        The rank and world size may differ from the saving run's: the cursor counts steps.
        """
        e, step, workers, worker = self.check_state(state)
        self._epoch, self._step = e, step
        self._stride, self._phase = workers, worker
        self._serial += 1

    def check_state(self, state: object) -> tuple[int, int, int, int]:
        """``(epoch, step, num_workers, worker)`` of a state that fits this loader.

        Raises ``StateError`` naming the first key that does not fit.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError(f"not a {STATE_FORMAT} state: {state!r:.200}")
        if state.get("version") != STATE_VERSION:
            raise StateError(f"unsupported loader state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in ORDER_KEYS:
            if state.get(key) != mine[key]:
                raise StateError(
                    f"{self.reader.path}: state has {key}={state.get(key)!r} but this loader "
                    f"has {key}={mine[key]!r}"
                )
        e, step = state.get("epoch"), state.get("step")
        workers, worker = state.get("num_workers", 1), state.get("worker", 0)
        if not _is_int(e) or not 0 <= e <= U64_MAX:
            raise StateError(f"state epoch {e!r} is not an integer in [0, 2**64 - 1]")
        if not _is_int(workers) or workers < 1 or not _is_int(worker):
            raise StateError(f"state num_workers={workers!r}, worker={worker!r} are invalid")
        if not 0 <= worker < workers:
            raise StateError(f"state worker {worker} is outside num_workers {workers}")
        # A worker's next step can lie past the end of the epoch (nothing left for it).
        if not _is_int(step) or not 0 <= step < len(self) + workers:
            raise StateError(f"state step {step!r} is outside [0, {len(self)}]")
        if (step - worker) % workers:
            raise StateError(f"state step {step} is not one of worker {worker}'s steps")
        return e, step, workers, worker


def _next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: epochs are u64 and wrap, so the cursor stays representable."""
    return (epoch + 1) & U64_MAX


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
