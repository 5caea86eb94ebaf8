"""Replacing a dataset: the old one stays whole until the new one is committed, then is swapped
out in one step; the directory's other files survive; names the manifest would refuse are
refused before anything is written.

``write_sharded_dataset(overwrite=True)`` and ``create_dataset(overwrite=True)`` stage the new
dataset in ``.NAME.zerobatch-new-RAND`` beside the old one and swap the two directories
(``dataset_build`` module docstring). These tests interrupt the writers at chosen points with
the errors a user causes (a failing source, Ctrl-C as ``KeyboardInterrupt``), force the
two-rename fallback, and check what the directory holds with ``validate_dataset``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

from tests.helpers import records
from zerobatch_core import DatasetReader, validate_dataset, write_batch_file
from zerobatch_core.cli import main
from zerobatch_core.datasets import build as dataset_build
from zerobatch_core.datasets import replace as dataset_replace
from zerobatch_core.datasets.build import create_dataset, write_sharded_dataset
from zerobatch_core.errors import WriteError, ZeroBatchIOError

B, T = 4, 6


def siblings(path: Path) -> list[str]:
    """Staging and moved-aside directories beside dataset ``path``."""
    return sorted(n for n in os.listdir(path.parent) if n.startswith(f".{path.name}.zerobatch"))


def valid(path: Path) -> bool:
    report = validate_dataset(path, deep=True)
    return report.valid


def failure_codes(path: Path) -> list[str]:
    return [f.code for f in validate_dataset(path, deep=True).failures]


def sharded(path: Path, n: int, *, offset: int = 0, shard_batches: int = 2, **kw: Any) -> bytes:
    """Write ``n`` records (values from ``offset``) as a dataset; return its manifest bytes."""
    data = records(n, T) + offset
    write_sharded_dataset(
        path, iter([data]), batch_size=B, seq_len=T, shard_batches=shard_batches, **kw
    )
    return (path / MANIFEST_NAME).read_bytes()


def stream_then(data: npt.NDArray[np.uint32], after: int, action: Callable[[], None]) -> Iterator[
    npt.NDArray[np.uint32]
]:  # fmt: skip
    """Yield ``data`` one record at a time; call ``action`` before record ``after``."""
    for i, row in enumerate(data):
        if i == after:
            action()
        yield row


# -- what survives a successful overwrite ---------------------------------------------------------


def test_overwrite_of_a_created_dataset_leaves_no_extra_shard_and_keeps_user_files(
    tmp_path: Path,
) -> None:
    """A directory made by ``dataset create`` and replaced by the sharded writer holds exactly
    the new dataset, plus the user's files that no dataset listed (same inodes), its symbolic
    links and its permission bits."""
    out = tmp_path / "data"
    out.mkdir()
    for i in range(3):
        write_batch_file(out / f"part-{i}.batch", records(8, T) + 100 * i, batch_size=B, seed=i)
    create_dataset(out)
    (out / "notes.txt").write_text("mine")
    os.symlink("notes.txt", out / "notes.link")
    os.chmod(out, 0o751)
    inode = (out / "notes.txt").stat().st_ino

    new = sharded(out, 24, offset=7, overwrite=True)

    assert failure_codes(out) == []  # the old part-*.batch are gone, not extra_shard
    names = {s.name for s in DatasetReader(out).manifest.shards}
    assert set(os.listdir(out)) == names | {
        MANIFEST_NAME,
        CHECKSUMS_NAME,
        "notes.txt",
        "notes.link",
    }
    assert (out / "notes.txt").stat().st_ino == inode and os.readlink(out / "notes.link") == (
        "notes.txt"
    )
    assert stat.S_IMODE(out.stat().st_mode) == 0o751
    assert (out / MANIFEST_NAME).read_bytes() == new and siblings(out) == []


def test_sharded_overwrite_keeps_unlisted_batch_files_and_drops_the_old_shards(
    tmp_path: Path,
) -> None:
    """The sharded writer drops the old dataset's listed shards and its own shard names; a
    ``*.batch`` file no manifest listed is the user's and stays."""
    out = tmp_path / "ds"
    sharded(out, 56)  # 7 shards
    write_batch_file(out / "mine.batch", records(8, T), batch_size=B)
    sharded(out, 16, overwrite=True)  # 2 shards
    assert sorted(n for n in os.listdir(out) if n.endswith(".batch")) == [
        "mine.batch",
        "shard-00000.batch",
        "shard-00001.batch",
    ]
    assert failure_codes(out) == ["extra_shard"]  # as before the overwrite: the user's file


def test_overwrite_through_a_symlinked_path_replaces_the_real_directory(tmp_path: Path) -> None:
    real = tmp_path / "real"
    sharded(real, 16)
    link = tmp_path / "link"
    os.symlink("real", link)
    new = sharded(link, 24, offset=9, overwrite=True)
    assert link.is_symlink() and os.readlink(link) == "real"
    assert (real / MANIFEST_NAME).read_bytes() == new and valid(real)
    assert siblings(real) == [] and siblings(link) == []


# -- the old dataset stays whole until the commit -------------------------------------------------


def test_the_old_dataset_stays_valid_while_an_overwrite_runs(tmp_path: Path) -> None:
    """Midway through writing the new shards, the path still validates, deeply, as the old
    dataset, with its old manifest bytes."""
    out = tmp_path / "ds"
    old = sharded(out, 40)
    seen: list[bool] = []

    def check() -> None:
        seen.append(valid(out) and (out / MANIFEST_NAME).read_bytes() == old)

    data = records(40, T) + 5
    write_sharded_dataset(
        out, stream_then(data, 25, check), batch_size=B, seq_len=T, shard_batches=2,
        overwrite=True,
    )  # fmt: skip
    assert seen == [True]
    assert (out / MANIFEST_NAME).read_bytes() != old and valid(out) and siblings(out) == []


@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError], ids=["ctrl-c", "error"])
def test_an_interrupted_sharded_overwrite_leaves_the_old_dataset_intact(
    tmp_path: Path, error: type[BaseException]
) -> None:
    out = tmp_path / "ds"
    old = sharded(out, 40)
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}

    def fail() -> None:
        raise error("stop")

    with pytest.raises(error):
        write_sharded_dataset(
            out, stream_then(records(40, T) + 3, 30, fail), batch_size=B, seq_len=T,
            shard_batches=2, overwrite=True,
        )  # fmt: skip
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before
    assert (out / MANIFEST_NAME).read_bytes() == old and valid(out) and siblings(out) == []


def test_a_create_overwrite_interrupted_before_its_manifest_leaves_the_old_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the new checksums file is written but before the manifest: the old
    manifest and checksums file are untouched (no window between the two)."""
    out = tmp_path / "data"
    out.mkdir()
    for i in range(3):
        write_batch_file(out / f"p{i}.batch", records(12, T) + 50 * i, batch_size=B, seed=i)
    create_dataset(out)
    before = {n: (out / n).read_bytes() for n in (MANIFEST_NAME, CHECKSUMS_NAME)}
    real = dataset_build.write_bytes_atomic

    def interrupted(path: Any, data: bytes, *, overwrite: bool = False) -> None:
        if os.path.basename(os.fspath(path)) == MANIFEST_NAME:
            raise KeyboardInterrupt
        real(path, data, overwrite=overwrite)

    monkeypatch.setattr(dataset_build, "write_bytes_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        create_dataset(out, ["p2.batch", "p0.batch"], overwrite=True)
    assert {n: (out / n).read_bytes() for n in before} == before
    assert valid(out) and siblings(out) == []


def test_create_overwrite_links_the_shards_and_keeps_unlisted_files(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    for i in range(3):
        write_batch_file(out / f"p{i}.batch", records(8, T) + 10 * i, batch_size=B, seed=i)
    create_dataset(out)
    inodes = {n: (out / n).stat().st_ino for n in os.listdir(out) if n.endswith(".batch")}
    manifest = create_dataset(out, ["p2.batch", "p0.batch"], overwrite=True)
    assert [s.name for s in manifest.shards] == ["p2.batch", "p0.batch"]
    assert {n: (out / n).stat().st_ino for n in inodes} == inodes  # no copy, nothing lost
    assert failure_codes(out) == ["extra_shard"] and siblings(out) == []  # p1: the user's


# -- the fallback swap, leftovers, what cannot be carried -----------------------------------------


def test_the_two_rename_fallback_replaces_the_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dataset_replace, "exchange_paths", lambda a, b: False)
    out = tmp_path / "ds"
    sharded(out, 40)
    (out / "keep.txt").write_text("x")
    new = sharded(out, 16, offset=1, overwrite=True)
    assert (out / MANIFEST_NAME).read_bytes() == new and valid(out)
    assert (out / "keep.txt").read_text() == "x" and siblings(out) == []


def test_a_dataset_moved_aside_by_an_interrupted_fallback_is_reported_never_removed(
    tmp_path: Path,
) -> None:
    """A kill between the fallback's two renames leaves the old dataset whole at
    ``.NAME.zerobatch-old-RAND``: every later write to the path refuses, naming it."""
    out = tmp_path / "ds"
    old = sharded(out, 16)
    aside = tmp_path / ".ds.zerobatch-old-abcd1234"
    os.rename(out, aside)
    with pytest.raises(WriteError, match=r"zerobatch-old-abcd1234"):
        sharded(out, 8)
    (out).mkdir(exist_ok=True)
    with pytest.raises(WriteError, match=r"interrupted"):
        create_dataset(out, overwrite=True)
    assert (aside / MANIFEST_NAME).read_bytes() == old and valid(aside)


def test_every_dataset_moved_aside_is_named(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    sharded(out, 16)
    for tag in ("aaaa0001", "bbbb0002"):
        (tmp_path / f".ds.zerobatch-old-{tag}").mkdir()
    with pytest.raises(WriteError) as caught:
        sharded(out, 8, overwrite=True)
    assert "zerobatch-old-aaaa0001" in str(caught.value)
    assert "zerobatch-old-bbbb0002" in str(caught.value)


def test_a_fallback_interrupted_between_its_renames_puts_the_old_dataset_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the old dataset was renamed aside and before the new one took its
    place: the old dataset is renamed back, whole, and nothing is left beside it."""
    monkeypatch.setattr(dataset_replace, "exchange_paths", lambda a, b: False)
    out = tmp_path / "ds"
    old = sharded(out, 16)
    real_rename = os.rename
    calls = []

    def rename(src: str, dst: str) -> None:
        calls.append((src, dst))
        if len(calls) == 2:  # the staged dataset into place
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        sharded(out, 8, offset=1, overwrite=True)
    monkeypatch.setattr(os, "rename", real_rename)
    staged = os.path.basename(calls[1][0])  # .ds.zerobatch-new-RAND
    assert os.path.basename(calls[0][1]) == f".ds.zerobatch-old-{staged[-8:]}"
    assert re.fullmatch(r"\.ds\.zerobatch-new-\w{8}", staged)
    assert (out / MANIFEST_NAME).read_bytes() == old and valid(out)
    assert not [n for n in siblings(out) if "zerobatch-old" in n]


def test_a_file_added_while_create_overwrite_runs_is_carried_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dataset create --overwrite`` carries the user's files before it checksums the shards
    and again at its commit: a file written into the old directory meanwhile (sorted after
    one already carried) is in the new dataset, not lost with the replaced directory."""
    out = tmp_path / "ds"
    sharded(out, 16)
    (out / "a-notes.txt").write_text("a")
    real_describe = dataset_build._describe

    def describe(*args: Any, **kwargs: Any) -> Any:
        result = real_describe(*args, **kwargs)
        (out / "b-notes.txt").write_text("b")  # written while the overwrite runs
        return result

    monkeypatch.setattr(dataset_build, "_describe", describe)
    create_dataset(out, overwrite=True)
    assert valid(out)
    assert (out / "a-notes.txt").read_text() == "a" and (out / "b-notes.txt").read_text() == "b"


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_an_overwrite_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """The staging directory's lock is released (its descriptor closed) once the overwrite
    commits, and when it fails."""
    out = tmp_path / "ds"
    sharded(out, 16)
    before = _open_descriptors()
    sharded(out, 8, offset=1, overwrite=True)
    create_dataset(out, overwrite=True)
    (out / "sub").mkdir()
    with pytest.raises(WriteError):
        sharded(out, 8, overwrite=True)
    assert _open_descriptors() == before


def test_a_file_at_its_hard_link_limit_is_copied_into_the_new_dataset(tmp_path: Path) -> None:
    """A user file that cannot take one more hard link (the file system's link limit) is
    copied instead, so the new dataset still has it and the old one is untouched."""
    out = tmp_path / "ds"
    sharded(out, 16)
    notes = out / "notes.txt"
    notes.write_text("notes")
    limit = os.pathconf(notes, "PC_LINK_MAX")
    if limit > 70_000:
        pytest.skip(f"this file system allows {limit} links per file")
    links = tmp_path / "links"
    links.mkdir()
    for i in range(limit - 1):
        os.link(notes, links / str(i))
    assert os.stat(notes).st_nlink == limit
    sharded(out, 8, offset=1, overwrite=True)
    assert valid(out) and (out / "notes.txt").read_text() == "notes"
    assert os.stat(out / "notes.txt").st_nlink == 1  # a copy, not a link


def _immutable(path: Path, on: bool) -> bool:
    """Mark ``path`` immutable (no link, rename or removal, even by root) or not; ``False``
    where the file system or the tools cannot."""
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    done = subprocess.run([chattr, "+i" if on else "-i", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def immutable_notes(tmp_path: Path) -> Iterator[Path]:
    """A dataset whose directory holds ``notes.txt``, a user file marked immutable."""
    out = tmp_path / "ds"
    sharded(out, 16)
    notes = out / "notes.txt"
    notes.write_text("notes")
    if not _immutable(notes, True):
        pytest.skip("no immutable files here (chattr)")
    marked = [notes]
    yield out
    for p in [*marked, *tmp_path.glob(".ds.zerobatch-*/notes.txt")]:
        _immutable(p, False)


def test_a_user_file_that_cannot_be_linked_is_copied_and_the_overwrite_commits(
    immutable_notes: Path,
) -> None:
    """An immutable file cannot be hard linked (``EPERM``): it is copied into the new dataset.
    The replaced directory then cannot be removed whole; the overwrite still succeeds (the
    new dataset is committed) and the rest is left for a later write to retry."""
    out = immutable_notes
    new = sharded(out, 8, offset=1, overwrite=True)
    assert (out / MANIFEST_NAME).read_bytes() == new and valid(out)
    assert (out / "notes.txt").read_text() == "notes"


def test_a_stale_staging_directory_that_cannot_be_removed_does_not_stop_a_write(
    immutable_notes: Path,
) -> None:
    out = immutable_notes
    sharded(out, 8, offset=1, overwrite=True)  # leaves the replaced directory half removed
    stale = [n for n in siblings(out) if "zerobatch-new" in n]
    assert stale  # holds the immutable file, so it cannot go
    new = sharded(out, 24, overwrite=True)
    assert (out / MANIFEST_NAME).read_bytes() == new and valid(out)
    assert [n for n in siblings(out) if "zerobatch-new" in n] == stale


def test_a_dataset_in_a_missing_directory_has_no_staging_or_aside_to_find(tmp_path: Path) -> None:
    missing = tmp_path / "missing" / "ds"
    dataset_replace.remove_stale_staging(missing)
    dataset_replace.refuse_aside(str(missing))
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("live_tag", "dead_tags"), [("live0001", ["dead0001"]), ("aaaa0001", ["bbbb0002", "cccc0003"])]
)
def test_the_next_write_removes_stale_staging_but_not_a_live_writers(
    tmp_path: Path, live_tag: str, dead_tags: list[str]
) -> None:
    """Stale staging directories are each judged by their own lock: one held by a live writer
    is left (whether it sorts first or last), every dead one is removed."""
    out = tmp_path / "ds"
    sharded(out, 16)
    live = tmp_path / f".ds.zerobatch-new-{live_tag}"
    for d in (live, *(tmp_path / f".ds.zerobatch-new-{t}" for t in dead_tags)):
        d.mkdir()
        (d / "shard-00000.batch").write_bytes(b"partial")
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        sharded(out, 24, overwrite=True)
        assert siblings(out) == [live.name]
    finally:
        os.close(fd)
    sharded(out, 8, overwrite=True)
    assert siblings(out) == [] and valid(out)


def test_an_overwrite_refuses_entries_it_cannot_carry(tmp_path: Path) -> None:
    """A subdirectory or a FIFO in the dataset directory is named, and nothing changes."""
    out = tmp_path / "ds"
    old = sharded(out, 16)
    (out / "logs").mkdir()
    with pytest.raises(WriteError, match=r"logs/"):
        sharded(out, 8, overwrite=True)
    os.rmdir(out / "logs")
    os.mkfifo(out / "pipe")
    with pytest.raises(WriteError, match=r"pipe"):
        create_dataset(out, overwrite=True)
    assert (out / MANIFEST_NAME).read_bytes() == old and siblings(out) == []


# -- names the manifest rule refuses --------------------------------------------------------------

BAD_NAMES = ["a b.batch", "caf\u00e9.batch", "back\\slash.batch", "new\nline.batch"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_create_dataset_refuses_names_its_reader_would_refuse(tmp_path: Path, name: str) -> None:
    out = tmp_path / "data"
    out.mkdir()
    write_batch_file(out / "good.batch", records(8, T), batch_size=B)
    write_batch_file(out / name, records(8, T), batch_size=B)
    for names in (None, ["good.batch", name]):
        with pytest.raises(WriteError, match="name rule") as e:
            create_dataset(out, names)
        assert repr(name) in str(e.value)
    assert not (out / MANIFEST_NAME).exists() and not (out / CHECKSUMS_NAME).exists()


def test_create_dataset_refuses_metadata_names_and_repeats(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    write_batch_file(out / "a.batch", records(8, T), batch_size=B)
    with pytest.raises(WriteError, match=r"'a.batch' \(given twice\)"):
        create_dataset(out, ["a.batch", "a.batch"])
    with pytest.raises(WriteError, match=r"'checksums.xxh3' \(the dataset's own"):
        create_dataset(out, ["a.batch", CHECKSUMS_NAME])
    assert os.listdir(out) == ["a.batch"]


def test_dataset_create_command_names_every_bad_name_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data"
    out.mkdir()
    write_batch_file(out / "ok.batch", records(8, T), batch_size=B)
    for name in BAD_NAMES[:3]:
        write_batch_file(out / name, records(8, T), batch_size=B)
    status = main(["dataset", "create", str(out)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "3 shard names break" in err and all(repr(n) in err for n in BAD_NAMES[:3])
    assert not (out / MANIFEST_NAME).exists()


def _kernel_exchanges(tmp_path: Path) -> bool:
    """Whether this kernel and file system swap two directories with ``renameat2``
    (``RENAME_EXCHANGE``), probed with the C library directly on two scratch directories."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if not sys.platform.startswith("linux") or fn is None:
        return False
    x, y = tmp_path / "probe-x", tmp_path / "probe-y"
    x.mkdir()
    y.mkdir()
    return bool(fn(-100, os.fsencode(x), -100, os.fsencode(y), 2) == 0)


def test_exchange_paths_swaps_two_directories_in_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wherever the system can swap in one step, ``exchange_paths`` does (relative paths
    resolve from the working directory); elsewhere it says so and changes nothing."""
    can = _kernel_exchanges(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "from-a").write_text("a")
    monkeypatch.chdir(tmp_path)
    assert dataset_replace.exchange_paths("a", "b") is can
    assert (os.listdir(a), os.listdir(b)) == (([], ["from-a"]) if can else (["from-a"], []))
    if can:
        with pytest.raises(FileNotFoundError):
            dataset_replace.exchange_paths(str(a), str(tmp_path / "missing"))


def test_exchange_paths_across_file_systems_changes_nothing(tmp_path: Path) -> None:
    """Directories on two file systems cannot be swapped in one step: ``False`` (the caller
    falls back to two renames), both left as they were."""
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system to swap across")
    a = tmp_path / "a"
    a.mkdir()
    (a / "from-a").write_text("a")
    b = Path(tempfile.mkdtemp(dir=other))
    try:
        assert dataset_replace.exchange_paths(str(a), str(b)) is False
        assert os.listdir(a) == ["from-a"] and os.listdir(b) == []
    finally:
        shutil.rmtree(b)


def test_a_directory_lock_is_exclusive_and_never_follows_a_link(tmp_path: Path) -> None:
    """``_lock_directory`` holds an exclusive lock on a real directory (a second locker gets
    ``None``) through a descriptor that no child process inherits; a symbolic link or a
    regular file under the name gets ``None``."""
    d = tmp_path / "staging"
    d.mkdir()
    fd = dataset_replace._lock_directory(str(d))
    assert fd is not None
    try:
        assert not os.get_inheritable(fd)
        assert dataset_replace._lock_directory(str(d)) is None
    finally:
        os.close(fd)
    again = dataset_replace._lock_directory(str(d))
    assert again is not None
    os.close(again)
    (tmp_path / "link").symlink_to(d, target_is_directory=True)
    (tmp_path / "file").write_text("x")
    assert dataset_replace._lock_directory(str(tmp_path / "link")) is None
    assert dataset_replace._lock_directory(str(tmp_path / "file")) is None


@pytest.mark.parametrize("count", [5, 6])
def test_refused_entries_are_named_up_to_five(tmp_path: Path, count: int) -> None:
    out = tmp_path / "ds"
    sharded(out, 16)
    names = [f"sub{i}" for i in range(count)]
    for n in names:
        (out / n).mkdir()
    with pytest.raises(WriteError) as caught:
        sharded(out, 8, overwrite=True)
    text = str(caught.value)
    assert all(f"{n}/" in text for n in names[:5])
    assert ("sub5/" in text, ", ..." in text) == (False, count > 5)


def test_a_staging_directory_that_cannot_be_made_is_reported_with_its_errno(
    tmp_path: Path,
) -> None:
    """A dataset name long enough that the staging name beside it passes the file system's
    limit: the error keeps the system's errno and names the dataset."""
    out = tmp_path / ("d" * 240)
    sharded(out, 16)
    with pytest.raises(ZeroBatchIOError, match="while creating the staging directory") as caught:
        sharded(out, 8, overwrite=True)
    assert caught.value.errno == errno.ENAMETOOLONG
    assert f"{os.strerror(errno.ENAMETOOLONG)} while creating the staging" in str(caught.value)
    assert valid(out)
