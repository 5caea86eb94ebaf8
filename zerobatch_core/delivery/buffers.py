"""Reused output arrays for the converting (int64) paths, and the stage that fills them ahead.

A fresh 128 KiB array per batch costs more than the conversion into it: the allocator hands
large blocks back to the kernel when they are freed, so every new batch faults in fresh pages.
A ``BufferPool`` keeps a few arrays and hands one out again only when nothing outside the pool
refers to it any more (no batch, view, or tensor made from it is alive), so reuse can never
overwrite data a caller still holds: a caller who keeps every batch simply gets new arrays.

``ChunkStage`` runs a producer of *chunks* (lists of items made together) on a background
thread, a few chunks ahead of the caller. The loader's int64 path uses it to convert several
consecutive batches with one copy into one pooled chunk buffer and to hand the caller views of
it: NumPy releases the GIL inside the copy, so the conversion runs on the second core while the
training loop works, and the two threads meet once per chunk instead of once per batch (a
hand-over per batch costs more than the conversion it moves away). The pool's rule covers the
chunk buffers: a chunk is overwritten only once no item made from it is alive.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

DEFAULT_CAPACITY = 8
T = TypeVar("T")


class BufferPool:
    """Arrays of one shape and dtype, reused once their previous holder has let go of them.

    Whether an array is free is read from its reference count: a view, a slice or a
    ``torch.from_numpy`` tensor of it holds a reference to it, so any of those keeps it busy.
    Up to ``capacity`` arrays are kept; when all are busy a new, unpooled array is returned.
    ``take`` may be called from several threads.
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
        self._lock = threading.Lock()
        # References an idle pooled array has, as counted by ``_refs`` (the pool's list entry
        # plus the call's own argument); measured rather than assumed.
        probe: list[npt.NDArray[Any]] = [np.empty(0, self.dtype)]
        self._idle = _refs(probe, 0)

    def take(self) -> npt.NDArray[Any]:
        """An array of the pool's shape and dtype that nobody else holds (contents undefined)."""
        with self._lock:  # the reference returned exists before another thread can look
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

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process: the same shape and capacity, none of these arrays."""
        state = self.__dict__.copy()
        del state["_lock"]
        state["_buffers"] = []
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


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


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def stop_at_exit(stage: Any) -> None:
    """Have ``stage.close()`` called at interpreter exit if ``stage`` is still alive then.

    Background stages run daemon threads; one still inside a library call (a copy, a tensor
    operation) while the interpreter tears itself down can crash it, so each is stopped first.
    """
    _LIVE.add(stage)


class ChunkStage(Generic[T]):
    """Iterate ``chunks`` on a daemon thread, at most ``depth`` chunks ahead of the caller.

    The caller takes chunks in order with ``next()``; an exception raised by the producer is
    raised in the caller after the chunks made before it. ``close`` (also on reaching the end,
    and for every live stage at interpreter exit) stops the thread, waiting at most for the
    chunk being made, and drops what was made ahead. In a forked child (a ``DataLoader`` worker)
    a stage inherited from the parent has no thread: ``close`` there only forgets it.
    """

    def __init__(self, chunks: Iterator[T], depth: int) -> None:
        if depth < 1:
            raise ValueError(f"chunk depth must be at least 1, got {depth}")
        self._depth = depth
        self._ready: collections.deque[object] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._stopped = False
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._run, args=(chunks,), name="zerobatch-chunks", daemon=True
        )
        stop_at_exit(self)
        self._thread.start()

    def _run(self, chunks: Iterator[T]) -> None:
        cond, ready = self._cond, self._ready
        try:
            for chunk in chunks:
                with cond:
                    while len(ready) >= self._depth and not self._stopped:
                        cond.wait()
                    if self._stopped:
                        return
                    ready.append(chunk)
                    cond.notify()
                del chunk  # nothing of a handed-over chunk stays referenced here
            end: object = _END
        except BaseException as error:  # handed to the caller, raised there
            end = _Failure(error)
        with cond:
            if not self._stopped:
                ready.append(end)
                cond.notify()

    def __iter__(self) -> ChunkStage[T]:
        return self

    def __next__(self) -> T:
        cond, ready = self._cond, self._ready
        with cond:
            while not ready and not self._stopped:
                cond.wait()
            if self._stopped:
                raise StopIteration
            got = ready.popleft()
            cond.notify()
        if got is _END:
            self.close()
            raise StopIteration
        if isinstance(got, _Failure):
            self.close()
            raise got.error
        return got  # type: ignore[return-value]

    @property
    def running(self) -> bool:
        """Whether the producing thread is alive in this process."""
        return self._pid == os.getpid() and self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread and drop the chunks made ahead (idempotent)."""
        if self._pid != os.getpid():
            return  # a fork's copy: the thread and its lock belong to the parent
        with self._cond:
            self._stopped = True
            self._ready.clear()
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        _LIVE.discard(self)


@atexit.register
def _stop_live_stages() -> None:
    """Stop every stage still running when the interpreter exits (before modules go away)."""
    for stage in list(_LIVE):
        stage.close()
        _LIVE.discard(stage)
