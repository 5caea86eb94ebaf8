"""Sharding geometry for the JAX adapter: which rows and token columns each process holds.

A ``jax.sharding.Sharding`` says which slice of every global batch each device holds. The
core loader reads by ``Slicing`` (data-parallel rows, context-parallel column chunks), so the
adapter needs the reverse map: from a sharding to the one contiguous block of rows and column
chunks this process's devices hold together (``process_block``), and the two shardings that
have such blocks by construction (``default_sharding``, ``data_context_sharding``). Kept apart
from ``zerobatch_adapters.jax`` because it is pure geometry: no file, no loader, no transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from zerobatch_core import rank_rows

__all__ = [
    "CONTEXT_AXIS",
    "DATA_AXIS",
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


# Typed name for a JAX entry point that is unannotated in JAX itself.
_partition_spec: Callable[..., PartitionSpec] = PartitionSpec


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
