"""SIGKILL every writer at random points: no partial output, no temporary file outlives the next
write (none at all where unnamed files exist), and no partial file ever carries the magic.

A zygote process imports ZeroBatch once and forks one child per trial; the child writes a file
of about 48 MiB (``write_batch_file`` from a memory-mapped array, ``write_batch_dataset`` from
a stream of blocks, or ``convert`` from a ``.npy`` file) and the zygote kills it after a random
delay drawn over the length of an uninterrupted write, so kills land before the output is
created, during the data, around the header write, fsync and link, and after the end. Trials
alternate between a new output (``overwrite=False``) and replacing an old file
(``overwrite=True``). After each kill:

- the output path holds what it held before or the complete new file, byte for byte;
- with unnamed files (``O_TMPFILE``) no hidden temporary exists, except, when replacing, a
  complete copy of the new output under a hidden name (the instant between link and rename);
- with named temporaries (the fallback, forced here) any leftover either lacks the magic or is
  the complete output;
- after the next write into the directory, nothing but the output and that write remain.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
from zerobatch_spec import MAGIC

from zerobatch_core import write_batch_file

TRIALS = 20
SEQ_LEN, BATCH_SIZE, SEED = 256, 8, 1
RECORDS = 48 * 2**20 // (SEQ_LEN * 4)

ZYGOTE = r"""
import json, os, signal, sys, time, traceback
import numpy as np
from zerobatch_core import write_batch_dataset, write_batch_file
from zerobatch_core.files import writer
from zerobatch_core.ingest.convert import convert

def run(job):
    if not job["unnamed"]:
        writer._open_unnamed = lambda directory: None
    out, overwrite, b, seed = job["out"], job["overwrite"], job["batch_size"], job["seed"]
    rows = np.load(job["source"], mmap_mode="r")
    if job["writer"] == "write_batch_file":
        write_batch_file(out, rows, b, seed=seed, overwrite=overwrite)
    elif job["writer"] == "write_batch_dataset":
        blocks = (np.asarray(rows[i : i + 4096]) for i in range(0, len(rows), 4096))
        write_batch_dataset(out, blocks, len(rows), b, rows.shape[1], seed, overwrite=overwrite)
    else:
        convert([job["source"]], out, seq_len=rows.shape[1], batch_size=b, seed=seed,
                overwrite=overwrite)

for line in sys.stdin:
    job = json.loads(line)
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            run(job)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    if job["delay"] is not None:
        time.sleep(job["delay"])
        os.kill(pid, signal.SIGKILL)  # a child that has exited is a zombie until reaped: fine
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    print(json.dumps({"killed": killed, "exit": code, "seconds": time.perf_counter() - start}),
          flush=True)
"""


class Zygote:
    """The forking process: ``run(job)`` writes in a fresh child, killed after ``delay``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, **job: Any) -> dict[str, Any]:
        stdin: IO[str] | None = self.proc.stdin
        stdout: IO[str] | None = self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(job) + "\n")
        stdin.flush()
        line = stdout.readline()
        assert line, "the zygote died"
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    try:
        yield z
    finally:
        z.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, bytes]:
    """The source array, the output every writer makes of it, and an older file to replace."""
    directory = tmp_path_factory.mktemp("source")
    path = directory / "src.npy"
    rows = np.arange(RECORDS * SEQ_LEN, dtype=np.uint32).reshape(RECORDS, SEQ_LEN)
    np.save(path, rows)
    write_batch_file(directory / "ref.batch", rows, BATCH_SIZE, seed=SEED)
    write_batch_file(directory / "old.batch", rows[:64], BATCH_SIZE, seed=SEED + 1)
    ref, old = ((directory / n).read_bytes() for n in ("ref.batch", "old.batch"))
    return path, ref, old


def unnamed_files_work(directory: Path) -> bool:
    """Whether ``directory`` takes ``O_TMPFILE`` files (asked directly, not through the writer,
    so that a writer that stopped using them fails here instead of skipping)."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return False
    try:
        fd = os.open(directory, flag | os.O_RDWR, 0o600)
    except OSError:
        return False
    os.close(fd)
    return True


def hidden(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


@pytest.mark.slow
@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed", "named"])
@pytest.mark.parametrize("writer", ["write_batch_file", "write_batch_dataset", "convert"])
def test_killed_writers_leave_no_partial_file_and_no_temporary(
    tmp_path: Path,
    zygote: Zygote,
    source: tuple[Path, bytes, bytes],
    writer: str,
    unnamed: bool,
) -> None:
    if unnamed and not unnamed_files_work(tmp_path):
        pytest.skip("no unnamed files (O_TMPFILE) on this platform or file system")
    src, ref, old = source
    out = tmp_path / "out.batch"
    job = {
        "writer": writer,
        "unnamed": unnamed,
        "source": str(src),
        "out": str(out),
        "batch_size": BATCH_SIZE,
        "seed": SEED,
        "overwrite": False,
        "delay": None,
    }
    full = zygote.run(**job)  # one uninterrupted write: how long the kills are spread over
    assert full["exit"] == 0 and out.read_bytes() == ref
    span = full["seconds"]
    rng = random.Random(f"{writer}-{unnamed}")
    outcomes = {"killed": 0, "finished": 0}
    for trial in range(TRIALS):
        replace = trial % 2 == 1
        if replace:
            out.write_bytes(old)
        else:
            out.unlink(missing_ok=True)
        delay = rng.uniform(0.0, 1.2 * span)
        result = zygote.run(**{**job, "overwrite": replace, "delay": delay})
        outcomes["killed" if result["killed"] else "finished"] += 1
        if not result["killed"]:  # the write took less than ``delay``: the machine got faster
            span = min(span, delay)  # than when it was timed, so spread later kills over less
        assert result["killed"] or result["exit"] == 0, (trial, result)
        where = f"trial {trial} ({'replace' if replace else 'new'}), killed after {delay:.3f} s"

        # The output: as before, or complete.
        if out.exists():
            assert out.read_bytes() in ((old, ref) if replace else (ref,)), where
        else:
            assert not replace, where

        # Leftovers before the next write.
        for name in hidden(tmp_path):
            data = (tmp_path / name).read_bytes()
            complete = data == ref
            if unnamed:
                assert replace and complete, f"{where}: {name} ({len(data)} bytes) left"
            else:
                assert complete or data[: len(MAGIC)] != MAGIC, f"{where}: {name} looks valid"

        # The next write into the directory removes whatever a dead writer left.
        write_batch_file(tmp_path / "next.batch", np.zeros((1, 1), np.uint32), 1, overwrite=True)
        assert hidden(tmp_path) == [], where
        assert set(os.listdir(tmp_path)) <= {"out.batch", "next.batch"}, where
    assert outcomes["killed"] >= TRIALS // 2, outcomes  # most trials really were cut short
