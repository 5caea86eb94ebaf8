"""``BatchSource``, what a loader serves from, and ``open_reader``: the reader for any source.

``BatchSource`` is the small protocol the loader, the stream and the adapters depend on instead
of on each reader class: the shape (``batch_size``, ``seq_len``, ``num_batches``), the serving
``order``, an ``identity`` for loader states, slot reads (whole or a region), read-ahead and
its checks, and two capabilities: ``fetches`` (reads are network fetches, announced ahead
with ``ahead``; else views of local mappings) and ``view_batches`` (a run of slots as one
view, where one mapping holds them). ``BatchFileReader``, ``DatasetReader`` and
``RemoteSource`` (with ``LiveSource``) implement it; so does any object with these members,
which the loader then serves like the others.

Slots hold the stored tokens as they are: uint32, or uint16 for a dtype 1 file or dataset.
Every ZeroBatch source says which with ``token_dtype`` (a NumPy dtype); a source without that
member, such as one written before uint16 files existed, holds uint32 tokens
(``source_token_dtype`` reads it either way, so the protocol does not require it).

A path opens as before (``dataset.open_source``: a dataset directory or a file). A URL
(``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``) opens a ``RemoteSource``
(``remote.py``), and a live dataset, at a URL or a path, a ``LiveSource``
(``live/source.py``). Readers already open are returned as they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
from zerobatch_spec import TOKEN_DTYPE, TOKEN_DTYPES
from zerobatch_spec.live import DESCRIPTOR_NAME

from ..datasets.dataset import DatasetReader, Verify, open_source
from ..datasets.remote import RemoteSource, RemoteVerify
from ..files.reader import BatchFileReader
from ..order import Order
from ..stores.resolve import open_store
from ..stores.store import Store, is_url

S = TypeVar("S")
Region = tuple[int, int, int, int, int]
"""``(slot, first row, end row, first column, end column)`` of a read."""


@runtime_checkable
class BatchSource(Protocol):
    """What a loader serves from: a sequence of ``num_batches`` ``[batch_size, seq_len]`` slots
    of stored tokens with a seeded serving order (see the module docstring).

    Optionally also ``token_dtype``, the NumPy dtype of the stored tokens (uint32 when absent:
    ``source_token_dtype``); it is not a member here so that sources without it still match.
    """

    path: str
    fetches: bool
    """Whether reads are fetches (remote): converted on the caller's thread, and announced
    ahead with ``ahead``. Otherwise reads are views of local mappings."""

    @property
    def batch_size(self) -> int: ...

    @property
    def seq_len(self) -> int: ...

    @property
    def num_batches(self) -> int: ...

    @property
    def seed(self) -> int:
        """The seed the serving order defaults to."""
        ...

    @property
    def closed(self) -> bool: ...

    def order(self, block_size: int, seed: int, shuffle: bool) -> Order:
        """The serving order with these parameters."""
        ...

    def identity(self) -> dict[str, Any]:
        """What a loader state records so that it loads into this source only (JSON-able)."""
        ...

    def read_batch(self, index: int) -> npt.NDArray[np.uint32]:
        """Slot ``index``, ``[batch_size, seq_len]`` of stored tokens (read-only)."""
        ...

    def read_region(self, index: int, r0: int, r1: int, lo: int, hi: int) -> npt.NDArray[np.uint32]:
        """Rows ``r0..r1``, columns ``lo..hi`` of slot ``index`` (read-only)."""
        ...

    def view_batches(self, start: int, stop: int) -> npt.NDArray[np.uint32] | None:
        """Slots ``start..stop`` as one ``[n, batch_size, seq_len]`` view, or ``None`` where
        no single mapping holds them (the caller then reads slot by slot)."""
        ...

    def slot_file(self, index: int) -> tuple[BatchFileReader, int] | None:
        """The local file holding slot ``index`` and its slot in it, or ``None`` (fetched)."""
        ...

    def read_ahead(self, start: int, stop: int) -> None:
        """Have slots ``start..stop`` read in the background (a hint; may do nothing)."""
        ...

    def check_size(self, index: int = 0) -> None:
        """Raise if the file holding slot ``index`` changed size since it was opened."""
        ...

    def ahead(
        self, steps: Iterator[S], regions: Callable[[S], Sequence[Region]], *, whole_rows: bool
    ) -> Iterator[S]:
        """``steps`` as they come, each step's ``regions`` announced (fetched) ahead first."""
        ...

    def close(self) -> None: ...


def source_token_dtype(source: object) -> np.dtype[np.unsignedinteger]:
    """The NumPy dtype of ``source``'s stored tokens: its ``token_dtype``, or uint32 for a
    source that does not say. ``ValueError`` for a dtype that no token dtype code has."""
    found = np.dtype(getattr(source, "token_dtype", TOKEN_DTYPE))
    for known in TOKEN_DTYPES.values():
        if found == known:
            return known
    names = ", ".join(str(d) for d in TOKEN_DTYPES.values())
    raise ValueError(
        f"{getattr(source, 'path', source)!r:.200}: token_dtype {found} is not a token dtype "
        f"(one of {names})"
    )


def is_live(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a local live dataset directory (it holds a live descriptor)."""
    return os.path.isfile(os.path.join(os.fspath(path), DESCRIPTOR_NAME))


def open_reader(
    source: str | os.PathLike[str] | Store | BatchSource | tuple[Any, str],
    *,
    verify: Verify | RemoteVerify | None = None,
    **remote: Any,
) -> BatchSource:
    """The reader for ``source`` (see the module docstring); ``(fs, root)`` is a dataset or
    a live dataset at ``root`` on a configured fsspec filesystem ``fs``.

    ``verify`` is the checksum mode: ``"off"``, ``"first"`` or ``"always"`` for local datasets
    (default ``"first"``); remote sources also take ``"whole"``, their default (what each mode
    means for a rank that reads part of a slot: ``remote.py``). ``remote`` options
    (``prefetch_bytes``, ``cache_dir``, ``cache_bytes``, ...) go to ``RemoteSource``. An open
    ``BatchSource`` is returned as it is.
    """
    if isinstance(source, BatchSource):
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


def _readers_are_sources(
    file: BatchFileReader, dataset: DatasetReader, remote: RemoteSource
) -> tuple[BatchSource, ...]:
    """Never called: makes the type checker prove that every reader is a ``BatchSource``."""
    return file, dataset, remote
