"""Ways to serve int32 batches from uint16 tokens, against int32 views of uint32 tokens.

The loader serves int32 batches of a uint32 file as views (the same bits, no work) and those of
a uint16 file as widened copies. This probe measures, outside the loader, what each way of
widening lets a loop reach that sums every token of every ``[32, 512]`` batch in int32 (the
loader suite's consume operation), against the same loop over int32 views of the uint32 file
of the same tokens, in one process, page cache warm, medians of ``--reps`` passes:

- ``caller``: the loop's own thread widens a chunk of consecutive batches (``np.copyto`` into
  one reused buffer) when it needs the next one: what the loader does, with 2 MiB chunks.
- ``ring``: a second thread widens chunks into a ring of 4 buffers ahead of the loop.
- ``split``: each chunk is widened half by the loop's thread and half by a second thread.
- ``process``: a child process maps the file itself and widens chunks into a ring of 4
  shared-memory buffers, pipes carrying "filled" and "free" (its first pass includes the
  child's page faults on its own mapping, so the figure is the median of later passes).

``--switch-interval`` sets ``sys.setswitchinterval`` (the interpreter lock's hand-over period)
for the thread designs. RESULTS.md ("uint16 token files against uint32") has a run.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import scratch_dir

BATCH = 32 * 512
"""Tokens of one ``[32, 512]`` batch."""
DEPTH = 4
"""Chunk buffers of the ring designs."""


def _mapped(path: Path, dtype: Any) -> np.ndarray[Any, Any]:
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(data, dtype=dtype)


def _sum_batches(buf: np.ndarray[Any, Any]) -> None:
    for i in range(0, buf.size, BATCH):
        buf[i : i + BATCH].sum(dtype=np.int32)


def view(wide: np.ndarray[Any, Any], narrow: np.ndarray[Any, Any], chunk: int) -> None:
    _sum_batches(wide)


def caller(wide: np.ndarray[Any, Any], narrow: np.ndarray[Any, Any], chunk: int) -> None:
    buf = np.empty(chunk, np.int32)
    for c in range(0, narrow.size, chunk):
        np.copyto(buf, narrow[c : c + chunk], casting="unsafe")
        _sum_batches(buf)


def ring(wide: np.ndarray[Any, Any], narrow: np.ndarray[Any, Any], chunk: int) -> None:
    bufs = [np.empty(chunk, np.int32) for _ in range(DEPTH)]
    free, full = threading.Semaphore(DEPTH), threading.Semaphore(0)
    n = narrow.size // chunk

    def fill() -> None:
        for j in range(n):
            free.acquire()
            np.copyto(bufs[j % DEPTH], narrow[j * chunk : (j + 1) * chunk], casting="unsafe")
            full.release()

    worker = threading.Thread(target=fill)
    worker.start()
    for j in range(n):
        full.acquire()
        _sum_batches(bufs[j % DEPTH])
        free.release()
    worker.join()


def split(wide: np.ndarray[Any, Any], narrow: np.ndarray[Any, Any], chunk: int) -> None:
    buf, half = np.empty(chunk, np.int32), chunk // 2
    go, done = threading.Semaphore(0), threading.Semaphore(0)
    at: list[int | None] = [0]

    def fill() -> None:
        while True:
            go.acquire()
            c = at[0]
            if c is None:
                return
            np.copyto(buf[half:], narrow[c + half : c + chunk], casting="unsafe")
            done.release()

    worker = threading.Thread(target=fill)
    worker.start()
    for c in range(0, narrow.size, chunk):
        at[0] = c
        go.release()
        np.copyto(buf[:half], narrow[c : c + half], casting="unsafe")
        done.acquire()
        _sum_batches(buf)
    at[0] = None
    go.release()
    worker.join()


def _serve(path: str, name: str, chunk: int, passes: int, orders: Connection, filled: int) -> None:
    """The child of ``process``: widen every chunk of ``path`` into the ring, ``passes`` times."""
    narrow = _mapped(Path(path), np.uint16)
    segment = shared_memory.SharedMemory(name=name)
    bufs = np.ndarray((DEPTH, chunk), np.int32, buffer=segment.buf)
    n = narrow.size // chunk
    for _ in range(passes):
        for j in range(n):
            if j >= DEPTH:
                orders.recv_bytes()  # a buffer was given back
            np.copyto(bufs[j % DEPTH], narrow[j * chunk : (j + 1) * chunk], casting="unsafe")
            os.write(filled, b"x")
    del bufs
    segment.close()


def process_ring(path: Path, chunk: int, reps: int) -> list[float]:
    """Seconds of each of ``reps`` passes of the ``process`` design."""
    segment = shared_memory.SharedMemory(create=True, size=DEPTH * chunk * 4)
    bufs = np.ndarray((DEPTH, chunk), np.int32, buffer=segment.buf)
    orders_r, orders_w = mp.Pipe(duplex=False)
    filled_r, filled_w = os.pipe()
    n = path.stat().st_size // 2 // chunk
    child = mp.get_context("fork").Process(
        target=_serve, args=(str(path), segment.name, chunk, reps, orders_r, filled_w)
    )
    child.start()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for j in range(n):
            os.read(filled_r, 1)
            _sum_batches(bufs[j % DEPTH])
            if j + DEPTH < n:
                orders_w.send_bytes(b"f")
        times.append(time.perf_counter() - t0)
    child.join()
    del bufs
    segment.close()
    segment.unlink()
    os.close(filled_r)
    os.close(filled_w)
    return times


def _median_rate(fn: Callable[[], None], tokens: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return tokens / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2**25, help="tokens (default 2**25)")
    parser.add_argument("--reps", type=int, default=7, help="passes per figure (default 7)")
    parser.add_argument(
        "--chunks-kib",
        default="256,1024,2048,4096",
        help="chunk sizes in KiB of int32 (default 256,1024,2048,4096)",
    )
    parser.add_argument(
        "--switch-interval", type=float, default=None, help="seconds (default: Python's own)"
    )
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    chunks = [int(k) * 1024 // 4 for k in args.chunks_kib.split(",")]
    tokens = args.tokens // max(chunks) * max(chunks)
    work = scratch_dir("widening-")
    try:
        ids = np.random.default_rng(0).integers(0, 50_257, tokens, dtype=np.uint32)
        (work / "u32").write_bytes(ids.tobytes())
        (work / "u16").write_bytes(ids.astype(np.uint16).tobytes())
        del ids
        wide, narrow = _mapped(work / "u32", np.int32), _mapped(work / "u16", np.uint16)
        wide.sum(), narrow.sum()  # mapped and in the page cache
        base = _median_rate(lambda: view(wide, narrow, 0), tokens, args.reps)
        load = os.getloadavg()[0]
        print(f"int32 views of the uint32 file: {base / 1e9:.2f}G tok/s; load {load:.2f}")
        for chunk in chunks:
            row = []
            for name, design in (("caller", caller), ("ring", ring), ("split", split)):
                rate = _median_rate(lambda d=design, c=chunk: d(wide, narrow, c), tokens, args.reps)
                row.append(f"{name} {rate / base:.2f}x")
            times = process_ring(work / "u16", chunk, args.reps)
            later = tokens / statistics.median(times[1:] or times)
            row.append(f"process {later / base:.2f}x (first pass {tokens / times[0] / base:.2f}x)")
            print(f"  {chunk * 4 // 1024:5d} KiB chunks: " + ", ".join(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
