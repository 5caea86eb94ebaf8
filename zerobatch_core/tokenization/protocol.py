"""What a tokenizer is to ZeroBatch, how a spec string names one, and how one is described.

A :class:`Tokenizer` encodes a batch of documents into ``uint32`` id arrays and says which id
starts a document (``bos_id``). There are three kinds, each with a spec string that re-creates
it from files (:func:`~zerobatch_core.tokenization.load_tokenizer`):

``byte``
    The built-in byte-level tokenizer (UTF-8 bytes, BOS 256, vocabulary 257): no files.
``hf:PATH?bos=TOKEN[&eos=TOKEN]``
    A Hugging Face ``tokenizers`` model saved as ``tokenizer.json``. BOS (required) and EOS are
    special-token strings of the model, e.g. ``<|endoftext|>`` or ``<s>``.
``tiktoken:FILE.tiktoken[?pattern=NAME][&bos=TOKEN][&eos=TOKEN]`` or ``tiktoken:NAME``
    A ``tiktoken`` encoding, never downloaded: either a local ``.tiktoken`` rank file with the
    split pattern and special tokens of the standard encoding ``NAME`` (by default the file's
    stem, e.g. ``cl100k_base.tiktoken``), or the standard encoding ``NAME`` if its file is in
    tiktoken's local cache. BOS defaults to ``<|endoftext|>``.

Option values are percent-decoded (``urllib.parse.unquote``), so any token can be written; the
path itself may not contain ``?``. Special-token strings inside documents are always encoded as
ordinary text, never as the special id: a document that happens to contain ``<|endoftext|>``
must not forge a document boundary.

Every tokenizer, including one built in memory that no spec names, also describes itself as
plain JSON data (:meth:`Tokenizer.to_json`, see :mod:`.descriptions`): that is how a tokenizer
reaches a worker process (:mod:`.parallel`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote, unquote

import numpy as np
import numpy.typing as npt

from ..errors import IngestError, MissingDependencyError

U32Array = npt.NDArray[np.uint32]

_OPTIONS: Mapping[str, frozenset[str]] = {
    "byte": frozenset(),
    "hf": frozenset({"bos", "eos"}),
    "tiktoken": frozenset({"bos", "eos", "pattern"}),
}

KINDS = tuple(_OPTIONS)
"""The tokenizer kinds: the first part of a spec string and the ``"kind"`` of a description."""


@runtime_checkable
class Tokenizer(Protocol):
    """What ingestion needs from a tokenizer."""

    @property
    def name(self) -> str:
        """The spec that re-creates this tokenizer (or a description for in-memory ones)."""
        ...

    @property
    def vocab_size(self) -> int:
        """One more than the largest id the tokenizer can produce."""
        ...

    @property
    def bos_id(self) -> int:
        """The id that starts every document in packed records."""
        ...

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or ``None`` if the tokenizer has none configured."""
        ...

    def encode_batch(self, texts: list[str]) -> list[U32Array]:
        """One 1-D ``uint32`` array per text, without BOS/EOS; special tokens are not parsed."""
        ...

    def decode(self, ids: npt.ArrayLike) -> str:
        """Text for a 1-D id sequence, special tokens (BOS, EOS) skipped."""
        ...

    def to_json(self) -> str:
        """This tokenizer as a JSON object of plain data, ``"kind"`` first (:mod:`.descriptions`).

        ``tokenizer_from_json(tok.to_json())`` builds a tokenizer that gives the same ids.
        """
        ...


def import_optional(module: str, what: str) -> Any:
    """Import a library of the ``text`` extra, or fail with the command that installs it.

    A failed import raises ``MissingDependencyError`` (still an ``ImportError``) naming the
    top-level package, ``what`` needed it and the extra, so that the command line can print one
    line and exit with its own status; the original ``ImportError`` is its ``__cause__``.
    The module is returned as ``Any``: the optional libraries stay untyped at this boundary,
    whether or not they ship stubs, and are never imported before they are needed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(module.split(".")[0], "text", what) from e


# --- spec strings -----------------------------------------------------------------------------


def make_spec(kind: str, target: str, **options: str | None) -> str:
    """The spec string for ``kind``, ``target`` and the options that are not ``None``.

    The inverse of :func:`parse_spec`: values are percent-encoded where needed (``&``, ``=``,
    ``%``, ``?``, whitespace), keeping the usual ``<|...|>`` token names readable.
    """
    query = "&".join(f"{k}={quote(v, safe='<>|/')}" for k, v in options.items() if v is not None)
    return f"{kind}:{target}" + (f"?{query}" if query else "")


def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """Split a tokenizer spec into ``(kind, target, options)``; see the module docstring."""
    if not isinstance(spec, str):
        raise IngestError(f"a tokenizer spec must be a string, got {type(spec).__name__}")
    kind, colon, rest = spec.partition(":")
    if kind not in _OPTIONS:
        raise IngestError(
            f"tokenizer spec {spec!r}: unknown kind {kind!r}; expected 'byte', "
            f"'hf:/path/tokenizer.json?bos=TOKEN' or 'tiktoken:/path/file.tiktoken'"
        )
    if kind == "byte":
        if colon:
            raise IngestError(f"tokenizer spec {spec!r}: 'byte' takes no argument")
        return kind, "", {}
    target, _, query = rest.partition("?")
    if not target:
        raise IngestError(f"tokenizer spec {spec!r}: {kind}: needs a path or name")
    options: dict[str, str] = {}
    for item in query.split("&") if query else []:
        key, eq, value = item.partition("=")
        if not eq or key not in _OPTIONS[kind] or key in options:
            problem = "repeated" if key in options else "unknown or malformed"
            raise IngestError(
                f"tokenizer spec {spec!r}: {problem} option {item!r} (options for {kind}: "
                f"{', '.join(sorted(_OPTIONS[kind]))}, as key=value joined by '&')"
            )
        options[key] = unquote(value)
    return kind, target, options
