"""``BatchStream`` and its stages: delivery order, the delivered cursor, read-ahead and errors.

The adapter contract itself (every framework, the same surface) is ``tests/adapters/
test_contract.py``; these tests pin the core pieces it is made of, with NumPy only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zerobatch_core import BatchNativeLoader, BatchStream, Position, StateError
from zerobatch_core.delivery.stream import Lookahead, Prefetcher, Stage

MakeFile = Callable[..., Path]
ORDER: dict[str, Any] = {"block_size": 3, "seed": 99}


def firsts(items: Any) -> list[int]:
    return [int(b[0, 0]) for b in items]


def core_firsts(path: Path, epoch: int = 0) -> list[int]:
    return firsts(BatchNativeLoader(path, epoch=epoch, **ORDER))


class Ahead(BatchStream[Any]):
    """A NumPy stream that prepares items ahead (as device adapters do) and counts the work."""

    def __init__(self, source: Path, stage: Stage, **kw: Any) -> None:
        self.stage, self.transferred = stage, 0
        super().__init__(source, **kw)

    def _stage(self) -> Stage | None:
        return self.stage

    def _transfer(self, item: Any) -> Any:
        self.transferred += 1
        return np.array(item)


@pytest.mark.parametrize("stage", ["thread", "caller"])
def test_the_cursor_counts_delivered_items_not_read_ahead(
    make_file: MakeFile, stage: Stage
) -> None:
    path = make_file(n=4 * 13, batch_size=4)
    e0 = core_firsts(path)
    data = Ahead(path, stage, prefetch=3, **ORDER)
    it = iter(data)
    got = firsts(next(it) for _ in range(4))
    if stage == "thread":
        deadline = threading.Event()
        deadline.wait(0.2)  # let the thread fill its queue
    assert data.transferred >= 4 + (3 if stage == "caller" else 1)
    assert data.position == Position(0, 4) and data.state_dict()["step"] == 4
    state = json.loads(json.dumps(data.state_dict()))
    # A new pass drops the read-ahead and continues at the first undelivered item.
    got += firsts(data)
    assert next(it, None) is None
    assert got == e0 and data.position == Position(1, 0)
    resumed = BatchStream(path, **ORDER)
    resumed.load_state_dict(state)
    assert firsts(resumed) == e0[4:]


def test_set_epoch_and_load_state_end_a_pass_that_reads_ahead(make_file: MakeFile) -> None:
    path = make_file(n=4 * 13, batch_size=4)
    data = Ahead(path, "thread", prefetch=2, **ORDER)
    it = iter(data)
    next(it)
    data.set_epoch(2)
    assert next(it, None) is None and data.position == Position(2, 0)
    assert firsts(data) == core_firsts(path, epoch=2)
    it = iter(data)
    next(it)
    data.load_state_dict(BatchNativeLoader(path, **ORDER).state_dict())
    assert next(it, None) is None and data.position == Position(0, 0)


def test_a_stream_from_a_loader_shares_its_cursor(make_file: MakeFile) -> None:
    path = make_file(n=4 * 13, batch_size=4)
    loader = BatchNativeLoader(path, dtype="int32", **ORDER)
    data = BatchStream.from_loader(loader)
    assert firsts(data) == core_firsts(path)
    assert loader.position == Position(1, 0)
    data.close()
    assert not loader.reader.closed  # the loader's file belongs to the loader
    int64_only: Any = type("Int64Only", (BatchStream,), {"dtypes": ("int64",)})
    with pytest.raises(ValueError, match="serves"):
        int64_only.from_loader(loader)


def test_a_worker_state_is_refused_by_a_whole_stream(make_file: MakeFile) -> None:
    path = make_file(n=4 * 13, batch_size=4)
    worker = BatchNativeLoader(path, **ORDER)
    worker.split_workers(1, 2)
    with pytest.raises(StateError, match="worker 1 of 2"):
        BatchStream(path, **ORDER).load_state_dict(worker.state_dict())


def test_prefetcher_reraises_and_stops() -> None:
    def source() -> Iterator[int]:
        yield 0
        yield 1
        raise RuntimeError("bad item")

    p = Prefetcher(source(), 2)
    assert next(p) == 0 and next(p) == 1
    with pytest.raises(RuntimeError, match="bad item"):
        next(p)
    with pytest.raises(StopIteration):
        next(p)
    endless = Prefetcher(iter(int, 1), 2)
    next(endless)
    endless.close()
    assert not endless._thread.is_alive()


def test_lookahead_produces_depth_items_ahead() -> None:
    produced: list[int] = []

    def source() -> Iterator[int]:
        for i in range(5):
            produced.append(i)
            yield i

    ahead = Lookahead(source(), 2)
    assert next(ahead) == 0 and produced == [0, 1, 2]  # two ready beyond the one handed out
    assert list(ahead) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="depth"):
        Lookahead(iter([]), 0)
