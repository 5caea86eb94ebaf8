"""``Store`` implementations over object storage: ``obstore`` (the default) and ``fsspec``.

``ObstoreStore`` serves ``s3://``, ``gs://``, ``az://`` and ``http(s)://`` URLs with the Rust
``object_store`` crate (the ``obstore`` package, ``pip install 'zerobatch[remote]'``): range
reads are fetched concurrently and nearby ranges merged (``get_ranges``), and ``create`` is
``put(mode="create")``, i.e. ``If-None-Match: *`` on S3. Its own retries are switched off so
that ``Store``'s retry loop sees, counts and reports every retry. Why obstore rather than
s3fs is measured in ``benchmarks/remote_bench.py`` (README, "Object storage").

``FsspecStore`` wraps a filesystem the caller configured (``s3fs``, ``gcsfs``, ``adlfs``, a
local or memory filesystem): ZeroBatch takes it as it is, credentials and all. Its
conditional create is ``pipe_file(mode="create")``, which not every filesystem honours; live
datasets probe for that before they commit (``live.probe_conditional_create``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Sequence
from typing import Any

from ..errors import MissingDependencyError
from ..redaction import redact, scrub
from .store import RetryPolicy, Store, StoreError


def _obstore() -> Any:
    try:
        import obstore
        import obstore.store
    except ImportError:
        raise MissingDependencyError(
            "obstore", "remote", "reading s3://, gs://, az:// and http(s):// URLs"
        ) from None
    return obstore


def _past_invalid(message: str, root: str | None) -> tuple[str, str] | None:
    """The key an ``InvalidPathError`` names (relative to the store's ``root``), and the
    smallest listing offset past every key that shares its first ``.``, ``..`` or empty
    segment; ``None`` if there is none (the segment ends the key, or the message is not
    understood). Keys sort bytewise and ``0`` follows ``/``, so ``a/../x`` gives ``a/..0``."""
    base = re.escape(f"{root.strip('/')}/") if root else ""
    found = re.search(f'Path "{base}(.+?)"(?:: | contained)', message)
    if found is None:
        return None
    key = found.group(1)
    parts = key.split("/")
    for i, part in enumerate(parts[:-1]):
        if part in ("", ".", ".."):
            return key, "/".join([*parts[:i], part + "0"])
    return None


class ObstoreStore(Store):
    """A store at an object-storage URL, through ``obstore`` (see the module docstring).

    ``options`` are ``obstore`` store options (``endpoint``, ``region``, ...), merged over
    what the environment gives; an ``http://`` endpoint (a local S3-compatible server) is
    allowed without TLS.
    """

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy | None = None,
        options: dict[str, str] | None = None,
    ) -> None:
        super().__init__(url, retry)
        self.unlisted: set[str] = set()
        """Keys a listing left out: names the client cannot hold (see ``_list``)."""
        obs = _obstore()
        self._obs = obs
        self._exceptions = __import__("obstore.exceptions", fromlist=["AlreadyExistsError"])
        config = dict(options or {})
        endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL", "")
        client: dict[str, Any] = {"timeout": "120s", "connect_timeout": "10s"}
        if endpoint.startswith("http://") or url.lower().startswith("http://"):
            client["allow_http"] = True
        try:
            self._store = obs.store.from_url(
                url,
                config=config or None,
                client_options=client,
                retry_config={"max_retries": 0},
            )
        except Exception as e:
            # Not chained: the client's error holds the URL as given, user information included.
            first = (scrub(str(e)).strip().splitlines() or [type(e).__name__])[0]
            raise StoreError(errno.EINVAL, f"cannot open the store: {first}", redact(url)) from None

    def _read(self, key: str) -> bytes:
        return bytes(self._obs.get(self._store, key).bytes())

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        (start, end), *more = ranges
        if not more:
            return [bytes(self._obs.get_range(self._store, key, start=start, end=end))]
        parts = self._obs.get_ranges(
            self._store,
            key,
            starts=[r[0] for r in ranges],
            ends=[r[1] for r in ranges],
            coalesce=coalesce,
        )
        return [bytes(p) for p in parts]

    def _size(self, key: str) -> int:
        return int(self._obs.head(self._store, key)["size"])

    def _read_head(self, key: str, length: int) -> tuple[bytes, int]:
        # A ranged GET answers the object's size too (Content-Range): no separate HEAD.
        result = self._obs.get(self._store, key, options={"range": (0, length)})
        return bytes(result.bytes()), int(result.meta["size"])

    def _write(self, key: str, data: bytes) -> None:
        self._obs.put(self._store, key, data)

    def _create(self, key: str, data: bytes) -> bool:
        # S3 answers a taken key with 412, which obstore raises as AlreadyExistsError;
        # PreconditionError is its answer to a failed If-Match, caught in case a store sends it.
        taken = (self._exceptions.AlreadyExistsError, self._exceptions.PreconditionError)
        try:
            self._obs.put(self._store, key, data, mode="create")
        except taken:
            return False
        return True

    def _delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._obs.delete(self._store, key)

    def _list(self, prefix: str) -> list[str]:
        # An object whose name has a ".", ".." or empty segment (no ZeroBatch writer makes
        # one) fails the client's whole listing page: list again from just past every key
        # that shares the bad segment (``_past_invalid``). Those keys are left out, and named
        # in ``unlisted``. One key a chunk, so that every key of the pages before the failing
        # one is kept (a larger chunk would drop the keys it had collected). The good keys of
        # the failing page that sort before the bad one are lost with it, unnamed: the client
        # cannot ask for smaller pages (``chunk_size`` only splits what a page returned).
        keys: list[str] = []
        offset: str | None = None
        while True:
            try:
                for chunk in self._obs.list(
                    self._store, prefix=prefix or None, offset=offset, chunk_size=1
                ):
                    keys.extend(str(meta["path"]) for meta in chunk)
                break
            except self._exceptions.InvalidPathError as e:
                past = _past_invalid(str(e), self._store.prefix)
                if past is None:
                    raise
                bad, skip = past
                if offset is not None and skip <= offset:
                    raise  # listed again from before the same key: it would never end
                self.unlisted.add(bad)
                offset = skip
        return [k for k in keys if k.startswith(prefix)]


class FsspecStore(Store):
    """A store below ``root`` on a configured ``fsspec`` filesystem ``fs``."""

    def __init__(self, fs: Any, root: str, *, retry: RetryPolicy | None = None) -> None:
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        super().__init__(f"{protocol}://{root.strip('/')}", retry)
        self.fs = fs
        self.root = root.rstrip("/")

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _read(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(self._path(key)))

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        path = self._path(key)
        parts = self.fs.cat_ranges(
            [path] * len(ranges), [r[0] for r in ranges], [r[1] for r in ranges]
        )
        for part in parts:
            if isinstance(part, BaseException):
                raise part
        return [bytes(p) for p in parts]

    def _size(self, key: str) -> int:
        return int(self.fs.size(self._path(key)))

    def _parent_made(self, key: str) -> str:
        """The path of ``key``, its parent directory made (a local filesystem needs it)."""
        path = self._path(key)
        parent, _, _ = path.rpartition("/")
        if parent:
            self.fs.makedirs(parent, exist_ok=True)
        return path

    def _write(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._parent_made(key), data)

    def _create(self, key: str, data: bytes) -> bool:
        path = self._parent_made(key)
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except Exception as e:
            text = str(e)
            if "PreconditionFailed" in text or "412" in text or "exists" in text.lower():
                return False
            raise
        return True

    def _delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))

    def _list(self, prefix: str) -> list[str]:
        try:
            found = self.fs.find(self.root)
        except FileNotFoundError:
            return []
        base = self.root.lstrip("/")
        keys = []
        for name in found:
            rel = str(name).lstrip("/")[len(base) :].lstrip("/")
            if rel.startswith(prefix):
                keys.append(rel)
        return keys
