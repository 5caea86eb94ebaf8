"""JAX adapter: LLMBATCH batches as sharded ``jax.Array``s, prefetched onto the devices.

``JaxBatchIterator`` serves ``BatchNativeLoader``'s batches as global ``jax.Array``s laid out
by a ``jax.sharding.Sharding`` (default: the batch axis split over every device). Each process
reads from the file only the rows its own devices hold, and
``jax.make_array_from_process_local_data`` copies each device's rows from the host straight
to that device, once: no device ever holds, or gathers, the whole batch. The core's look-ahead
keeps the next ``prefetch`` batches in flight while the training step runs, and ``state_dict``
counts only the batches the loop received (``zerobatch_core.BatchStream``).

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

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from zerobatch_core import (
    BatchFileReader,
    BatchStream,
    DatasetReader,
    Layout,
    Slicing,
    Source,
    Stage,
    StreamOptions,
    rank_rows,
    resolve_rank_world,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

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


class JaxBatchIterator(BatchStream[Any]):
    """Iterate an LLMBATCH file as sharded ``jax.Array`` batches, prefetched to the devices.

    Each item is a global ``jax.Array`` ``[rows, seq_len]`` placed with ``sharding`` (default
    ``default_sharding()``), or with ``next_token=True`` a pair ``(inputs, labels)`` of
    ``[rows, seq_len - 1]`` arrays with the same sharding, where ``rows`` is the batch size
    (or, with ``rank``/``world_size``, that rank's share: ``rows // world_size``). Inputs and
    labels share one dtype, ``dtype`` (int32 by default, JAX's own integer width: the core's
    zero-copy view; ids of 2**31 and above wrap to negative numbers. ``"int64"`` needs
    ``jax.config.update("jax_enable_x64", True)``); ``optax``/``jax.nn`` cross-entropy takes
    int32 labels.

    ``bos_id`` (packed rows whose documents start with that token) makes each item a
    ``DocumentBatch`` dict: ``tokens`` (or ``inputs`` and ``labels``) plus the core's document
    layout of the tokens (or inputs), ``segment_ids`` and ``positions``, int32 ``jax.Array``s
    with the tokens' shape and sharding (e.g. splash attention's segment ids, RoPE positions).
    ``cu_seqlens`` (FlashAttention's varlen layout) is served as a **host NumPy** int32 array:
    its length (documents + 1) varies from batch to batch, so it can neither be split by rows
    over the devices nor passed to ``jax.jit`` without a recompile per length. It covers this
    process's rows only, flattened in order (exact, since segments restart at every row).

    Ranks: by default the whole stored batch is the global array and the sharding alone says
    which process reads which rows (``rank``/``world_size`` are not read from the environment:
    under ``jax.distributed`` the processes are the sharding's). Explicit ``rank`` and
    ``world_size`` serve that rank's share of every batch as the global array, for several
    independent JAX programs splitting one dataset.

    Prefetch: right after handing out a batch, the copies of the next ``prefetch`` batches are
    dispatched (JAX copies asynchronously), so they overlap the caller's step. This happens on
    the caller's thread on purpose: on XLA's CPU backend, work dispatched from a second thread
    while a step runs collectives can starve the collective's rendezvous and abort. The rest
    of the surface (epochs, ``state_dict`` of delivered batches, ``close``) is ``BatchStream``'s.
    """

    dtypes = ("int32", "int64")

    def __init__(
        self,
        source: Source,
        *,
        sharding: Sharding | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        if options.get("dtype") == "int64" and jax.dtypes.canonicalize_dtype(np.int64) != np.int64:
            raise ValueError(
                "dtype='int64' needs 64-bit JAX: jax.config.update('jax_enable_x64', True) "
                "first, or use dtype='int32'"
            )
        self.sharding: Sharding = default_sharding() if sharding is None else sharding
        super().__init__(source, **options)

    def _slicing(
        self,
        reader: BatchFileReader | DatasetReader,
        layout: Layout,
        next_token: bool,
        global_batch_size: int | None,
    ) -> Slicing:
        """The rank's share of the step, then this process's rows of it by the sharding."""
        r, w = resolve_rank_world(layout.rank, layout.world_size, (0, 1), environment=False)
        c, size = resolve_rank_world(
            layout.context_rank, layout.context_size, (0, 1), environment=False
        )
        g = reader.batch_size if global_batch_size is None else global_batch_size
        share = Slicing(r, w, c, size, 1, layout.zigzag)
        width = reader.seq_len - 1 if next_token else reader.seq_len
        share.check(g, reader.batch_size, width)
        columns = sum(hi - lo for lo, hi in share.columns(width))
        # The shape of every served array (inputs and labels alike with next_token).
        self.global_shape: tuple[int, int] = (share.samples_per_step(g), columns)
        try:
            indices = self.sharding.addressable_devices_indices_map(self.global_shape)
        except ValueError as e:
            raise ValueError(
                f"{reader.path}: the sharding cannot split a {self.global_shape} batch (its "
                f"{self.global_shape[0]} rows must divide evenly over its devices): {e}"
            ) from e
        split = process_rows(indices, self.global_shape)
        self.rows: slice = split.rows  # the rows of the global array this process reads
        return Slicing(
            r * split.world_size + split.rank, w * split.world_size, c, size, 1, share.zigzag
        )

    def _converter(self, key: str) -> Callable[[np.ndarray[Any, Any]], Any]:
        if key == "cu_seqlens":
            return _host
        dtype = np.dtype(self.dtype)
        sharding, shape = self.sharding, self.global_shape

        def to_devices(local_rows: np.ndarray[Any, Any]) -> jax.Array:
            # One global array from this process's rows: each device gets its slice, once.
            return _make_array(sharding, local_rows.astype(dtype, copy=False), shape)

        return to_devices

    def _stage(self) -> Stage | None:
        return "caller"


def _host(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return array
