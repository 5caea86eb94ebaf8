"""LLMBATCH's numbers are written down once, in ``spec/``: no format literal anywhere else.

Every Python module under ``zerobatch_core/``, ``adapters/``, ``conformance/`` and ``examples/``
is parsed with ``ast`` and searched for the format's literals:

- the header size / slot alignment: the integer 4096 (however it is spelled: ``4096``,
  ``0x1000``), ``2**12`` or ``1 << 12``; use ``HEADER_SIZE`` or ``SLOT_ALIGNMENT``;
- the token dtype as a string: ``"<u4"``, ``"u4"``, ``"=u4"``, ``"<i4"``, ``"i4"``, ``"=i4"``;
  use ``TOKEN_DTYPE``;
- the token size in byte arithmetic: ``x * 4``, ``4 * x``, ``x / 4``, ``x // 4`` or ``x % 4``
  (also as ``*=``, ``/=``, ``//=``, ``%=``) where ``x`` is a token count or a byte size, that is,
  it mentions a one-letter name (``b``, ``t``: the code's shorthand for batch dimensions) or an
  identifier containing one of ``SIZE_WORDS`` (``seq_len``, ``padded_batch_bytes``,
  ``shape``...). Use ``TOKEN_BYTES`` or ``slot_words``. Not reported: a constant ``x``
  (``4 * 2**20`` is 4 MiB), a sequence repeated four times (``[0] * 4``), a product whose ``x``
  is already a byte count, a name ending in ``bytes`` (``4 * CHUNK_BYTES`` is four chunks), and
  an ``x`` that names neither (``4 * cfg.n_layers``). For an attribute only its last name
  counts (``cfg`` in ``cfg.n_layers`` is not a one-letter token count);
- the u32 bound: ``4294967295`` (``0xFFFFFFFF``), ``4294967296``, ``2**32`` (so ``2**32 - 1``) or
  ``1 << 32``; use ``U32_MAX``.

``ALLOWED`` names the few module constants whose value may hold such a literal because it
belongs to another format or is not a format quantity; each entry says why, and an entry that no
longer matches a literal fails the test, so the list cannot rot. Each hit is reported with its
file, line and the replacement to use.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCANNED_DIRS = ("zerobatch_core", "adapters", "conformance", "examples")
"""Directories checked, relative to the repository root (missing ones are skipped)."""

SPEC_DIR = "spec"
"""The one directory where the format's literals live; never scanned."""

SLOT_ALIGNMENT_VALUE = 2**12
U32_BOUND_VALUES = frozenset({2**32 - 1, 2**32})
TOKEN_BYTES_VALUE = 4
TOKEN_DTYPE_STRINGS = frozenset({"<u4", "u4", "=u4", "<i4", "i4", "=i4"})
TOKEN_ARITHMETIC_OPS = (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)
SIZE_WORDS = (
    "byte",
    "size",
    "len",
    "word",
    "tok",
    "seq",
    "batch",
    "slot",
    "record",
    "row",
    "offset",
    "count",
    "shape",
)
"""An operand that mentions an identifier containing one of these is a token count or size."""

ALLOWED: dict[tuple[str, str], str] = {
    # nanoGPT's ``.bin`` shards are their own format: a header of 256 little-endian int32 words,
    # uint16 or uint32 tokens, and an int32 ``.bos.idx``. Their dtypes equal LLMBATCH's by
    # coincidence and must not follow TOKEN_DTYPE if it ever changed.
    ("zerobatch_core/ingest/nanogpt.py", "HEADER_DTYPE"): "nanoGPT shard header words (int32)",
    ("zerobatch_core/ingest/nanogpt.py", "SHARD_TOKEN_DTYPES"): "nanoGPT shard token widths",
    ("zerobatch_core/ingest/nanogpt.py", "BOS_INDEX_DTYPE"): "nanoGPT .bos.idx entries (int32)",
    # A token count that bounds how large a writer input a vector's JSON embeds, not a slot size.
    ("conformance/generate.py", "WRITER_INPUT_MAX_TOKENS"): "JSON size bound on writer inputs",
}


@dataclass(frozen=True)
class Hit:
    """One format literal found outside ``spec/``."""

    path: str
    line: int
    source: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source!r}: {self.what}"


def _int_constant(node: ast.AST) -> int | None:
    """The value of an integer literal (booleans excluded), else ``None``."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _identifiers(node: ast.AST) -> set[str]:
    """Names and attribute names in ``node``; the object an attribute is taken from excluded."""
    bases = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in bases}
    return names


def _is_size_like(node: ast.AST) -> bool:
    """Whether ``node`` mentions a token count or byte size (see the module docstring)."""
    if isinstance(node, (ast.List, ast.Tuple, ast.ListComp, ast.Constant, ast.JoinedStr)):
        return False  # a literal, or a sequence being repeated: not arithmetic on sizes
    return any(
        len(name) == 1 or any(word in name.lower() for word in SIZE_WORDS)
        for name in _identifiers(node)
    )


def _is_byte_count(node: ast.AST) -> bool:
    """Whether ``node`` is a name or attribute whose identifier ends in ``bytes``."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(name, str) and name.lower().endswith("bytes")


def _token_arithmetic(op: ast.operator, left: ast.AST, right: ast.AST) -> bool:
    """``left op right`` converts between tokens and bytes with the literal token size."""
    if not isinstance(op, TOKEN_ARITHMETIC_OPS):
        return False
    # Only ``x / 4`` divides by the token size; ``4 / x`` is not a size conversion.
    pairs = [(left, right), (right, left)] if isinstance(op, ast.Mult) else [(right, left)]
    for four, other in pairs:
        if _int_constant(four) != TOKEN_BYTES_VALUE or not _is_size_like(other):
            continue
        if isinstance(op, ast.Mult) and _is_byte_count(other):
            continue
        return True
    return False


def _classify(node: ast.AST) -> str | None:
    """What format literal ``node`` is, with the replacement to use; ``None`` if it is none."""
    value = _int_constant(node)
    if value == SLOT_ALIGNMENT_VALUE:
        return "slot alignment / header size literal: use SLOT_ALIGNMENT or HEADER_SIZE"
    if value in U32_BOUND_VALUES:
        return "u32 bound literal: use U32_MAX"
    if isinstance(node, ast.Constant) and node.value in TOKEN_DTYPE_STRINGS:
        return "token dtype string: use TOKEN_DTYPE"
    if isinstance(node, ast.BinOp):
        base, exponent = _int_constant(node.left), _int_constant(node.right)
        if isinstance(node.op, ast.Pow) and base == 2 and exponent == 12:
            return "slot alignment / header size literal: use SLOT_ALIGNMENT or HEADER_SIZE"
        if isinstance(node.op, ast.LShift) and base == 1 and exponent == 12:
            return "slot alignment / header size literal: use SLOT_ALIGNMENT or HEADER_SIZE"
        if isinstance(node.op, ast.Pow) and base == 2 and exponent == 32:
            return "u32 bound literal: use U32_MAX"
        if isinstance(node.op, ast.LShift) and base == 1 and exponent == 32:
            return "u32 bound literal: use U32_MAX"
        if _token_arithmetic(node.op, node.left, node.right):
            return "token size 4 in byte arithmetic: use TOKEN_BYTES (or slot_words)"
    if isinstance(node, ast.AugAssign) and _token_arithmetic(node.op, node.target, node.value):
        return "token size 4 in byte arithmetic: use TOKEN_BYTES (or slot_words)"
    return None


def find_format_literals(source: str, path: str) -> tuple[list[Hit], set[str]]:
    """The format literals in ``source`` (from ``path``) and the ``ALLOWED`` names they used.

    A literal inside the value of an ``ALLOWED`` constant is not a hit; the names of the
    constants that did cover a literal are returned so stale entries can be detected.
    """
    tree = ast.parse(source, filename=path)
    covering = _covering_names(tree, path)
    hits: list[Hit] = []
    used: set[str] = set()
    for node in ast.walk(tree):
        what = _classify(node)
        if what is None:
            continue
        if id(node) in covering:
            used.add(covering[id(node)])
            continue
        segment = ast.get_source_segment(source, node) or type(node).__name__
        hits.append(Hit(path, getattr(node, "lineno", 0), segment, what))
    hits.sort(key=lambda h: (h.path, h.line))
    return hits, used


def _covering_names(tree: ast.Module, path: str) -> dict[int, str]:
    """For each node inside an ``ALLOWED`` constant's value, the constant's name."""
    names = {name for (p, name) in ALLOWED if p == path}
    covering: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in names:
                covering.update((id(n), target.id) for n in ast.walk(value))
    return covering


def scanned_files() -> list[Path]:
    """Every Python module the check covers, ``spec/`` excluded."""
    files: list[Path] = []
    for directory in SCANNED_DIRS:
        base = ROOT / directory
        if base.is_dir():
            files += [p for p in base.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(p for p in files if p.relative_to(ROOT).parts[0] != SPEC_DIR)


def test_no_format_literal_outside_spec() -> None:
    hits: list[Hit] = []
    used: set[tuple[str, str]] = set()
    for file in scanned_files():
        rel = file.relative_to(ROOT).as_posix()
        found, names = find_format_literals(file.read_text(encoding="utf-8"), rel)
        hits += found
        used.update((rel, name) for name in names)
    stale = sorted(set(ALLOWED) - used)
    problems = [f"  {h}" for h in hits]
    problems += [
        f"  ALLOWED entry {p}:{name} no longer covers a literal: remove it" for p, name in stale
    ]
    if problems:
        listing = "\n".join(problems)
        pytest.fail(
            f"{len(hits)} LLMBATCH format literal(s) outside spec/ (import the constant from "
            f"zerobatch_spec instead), {len(stale)} stale ALLOWED entries:\n{listing}",
            pytrace=False,
        )


def test_scan_covers_the_packages_and_skips_spec() -> None:
    rel = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert {
        "zerobatch_core/files/reader.py",
        "zerobatch_core/files/writer.py",
        "conformance/generate.py",
    } <= rel
    assert any(r.startswith("adapters/") for r in rel)
    assert not any(r.startswith(f"{SPEC_DIR}/") for r in rel)


def test_spec_itself_holds_the_literals() -> None:
    # The same scan over spec/layout.py finds the definitions: the scanner sees real code, and
    # spec/ passes only because it is excluded.
    source = (ROOT / SPEC_DIR / "layout.py").read_text(encoding="utf-8")
    whats = {h.what.split(":")[0] for h in find_format_literals(source, "spec/layout.py")[0]}
    assert whats == {
        "slot alignment / header size literal",
        "token dtype string",
        "u32 bound literal",
    }


@pytest.mark.parametrize(
    "snippet",
    [
        "PAGE = 4096",
        "PAGE = 0x1000",
        "PAGE = 2**12",
        "PAGE = 1 << 12",
        "offset = 4096 + i * padded",
        "dt = np.dtype('<u4')",
        "a = np.zeros(3, dtype='u4')",
        "v = x.view('<i4')",
        "words = padded_batch_bytes // 4",
        "n = size / 4",
        "ok = size % 4 == 0",
        "row_bytes = seq_len * 4",
        "row_bytes = 4 * header.seq_len",
        "nbytes = len(tokens) * 4",
        "n //= 4",
        "n *= 4",
        "size = m * b * t * 4",
        "offset = raw + 4 * word + byte",
        "rows = self.stage.shape[0] // 4",
        "limit = 2**32 - 1",
        "limit = 2**32",
        "limit = 1 << 32",
        "limit = 4294967295",
        "limit = 0xFFFFFFFF",
        "ok = 0 <= v < 2**32",
    ],
)
def test_detects_reintroduced_literal(snippet: str) -> None:
    hits, _ = find_format_literals(snippet + "\n", "zerobatch_core/example.py")
    assert len(hits) == 1, hits
    assert hits[0].line == 1 and hits[0].path == "zerobatch_core/example.py"


@pytest.mark.parametrize(
    "snippet",
    [
        "CHUNK = 4 * 2**20",
        "BOUND = 4 * CHUNK_BYTES + 96 * 2**20",
        "x = a + 4",
        "x = 4 // a",
        "limit = 2**31 - 1",
        "key = salt << 32",
        "dtypes = ('uint32', 'int32', 'int64')",
        "'''Tokens are stored as <u4 in 4096-byte slots.'''",
        "ok = flag is True",
        "x = y * 8",
        "keys = split(key, 2 + 4 * cfg.n_layers)",
        "rows = [[0, 1, limit]] * 4",
        "heads = 4 * d_model",
    ],
)
def test_ignores_what_is_not_a_format_literal(snippet: str) -> None:
    assert find_format_literals(snippet + "\n", "zerobatch_core/example.py")[0] == []


def test_allowlisted_constant_is_not_a_hit_but_its_neighbours_are() -> None:
    source = 'HEADER_DTYPE = np.dtype("<i4")\nOTHER = np.dtype("<i4")\n'
    hits, used = find_format_literals(source, "zerobatch_core/ingest/nanogpt.py")
    assert [h.line for h in hits] == [2]
    assert used == {"HEADER_DTYPE"}
