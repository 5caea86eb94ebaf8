"""Tokenizers for ingestion, named by a spec string, and deterministic parallel tokenization.

A :class:`Tokenizer` encodes a batch of documents into ``uint32`` id arrays and says which id
starts a document (``bos_id``). Three implementations, each created from a spec string by
:func:`load_tokenizer` so that worker processes can re-create it:

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

:func:`tokenize_documents` tokenizes a document stream in batches across worker processes and
yields the id arrays in document order, so its output does not depend on the worker count.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import multiprocessing
import os
import pickle
import tempfile
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote, unquote

import numpy as np
import numpy.typing as npt

from ..arguments import int_arg
from ..errors import IngestError
from ..tokenizer import ByteTokenizer

U32Array = npt.NDArray[np.uint32]

DEFAULT_BATCH_DOCS = 256
"""Documents per tokenization task: enough to amortise inter-process transfer."""

ENDOFTEXT = "<|endoftext|>"


def import_optional(module: str, what: str) -> Any:
    """Import an optional dependency, or fail with the install command that provides it.

    The module is returned as ``Any``: the optional libraries stay untyped at this boundary,
    whether or not they ship stubs, and are never imported before they are needed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{what} needs the optional dependency {module.split('.')[0]!r}: "
            f"pip install 'zerobatch[text]'"
        ) from e


@runtime_checkable
class Tokenizer(Protocol):
    """What ingestion needs from a tokenizer. Implementations must be picklable."""

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


# --- byte-level -------------------------------------------------------------------------------


class ByteLevelTokenizer:
    """The built-in :class:`~zerobatch_core.tokenizer.ByteTokenizer` as a :class:`Tokenizer`."""

    name = "byte"
    eos_id: int | None = None

    def __init__(self) -> None:
        self._tok = ByteTokenizer()
        self.bos_id: int = self._tok.bos_id
        self.vocab_size: int = self._tok.vocab_size

    def encode_batch(self, texts: list[str]) -> list[U32Array]:
        """UTF-8 bytes of each text; a lone surrogate (not encodable) raises ``IngestError``."""
        out: list[U32Array] = []
        for i, text in enumerate(texts):
            try:
                out.append(self._tok.encode(text))
            except UnicodeEncodeError as e:
                raise IngestError(f"document {i} of the batch: not encodable as UTF-8: {e}") from e
        return out

    def decode(self, ids: npt.ArrayLike) -> str:
        """The text of ``ids``, BOS skipped, invalid UTF-8 replaced (a cut character, say)."""
        return self._tok.decode(ids)

    def __repr__(self) -> str:
        return "ByteLevelTokenizer()"


# --- Hugging Face tokenizers ------------------------------------------------------------------


def _special_id(lookup: Any, token: str, role: str, where: str) -> int:
    tid = lookup(token)
    if tid is None:
        raise IngestError(f"{where}: {role} token {token!r} is not in the vocabulary")
    return int(tid)


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` with BOS/EOS given as special-token strings.

    Encoding adds no special tokens (the packer adds BOS) and treats special-token strings in
    the text as ordinary text (``encode_special_tokens``). Pickling carries the model's JSON,
    so a worker re-creates the same tokenizer without reading the file again.
    """

    def __init__(
        self, tokenizer: Any, *, bos: str, eos: str | None = None, name: str = "hf"
    ) -> None:
        """Wrap a ``tokenizers.Tokenizer`` (copied: the caller's object is not modified)."""
        tk = import_optional("tokenizers", "a Hugging Face tokenizer")
        self._json: str = tokenizer.to_str()
        self._tok: Any = tk.Tokenizer.from_str(self._json)
        self._tok.encode_special_tokens = True
        self._bos, self._eos = bos, eos
        self.name = name
        lookup = self._tok.token_to_id
        self.bos_id: int = _special_id(lookup, bos, "BOS", name)
        self.eos_id: int | None = None if eos is None else _special_id(lookup, eos, "EOS", name)
        self.vocab_size: int = int(self._tok.get_vocab_size(with_added_tokens=True))
        self._encode: Any = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, bos: str, eos: str | None = None, name: str = ""
    ) -> HFTokenizer:
        """Load ``tokenizer.json``; a missing or unreadable file raises ``IngestError``."""
        tk = import_optional("tokenizers", "a Hugging Face tokenizer")
        p = os.fspath(path)
        if not os.path.isfile(p):
            raise IngestError(f"{p}: tokenizer file does not exist")
        try:
            tok = tk.Tokenizer.from_file(p)
        except Exception as e:  # the Rust library raises a bare Exception
            raise IngestError(f"{p}: not a readable tokenizers model: {e}") from e
        return cls(tok, bos=bos, eos=eos, name=name or make_spec("hf", p, bos=bos, eos=eos))

    def encode_batch(self, texts: list[str]) -> list[U32Array]:
        """Ids of each text, no special tokens added."""
        encodings = self._encode(texts, add_special_tokens=False)
        return [np.array(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: npt.ArrayLike) -> str:
        """Text of ``ids`` with special tokens skipped."""
        return str(self._tok.decode(np.asarray(ids).tolist(), skip_special_tokens=True))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_hf_from_json, (self._json, self._bos, self._eos, self.name))

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, bos={self._bos!r}, eos={self._eos!r})"


def _hf_from_json(json_str: str, bos: str, eos: str | None, name: str) -> HFTokenizer:
    tk = import_optional("tokenizers", "a Hugging Face tokenizer")
    return HFTokenizer(tk.Tokenizer.from_str(json_str), bos=bos, eos=eos, name=name)


# --- tiktoken ---------------------------------------------------------------------------------

_R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_BLOB = "https://openaipublic.blob.core.windows.net/encodings"


@dataclass(frozen=True)
class TiktokenStandard:
    """A standard tiktoken encoding: where tiktoken fetches its ranks, and its fixed parts.

    Copied from ``tiktoken_ext/openai_public.py``; these values never change for an existing
    encoding, and knowing them lets ZeroBatch build the encoding without calling tiktoken's
    constructors, which download.
    """

    url: str
    sha256: str
    pat_str: str
    special_tokens: Mapping[str, int]


TIKTOKEN_STANDARD: Mapping[str, TiktokenStandard] = {
    "r50k_base": TiktokenStandard(
        f"{_BLOB}/r50k_base.tiktoken",
        "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        _R50K_PAT,
        {ENDOFTEXT: 50256},
    ),
    "p50k_base": TiktokenStandard(
        f"{_BLOB}/p50k_base.tiktoken",
        "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
        _R50K_PAT,
        {ENDOFTEXT: 50256},
    ),
    "cl100k_base": TiktokenStandard(
        f"{_BLOB}/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PAT,
        {
            ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": TiktokenStandard(
        f"{_BLOB}/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PAT,
        {ENDOFTEXT: 199999, "<|endofprompt|>": 200018},
    ),
}


def read_tiktoken_ranks(path: str | os.PathLike[str]) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file (``base64(token) rank`` per line) without tiktoken's loader.

    ``tiktoken.load.load_tiktoken_bpe`` would also accept a local path, but it goes through
    tiktoken's download cache, keyed by the path string: a stale cached copy would be returned
    instead of the file, and the file is copied into the cache. Reading it here avoids both and
    reports a malformed line by number.
    """
    p = os.fspath(path)
    ranks: dict[bytes, int] = {}
    with open(p, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            try:
                if len(parts) != 2:
                    raise ValueError(f"expected 2 fields, got {len(parts)}")
                ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
            except (ValueError, binascii.Error) as e:
                raise IngestError(f"{p}: line {lineno}: not a tiktoken rank line: {e}") from e
    if not ranks:
        raise IngestError(f"{p}: no tiktoken ranks in the file")
    return ranks


def tiktoken_cache_path(name: str) -> str:
    """Where tiktoken caches the standard encoding ``name`` (it may not be there).

    The same rule as ``tiktoken.load.read_file_cached``: ``$TIKTOKEN_CACHE_DIR``, else
    ``$DATA_GYM_CACHE_DIR``, else ``<tmp>/data-gym-cache``; the file is the SHA-1 of its URL.
    """
    std = TIKTOKEN_STANDARD[name]
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if not cache_dir:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.path.join(cache_dir, hashlib.sha1(std.url.encode()).hexdigest())


class TiktokenTokenizer:
    """A ``tiktoken.Encoding`` built from local ranks: nothing is ever downloaded.

    ``encode_batch`` uses ``encode_ordinary_batch``: special-token strings in the text are
    plain text. Pickling carries the ranks, so a worker rebuilds the same encoding offline
    (pickling a ``tiktoken.Encoding`` itself would make the worker look it up by name, which
    downloads).
    """

    def __init__(
        self,
        mergeable_ranks: dict[bytes, int],
        *,
        pat_str: str,
        special_tokens: Mapping[str, int],
        bos: str = ENDOFTEXT,
        eos: str | None = None,
        name: str = "tiktoken",
        num_threads: int = 8,
    ) -> None:
        """Build the encoding; ``bos``/``eos`` must be keys of ``special_tokens``."""
        tt = import_optional("tiktoken", "a tiktoken encoding")
        self._args = (mergeable_ranks, pat_str, dict(special_tokens), bos, eos, name)
        self.name = name
        self.num_threads = num_threads
        try:
            self._enc: Any = tt.Encoding(
                name,
                pat_str=pat_str,
                mergeable_ranks=mergeable_ranks,
                special_tokens=dict(special_tokens),
            )
        except Exception as e:  # the Rust core raises ValueError or a bare Exception
            raise IngestError(f"{name}: cannot build the tiktoken encoding: {e}") from e
        known = ", ".join(sorted(special_tokens)) or "none"
        for role, token in (("BOS", bos), ("EOS", eos)):
            if token is not None and token not in special_tokens:
                raise IngestError(
                    f"{name}: {role} token {token!r} is not a special token of this encoding "
                    f"(special tokens: {known})"
                )
        self.bos_id: int = int(special_tokens[bos])
        self.eos_id: int | None = None if eos is None else int(special_tokens[eos])
        self.vocab_size: int = int(self._enc.n_vocab)
        self._special_ids = np.array(sorted(set(special_tokens.values())), dtype=np.int64)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        pattern: str | None = None,
        bos: str = ENDOFTEXT,
        eos: str | None = None,
        name: str = "",
    ) -> TiktokenTokenizer:
        """A local ``.tiktoken`` file with the split pattern and special tokens of ``pattern``.

        ``pattern`` names a standard encoding (``TIKTOKEN_STANDARD``); by default the file's
        stem, so ``cl100k_base.tiktoken`` needs no option.
        """
        p = os.fspath(path)
        if not os.path.isfile(p):
            raise IngestError(f"{p}: tiktoken file does not exist")
        std_name = pattern or os.path.splitext(os.path.basename(p))[0]
        if std_name not in TIKTOKEN_STANDARD:
            raise IngestError(
                f"{p}: cannot tell which split pattern and special tokens go with this file; "
                f"add ?pattern=NAME to the spec, NAME one of {', '.join(TIKTOKEN_STANDARD)}"
            )
        std = TIKTOKEN_STANDARD[std_name]
        return cls(
            read_tiktoken_ranks(p),
            pat_str=std.pat_str,
            special_tokens=std.special_tokens,
            bos=bos,
            eos=eos,
            name=name or make_spec("tiktoken", p, pattern=std_name, bos=bos, eos=eos),
        )

    @classmethod
    def from_cache(
        cls, encoding: str, *, bos: str = ENDOFTEXT, eos: str | None = None, name: str = ""
    ) -> TiktokenTokenizer:
        """The standard encoding ``encoding`` from tiktoken's local cache, never the network.

        The cached file must exist and match the encoding's published SHA-256.
        """
        if encoding not in TIKTOKEN_STANDARD:
            raise IngestError(
                f"unknown tiktoken encoding {encoding!r}: known ones are "
                f"{', '.join(TIKTOKEN_STANDARD)}, or give a local .tiktoken file"
            )
        std = TIKTOKEN_STANDARD[encoding]
        path = tiktoken_cache_path(encoding)
        if not os.path.isfile(path):
            raise IngestError(
                f"tiktoken encoding {encoding!r} is not in the local cache ({path}) and ZeroBatch "
                f"never downloads: fetch {std.url} yourself and use "
                f"'tiktoken:/path/to/{encoding}.tiktoken', or fill the cache with "
                f"tiktoken.get_encoding({encoding!r}) on a machine with network access"
            )
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != std.sha256:
            raise IngestError(
                f"{path}: cached tiktoken file for {encoding!r} has SHA-256 {digest}, expected "
                f"{std.sha256}: the cache is corrupt; delete the file"
            )
        spec = make_spec("tiktoken", encoding, bos=bos, eos=eos)
        return cls.from_file(path, pattern=encoding, bos=bos, eos=eos, name=name or spec)

    def encode_batch(self, texts: list[str]) -> list[U32Array]:
        """Ids of each text (``encode_ordinary_batch``: special-token strings are plain text)."""
        ids = self._enc.encode_ordinary_batch(texts, num_threads=self.num_threads)
        return [np.array(x, dtype=np.uint32) for x in ids]

    def decode(self, ids: npt.ArrayLike) -> str:
        """Text of ``ids``, special tokens skipped, invalid UTF-8 replaced."""
        arr = np.asarray(ids, dtype=np.int64)
        kept = arr[~np.isin(arr, self._special_ids)]
        return str(self._enc.decode(kept.tolist(), errors="replace"))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_tiktoken_from_args, (*self._args, self.num_threads))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r}, bos_id={self.bos_id}, eos_id={self.eos_id})"


def _tiktoken_from_args(
    ranks: dict[bytes, int],
    pat_str: str,
    special_tokens: dict[str, int],
    bos: str,
    eos: str | None,
    name: str,
    num_threads: int,
) -> TiktokenTokenizer:
    return TiktokenTokenizer(
        ranks,
        pat_str=pat_str,
        special_tokens=special_tokens,
        bos=bos,
        eos=eos,
        name=name,
        num_threads=num_threads,
    )


# --- specs ------------------------------------------------------------------------------------

_OPTIONS = {"byte": frozenset(), "hf": {"bos", "eos"}, "tiktoken": {"bos", "eos", "pattern"}}


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


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer a spec names: ``byte``, ``hf:...`` or ``tiktoken:...`` (module docstring).

    Raises ``IngestError`` for a malformed spec, a missing file, or a BOS/EOS token the model
    lacks, and ``ImportError`` (with the install command) if the library is not installed.
    """
    kind, target, options = parse_spec(spec)
    if kind == "byte":
        return ByteLevelTokenizer()
    if kind == "hf":
        if "bos" not in options:
            raise IngestError(
                f"tokenizer spec {spec!r}: a Hugging Face tokenizer needs its BOS token, "
                f"e.g. 'hf:{target}?bos=<|endoftext|>'"
            )
        return HFTokenizer.from_file(target, bos=options["bos"], eos=options.get("eos"), name=spec)
    bos, eos = options.get("bos", ENDOFTEXT), options.get("eos")
    if target in TIKTOKEN_STANDARD and not os.path.isfile(target):
        if "pattern" in options:
            raise IngestError(f"tokenizer spec {spec!r}: pattern applies only to a local file")
        return TiktokenTokenizer.from_cache(target, bos=bos, eos=eos, name=spec)
    return TiktokenTokenizer.from_file(
        target, pattern=options.get("pattern"), bos=bos, eos=eos, name=spec
    )


# --- parallel tokenization --------------------------------------------------------------------

_worker: dict[str, Any] = {}
"""Per worker process: the pickled tokenizer, and the tokenizer once created."""


def _worker_init(payload: bytes) -> None:
    """Store the tokenizer; it is created by the first task so that a failure reaches the
    parent as that task's exception (a failing Pool initializer respawns workers forever)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: workers scale
    _worker.clear()
    _worker["payload"] = payload


def _worker_encode(texts: list[str]) -> tuple[U32Array, npt.NDArray[np.int64]]:
    """Tokenize one batch in a worker: all ids in one array plus per-document lengths."""
    tok = _worker.get("tokenizer")
    if tok is None:
        tok = pickle.loads(_worker["payload"])
        if isinstance(tok, TiktokenTokenizer):
            tok.num_threads = 1
        _worker["tokenizer"] = tok
    arrays = tok.encode_batch(texts)
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.uint32)
    return flat.astype(np.uint32, copy=False), lengths


def _split(result: tuple[U32Array, npt.NDArray[np.int64]]) -> list[U32Array]:
    flat, lengths = result
    return np.split(flat, np.cumsum(lengths)[:-1])


def _batches(docs: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for index, doc in enumerate(docs):
        if not isinstance(doc, str):
            raise IngestError(f"document {index}: expected a str, got {type(doc).__name__}")
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenize_documents(
    docs: Iterable[str],
    tokenizer_spec: str | Tokenizer,
    workers: int = 1,
    batch_docs: int = DEFAULT_BATCH_DOCS,
) -> Generator[U32Array, None, None]:
    """Token ids of each document (a 1-D ``uint32`` array each), in document order.

    Documents are tokenized ``batch_docs`` at a time; with ``workers > 1`` the batches go to
    that many ``spawn``-ed processes, each creating the tokenizer once (from the tokenizer
    pickled by the parent: a spec string is resolved here first, so a bad spec fails at once).
    Results come back in submission order, so the output is identical whatever ``workers``.
    At most ``2 * workers`` batches are in flight: memory is bounded by about that many
    batches, whatever the corpus size (``Pool.imap`` is not used because its feeder thread
    drains the whole input as fast as it can). With ``workers == 1`` everything runs in this
    process. ``close()`` the generator to stop the workers before the end (they also stop when
    it is garbage-collected). Scripts using ``workers > 1`` need the usual
    ``if __name__ == "__main__":`` guard, as with any ``spawn`` pool.
    """
    w = int_arg("workers", workers, 1, None, IngestError)
    size = int_arg("batch_docs", batch_docs, 1, None, IngestError)
    if isinstance(tokenizer_spec, str):
        tok = load_tokenizer(tokenizer_spec)
    elif isinstance(tokenizer_spec, Tokenizer):
        tok = tokenizer_spec
    else:
        raise IngestError(
            f"tokenizer_spec must be a spec string or a Tokenizer, got "
            f"{type(tokenizer_spec).__name__}"
        )
    if w == 1:
        return _tokenize_here(docs, tok, size)
    try:
        payload = pickle.dumps(tok)
    except Exception as e:  # pickling can fail with almost anything
        raise IngestError(
            f"tokenizer {tok.name!r} cannot be pickled for worker processes ({e}); pass a spec "
            f"string or use workers=1"
        ) from e
    return _tokenize_pool(docs, payload, w, size)


def _tokenize_here(
    docs: Iterable[str], tok: Tokenizer, size: int
) -> Generator[U32Array, None, None]:
    for batch in _batches(docs, size):
        yield from tok.encode_batch(batch)


def _tokenize_pool(
    docs: Iterable[str], payload: bytes, workers: int, size: int
) -> Generator[U32Array, None, None]:
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(workers, initializer=_worker_init, initargs=(payload,))
    try:
        pending: deque[AsyncResult[tuple[U32Array, npt.NDArray[np.int64]]]] = deque()
        for batch in _batches(docs, size):
            pending.append(pool.apply_async(_worker_encode, (batch,)))
            if len(pending) >= 2 * workers:
                yield from _split(pending.popleft().get())
        while pending:
            yield from _split(pending.popleft().get())
    finally:
        pool.terminate()
        pool.join()
