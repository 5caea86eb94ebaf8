"""``TIKTOKEN_STANDARD`` against tiktoken's own encoding constructors, with nothing downloaded.

ZeroBatch copies the split patterns and special tokens of the standard encodings from
``tiktoken_ext/openai_public.py`` so that it never has to call those constructors (they
download the rank files). Here the constructors are called all the same, with the one function
that would download, ``load_tiktoken_bpe``, pointed at a small local rank table: the
replacement records what the constructor asked for and reads the local file with tiktoken's own
``load_tiktoken_bpe``, its cache disabled (``TIKTOKEN_CACHE_DIR=""``, tiktoken's switch for
that). Network connections fail for the whole test. Everything else (pattern, special tokens,
the encoding itself) is tiktoken's.

Both encodings are then built over the same table and must give identical ids for texts chosen
to exercise every branch of the patterns (contractions, letters and case changes, digit runs,
punctuation, whitespace runs, non-ASCII, special-token strings), and identical special-token
ids. ``test_an_altered_table_is_caught`` proves that the comparison notices a changed pattern or
special-token id.
"""

from __future__ import annotations

import base64
import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import require
from zerobatch_core.tokenization import TIKTOKEN_STANDARD, TiktokenStandard, TiktokenTokenizer
from zerobatch_core.tokenization.tiktoken_files import read_tiktoken_ranks

TEXTS = [
    "The cat sat on the mat. The end.\n\nNext paragraph\r\nwith CRLF.",
    "I'm sure they'll say we've, you're, he's, I'd, DON'T, I'LL, We'Ve",
    "CamelCaseWords and HTTPServer and iPhone and ALLCAPS and McDonald's",
    "digits 1 12 123 1234 12345 1234567890 3.14159 -42 +7 1,000,000",
    "whitespace:  two   three    four\t\ttabs \n trailing   ",
    "   leading spaces, then\n\n\n\nnewlines and \n \n mixed \r\n\r\n",
    "non-ASCII: naïve café Ærøskøbing 日本語のテキスト 한국어 Привет мир 🎉🚀 e\u0301",
    "punctuation!!! ??? ... --- /// a/b//c (x) [y] {z} <|> @#$%^&*_=+;:\"'`~",
    "special strings: <|endoftext|> <|fim_prefix|><|fim_middle|><|fim_suffix|> <|endofprompt|>",
    "<|endoftext|>",
    "",
    " ",
    "\n",
]


def _substrings(texts: list[str], longest: int) -> Iterator[bytes]:
    for text in texts:
        data = text.encode()
        for n in range(2, longest + 1):
            for i in range(len(data) - n + 1):
                yield data[i : i + n]


def _rank_table() -> dict[bytes, int]:
    """Every byte, then every 2- to 4-byte substring of the texts: every token can be reached
    by merges, and which merges apply depends on where the pattern cuts the text."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in sorted(set(_substrings(TEXTS, 4)), key=lambda t: (len(t), t)):
        ranks.setdefault(token, len(ranks))
    return ranks


@pytest.fixture(scope="module")
def rank_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ranks") / "small.tiktoken"
    lines = (base64.b64encode(t) + b" %d\n" % r for t, r in _rank_table().items())
    path.write_bytes(b"".join(lines))
    return path


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@dataclasses.dataclass
class Constructed:
    """What tiktoken's constructor for one encoding returned, and which ranks it asked for."""

    encoding: dict[str, Any]
    requested: list[tuple[str, str | None]]


def _tiktoken_constructor(
    name: str, rank_file: Path, monkeypatch: pytest.MonkeyPatch
) -> Constructed:
    """Call ``tiktoken_ext.openai_public.<name>()`` with its rank download read locally."""
    openai_public = require("tiktoken_ext.openai_public")
    tiktoken_load = require("tiktoken.load")
    requested: list[tuple[str, str | None]] = []

    def local_ranks(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        requested.append((url, expected_hash))
        ranks: dict[bytes, int] = tiktoken_load.load_tiktoken_bpe(str(rank_file))
        return ranks

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken: an empty cache dir disables caching
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", local_ranks)
    return Constructed(openai_public.ENCODING_CONSTRUCTORS[name](), requested)


def differences(
    name: str, ours: TiktokenStandard, rank_file: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[str]]:
    """``(table differences, behaviour differences)`` between ``ours`` and tiktoken's ``name``.

    The table part compares the fields; the behaviour part compares what the two encodings do
    with the texts (ids of ``encode_batch`` against ``encode_ordinary``) and which id each
    special token gets, so a change is caught even where two patterns differ only in spelling.
    """
    tiktoken = require("tiktoken")
    built = _tiktoken_constructor(name, rank_file, monkeypatch)
    theirs = built.encoding
    table = []
    if built.requested != [(ours.url, ours.sha256)]:
        table.append(f"rank file: ours {(ours.url, ours.sha256)}, tiktoken {built.requested}")
    if ours.pat_str != theirs["pat_str"]:
        table.append(f"pat_str: ours {ours.pat_str!r}, tiktoken {theirs['pat_str']!r}")
    if dict(ours.special_tokens) != theirs["special_tokens"]:
        table.append(
            f"special_tokens: ours {dict(ours.special_tokens)}, tiktoken {theirs['special_tokens']}"
        )

    # explicit_n_vocab checks the size of the full published table, not this small one.
    reference = tiktoken.Encoding(**{k: v for k, v in theirs.items() if k != "explicit_n_vocab"})
    ranks = read_tiktoken_ranks(rank_file)
    assert ranks == theirs["mergeable_ranks"]  # both read the same table
    behaviour = []
    for token in sorted(set(ours.special_tokens) | set(theirs["special_tokens"])):
        try:
            tok = TiktokenTokenizer(
                ranks, pat_str=ours.pat_str, special_tokens=ours.special_tokens, bos=token
            )
            got: int | None = tok.bos_id
        except ValueError:  # IngestError: ours lacks the token
            got = None
        want = reference.encode(token, allowed_special="all")
        if [got] != want:
            behaviour.append(f"special token {token!r}: ours {got}, tiktoken {want}")
    tok = TiktokenTokenizer(ranks, pat_str=ours.pat_str, special_tokens=ours.special_tokens)
    ours_ids = [a.tolist() for a in tok.encode_batch(TEXTS)]
    for text, got_ids, want_ids in zip(
        TEXTS, ours_ids, reference.encode_ordinary_batch(TEXTS), strict=True
    ):
        if got_ids != want_ids:
            behaviour.append(f"{text!r}: ours {got_ids}, tiktoken {want_ids}")
    return table, behaviour


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("name", sorted(TIKTOKEN_STANDARD))
def test_standard_tables_match_tiktoken(
    name: str, rank_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, behaviour = differences(name, TIKTOKEN_STANDARD[name], rank_file, monkeypatch)
    assert table == [] and behaviour == []
    # The texts exercise the table: merges apply, and across pieces they would apply more.
    tok = TiktokenTokenizer(
        read_tiktoken_ranks(rank_file),
        pat_str=TIKTOKEN_STANDARD[name].pat_str,
        special_tokens=TIKTOKEN_STANDARD[name].special_tokens,
    )
    ids = tok.encode_batch(TEXTS)
    assert sum(a.size for a in ids) < sum(len(t.encode()) for t in TEXTS)
    assert all(tok.decode(a) == t for a, t in zip(ids, TEXTS, strict=True))


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("r50k_base", r" ?\p{N}++", r"\p{N}++"),
        ("p50k_base", r"'(?:[sdmt]|ll|ve|re)|", ""),
        ("cl100k_base", r"\p{N}{1,3}+", r"\p{N}{1,4}+"),
        ("cl100k_base", r"\s*[\r\n]|", ""),
        ("o200k_base", r"[^\r\n\p{L}\p{N}]?[\p{Lu}", r"[\p{Lu}"),
        ("o200k_base", r"\p{N}{1,3}", r"\p{N}{1,2}"),
    ],
)
def test_an_altered_table_is_caught(
    name: str, old: str, new: str, rank_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    std = TIKTOKEN_STANDARD[name]
    assert old in std.pat_str
    altered = dataclasses.replace(std, pat_str=std.pat_str.replace(old, new, 1))
    table, behaviour = differences(name, altered, rank_file, monkeypatch)
    assert table and behaviour  # the ids differ, not only the spelling

    token, tid = next(iter(std.special_tokens.items()))
    moved = tid + 1000  # an id no other token has
    shifted = dataclasses.replace(std, special_tokens={**std.special_tokens, token: moved})
    table, behaviour = differences(name, shifted, rank_file, monkeypatch)
    assert table and behaviour == [f"special token {token!r}: ours {moved}, tiktoken [{tid}]"]
