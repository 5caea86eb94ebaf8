"""``BatchNativeLoader``: the order, the cursor and the slicing of a file's or a dataset's batches.

An epoch walks every stored batch once: blocks of ``block_size`` consecutive batches in the
order ``SPEC.md`` pins (section 8 for a file, 14 for a dataset, where blocks never cross a
shard), and batches in storage order inside a block, so reads stay sequential for the kernel's
read-ahead while the block order changes every epoch. Training consumes that sequence of
samples one *step* (a global batch of ``global_batch_size`` samples, by default one stored
batch) at a time, and each reader serves only its slice of every step (``slicing.py``: data-
and context-parallel coordinates). The position is a cursor ``(epoch, step)``; ``state_dict``
saves it as plain integers with what it depends on, and ``load_state_dict`` resumes at exactly
the next step, in any process, with another number of ranks, or with a global batch size a
multiple or divisor of the saved one.

A *pass* is one ``iter()`` over the loader: it serves the rest of the cursor's epoch. After the
epoch's last step the cursor reads ``(epoch, steps)`` (epoch served, pass still open); it moves
to ``(epoch + 1, 0)`` when the pass ends, i.e. when the consumer asks for the item after the
last one. A loader restored from a state taken while a pass was open finishes that pass first
(with nothing left to serve) and then starts the next epoch, exactly as the uninterrupted run
would have: this is what lets a framework that restores its own pass (torchdata's
``StatefulDataLoader``) resume at the last batch of an epoch without replaying or skipping one.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple, TypeGuard

import numpy as np
import numpy.typing as npt
from zerobatch_spec import TOKEN_BYTES, U32_MAX, U64_MAX

from ..arguments import int_arg
from ..datasets.dataset import Verify
from ..datasets.remote import RemoteVerify
from ..errors import StateError
from ..order import Order
from .buffers import BufferPool, ChunkStage, convert_into
from .documents import document_layout
from .slicing import Slicing
from .sources import BatchSource, Region, open_reader

OutputDType = Literal["uint32", "int32", "int64"]
LabelDType = Literal["int64", "uint32"]
OUTPUT_DTYPES: tuple[OutputDType, ...] = ("uint32", "int32", "int64")
STATE_FORMAT = "zerobatch.BatchNativeLoader"
STATE_VERSION = 1
U32Batch = npt.NDArray[np.uint32]
Item = Any  # one batch array, an (inputs, labels) pair of arrays, or a dict of arrays
DEFAULT_BLOCK_SIZE = 256
ORDER_KEYS = ("seed", "block_size", "shuffle", "num_batches", "batch_size", "seq_len", "file_seed")
"""State keys that must equal the loader's own for a state to load (``SPEC.md`` section 9)."""
CHUNK_STEPS = 8
"""Consecutive steps the int64 stage converts with one copy (``[8, 32, 512]``: 1 MiB of int64,
which stays in the caches; 64 steps per chunk measured 0.87x and 256 steps 0.66x of 8)."""
CHUNK_DEPTH = 3
"""Chunks the int64 stage keeps converted ahead of the caller."""
CHUNK_SPARE = 4
"""Chunk buffers pooled beyond ``CHUNK_DEPTH``: the one being filled, the caller's current
chunk, and chunks whose last items a caller or a device stage still holds."""

Source = BatchSource
Piece = tuple[int, int, int]  # stored batch index, first row, end row


class Position(NamedTuple):
    """A cursor value: the epoch of the next item and the steps of it already served.

    ``step >= steps per epoch`` means the epoch has been served and its pass is still open.
    """

    epoch: int
    step: int


_INFINITY = float("inf")
"""Sorts after every step number: ``(step, _INFINITY)`` follows every range that starts at
``step``, whatever its end."""

RESTART_GAP = 5000
"""Serving positions a pass walks through the order to reach its next step; a step further
ahead (a skipped range, a worker's share of a long split) starts the order anew there."""


def _u64(name: str, value: object) -> int:
    return int_arg(name, value, 0, U64_MAX)


def normalize_skips(skip_steps: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """``((first, end), ...)`` of global steps to skip, checked, sorted and merged."""
    ranges = []
    for item in skip_steps:
        if isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError(f"skip_steps entries must be (first, end) pairs, got {item!r}")
        a = int_arg("skip_steps first step", item[0], 0)
        b = int_arg("skip_steps end step", item[1], 0)
        if b <= a:
            raise ValueError(f"skip_steps range ({a}, {b}) is empty: its end must exceed its first")
        ranges.append((a, b))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return tuple(merged)


def source_identity(source: Source) -> dict[str, Any]:
    """What a state records about its source, so that it loads into that source only: its
    ``identity()`` (a dataset's manifest digest; a file's size, header digest and a sample of
    ``FINGERPRINT_SLOTS`` slots, ``files.reader.file_identity``)."""
    return source.identity()


LOADER_KINDS: list[tuple[Callable[[object], bool], type[BatchNativeLoader]]] = []
"""``(test, subclass)``: ``BatchNativeLoader(source, ...)`` builds the first ``subclass`` whose
``test(source)`` holds (``register_loader_kind``)."""


def register_loader_kind(test: Callable[[object], bool], kind: type[BatchNativeLoader]) -> None:
    """Have ``BatchNativeLoader(source, ...)`` build a ``kind`` for every source ``test``
    accepts: a subclass that serves a kind of source through the same protocol with resume
    rules of its own (``mixture_loader.MixtureLoader``), chosen where the user names only the
    core loader."""
    LOADER_KINDS.append((test, kind))


class BatchNativeLoader:
    """Iterate a file's or a dataset's batches in block-shuffled order, one epoch per pass.

    ``path`` is an LLMBATCH file, a dataset directory (``dataset.py``; ``verify`` sets its
    checksum checks), a URL or a live dataset (``sources.open_reader``: ``s3://``, ``gs://``,
    ``az://``, ``http(s)://``, ``file://``; read as byte ranges of this rank's share, see
    ``remote.py``) or an open reader of any of them. ``dtype`` picks the output: ``"uint32"``
    (zero-copy view, the default), ``"int32"`` (zero-copy view, exact for ids below 2**31) or
    ``"int64"`` (a copy per batch, in an array reused only once nothing refers to the previous
    batch made in it). ``seed`` defaults to the file's (or the dataset's) seed.
    ``shuffle=False`` serves storage order. With ``next_token=True`` each item is ``(inputs,
    labels)``: the samples without their last token (in ``dtype``) and without their first
    (int64, as cross-entropy wants; ``label_dtype="uint32"`` serves them unconverted, views of
    the file where the step allows, for a caller that widens them elsewhere, e.g. on a device).
    With ``bos_id`` set (packed rows whose documents
    start with that token), each item is a dict: ``tokens`` (or ``inputs`` and ``labels``)
    plus the document layout of the tokens (or inputs) as ``segment_ids``, ``positions`` and
    ``cu_seqlens`` (see ``documents.py``).

    Parallelism (``slicing.py``): every rank walks the same order. ``rank`` of ``world_size``
    (data parallel) gets its own ``global_batch_size // world_size`` samples of each step;
    ``context_rank`` of ``context_size`` (context parallel) gets token chunk ``context_rank``
    of them, or with ``zigzag`` chunks ``c`` and ``2C - 1 - c`` of ``2C``. One step of all
    ranks is exactly one global batch. ``global_batch_size`` (default: the stored batch size)
    may be a multiple of it (a step spans several stored batches; ``world_size *
    batch_size`` gives each rank whole stored batches) or a divisor (one stored batch serves
    several steps). ``skip_steps`` lists ``(first, end)`` ranges of global steps (``epoch *
    len(loader) + step``) that are not served; every other step is unchanged. Worker
    processes of one rank split the served steps instead (``split_workers``): worker ``w`` of
    ``k`` serves the ``w``-th, ``(w + k)``-th, ... from the cursor on, the round-robin order in
    which a PyTorch ``DataLoader`` collects them.

    The loader advances its cursor as it hands out items, and a pass that ends moves it to the
    next epoch, so a plain second ``for`` loop sees the next epoch's order. ``set_epoch(e)``
    moves to the start of epoch ``e`` (and keeps the position if ``e`` is already the current
    epoch, so the usual ``set_epoch`` loop resumes correctly). Moving the cursor from outside
    (``set_epoch``, ``load_state_dict``) ends a pass in progress.

    Conversions (int64 batches, and the int64 labels of ``next_token``) are made by a
    background thread a few steps ahead: it converts ``CHUNK_STEPS`` consecutive steps of a
    block with one copy into a pooled chunk buffer, and items are views of that chunk (inputs
    and labels both of one ``[rows, T]`` row block). A chunk buffer is reused only once no item
    made from it is alive, so batches a caller keeps are never overwritten (keeping one item
    keeps its whole chunk in memory). The cursor still counts only the items handed out; the
    thread stops when the pass ends or the cursor is moved. Steps made of several stored
    batches or column ranges convert on the caller's thread into pooled arrays.

    This is the core's low-level loader (NumPy arrays, explicit coordinates). Training loops
    normally use a ``BatchStream`` (``stream.py``) or a framework adapter built on it.

    >>> loader = BatchNativeLoader("train.batch", block_size=64)  # doctest: +SKIP
    >>> for epoch in range(3):  # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         train_step(batch)
    """

    def __new__(cls, path: object = None, *args: Any, **kwargs: Any) -> BatchNativeLoader:
        """A registered subclass for the sources it serves (``register_loader_kind``)."""
        if cls is BatchNativeLoader:
            for test, kind in LOADER_KINDS:
                if test(path):
                    return super().__new__(kind)
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike[str] | Source,
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
        context_rank: int = 0,
        context_size: int = 1,
        zigzag: bool = False,
        global_batch_size: int | None = None,
        skip_steps: Iterable[Sequence[int]] = (),
        slicing: Slicing | None = None,
        verify: Verify | RemoteVerify | None = None,
        label_dtype: LabelDType = "int64",
    ) -> None:
        if dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be 'uint32', 'int32' or 'int64', got {dtype!r}")
        block_size = int_arg("block_size", block_size, 1)
        seed = None if seed is None else _u64("seed", seed)
        epoch = _u64("epoch", epoch)
        bos_id = None if bos_id is None else int_arg("bos_id", bos_id, 0, U32_MAX)
        if slicing is None:
            slicing = Slicing(rank, world_size, context_rank, context_size, 1, bool(zigzag))
        self.skip_steps = normalize_skips(skip_steps)
        opened = not isinstance(path, BatchSource)
        source = path if isinstance(path, BatchSource) else open_reader(path, verify=verify)
        self.source = self.reader = source
        try:
            if next_token and source.seq_len < 2:
                raise ValueError(f"{source.path}: next_token needs seq_len >= 2")
            self.dtype: OutputDType = dtype
            self.next_token = bool(next_token)
            if label_dtype not in ("int64", "uint32"):
                raise ValueError(f"label_dtype must be 'int64' or 'uint32', got {label_dtype!r}")
            self.label_dtype: LabelDType = label_dtype
            self.bos_id = bos_id
            self.width = source.seq_len - 1 if self.next_token else source.seq_len
            if bos_id is not None and not slicing.whole_rows:
                raise ValueError(
                    "bos_id needs whole rows in order: the document layout of a token chunk "
                    "depends on the tokens before it (use context_size=1 with bos_id)"
                )
            self.slicing = slicing
            self._set_global_batch(global_batch_size)
        except BaseException:
            if opened:
                source.close()
            raise
        self.rank, self.world_size = slicing.dp_rank, slicing.dp_size
        self.block_size = block_size
        self.shuffle = bool(shuffle)
        self.seed = source.seed if seed is None else seed
        self.order: Order = source.order(block_size, self.seed, self.shuffle)
        self._epoch, self._step = epoch, 0
        self._stride, self._phase, self._origin = 1, 0, Position(epoch, 0)
        self._serial = 0  # bumped by every new pass: an older pass still running ends
        self.bytes_read = 0
        """Token bytes this loader has read from its source (its share of each step)."""
        self._identity: dict[str, Any] | None = None

    def _set_global_batch(self, global_batch_size: int | None) -> None:
        b = self.source.batch_size
        g = b if global_batch_size is None else int_arg("global_batch_size", global_batch_size, 1)
        self.slicing.check(g, b, self.width)
        self.global_batch_size = g
        self.per_step = g // self.slicing.dp_size
        first = self.slicing.dp_rank * self.per_step
        self.rows = slice(first, first + self.per_step)  # of the step's samples
        self.columns = self.slicing.columns(self.width)
        # One stored batch per step and one column range: items are views of one batch.
        self._simple = g == b and len(self.columns) == 1
        extra = 1 if self.next_token else 0  # labels reach one token past each range
        read = sum(hi - lo + extra for lo, hi in self.columns)
        self.bytes_per_step = self.per_step * read * TOKEN_BYTES
        self.batch_shape = (self.per_step, sum(hi - lo for lo, hi in self.columns))
        shape = self.batch_shape
        self._inputs_pool = BufferPool(shape, np.int64) if self.dtype == "int64" else None
        wide_labels = self.next_token and self.label_dtype == "int64"
        self._labels_pool = BufferPool(shape, np.int64) if wide_labels else None
        # Simple steps that convert are made by a ChunkStage: the converted columns of a step's
        # rows, i.e. its region plus the labels' extra token, or the labels alone for views.
        self._chunked = self._simple and (self.dtype == "int64" or wide_labels)
        if self.source.fetches:  # fetches dominate: convert on the caller
            self._chunked = False
        lo, hi = self.columns[0]
        extra = 1 if wide_labels else 0
        self._chunk_columns = (lo + (extra if self.dtype != "int64" else 0), hi + extra)
        self._chunk_pool: tuple[int, BufferPool] | None = None  # (pid, pool)
        self._stage: ChunkStage[Any] | None = None

    # -- order -----------------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        """Steps per epoch, over all workers: the epoch's samples over the global batch size
        (a Python integer: a live dataset's endless epoch has more than ``len`` can return)."""
        return self.source.num_batches * self.source.batch_size // self.global_batch_size

    def __len__(self) -> int:
        """``steps_per_epoch`` (``len`` raises ``OverflowError`` beyond ``sys.maxsize``)."""
        return self.steps_per_epoch

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

    def global_step(self, position: Position | None = None) -> int:
        """``epoch * steps_per_epoch + step`` of ``position`` (default: the cursor)."""
        epoch, step = self.position if position is None else position
        return epoch * self.steps_per_epoch + step

    def _served_steps(
        self, epoch: int, start: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> Iterator[int]:
        """Steps of ``epoch`` from ``start`` on that ``skips`` (default: this loader's) do not
        skip, continuing past the end of the epoch (where nothing is skipped). A skipped range
        is jumped over, not walked: the cost of each step is one search of the ranges."""
        if not (self.skip_steps if skips is None else skips):
            yield from itertools.count(start)
            return
        step = start
        while True:
            step = self._nth_served(epoch, step, 0, skips)
            _, following = self._skip_at(epoch, step, skips)
            if following <= step:  # past the epoch's end: every step from here on
                yield from itertools.count(step)
                return
            yield from range(step, following)  # served up to the next skipped range
            step = following

    def _skip_at(
        self, epoch: int, step: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> tuple[int, int]:
        """``(end, next)``: where the skipped range holding ``step`` of ``epoch`` ends (``step``
        if none holds it) and where the next one begins (the epoch's end if none), both as
        steps of ``epoch`` and at most the epoch's end: past it nothing is skipped."""
        ranges = self.skip_steps if skips is None else skips
        n = self.steps_per_epoch
        if step >= n:
            return step, step
        base = epoch * n
        i = bisect.bisect_right(ranges, (base + step, _INFINITY)) - 1
        if i >= 0 and ranges[i][0] <= base + step < ranges[i][1]:
            return min(ranges[i][1] - base, n), step
        following = ranges[i + 1][0] - base if i + 1 < len(ranges) else n
        return step, min(following, n)

    def _nth_served(
        self, epoch: int, start: int, m: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> int:
        """The ``m``-th (from 0) served step of ``epoch`` at or after ``start``, in as many
        searches as skipped ranges it passes (never one per step)."""
        step = start
        while True:
            end, following = self._skip_at(epoch, step, skips)
            if end > step:  # inside a skipped range: jump past it
                step = end
                continue
            if following <= step or m < following - step:  # past the epoch, or before a range
                return step + m
            m -= following - step
            step = following

    def _count_served(
        self, epoch: int, lo: int, hi: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> int:
        """Served steps of ``epoch`` in ``[lo, hi)``: two searches of the skipped ranges."""
        ranges = self.skip_steps if skips is None else skips
        n = self.steps_per_epoch
        base = epoch * n
        below = _SkipTotals.of(ranges)
        a, b = base + min(lo, n), base + min(max(lo, hi), n)
        return max(0, hi - lo) - (below(b) - below(a))

    def _owned(self, epoch: int, start: int) -> Iterator[int]:
        """This copy's steps of ``epoch`` from ``start`` on (past the end: where its cursor
        would go next), the worker split counted over served steps from the split's origin.
        Computed, not walked: each step costs a search of the skipped ranges."""
        if self._stride == 1:
            return self._served_steps(epoch, start)
        return self._split_steps(epoch, start)

    def _split_steps(self, epoch: int, start: int) -> Iterator[int]:
        """This worker's steps from ``start`` on: its first, then every ``k``-th served one."""
        k = self._stride
        step = self._first_owned(epoch, start, k, self._phase)
        while True:
            yield step
            step = self._nth_served(epoch, step + 1, k - 1)

    def _first_owned(
        self,
        epoch: int,
        start: int,
        workers: int,
        worker: int,
        skips: tuple[tuple[int, int], ...] | None = None,
        origin: int | None = None,
    ) -> int:
        """The first step at or after ``start`` that worker ``worker`` of ``workers`` serves:
        the served steps from the split's origin are dealt out round-robin."""
        if origin is None:
            origin = self._origin.step if self._origin.epoch == epoch else 0
        start = max(start, origin)
        j = self._count_served(epoch, origin, start, skips)  # served steps before start
        return self._nth_served(epoch, start, (worker - j) % workers, skips)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is already the current epoch)."""
        e = _u64("epoch", epoch)
        if e != self._epoch:
            self._epoch, self._step = e, next(self._owned(e, 0))
            self._new_serial()

    def seek(self, position: Position) -> None:
        """Move the cursor to ``position`` (one of this copy's steps); ends a pass in progress."""
        self._epoch, self._step = position
        self._new_serial()

    def after(self, position: Position, steps: int = 1) -> Position:
        """The cursor after serving ``steps`` more items from ``position`` within its pass."""
        if self._stride == 1 and not self.skip_steps:
            return Position(position.epoch, position.step + steps)
        epoch, step = position
        if self._stride == 1:
            return Position(epoch, self._nth_served(epoch, step, steps))
        first = self._first_owned(epoch, step, self._stride, self._phase)
        return Position(epoch, self._nth_served(epoch, first, steps * self._stride))

    def next_pass(self, position: Position) -> Position:
        """Where a pass that ends at ``position`` leaves the cursor: the next epoch if served."""
        if next(self._owned(*position)) >= self.steps_per_epoch:
            e = _next_epoch(position.epoch)
            return Position(e, next(self._owned(e, 0)))
        return position

    def split_workers(self, worker: int, num_workers: int) -> None:
        """Serve only every ``num_workers``-th served step, from the ``worker``-th on.

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
        self._stride, self._phase, self._origin = num_workers, worker, self.position
        self._step = next(self._owned(self._epoch, self._step))

    def epoch_order(self, epoch: int | None = None) -> npt.NDArray[np.int64]:
        """Stored batch indices of a whole epoch in serving order."""
        return self.order.epoch_order(self._epoch if epoch is None else _u64("epoch", epoch))

    def _indices(self, epoch: int, start: int) -> Iterator[int]:
        """Stored batch indices from position ``start`` on; each next block is read ahead and
        its file checked once (a file truncated since it was opened raises here)."""
        for block in self._blocks(epoch, start):
            yield from block

    def _blocks(self, epoch: int, start: int) -> Iterator[range]:
        """The stored indices of each block from position ``start`` on, the next block read
        ahead while one is served and each block's file checked before it is."""
        spans = self.order.spans(epoch, start)
        current = next(spans, None)
        if current is not None:
            self._check_size(current.start)
            self.source.read_ahead(current.start, current.stop)
        while current is not None:
            upcoming = next(spans, None)
            if upcoming is not None:  # read the next block while this one is served
                self.source.read_ahead(upcoming.start, upcoming.stop)
            yield range(current.start, current.stop)
            if upcoming is not None:
                self._check_size(upcoming.start)
            current = upcoming

    def _check_size(self, index: int) -> None:
        """Raise if the file holding stored batch ``index`` shrank since it was opened."""
        self.source.check_size(index)

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Item]:
        """Serve the rest of the current epoch, advancing the cursor with every item.

        The pass ends, and the cursor moves to the next epoch, when the epoch is exhausted.
        Moving the cursor from outside (``set_epoch``, ``load_state_dict``) ends the pass.
        """
        self._new_serial()
        return self._pass(self._serial, self._epoch, self._step)

    def _new_serial(self) -> None:
        """End the pass in progress (its generator sees a new serial) and its chunk stage."""
        self._serial += 1
        stage, self._stage = self._stage, None
        if stage is not None:
            stage.close()

    def _pass(self, serial: int, epoch: int, start: int) -> Iterator[Item]:
        n = self.steps_per_epoch
        owned = self._owned(epoch, start)
        step = next(owned)
        views = self._all_views() if step < n and not self._chunked else None
        if step < n and self._chunked:
            yield from self._chunked_pass(serial, epoch, step, owned)
        elif views is not None and self._stride == 1 and not self.skip_steps:
            # Every step served, one view each: index the whole-file view block by block,
            # with no per-step generator work (the loop's cost is this loop's own).
            per_step = self.bytes_per_step
            for block in self._blocks(epoch, step):
                for index in block:
                    if self._serial != serial or self._epoch != epoch:
                        return
                    step += 1
                    self._step = step
                    self.bytes_read += per_step
                    yield views[index]
                    if self._serial != serial:
                        return
        elif step < n:
            for pieces, step_after in self._ahead(self._pieces(epoch, step, owned)):
                if self._serial != serial or self._epoch != epoch:
                    return
                if views is not None:
                    item = views[pieces[0][0]]
                    self.bytes_read += self.bytes_per_step
                else:
                    item = self._item(pieces)
                self._step = step_after
                yield item
                if self._serial != serial:
                    return
        if (self._epoch, self._serial) == (epoch, serial):  # not moved from outside
            e = _next_epoch(epoch)
            self._epoch, self._step = e, next(self._owned(e, 0))

    def _chunked_pass(
        self, serial: int, epoch: int, step: int, owned: Iterator[int]
    ) -> Iterator[Item]:
        """The items of a pass whose conversions a ``ChunkStage`` makes ahead, in chunks."""
        stage = ChunkStage(self._chunks(epoch, step, owned), CHUNK_DEPTH)
        self._stage = stage
        try:
            for chunk in stage:
                for item, step_after in chunk:
                    if self._serial != serial or self._epoch != epoch:
                        return
                    self.bytes_read += self.bytes_per_step
                    self._step = step_after
                    yield item
                    if self._serial != serial:
                        return
                del chunk, item  # the chunk's buffer is free once the caller lets go too
        finally:
            stage.close()
            if self._stage is stage:
                self._stage = None

    def _chunks(
        self, epoch: int, step: int, owned: Iterator[int]
    ) -> Iterator[list[tuple[Item, int]]]:
        """Runs on the stage's thread: lists of ``(item, step after it)`` for runs of at most
        ``CHUNK_STEPS`` steps whose stored batches are evenly spaced (consecutive in a block,
        or a worker's share of it), each run converted with one copy."""
        if self._stride == 1 and not self.skip_steps:  # every step served: cut blocks in runs
            for block in self._blocks(epoch, step):
                for first in range(block.start, block.stop, CHUNK_STEPS):
                    k = min(CHUNK_STEPS, block.stop - first)
                    yield self._make_chunk([(first + j, step + j + 1) for j in range(k)])
                    step += k
            return
        run: list[tuple[int, int]] = []  # (stored index, step after it)
        for pieces, step_after in self._pieces(epoch, step, owned):
            index = pieces[0][0]
            if run and not _continues(run, index):
                yield self._make_chunk(run)
                run = []
            run.append((index, step_after))
            if len(run) == CHUNK_STEPS:
                yield self._make_chunk(run)
                run = []
        if run:
            yield self._make_chunk(run)

    def _make_chunk(self, run: list[tuple[int, int]]) -> list[tuple[Item, int]]:
        """Convert one run of steps into a pooled chunk buffer; the run's items as views."""
        source, rows = self.source, self.rows
        lo, hi = self.columns[0]
        end = hi + (1 if self.next_token else 0)
        c0, c1 = self._chunk_columns
        first, k = run[0][0], len(run)
        gap = run[1][0] - first if k > 1 else 1
        regions: list[U32Batch] | None = None
        # The chunk buffer is taken once its slots have been read (a dataset's shards opened
        # and checked): its size comes from the manifest's shape until then.
        view = source.view_batches(first, first + gap * (k - 1) + 1)
        if view is not None:  # one strided view of the mapping, one copy
            block = view[::gap, rows]
            chunk = self._pool().take()[:k]
            np.copyto(chunk, block[:, :, c0:c1], casting="safe")
            narrow = self.next_token and self._labels_pool is None
            if self.dtype != "int64" or self.bos_id is not None or narrow:
                regions = list(block[:, :, lo:end])
        else:  # a dataset checks each slot as it reads it: one copy per step
            regions = [source.read_batch(i)[rows, lo:end] for i, _ in run]
            chunk = self._pool().take()[:k]
            for j, region in enumerate(regions):
                np.copyto(chunk[j], region[:, c0 - lo : c1 - lo], casting="safe")
        after = [step_after for _, step_after in run]
        if regions is None:  # int64 tokens, or int64 pairs: views made by NumPy in one go
            pairs = self._labels_pool is not None
            items = zip(chunk[:, :, :-1], chunk[:, :, 1:], strict=True) if pairs else chunk
            return list(zip(items, after, strict=True))
        return [
            (self._chunk_item(regions[j], chunk[j]), step_after)
            for j, step_after in enumerate(after)
        ]

    def _chunk_item(self, region: U32Batch | None, converted: npt.NDArray[np.int64]) -> Item:
        """One step's item from its converted columns (and its source region, when views of it
        or its document layout are part of the item)."""
        labels: npt.NDArray[Any] | None = None
        if self.dtype == "int64":
            wide = self._labels_pool is not None  # labels share the chunk: one more column
            inputs: npt.NDArray[Any] = converted[:, :-1] if wide else converted
        else:
            assert region is not None
            inputs = self._convert(region[:, :-1] if self.next_token else region)
        if self.next_token:
            if self._labels_pool is not None:
                labels = converted[:, 1:] if self.dtype == "int64" else converted
            else:
                assert region is not None
                labels = region[:, 1:]
        if self.bos_id is None:
            return inputs if labels is None else (inputs, labels)
        assert region is not None
        layout = document_layout(region[:, :-1] if self.next_token else region, self.bos_id)
        item = {"tokens": inputs} if labels is None else {"inputs": inputs, "labels": labels}
        item["segment_ids"] = layout.segment_ids
        item["positions"] = layout.positions
        item["cu_seqlens"] = layout.cu_seqlens
        return item

    def _pool(self) -> BufferPool:
        """This process's chunk buffers (a forked worker makes its own)."""
        pid = os.getpid()
        if self._chunk_pool is None or self._chunk_pool[0] != pid:
            c0, c1 = self._chunk_columns
            shape = (CHUNK_STEPS, self.per_step, c1 - c0)
            pool = BufferPool(shape, np.int64, CHUNK_DEPTH + CHUNK_SPARE)
            self._chunk_pool = (pid, pool)
        return self._chunk_pool[1]

    def __getstate__(self) -> dict[str, Any]:
        """Copies sent to other processes leave this process's chunk stage and buffers here."""
        state = self.__dict__.copy()
        state["_stage"] = state["_chunk_pool"] = None
        return state

    def _pieces(
        self, epoch: int, step: int, owned: Iterator[int]
    ) -> Iterator[tuple[list[Piece], int]]:
        """For each of this copy's steps from ``step`` on: its stored-batch pieces and the step
        after it. A piece is ``(stored index, first row, end row)`` of this rank's samples."""
        n, b, g, per = (
            self.steps_per_epoch,
            self.source.batch_size,
            self.global_batch_size,
            self.per_step,
        )
        first_sample = step * g + self.rows.start
        position = first_sample // b  # stored position of the next index the iterator gives
        indices = self._indices(epoch, position)
        if self._simple:  # one stored batch per step: its index, at position step
            while True:
                for index in indices:
                    if position == step:
                        nxt = next(owned)
                        yield [(index, self.rows.start, self.rows.stop)], nxt
                        if nxt >= n:
                            return
                        step = nxt
                        if step - position > RESTART_GAP:  # far ahead: start the order there
                            position, indices = step, self._indices(epoch, step)
                            break
                    position += 1
                else:
                    return
        current = -1
        index = 0
        while step < n:
            a = step * g + self.rows.start
            end = a + per
            pieces: list[Piece] = []
            while a < end:
                p = a // b
                if current >= 0 and p - current > RESTART_GAP:  # far ahead: start there
                    indices, current = self._indices(epoch, p), -1
                while current < p:  # positions only increase: walk the iterator to p
                    index = next(indices)
                    current = p if current < 0 else current + 1
                r0 = a - p * b
                r1 = min(b, r0 + end - a)
                pieces.append((index, r0, r1))
                a += r1 - r0
            nxt = next(owned)
            yield pieces, nxt
            step = nxt

    def _all_views(self) -> npt.NDArray[Any] | None:
        """Every batch's rows as one ``[num_batches, rows, seq_len]`` view, when items are plain
        views of a single file's batches."""
        if not self._simple or self.bos_id is not None or self.next_token or self.source.fetches:
            return None
        if self.dtype == "int64" or self.columns != [(0, self.source.seq_len)]:
            return None
        every = self.source.view_batches(0, self.source.num_batches)
        if every is None:
            return None
        every = every[:, self.rows]
        return every.view(np.int32) if self.dtype == "int32" else every

    def _regions(self, pieces: list[Piece]) -> list[U32Batch]:
        """This rank's samples of one step, one array per column range (labels' token too)."""
        extra = 1 if self.next_token else 0
        out = []
        for lo, hi in self.columns:
            parts = [self._read_region(i, r0, r1, lo, hi + extra) for i, r0, r1 in pieces]
            out.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
        self.bytes_read += self.bytes_per_step
        return out

    def _read_region(self, index: int, r0: int, r1: int, lo: int, hi: int) -> U32Batch:
        """Rows ``r0..r1``, columns ``lo..hi`` of stored batch ``index``: a view of a local
        source's batch; a remote source fetches just those bytes (``remote.py``)."""
        return self.source.read_region(index, r0, r1, lo, hi)

    def _ahead(self, steps: Iterator[tuple[list[Piece], int]]) -> Iterator[tuple[list[Piece], int]]:
        """The steps as they come, each step's regions announced to the source first, so a
        source that fetches (``RemoteSource.ahead``) fetches them ahead of the loop."""
        # A single rank with steps smaller than a slot reads every row of each slot over
        # consecutive steps: the source fetches (and checks) the slot once, whole. A worker
        # serving only some of the steps reads only their rows (as a worker process's reopened
        # source does): fetching whole slots would multiply its bytes.
        whole_rows = self.slicing.dp_size == 1 and self.slicing.whole_rows and self._stride == 1
        extra = 1 if self.next_token else 0

        def regions(step: tuple[list[Piece], int]) -> list[Region]:
            pieces = step[0]
            return [(i, r0, r1, lo, hi + extra) for lo, hi in self.columns for i, r0, r1 in pieces]

        return self.source.ahead(steps, regions, whole_rows=whole_rows)

    def _item(self, pieces: list[Piece]) -> Item:
        regions = self._regions(pieces)
        if self.next_token:
            inputs = _join([r[:, :-1] for r in regions])
            labels = _join([r[:, 1:] for r in regions])
        else:
            inputs, labels = _join(regions), None
        if self.bos_id is not None:
            layout = document_layout(inputs, self.bos_id)
            item: dict[str, npt.NDArray[Any]] = (
                {"tokens": self._convert(inputs)}
                if labels is None
                else {"inputs": self._convert(inputs), "labels": self._convert_labels(labels)}
            )
            item["segment_ids"] = layout.segment_ids
            item["positions"] = layout.positions
            item["cu_seqlens"] = layout.cu_seqlens
            return item
        if labels is None:
            return self._convert(inputs)
        return self._convert(inputs), self._convert_labels(labels)

    def _convert_labels(self, labels: U32Batch) -> npt.NDArray[Any]:
        """Labels in ``label_dtype``: a pooled int64 copy, or the uint32 tokens as they are."""
        if self.label_dtype == "uint32":
            return labels
        return convert_into(self._labels_pool, labels, np.int64)

    def item(self, index: int) -> Item:
        """The item this loader serves from stored batch ``index`` (one-batch steps only)."""
        if self.global_batch_size != self.source.batch_size:
            raise ValueError("item(index) needs global_batch_size == batch_size")
        return self._item([(index, self.rows.start, self.rows.stop)])

    def _convert(self, batch: U32Batch) -> npt.NDArray[Any]:
        """uint32 tokens in the output dtype: views for uint32/int32, a pooled copy for int64."""
        if self.dtype == "uint32":
            return batch
        if self.dtype == "int32":
            return batch.view(np.int32)
        return convert_into(self._inputs_pool, batch, np.int64)

    def served(self, position: Position) -> int:
        """How many steps a single copy serves from ``position`` to the end of its epoch."""
        epoch, step = position
        n = self.steps_per_epoch
        if step >= n:
            return 0
        lo, hi = epoch * n + step, epoch * n + n
        skipped = sum(max(0, min(b, hi) - max(a, lo)) for a, b in self.skip_steps)
        return n - step - skipped

    def copy(self) -> BatchNativeLoader:
        """A loader over the same open source with the same parameters and cursor, whose
        iteration does not move this one's (the source stays this loader's to close)."""
        twin = BatchNativeLoader(
            self.source,
            block_size=self.block_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self._epoch,
            dtype=self.dtype,
            next_token=self.next_token,
            label_dtype=self.label_dtype,
            bos_id=self.bos_id,
            global_batch_size=self.global_batch_size,
            skip_steps=self.skip_steps,
            slicing=self.slicing,
        )
        twin._identity = self._identity
        twin.load_state_dict(self.state_dict())
        return twin

    # -- checkpointing ---------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """The source's identity recorded in states (computed once)."""
        if self._identity is None:
            self._identity = source_identity(self.source)
        return self._identity

    def state_dict(self, position: Position | None = None) -> dict[str, Any]:
        """The cursor (or ``position``) and what it depends on, as JSON-serialisable values."""
        src = self.source
        epoch, step = self.position if position is None else position
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": epoch,
            "step": step,
            "num_workers": self._stride,
            "worker": self._phase,
            "origin": self._origin.step if self._origin.epoch == epoch else 0,
            "seed": self.seed,
            "block_size": self.block_size,
            "shuffle": self.shuffle,
            "num_batches": src.num_batches,
            "batch_size": src.batch_size,
            "seq_len": src.seq_len,
            "file_seed": src.seed,
            "global_batch_size": self.global_batch_size,
            "samples": min(step, self.steps_per_epoch) * self.global_batch_size,
            "skip_steps": [list(r) for r in self.skip_steps],
            "source": self.identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the cursor saved by ``state_dict``; the order parameters must match.

        The rank and world size may differ from the saving run's (the cursor counts steps), and
        so may the global batch size, by an integer factor, if the saved position falls on a
        step of the new size. The state's ``skip_steps`` are added to this loader's.
        """
        e, step, workers, worker, origin, skips = self.check_state(state)
        self._epoch, self._step = e, step
        self._stride, self._phase, self._origin = workers, worker, Position(e, origin)
        self.skip_steps = normalize_skips([*self.skip_steps, *skips])
        self._new_serial()

    def check_state(self, state: object) -> tuple[int, int, int, int, int, list[list[int]]]:
        """``(epoch, step, num_workers, worker, origin, skip_steps)`` of a state that fits this
        loader, its step in this loader's global batch size. ``StateError`` names what does
        not fit."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError(f"not a {STATE_FORMAT} state: {state!r:.200}")
        if state.get("version") != STATE_VERSION:
            raise StateError(f"unsupported loader state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in ORDER_KEYS:
            if state.get(key) != mine[key]:
                raise StateError(
                    f"{self.source.path}: state has {key}={state.get(key)!r} but this loader "
                    f"has {key}={mine[key]!r}"
                )
        if "source" in state and state["source"] != mine["source"]:
            raise StateError(
                f"{self.source.path}: the state was saved for another file or dataset of the "
                f"same shape (state {state['source']!r:.200}, this one {mine['source']!r:.200})"
            )
        e, step = state.get("epoch"), state.get("step")
        workers, worker = state.get("num_workers", 1), state.get("worker", 0)
        origin, skips = state.get("origin", 0), state.get("skip_steps", [])
        g = state.get("global_batch_size", mine["batch_size"])
        if not _is_int(e) or not 0 <= e <= U64_MAX:
            raise StateError(f"state epoch {e!r} is not an integer in [0, 2**64 - 1]")
        if not _is_int(workers) or not 1 <= workers <= U64_MAX or not _is_int(worker):
            raise StateError(f"state num_workers={workers!r}, worker={worker!r} are invalid")
        if not 0 <= worker < workers:
            raise StateError(f"state worker {worker} is outside num_workers {workers}")
        if not _is_int(g) or g < 1:
            raise StateError(f"state global_batch_size {g!r} is invalid")
        if not isinstance(skips, list):
            raise StateError(f"state skip_steps {skips!r:.100} is not a list of pairs")
        try:
            normalize_skips(skips)
        except (TypeError, ValueError) as err:
            raise StateError(f"state skip_steps: {err}") from None
        steps = mine["num_batches"] * mine["batch_size"] // g
        # A worker's next step can lie past the end of the epoch (nothing left for it).
        if not _is_int(step) or not 0 <= step < steps + workers:
            raise StateError(f"state step {step!r} is outside [0, {steps}]")
        if not _is_int(origin) or not 0 <= origin <= step:
            raise StateError(f"state origin {origin!r} is outside [0, step]")
        if workers > 1 and not self._owns(e, origin, workers, worker, step, skips):
            raise StateError(f"state step {step} is not one of worker {worker}'s steps")
        if g != self.global_batch_size:
            if workers != 1:
                raise StateError("a worker's state cannot change the global batch size")
            samples = min(step, steps) * g
            if samples % self.global_batch_size:
                raise StateError(
                    f"the state is {samples} samples into epoch {e}, not a whole number of "
                    f"steps of the new global batch size {self.global_batch_size}: resume "
                    f"with global_batch_size {g}, or at a step where the sizes line up"
                )
            step = samples // self.global_batch_size if step < steps else self.steps_per_epoch
        return e, step, workers, worker, origin, skips

    def _owns(
        self, epoch: int, origin: int, workers: int, worker: int, step: int, skips: list[list[int]]
    ) -> bool:
        """Whether worker ``worker`` of ``workers``, split at ``origin``, serves ``step``
        (counted, not walked: a state's step may be far into a long epoch)."""
        merged = normalize_skips([*self.skip_steps, *skips])
        first = self._first_owned(epoch, step, workers, worker, merged, origin)
        return first == step


class _SkipTotals:
    """How many global steps a tuple of merged skipped ranges skips below a step, in one
    search: the ranges' first steps and the running total of their lengths (kept for the
    last tuple asked about, which is nearly always the loader's own)."""

    _last: tuple[tuple[tuple[int, int], ...], _SkipTotals] | None = None

    def __init__(self, ranges: tuple[tuple[int, int], ...]) -> None:
        self.firsts = [a for a, _ in ranges]
        self.ranges = ranges
        self.totals = [0]
        for a, b in ranges:
            self.totals.append(self.totals[-1] + b - a)

    @classmethod
    def of(cls, ranges: tuple[tuple[int, int], ...]) -> _SkipTotals:
        last = cls._last
        if last is not None and last[0] is ranges:
            return last[1]
        totals = cls(ranges)
        cls._last = (ranges, totals)
        return totals

    def __call__(self, step: int) -> int:
        """Global steps below ``step`` that the ranges skip."""
        i = bisect.bisect_right(self.firsts, step) - 1
        if i < 0:
            return 0
        a, b = self.ranges[i]
        return self.totals[i] + min(b, step) - a


def _continues(run: list[tuple[int, int]], index: int) -> bool:
    """Whether stored batch ``index`` extends ``run`` with the same positive spacing."""
    last = run[-1][0]
    return index > last and (len(run) == 1 or index - last == run[1][0] - run[0][0])


def _join(parts: list[U32Batch]) -> U32Batch:
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def _next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: epochs are u64 and wrap, so the cursor stays representable."""
    return (epoch + 1) & U64_MAX


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
