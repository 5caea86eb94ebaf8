"""Byte stores (wing 2): where bytes live, with nothing of LLMBATCH in them.

``store.py`` is the ``Store`` interface (whole and ranged reads, writes, conditional create,
deletes, listings, retries with backoff) and ``LocalStore``; ``object_stores.py`` implements it
over ``obstore`` and ``fsspec``; ``resolve.py``'s ``open_store`` is the one place that picks an
implementation from a URL, so the implementations never import each other. ``range_cache.py``
keeps fetched ranges on local disk and ``regular_files.py`` opens files without blocking on
FIFOs or devices. Datasets, live datasets and remote reads are built on this wing.
"""

from .resolve import open_store
from .store import (
    LOCAL_READ_LIMIT,
    REMOTE_SCHEMES,
    URL_SCHEMES,
    LocalStore,
    ObjectNotFoundError,
    RetriesExhaustedError,
    RetryPolicy,
    Store,
    StoreError,
    StoreStats,
    is_url,
    join_url,
    retry_reason,
    split_url,
)

__all__ = [
    "LOCAL_READ_LIMIT",
    "REMOTE_SCHEMES",
    "URL_SCHEMES",
    "LocalStore",
    "ObjectNotFoundError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "Store",
    "StoreError",
    "StoreStats",
    "is_url",
    "join_url",
    "open_store",
    "retry_reason",
    "split_url",
]
