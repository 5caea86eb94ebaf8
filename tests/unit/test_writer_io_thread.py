"""The writer's I/O thread: a Ctrl-C at any point of a hand-over never leaves it waiting forever.

A signal handler runs between two bytecodes of the main thread. The test stands in for Ctrl-C
by raising ``KeyboardInterrupt`` from a trace function at the k-th traced opcode of a run of
hand-overs (every opcode, in turn, including those inside the standard library), and requires
that ``close`` then ends the thread within seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from zerobatch_core.files.writer import _IOThread


class _InterruptAt:
    """A trace function raising ``KeyboardInterrupt`` at the ``k``-th opcode it sees."""

    def __init__(self, k: int) -> None:
        self.k, self.seen = k, 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> _InterruptAt:
        frame.f_trace_opcodes = True
        if event == "opcode":
            self.seen += 1
            if self.seen == self.k:
                sys.settrace(None)
                raise KeyboardInterrupt
        return self


def _work(done: list[int], i: int) -> None:
    time.sleep(0.0002)
    done.append(i)


def _closes_in_time(io: _IOThread, seconds: float = 5.0) -> bool:
    closer = threading.Thread(target=io.close, daemon=True)
    closer.start()
    closer.join(seconds)
    return not closer.is_alive()


def test_an_interrupt_at_any_opcode_of_a_hand_over_never_hangs_close() -> None:
    k, points = 1, 0
    while True:
        io, done = _IOThread(depth=2), []
        interrupted = False
        sys.settrace(_InterruptAt(k))
        try:
            for i in range(4):
                io.submit(_work, done, i)
            io.wait()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        assert _closes_in_time(io), f"close hung after an interrupt at opcode {k}"
        assert not io._thread.is_alive()
        assert done == sorted(done)  # jobs ran in submission order, none twice
        if not interrupted:
            assert done == [0, 1, 2, 3]
            break
        points, k = points + 1, k + 1
    assert points > 50  # the hand-overs were interrupted at every one of their opcodes


def test_errors_reach_the_caller_and_close_skips_queued_jobs() -> None:
    io, done = _IOThread(depth=2), []
    gate = threading.Event()

    def fail() -> None:
        gate.wait(5)
        raise OSError(28, "No space left on device")

    io.submit(fail)
    io.submit(_work, done, 1)
    gate.set()
    with pytest.raises(OSError, match="No space"):
        io.wait()
    io.close()
    assert not io._thread.is_alive()

    io = _IOThread(depth=3)
    gate.clear()
    io.submit(gate.wait, 5)
    io.submit(_work, done, 2)
    io.submit(_work, done, 3)
    io.stopping = True  # what close sets first: jobs not yet started are skipped
    gate.set()
    io.close()
    assert done == [1]


def test_a_ctrl_c_during_close_waits_for_the_running_job_then_is_raised() -> None:
    io, done = _IOThread(depth=1), []
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        done.append(1)

    def interrupt_in_join(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == "join":
            sys.settrace(None)
            raise KeyboardInterrupt
        return None

    io.submit(slow)
    started.wait(5)
    with pytest.raises(KeyboardInterrupt):
        sys.settrace(interrupt_in_join)
        try:
            io.close()
        finally:
            sys.settrace(None)
    assert done == [1] and not io._thread.is_alive()  # the write ended before close returned


def test_submit_waits_while_depth_jobs_are_in_flight() -> None:
    """At most ``depth`` jobs are queued or running: the writer's memory in flight is bounded."""
    io = _IOThread(depth=2)
    gates = [threading.Event() for _ in range(3)]
    submitted: list[int] = []

    def submit_all() -> None:
        for i, gate in enumerate(gates):
            io.submit(gate.wait, 5)
            submitted.append(i)

    feeder = threading.Thread(target=submit_all)
    feeder.start()
    time.sleep(0.2)
    assert submitted == [0, 1]  # the third waits for a job to finish
    gates[0].set()
    feeder.join(5)
    assert submitted == [0, 1, 2]
    for gate in gates:
        gate.set()
    io.wait()
    io.close()


INTERRUPTED_START = """
import threading, numpy as np
from zerobatch_core import write_batch_dataset

start = threading.Thread.start

def interrupted(self):  # Ctrl-C inside Thread.start, once the thread runs
    start(self)
    if self.name == "zerobatch-writer":
        raise KeyboardInterrupt

threading.Thread.start = interrupted
try:
    write_batch_dataset(OUT, iter([np.zeros((64, 8), np.uint32)]), 64, 4, 8)
except KeyboardInterrupt:
    print("interrupted")
"""


def test_an_interrupt_inside_the_threads_start_does_not_keep_the_process_alive(
    tmp_path: Path,
) -> None:
    """The I/O thread left behind when ``Thread.start`` is interrupted (before its owner can
    close it) must not keep the interpreter from exiting: ``zerobatch convert`` printed
    "interrupted" and then waited for ever at exit."""
    script = INTERRUPTED_START.replace("OUT", repr(str(tmp_path / "x.batch")))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "interrupted", proc.stderr
    assert os.listdir(tmp_path) == []
