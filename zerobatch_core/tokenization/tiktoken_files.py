"""tiktoken encodings from local rank files (spec ``tiktoken:FILE`` or ``tiktoken:NAME``).

ZeroBatch never downloads: the ranks come from a local ``.tiktoken`` file (``base64(token)
rank`` per line) or from tiktoken's own local cache, checked against the published SHA-256. The
split pattern and special tokens of the standard encodings are in :data:`TIKTOKEN_STANDARD`,
copied from ``tiktoken_ext/openai_public.py`` (``tests/unit/test_tiktoken_tables.py`` compares
them with tiktoken's own). ``tiktoken`` is imported on first use (``pip install
'zerobatch[text]'``).

The description of a :class:`TiktokenTokenizer` holds its ranks in the ``.tiktoken`` line format
(base64 tokens, decimal ranks), its pattern and its special tokens: plain data from which a
worker process rebuilds the same encoding offline.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import IngestError
from .descriptions import description_field, optional_field, write_description
from .protocol import U32Array, import_optional, make_spec

ENDOFTEXT = "<|endoftext|>"

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


def parse_tiktoken_ranks(data: bytes, where: str) -> dict[bytes, int]:
    """Ranks from ``.tiktoken`` text (``base64(token) rank`` per line; blank lines skipped).

    A malformed line raises ``IngestError`` naming ``where`` and the line number; so does text
    with no ranks at all.
    """
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 2:
                raise ValueError(f"expected 2 fields, got {len(parts)}")
            ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
        except (ValueError, binascii.Error) as e:
            raise IngestError(f"{where}: line {lineno}: not a tiktoken rank line: {e}") from e
    if not ranks:
        raise IngestError(f"{where}: no tiktoken ranks")
    return ranks


def format_tiktoken_ranks(ranks: Mapping[bytes, int]) -> str:
    """``ranks`` as ``.tiktoken`` text in rank order, what :func:`parse_tiktoken_ranks` reads."""
    lines = sorted(ranks.items(), key=lambda item: item[1])
    return "".join(f"{base64.b64encode(t).decode('ascii')} {r}\n" for t, r in lines)


def read_tiktoken_ranks(path: str | os.PathLike[str]) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file without tiktoken's loader.

    ``tiktoken.load.load_tiktoken_bpe`` would also accept a local path, but it goes through
    tiktoken's download cache, keyed by the path string: a stale cached copy would be returned
    instead of the file, and the file is copied into the cache. Reading it here avoids both and
    reports a malformed line by number.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        return parse_tiktoken_ranks(f.read(), p)


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
    plain text. ``num_threads`` is how many threads one ``encode_batch`` call uses (worker
    processes set it to 1).
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
        self._ranks, self._pat_str = mergeable_ranks, pat_str
        self._special, self._bos, self._eos = dict(special_tokens), bos, eos
        self.name = name
        self.num_threads = num_threads
        try:
            self._enc: Any = tt.Encoding(
                name,
                pat_str=pat_str,
                mergeable_ranks=mergeable_ranks,
                special_tokens=self._special,
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
        """Ids of each text, as ``encode_ordinary`` gives them (special-token strings are plain
        text).

        Each text goes through ``encode_to_numpy``, which releases the interpreter lock and
        returns uint32 ids without building a Python list, on a pool of ``num_threads``
        threads made once per tokenizer (``encode_ordinary_batch`` starts a new pool on every
        call and builds a list of ints per text under the lock).
        """
        encode = partial(self._enc.encode_to_numpy, allowed_special=set(), disallowed_special=())
        n = min(self.num_threads, len(texts))
        if n <= 1:
            return [encode(t) for t in texts]
        pool = self._threads()
        step = -(-len(texts) // n)
        parts = pool.map(
            lambda i: [encode(t) for t in texts[i : i + step]], range(0, len(texts), step)
        )
        return [ids for part in parts for ids in part]

    def _threads(self) -> ThreadPoolExecutor:
        """The encoding threads, started on first use (and after a ``num_threads`` change)."""
        found: tuple[ThreadPoolExecutor, int] | None = self.__dict__.get("_pool")
        if found is not None and found[1] == self.num_threads:
            return found[0]
        if found is not None:
            found[0].shutdown(wait=False)
        pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="zb-tiktoken")
        self.__dict__["_pool"] = (pool, self.num_threads)
        return pool

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_pool", None)  # threads do not travel; a copy starts its own
        return state

    def decode(self, ids: npt.ArrayLike) -> str:
        """Text of ``ids``, special tokens skipped, invalid UTF-8 replaced."""
        arr = np.asarray(ids, dtype=np.int64)
        kept = arr[~np.isin(arr, self._special_ids)]
        return str(self._enc.decode(kept.tolist(), errors="replace"))

    def to_json(self) -> str:
        """Name, BOS/EOS, ``pat_str``, ``special_tokens`` and the ranks as ``.tiktoken`` text."""
        return write_description(
            "tiktoken",
            name=self.name,
            bos=self._bos,
            eos=self._eos,
            pat_str=self._pat_str,
            special_tokens=self._special,
            ranks=format_tiktoken_ranks(self._ranks),
        )

    @classmethod
    def from_description(cls, desc: Mapping[str, Any]) -> TiktokenTokenizer:
        """The tokenizer a ``tiktoken`` description (:meth:`to_json`, parsed) stands for."""
        special = description_field(desc, "special_tokens", dict)
        for token, tid in special.items():
            if isinstance(tid, bool) or not isinstance(tid, int):
                raise IngestError(
                    f"tiktoken tokenizer description: field 'special_tokens': {token!r} maps to "
                    f"{type(tid).__name__}, expected int"
                )
        ranks = description_field(desc, "ranks", str).encode()
        return cls(
            parse_tiktoken_ranks(ranks, "tiktoken tokenizer description: field 'ranks'"),
            pat_str=description_field(desc, "pat_str", str),
            special_tokens=special,
            bos=description_field(desc, "bos", str),
            eos=optional_field(desc, "eos", str),
            name=description_field(desc, "name", str),
        )

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r}, bos_id={self.bos_id}, eos_id={self.eos_id})"
