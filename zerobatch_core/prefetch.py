"""A bounded background prefetcher shared by the adapters that move batches onto devices.

A thread pulls items from a source iterator, applies a transform (a host-to-device copy, say)
and keeps at most ``depth`` results waiting. Each item travels with the loader state *after*
it, so an adapter's ``state_dict`` reflects what the training loop received, not what the
thread has read ahead.
"""

from __future__ import annotations

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
