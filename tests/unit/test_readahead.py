"""Read-ahead: hints run off-thread, stop at close, and never leak the reader's descriptor."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from zerobatch_core import BatchFileReader, BatchNativeLoader
from zerobatch_core.pages import Readahead

pytestmark = pytest.mark.skipif(not Readahead.available(), reason="no posix_fadvise here")


def open_fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def test_requests_run_in_a_thread_that_close_ends(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"\0" * (1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        ahead = Readahead(fd, np.fromfile(path, dtype=np.uint8))
        ahead.request(0, 1 << 20)
        ahead.request(1 << 19, 1 << 22)  # past the end of the file: harmless
        thread = ahead._thread
        assert thread is not None and thread.name == "zerobatch-readahead"
        assert ahead.close()
        assert not thread.is_alive()
        ahead.request(0, 4096)  # after close: ignored, no new thread
        assert ahead._thread is thread
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_readers_release_their_descriptor_on_close_and_on_drop(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=64)
    before = open_fds()
    loader = BatchNativeLoader(path, block_size=2)
    assert len(list(loader)) == len(loader)  # iterating starts read-ahead
    loader.reader.close()
    assert open_fds() == before
    dropped = BatchFileReader(path)
    dropped.read_ahead(0, 4)
    del dropped
    gc.collect()
    assert open_fds() == before


class _Recording(Readahead):
    """Records what reaches the thread instead of starting it."""

    def __init__(self, fd: int, mapping: np.ndarray) -> None:
        super().__init__(fd, mapping)
        self.sent: list[tuple[int, int]] = []
        self._pid = os.getpid()
        self._queue = self  # type: ignore[assignment]

    def put(self, item: tuple[int, int]) -> None:
        self.sent.append(item)


def test_a_file_that_fits_in_ram_is_populated_once_per_range(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"\0" * (1 << 16))
    ahead = _Recording(-1, np.fromfile(path, dtype=np.uint8))
    assert ahead._remember  # 64 KiB fits in half of any machine's RAM
    for _ in range(3):  # three epochs over the same two blocks
        ahead.request(0, 4096)
        ahead.request(4096, 8192)
    assert ahead.sent == [(0, 4096), (4096, 8192)]
    ahead._remember = False  # a file larger than half the RAM: evicted between epochs
    ahead.request(0, 4096)
    ahead.request(0, 4096)
    assert ahead.sent[-2:] == [(0, 4096), (0, 4096)]
