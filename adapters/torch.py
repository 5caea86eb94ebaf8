"""PyTorch adapter: an ``IterableDataset`` over one LLMBATCH file and a resumable loader.

Everything that decides *what* is served (block-shuffled order, epochs, rank rows, worker
steps, next-token pairs, the checkpoint cursor) lives in ``zerobatch_core.BatchNativeLoader``;
this module only turns its NumPy batches into tensors and plugs it into PyTorch's
``DataLoader`` machinery, so every framework adapter serves the same batches in the same order.

Usage (``TorchBatchLoader`` keeps an exact, JSON-able cursor, workers or not)::

    from zerobatch_adapters.torch import TorchBatchLoader

    loader = TorchBatchLoader("train.batch", next_token=True, num_workers=2, device="cuda")
    if os.path.exists("data.json"):  # resume: the next batch is the one after the checkpoint
        loader.load_state_dict(json.load(open("data.json")))
    for epoch in range(loader.epoch, num_epochs):  # resume the epoch loop at loader.epoch
        loader.set_epoch(epoch)  # a new block order every epoch
        for inputs, labels in loader:  # int64 [B, T - 1] each, already on the GPU
            train_step(inputs, labels)
            json.dump(loader.state_dict(), open("data.json", "w"))

``TorchBatchDataset`` is the building block for a plain ``DataLoader(ds, batch_size=None,
num_workers=k)`` or torchdata's ``StatefulDataLoader``; ``TorchBatchLoader`` wraps it for the
common case and keeps an exact cursor even when the batches come from worker processes.

Packed rows (several documents per row, each starting with a BOS token): ``bos_id=...`` makes
every batch a dict of tensors that adds the core's document layout (``zerobatch_core.documents``)
for variable-length attention::

    loader = TorchBatchLoader("train.batch", next_token=True, bos_id=tok.bos_id, device="cuda")
    for b in loader:  # b["inputs"], b["labels"]: [B, T - 1]; the layout is the inputs'
        b["segment_ids"], b["positions"]  # int32 [B, T - 1]: attention masks, RoPE positions
        b["cu_seqlens"]  # int32 [documents + 1]: flash_attn_varlen_func's cu_seqlens_q/k
"""

from __future__ import annotations

import os
import re
import warnings
import weakref
from collections.abc import Generator, Iterator
from itertools import count
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from zerobatch_core import BatchFileReader, BatchNativeLoader, StateError
from zerobatch_core.distributed import resolve_rank_world
from zerobatch_core.loader import DEFAULT_BLOCK_SIZE
from zerobatch_core.prefetch import Prefetcher

__all__ = [
    "DocumentBatch",
    "NextTokenBatch",
    "TorchBatchDataset",
    "TorchBatchLoader",
    "TorchDType",
]

TorchDType = Literal["int32", "int64"]
PASS_DONE = "pass_done"
"""Key the dataset adds to the core state (see ``TorchBatchDataset.state_dict``)."""

_READONLY_MESSAGE = "The given NumPy array is not writable"
_READONLY_MODULE = re.escape(__name__) + r"\Z"
# The entry ``warnings.filterwarnings`` adds for the call below (Python 3.10+ layout).
_READONLY_FILTER = (
    "ignore",
    re.compile(re.escape(_READONLY_MESSAGE), re.IGNORECASE),
    UserWarning,
    re.compile(_READONLY_MODULE),
    0,
)


def _ignore_readonly_warning() -> None:
    """Silence ``torch.from_numpy``'s read-only warning, for calls made from this module only.

    int32 batches are deliberately read-only views of the mapped file (see
    ``TorchBatchDataset``), so the warning says nothing new. The filter matches only that
    message, only as a ``UserWarning`` and only when raised from this module: every other
    warning still shows. ``__iter__`` calls this again (a list lookup) to restore the filter
    if a ``warnings.catch_warnings`` block or ``resetwarnings`` dropped it since import.
    """
    if _READONLY_FILTER not in warnings.filters:
        warnings.filterwarnings(
            "ignore",
            message=re.escape(_READONLY_MESSAGE),
            category=UserWarning,
            module=_READONLY_MODULE,
        )


_ignore_readonly_warning()


class NextTokenBatch(NamedTuple):
    """``(inputs, labels)`` for next-token training: ``[B, T - 1]`` each, labels int64.

    A named tuple rather than a plain one because ``DataLoader``'s default conversion keeps
    named tuples as they are (plain tuples come out as lists) and ``pin_memory`` keeps them too.
    """

    inputs: torch.Tensor
    labels: torch.Tensor


DocumentBatch = dict[str, torch.Tensor]
"""A ``bos_id`` item: ``tokens`` (or ``inputs``/``labels``), ``segment_ids``, ``positions``,
``cu_seqlens``. A plain dict: ``DataLoader`` collation and ``pin_memory`` keep dicts."""

TorchItem = torch.Tensor | NextTokenBatch | DocumentBatch


def _distributed_rank_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of an initialised default ``torch.distributed`` group, if any."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _tensors(item: Any) -> TorchItem:
    """Wrap the core loader's arrays as tensors without copying them."""
    if isinstance(item, dict):
        arrays: dict[str, npt.NDArray[Any]] = item
        return {key: torch.from_numpy(array) for key, array in arrays.items()}
    if isinstance(item, tuple):
        inputs: npt.NDArray[np.integer[Any]] = item[0]
        labels: npt.NDArray[np.int64] = item[1]
        return NextTokenBatch(torch.from_numpy(inputs), torch.from_numpy(labels))
    return torch.from_numpy(item)


class TorchBatchDataset(IterableDataset[TorchItem]):
    """Batches of one LLMBATCH file as tensors, for ``DataLoader(ds, batch_size=None)``.

    Each item is one step's batch, ``[B // world_size, T]``, or with ``next_token=True`` a
    ``NextTokenBatch(inputs, labels)`` shifted by one token (``[B // world_size, T - 1]``
    each). ``dtype="int64"`` (the default) gives a fresh int64 tensor per batch;
    ``dtype="int32"`` gives a zero-copy view of the memory-mapped file (exact for token ids
    below 2**31). **int32 tensors share read-only memory with the file: never modify them in
    place** (``t.add_(1)`` would crash the process with SIGSEGV); ``.clone()`` or ``.long()`` first.
    Labels are always int64 (a copy), as ``cross_entropy`` wants.

    ``bos_id`` (packed rows whose documents start with that token) makes each item a dict
    (``DocumentBatch``) of the core loader's arrays as tensors: ``tokens`` (or ``inputs`` and
    ``labels`` with ``next_token``, dtypes as above) plus the document layout of the tokens (or
    inputs), derived by the core once per batch: ``segment_ids`` and ``positions`` (int32, the
    shape of the tokens or inputs; 1-based segments and positions restarting at every BOS and
    row start) and ``cu_seqlens`` (int32, 1-D, one more entry than the batch has documents, so
    its length varies from batch to batch: FlashAttention's varlen layout over the flattened
    rows; no document is longer than a row, a bound for ``max_seqlen``).

    The order is ``BatchNativeLoader``'s (see ``zerobatch_core``): ``seed`` defaults to the
    file's, ``shuffle=False`` serves file order. Ranks: ``rank``/``world_size`` if given,
    else an initialised ``torch.distributed`` group, else ``RANK``/``WORLD_SIZE`` from the
    environment (as ``torchrun`` sets them), else one rank; each rank gets its own rows of
    every step, so the ranks together serve each batch exactly once.

    With ``num_workers=k`` in the ``DataLoader``, worker ``w`` serves steps ``w, w + k, ...``
    from the dataset's cursor, the round-robin order the ``DataLoader`` collects them in, so
    the output equals the single-process order. Each worker iterates its own copy: the
    dataset in the main process does not advance, so call ``set_epoch(e)`` before each epoch
    (as with ``DistributedSampler``), or use ``TorchBatchLoader``, which handles this.
    ``state_dict``/``load_state_dict`` make it resumable under torchdata's
    ``StatefulDataLoader``, which calls them inside each worker.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | BatchFileReader,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        dtype: TorchDType = "int64",
        next_token: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        bos_id: int | None = None,
    ) -> None:
        if dtype not in ("int32", "int64"):
            raise ValueError(
                f"dtype must be 'int32' (zero-copy, ids below 2**31) or 'int64' (a copy), got "
                f"{dtype!r}; PyTorch has no general uint32 support"
            )
        r, w = resolve_rank_world(rank, world_size, _distributed_rank_world())
        # The core loader pickles cleanly (its reader reopens the file by path), so worker
        # processes get a copy whatever their start method.
        self.loader = BatchNativeLoader(
            path, block_size, shuffle, seed, epoch, dtype, r, w, next_token, bos_id
        )
        self._skip_pass = False  # restored from a state whose pass this copy had finished
        self._pass_done = False  # a skipped pass is still running
        self._live_epoch: int | None = None  # epoch of the pass being served, if one is

    @property
    def rank(self) -> int:
        """This rank's index among ``world_size``."""
        return self.loader.rank

    @property
    def world_size(self) -> int:
        """Number of ranks splitting each batch's rows."""
        return self.loader.world_size

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self.loader.epoch

    def __len__(self) -> int:
        """Steps per epoch: the number of batches in the file (each rank serves all steps)."""
        return len(self.loader)

    def __iter__(self) -> Iterator[TorchItem]:
        """Serve the rest of the current epoch; in a ``DataLoader`` worker, only its steps."""
        info = get_worker_info()
        if info is not None:
            self.loader.split_workers(info.id, info.num_workers)
        _ignore_readonly_warning()
        skip, self._skip_pass = self._skip_pass, False
        self._pass_done = skip  # a skipped pass stays done until it ends, as the saved one was
        return self._serve(skip)

    def _serve(self, skip: bool) -> Iterator[TorchItem]:
        try:
            if skip:
                return
            # The core cursor moves to the next epoch with this copy's last step; state_dict
            # compares it with the pass's epoch, so the loop itself does no bookkeeping.
            self._live_epoch = self.loader.epoch
            plain = self.loader.bos_id is None and not self.loader.next_token
            yield from map(torch.from_numpy if plain else _tensors, self.loader)
        finally:
            self._pass_done = False
            self._live_epoch = None

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is already the current one), as the core does."""
        self.loader.set_epoch(epoch)
        self._skip_pass = self._pass_done = False
        self._live_epoch = None

    def state_dict(self) -> dict[str, Any]:
        """The core loader's JSON-able cursor state, plus ``pass_done``.

        The core cursor moves to the next epoch as soon as a copy serves its last step, but a
        ``DataLoader`` pass goes on until every worker has finished. ``pass_done`` is true when
        the state was taken inside a pass after this copy's last step: a copy restored from it
        serves nothing on its next iteration (the rest of that pass), instead of starting the
        next epoch while the other workers still finish this one.
        """
        state = self.loader.state_dict()
        live = self._live_epoch is not None and self.loader.epoch != self._live_epoch
        state[PASS_DONE] = self._skip_pass or self._pass_done or live
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a state from ``state_dict`` (or a core ``BatchNativeLoader`` state)."""
        self.loader.load_state_dict(state)
        self._skip_pass = bool(state.get(PASS_DONE, False))
        self._pass_done = False
        self._live_epoch = None


def _non_negative_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


class TorchBatchLoader:
    """A ``DataLoader`` over ``TorchBatchDataset`` that resumes exactly, workers or not.

    Iterating serves the rest of the current epoch and the next ``iter`` serves the next
    epoch, like ``BatchNativeLoader``. The loader keeps the global cursor itself: it counts
    the batches it has delivered and, at each ``iter``, hands the cursor to the dataset so
    the (new) worker processes start from it. ``state_dict`` is therefore exact even with
    ``num_workers > 0``, where the dataset copy in this process never advances, and with a
    ``device`` prefetch queue, where batches are read ahead: it counts what the training loop
    has received. When resuming, continue the epoch loop from ``loader.epoch``.

    ``device`` (e.g. ``"cuda"``) moves batches (each tensor of a ``bos_id`` dict) with
    ``.to(device, non_blocking=True)`` in a background thread, ``prefetch`` batches ahead;
    combine with ``pin_memory=True`` for asynchronous host-to-device copies.
    ``multiprocessing_context`` is passed to the ``DataLoader`` (use ``"forkserver"`` or
    ``"spawn"`` when the process already runs threads, e.g. after JAX or TensorFlow started).
    The other arguments are ``TorchBatchDataset``'s.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | BatchFileReader,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        dtype: TorchDType = "int64",
        next_token: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        bos_id: int | None = None,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        device: torch.device | str | None = None,
        prefetch: int = 2,
        multiprocessing_context: str | None = None,
    ) -> None:
        self.multiprocessing_context = multiprocessing_context
        self.num_workers = _non_negative_int("num_workers", num_workers, 0)
        self.prefetch = _non_negative_int("prefetch", prefetch, 1)
        self.pin_memory = bool(pin_memory)
        self.device = None if device is None else torch.device(device)
        self.dataset = TorchBatchDataset(
            path, block_size, shuffle, seed, epoch, dtype, next_token, rank, world_size, bos_id
        )
        core = self.dataset.loader
        # The global cursor: a core loader that is never iterated, only moved, so the cursor
        # rules (epoch rollover, set_epoch, state validation) stay the core's.
        self._cursor = BatchNativeLoader(
            core.reader, core.block_size, core.shuffle, core.seed, core.epoch
        )
        self._active: weakref.ref[Generator[TorchItem, None, None]] | None = None

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._cursor.epoch

    @property
    def step(self) -> int:
        """Position of the next batch in the current epoch."""
        return self._cursor.step

    def __len__(self) -> int:
        """Steps (batches) per epoch."""
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is already the current one)."""
        self._cursor.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The cursor after the last delivered batch, as the core's JSON-able state."""
        return self._cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a state from ``state_dict`` (or from a single-process core loader)."""
        if isinstance(state, dict) and state.get("num_workers", 1) != 1:
            raise StateError(
                f"state of worker {state.get('worker')} of {state.get('num_workers')} only; "
                "a TorchBatchLoader resumes from its own state_dict"
            )
        self._cursor.load_state_dict(state)

    def __iter__(self) -> Iterator[TorchItem]:
        """Serve the rest of the current epoch; a pass still running ends here."""
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()  # stops its prefetch thread and its worker processes
        batches = self._pass()
        self._active = weakref.ref(batches)
        return batches

    def _move(self, item: TorchItem) -> TorchItem:
        if isinstance(item, dict):
            return {key: t.to(self.device, non_blocking=True) for key, t in item.items()}
        if isinstance(item, NextTokenBatch):
            return NextTokenBatch(*(t.to(self.device, non_blocking=True) for t in item))
        return item.to(self.device, non_blocking=True)

    def _pass(self) -> Generator[TorchItem, None, None]:
        start = self._cursor.state_dict()
        self.dataset.load_state_dict(start)  # the workers' copies start from the cursor
        loader = DataLoader(
            self.dataset,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            multiprocessing_context=self.multiprocessing_context if self.num_workers else None,
            # Fresh workers at every iter: they copy the dataset, so they get the cursor sent
            # just above. Persistent workers would keep their own cursors and miss set_epoch
            # and load_state_dict calls made in between.
            persistent_workers=False,
        )
        # Each batch travels with the cursor after it (the core rolls step == len over to the
        # next epoch), so the state follows delivery and never the read-ahead.
        steps = ({**start, "step": s} for s in count(start["step"] + 1))
        source = zip(iter(loader), steps, strict=False)  # steps never ends
        prefetcher = None
        if self.device is not None:
            prefetcher = Prefetcher(source, self._move, self.prefetch, start)
        expected = (self._cursor.epoch, self._cursor.step)
        try:
            if prefetcher is None:
                pairs: Iterator[tuple[TorchItem, dict[str, Any]]] = source
            else:
                pairs = ((item, prefetcher.state) for item in prefetcher)
            for item, state in pairs:
                if (self._cursor.epoch, self._cursor.step) != expected:
                    return  # the cursor was moved from outside: this pass is over
                self._cursor.load_state_dict(state)
                expected = (self._cursor.epoch, self._cursor.step)
                yield item
            if (self._cursor.epoch, self._cursor.step) == expected:
                self._cursor.set_epoch(start["epoch"] + 1)  # no-op unless the epoch was empty
        finally:
            if prefetcher is not None:
                prefetcher.close()
