"""The loader's int64 stage: chunks of converted steps made on a background thread.

Every conversion the stage makes is checked against the loader's unconverted uint32 output for
the same arguments (views of the file, made without the stage), over the shapes of step the
stage serves: whole batches, rank rows, a context chunk, next-token pairs, document layouts,
worker splits and skipped steps. The thread's lifetime and the buffer rule are checked by
observation: the stage's thread, the addresses of the chunk buffers, and batches kept intact.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zerobatch_core import BatchNativeLoader
from zerobatch_core.delivery.buffers import ChunkStage
from zerobatch_core.delivery.loader import CHUNK_DEPTH, CHUNK_SPARE, CHUNK_STEPS

MakeFile = Callable[..., Path]
ROOT = Path(__file__).resolve().parents[2]


def chunk_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "zerobatch-chunks" and t.is_alive()]


def wait_for_no_chunk_threads() -> None:
    for t in chunk_threads():
        t.join(timeout=10)
    assert chunk_threads() == []


def as_lists(item: Any) -> Any:
    """An item's arrays as (dtype, values) pairs, for comparing items of two loaders."""
    if isinstance(item, dict):
        return {k: as_lists(v) for k, v in item.items()}
    if isinstance(item, tuple):
        return tuple(as_lists(v) for v in item)
    return item


def widened(item: Any, dtype: str) -> Any:
    """The uint32 reference item in the converting loader's dtypes."""
    if isinstance(item, dict):
        out = dict(item)
        for key in ("tokens", "inputs"):
            if key in out:
                out[key] = out[key].astype(dtype)
        if "labels" in out:
            out["labels"] = out["labels"].astype(np.int64)
        return out
    if isinstance(item, tuple):
        return item[0].astype(dtype), item[1].astype(np.int64)
    return item.astype(dtype)


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert sorted(got) == sorted(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


CASES: list[dict[str, Any]] = [
    {},
    {"rank": 1, "world_size": 2},
    {"context_rank": 5, "context_size": 13},
    {"next_token": True},
    {"next_token": True, "rank": 1, "world_size": 4},
    {"next_token": True, "context_rank": 0, "context_size": 3},
    {"bos_id": 3},
    {"bos_id": 3, "next_token": True},
    {"skip_steps": [(2, 5), (11, 12)]},
    {"shuffle": False, "block_size": 1},
]


# int64 for every case; int32 where the stage converts the labels.
DTYPE_CASES = [("int64", c) for c in CASES] + [("int32", c) for c in CASES if c.get("next_token")]


@pytest.mark.parametrize(
    ("dtype", "case"),
    DTYPE_CASES,
    ids=[d + ":" + ",".join(f"{k}={v}" for k, v in c.items()) for d, c in DTYPE_CASES],
)
def test_chunked_items_equal_the_unconverted_items(
    make_file: MakeFile, dtype: str, case: dict[str, Any]
) -> None:
    path = make_file(n=4 * 37, seq_len=13, batch_size=4)  # 37 batches: runs cut by blocks
    kw = {"block_size": 5, "seed": 3, **case}
    for epoch in (0, 1):
        want = [
            widened(i, dtype)
            for i in BatchNativeLoader(path, epoch=epoch, label_dtype="uint32", **kw)
        ]
        got = list(BatchNativeLoader(path, epoch=epoch, dtype=dtype, **kw))
        assert len(got) == len(want) > 0
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    wait_for_no_chunk_threads()


@pytest.mark.parametrize("workers", [2, 3])
def test_a_workers_share_is_converted_in_evenly_spaced_runs(
    make_file: MakeFile, workers: int
) -> None:
    path = make_file(n=4 * 37, seq_len=8, batch_size=4)
    for w in range(workers):
        ref = BatchNativeLoader(path, block_size=16, next_token=True, label_dtype="uint32")
        ref.split_workers(w, workers)
        loader = BatchNativeLoader(path, block_size=16, dtype="int64", next_token=True)
        loader.split_workers(w, workers)
        for g, want in zip(loader, ref, strict=True):
            assert_same(g, widened(want, "int64"))


def test_next_token_inputs_and_labels_are_views_of_one_chunk(make_file: MakeFile) -> None:
    loader = BatchNativeLoader(
        make_file(n=4 * 20, seq_len=8, batch_size=4), dtype="int64", next_token=True
    )
    inputs, labels = next(iter(loader))
    assert inputs.base is labels.base and inputs.base is not None
    assert inputs.base.shape == (CHUNK_STEPS, 4, 8)  # whole rows: inputs plus one label token
    assert labels.ctypes.data == inputs.ctypes.data + 8  # shifted by one int64
    int32 = BatchNativeLoader(
        make_file(n=4 * 20, seq_len=8, batch_size=4, name="b"), next_token=True, dtype="int32"
    )
    inputs32, labels32 = next(iter(int32))
    assert inputs32.dtype == np.int32 and labels32.base.shape == (CHUNK_STEPS, 4, 7)


def test_chunk_buffers_are_reused_only_once_no_item_holds_them(make_file: MakeFile) -> None:
    path = make_file(n=4 * 200, seq_len=8, batch_size=4)
    loader = BatchNativeLoader(path, block_size=64, dtype="int64")
    bases = {int(batch.base.ctypes.data) for batch in loader}  # each batch dropped in turn
    assert len(bases) <= CHUNK_DEPTH + CHUNK_SPARE
    kept = list(BatchNativeLoader(path, block_size=64, dtype="int64"))  # every batch kept
    reference = BatchNativeLoader(path, block_size=64)
    for batch, view in zip(kept, reference, strict=True):
        np.testing.assert_array_equal(batch, view)
    runs = 3 * (64 // CHUNK_STEPS) + 1  # blocks of 64, 64, 64 and 8 batches
    assert len({int(b.base.ctypes.data) for b in kept}) == runs


def test_the_cursor_counts_delivered_items_while_the_stage_reads_ahead(
    make_file: MakeFile,
) -> None:
    path = make_file(n=4 * 60, seq_len=8, batch_size=4)
    loader = BatchNativeLoader(path, block_size=64, dtype="int64")
    it = iter(loader)
    head = [next(it).copy() for _ in range(3)]
    stage = loader._stage
    assert stage is not None and stage.running
    deadline = threading.Event()
    while len(stage._ready) < CHUNK_DEPTH:  # the thread has read ahead of the loop
        deadline.wait(0.005)
    assert loader.position == (0, 3) and loader.bytes_read == 3 * loader.bytes_per_step
    state = loader.state_dict()
    resumed = BatchNativeLoader(path, block_size=64, dtype="int64")
    resumed.load_state_dict(state)
    rest = [b.copy() for b in resumed]
    whole = [b.copy() for b in BatchNativeLoader(path, block_size=64, dtype="int64")]
    for g, w in zip(head + rest, whole, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("how", ["abandon", "new_pass", "set_epoch", "load_state", "seek"])
def test_the_stage_thread_ends_with_its_pass(make_file: MakeFile, how: str) -> None:
    path = make_file(n=4 * 100, seq_len=8, batch_size=4)
    loader = BatchNativeLoader(path, block_size=64, dtype="int64")
    it = iter(loader)
    first = next(it).copy()
    thread = loader._stage._thread if loader._stage is not None else None
    assert thread is not None and thread.is_alive()
    if how == "abandon":
        del it
        gc.collect()
    elif how == "new_pass":
        assert next(iter(loader)) is not None  # the second pass starts where the first stopped
    elif how == "set_epoch":
        loader.set_epoch(4)
    elif how == "load_state":
        loader.load_state_dict(BatchNativeLoader(path, block_size=64).state_dict())
    else:
        loader.seek(loader.position)
    if how != "new_pass":
        thread.join(timeout=10)
        assert not thread.is_alive()
    if how in ("set_epoch", "load_state", "seek"):
        assert next(it, None) is None  # the old pass ended
    del first


def test_errors_on_the_stage_thread_reach_the_loop_after_earlier_items(
    make_file: MakeFile,
) -> None:
    path = make_file(n=4 * 100, seq_len=8, batch_size=4)
    loader = BatchNativeLoader(path, block_size=8, shuffle=False, dtype="int64")
    whole = list(BatchNativeLoader(path, shuffle=False))
    size = os.path.getsize(path)
    it = iter(loader)
    served = [next(it)]
    # The stage is at most a few chunks ahead (far from the last block): lose that block. The
    # file's size is checked before each block, on the stage's thread, so the pass fails at the
    # first block boundary the stage reaches after the change, before any lost page is read.
    assert (CHUNK_DEPTH + CHUNK_SPARE + 1) * CHUNK_STEPS < 92
    with open(path, "r+b") as f:
        f.truncate(size - 8 * loader.reader.padded_batch_bytes)
    try:
        with pytest.raises(Exception, match="truncated"):
            while True:
                served.append(next(it))
        assert len(served) % 8 == 0 and 8 <= len(served) <= 92  # whole blocks before it
        for batch, view in zip(served, whole, strict=False):
            np.testing.assert_array_equal(batch, view)
    finally:
        with open(path, "r+b") as f:
            f.truncate(size)


def test_a_stage_is_a_fork_safe_background_iterator() -> None:
    stage: ChunkStage[int] = ChunkStage(iter(range(10)), 2)
    assert list(stage) == list(range(10)) and not stage.running
    with pytest.raises(ValueError, match="depth"):
        ChunkStage(iter([]), 0)
    endless: ChunkStage[int] = ChunkStage(iter(int, 1), 2)
    assert next(endless) == 0
    endless.close()
    assert not endless.running and next(endless, None) is None


CHILD = r"""
import sys, threading
from zerobatch_core import BatchNativeLoader
loader = BatchNativeLoader(sys.argv[1], dtype="int64", block_size=64)
it = iter(loader)
next(it)
assert [t.name for t in threading.enumerate()].count("zerobatch-chunks") == 1
print("exiting with the stage running", flush=True)
"""


def test_the_interpreter_exits_with_a_stage_running(make_file: MakeFile) -> None:
    path = make_file(n=4 * 200, seq_len=8, batch_size=4)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "exiting" in out.stdout and out.stderr == ""


def test_a_forked_child_makes_its_own_stage(make_file: MakeFile) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    path = make_file(n=4 * 100, seq_len=8, batch_size=4)
    loader = BatchNativeLoader(path, block_size=64, dtype="int64")
    it = iter(loader)
    next(it)
    want = [b.copy() for b in BatchNativeLoader(path, block_size=64, dtype="int64", epoch=1)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's stage has no thread here
        os.close(read)
        ok = 0
        try:
            loader.set_epoch(1)
            got = list(loader)
            ok = int(len(got) == len(want) and all(map(np.array_equal, got, want)))
        finally:
            os.write(write, bytes([ok]))
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"\x01"
    os.waitpid(pid, 0)
    os.close(read)
    assert next(it) is not None  # the parent's pass goes on


def test_a_loader_copy_for_another_process_leaves_its_stage_behind(make_file: MakeFile) -> None:
    import copy

    loader = BatchNativeLoader(make_file(n=4 * 100, seq_len=8, batch_size=4), dtype="int64")
    it = iter(loader)
    next(it)
    state = loader.__getstate__()
    assert state["_stage"] is None and state["_chunk_pools"] is None
    twin = copy.copy(loader)
    assert twin._stage is None and loader._stage is not None
    del it
