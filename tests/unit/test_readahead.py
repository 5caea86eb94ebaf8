"""Read-ahead: hints run off-thread, stop at close, and never leak the reader's descriptor."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from zerobatch_core import BatchFileReader, BatchNativeLoader
from zerobatch_core.files.pages import MIN_HINT_BYTES, Readahead

pytestmark = pytest.mark.skipif(not Readahead.available(), reason="no posix_fadvise here")


def open_fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def _wait(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_one_shared_thread_serves_every_reader_and_close_closes_the_descriptor(
    tmp_path: Path,
) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"\0" * (1 << 20))
    aheads = []
    for _ in range(20):  # twenty readers: still one read-ahead thread in the process
        fd = os.open(path, os.O_RDONLY)
        ahead = Readahead(fd, np.fromfile(path, dtype=np.uint8))
        ahead.request(0, 1 << 20)
        ahead.request(1 << 19, 1 << 22)  # past the end of the file: harmless
        aheads.append((fd, ahead))
    threads = [t for t in threading.enumerate() if t.name == "zerobatch-readahead"]
    assert len(threads) == 1 and threads[0].daemon
    for fd, ahead in aheads:
        ahead.close()
        _wait(lambda a=ahead: a._fd is None)  # closed now, or right after its running hint
        with pytest.raises(OSError):
            os.fstat(fd)  # the descriptor was the read-ahead's to close
        ahead.request(0, 4096)  # after close: ignored


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_readers_release_their_descriptor_on_close_and_on_drop(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=64)
    gc.collect()  # descriptors of earlier tests' dropped objects close now, not mid-test
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
    """Records what reaches the worker thread instead of hinting."""

    def __init__(self, fd: int, mapping: np.ndarray) -> None:
        super().__init__(fd, mapping)
        self.sent: list[tuple[int, int]] = []

    def _run(self, offset: int, length: int) -> None:
        self.sent.append((offset, length))


def test_a_file_that_fits_in_ram_is_populated_once_per_range(tmp_path: Path) -> None:
    path = tmp_path / "data"
    mib = MIN_HINT_BYTES
    path.write_bytes(b"\0" * (4 * mib))
    ahead = _Recording(os.open(path, os.O_RDONLY), np.fromfile(path, dtype=np.uint8))
    assert ahead._remember  # 4 MiB fits in half of any machine's RAM
    for _ in range(3):  # three epochs over the same two blocks
        ahead.request(0, mib)
        ahead.request(mib, 2 * mib)
        ahead.request(3 * mib, mib // 2)  # a small block: the kernel's own read-ahead does it
    _wait(lambda: len(ahead.sent) >= 2)
    ahead._remember = False  # a file larger than half the RAM: evicted between epochs
    ahead.request(0, mib)
    ahead.request(0, mib)
    _wait(lambda: len(ahead.sent) >= 4)
    assert ahead.sent == [(0, mib), (mib, 2 * mib), (0, mib), (0, mib)]
    ahead.close()
