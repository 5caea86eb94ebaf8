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

Context parallelism: a ``NamedSharding`` over a 2-D ``("data", "context")`` mesh with
``PartitionSpec("data", "context")`` (``data_context_sharding``) splits the rows over
``"data"`` and the token columns over ``"context"``; each process reads only its devices'
block of rows and columns::

    sharding = data_context_sharding(context_size=2)  # e.g. 4 x 2 devices
    it = JaxBatchIterator("train.batch", sharding=sharding, next_token=True, zigzag=True)

With ``zigzag=True`` the global array's columns are in zig-zag order: with ``C`` devices on
the context axis and the width cut into ``2C`` chunks, device ``c`` holds chunks ``c`` and
``2C - 1 - c`` (the load-balanced split for causal attention), so the plain contiguous split
of the context axis gives every device its balanced chunks. Position-dependent code (RoPE,
causal masks) must use the same order; a chunk's labels are its tokens one position later.

Multi-host: call ``jax.distributed.initialize()`` first, then build the same iterator (same
file, same sharding over the global mesh) in every process. Block order, rank slicing,
next-token pairs and the checkpoint cursor all come from ``zerobatch_core``; this module only
maps the sharding to the core's ``Slicing`` (``process_block``) and moves arrays to devices.
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
from zerobatch_core.remote import RemoteSource

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CONTEXT_AXIS",
    "DATA_AXIS",
    "DocumentBatch",
    "JaxBatchIterator",
    "ProcessBlock",
    "ProcessRows",
    "data_context_sharding",
    "default_sharding",
    "process_block",
    "process_rows",
]

DATA_AXIS = "data"
"""Name of the mesh axis the batch rows are split over (``default_sharding``, and the first
axis of ``data_context_sharding``)."""

CONTEXT_AXIS = "context"
"""Name of the mesh axis ``data_context_sharding`` splits the token columns over."""


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
_partition_spec: Callable[..., PartitionSpec] = PartitionSpec
_make_array: Callable[[Sharding, np.ndarray[Any, Any], tuple[int, ...]], jax.Array] = (
    jax.make_array_from_process_local_data
)


def _ordered(devices: list[jax.Device] | None) -> list[jax.Device]:
    """``devices`` as given, or every device ordered by process then id (each process's
    devices adjacent, so each process holds one contiguous block of every batch)."""
    if devices is None:
        return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return list(devices)


def default_sharding(devices: list[jax.Device] | None = None) -> NamedSharding:
    """Batch axis split over ``devices``, in the order given.

    A ``NamedSharding`` on a 1-D mesh named ``"data"`` with ``PartitionSpec("data")``: the
    ``k``-th device holds rows ``[k * B / n, (k + 1) * B / n)`` and the sequence axis stays
    whole. The default is every device of every process, ordered by process then id, so that
    each process's devices, and hence its rows, are adjacent (what ``process_rows`` needs).
    """
    devs = _ordered(devices)
    if not devs:
        raise ValueError("default_sharding needs at least one device")
    return NamedSharding(Mesh(np.asarray(devs), (DATA_AXIS,)), _partition_spec(DATA_AXIS))


def data_context_sharding(
    context_size: int, devices: list[jax.Device] | None = None
) -> NamedSharding:
    """Rows over ``"data"``, token columns over ``"context"``: data and context parallelism.

    A ``NamedSharding`` on a 2-D mesh ``("data", "context")`` of shape ``(n // context_size,
    context_size)`` with ``PartitionSpec("data", "context")``: devices are laid out row-major
    (``devices[i * context_size + c]`` is data index ``i``, context index ``c``), by default
    every device ordered by process then id, so a process whose device count is a multiple of
    ``context_size`` holds whole context groups (rows of the mesh): a contiguous run of the
    batch rows and all columns. Each device holds rows ``[i * B / D, (i + 1) * B / D)`` and
    columns ``[c * W / C, (c + 1) * W / C)`` of the global ``[B, W]`` array (with ``zigzag``,
    those columns are token chunks ``c`` and ``2C - 1 - c``; see ``JaxBatchIterator``).
    """
    devs = _ordered(devices)
    if isinstance(context_size, bool) or not isinstance(context_size, int) or context_size < 1:
        raise ValueError(f"context_size must be a positive integer, got {context_size!r}")
    if not devs or len(devs) % context_size:
        raise ValueError(
            f"{len(devs)} devices do not form a (data, context) mesh with context_size "
            f"{context_size}: use a context size that divides the device count"
        )
    grid = np.asarray(devs).reshape(len(devs) // context_size, context_size)
    mesh = Mesh(grid, (DATA_AXIS, CONTEXT_AXIS))
    return NamedSharding(mesh, _partition_spec(DATA_AXIS, CONTEXT_AXIS))


class ProcessRows(NamedTuple):
    """The rows of every batch one process holds, as the core loader's rank of a world.

    ``rows == rank_rows(batch_size, rank, world_size)``: a ``BatchNativeLoader`` built with
    this ``rank`` and ``world_size`` reads exactly these rows.
    """

    rank: int
    world_size: int
    rows: slice


class ProcessBlock(NamedTuple):
    """The block of every global ``[rows, width]`` array one process holds, as core coordinates.

    Rows ``rows`` are data-parallel rank ``rank`` of ``world_size`` (as ``ProcessRows``);
    columns ``columns`` are ``context_count`` consecutive context-parallel ranks from
    ``context_rank`` of ``context_size``, where ``context_size`` is the number of equal column
    blocks the sharding cuts the width into (the devices on the context axis). A core
    ``Slicing(rank, world_size, context_rank, context_size, context_count, zigzag)`` serves
    exactly this block: without ``zigzag`` the columns are the tokens ``columns``; with it, the
    global array's columns are in zig-zag order and the block is the chunks of those ranks.
    """

    rank: int
    world_size: int
    rows: slice
    context_rank: int
    context_size: int
    context_count: int
    columns: slice


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


def _axis_spans(
    indices_map: Mapping[Any, tuple[Any, ...] | None], global_shape: tuple[int, ...]
) -> list[set[tuple[int, int]]]:
    """For each axis, the distinct ``[start, stop)`` spans this process's devices hold."""
    if not indices_map:
        raise ValueError("the sharding gives this process no device: it would receive no rows")
    if not global_shape:
        raise ValueError("global_shape must have a batch axis")
    per_axis: list[set[tuple[int, int]]] = [set() for _ in global_shape]
    for index in indices_map.values():
        given = () if index is None else tuple(index)  # None: the whole array
        full = given + (slice(None),) * (len(global_shape) - len(given))
        for axis, size in enumerate(global_shape):
            per_axis[axis].add(_span(full[axis], size, axis))
    return per_axis


def _whole(per_axis: list[set[tuple[int, int]]], global_shape: tuple[int, ...], first: int) -> None:
    """Raise unless this process holds the whole of every axis from ``first`` on."""
    for axis, spans in enumerate(per_axis[first:], start=first):
        if _union(spans) != [(0, global_shape[axis])]:
            allowed = "the batch axis" if first == 1 else "the batch and sequence axes"
            raise ValueError(
                f"the sharding gives this process only parts {sorted(spans)} of axis {axis} "
                f"(size {global_shape[axis]}); only {allowed} may be split across processes"
            )


def _row_part(spans: set[tuple[int, int]], batch_size: int) -> ProcessRows:
    """The process's rows as one of equal parts of the batch: a data-parallel rank."""
    rows = _union(spans)
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


def _column_part(spans: set[tuple[int, int]], width: int) -> tuple[int, int, int, slice]:
    """``(context_rank, context_size, context_count, columns)`` of the process's columns.

    Every device holds one of ``width // chunk`` equal column blocks (``chunk`` wide); the
    process's blocks must be one contiguous run of them.
    """
    run = _union(spans)
    if len(run) != 1:
        raise ValueError(
            f"the sharding gives this process the non-contiguous columns {run} of width "
            f"{width}; each process must hold one contiguous run of the context axis (order "
            "the mesh devices so that each process's devices on that axis are adjacent)"
        )
    widths = sorted({stop - start for start, stop in spans})
    chunk = widths[0]
    if len(widths) != 1 or chunk == 0 or width % chunk or any(a % chunk for a, _ in spans):
        raise ValueError(
            f"the sharding gives this process's devices the column blocks {sorted(spans)} of "
            f"width {width}, which are not equal parts splitting the width; every device must "
            "hold one of equal column blocks (a sharding of the context axis)"
        )
    start, stop = run[0]
    return start // chunk, width // chunk, (stop - start) // chunk, slice(start, stop)


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
    else raises ``ValueError`` naming the rows found. ``process_block`` also allows a split of
    the sequence axis across processes (context parallelism).
    """
    per_axis = _axis_spans(indices_map, global_shape)
    _whole(per_axis, global_shape, 1)
    return _row_part(per_axis[0], global_shape[0])


def process_block(
    indices_map: Mapping[Any, tuple[Any, ...] | None], global_shape: tuple[int, ...]
) -> ProcessBlock:
    """Map a process's device indices over a global ``[rows, width]`` array to core coordinates.

    As ``process_rows``, and the process's devices may also hold only some of the columns
    (axis 1, split over a context axis): every device one of the equal column blocks the
    sharding cuts the width into, the process's together one contiguous run of them. Rows
    give the data-parallel rank, columns the context-parallel ranks (``ProcessBlock``).
    Devices may repeat blocks (replication over a model axis). Axes past 1 must be whole.

    >>> process_block({0: (slice(8, 16), slice(4, 8))}, (16, 8))  # doctest: +NORMALIZE_WHITESPACE
    ProcessBlock(rank=1, world_size=2, rows=slice(8, 16, None),
                 context_rank=1, context_size=2, context_count=1, columns=slice(4, 8, None))
    """
    if len(global_shape) < 2:
        raise ValueError(f"global_shape must be [rows, width, ...], got {global_shape}")
    per_axis = _axis_spans(indices_map, global_shape)
    _whole(per_axis, global_shape, 2)
    rank, world_size, rows = _row_part(per_axis[0], global_shape[0])
    context_rank, context_size, count, columns = _column_part(per_axis[1], global_shape[1])
    return ProcessBlock(rank, world_size, rows, context_rank, context_size, count, columns)


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

    Ranks: by default the whole step is the global array and the sharding alone says which
    process reads which block of it (``rank``/``world_size`` are not read from the
    environment: under ``jax.distributed`` the processes are the sharding's). Rows split over
    the mesh are data parallelism; columns split over a mesh axis (``PartitionSpec("data",
    "context")``, see ``data_context_sharding``) are context parallelism: each process's
    devices must hold one contiguous run of rows and one contiguous run of columns
    (``process_block``), and the process reads only that block. With ``zigzag=True`` and the
    columns split over ``C`` devices, the global array's columns are in zig-zag order (device
    ``c`` holds token chunks ``c`` and ``2C - 1 - c`` of ``2C``), so each device's contiguous
    block is its load-balanced share; with ``next_token`` the labels follow the same order.
    Explicit ``rank``/``world_size`` (and ``context_rank``/``context_size``) serve that rank's
    share of every step as the global array, for several independent JAX programs splitting
    one dataset; the sharding then splits that share.

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
        reader: BatchFileReader | DatasetReader | RemoteSource,
        layout: Layout,
        next_token: bool,
        global_batch_size: int | None,
    ) -> Slicing:
        """The rank's share of the step, then this process's block of it by the sharding.

        Rows of the global array are data-parallel ranks, columns context-parallel ranks: a
        process holding rows ``[a, b)`` and the context devices ``c0 .. c0 + k - 1`` of ``C``
        reads with the core's ``Slicing(dp, D, c0, C, k, zigzag)``. Explicit coordinates pick
        the share first; the sharding then splits that share.
        """
        r, w = resolve_rank_world(layout.rank, layout.world_size, (0, 1), environment=False)
        c, size = resolve_rank_world(
            layout.context_rank,
            layout.context_size,
            (0, 1),
            names=("context_rank", "context_size"),
            environment=False,
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
                f"{self.global_shape[0]} rows and {columns} columns must divide evenly over "
                f"its mesh axes): {e}"
            ) from e
        block = process_block(indices, self.global_shape)
        self.rows: slice = block.rows  # the rows of the global array this process reads
        self.columns: slice = block.columns  # and its columns
        dp = (r * block.world_size + block.rank, w * block.world_size)
        if block.context_size == 1:  # the share's columns are not split: all of them
            return Slicing(*dp, c, size, 1, share.zigzag)
        if share.zigzag and size > 1:
            raise ValueError(
                f"{reader.path}: zigzag with an explicit context_size {size} and a sharding "
                f"that splits the columns over {block.context_size} devices: give one of them "
                "(the sharding's context axis alone sets the zig-zag chunks)"
            )
        if share.zigzag and columns % (2 * block.context_size):
            raise ValueError(
                f"{reader.path}: zigzag over the sharding's {block.context_size} context "
                f"devices cuts the width {columns} into {2 * block.context_size} chunks, which "
                f"does not divide it (use a context axis whose size times 2 divides {columns})"
            )
        return Slicing(
            *dp,
            c * block.context_size + block.context_rank,
            size * block.context_size,
            block.context_count,
            share.zigzag,
        )

    def _converter(self, key: str) -> Callable[[np.ndarray[Any, Any]], Any]:
        if key == "cu_seqlens":
            return _host
        dtype = np.dtype(self.dtype)
        sharding, shape = self.sharding, self.global_shape

        def to_devices(local_block: np.ndarray[Any, Any]) -> jax.Array:
            # One global array from this process's block: each device gets its part, once.
            return _make_array(sharding, local_block.astype(dtype, copy=False), shape)

        return to_devices

    def _stage(self) -> Stage | None:
        return "caller"


def _host(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return array
