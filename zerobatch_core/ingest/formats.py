"""Other systems' token formats as ``convert`` inputs: which format a path is, and its files.

Four formats hold tokens already, as documents, in files of their own layout; each module
opens them as ``TokenFile`` (``token_files.py``), and ``convert`` cuts records from them with
``TokenFileSource``:

========== ======================================================= =========================
kind       input                                                   one ``TokenFile`` per
========== ======================================================= =========================
megatron   Megatron-LM indexed datasets: ``PREFIX`` (``PREFIX.bin`` ``.bin``/``.idx`` pair
           + ``PREFIX.idx``), ``PREFIX.idx`` or ``PREFIX.bin``
hf         a Hugging Face ``save_to_disk`` directory, ``.arrow``   Arrow or parquet file
           files, or parquet files with a token column
mds        a MosaicML Streaming directory (``index.json``)         MDS shard
atlas      an Atlas dataset directory (``meta.json``)              shard folder
========== ======================================================= =========================

Detection (``detect_format``) looks at the path, never at more than a file's first bytes, a
directory's marker files or a parquet file's schema: a ``.bin`` is Megatron's only when an
``.idx`` beside it starts with Megatron's magic (else it is a nanoGPT shard), and a parquet
file is a token source only when it has the token column as a list of integers and no text
column of that name.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import IngestError
from ..tokenization.protocol import import_optional
from .token_files import DEFAULT_COLUMN, TokenFile

TokenKind = Literal["megatron", "hf", "mds", "atlas"]
TOKEN_FORMATS: tuple[TokenKind, ...] = ("megatron", "hf", "mds", "atlas")


@dataclass(frozen=True)
class FormatOptions:
    """What a format's files need beyond their paths: the token ``column`` (Hugging Face,
    MDS, Atlas examples that are dicts) and, for MDS ``bytes`` columns, the tokens' dtype."""

    column: str = DEFAULT_COLUMN
    column_dtype: str | None = None


def _open_megatron(patterns: Sequence[str], options: FormatOptions) -> list[TokenFile]:
    from .megatron import MegatronFile, expand_megatron

    return [MegatronFile(p) for p in expand_megatron(patterns)]


def _open_hf(patterns: Sequence[str], options: FormatOptions) -> list[TokenFile]:
    from .hf_datasets import expand_hf

    return list(expand_hf(patterns, column=options.column))


def _open_mds(patterns: Sequence[str], options: FormatOptions) -> list[TokenFile]:
    from .mds import expand_mds

    return list(expand_mds(patterns, column=options.column, dtype=options.column_dtype))


def _open_atlas(patterns: Sequence[str], options: FormatOptions) -> list[TokenFile]:
    from .atlas import expand_atlas

    return list(expand_atlas(patterns, field=options.column))


OPENERS: dict[TokenKind, Callable[[Sequence[str], FormatOptions], list[TokenFile]]] = {
    "megatron": _open_megatron,
    "hf": _open_hf,
    "mds": _open_mds,
    "atlas": _open_atlas,
}


def open_token_files(
    kind: TokenKind, patterns: Sequence[str], options: FormatOptions | None = None
) -> list[TokenFile]:
    """The ``TokenFile`` of every input of ``kind`` that ``patterns`` name, in reading order."""
    if kind not in OPENERS:
        raise IngestError(f"unknown token format {kind!r}; expected one of {TOKEN_FORMATS}")
    files = OPENERS[kind](list(patterns), options or FormatOptions())
    if not files:
        raise IngestError(f"{', '.join(patterns)}: no {kind} input found")
    return files


def detect_format(path: str, column: str = DEFAULT_COLUMN) -> TokenKind | None:
    """The token format ``path`` (a file, a directory, a Megatron prefix or a glob pattern's
    first match) is in, or ``None`` if it is none of them."""
    if glob.has_magic(path) and not os.path.exists(path):
        matches = sorted(glob.glob(path))
        if not matches:
            return None
        path = matches[0]
    from .atlas import is_atlas
    from .hf_datasets import is_hf_dataset
    from .mds import is_mds
    from .megatron import is_megatron

    if is_megatron(path):
        return "megatron"
    if os.path.isdir(path):
        for kind, test in (("hf", is_hf_dataset), ("mds", is_mds), ("atlas", is_atlas)):
            if test(path):
                return kind  # type: ignore[return-value]
        return None
    if path.lower().endswith(".arrow") and is_hf_dataset(path):
        return "hf"
    if path.lower().endswith(".parquet") and _token_parquet(path, column):
        return "hf"
    return None


def _token_parquet(path: str, column: str) -> bool:
    """Whether the parquet file at ``path`` has ``column`` as a list of integers."""
    try:
        pa = import_optional("pyarrow", "reading parquet")
        pq = import_optional("pyarrow.parquet", "reading parquet")
    except ImportError:
        return False
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError):
        return False
    index = schema.get_field_index(column)
    if index < 0:
        return False
    t = schema.field(index).type
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    return any(test(t) for test in lists) and pa.types.is_integer(t.value_type)


def side_files(files: Sequence[TokenFile]) -> list[str]:
    """Every file the inputs read (for refusing an output that is one of them)."""
    out: list[str] = []
    for f in files:
        out.append(f.path)
        extra: Any = getattr(f, "side_files", ())
        out.extend(extra() if callable(extra) else extra)
    return out


__all__ = [
    "DEFAULT_COLUMN",
    "TOKEN_FORMATS",
    "FormatOptions",
    "TokenKind",
    "detect_format",
    "open_token_files",
    "side_files",
]
