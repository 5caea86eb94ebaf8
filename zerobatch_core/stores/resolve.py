"""``open_store``: the store at a path, a URL or a configured fsspec filesystem.

The one place that knows every ``Store`` implementation: ``LocalStore`` (``store.py``) for
paths and ``file://`` URLs, ``ObstoreStore`` and ``FsspecStore`` (``object_stores.py``) for
object storage, so the implementations import only the interface and never each other.
"""

from __future__ import annotations

import errno
import os
import urllib.parse
from typing import Any

from ..errors import ZeroBatchIOError
from ..redaction import redact
from .object_stores import FsspecStore, ObstoreStore
from .store import URL_SCHEMES, LocalStore, RetryPolicy, Store, is_url


def open_store(
    url: str | os.PathLike[str] | Any,
    *,
    retry: RetryPolicy | None = None,
    options: dict[str, str] | None = None,
) -> Store:
    """The store rooted at ``url``: a path, a ``file://``, ``s3://``, ``gs://``, ``az://`` or
    ``http(s)://`` URL, an fsspec filesystem paired with a root (``(fs, "bucket/prefix")``), or
    a ``Store`` (returned as it is).

    ``options`` are passed to the object-store client (for S3, e.g. ``{"endpoint":
    "http://127.0.0.1:9000"}``); credentials are best left to the environment.
    """
    if isinstance(url, Store):
        return url
    if isinstance(url, tuple) and len(url) == 2:
        return FsspecStore(url[0], str(url[1]), retry=retry)
    if not isinstance(url, (str, os.PathLike)):
        raise TypeError(f"expected a path, a URL or a Store, got {type(url).__name__}")
    text = os.fspath(url)
    if not is_url(text):
        if "://" in text:
            scheme = text.split("://", 1)[0]
            raise ZeroBatchIOError(
                errno.EINVAL,
                f"unknown URL scheme {scheme!r} (ZeroBatch opens {', '.join(URL_SCHEMES)})",
                redact(text),
            )
        return LocalStore(text, retry)
    scheme = text.split("://", 1)[0].lower()
    if scheme == "file":
        path = urllib.parse.unquote(urllib.parse.urlsplit(text).path)
        return LocalStore(path, retry)
    return ObstoreStore(text, retry=retry, options=options)
