"""Byte stores: one small interface over local directories, object storage and fsspec.

A ``Store`` is a flat namespace of immutable-once-written objects under one root, with the few
operations ZeroBatch needs from object storage: whole reads, concurrent byte-range reads, sizes,
writes, a *conditional create* (write only if the key does not exist yet: ``O_EXCL``/``link``
on a file system, ``If-None-Match: *`` on S3-compatible stores), deletes and listings.

``open_store(url)`` (``resolve.py``) picks the implementation from the URL: a path or
``file://`` URL is a ``LocalStore`` (here); ``s3://``, ``gs://``, ``az://``, ``http://`` and
``https://`` use the Rust ``object_store`` crate through ``obstore``
(``object_stores.ObstoreStore``, the optional ``zerobatch[remote]`` extra); a configured
``fsspec`` filesystem is accepted as it is (``object_stores.FsspecStore``). Credentials come
from each store's standard environment and configuration (for S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ...);
ZeroBatch never stores, prints or logs them: URLs in messages are shown without any user
information, and every error text, including what the store's client says, is scrubbed of user
information and of the URL's secrets (``redaction``).

Every operation is retried with exponential backoff and jitter when the store throttles (S3
``SlowDown``, HTTP 429/500/502/503/504) or the connection drops (``RetryPolicy``); the store
counts requests, bytes and retries in ``stats`` so that callers can report them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import secrets
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ZeroBatchError
from ..redaction import redact, remember, scrub
from .regular_files import open_regular_file, read_regular_file

T = TypeVar("T")

REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "http", "https")
"""URL schemes served by object storage (``obstore``)."""

URL_SCHEMES = ("file", *REMOTE_SCHEMES)
"""Every URL scheme a source or a live dataset may be given as."""


class StoreError(ZeroBatchError, OSError):
    """A store operation that failed for good (after its retries), naming the store and key."""


class RetriesExhaustedError(StoreError):
    """A retryable failure (throttling, a dropped connection) that outlasted ``RetryPolicy``."""


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """No object at the key (a ``FileNotFoundError``, so ``except FileNotFoundError`` works),
    naming the store and key."""


def is_url(source: object) -> bool:
    """Whether ``source`` is a string that names a URL scheme ZeroBatch opens (``s3://`` ...)."""
    if not isinstance(source, str) or "://" not in source:
        return False
    return source.split("://", 1)[0].lower() in URL_SCHEMES


def join_url(base: str, key: str) -> str:
    """``base`` and a key below it, joined with one ``/``."""
    return f"{base.rstrip('/')}/{key}" if key else base


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter: attempt ``k`` (from 0) sleeps a random time in
    ``[0, min(cap, base * 2**k)]`` before retrying, for at most ``attempts`` attempts.

    The defaults ride out a few seconds of throttling (S3 asks clients to slow down rather
    than fail) without hanging a training step for minutes.
    """

    attempts: int = 10
    base: float = 0.02
    cap: float = 2.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt + 1``."""
        return random.uniform(0.0, min(self.cap, self.base * (2.0**attempt)))


class StoreStats:
    """Counters of one store's traffic (thread-safe): requests, bytes in and out, retries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.retries = 0
        self.retry_reasons: dict[str, int] = {}

    def add(self, requests: int = 0, read: int = 0, written: int = 0) -> None:
        """Count ``requests`` requests that moved ``read`` and ``written`` bytes."""
        with self._lock:
            self.requests += requests
            self.bytes_read += read
            self.bytes_written += written

    def retried(self, reason: str) -> None:
        """Count one retry, by a short reason (``"503"``, ``"connection"``, ...)."""
        with self._lock:
            self.retries += 1
            self.retry_reasons[reason] = self.retry_reasons.get(reason, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain values."""
        with self._lock:
            return {
                "requests": self.requests,
                "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written,
                "retries": self.retries,
                "retry_reasons": dict(self.retry_reasons),
            }


class Store:
    """Objects under one root, addressed by ``/``-separated keys (see the module docstring).

    Subclasses implement the ``_``-prefixed operations and ``_retry_reason``; this class adds
    the retries, the counters and error messages that name the store and the key.
    """

    url: str
    """The store's root, as given (user information removed)."""

    def __init__(self, url: str, retry: RetryPolicy | None = None) -> None:
        remember(url)
        self.url = redact(url) if "://" in url else url
        self.retry = retry or RetryPolicy()
        self.stats = StoreStats()

    # -- the interface ---------------------------------------------------------------------
    def read(self, key: str) -> bytes:
        """The whole object ``key``; ``FileNotFoundError`` if there is none."""
        data = self._call("read", key, lambda: self._read(key))
        self.stats.add(1, read=len(data))
        return data

    def read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int = 0
    ) -> list[bytes]:
        """The bytes ``[start, end)`` of each range of object ``key``, fetched concurrently
        where the store can. Ranges less than ``coalesce`` bytes apart may be fetched as one
        request (fewer requests, but the gaps' bytes are fetched too); ``0`` fetches exactly
        the ranges."""
        if not ranges:
            return []
        parts = self._call("read_ranges", key, lambda: self._read_ranges(key, ranges, coalesce))
        for (start, end), part in zip(ranges, parts, strict=True):
            if len(part) != end - start:
                raise StoreError(
                    errno.EIO,
                    f"range [{start}, {end}) returned {len(part)} bytes (object shorter than "
                    "expected, or changed)",
                    self.where(key),
                )
        self.stats.add(len(ranges), read=sum(len(p) for p in parts))
        return parts

    def read_head(self, key: str, length: int) -> tuple[bytes, int]:
        """The first ``length`` bytes of object ``key`` (fewer if it is shorter) and its size:
        one request where the store reports the size with a ranged read, two otherwise."""
        found = self._call("read_head", key, lambda: self._read_head(key, length))
        self.stats.add(1, read=len(found[0]))
        return found

    def _read_head(self, key: str, length: int) -> tuple[bytes, int]:
        size = self._size(key)
        end = min(length, size)
        return (self._read_ranges(key, [(0, end)], 0)[0] if end else b""), size

    def size(self, key: str) -> int:
        """Size in bytes of object ``key``; ``FileNotFoundError`` if there is none."""
        value = self._call("size", key, lambda: self._size(key))
        self.stats.add(1)
        return value

    def exists(self, key: str) -> bool:
        """Whether object ``key`` exists."""
        try:
            self.size(key)
        except FileNotFoundError:
            return False
        return True

    def write(self, key: str, data: bytes) -> None:
        """Write ``data`` as object ``key``, replacing any object there (atomically)."""
        self._call("write", key, lambda: self._write(key, data))
        self.stats.add(1, written=len(data))

    def create(self, key: str, data: bytes) -> bool:
        """Write ``data`` as object ``key`` only if no object ``key`` exists: ``True`` if this
        call created it, ``False`` if the key was taken.

        A retry after a dropped connection can find the object its own first attempt wrote; it
        then reads the object back and reports ``True`` if the bytes are the ones sent. Callers
        therefore make what they create conditionally unique (live manifests carry their
        writer's id and a random nonce), so equal bytes mean this call's own write.
        """
        tried = False

        def attempt() -> bool:
            nonlocal tried
            first, tried = not tried, True
            if self._create(key, data):
                return True
            if first:
                return False
            try:
                return self._read(key) == data
            except FileNotFoundError:
                return False

        created = self._call("create", key, attempt)
        self.stats.add(1, written=len(data))
        return created

    def delete(self, key: str) -> None:
        """Delete object ``key``; deleting a missing object is not an error (idempotent)."""
        self._call("delete", key, lambda: self._delete(key))
        self.stats.add(1)

    def list_keys(self, prefix: str = "") -> list[str]:
        """Keys of every object whose key starts with ``prefix``, sorted."""
        keys = self._call("list", prefix, lambda: self._list(prefix))
        self.stats.add(1)
        return sorted(keys)

    def where(self, key: str) -> str:
        """The URL (or path) of ``key`` for messages."""
        return join_url(self.url, key)

    def close(self) -> None:
        """Release what the store holds (connections); most stores hold nothing."""

    # -- retries ---------------------------------------------------------------------------
    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """``fn()`` with retries; a failure for good raises ``StoreError`` (``ObjectNotFoundError``
        for a missing object) naming the store and key.

        The client's exception is not chained to the one raised (``from None``): its text and
        attributes hold the URL as the client saw it, user information included, and a
        traceback (``--debug``, an uncaught error in a training script) prints every chained
        exception. Its type and scrubbed first line are in the message instead.
        """
        for attempt in range(self.retry.attempts):
            try:
                return fn()
            except (FileNotFoundError, NotADirectoryError) as e:
                if isinstance(e, ZeroBatchError):
                    raise
                # Named by the store and key; the client's text, scrubbed, says the rest. A
                # key below a file (a directory store rooted at a file) is no object either.
                detail = e.strerror if e.filename is not None and e.strerror else _short(e)
                raise ObjectNotFoundError(
                    errno.ENOENT, f"no such object ({detail})", self.where(key)
                ) from None
            except ZeroBatchError:
                raise  # ZeroBatch's own verdict (a FIFO refused, ...): never transient
            except Exception as e:
                reason = self._retry_reason(e)
                if reason is None:
                    raise StoreError(
                        getattr(e, "errno", None) or errno.EIO,
                        f"{op} failed: {_short(e)}",
                        self.where(key),
                    ) from None
                if attempt + 1 == self.retry.attempts:
                    raise RetriesExhaustedError(
                        errno.EAGAIN,
                        f"{op} still failing after {self.retry.attempts} attempts "
                        f"({reason}): {_short(e)}",
                        self.where(key),
                    ) from None
                self.stats.retried(reason)
                time.sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _retry_reason(self, error: Exception) -> str | None:
        """A short reason if ``error`` is worth retrying (throttling, a dropped connection)."""
        return retry_reason(error)

    # -- implementation --------------------------------------------------------------------
    def _read(self, key: str) -> bytes:
        raise NotImplementedError

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        raise NotImplementedError

    def _size(self, key: str) -> int:
        raise NotImplementedError

    def _write(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _create(self, key: str, data: bytes) -> bool:
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError

    def _list(self, prefix: str) -> list[str]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


_THROTTLE_MARKERS = (
    ("slowdown", "SlowDown"),
    ("slow down", "SlowDown"),
    ("throttl", "throttled"),
    ("too many requests", "429"),
    (" 429", "429"),
    (" 500", "500"),
    (" 502", "502"),
    (" 503", "503"),
    (" 504", "504"),
    ("service unavailable", "503"),
    ("internal server error", "500"),
    ("bad gateway", "502"),
    ("gateway timeout", "504"),
    ("connection", "connection"),
    ("error sending request", "connection"),
    ("broken pipe", "connection"),
    ("reset by peer", "connection"),
    ("incomplete", "connection"),
    ("unexpected eof", "connection"),
    ("end of file", "connection"),
    ("timed out", "timeout"),
    ("timeout", "timeout"),
)


_STATUS = re.compile(r"(?i)(?:status code|status)\s*:?\s*(\d{3})\b")
"""An HTTP status in a client's error text (``non-2xx status code: 403``, ``status: 404``)."""

_SETTINGS = re.compile(r"(?i)\b(?:retry_timeout|max_retries|retries|elapsed)\s*:\s*[^,\n]*")
"""Request settings that ``obstore`` errors list in their debug dump (``retry_timeout: 180s``),
which must not read as a timeout."""


def retry_reason(error: BaseException) -> str | None:
    """Whether an error from any store client is transient, and why (``None``: it is not).

    Clients report throttling and dropped connections in different types, so the decision
    looks at the standard exception types first, then at the HTTP status (an attribute, or the
    status the message reports): 429, 500, 502, 503 and 504 are transient, and so is 409 (S3's
    answer to concurrent conditional writes of one key); 408 is a timeout, and any other status
    an answer that the same request will get again (403 forbidden, 404 not found, 501 not
    implemented). Without a status it looks at the message (request settings such as
    ``retry_timeout`` aside) for the phrases S3, GCS, Azure and HTTP servers use.
    """
    if isinstance(error, (ConnectionError, TimeoutError)):
        return "connection"
    text = f" {error}".lower()
    status = getattr(error, "status", None) or getattr(error, "status_code", None)
    if not isinstance(status, int):
        found = _STATUS.search(text)
        status = int(found.group(1)) if found else None
    if isinstance(status, int) and status >= 400:  # a 2xx body cut off is not an answer
        if status in (409, 429, 500, 502, 503, 504):  # 409: a conditional write's race
            return str(status)
        if status == 408:
            return "timeout"
        return None  # the server answered, and will answer the same again
    text = _SETTINGS.sub("", text)
    for marker, reason in _THROTTLE_MARKERS:
        if marker in text:
            return reason
    return None


def _short(error: BaseException) -> str:
    """The first line of ``error``'s text (its type name if it has none), scrubbed of user
    information and secrets, at most 300 characters."""
    text = scrub(str(error)).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


LOCAL_READ_LIMIT = 1 << 30
"""Largest object a directory store reads whole (1 GiB): whole reads are for metadata (live
descriptors, manifest versions, segments, watermarks, a dataset's manifest, and its checksums
at 8 bytes a slot), so a sparse or runaway file is refused before it is read rather than
filling memory."""


class LocalStore(Store):
    """A directory as a store: keys are relative paths below ``root``.

    Writes are atomic (a temporary file in the target's directory, written, fsynced and
    renamed, then the directory fsynced); ``create`` links the written temporary file to the
    key, which fails if the key exists (``link`` is the file system's conditional create and
    also works on NFS, where ``O_EXCL`` on the final name is not reliable everywhere).
    """

    def __init__(self, root: str | os.PathLike[str], retry: RetryPolicy | None = None) -> None:
        self.root = os.path.abspath(os.fspath(root))
        super().__init__(self.root, retry)

    def path(self, key: str) -> str:
        """The file of ``key``."""
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"{self.root}: key {key!r} leaves the store")
        return os.path.join(self.root, *key.split("/")) if key else self.root

    def where(self, key: str) -> str:
        return self.path(key)

    def _read(self, key: str) -> bytes:
        # Non-blocking open and a file-type check: a FIFO named like a manifest is refused
        # (``ZeroBatchIOError``), not waited on; so is a file too large to be metadata.
        return read_regular_file(self.path(key), LOCAL_READ_LIMIT)

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        fd = open_regular_file(self.path(key))
        try:
            return [os.pread(fd, end - start, start) for start, end in ranges]
        finally:
            os.close(fd)

    def _size(self, key: str) -> int:
        # Only a regular file is an object: a FIFO's or a directory's size says nothing.
        path = self.path(key)
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            os.close(open_regular_file(path))  # raises the error naming what the path is
        return st.st_size

    def _temp(self, target: str, data: bytes) -> str:
        directory = os.path.dirname(target)
        os.makedirs(directory, exist_ok=True)
        temp = os.path.join(directory, f".{os.path.basename(target)}.{secrets.token_hex(6)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(temp)
            raise
        os.close(fd)
        return temp

    def _sync_dir(self, target: str) -> None:
        fd = os.open(os.path.dirname(target), os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write(self, key: str, data: bytes) -> None:
        target = self.path(key)
        temp = self._temp(target, data)
        try:
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        self._sync_dir(target)

    def _create(self, key: str, data: bytes) -> bool:
        target = self.path(key)
        temp = self._temp(target, data)
        try:
            os.link(temp, target)
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        self._sync_dir(target)
        return True

    def _delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key))

    def _list(self, prefix: str) -> list[str]:
        # Objects are regular files (a FIFO, socket or device is none, and reading one is
        # refused): the directory entries' types say which, without opening anything.
        out: list[str] = []
        for directory, dirs, files in os.walk(self.root):
            dirs.sort()
            rel = os.path.relpath(directory, self.root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            wanted = {
                name
                for name in files
                if (base + name).startswith(prefix) and not name.endswith(".tmp")
            }
            if not wanted:
                continue
            with os.scandir(directory) as entries:
                out.extend(base + e.name for e in entries if e.name in wanted and _is_regular(e))
        return out


def _is_regular(entry: os.DirEntry[str]) -> bool:
    """Whether a directory entry is a regular file (through a symbolic link too); an entry that
    vanished or cannot be examined is not."""
    try:
        return entry.is_file()
    except OSError:
        return False


def split_url(source: str) -> tuple[str, str]:
    """``(parent, name)`` of a URL or path: the store root that holds it, and its key there."""
    stripped = source.rstrip("/")
    if is_url(stripped) and stripped.lower().startswith("file://"):
        stripped = urllib.parse.unquote(urllib.parse.urlsplit(stripped).path)
    if is_url(stripped):
        rest = stripped.split("://", 1)[1]
        if "/" not in rest.lstrip("/"):
            return stripped, ""
        parent, name = stripped.rsplit("/", 1)
        return (parent + "/" if parent.endswith(":/") or parent.endswith("://") else parent), name
    path = os.path.abspath(stripped)
    return os.path.dirname(path), os.path.basename(path)
