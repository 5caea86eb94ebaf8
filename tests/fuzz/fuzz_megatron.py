"""Fuzz the Megatron-LM indexed dataset reader: mutants of small ``.idx`` / ``.bin`` pairs.

Run from the repository root::

    nice -n 19 .venv/bin/python -m tests.fuzz.fuzz_megatron --mutants 100000 --workers 1

Mutant ``i`` of a run is a pure function of ``(--seed, i)`` (``random_mutant``): one of a few
valid datasets written by ``write_dataset`` below (a minimal writer of the format, byte for
byte what ``IndexedDatasetBuilder`` writes, checked by ``tests/unit/test_ingest_megatron.py``;
no torch or Megatron needed here), with one to four mutations:

* ``("flip", file, offset, value)``: set one byte of the ``.idx`` or the ``.bin``;
* ``("header", name, value)``: set a header field (``magic`` as hex, ``version``, ``code``,
  ``sequences``, ``documents``) to a value, typically an extreme one;
* ``("entry", array, i, value)``: set entry ``i`` of ``lengths``, ``pointers``, ``documents``
  or ``modes``, where the current header places it, to an extreme or nearby value;
* ``("truncate", file, length)``, ``("append", file, count, byte)``;
* ``("counts", S, N, byte, modes)``: both counts set and the ``.idx`` resized to what they
  need (new bytes ``byte``; ``modes``: room for sequence modes), so odd counts reach the array
  checks;
* ``("refit", byte)``: the pointers recomputed from the lengths, the last document entry set
  to ``S`` and the ``.bin`` resized to the sequences' bytes, so that changed lengths and
  counts also reach the valid side;
* ``("special", file, what)``: the file removed, or replaced by a FIFO or a directory.

The oracle (``check``) opens the mutant (as the prefix, the ``.idx`` or the ``.bin``) and,
when it opens, reads every token, the document starts and the records of both layouts through
``TokenFileSource``; on one valid mutant in four it then truncates the ``.bin`` and reads again.
An independent reference (``violations``, plain Python over the bytes) lists every rule the
mutant breaks, and the reader must agree: it refuses exactly the mutants that break a rule,
with an ``IngestError`` naming the file and one of the broken fields; it serves exactly the
``.bin``'s bytes, the document starts the index gives and the records a plain NumPy cut gives
(or refuses a token outside ``[0, 2**32 - 1]`` that is really there); the truncated read is an
``IngestError``. Anything else is a finding: another exception (**exception**), a
``MemoryError`` (**memory**, each worker runs under a 2 GiB address-space limit), a wrong
answer (**disagreement**), a worker killed by a signal (**signal**), or a mutant that makes no
progress for ``--hang-seconds`` (**hang**). The run exits 1 if there was any finding. The
workers, their status files and the run loop are ``harness.py``'s.

The reader's chunk sizes are shrunk (``small_chunks``) so that these small files cross many
chunk and window boundaries. ``tests/property/test_fuzz_megatron.py`` runs the first mutants
in CI.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import shutil
import struct
import tempfile
import traceback
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.fuzz.harness import (
    Ended,
    Fleet,
    Layout,
    Worker,
    limit_address_space,
    parser,
    run_workers,
    sabotage,
    say_flushed,
    say_outcomes,
    scratch_root,
    serve,
)
from tests.fuzz.mutants import edit_bytes
from zerobatch_core import ZeroBatchError
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest import megatron, token_files
from zerobatch_core.ingest.megatron import MegatronFile, expand_megatron, is_megatron
from zerobatch_core.ingest.token_files import TokenFileSource

Op = list[Any]
"""One mutation, as a JSON-serialisable list (saved with each finding, replayed by --ops)."""

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")
HEADER_BYTES = HEADER.size
CODES: dict[int, str] = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}
"""The integer dtype codes (Megatron's ``DType``); 6 and 7 are floats."""
FIT_LIMIT = 1 << 16
"""``counts`` and ``refit`` leave files alone that would grow past this many bytes."""

FINDINGS = ("exception", "memory", "disagreement", "signal", "hang")
FIELDS = (
    "idx:missing",
    "bin:missing",
    "idx:header",
    "idx:magic",
    "idx:version",
    "idx:dtype code",
    "idx:size",
    "idx:document_count",
    "idx:sequence_lengths",
    "idx:sequence_pointers",
    "idx:sequence_modes",
    "idx:document_index",
    "bin:size",
)
"""The rules a mutant can break, as ``file:field`` (what the reader's messages name)."""
OUTCOMES = ("valid", "valid:token-range", *(f"error {f}" for f in FIELDS), *FINDINGS)
FLEET = Fleet("tests.fuzz.fuzz_megatron", Layout(OUTCOMES), FINDINGS, poll_seconds=0.1)


# -- the format, written plainly ---------------------------------------------------------------


def write_dataset(
    sequences: list[list[int]],
    documents: list[int],
    code: int,
    modes: list[int] | None = None,
) -> tuple[bytes, bytes]:
    """The ``.idx`` and ``.bin`` bytes of a dataset, as ``IndexedDatasetBuilder`` writes them.

    ``documents`` is the document index (``[0, ..., len(sequences)]``).
    """
    dtype = np.dtype(CODES[code])
    arrays = [np.asarray(s, dtype=np.int64).astype(dtype) for s in sequences]
    lengths = np.array([a.size for a in arrays], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * dtype.itemsize)[:-1]])
    idx = HEADER.pack(MAGIC, 1, code, len(sequences), len(documents))
    idx += lengths.tobytes() + pointers[: len(sequences)].astype("<i8").tobytes()
    idx += np.asarray(documents, dtype="<i8").tobytes()
    if modes is not None:
        idx += np.asarray(modes, dtype="i1").tobytes()
    data = b"".join(a.tobytes() for a in arrays)
    return idx, data


def _bases() -> tuple[tuple[bytes, bytes], ...]:
    rng = np.random.default_rng(7)
    many = [rng.integers(0, 50_000, int(n)).tolist() for n in rng.integers(0, 5, 40)]
    many_docs = [0, *range(3, 40, 3), 40]
    return (
        # uint16: an empty sequence, an empty document, documents of several sequences
        write_dataset([[5, 1, 2, 3, 4], [], [9, 9, 9], [1] * 7, [6], [7, 8]], [0, 2, 2, 5, 6], 8),
        # int32 with large ids, one sequence per document
        write_dataset([[1, 2, 3, 4], list(range(2**31 - 9, 2**31)), [3]], [0, 1, 2, 3], 4),
        write_dataset([list(range(16))], [0, 1], 1),  # uint8, one document
        write_dataset([], [0], 8),  # no sequences at all
        write_dataset([[3, 1, 4], [1, 5, 9, 2]], [0, 2], 8, modes=[0, 0]),  # multimodal, text
        write_dataset(many, many_docs, 4),  # 40 short sequences, crossing chunk boundaries
        write_dataset([[1, -3, 2], [7, 7], [5]], [0, 2, 3], 2),  # int8 with a negative token
        write_dataset([[2**32 - 1, 0], [2**32, 5, 6]], [0, 1, 2], 5),  # int64 past uint32
        write_dataset([[1, 2], [3, 4, 5, 6, 7, 8]], [0, 0, 1, 1, 2, 2], 3),  # int16, empty docs
    )


BASES = _bases()


@dataclass
class Mutant:
    """The two files of a dataset: bytes, or ``None`` with ``special`` saying what is there."""

    idx: bytearray | None
    bin: bytearray | None
    special: dict[str, str] = field(default_factory=dict)


def _layout(idx: bytes | bytearray) -> tuple[int, int, int, int] | None:
    """``(code, S, N, itemsize)`` from a header whose arrays the file holds, else ``None``."""
    if len(idx) < HEADER_BYTES:
        return None
    _, _, code, s, n = HEADER.unpack(bytes(idx[:HEADER_BYTES]))
    if code not in CODES or len(idx) < HEADER_BYTES + 12 * s + 8 * n:
        return None
    return code, s, n, np.dtype(CODES[code]).itemsize


_ARRAYS = {"lengths": (0, 4), "pointers": (1, 8), "documents": (2, 8), "modes": (3, 1)}


def _entry_offset(idx: bytes | bytearray, array: str, i: int) -> tuple[int, int] | None:
    """Where entry ``i`` of ``array`` is under the current header, and its width."""
    if len(idx) < HEADER_BYTES:
        return None
    _, _, _, s, n = HEADER.unpack(bytes(idx[:HEADER_BYTES]))
    which, width = _ARRAYS[array]
    start = (
        HEADER_BYTES,
        HEADER_BYTES + 4 * s,
        HEADER_BYTES + 12 * s,
        HEADER_BYTES + 12 * s + 8 * n,
    )
    at = start[which] + width * i
    return (at, width) if at + width <= len(idx) else None


def _header_field(name: str) -> tuple[int, str]:
    return {
        "version": (9, "<Q"),
        "code": (17, "<B"),
        "sequences": (18, "<Q"),
        "documents": (26, "<Q"),
    }[name]


def apply(base: tuple[bytes, bytes], ops: list[Op]) -> Mutant:
    """The mutant: ``ops`` applied to the base pair in order."""
    m = Mutant(bytearray(base[0]), bytearray(base[1]))
    for op in ops:
        kind = op[0]
        if kind in ("flip", "truncate", "append"):
            data = m.idx if op[1] == "idx" else m.bin
            if data is not None:
                edit_bytes(data, [kind, *op[2:]])
            continue
        data = m.idx
        if data is None:
            continue
        if kind == "header":
            if len(data) < HEADER_BYTES:
                data.extend(bytes(HEADER_BYTES - len(data)))
            if op[1] == "magic":
                data[:9] = bytes.fromhex(op[2])
            else:
                at, fmt = _header_field(op[1])
                width = struct.calcsize(fmt)
                struct.pack_into(fmt, data, at, op[2] % (1 << (8 * width)))
        elif kind == "entry":
            where = _entry_offset(data, op[1], op[2])
            if where is not None:
                at, width = where
                data[at : at + width] = (op[3] % (1 << (8 * width))).to_bytes(width, "little")
        elif kind == "counts":
            _, s, n, byte, modes = op
            if len(data) < HEADER_BYTES:
                data.extend(bytes(HEADER_BYTES - len(data)))
            struct.pack_into("<QQ", data, 18, s, n)
            size = HEADER_BYTES + 12 * s + 8 * n + (s if modes else 0)
            if size <= FIT_LIMIT:
                if len(data) > size:
                    del data[size:]
                else:
                    data.extend(bytes([byte]) * (size - len(data)))
        elif kind == "refit":
            layout = _layout(data)
            if layout is None or m.bin is None:
                continue
            _, s, n, item = layout
            lengths = np.frombuffer(bytes(data[HEADER_BYTES : HEADER_BYTES + 4 * s]), "<i4")
            ends = np.cumsum(lengths.astype(np.int64) * item)
            pointers = np.concatenate([[0], ends[:-1]]).astype("<i8")[:s]
            data[HEADER_BYTES + 4 * s : HEADER_BYTES + 12 * s] = pointers.tobytes()
            if n:
                last = HEADER_BYTES + 12 * s + 8 * (n - 1)
                data[last : last + 8] = s.to_bytes(8, "little")
            total = int(ends[-1]) if s else 0
            if 0 <= total <= FIT_LIMIT:
                if len(m.bin) > total:
                    del m.bin[total:]
                else:
                    m.bin.extend(bytes([op[1]]) * (total - len(m.bin)))
        elif kind == "special":
            if op[1] == "idx":
                m.idx = None
            else:
                m.bin = None
            m.special[op[1]] = op[2]
        else:
            raise ValueError(f"unknown mutation {op!r}")
    return m


# -- random mutations --------------------------------------------------------------------------

I32 = (0, 1, 2, -1, -2, 2**31 - 1, -(2**31), 2**16, 1000)
I64 = (0, 1, 2, -1, -2, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63), 2**53 + 1)
U64 = (0, 1, 2, 3, 2**31, 2**32, 2**61, 2**62 + 1, 2**63, 2**64 - 1, 2**64 - 2)
MAGICS = (
    b"MMIDIDX\x00\x01",
    b"MMIDIDX\x01\x00",
    b"TNTIDX\x00\x00\x01",
    bytes(9),
    b"mmididx\x00\x00",
)
"""Nine bytes each (the magic's width), the legacy ``TNTIDX`` among them."""


def _current(data: bytes | bytearray, at: int, width: int, signed: bool) -> int:
    if at + width > len(data):
        return 0
    return int.from_bytes(data[at : at + width], "little", signed=signed)


def random_op(rng: random.Random, m: Mutant) -> Op:
    """One mutation of ``m``, weighted towards the index's fields and their edge values."""
    idx = m.idx if m.idx is not None else bytearray()
    data_len = len(m.bin) if m.bin is not None else 0
    layout = _layout(idx)
    s = layout[1] if layout else 3
    n = layout[2] if layout else 3
    roll = rng.random()
    if roll < 0.27:
        array = rng.choice(("lengths", "lengths", "pointers", "pointers", "documents", "modes"))
        count = {"lengths": s, "pointers": s, "documents": n, "modes": s}[array]
        i = rng.randrange(max(count, 1))
        where = _entry_offset(idx, array, i)
        width = _ARRAYS[array][1]
        cur = _current(idx, where[0], width, True) if where else 0
        r = rng.random()
        if r < 0.45:
            value = rng.choice(I32 if width == 4 else I64 if width == 8 else (1, -1, 2, 127))
        elif r < 0.85:
            step = layout[3] if layout and array == "pointers" else 1
            value = cur + step * rng.choice((-2, -1, 1, 2))
        else:
            value = rng.choice((s, n, data_len, data_len + 1, s + 1, n - 1))
        return ["entry", array, i, value]
    if roll < 0.40:
        name = rng.choice(("magic", "version", "code", "code", "sequences", "documents"))
        if name == "magic":
            return ["header", "magic", rng.choice(MAGICS).hex()]
        if name == "code":
            return ["header", "code", rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 255))]
        cur = {"version": 1, "sequences": s, "documents": n}[name]
        r = rng.random()
        value = rng.choice(U64) if r < 0.6 else max(0, cur + rng.choice((-2, -1, 1, 2)))
        return ["header", name, value]
    if roll < 0.58:
        on_idx = rng.random() < 0.7
        size = len(idx) if on_idx else data_len
        offset = rng.randrange(HEADER_BYTES) if on_idx and rng.random() < 0.3 else None
        if offset is None:
            offset = rng.randrange(max(size, 1))
        value = rng.randrange(256) if rng.random() < 0.5 else (1 << rng.randrange(8))
        return ["flip", "idx" if on_idx else "bin", offset, value]
    if roll < 0.68:
        on_idx = rng.random() < 0.7
        size = len(idx) if on_idx else data_len
        choices = (0, 1, 8, 9, 17, 18, 33, 34, size - 1, size - 2, size - 8) if on_idx else ()
        length = rng.choice((*choices, rng.randrange(size + 1), rng.randrange(size + 1), size - 1))
        return ["truncate", "idx" if on_idx else "bin", max(0, length)]
    if roll < 0.75:
        count = rng.choice((1, 2, 4, 8, s, rng.randrange(1, 200)))
        return ["append", "idx" if rng.random() < 0.6 else "bin", max(1, count), rng.randrange(256)]
    if roll < 0.84:
        r = rng.random()
        new_s = rng.choice(U64) if r < 0.2 else max(0, s + rng.choice((-3, -1, 0, 1, 2, 5)))
        new_n = rng.choice(U64) if r > 0.8 else max(0, n + rng.choice((-2, -1, 0, 1, 3)))
        byte = 0 if rng.random() < 0.7 else rng.randrange(256)
        return ["counts", new_s, new_n, byte, rng.random() < 0.2]
    if roll < 0.985:
        return ["refit", 0 if rng.random() < 0.5 else rng.randrange(256)]
    return ["special", rng.choice(("idx", "bin")), rng.choice(("remove", "fifo", "dir"))]


def random_mutant(seed: int, index: int) -> tuple[int, list[Op], Mutant]:
    """Mutant ``index`` of run ``seed``: its base, its ops and its files (deterministic)."""
    rng = random.Random((seed << 40) ^ index)
    base = rng.randrange(len(BASES))
    ops: list[Op] = []
    m = apply(BASES[base], [])
    for _ in range(rng.choice((1, 1, 2, 2, 3, 4))):
        op = random_op(rng, m)
        ops.append(op)
        m = apply(BASES[base], ops)
        if op[0] == "special":
            break
    return base, ops, m


# -- the reference -----------------------------------------------------------------------------


def violations(m: Mutant) -> set[str]:
    """Every rule ``m`` breaks (``FIELDS``), by plain Python over its bytes.

    The header's rules are gates, checked in the reader's order (each needs the ones before);
    the arrays' rules are all listed, since which of them the reader meets first depends on its
    chunking.
    """
    if m.idx is None:
        return {"idx:missing"}
    if m.bin is None:
        return {"bin:missing"}
    idx, size = bytes(m.idx), len(m.idx)
    if size < HEADER_BYTES:
        return {"idx:header"}
    magic, version, code, s, n = HEADER.unpack(idx[:HEADER_BYTES])
    if magic != MAGIC:
        return {"idx:magic"}
    if version != 1:
        return {"idx:version"}
    if code not in CODES:
        return {"idx:dtype code"}
    base = HEADER_BYTES + 12 * s + 8 * n
    if size != base and not (s > 0 and size == base + s):
        return {"idx:size"}
    if n < 1:
        return {"idx:document_count"}
    item = np.dtype(CODES[code]).itemsize
    found: set[str] = set()
    at = HEADER_BYTES
    lengths = [
        int.from_bytes(idx[at + 4 * i : at + 4 * i + 4], "little", signed=True) for i in range(s)
    ]
    at += 4 * s
    pointers = [
        int.from_bytes(idx[at + 8 * i : at + 8 * i + 8], "little", signed=True) for i in range(s)
    ]
    at += 8 * s
    documents = [
        int.from_bytes(idx[at + 8 * i : at + 8 * i + 8], "little", signed=True) for i in range(n)
    ]
    at += 8 * n
    modes = idx[at:] if size != base else b""
    end = 0
    for i in range(s):
        if lengths[i] < 0:
            found.add("idx:sequence_lengths")
        if pointers[i] != end:
            found.add("idx:sequence_pointers")
        end += lengths[i] * item
        if end > len(m.bin):
            found.add("bin:size")
    if end != len(m.bin):
        found.add("bin:size")
    if any(modes):
        found.add("idx:sequence_modes")
    if documents[0] != 0 or documents[-1] != s:
        found.add("idx:document_index")
    if any(b < a or b > s for a, b in zip([0, *documents[:-1]], documents, strict=True)):
        found.add("idx:document_index")
    return found


def reference_tokens(m: Mutant) -> tuple[npt.NDArray[np.int64], list[int]]:
    """A valid mutant's token stream (as int64) and document starts, from its bytes."""
    assert m.idx is not None and m.bin is not None
    _, _, code, s, n = HEADER.unpack(bytes(m.idx[:HEADER_BYTES]))
    tokens = np.frombuffer(bytes(m.bin), dtype=CODES[code]).astype(np.int64)
    lengths = np.frombuffer(bytes(m.idx), "<i4", count=s, offset=HEADER_BYTES)
    seq_starts = [0, *np.cumsum(lengths.astype(np.int64)).tolist()]
    documents = np.frombuffer(bytes(m.idx), "<i8", count=n, offset=HEADER_BYTES + 12 * s)
    return tokens, [int(seq_starts[d]) for d in documents[:-1]]


def reference_records(
    tokens: npt.NDArray[np.int64], starts: list[int], seq_len: int, layout: str
) -> npt.NDArray[np.int64]:
    """The records ``token_files.py``'s rules cut, by a plain loop."""
    n = tokens.size
    if layout == "contiguous":
        k = n // seq_len
        return tokens[: k * seq_len].reshape(k, seq_len)
    rows, pos = [], 0
    for s in sorted(set(starts)):
        if s < pos or s >= n:
            continue
        if s + seq_len > n:
            break
        rows.append(tokens[s : s + seq_len])
        pos = s + seq_len
    return np.array(rows, dtype=np.int64).reshape(len(rows), seq_len)


# -- the oracle --------------------------------------------------------------------------------


@contextlib.contextmanager
def small_chunks() -> Iterator[None]:
    """Shrink the reader's chunks and windows so that small files cross many boundaries."""
    saved = (megatron.INDEX_CHUNK_ENTRIES, megatron.GATHER_ENTRIES, token_files.WINDOW_BYTES)
    megatron.INDEX_CHUNK_ENTRIES, megatron.GATHER_ENTRIES, token_files.WINDOW_BYTES = 3, 2, 16
    try:
        yield
    finally:
        megatron.INDEX_CHUNK_ENTRIES, megatron.GATHER_ENTRIES, token_files.WINDOW_BYTES = saved


def _clear(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def materialize(m: Mutant, prefix: str) -> None:
    """Write ``m`` as ``prefix.idx`` and ``prefix.bin`` (replacing what was there)."""
    for suffix, data in ((".idx", m.idx), (".bin", m.bin)):
        path = prefix + suffix
        _clear(path)
        what = m.special.get(suffix[1:])
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        elif what == "fifo":
            os.mkfifo(path)
        elif what == "dir":
            os.mkdir(path)


def classify(e: IngestError, prefix: str) -> str:
    """The ``file:field`` an ``IngestError`` of the reader names (``?`` when it names none)."""
    msg = str(e)
    for kind in ("idx", "bin"):
        path = f"{prefix}.{kind}"
        if msg.startswith(path + ": "):
            rest = msg[len(path) + 2 :]
            if "file of Megatron dataset" in rest:
                return f"{kind}:missing"
            found = re.match(r"field ([a-z_]+(?: code)?)", rest)
            return f"{kind}:{found.group(1)}" if found else f"{kind}:?"
    return "?"


def check(prefix: str, m: Mutant, index: int) -> str:
    """Read mutant ``m`` (materialised at ``prefix``) every way; return its outcome.

    Raises ``AssertionError`` when the reader disagrees with the reference; lets any exception
    that is not a ``ZeroBatchError`` escape.
    """
    broken = violations(m)
    assert isinstance(is_megatron(prefix), bool) and isinstance(is_megatron(prefix + ".bin"), bool)
    path = (prefix, prefix + ".idx", prefix + ".bin")[index % 3]
    try:
        f = MegatronFile(path)
    except IngestError as e:
        got = classify(e, prefix)
        assert broken, f"reader refused a valid dataset: {e}"
        assert got in broken, f"reader says {got} ({e}); the reference finds {sorted(broken)}"
        if got.endswith(":missing"):
            try:
                expand_megatron(prefix)
            except IngestError:
                pass
            else:
                raise AssertionError("expand_megatron accepted a dataset with a missing file")
        return f"error {got}"
    assert not broken, f"reader accepted a dataset the reference rejects: {sorted(broken)}"
    assert is_megatron(prefix) and is_megatron(prefix + ".bin") and is_megatron(path)
    assert expand_megatron(path) == [prefix]
    tokens, starts = reference_tokens(m)
    n = tokens.size
    assert f.num_tokens == n and f.path == prefix + ".bin", (f.num_tokens, n)
    assert f.read_tokens(0, n).tobytes() == bytes(m.bin or b"")
    rng = random.Random(index)
    a = rng.randrange(n + 1)
    b = rng.randrange(a, n + 1)
    assert np.array_equal(f.read_tokens(a, b).astype(np.int64), tokens[a:b])
    assert f.document_starts().tolist() == starts
    outcome = "valid"
    for layout in token_files.LAYOUTS:
        seq_len = rng.choice((1, 2, 3, 5, 8))
        expected = reference_records(tokens, starts, seq_len, layout)
        src = TokenFileSource([f], seq_len, layout, rng.choice((1, 2, None)))
        try:
            assert src.num_records == expected.shape[0]
            blocks = list(src.iter_blocks())
        except IngestError as e:
            found = re.search(r"token (\d+) is (-?\d+), outside", str(e))
            assert found, f"records refused: {e}"
            at, value = int(found.group(1)), int(found.group(2))
            assert tokens[at] == value and not 0 <= value < 2**32, str(e)
            outcome = "valid:token-range"
            continue
        rows = np.concatenate(blocks) if blocks else np.zeros((0, seq_len), np.uint32)
        assert rows.dtype == np.uint32 and rows.shape == expected.shape, (rows.shape, layout)
        assert np.array_equal(rows.astype(np.int64), expected), layout
        assert src.source_tokens == n
    if index % 4 == 0 and m.bin:
        cut = rng.randrange(len(m.bin))
        os.truncate(prefix + ".bin", cut)
        try:
            f.read_tokens(0, n)
        except IngestError as e:
            assert "truncated while reading" in str(e), str(e)
        else:
            raise AssertionError(f"read a .bin cut to {cut} of {len(m.bin)} bytes")
    return outcome


# -- worker ------------------------------------------------------------------------------------


def run_mutants(seed: int, start: int, stop: int, work: str) -> collections.Counter[str]:
    """Run mutants ``start..stop`` in this process (the CI test); a finding raises."""
    counts: collections.Counter[str] = collections.Counter()
    prefix = os.path.join(work, "ds")
    with small_chunks():
        for index in range(start, stop):
            _, ops, m = random_mutant(seed, index)
            materialize(m, prefix)
            try:
                counts[check(prefix, m, index)] += 1
            except Exception as e:
                raise AssertionError(
                    f"mutant {seed}:{index} (ops {json.dumps(ops)}): {type(e).__name__}: {e}"
                ) from e
    return counts


def _finding(e: BaseException) -> str:
    if isinstance(e, MemoryError):
        return "memory"
    if isinstance(e, AssertionError):
        return "disagreement"
    return "exception"


def run_worker(args: argparse.Namespace) -> int:
    """Check mutants ``--start..--stop`` under the address-space limit, keeping the status file
    current; findings are logged for the parent.

    ``--crash-at`` and ``--hang-at`` check the harness: on that mutant the worker sends itself
    SIGBUS, or sleeps; the run must then count one signal or hang there and go on.
    """
    limit_address_space()

    def step(worker: Worker, index: int) -> None:
        sabotage(index, args.crash_at, args.hang_at)
        prefix = os.path.join(worker.scratch, "ds")
        _, ops, m = random_mutant(args.seed, index)
        materialize(m, prefix)
        try:
            worker.count(check(prefix, m, index))
            return
        except Exception as e:
            # A ZeroBatchError that ``check`` lets out came from a read the reference says
            # works: a disagreement, like a wrong value.
            kind = "disagreement" if isinstance(e, ZeroBatchError) else _finding(e)
            detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        worker.count(kind)
        worker.failure({"index": index, "kind": kind, "ops": ops, "detail": detail[-4000:]})

    with small_chunks():
        return serve(FLEET.layout, args, step)


# -- parent ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    def died(ended: Ended) -> tuple[Hashable, dict[str, Any]]:
        _, ops, _ = random_mutant(args.seed, ended.index)
        record = {"index": ended.index, "kind": ended.kind, "ops": ops}
        return ended.kind, record | {"detail": ended.describe()}

    extra = ["--crash-at", str(args.crash_at), "--hang-at", str(args.hang_at)]
    result = run_workers(FLEET, args, extra, died, say_flushed)
    outcomes, failures = result.totals.counts, result.totals.failures
    summary = {
        **result.figures(args),
        "outcomes": {k: outcomes[k] for k in OUTCOMES if outcomes[k] and k not in FINDINGS},
        "findings": {k: outcomes[k] for k in FINDINGS},
        "failures": failures[:50],
    }
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    result.head(print, args, noun="mutants")
    say_outcomes(print, outcomes, [k for k in OUTCOMES if k not in FINDINGS], 32)
    print("findings: " + ", ".join(f"{k} {outcomes[k]}" for k in FINDINGS))
    for failure in failures[:20]:
        print(f"  {failure['kind']} at mutant {failure['index']}: {json.dumps(failure['ops'])}")
        print("    " + failure["detail"][-600:].replace("\n", "\n    "))
    return 1 if any(outcomes[k] for k in FINDINGS) else 0


def replay(seed: int, index: int, ops_json: str | None, base: int) -> int:
    """Run one mutant (``seed:index``, or ``ops`` on ``base``) here, printing the outcome."""
    if ops_json is None:
        base, ops, m = random_mutant(seed, index)
    else:
        ops = json.loads(ops_json)
        m = apply(BASES[base], ops)
    print(f"base {base}, ops {json.dumps(ops)}")
    print(f"reference: {sorted(violations(m)) or 'valid'}")
    work = tempfile.mkdtemp(prefix="zerobatch-fuzz-megatron-", dir=scratch_root())
    try:
        materialize(m, os.path.join(work, "ds"))
        with small_chunks():
            print(f"outcome: {check(os.path.join(work, 'ds'), m, index)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "tests.fuzz.fuzz_megatron",
        "Fuzz the Megatron indexed dataset reader with mutants of valid datasets.",
        mutants=100_000,
        chunk=10_000,
        hang_seconds=10.0,
    )
    p.add_argument("--summary", default=None, help="write the run's figures as JSON here")
    p.add_argument("--replay", default=None, metavar="S:I", help="run mutant I of seed S")
    p.add_argument("--ops", default=None, help="with --replay 0:B: these ops on base B")
    p.add_argument("--crash-at", type=int, default=-1, help="harness check: SIGBUS on this mutant")
    p.add_argument("--hang-at", type=int, default=-1, help="harness check: hang here")
    args = p.parse_args(argv)
    if args.worker:
        return run_worker(args)
    if args.replay:
        seed, index = (int(x) for x in args.replay.split(":"))
        return replay(seed, index, args.ops, index)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
