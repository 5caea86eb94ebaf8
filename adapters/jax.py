"""JAX adapter: LLMBATCH batches as sharded ``jax.Array``s, prefetched onto the devices.

``JaxBatchIterator`` serves ``BatchNativeLoader``'s batches as global ``jax.Array``s laid out
by a ``jax.sharding.Sharding`` (default: the batch axis split over every device). Each process
reads from the file only the rows its own devices hold, and
``jax.make_array_from_process_local_data`` copies each device's rows from the host straight
to that device, once: no device ever holds, or gathers, the whole batch. A look-ahead
(``zerobatch_core.prefetch.Lookahead``) keeps the next ``prefetch`` batches in flight
while the training step runs, and ``state_dict`` counts only the batches the loop received.

Usage::

    from zerobatch_adapters.jax import JaxBatchIterator

    it = JaxBatchIterator("train.batch", block_size=64, next_token=True, prefetch=2)
    for epoch in range(3):
        it.set_epoch(epoch)
        for inputs, labels in it:  # int32 [B, T - 1] jax.Arrays, rows split over devices
            params, loss = train_step(params, inputs, labels)  # a jax.jit step
        save_json(it.state_dict())  # plain ints; resume with it.load_state_dict(...)
    it.close()

Packed rows (several documents per row, each starting with a BOS token): with ``bos_id=...``
every batch is a dict (``DocumentBatch``) that adds the core's document layout::

    it = JaxBatchIterator("train.batch", next_token=True, bos_id=tok.bos_id)
    for b in it:  # b["inputs"], b["labels"], b["segment_ids"], b["positions"]: sharded [B, T - 1]
        cu_seqlens = b.pop("cu_seqlens")  # host NumPy int32 of varying length: not for jit
        params, loss = train_step(params, b)  # segment ids: e.g. splash attention's mask

Multi-host: call ``jax.distributed.initialize()`` first, then build the same iterator (same
file, same sharding over the global mesh) in every process. Block order, rank row-splitting,
next-token pairs and the checkpoint cursor all come from ``zerobatch_core``; this module only
maps the sharding to a core ``(rank, world_size)`` and moves arrays to devices.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, Literal, NamedTuple, TypedDict, TypeVar, cast, overload

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from zerobatch_core import BatchFileReader, BatchNativeLoader
from zerobatch_core.distributed import rank_rows
from zerobatch_core.loader import DEFAULT_BLOCK_SIZE, Item, iter_with_state
from zerobatch_core.prefetch import Lookahead

__all__ = [
    "DATA_AXIS",
    "DocumentBatch",
    "JaxBatchIterator",
    "ProcessRows",
    "default_sharding",
    "process_rows",
]

DATA_AXIS = "data"
"""Name of the 1-D mesh axis ``default_sharding`` splits the batch over."""

Pair = tuple[jax.Array, jax.Array]


class DocumentBatch(TypedDict, total=False):
    """A ``bos_id`` batch: the tokens (or next-token pair) and their document layout.

    ``tokens`` without ``next_token``, else ``inputs`` and ``labels``; ``segment_ids`` and
    ``positions`` are those of the tokens (or inputs). Every ``jax.Array`` is int32 with the
    tokens' shape and sharding. ``cu_seqlens`` is a host NumPy array (see ``JaxBatchIterator``).
    """

    tokens: jax.Array
    inputs: jax.Array
    labels: jax.Array
    segment_ids: jax.Array
    positions: jax.Array
    cu_seqlens: np.ndarray[Any, np.dtype[np.int32]]


BatchT = TypeVar("BatchT", jax.Array, Pair, DocumentBatch)

# Typed names for the JAX entry points used here (some are unannotated in JAX itself).
_partition_spec: Callable[[str], PartitionSpec] = PartitionSpec
_make_array: Callable[[Sharding, np.ndarray[Any, Any], tuple[int, ...]], jax.Array] = (
    jax.make_array_from_process_local_data
)


def default_sharding(devices: list[jax.Device] | None = None) -> NamedSharding:
    """Batch axis split over ``devices``, in the order given.

    A ``NamedSharding`` on a 1-D mesh named ``"data"`` with ``PartitionSpec("data")``: the
    ``k``-th device holds rows ``[k * B / n, (k + 1) * B / n)`` and the sequence axis stays
    whole. The default is every device of every process, ordered by process then id, so that
    each process's devices, and hence its rows, are adjacent (what ``process_rows`` needs).
    """
    if devices is None:
        devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    else:
        devs = list(devices)
    if not devs:
        raise ValueError("default_sharding needs at least one device")
    return NamedSharding(Mesh(np.asarray(devs), (DATA_AXIS,)), _partition_spec(DATA_AXIS))


class ProcessRows(NamedTuple):
    """The rows of every batch one process holds, as the core loader's rank of a world.

    ``rows == rank_rows(batch_size, rank, world_size)``: a ``BatchNativeLoader`` built with
    this ``rank`` and ``world_size`` reads exactly these rows.
    """

    rank: int
    world_size: int
    rows: slice


def _span(index: object, size: int, axis: int) -> tuple[int, int]:
    """``[start, stop)`` of one device's index along one axis (a slice, or an int)."""
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        i = int(index) % size if size else 0
        return i, i + 1
    if not isinstance(index, slice):
        raise TypeError(f"axis {axis}: expected a slice in the device index, got {index!r}")
    start, stop, step = index.indices(size)
    if step != 1:
        raise ValueError(f"axis {axis}: device index {index} has step {step}; expected 1")
    return start, max(start, stop)


def _union(spans: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged intervals covering ``spans``."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def process_rows(
    indices_map: Mapping[Any, tuple[Any, ...] | None], global_shape: tuple[int, ...]
) -> ProcessRows:
    """Map a process's device indices to the core loader's ``(rank, world_size)``.

    ``indices_map`` is ``sharding.addressable_devices_indices_map(global_shape)``: for each of
    this process's devices, the index (a tuple of slices; ``None``: everything) of the block of
    the global ``[batch_size, ...]`` array it holds. Devices may repeat rows (replication over
    a model axis); together they must hold one contiguous run of rows that is one of the
    ``batch_size // n`` equal parts of the batch, and the whole of every other axis. That is
    what lets the core loader read exactly this process's rows with ``rank_rows``; anything
    else raises ``ValueError`` naming the rows found.
    """
    if not indices_map:
        raise ValueError("the sharding gives this process no device: it would receive no rows")
    if not global_shape:
        raise ValueError("global_shape must have a batch axis")
    batch_size = global_shape[0]
    per_axis: list[set[tuple[int, int]]] = [set() for _ in global_shape]
    for index in indices_map.values():
        given = () if index is None else tuple(index)  # None: the whole array
        full = given + (slice(None),) * (len(global_shape) - len(given))
        for axis, size in enumerate(global_shape):
            per_axis[axis].add(_span(full[axis], size, axis))
    for axis, spans in enumerate(per_axis[1:], start=1):
        if _union(spans) != [(0, global_shape[axis])]:
            raise ValueError(
                f"the sharding gives this process only parts {sorted(spans)} of axis {axis} "
                f"(size {global_shape[axis]}); only the batch axis may be split across processes"
            )
    rows = _union(per_axis[0])
    if len(rows) != 1:
        raise ValueError(
            f"the sharding gives this process the non-contiguous rows {rows} of a "
            f"{batch_size}-row batch; each process must hold one contiguous run of rows "
            "(order the mesh devices so that each process's devices are adjacent)"
        )
    start, stop = rows[0]
    count = stop - start
    if count == 0 or batch_size % count or start % count:
        raise ValueError(
            f"the sharding gives this process rows [{start}, {stop}) of a {batch_size}-row "
            "batch, which is not one of equal parts splitting the batch; every process must "
            "hold the same number of rows, and that number must divide the batch size"
        )
    rank, world_size = start // count, batch_size // count
    split = rank_rows(batch_size, rank, world_size)
    if (split.start, split.stop) != (start, stop):  # cannot happen: a guard on rank_rows
        raise AssertionError(f"rank_rows gives {split} for rows [{start}, {stop})")
    return ProcessRows(rank, world_size, split)


class JaxBatchIterator(Generic[BatchT]):
    """Iterate an LLMBATCH file as sharded int32 ``jax.Array`` batches, prefetched to devices.

    Each item is a global ``jax.Array`` ``[batch_size, seq_len]`` placed with ``sharding``
    (default ``default_sharding()``), or with ``next_token=True`` a pair ``(inputs, labels)``
    of ``[batch_size, seq_len - 1]`` arrays with the same sharding. Both are int32, JAX's
    default integer width: inputs are the core's zero-copy int32 view, and labels are int32
    as well (the core yields them as int64, as PyTorch wants; JAX would narrow them anyway
    unless ``jax_enable_x64`` is on, and ``optax``/``jax.nn`` cross-entropy takes int32
    labels), so inputs and labels always have one dtype. Ids of 2**31 and above wrap to
    negative numbers, exactly like the core's int32 view.

    ``bos_id`` (packed rows whose documents start with that token) makes each item a
    ``DocumentBatch`` dict: ``tokens`` (or ``inputs`` and ``labels``, as above) plus the core's
    document layout of the tokens (or inputs), ``segment_ids`` (1-based per row) and
    ``positions`` (restarting at every BOS and row start), both int32 ``jax.Array``s with the
    tokens' shape and sharding: the layout JAX attention kernels take (e.g. splash attention's
    segment ids, RoPE positions). ``cu_seqlens`` (FlashAttention's varlen layout) is served
    too, but as a **host NumPy** int32 array: its length (documents + 1) varies from batch to
    batch, so it can neither be split by rows over the devices nor passed to a ``jax.jit``
    function without a recompile per length (pad it to a fixed length first if a kernel needs
    it on device). It covers this process's rows only, flattened in order: with several
    processes each one derives the layout of its own rows, which is exact because segments
    restart at every row.

    The order, epochs and checkpoint cursor are ``BatchNativeLoader``'s: ``iter()`` serves the
    rest of the current epoch and a new ``iter()`` after its end serves the next one;
    ``set_epoch(e)`` starts epoch ``e`` (keeping the position if ``e`` is current). The state
    is the core loader's, so it also resumes a core loader, and vice versa.

    Prefetch: right after handing out a batch, the copies of the next ``prefetch`` batches are
    dispatched (JAX copies asynchronously), so they overlap the caller's step. This happens on
    the caller's thread on purpose: on XLA's CPU backend, work dispatched from a second thread
    while a step runs collectives can starve the collective's rendezvous and abort.
    ``state_dict`` counts only delivered batches; starting a new pass, ``set_epoch`` and
    ``load_state_dict`` drop what was read ahead and go back to the first undelivered batch,
    so nothing is skipped. Starting a new pass ends the previous iterator.
    """

    @overload
    def __init__(
        self: JaxBatchIterator[jax.Array],
        path: str | os.PathLike[str] | BatchFileReader,
        sharding: Sharding | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        next_token: Literal[False] = False,
        prefetch: int = 2,
        bos_id: None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: JaxBatchIterator[Pair],
        path: str | os.PathLike[str] | BatchFileReader,
        sharding: Sharding | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        *,
        next_token: Literal[True],
        prefetch: int = 2,
        bos_id: None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: JaxBatchIterator[DocumentBatch],
        path: str | os.PathLike[str] | BatchFileReader,
        sharding: Sharding | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        next_token: bool = False,
        prefetch: int = 2,
        *,
        bos_id: int,
    ) -> None: ...

    @overload
    def __init__(
        self: JaxBatchIterator[Any],
        path: str | os.PathLike[str] | BatchFileReader,
        sharding: Sharding | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        next_token: bool = False,
        prefetch: int = 2,
        bos_id: int | None = None,
    ) -> None: ...

    def __init__(
        self,
        path: str | os.PathLike[str] | BatchFileReader,
        sharding: Sharding | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        next_token: bool = False,
        prefetch: int = 2,
        bos_id: int | None = None,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int):
            raise TypeError(f"prefetch must be an integer, got {type(prefetch).__name__}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        reader = path if isinstance(path, BatchFileReader) else BatchFileReader(path)
        try:
            self.sharding: Sharding = default_sharding() if sharding is None else sharding
            width = reader.seq_len - 1 if next_token else reader.seq_len
            # The shape of every served array (inputs and labels alike with next_token).
            self.global_shape: tuple[int, int] = (reader.batch_size, width)
            try:
                indices = self.sharding.addressable_devices_indices_map(self.global_shape)
            except ValueError as e:
                raise ValueError(
                    f"{reader.path}: the sharding cannot split a {self.global_shape} batch "
                    f"(batch_size {reader.batch_size} must divide evenly over its devices): {e}"
                ) from e
            split = process_rows(indices, self.global_shape)
            self.rows: slice = split.rows  # the rows of every batch this process reads
            self._loader = BatchNativeLoader(
                reader,
                block_size=block_size,
                shuffle=shuffle,
                seed=seed,
                epoch=epoch,
                dtype="int32",
                rank=split.rank,
                world_size=split.world_size,
                next_token=next_token,
                bos_id=bos_id,
            )
        except BaseException:
            if reader is not path:
                reader.close()
            raise
        self.next_token = bool(next_token)
        self.bos_id: int | None = self._loader.bos_id
        self.prefetch = prefetch
        self._prefetcher: Lookahead[Item, BatchT] | None = None

    # -- host to device ----------------------------------------------------------------------
    def _array(self, local_rows: np.ndarray[Any, Any]) -> jax.Array:
        """One global array from this process's rows: each device gets its slice, once."""
        return _make_array(self.sharding, local_rows, self.global_shape)

    def _to_device(self, item: Item) -> BatchT:
        """Dispatch one core item's host-to-device copies (asynchronous in JAX)."""
        if self.bos_id is not None:
            documents: Any = self._documents(item)  # already on the devices
            return cast("BatchT", documents)
        if self.next_token:
            inputs, labels = item
            out: Any = (self._array(inputs), self._array(labels.astype(np.int32)))
        else:
            out = self._array(item)
        return cast("BatchT", out)

    def _documents(self, item: dict[str, np.ndarray[Any, Any]]) -> DocumentBatch:
        """A core ``bos_id`` dict on the devices; ``cu_seqlens`` stays on the host."""
        out: dict[str, Any] = {
            key: self._array(array.astype(np.int32, copy=False))  # labels: int64 -> int32
            for key, array in item.items()
            if key != "cu_seqlens"
        }
        out["cu_seqlens"] = item["cu_seqlens"]
        return cast(DocumentBatch, out)

    # -- iteration ---------------------------------------------------------------------------
    def _rewind(self) -> None:
        """Stop the read-ahead and move the core cursor back to the first undelivered batch."""
        if self._prefetcher is not None:
            prefetcher, self._prefetcher = self._prefetcher, None
            prefetcher.close()
            self._loader.load_state_dict(prefetcher.state)

    def __iter__(self) -> Iterator[BatchT]:
        """Serve the rest of the current epoch, ``prefetch`` batches ahead on the devices."""
        self._rewind()
        self._prefetcher = Lookahead(
            iter_with_state(self._loader), self._to_device, self.prefetch, self._loader.state_dict()
        )
        return self._prefetcher

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self._loader)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is the current epoch of delivered batches)."""
        self._rewind()
        self._loader.set_epoch(epoch)

    # -- checkpointing -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The core loader state after the last *delivered* batch (JSON-serialisable)."""
        if self._prefetcher is not None:
            return dict(self._prefetcher.state)
        return self._loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume right after the batch ``state`` was saved at (a core loader state too)."""
        self._rewind()
        self._loader.load_state_dict(state)

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the read-ahead and release the file; ``state_dict`` still works."""
        if self._prefetcher is not None:
            self._prefetcher.close()
        self._loader.reader.close()

    def __enter__(self) -> JaxBatchIterator[BatchT]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
