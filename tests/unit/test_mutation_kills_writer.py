"""Writer behaviours that mutation testing found unpinned (tests/README.md)."""

from __future__ import annotations

import errno
import mmap
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import DOMAIN_RECORDS, HEADER_SIZE, permute_array, record_source

from tests.helpers import records
from zerobatch_core import WriteError, ZeroBatchIOError, write_batch_dataset, write_batch_file
from zerobatch_core.files import writer as writer_module


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_check_output_refuses_an_existing_file_by_default(tmp_path: Path) -> None:
    dest = tmp_path / "x.batch"
    dest.write_bytes(b"old")
    with pytest.raises(WriteError, match="output file already exists"):
        writer_module.check_output(dest)


def test_a_live_writer_is_probed_without_a_signal(tmp_path: Path) -> None:
    # The probe is signal 0: the process must survive being asked whether it runs.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):\n"
            "    signal.signal(s, signal.SIG_DFL)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        assert writer_module._running(child.pid)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1)  # still running a second later
    finally:
        child.kill()
        child.wait()


def test_a_pid_no_system_can_have_counts_as_running() -> None:
    # os.kill raises OverflowError: the temporary is kept rather than guessed stale.
    assert writer_module._running(2**70)


def test_a_stale_named_symlink_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    link = tmp_path / f".x.batch.{dead_pid()}.0a1b2c3d.tmp"
    link.symlink_to(target)
    writer_module.remove_stale_temporaries(tmp_path)
    assert link.is_symlink() and target.read_bytes() == b"keep"


def test_stale_cleanup_of_a_missing_directory_does_nothing(tmp_path: Path) -> None:
    assert writer_module.remove_stale_temporaries(tmp_path / "missing") is None


def no_hard_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate a file system without hard links or unnamed files: named temporaries, rename."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    monkeypatch.setattr(os, "link", refuse)


def test_without_hard_links_a_new_output_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_hard_links(monkeypatch)
    assert write_batch_file(tmp_path / "new.batch", records(8, 4), 2) == 4
    assert os.listdir(tmp_path) == ["new.batch"]


def test_without_hard_links_overwrite_replaces_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "x.batch"
    write_batch_file(dest, records(8, 4), 2, seed=1)
    first = dest.read_bytes()
    no_hard_links(monkeypatch)
    write_batch_file(dest, records(8, 4), 2, seed=2, overwrite=True)
    assert dest.read_bytes() != first and os.listdir(tmp_path) == ["x.batch"]


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
def test_wide_tokens_above_uint32_are_refused(tmp_path: Path, dtype: type) -> None:
    rows = records(4, 3, dtype)
    rows[2, 1] = 2**32
    with pytest.raises(WriteError, match="record 2, token 1: value 4294967296"):
        write_batch_file(tmp_path / "x.batch", rows, 2)


def test_seq_len_mismatch_message_names_the_records_length(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match="seq_len=5 but records have 3 tokens"):
        write_batch_file(tmp_path / "x.batch", records(4, 3), 2, seq_len=5)


def test_a_small_file_is_one_data_write_and_the_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slots are gathered into writes of up to CHUNK_BYTES, not written one batch at a time.
    sizes: list[int] = []
    pwrite = os.pwrite

    def spy(fd: int, data: Any, offset: int) -> int:
        sizes.append(len(data))
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", spy)
    write_batch_file(tmp_path / "x.batch", records(64, 4), 2)  # 32 slots of 4096 bytes
    assert sorted(sizes) == [4096, 32 * 4096]


def test_windows_smaller_than_a_slot_hold_one_batch_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = records(40, 4)
    write_batch_file(tmp_path / "a.batch", src, 4, seed=3)
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 100)  # below one 4096-byte slot
    write_batch_dataset(tmp_path / "b.batch", iter(src), 40, 4, 4, seed=3)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_the_spill_is_read_back_in_chunks_and_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = records(40, 4)
    write_batch_file(tmp_path / "a.batch", src, 4, seed=3)
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 8)  # below one record: one per read
    blocks: list[int] = []
    add = writer_module._WindowedOutput.add

    def spy(self: Any, rows: np.ndarray) -> None:
        blocks.append(rows.shape[0])
        add(self, rows)

    monkeypatch.setattr(writer_module._WindowedOutput, "add", spy)
    write_batch_dataset(tmp_path / "b.batch", iter(src), None, 4, 4, seed=3)
    assert blocks == [1] * 40
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_an_open_count_stream_of_exactly_one_batch_is_written(tmp_path: Path) -> None:
    assert write_batch_dataset(tmp_path / "x.batch", iter(records(4, 3)), None, 4, 3) == 1


def test_disk_full_while_spilling_counts_the_spill_in_the_bytes_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 records of 4 tokens: a 4096 + 10 * 4096-byte output plus the 640-byte spill.
    def full(fd: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "ftruncate", full)
    with pytest.raises(OSError, match=r"needs about 45,696 bytes"):
        write_batch_dataset(tmp_path / "x.batch", iter(records(40, 4)), None, 4, 4)


def test_short_writes_are_continued_until_everything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: pwrite(fd, data[:1], offset))
    write_batch_file(tmp_path / "a.batch", records(8, 4), 2, seed=5)
    monkeypatch.undo()
    write_batch_file(tmp_path / "b.batch", records(8, 4), 2, seed=5)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_a_write_that_writes_nothing_is_an_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
    with pytest.raises(OSError, match="write returned 0"):
        write_batch_file(tmp_path / "a.batch", records(8, 4), 2)


def test_empty_output_message_for_a_single_record(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match="1 record is fewer than batch_size=4"):
        write_batch_file(tmp_path / "x.batch", records(1, 3), 4)


def test_a_writers_temporary_name_is_recognised_as_its_own(tmp_path: Path) -> None:
    name = os.path.basename(writer_module._temp_path(str(tmp_path / "x.batch")))
    assert writer_module._temp_owner(name) == os.getpid()


def test_the_blocking_writer_lock_is_held(tmp_path: Path) -> None:
    import fcntl

    path = tmp_path / "locked"
    path.write_bytes(b"")
    mine, other = os.open(path, os.O_RDONLY), os.open(path, os.O_RDONLY)
    try:
        assert writer_module._lock(mine, blocking=True)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(mine)
        os.close(other)


def test_negative_tokens_of_narrow_signed_inputs_are_refused(tmp_path: Path) -> None:
    rows = records(4, 3, np.int32)
    rows[1, 2] = -1
    with pytest.raises(WriteError, match="record 1, token 2: value -1"):
        write_batch_file(tmp_path / "x.batch", rows, 2)


def dropped_record(n: int, batch_size: int, seed: int) -> int | None:
    kept = {record_source(p, n, seed) for p in range(n // batch_size * batch_size)}
    rest = sorted(set(range(n)) - kept)
    return rest[0] if rest else None


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
def test_a_bad_token_in_the_dropped_remainder_is_refused(tmp_path: Path, dtype: type) -> None:
    # The first record, dropped: the whole input is checked, from its first record on.
    seed = next(s for s in range(100) if dropped_record(3, 2, s) == 0)
    rows = records(3, 4, dtype)
    rows[0, 1] = 2**32
    with pytest.raises(WriteError, match="record 0, token 1: value 4294967296"):
        write_batch_file(tmp_path / "x.batch", rows, 2, seed=seed)


def test_a_fortran_ordered_memmap_input_is_read_by_its_values(tmp_path: Path) -> None:
    src = records(12, 4)
    mm = np.memmap(tmp_path / "src.bin", dtype=np.uint32, mode="w+", shape=src.shape, order="F")
    mm[:] = src
    mm.flush()
    write_batch_file(tmp_path / "a.batch", mm, 2, seed=4)
    write_batch_file(tmp_path / "b.batch", src, 2, seed=4)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_a_memmap_input_with_scattered_records_per_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One batch per chunk: each chunk's records are scattered runs of the mapped file.
    src = records(13, 4)
    mm = np.memmap(tmp_path / "src.bin", dtype=np.uint32, mode="w+", shape=src.shape)
    mm[:] = src
    mm.flush()
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 4096)
    write_batch_file(tmp_path / "a.batch", mm, 4, seed=4)
    write_batch_file(tmp_path / "b.batch", src, 4, seed=4)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_a_file_system_without_locks_counts_as_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No advisory locks at all: the pid check alone decides, so the lock "succeeds".
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert writer_module._lock(fd, blocking=False)
    finally:
        os.close(fd)


def test_a_temporary_name_already_taken_is_retried_with_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = tmp_path / ".x.batch.1.0a1b2c3d.tmp"
    taken.write_bytes(b"someone else's")
    names = iter([str(taken), str(tmp_path / ".x.batch.1.0a1b2c3e.tmp")])
    monkeypatch.setattr(writer_module, "_temp_path", lambda path: next(names))
    fd, temp = writer_module._open_named(str(tmp_path / "x.batch"))
    os.close(fd)
    assert temp.endswith("0a1b2c3e.tmp") and taken.read_bytes() == b"someone else's"


def test_an_os_error_message_starts_with_its_description(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "ftruncate", full)
    with pytest.raises(OSError) as info:
        write_batch_dataset(tmp_path / "x.batch", iter(records(40, 4)), 40, 4, 4)
    assert info.value.strerror.startswith("No space left on device while sizing the output")


def test_a_plain_memmap_input_is_read_with_positioned_reads(tmp_path: Path) -> None:
    mm = np.memmap(tmp_path / "src.bin", dtype=np.uint32, mode="w+", shape=(12, 4))
    found = writer_module._as_record_file(mm)
    assert found is not None and found.shape == (12, 4)
    os.close(found.fd)


def test_a_write_leaves_no_descriptor_open(tmp_path: Path) -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    write_batch_file(tmp_path / "x.batch", records(8, 4), 2)
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_link_error_other_than_no_hard_links_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only "no hard links here" (EPERM, EOPNOTSUPP, EMLINK) falls back to a rename; an I/O
    # error while linking the named temporary fails the write and publishes nothing.
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    monkeypatch.setattr(os, "link", broken)
    with pytest.raises(OSError, match="Input/output error"):
        write_batch_file(tmp_path / "x.batch", records(8, 4), 2)
    assert not (tmp_path / "x.batch").exists()


def test_signed_inputs_are_checked_a_chunk_of_records_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 64-byte chunks of 4-token int64 records: two records per conversion, never the whole input.
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 64)
    checked: list[tuple[int, int]] = []
    to_tokens = writer_module._to_tokens

    def spy(rows: np.ndarray, what: str, first_record: int, dtype: int = 0) -> np.ndarray:
        checked.append((first_record, rows.shape[0]))
        return to_tokens(rows, what, first_record, dtype)

    monkeypatch.setattr(writer_module, "_to_tokens", spy)
    writer_module._check_values(records(10, 4, np.int64), "tokens_array")
    assert checked == [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)]


def test_the_default_record_seed_is_zero(tmp_path: Path) -> None:
    src = records(16, 4)
    write_batch_file(tmp_path / "default.batch", src, 2)
    write_batch_file(tmp_path / "zero.batch", src, 2, seed=0)
    write_batch_file(tmp_path / "one.batch", src, 2, seed=1)
    default = (tmp_path / "default.batch").read_bytes()
    assert default == (tmp_path / "zero.batch").read_bytes()
    assert default != (tmp_path / "one.batch").read_bytes()


def test_stream_positions_are_computed_in_bulk_and_served_from_the_window() -> None:
    header = writer_module._file_header(100, 4, 4, 7)
    calls: list[int] = []

    def counted(ids: Any, n: int, seed: int, domain: int) -> np.ndarray:
        calls.append(len(np.asarray(ids)))
        return permute_array(ids, n, seed, domain)

    ahead = writer_module._AheadPermutation(counted, header, 100)
    got = np.concatenate([ahead.get(first, 10) for first in range(0, 100, 10)])
    expected = permute_array(np.arange(100), 100, 7, DOMAIN_RECORDS)
    assert calls == [100]  # one evaluation of the whole range, then served from it
    assert got.tolist() == expected.tolist()


def test_windows_smaller_than_a_slot_are_written_one_slot_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Memory is bounded by the window: a slot above WINDOW_BYTES is a window of its own.
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 100)  # below one 4096-byte slot
    sizes: list[int] = []
    write_window = writer_module._WindowedOutput._write_window

    def spy(self: Any, data: np.ndarray, offset: int) -> None:
        sizes.append(data.nbytes)
        write_window(self, data, offset)

    monkeypatch.setattr(writer_module._WindowedOutput, "_write_window", spy)
    write_batch_dataset(tmp_path / "x.batch", iter(records(40, 4)), 40, 4, 4, seed=3)
    assert sizes == [4096] * 10


def test_windows_are_written_in_file_order_even_when_a_write_is_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One I/O thread, in submission order: the output gets sequential writes only.
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 100)  # ten windows of one slot
    offsets: list[int] = []
    write_window = writer_module._WindowedOutput._write_window

    def slow_first(self: Any, data: np.ndarray, offset: int) -> None:
        if not offsets and offset == HEADER_SIZE:
            time.sleep(0.5)  # a second I/O thread would write the next window meanwhile
        offsets.append(offset)
        write_window(self, data, offset)

    monkeypatch.setattr(writer_module._WindowedOutput, "_write_window", slow_first)
    write_batch_dataset(tmp_path / "x.batch", iter(records(40, 4)), 40, 4, 4, seed=3)
    assert offsets == [HEADER_SIZE + 4096 * w for w in range(10)]


def test_a_failed_replace_when_overwriting_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "x.batch"
    write_batch_file(dest, records(8, 4), 2, seed=1)
    old = dest.read_bytes()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="Input/output error"):
        write_batch_file(dest, records(8, 4), 2, seed=2, overwrite=True)
    assert os.listdir(tmp_path) == ["x.batch"] and dest.read_bytes() == old


def test_stream_blocks_that_straddle_the_stage_are_split_across_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 13-record stage fed blocks of 2: every seventh block is cut where the stage fills.
    src = records(40, 4)
    write_batch_file(tmp_path / "a.batch", src, 4, seed=3)
    monkeypatch.setattr(writer_module, "STAGE_BYTES", 13 * 4 * 4)
    write_batch_dataset(
        tmp_path / "b.batch", (src[i : i + 2] for i in range(0, 40, 2)), 40, 4, 4, seed=3
    )
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_the_default_stream_seed_is_zero(tmp_path: Path) -> None:
    src = records(16, 4)
    write_batch_dataset(tmp_path / "default.batch", iter(src), 16, 2, 4)
    write_batch_file(tmp_path / "zero.batch", src, 2, seed=0)
    write_batch_file(tmp_path / "one.batch", src, 2, seed=1)
    default = (tmp_path / "default.batch").read_bytes()
    assert default == (tmp_path / "zero.batch").read_bytes()
    assert default != (tmp_path / "one.batch").read_bytes()


def test_an_output_path_that_cannot_be_inspected_is_a_zerobatch_io_error(tmp_path: Path) -> None:
    loop = tmp_path / "x.batch"
    loop.symlink_to(loop)  # stat fails with ELOOP
    with pytest.raises(ZeroBatchIOError, match="while inspecting the output path"):
        writer_module.check_output(loop)


def test_a_name_without_an_output_name_is_not_a_writers_temporary(tmp_path: Path) -> None:
    # ".." + PID + RAND + ".tmp": no writer makes it (an output has a name), so it is kept.
    other = tmp_path / f"..{dead_pid()}.0a1b2c3d.tmp"
    other.write_bytes(b"keep")
    writer_module.remove_stale_temporaries(tmp_path)
    assert other.read_bytes() == b"keep"


def test_a_fifo_named_like_a_stale_temporary_does_not_block_the_cleanup(tmp_path: Path) -> None:
    fifo = tmp_path / f".x.batch.{dead_pid()}.0a1b2c3d.tmp"
    os.mkfifo(fifo)
    cleanup = threading.Thread(
        target=writer_module.remove_stale_temporaries, args=(tmp_path,), daemon=True
    )
    cleanup.start()
    cleanup.join(timeout=10)
    blocked = cleanup.is_alive()
    if blocked:  # release the open() waiting for a writer before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        cleanup.join(timeout=10)
    assert not blocked and fifo.exists()  # left alone: not a regular file


def test_windows_are_mapped_where_mmap_has_no_populate_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = records(40, 4)
    write_batch_file(tmp_path / "a.batch", src, 4, seed=3)
    monkeypatch.delattr(mmap, "MAP_POPULATE", raising=False)  # as on macOS
    write_batch_dataset(tmp_path / "b.batch", iter(src), 40, 4, 4, seed=3)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_a_record_file_gathers_no_rows_for_no_indices(tmp_path: Path) -> None:
    mm = np.memmap(tmp_path / "src.bin", dtype=np.uint32, mode="w+", shape=(12, 4))
    found = writer_module._as_record_file(mm)
    assert found is not None
    try:
        assert found.gather(np.zeros(0, dtype=np.int64)).shape == (0, 4)
    finally:
        os.close(found.fd)


def test_the_sorting_file_is_discarded_window_by_window_once_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its pages go as the output grows, so the write needs about one output's size of disk.
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 2 * 4096)  # five windows of two slots
    freed: list[tuple[int, int]] = []
    discard = writer_module.discard

    def spy(fd: int, offset: int, length: int) -> None:
        freed.append((offset, length))
        discard(fd, offset, length)

    monkeypatch.setattr(writer_module, "discard", spy)
    write_batch_dataset(tmp_path / "x.batch", iter(records(40, 4)), 40, 4, 4, seed=3)
    # Each window's 8 packed records of 16 bytes, at the start of the window's byte range.
    assert freed == [(HEADER_SIZE + 2 * 4096 * w, 8 * 16) for w in range(5)]


def test_named_temporaries_work_where_the_os_has_no_o_nofollow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = records(8, 4)
    write_batch_file(tmp_path / "a.batch", src, 2, seed=1)
    monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    monkeypatch.delattr(os, "O_NOFOLLOW")
    write_batch_file(tmp_path / "b.batch", src, 2, seed=1)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_seq_len_zero_is_refused_as_an_argument(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match=r"seq_len must be in \[1, 2\*\*32 - 1\], got 0"):
        write_batch_file(tmp_path / "x.batch", records(8, 4), 2, seq_len=0)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32])
def test_a_negative_token_in_the_dropped_remainder_is_refused(tmp_path: Path, dtype: type) -> None:
    # Narrow signed inputs are checked whole, like wide ones: the dropped record 0 too.
    seed = next(s for s in range(100) if dropped_record(3, 2, s) == 0)
    rows = records(3, 4, dtype)
    rows[0, 1] = -1
    with pytest.raises(WriteError, match="record 0, token 1: value -1"):
        write_batch_file(tmp_path / "x.batch", rows, 2, seed=seed)


def test_a_failed_stream_drops_the_io_not_yet_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two blocks placed directly (10 of a 40-record stage): the first one's write is slow and
    # has started when the stream fails, the second's is queued behind it and is skipped, never
    # written; the first runs to its end before the file is closed.
    written: list[int] = []
    started = threading.Event()
    write_pieces = writer_module._WindowedOutput._write_pieces

    def slow(self: Any, packed: np.ndarray, firsts: list[int], offsets: list[int]) -> None:
        started.set()
        time.sleep(1.0)
        written.append(packed.shape[0])
        write_pieces(self, packed, firsts, offsets)

    def failing() -> Iterator[np.ndarray]:
        src = records(40, 4)
        yield src[:10]
        yield src[10:20]
        assert started.wait(5)
        raise RuntimeError("the source failed")

    monkeypatch.setattr(writer_module._WindowedOutput, "_write_pieces", slow)
    with pytest.raises(RuntimeError, match="the source failed"):
        write_batch_dataset(tmp_path / "x.batch", failing(), 40, 4, 4, seed=3)
    assert written == [10]
    assert os.listdir(tmp_path) == []


def test_small_stream_blocks_are_staged_and_placed_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks below a quarter of the 40-record stage are gathered: one placement of all 40.
    placed: list[int] = []
    place = writer_module._WindowedOutput._place

    def spy(self: Any, rows: np.ndarray) -> None:
        placed.append(rows.shape[0])
        place(self, rows)

    monkeypatch.setattr(writer_module._WindowedOutput, "_place", spy)
    src = records(40, 4)
    write_batch_dataset(tmp_path / "x.batch", (src[i : i + 2] for i in range(0, 40, 2)), 40, 4, 4)
    assert placed == [40]


def test_the_writer_waits_for_a_lock_held_on_its_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cleaner that took the temporary's lock is waited for; nothing is written before.
    import fcntl

    events: list[str] = []
    open_named = writer_module._open_named

    def release(fd: int) -> None:
        events.append("released")
        os.close(fd)  # drops the lock

    def locked(path: str) -> tuple[int, str]:
        fd, temp = open_named(path)
        cleaner = os.open(temp, os.O_RDONLY)
        fcntl.flock(cleaner, fcntl.LOCK_EX)
        threading.Timer(1.0, release, (cleaner,)).start()
        return fd, temp

    pwrite = os.pwrite

    def spy(fd: int, data: Any, offset: int) -> int:
        events.append("write")
        return pwrite(fd, data, offset)

    monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    monkeypatch.setattr(writer_module, "_open_named", locked)
    monkeypatch.setattr(os, "pwrite", spy)
    write_batch_file(tmp_path / "x.batch", records(8, 4), 2)
    assert events[0] == "released" and "write" in events


def test_consecutive_source_records_are_read_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mm = np.memmap(tmp_path / "src.bin", dtype=np.uint32, mode="w+", shape=(12, 4))
    mm[:] = records(12, 4)
    found = writer_module._as_record_file(mm)
    assert found is not None
    reads: list[int] = []
    preadv = os.preadv

    def spy(fd: int, buffers: list[Any], offset: int) -> int:
        reads.append(offset)
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", spy)
    try:
        rows = found.gather(np.array([2, 3, 4, 5, 9, 10], dtype=np.int64))
    finally:
        os.close(found.fd)
    assert rows.tolist() == records(12, 4)[[2, 3, 4, 5, 9, 10]].tolist()
    assert reads == [2 * 16, 9 * 16]  # two runs, two reads


def test_a_stream_block_of_dropped_records_only_places_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 41 records in batches of 4: one is dropped; one record per block, each placed directly.
    src = records(41, 4)
    write_batch_file(tmp_path / "a.batch", src, 4, seed=3)
    monkeypatch.setattr(writer_module, "STAGE_BYTES", 3 * 16)  # a 3-record stage
    write_batch_dataset(tmp_path / "b.batch", iter(src), 41, 4, 4, seed=3)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_an_existing_output_is_overwritten_from_another_mapped_file(tmp_path: Path) -> None:
    src = records(8, 4)
    mm = np.memmap(tmp_path / "src.bin", dtype=np.uint32, mode="w+", shape=src.shape)
    mm[:] = src
    mm.flush()
    dest = tmp_path / "x.batch"
    write_batch_file(dest, src, 2, seed=1)
    assert write_batch_file(dest, mm, 2, seed=2, overwrite=True) == 4
    write_batch_file(tmp_path / "y.batch", src, 2, seed=2)
    assert dest.read_bytes() == (tmp_path / "y.batch").read_bytes()


def test_a_taken_name_for_the_second_link_is_retried_with_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"data")
    taken = tmp_path / ".x.batch.1.0a1b2c3d.tmp"
    taken.write_bytes(b"someone else's")
    names = iter([str(taken), str(tmp_path / ".x.batch.1.0a1b2c3e.tmp")])
    monkeypatch.setattr(writer_module, "_temp_path", lambda path: next(names))
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    try:
        linked = writer_module._link_under_temp(str(source), str(tmp_path / "x.batch"), dir_fd)
    finally:
        os.close(dir_fd)
    assert linked == ".x.batch.1.0a1b2c3e.tmp"
    assert (tmp_path / linked).read_bytes() == b"data"
    assert taken.read_bytes() == b"someone else's"


class ReachedHeaderError(Exception):
    """Raised in place of the header: the record count passed the writer's checks."""


@pytest.mark.parametrize(("total", "accepted"), [(2**32 - 1, True), (2**32, False)])
def test_the_record_count_limit_is_the_u32_maximum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: int, accepted: bool
) -> None:
    # A broadcast array: 2**32 records of one token without the memory.
    tokens = np.broadcast_to(np.zeros((1, 1), dtype=np.uint32), (total, 1))

    def reached(*args: Any) -> None:
        raise ReachedHeaderError

    monkeypatch.setattr(writer_module, "_file_header", reached)
    if accepted:
        with pytest.raises(ReachedHeaderError):
            write_batch_file(tmp_path / "x.batch", tokens, 2**20)
    else:
        with pytest.raises(WriteError, match="4294967296 records exceed the u32 total_records"):
            write_batch_file(tmp_path / "x.batch", tokens, 2**20)


def test_slots_larger_than_a_chunk_are_written_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 100)  # below one 4096-byte slot
    sizes: list[int] = []
    pwrite = os.pwrite

    def spy(fd: int, data: Any, offset: int) -> int:
        sizes.append(len(data))
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", spy)
    write_batch_file(tmp_path / "x.batch", records(8, 4), 2)  # 4 slots, then the header
    assert sizes == [4096] * 5


def test_the_first_out_of_range_token_is_the_one_named(tmp_path: Path) -> None:
    rows = records(6, 3, np.int64)
    rows[4, 0] = -5
    rows[1, 2] = -1  # the first in record order
    with pytest.raises(WriteError, match="record 1, token 2: value -1"):
        write_batch_file(tmp_path / "x.batch", rows, 2)


def test_disk_full_for_a_stream_of_known_length_needs_the_output_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 records of 4 tokens in batches of 4: 4096 + 10 * 4096 bytes, nothing spilled.
    def full(fd: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "ftruncate", full)
    with pytest.raises(OSError, match=r"needs about 45,056 bytes"):
        write_batch_dataset(tmp_path / "x.batch", iter(records(40, 4)), 40, 4, 4)


def test_a_file_system_without_unnamed_files_gets_a_named_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = records(8, 4)
    write_batch_file(tmp_path / "a.batch", src, 2, seed=1)
    real_open = os.open

    def no_tmpfile(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile)
    write_batch_file(tmp_path / "b.batch", src, 2, seed=1)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.batch", "b.batch"]


def test_the_pages_of_a_mapped_input_read_through_its_mapping_are_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Fortran-ordered memmap is read through the mapping, chunk by chunk: each chunk's pages
    # are released; a C-ordered one is read with positioned reads and has none to release.
    src = records(12, 4)
    fortran = np.memmap(tmp_path / "f.bin", dtype=np.uint32, mode="w+", shape=src.shape, order="F")
    fortran[:] = src
    plain = np.memmap(tmp_path / "c.bin", dtype=np.uint32, mode="w+", shape=src.shape)
    plain[:] = src
    released: list[object] = []
    monkeypatch.setattr(writer_module, "release_pages", released.append)
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 4096)  # one batch per chunk: 3 chunks
    write_batch_file(tmp_path / "c.batch", plain, 4, seed=4)
    assert released == []
    write_batch_file(tmp_path / "f.batch", fortran, 4, seed=4)
    assert len(released) == 3 and all(r is fortran for r in released)


def test_records_larger_than_a_chunk_are_checked_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 8)  # below one 32-byte int64 record
    checked: list[int] = []
    to_tokens = writer_module._to_tokens

    def spy(rows: np.ndarray, what: str, first_record: int, dtype: int = 0) -> np.ndarray:
        checked.append(rows.shape[0])
        return to_tokens(rows, what, first_record, dtype)

    monkeypatch.setattr(writer_module, "_to_tokens", spy)
    writer_module._check_values(records(5, 4, np.int64), "tokens_array")
    assert checked == [1] * 5


def test_a_stream_batch_size_of_zero_is_refused_as_an_argument(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match=r"batch_size must be in \[1, 2\*\*32 - 1\], got 0"):
        write_batch_dataset(tmp_path / "x.batch", iter(records(8, 4)), 8, 0, 4)


def test_a_single_out_of_range_token_is_refused(tmp_path: Path) -> None:
    # One record of one token: the conversion's shortcut is for empty inputs only.
    with pytest.raises(WriteError, match="record 0, token 0: value -1"):
        write_batch_file(tmp_path / "x.batch", np.array([[-1]], dtype=np.int64), 1)


def test_a_stale_temporary_that_cannot_be_removed_is_left_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / f".x.batch.{dead_pid()}.0a1b2c3d.tmp"
    stale.write_bytes(b"left")

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "unlink", refuse)
    assert writer_module.remove_stale_temporaries(tmp_path) is None
    assert stale.read_bytes() == b"left"


def test_a_stream_seq_len_of_zero_is_refused_as_an_argument(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match=r"seq_len must be in \[1, 2\*\*32 - 1\], got 0"):
        write_batch_dataset(tmp_path / "x.batch", iter(records(8, 4)), 8, 2, 0)


def test_a_dangling_symlink_at_the_output_path_counts_as_existing(tmp_path: Path) -> None:
    dest = tmp_path / "x.batch"
    dest.symlink_to(tmp_path / "nowhere")
    with pytest.raises(WriteError, match="output file already exists"):
        write_batch_file(dest, records(8, 4), 2)
    assert dest.is_symlink() and not (tmp_path / "nowhere").exists()


def test_the_stale_temporary_of_a_one_letter_output_name_is_removed(tmp_path: Path) -> None:
    stale = tmp_path / f".a.{dead_pid()}.0a1b2c3d.tmp"
    stale.write_bytes(b"old")
    writer_module.remove_stale_temporaries(tmp_path)
    assert not stale.exists()


def test_a_sliced_memmap_input_is_read_by_its_values(tmp_path: Path) -> None:
    src = records(14, 4)
    mm = np.memmap(tmp_path / "src.bin", dtype=np.uint32, mode="w+", shape=src.shape)
    mm[:] = src
    mm.flush()
    write_batch_file(tmp_path / "a.batch", mm[2:], 4, seed=4)
    write_batch_file(tmp_path / "b.batch", src[2:], 4, seed=4)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_a_stream_too_short_for_a_batch_is_still_checked_item_by_item(tmp_path: Path) -> None:
    blocks = [records(1, 4), records(1, 3)]  # the second record has the wrong length
    with pytest.raises(
        WriteError, match=r"item at record 1: expected shape \(4,\) or \(k, 4\), got \(1, 3\)"
    ):
        write_batch_dataset(tmp_path / "x.batch", iter(blocks), 2, 4, 4, allow_empty=True)


def test_a_temporary_named_for_this_process_is_never_stale(tmp_path: Path) -> None:
    """A temporary whose name carries this process's pid belongs to a writer of this process
    (another thread's, perhaps not yet locked): the sweep every writer makes keeps it."""
    mine = tmp_path / f".x.batch.{os.getpid()}.0a1b2c3d.tmp"
    mine.write_bytes(b"in progress")
    writer_module.remove_stale_temporaries(tmp_path)
    write_batch_file(tmp_path / "other.batch", records(8, 4), batch_size=4, seq_len=4)
    assert mine.read_bytes() == b"in progress"


def test_a_negative_seed_of_a_record_stream_is_refused(tmp_path: Path) -> None:
    """``write_batch_dataset``'s seed is a u32 like the file's: -1 is refused, naming it, and
    nothing is written; 0 is accepted."""
    out = tmp_path / "out.batch"
    with pytest.raises(WriteError, match="seed"):
        write_batch_dataset(out, [records(8, 4)], total_records=8, batch_size=4, seq_len=4, seed=-1)
    assert not out.exists()
    write_batch_dataset(out, [records(8, 4)], total_records=8, batch_size=4, seq_len=4, seed=0)
    assert out.exists()
