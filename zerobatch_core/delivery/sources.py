"""``open_reader``: the reader for any source a loader accepts, local or remote.

A path opens as before (``dataset.open_source``: a dataset directory or a file). A URL
(``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``) opens a ``RemoteSource``
(``remote.py``), and a live dataset, at a URL or a path, a ``LiveSource``
(``live/source.py``). Readers already open are returned as they are.
"""

from __future__ import annotations

import os
from typing import Any

from zerobatch_spec.live import DESCRIPTOR_NAME

from ..datasets.dataset import DatasetReader, Verify, open_source
from ..datasets.remote import RemoteSource, RemoteVerify
from ..files.reader import BatchFileReader
from ..stores.resolve import open_store
from ..stores.store import Store, is_url

Reader = BatchFileReader | DatasetReader | RemoteSource
"""Every reader a loader serves from."""

READER_TYPES = (BatchFileReader, DatasetReader, RemoteSource)


def is_live(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a local live dataset directory (it holds a live descriptor)."""
    return os.path.isfile(os.path.join(os.fspath(path), DESCRIPTOR_NAME))


def open_reader(
    source: str | os.PathLike[str] | Store | Reader | tuple[Any, str],
    *,
    verify: Verify | RemoteVerify | None = None,
    **remote: Any,
) -> Reader:
    """The reader for ``source`` (see the module docstring); ``(fs, root)`` is a dataset or
    a live dataset at ``root`` on a configured fsspec filesystem ``fs``.

    ``verify`` is the checksum mode: ``"off"``, ``"first"`` or ``"always"`` for local datasets
    (default ``"first"``); remote sources also take ``"whole"``, their default (what each mode
    means for a rank that reads part of a slot: ``remote.py``). ``remote`` options
    (``prefetch_bytes``, ``cache_dir``, ``cache_bytes``, ...) go to ``RemoteSource``.
    """
    if isinstance(source, READER_TYPES):
        return source
    if isinstance(source, tuple):  # (a configured fsspec filesystem, the root on it)
        return open_url(open_store(source), verify=verify, **remote)
    if isinstance(source, Store) or is_url(source) or is_live(source):
        return open_url(source, verify=verify, **remote)
    text = os.fspath(source)
    if "://" in text and not os.path.exists(text):
        open_store(text)  # raises: a URL scheme ZeroBatch does not open, named
    if verify == "whole":
        raise ValueError(
            "verify='whole' is for remote sources; local datasets take 'off', 'first' or 'always'"
        )
    return open_source(source, verify=verify)


def open_url(
    source: str | os.PathLike[str] | Store, *, verify: Any = None, **remote: Any
) -> RemoteSource:
    """The source at a URL, a path or in a ``Store``: a ``LiveSource`` where a live descriptor
    exists, else a ``RemoteSource`` (a dataset if ``manifest.json`` exists, else a file)."""
    store = source if isinstance(source, Store) else open_store(os.fspath(source))
    if store.exists(DESCRIPTOR_NAME):
        from ..live.source import LiveSource

        return LiveSource(store, verify=verify, **remote)
    if isinstance(source, Store):
        return RemoteSource((store, ""), verify=verify, **remote)
    store.close()
    return RemoteSource(os.fspath(source), verify=verify, **remote)
