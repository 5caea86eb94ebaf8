"""A bounded background prefetcher shared by the adapters that move batches onto devices.

A thread pulls items from a source iterator, applies a transform (a host-to-device copy, say)
and keeps at most ``depth`` results waiting. Each item travels with the loader state *after*
it, so an adapter's ``state_dict`` reflects what the training loop received, not what the
thread has read ahead.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[S, T]):
    """Iterate ``transform(item)`` for ``(item, state)`` pairs of ``source``, ``depth`` ahead.

    ``state`` is the state after the most recently *delivered* item (``initial_state`` before
    the first). Exceptions raised in the thread are re-raised in the consumer. ``close`` stops
    the thread; it is also called when the iterator is exhausted or garbage-collected.
    """

    def __init__(
        self,
        source: Iterator[tuple[S, dict[str, Any]]],
        transform: Callable[[S], T],
        depth: int,
        initial_state: dict[str, Any],
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self.state = initial_state
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(source, transform), name="zerobatch-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[tuple[S, dict[str, Any]]], transform: Callable[[S], T]) -> None:
        try:
            for item, state in source:
                if not self._put((transform(item), state)):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failure(e))

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._stop.is_set():
            raise StopIteration
        got = self._queue.get()
        if got is _DONE:
            self.close()
            raise StopIteration
        if isinstance(got, _Failure):
            self.close()
            raise got.error
        pair: tuple[T, dict[str, Any]] = got  # type: ignore[assignment]
        self.state = pair[1]
        return pair[0]

    def close(self) -> None:
        """Stop the background thread and drop anything read ahead."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def __del__(self) -> None:
        self._stop.set()


class Lookahead(Generic[S, T]):
    """Like ``Prefetcher``, but on the calling thread: ``transform`` runs ``depth`` items ahead.

    For frameworks whose transfers are already asynchronous (JAX dispatches a host-to-device
    copy and returns at once), issuing the next copies right after handing out an item overlaps
    them with the caller's step without a second thread. That matters on XLA's CPU backend,
    where computations dispatched from two threads at once can starve a collective's
    rendezvous and abort the process.
    """

    def __init__(
        self,
        source: Iterator[tuple[S, dict[str, Any]]],
        transform: Callable[[S], T],
        depth: int,
        initial_state: dict[str, Any],
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self.state = initial_state
        self._source, self._transform, self._depth = source, transform, depth
        self._queue: collections.deque[tuple[T, dict[str, Any]]] = collections.deque()
        self._done = False

    def _fill(self) -> None:
        while not self._done and len(self._queue) < self._depth:
            try:
                item, state = next(self._source)
            except StopIteration:
                self._done = True
                return
            self._queue.append((self._transform(item), state))

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        self._fill()
        if not self._queue:
            raise StopIteration
        value, self.state = self._queue.popleft()
        self._fill()  # dispatch the next transfers before the caller starts its step
        return value

    def close(self) -> None:
        """Drop what was read ahead; ``state`` stays that of the last delivered item."""
        self._queue.clear()
        self._done = True
