"""``RangeCache``: byte ranges of immutable objects kept on local disk, under a size limit.

Batch objects never change once written (a dataset's shards, a live dataset's batch objects),
so a range fetched once can be served from local disk afterwards: by the next epoch, by
another process on the same machine sharing the directory, or after a restart. Entries are
files named by the XXH3-128 of ``(object URL, start, end)``, written atomically (a temporary
file, then ``rename``), so concurrent readers see a whole entry or none. When the entries
exceed ``limit`` bytes, the least recently used go first (modification times, refreshed on
every hit). A damaged or missing entry is a miss, never an error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading

import xxhash

SUFFIX = ".range"


class RangeCache:
    """Ranges of immutable objects in ``directory``, at most ``limit`` bytes in all."""

    def __init__(self, directory: str | os.PathLike[str], limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"cache_bytes must be a non-negative integer, got {limit!r}")
        self.directory = os.fspath(directory)
        self.limit = limit
        os.makedirs(self.directory, exist_ok=True)
        self._lock = threading.Lock()
        self._size = sum(size for _, size, _ in self._entries())
        if self._size > self.limit:
            self._evict()
        self.hits = 0
        self.misses = 0

    def _path(self, name: str, span: tuple[int, int]) -> str:
        key = xxhash.xxh3_128_hexdigest(f"{name}\0{span[0]}\0{span[1]}".encode())
        return os.path.join(self.directory, key + SUFFIX)

    def get(self, name: str, span: tuple[int, int]) -> bytes | None:
        """The cached bytes ``[start, end)`` of object ``name``, or ``None``."""
        path = self._path(name, span)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self.misses += 1
            return None
        if len(data) != span[1] - span[0]:
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        self.hits += 1
        return data

    def put(self, name: str, span: tuple[int, int], data: bytes) -> None:
        """Keep ``data`` as the range ``span`` of object ``name`` (skipped if over the limit)."""
        if len(data) > self.limit:
            return
        path = self._path(name, span)
        temp = f"{path}.{secrets.token_hex(4)}.tmp"
        try:
            with open(temp, "wb") as f:
                f.write(data)
            os.replace(temp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return
        with self._lock:
            self._size += len(data)
            if self._size > self.limit:
                self._evict()

    def _entries(self) -> list[tuple[str, int, float]]:
        out = []
        with os.scandir(self.directory) as it:
            for entry in it:
                if entry.name.endswith(SUFFIX):
                    with contextlib.suppress(OSError):
                        st = entry.stat()
                        out.append((entry.path, st.st_size, st.st_mtime))
        return out

    def _evict(self) -> None:
        """Delete least recently used entries until the cache is within 90% of its limit."""
        entries = sorted(self._entries(), key=lambda e: e[2])
        total = sum(size for _, size, _ in entries)
        for path, size, _ in entries:
            if total <= self.limit * 0.9:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= size
        self._size = total

    @property
    def size(self) -> int:
        """Bytes of cached ranges (as counted by this process)."""
        return self._size
