"""How PyTorch batches cross boundaries: from ``DataLoader`` workers to the main process, and
from the host to a device.

Worker processes. A batch made in a worker is, unless a transform changed it, a region of a file
the main process can map itself. ``Shipped`` tensors (a subclass that behaves as a plain tensor:
operations on it return plain tensors) remember that region; when the ``DataLoader`` sends one,
``multiprocessing`` uses ``_reduce_shipped``, which sends the file's path and identity and the
region's coordinates if the tensor still holds exactly those tokens, and its bytes otherwise. The
main process rebuilds the batch from its own mapping (``_rebuild_region``): int32 of a uint32
file as a view of it; int64, and int32 of a uint16 file, converted into a pooled array. Sending
a tensor the default way costs a fresh shared-memory segment and a descriptor hand-over per
batch (about 1 ms here); coordinates cost what the ``DataLoader``'s own hand-over costs
(measured in ``benchmarks/RESULTS.md``).

Devices. ``StagingRing`` copies each field of a batch into one of a few reused host buffers,
pinned where the platform can, and from there to the device: no pinned allocation per batch.

int32 batches of a uint32 file (and the uint16 tokens a device path moves) are views of a
read-only mapping, and ``torch.from_numpy`` warns about that once per process, whatever the
dtype; the warning is silenced for calls from the PyTorch adapter's modules only.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import threading
import warnings
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    ZeroBatchIOError,
    int_arg,
)
from zerobatch_core.delivery.buffers import BufferPool, convert_into

_READONLY_MESSAGE = "The given NumPy array is not writable"
# Calls from the adapter's modules only: ``zerobatch_adapters.torch`` and this one.
_READONLY_MODULE = re.escape(__name__.rsplit(".", 1)[0]) + r"\.torch(?:_transfer)?\Z"
# The entry ``warnings.filterwarnings`` adds for the call below (Python 3.10+ layout).
_READONLY_FILTER = (
    "ignore",
    re.compile(re.escape(_READONLY_MESSAGE), re.IGNORECASE),
    UserWarning,
    re.compile(_READONLY_MODULE),
    0,
)


def ignore_readonly_warning() -> None:
    """Silence ``torch.from_numpy``'s read-only warning, for calls made from the adapter only.

    int32 batches are deliberately read-only views of the mapped file, so the warning says
    nothing new. The filter matches only that message, only as a ``UserWarning`` and only when
    raised from ``zerobatch_adapters.torch`` or this module: every other warning still shows.
    Each pass calls this again (a list lookup) in case ``warnings.catch_warnings`` or
    ``resetwarnings`` dropped the filter.
    """
    if _READONLY_FILTER not in warnings.filters:
        warnings.filterwarnings(
            "ignore",
            message=re.escape(_READONLY_MESSAGE),
            category=UserWarning,
            module=_READONLY_MODULE,
        )


ignore_readonly_warning()
READONLY_PROBE = np.zeros(1, dtype=np.int32)
READONLY_PROBE.flags.writeable = False


class StagingRing:
    """Reused host buffers, pinned where the platform can, that batches cross a device through.

    Each field (``"tokens"``, ``"labels"``, ...) cycles through ``slots`` buffers. A buffer is
    written again only after the copy that read it has finished (an event recorded after the
    copy is waited on), so ``slots`` bounds memory, never correctness. ``allocations`` counts
    the buffers ever allocated: it stops growing once every slot exists and is large enough.
    """

    def __init__(self, device: torch.device, slots: int, pin: bool) -> None:
        self.device, self.slots, self.pin = device, int_arg("slots", slots, 1), pin
        self.buffers: dict[str, list[torch.Tensor]] = {}
        self._events: dict[str, list[Any]] = {}
        self._next: dict[str, int] = {}
        self.allocations = 0
        self.bytes_sent = 0

    def send(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``tensor`` on the device, staged through this key's next buffer."""
        buffers = self.buffers.setdefault(key, [])
        events = self._events.setdefault(key, [])
        i = self._next.get(key, 0)
        self._next[key] = (i + 1) % self.slots
        nbytes = tensor.numel() * tensor.element_size()
        if i == len(buffers) or buffers[i].numel() < nbytes:
            buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pin)
            self.allocations += 1
            if i == len(buffers):
                buffers.append(buffer)
                events.append(None)
            else:
                buffers[i] = buffer
        if events[i] is not None:
            events[i].synchronize()  # the last copy out of this buffer has finished
        staged = buffers[i][:nbytes].view(tensor.dtype).view(tensor.shape)
        staged.copy_(tensor)
        moved = staged.to(self.device, non_blocking=True, copy=True)
        if self.device.type != "cpu":
            events[i] = torch.Event(device=self.device)
            events[i].record()
        self.bytes_sent += nbytes
        return moved


ORDER_ARRAY_LIMIT = 1 << 28
"""Steps of an epoch up to which a worker looks its slots up in the epoch's order array."""


def shipped(
    tensor: torch.Tensor,
    reader: BatchFileReader | None = None,
    index: int = 0,
    rows: slice = slice(0),
    columns: tuple[int, int] = (0, 0),
) -> Shipped:
    """``tensor`` as a ``Shipped``; given a reader, one that holds rows ``rows`` and columns
    ``columns`` of its batch ``index`` until something changes it."""
    out = tensor.as_subclass(Shipped)
    if reader is not None:
        c0, c1 = columns
        out._zb_region = reader.read_batch(index)[rows, c0:c1]
        where = (index, rows.start, rows.stop, c0, c1)
        out._zb_where = (reader.path, file_identity(reader.path), *where)
    return out


def ship(loader: BatchNativeLoader, items: Iterator[Any], pair: type[Any]) -> Iterator[Any]:
    """A worker's items (tensors, ``pair(inputs, labels)`` or dicts), each tensor a ``Shipped``
    that knows the region of the file it holds (steps of one stored batch and one column range;
    other steps travel as bytes)."""
    source, rows = loader.source, loader.rows
    lo, hi = loader.columns[0]
    columns = {"tokens": (lo, hi), "inputs": (lo, hi), "labels": (lo + 1, hi + 1)}
    whole = loader.global_batch_size == source.batch_size and len(loader.columns) == 1
    whole = whole and not source.fetches  # fetched slots travel as bytes
    order: tuple[int, Any] = (-1, None)
    position = loader.after(loader.position, 0)  # the first item's step; then the cursor's
    for item in items:
        following, (epoch, step) = loader.position, position
        slot: tuple[BatchFileReader, int] | None = None
        if whole:
            if order[0] != epoch and source.num_batches <= ORDER_ARRAY_LIMIT:
                order = (epoch, loader.epoch_order(epoch))
            if source.num_batches > ORDER_ARRAY_LIMIT:  # an endless mixture: no epoch array
                slot = source.slot_file(next(loader.order.indices(epoch, step)))
            else:
                slot = source.slot_file(int(order[1][step]))

        def mark(key: str, tensor: torch.Tensor, slot: Any = slot) -> torch.Tensor:
            if slot is None or key not in columns:
                return shipped(tensor)
            return shipped(tensor, slot[0], slot[1], rows, columns[key])

        if isinstance(item, dict):
            yield {key: mark(key, t) for key, t in item.items()}
        elif isinstance(item, pair):
            yield pair(mark("inputs", item[0]), mark("labels", item[1]))
        else:
            yield mark("tokens", item)
        position = following


class Shipped(torch.Tensor):
    """A batch made in a worker process: a plain tensor there (operations on it return plain
    tensors), sent to the parent as file coordinates while it is unchanged."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    _zb_region: Any = None  # the view of the file's tokens this tensor was made from
    _zb_where: tuple[Any, ...] | None = None  # (path, identity, slot, r0, r1, c0, c1)


_IDENTITIES: dict[str, tuple[int, ...]] = {}


def file_identity(path: str) -> tuple[int, ...]:
    """``(device, inode, size, mtime)`` of a file, once per process and path."""
    found = _IDENTITIES.get(path)
    if found is None:
        st = os.stat(path)
        found = _IDENTITIES[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def _unchanged(tensor: Shipped) -> bool:
    """Whether a worker's batch still holds exactly the tokens of its region of the file."""
    region = tensor._zb_region
    if region is None or tuple(tensor.shape) != region.shape:
        return False
    if tensor.element_size() == region.itemsize:  # a view of the mapping: compare where it lies
        strides = tuple(s // region.itemsize for s in region.strides)
        return tensor.data_ptr() == region.ctypes.data and tensor.stride() == strides
    # A widened copy (int64, or int32 of uint16 tokens): compare the values.
    widened = tensor.dtype in (torch.int32, torch.int64)
    return widened and bool(np.array_equal(tensor.numpy(), region))


def _reduce_shipped(tensor: Shipped) -> tuple[Any, tuple[Any, ...]]:
    """How ``DataLoader`` sends a worker's batch: coordinates, else its bytes."""
    if tensor._zb_where is not None and _unchanged(tensor):
        return _rebuild_region, (*tensor._zb_where, str(tensor.dtype))
    plain = tensor.as_subclass(torch.Tensor).contiguous()
    return _rebuild_bytes, (plain.numpy().tobytes(), str(plain.dtype), tuple(plain.shape))


ForkingPickler.register(Shipped, _reduce_shipped)

_READERS: collections.OrderedDict[tuple[str, tuple[int, ...]], BatchFileReader] = (
    collections.OrderedDict()
)
_READERS_LOCK = threading.Lock()
_MAX_READERS = 64
_POOLS: dict[tuple[tuple[int, ...], str], BufferPool] = {}  # by region shape and dtype


def _rebuild_region(
    path: str, identity: tuple[int, ...], local: int, r0: int, r1: int, c0: int, c1: int, dtype: str
) -> torch.Tensor:
    """In the parent: the batch a worker described, from this process's own mapping."""
    key = (path, tuple(identity))
    with _READERS_LOCK:
        reader = _READERS.get(key)
        if reader is None:
            reader = BatchFileReader(path)
            st = os.stat(path)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != key[1]:
                reader.close()
                raise ZeroBatchIOError(
                    errno.ESTALE,
                    "a DataLoader worker read another file at this path than this process maps "
                    "(the file was replaced while batches were in flight)",
                    path,
                )
            _READERS[key] = reader
            ignore_readonly_warning()  # take PyTorch's one read-only warning under the filter
            torch.from_numpy(READONLY_PROBE)
            while len(_READERS) > _MAX_READERS:
                _READERS.popitem(last=False)[1].close()
        _READERS.move_to_end(key)
        region = reader.read_batch(local)[r0:r1, c0:c1]
        kind = np.dtype(dtype.removeprefix("torch."))
        if kind.itemsize == region.itemsize:  # int32 of uint32 tokens, or the tokens themselves
            return torch.from_numpy(region.view(kind))
        shape_dtype = (region.shape, kind.str)
        pool = _POOLS.get(shape_dtype)
        if pool is None:
            pool = _POOLS[shape_dtype] = BufferPool(region.shape, kind)
        return torch.from_numpy(convert_into(pool, region, kind))


def _rebuild_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """In the parent: a changed batch from its bytes."""
    kind = getattr(torch, dtype.removeprefix("torch."))
    if not data:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(data), dtype=kind).reshape(shape)
