"""Range cache, metadata-file, redaction and store behaviours that mutation testing found
unpinned (tests/README.md, "Mutation testing")."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from zerobatch_core.errors import ZeroBatchIOError
from zerobatch_core.live.retention import _stale_temporaries
from zerobatch_core.redaction import MASK, remember, scrub, secrets_of
from zerobatch_core.stores.range_cache import SUFFIX, RangeCache
from zerobatch_core.stores.regular_files import open_regular_file, read_regular_file
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import (
    LocalStore,
    ObjectNotFoundError,
    RetriesExhaustedError,
    RetryPolicy,
    Store,
    StoreError,
    StoreStats,
    is_url,
    retry_reason,
    split_url,
)

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


# -- stores: counters ----------------------------------------------------------------------


def _ten_bytes(tmp_path: Path) -> LocalStore:
    """A fresh store (nothing counted yet) holding the object ``k``, ``0123456789``."""
    (tmp_path / "k").write_bytes(b"0123456789")
    return LocalStore(tmp_path)


def test_a_new_store_has_counted_nothing(tmp_path: Path) -> None:
    assert LocalStore(tmp_path).stats.snapshot() == {
        "requests": 0,
        "bytes_read": 0,
        "bytes_written": 0,
        "retries": 0,
        "retry_reasons": {},
    }


@pytest.mark.parametrize(
    ("counted", "expected"),
    [({"read": 5}, (0, 5, 0)), ({"written": 7}, (0, 0, 7)), ({"requests": 2}, (2, 0, 0))],
)
def test_stats_count_only_what_they_are_given(
    counted: dict[str, int], expected: tuple[int, int, int]
) -> None:
    stats = StoreStats()
    stats.add(**counted)
    snapshot = stats.snapshot()
    assert (snapshot["requests"], snapshot["bytes_read"], snapshot["bytes_written"]) == expected


@pytest.mark.parametrize(
    ("operation", "requests", "read", "written"),
    [
        (lambda s: s.read("k"), 1, 10, 0),
        (lambda s: s.read_ranges("k", [(0, 2), (5, 9)]), 2, 6, 0),
        (lambda s: s.read_ranges("k", []), 0, 0, 0),
        (lambda s: s.read_head("k", 4), 1, 4, 0),
        (lambda s: s.size("k"), 1, 0, 0),
        (lambda s: s.exists("k"), 1, 0, 0),
        (lambda s: s.write("n", b"abc"), 1, 0, 3),
        (lambda s: s.create("n", b"abc"), 1, 0, 3),
        (lambda s: s.delete("k"), 1, 0, 0),
        (lambda s: s.list_keys(), 1, 0, 0),
    ],
    ids=[
        "read",
        "ranges",
        "no-ranges",
        "head",
        "size",
        "exists",
        "write",
        "create",
        "delete",
        "list",
    ],
)
def test_each_operation_counts_its_requests_and_bytes(
    tmp_path: Path, operation: Callable[[Store], object], requests: int, read: int, written: int
) -> None:
    store = _ten_bytes(tmp_path)
    operation(store)
    counted = store.stats.snapshot()
    assert (counted["requests"], counted["bytes_read"], counted["bytes_written"]) == (
        requests,
        read,
        written,
    )


@pytest.mark.parametrize(
    ("length", "data", "expected"),
    [
        (4, b"0123456789", (b"0123", 10)),
        (50, b"0123456789", (b"0123456789", 10)),
        (4, b"", (b"", 0)),
    ],
)
def test_read_head_returns_at_most_length_bytes_and_the_size(
    tmp_path: Path, length: int, data: bytes, expected: tuple[bytes, int]
) -> None:
    (tmp_path / "k").write_bytes(data)
    assert LocalStore(tmp_path).read_head("k", length) == expected


def test_a_range_past_the_end_of_an_object_is_an_error_naming_it(tmp_path: Path) -> None:
    store = _ten_bytes(tmp_path)
    with pytest.raises(StoreError, match=r"range \[5, 15\) returned 5 bytes") as caught:
        store.read_ranges("k", [(0, 5), (5, 15)])
    assert caught.value.errno == errno.EIO
    assert caught.value.filename == str(tmp_path / "k")


def test_a_store_answering_fewer_ranges_than_asked_is_an_error(tmp_path: Path) -> None:
    """Each range gets its own part: a store whose ranged read drops one never hands back a
    shorter list, whose parts the caller would take for the wrong ranges."""

    class DropsTheLast(LocalStore):
        def _read_ranges(
            self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
        ) -> list[bytes]:
            return super()._read_ranges(key, ranges, coalesce)[:-1]

    (tmp_path / "k").write_bytes(b"0123456789")
    with pytest.raises(ValueError, match="shorter"):
        DropsTheLast(tmp_path).read_ranges("k", [(0, 2), (5, 9)])


# -- stores: errors ------------------------------------------------------------------------


def test_a_missing_object_is_named_once_with_the_system_s_reason(tmp_path: Path) -> None:
    """The path is the error's file name; the text adds the system's reason, not the path
    again."""
    with pytest.raises(ObjectNotFoundError) as caught:
        LocalStore(tmp_path).read("missing")
    assert caught.value.errno == errno.ENOENT
    assert caught.value.strerror == "no such object (No such file or directory)"
    assert caught.value.filename == str(tmp_path / "missing")


def test_a_client_s_not_found_text_is_scrubbed(tmp_path: Path) -> None:
    """A client's ``FileNotFoundError`` that names no file carries its own text, which may
    hold a URL with user information: the message keeps the text, scrubbed, in its string and
    in its attributes."""

    class Client(LocalStore):
        def _read(self, key: str) -> bytes:
            raise FileNotFoundError(errno.ENOENT, "GET https://reader:s3cr3tpw@host/b/k: NoSuchKey")

    with pytest.raises(ObjectNotFoundError, match="NoSuchKey") as caught:
        Client(tmp_path).read("k")
    for text in (str(caught.value), str(caught.value.strerror), *map(str, caught.value.args)):
        assert "s3cr3tpw" not in text and "reader" not in text


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (PermissionError(errno.EACCES, "Access Denied"), errno.EACCES, "[Errno 13] Access Denied"),
        (ValueError("bad header\nsecond line"), errno.EIO, "bad header"),
        (ValueError(""), errno.EIO, "ValueError"),
        (ValueError("x" * 500), errno.EIO, "x" * 300),
    ],
    ids=["errno-kept", "first-line", "type-if-no-text", "300-characters"],
)
def test_a_lasting_failure_names_the_operation_the_object_and_the_client_s_error(
    tmp_path: Path, error: Exception, code: int, message: str
) -> None:
    class Refusing(LocalStore):
        def _read(self, key: str) -> bytes:
            raise error

    store = Refusing(tmp_path)
    with pytest.raises(StoreError) as caught:
        store.read("k")
    assert caught.value.errno == code
    assert caught.value.strerror == f"read failed: {message}"
    assert caught.value.filename == str(tmp_path / "k")
    assert store.stats.retries == 0


def test_the_default_policy_makes_ten_attempts(tmp_path: Path) -> None:
    """README, "Retries": throttling is retried, 10 attempts in all."""
    calls: list[str] = []

    class Throttled(LocalStore):
        def _size(self, key: str) -> int:
            calls.append(key)
            raise OSError("503 Service Unavailable")

    store = Throttled(tmp_path, RetryPolicy(base=0.0001))
    with pytest.raises(RetriesExhaustedError, match=r"after 10 attempts \(503\)") as caught:
        store.size("k")
    assert caught.value.errno == errno.EAGAIN
    assert len(calls) == 10
    assert (store.stats.retries, store.stats.retry_reasons) == (9, {"503": 9})


@pytest.mark.parametrize(
    ("policy", "attempt", "most", "largest_above"),
    [
        (RetryPolicy(base=1.0, cap=100.0), 3, 8.0, 7.0),
        (RetryPolicy(), 30, 2.0, 1.9),
        (RetryPolicy(), 0, 0.05, 0.015),
    ],
    ids=["doubles-per-attempt", "readme-2s-apart", "first-retry-brief"],
)
def test_backoff_is_drawn_up_to_base_doubled_per_attempt_and_capped(
    policy: RetryPolicy, attempt: int, most: float, largest_above: float
) -> None:
    """Full jitter: attempt ``k`` waits up to ``min(cap, base * 2**k)``, and 500 draws come
    near that bound. The default starts at tens of milliseconds (a short throttle costs a
    training step little) and waits at most 2 s (README, "Retries")."""
    delays = [policy.delay(attempt) for _ in range(500)]
    assert min(delays) >= 0.0
    assert max(delays) <= most
    assert max(delays) > largest_above


# -- stores: what is transient -------------------------------------------------------------


class _HTTPError(Exception):
    """An HTTP client's error with the status as an attribute, as requests and botocore-style
    clients give it."""

    def __init__(self, text: str, **status: int) -> None:
        super().__init__(text)
        for name, value in status.items():
            setattr(self, name, value)


def _status_error(form: str, status: int) -> Exception:
    text = "connection closed by the server"
    if form == "text":
        return OSError(f"Server returned non-2xx status code: {status}; {text}")
    return _HTTPError(text, **{form: status})


@pytest.mark.parametrize("form", ["status", "status_code", "text"])
@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (409, "409"),
        (429, "429"),
        (500, "500"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
        (408, "timeout"),
        (400, None),
        (403, None),
        (404, None),
        (501, None),
        (399, "connection"),
        (301, "connection"),
    ],
)
def test_an_error_status_decides_before_the_text(
    form: str, status: int, reason: str | None
) -> None:
    """An error status (400 and up) decides whether to retry, whatever the text says; below
    400 the status is no answer and the text (here a dropped connection) decides."""
    assert retry_reason(_status_error(form, status)) == reason


# -- stores: the directory store -----------------------------------------------------------


def test_a_store_at_a_url_shows_it_without_user_information() -> None:
    store = Store("https://reader:pw5512@host/bucket/data")
    assert store.url == "https://host/bucket/data"
    assert repr(store) == "Store('https://host/bucket/data')"


@pytest.mark.parametrize(
    ("root", "key", "where"),
    [
        ("s3://b/data", "k/1.json", "s3://b/data/k/1.json"),
        ("s3://b/data//", "k", "s3://b/data/k"),
        ("s3://b/data", "", "s3://b/data"),
    ],
)
def test_a_key_of_a_url_store_is_named_by_its_url(root: str, key: str, where: str) -> None:
    assert Store(root).where(key) == where


def test_objects_are_written_readable_by_all_writable_by_the_owner(tmp_path: Path) -> None:
    """Written and created objects get mode 0644 (less the process's umask), like files that
    other tools write: readers under other accounts can read them."""
    umask = os.umask(0o022)
    os.umask(umask)
    store = LocalStore(tmp_path)
    store.write("w", b"w")
    store.create("c", b"c")
    for key in ("w", "c"):
        assert (tmp_path / key).stat().st_mode & 0o7777 == 0o644 & ~umask


def test_a_metadata_object_over_one_gib_is_refused_unread(tmp_path: Path) -> None:
    """A local store reads whole objects of at most 1 GiB (a sparse file here: nothing is
    read)."""
    with (tmp_path / "manifest.json").open("wb") as f:
        f.truncate((1 << 30) + 1)
    with pytest.raises(ZeroBatchIOError, match="1,073,741,825 bytes, more than the 1,073,741,824"):
        LocalStore(tmp_path).read("manifest.json")


@pytest.mark.parametrize("key", ["/etc/passwd", "../x", "a/../../x", "a/.."])
def test_a_key_that_leaves_the_store_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="leaves the store"):
        LocalStore(tmp_path).path(key)


def test_the_size_of_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    with pytest.raises(ZeroBatchIOError, match=r"not a regular file \(a directory\)"):
        LocalStore(tmp_path).size("sub")


@pytest.mark.parametrize(("key", "exists"), [("k", True), ("missing", False)])
def test_exists_says_whether_an_object_is_there(tmp_path: Path, key: str, exists: bool) -> None:
    assert _ten_bytes(tmp_path).exists(key) is exists


def test_deleting_a_missing_object_is_no_error(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.delete("missing")
    assert store.list_keys() == []


@pytest.mark.parametrize(
    ("data", "left"),
    [(b"data", ["k"]), ("not bytes", [])],
    ids=["rename-fails", "write-fails"],
)
def test_a_failed_write_leaves_no_temporary_file(
    tmp_path: Path, data: Any, left: list[str]
) -> None:
    """A write that fails, at the rename (the key is a directory) or while the temporary file
    is written (data that is not bytes), removes its temporary file."""
    (tmp_path / "d").mkdir()
    if left:
        (tmp_path / "d" / "k").mkdir()
        (tmp_path / "d" / "k" / "inner").write_bytes(b"i")
    with pytest.raises(StoreError):
        LocalStore(tmp_path).write("d/k", data)
    assert sorted(os.listdir(tmp_path / "d")) == left


def test_listing_returns_regular_files_under_the_prefix_at_any_depth(tmp_path: Path) -> None:
    for name in ["a/x", "a/b/y", "ab", "a/.y.1234.tmp", "c/z"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"o")
    os.mkfifo(tmp_path / "a" / "fifo")
    os.symlink("loop", tmp_path / "a" / "loop")  # a link to itself: no file at all
    os.symlink("x", tmp_path / "a" / "linked")  # a link to a regular file: an object
    store = LocalStore(tmp_path)
    assert store.list_keys("a") == ["a/b/y", "a/linked", "a/x", "ab"]
    assert store.list_keys("a/") == ["a/b/y", "a/linked", "a/x"]
    assert store.list_keys() == ["a/b/y", "a/linked", "a/x", "ab", "c/z"]


class _Killed(BaseException):
    """A writer killed at a chosen point (nothing after it runs)."""


def test_a_killed_writer_s_temporary_file_is_found_by_retention(tmp_path: Path) -> None:
    """A write killed once its temporary file is written leaves that file, named the way
    retention's ``reclaim`` recognises to remove it once stale."""

    class KilledAfterTheTemporary(LocalStore):
        def _temp(self, target: str, data: bytes) -> str:
            super()._temp(target, data)
            raise _Killed

    with pytest.raises(_Killed):
        KilledAfterTheTemporary(tmp_path).write("d/manifest.json", b"data")
    (left,) = os.listdir(tmp_path / "d")
    assert _stale_temporaries(str(tmp_path), time.time() + 60) == [(str(tmp_path / "d" / left), 4)]


def test_a_write_never_writes_into_another_writer_s_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporary files are created exclusively: a writer that draws a name another writer's
    temporary file already has (forced here) fails rather than writing into that file."""
    monkeypatch.setattr(secrets, "token_hex", lambda n: "0" * (2 * n))
    (tmp_path / "d").mkdir()
    other = tmp_path / "d" / ".k.000000000000.tmp"
    other.write_bytes(b"another writer's longer bytes")
    with pytest.raises(StoreError, match="write failed"):
        LocalStore(tmp_path).write("d/k", b"mine")
    assert other.read_bytes() == b"another writer's longer bytes"
    assert not (tmp_path / "d" / "k").exists()


# -- stores: a conditional create retried after a lost answer ------------------------------


@pytest.mark.parametrize(
    ("meanwhile", "created"),
    [("nothing", True), ("replaced", False), ("deleted", False)],
)
def test_a_create_whose_answer_was_lost_reads_the_object_back(
    tmp_path: Path, meanwhile: str, created: bool
) -> None:
    """The first attempt's object is written but its answer lost (a dropped connection);
    the retry finds the key taken and reads it back: its own bytes mean created, another
    writer's bytes or no object at all (deleted in between) mean not created."""

    class LostAnswer(LocalStore):
        attempts = 0

        def _create(self, key: str, data: bytes) -> bool:
            self.attempts += 1
            made = super()._create(key, data)
            if self.attempts == 1:
                raise ConnectionResetError("connection reset by peer")
            return made

        def _read(self, key: str) -> bytes:
            if meanwhile == "replaced":
                LocalStore(self.root).write(key, b"another writer")
            elif meanwhile == "deleted":
                os.unlink(self.path(key))
            return super()._read(key)

    store = LostAnswer(tmp_path, RetryPolicy(base=0.0001))
    assert store.create("live/1.json", b"mine") is created
    assert store.stats.retry_reasons == {"connection": 1}


def test_a_create_finding_the_key_taken_at_once_does_not_claim_it(tmp_path: Path) -> None:
    """Only a retry reads the object back: a first attempt that finds the key taken has lost,
    even to identical bytes."""
    store = LocalStore(tmp_path)
    assert store.create("live/1.json", b"same") is True
    assert store.create("live/1.json", b"same") is False


# -- stores: opening by URL ----------------------------------------------------------------


@pytest.mark.parametrize("source", [("fs",), ("fs", "root", "extra"), ["fs", "root"], 3, None])
def test_open_store_refuses_what_is_neither_a_path_a_url_nor_a_store(source: Any) -> None:
    with pytest.raises(TypeError, match=f"got {type(source).__name__}"):
        open_store(source)


def test_open_store_returns_a_store_as_it_is(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert open_store(store) is store


def test_a_two_character_path_is_a_directory_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a pair (a tuple) is an fsspec filesystem and its root, not any source of length 2."""
    monkeypatch.chdir(tmp_path)
    store = open_store("db")
    assert isinstance(store, LocalStore)
    assert store.root == str(tmp_path / "db")


def test_an_fsspec_filesystem_and_its_root_open_a_store_there() -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"zb-{secrets.token_hex(6)}/data"
    policy = RetryPolicy(attempts=3)
    store = open_store((fs, root), retry=policy)
    assert (store.url, store.retry) == (f"memory://{root}", policy)
    store.write("k", b"bytes")
    assert fs.cat_file(f"{root}/k") == b"bytes"


@pytest.mark.parametrize("source", [3, None, Path("s3://b/k"), b"s3://b/k", "/tmp/x", "s3:/b/k"])
def test_only_a_string_with_a_known_scheme_is_a_url(source: object) -> None:
    assert is_url(source) is False


def test_a_file_url_opens_its_decoded_path(tmp_path: Path) -> None:
    (tmp_path / "a b").mkdir()
    store = open_store(f"file://{tmp_path}/a%20b")
    assert isinstance(store, LocalStore)
    assert store.root == str(tmp_path / "a b")


def test_an_unknown_scheme_is_refused_without_user_information() -> None:
    with pytest.raises(ZeroBatchIOError, match="unknown URL scheme 'ftp'") as caught:
        open_store("ftp://user:pw9731@host/x")
    assert caught.value.filename == "ftp://host/x"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("s3://b/data/f.batch/", ("s3://b/data", "f.batch")),
        ("https://host/d/f", ("https://host/d", "f")),
        ("http://host:9000/b/f", ("http://host:9000/b", "f")),
        ("file:///tmp/a%20b/f.batch", ("/tmp/a b", "f.batch")),
        ("/tmp/a/f.batch", ("/tmp/a", "f.batch")),
        ("s3://b/a://k", ("s3://b/a://", "k")),
        ("s3://b://k", ("s3://b://", "k")),
    ],
)
def test_split_url_gives_the_parent_and_the_key(source: str, expected: tuple[str, str]) -> None:
    """The key is what follows the last slash (a trailing slash aside; a ``file://`` URL is its
    decoded path). A parent that would end in ``:/`` (a path holding ``://``) keeps its second
    slash: the parent and the key then make up the source."""
    assert split_url(source) == expected
