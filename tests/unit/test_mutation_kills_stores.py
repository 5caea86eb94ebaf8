"""Range cache, metadata-file and redaction behaviours that mutation testing found unpinned
(tests/README.md, "Mutation testing")."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import sys
from pathlib import Path

import pytest

from zerobatch_core.errors import ZeroBatchIOError
from zerobatch_core.range_cache import SUFFIX, RangeCache
from zerobatch_core.redaction import MASK, remember, scrub, secrets_of
from zerobatch_core.regular_files import open_regular_file, read_regular_file

# -- range cache -------------------------------------------------------------------------------


def _entries(directory: Path) -> int:
    return sum(1 for p in directory.iterdir() if p.name.endswith(SUFFIX))


def test_a_cache_missing_a_range_counts_a_miss(tmp_path: Path) -> None:
    cache = RangeCache(tmp_path, 1000)
    assert cache.get("s3://b/k", (0, 10)) is None
    assert (cache.hits, cache.misses) == (0, 1)


def test_a_cache_entry_of_the_wrong_length_counts_a_miss(tmp_path: Path) -> None:
    """A damaged entry (a range whose bytes are not its length) is a miss, and is counted."""
    cache = RangeCache(tmp_path, 1000)
    cache.put("s3://b/k", (0, 10), b"x" * 10)
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(b"x" * 4)
    assert cache.get("s3://b/k", (0, 10)) is None
    assert (cache.hits, cache.misses) == (0, 1)


def test_a_cache_reopened_exactly_at_its_limit_keeps_every_entry(tmp_path: Path) -> None:
    """Eviction starts above the limit, not at it: a cache holding exactly ``limit`` bytes
    reopens whole."""
    cache = RangeCache(tmp_path, 1000)
    for i in range(10):
        cache.put("s3://b/k", (i * 100, i * 100 + 100), bytes([i]) * 100)
    assert cache.size == 1000
    again = RangeCache(tmp_path, 1000)
    assert again.size == 1000
    assert _entries(tmp_path) == 10


def test_eviction_keeps_the_most_recent_ninety_percent(tmp_path: Path) -> None:
    """Going over the limit evicts the least recently used entries down to 90% of it, and no
    further."""
    cache = RangeCache(tmp_path, 1000)
    for i in range(10):
        cache.put("s3://b/k", (i * 100, i * 100 + 100), bytes([i]) * 100)
    for age, entry in enumerate(sorted(tmp_path.iterdir())):
        os.utime(entry, (1_000_000 + age, 1_000_000 + age))  # all older than the next put
    cache.put("s3://b/k", (1000, 1100), bytes([10]) * 100)
    assert cache.size == 900
    assert _entries(tmp_path) == 9
    assert cache.get("s3://b/k", (1000, 1100)) == bytes([10]) * 100


def test_a_range_exactly_the_cache_limit_is_kept(tmp_path: Path) -> None:
    """Only a range larger than the whole cache is skipped; one of exactly ``limit`` bytes fits."""
    cache = RangeCache(tmp_path, 100)
    cache.put("s3://b/k", (0, 100), b"y" * 100)
    assert cache.get("s3://b/k", (0, 100)) == b"y" * 100


def test_a_cache_that_cannot_write_skips_the_range_quietly(tmp_path: Path) -> None:
    """A failed write (the directory gone, a full disk) leaves the range uncached; the read
    that fetched it goes on."""
    directory = tmp_path / "cache"
    cache = RangeCache(directory, 1000)
    shutil.rmtree(directory)
    cache.put("s3://b/k", (0, 10), b"z" * 10)
    assert cache.size == 0
    assert cache.get("s3://b/k", (0, 10)) is None


def test_a_cache_of_zero_bytes_is_allowed_and_keeps_nothing(tmp_path: Path) -> None:
    cache = RangeCache(tmp_path, 0)
    cache.put("s3://b/k", (0, 1), b"a")
    assert cache.get("s3://b/k", (0, 1)) is None
    assert _entries(tmp_path) == 0


def test_ranges_sharing_an_end_are_separate_entries(tmp_path: Path) -> None:
    """An entry is named by the object and both ends of its range."""
    cache = RangeCache(tmp_path, 1000)
    cache.put("s3://b/k", (0, 10), b"a" * 10)
    cache.put("s3://b/k", (5, 10), b"b" * 5)
    cache.put("s3://b/k", (0, 5), b"c" * 5)
    assert cache.get("s3://b/k", (0, 10)) == b"a" * 10
    assert cache.get("s3://b/k", (5, 10)) == b"b" * 5
    assert cache.get("s3://b/k", (0, 5)) == b"c" * 5


@pytest.mark.parametrize("limit", [True, "1000", 10.0, -1])
def test_a_cache_limit_must_be_a_non_negative_integer(tmp_path: Path, limit: object) -> None:
    with pytest.raises(ValueError, match="cache_bytes must be a non-negative integer"):
        RangeCache(tmp_path, limit)  # type: ignore[arg-type]


# -- metadata files: regular files only --------------------------------------------------------

PROC_FILE = "/proc/self/status"
"""A regular file whose ``stat`` size (0) is not its length: it stands for a file that grows
between the ``fstat`` and the read."""

needs_proc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists(PROC_FILE), reason="needs /proc"
)


def test_a_directory_is_refused_with_eisdir(tmp_path: Path) -> None:
    with pytest.raises(ZeroBatchIOError, match=r"not a regular file \(a directory\)") as caught:
        open_regular_file(tmp_path)
    assert caught.value.errno == errno.EISDIR
    assert caught.value.filename == str(tmp_path)


def test_a_fifo_is_refused_with_einval(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    os.mkfifo(path)
    with pytest.raises(ZeroBatchIOError, match=r"not a regular file \(a FIFO\)") as caught:
        read_regular_file(path)
    assert caught.value.errno == errno.EINVAL


def test_a_character_device_is_named_in_the_refusal() -> None:
    with pytest.raises(ZeroBatchIOError, match=r"not a regular file \(a character device\)"):
        read_regular_file("/dev/null")


def test_a_refused_file_leaves_no_descriptor_open(tmp_path: Path) -> None:
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    if fds is None:
        pytest.skip("needs /proc/self/fd")
    for _ in range(20):
        with pytest.raises(ZeroBatchIOError):
            open_regular_file(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_file_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "checksums.xxh3"
    path.write_bytes(b"c" * 64)
    assert read_regular_file(path, limit=64) == b"c" * 64


def test_a_file_over_the_limit_is_refused_with_efbig(tmp_path: Path) -> None:
    path = tmp_path / "checksums.xxh3"
    path.write_bytes(b"c" * 65)
    with pytest.raises(ZeroBatchIOError, match="65 bytes, more than the 64") as caught:
        read_regular_file(path, limit=64)
    assert caught.value.errno == errno.EFBIG


def test_a_file_larger_than_one_read_is_read_whole(tmp_path: Path) -> None:
    data = os.urandom(3 << 16) + b"tail"
    path = tmp_path / "manifest.json"
    path.write_bytes(data)
    assert read_regular_file(path) == data
    assert read_regular_file(path, limit=len(data)) == data


@needs_proc
def test_a_file_longer_than_its_stat_size_is_refused() -> None:
    """A file whose bytes do not match the size ``fstat`` reports (here a /proc file, size 0)
    is refused, never read on past that size."""
    with pytest.raises(ZeroBatchIOError, match="changed size while it was read") as caught:
        read_regular_file(PROC_FILE)
    assert caught.value.errno == errno.EIO


def _change_after_stat(monkeypatch: pytest.MonkeyPatch, path: Path, size: int | None) -> None:
    """Resize ``path`` (append one byte, or truncate to ``size``) right after the size that
    ``read_regular_file`` reads by was taken: a file written in place while it is read."""
    real_fstat = os.fstat
    calls = []

    def fstat(fd: int) -> os.stat_result:
        result = real_fstat(fd)
        calls.append(fd)
        if len(calls) == 2:  # the first is open_regular_file's check of the file's kind
            if size is None:
                with path.open("ab") as f:
                    f.write(b"!")
            else:
                os.truncate(path, size)
        return result

    monkeypatch.setattr(os, "fstat", fstat)


@pytest.mark.parametrize("limit", [None, 1000])
def test_a_file_that_grows_while_it_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int | None
) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(b"m" * 100)
    _change_after_stat(monkeypatch, path, None)
    with pytest.raises(ZeroBatchIOError, match=r"changed size .*100 bytes when opened") as caught:
        read_regular_file(path, limit=limit)
    assert caught.value.errno == errno.EIO
    assert caught.value.filename == str(path)


def test_a_file_that_shrinks_while_it_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(b"m" * 100)
    _change_after_stat(monkeypatch, path, 60)
    with pytest.raises(ZeroBatchIOError, match="changed size while it was read") as caught:
        read_regular_file(path)
    assert caught.value.errno == errno.EIO


def test_an_empty_file_reads_as_no_bytes(tmp_path: Path) -> None:
    path = tmp_path / "checksums.xxh3"
    path.write_bytes(b"")
    assert read_regular_file(path) == b""
    assert read_regular_file(path, limit=0) == b""


# -- redaction ---------------------------------------------------------------------------------


def test_a_url_with_an_empty_password_has_its_user_name_as_secret() -> None:
    assert secrets_of("https://token123:@host/x") == {"token123"}


@pytest.mark.parametrize("after", ["/data/a@b.batch", "?v=a@b", "#a@b"])
def test_an_at_sign_after_the_authority_is_no_user_information(after: str) -> None:
    assert secrets_of(f"https://host{after}") == set()


def test_a_secret_of_three_characters_is_replaced() -> None:
    assert secrets_of("https://u:abc@host/x") == {"abc"}


def test_user_information_ends_at_the_last_at_sign() -> None:
    """As ``urllib.parse`` splits it: ``user:pa@ss@host`` has the password ``pa@ss``."""
    assert secrets_of("https://user:pa@ss@host/x") == {"pa@ss", "pa%40ss"}


def test_a_raw_url_is_not_cut_at_an_encoded_slash() -> None:
    """In a raw URL, ``%2F`` in the user information is part of it, not the authority's end."""
    assert scrub("GET https://a%2Fb:pw123@host/x") == "GET https://host/x"


def test_an_encoded_url_ends_its_authority_at_an_encoded_slash() -> None:
    """In a percent-encoded URL the authority ends at ``%2F``: an encoded ``@`` in the path
    stays."""
    text = "https%3A%2F%2Fuser%3Apw%40host%2Fa%40b"
    assert scrub(text) == "https%3A%2F%2Fhost%2Fa%40b"


def test_extra_secrets_are_scrubbed_with_the_remembered_ones() -> None:
    assert scrub("the client says: bad key qzvxkwj", extra={"qzvxkwj"}) == (
        f"the client says: bad key {MASK}"
    )


def test_an_extra_secret_containing_another_is_replaced_whole() -> None:
    text = "bad key qzvxkwjabcd"
    assert scrub(text, extra={"qzvxkwj", "qzvxkwjabcd"}) == f"bad key {MASK}"


def test_a_remembered_secret_containing_another_is_replaced_whole() -> None:
    short = "k" + secrets.token_hex(6)
    remember(f"https://user:{short}@host/a")
    remember(f"https://user:{short}xyz@host/b")
    assert scrub(f"bad key {short}xyz") == f"bad key {MASK}"


def test_an_encoded_url_at_the_end_of_a_message_loses_its_user_information() -> None:
    assert scrub("GET https%3A%2F%2Fuser%3Apw%40") == "GET https%3A%2F%2F"


def test_an_extra_secret_of_three_characters_is_replaced() -> None:
    assert scrub("bad key q7z", extra={"q7z"}) == f"bad key {MASK}"
