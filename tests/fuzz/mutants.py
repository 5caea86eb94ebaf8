"""Mutants of valid LLMBATCH files, and the oracle every mutant must satisfy.

Shared by the CI fuzz test (``tests/property/test_fuzz.py``, mutations drawn by hypothesis) and
the long standalone run (``tests/fuzz/fuzz_reader.py``, mutations drawn from a seeded
``random.Random`` per mutant index, so that any mutant can be rebuilt from its index).

A mutation is a list of plain tuples applied in order to one of a few valid base files:

* ``("flip", offset, value)``: set one byte (anywhere: header fields, reserved bytes, slots);
* ``("field", name, value)``: set a header field to a value, typically an extreme one;
* ``("shape", batch_size, seq_len, num_batches)``: set the three shape fields at once, so that
  combinations of extreme values (a huge shape with no batches) are as likely as single ones;
* ``("magic", value)``: replace the 8 magic bytes;
* ``("truncate", length)``: cut the file to ``length`` bytes;
* ``("append", count, byte)``: append ``count`` copies of ``byte``;
* ``("fit", byte, fix_records)``: resize the file to the size its header declares (when that is
  at most ``FIT_LIMIT``), filling new bytes with ``byte``, and with ``fix_records`` raise
  ``total_records`` to what the header needs, so that odd headers also reach the valid side.

The oracle (``check``) reads the mutant through every public entry point and accepts exactly two
outcomes: the reader raises a ``FormatError`` whose code is the one ``zerobatch_spec``'s
reference rules give, or it serves every batch with the bytes the spec places there. Deep
validation, the conformance probe and the spec must agree on top. Any other exception escapes
to the caller, which counts it as a defect.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import xxhash
from zerobatch_conformance.dataset_files import HEAD_FIELDS, RECORD_FIELDS
from zerobatch_conformance.generate import assemble, pseudo_tokens
from zerobatch_conformance.probe import describe_batch_file
from zerobatch_spec import (
    DTYPE_UINT16,
    DTYPE_UINT32,
    FIELD_OFFSETS,
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    RESERVED_OFFSET,
    TOKEN_DTYPES,
    U32_MAX,
    U64_MAX,
    ErrorCode,
    Header,
    batch_offset,
    expected_file_size,
    find_violation,
    parse_header,
)
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME, Source, bytes_xxh3
from zerobatch_spec.index import (
    HEAD,
    HEAD_SIZE,
    INDEX_NAME,
    PAGE_ENTRY,
    RECORD,
    RECORD_SIZE,
    RUN,
    top_size,
)

from zerobatch_core import BatchFileReader, FormatError, ZeroBatchError, validate_file

Op = tuple[Any, ...]

FIT_LIMIT = 1 << 20
"""``fit`` leaves files alone whose header declares more than this many bytes."""

FIELD_BYTES: dict[str, int] = {sub.name: sub.sizeof() for sub in HEADER_STRUCT.subcons}
NUMERIC_FIELDS = tuple(name for name in FIELD_BYTES if name not in ("magic", "reserved"))

U32_EXTREMES = (
    0,
    1,
    2,
    3,
    4,
    1023,
    1024,
    1025,
    4095,
    4096,
    2**16,
    2**31 - 1,
    2**31,
    U32_MAX - 1,
    U32_MAX,
)
U64_EXTREMES = (
    0,
    1,
    2,
    3,
    U32_MAX,
    2**32,
    2**52 + 2,
    2**53 + 1,
    2**62,
    2**63 - 1,
    2**63,
    U64_MAX - 1,
    U64_MAX,
)
MAGICS = (b"LLMBATCX", b"llmbatch", bytes(8), b"LLMBATC\x00", b"\x00LLMBATC", b"BATCHLLM")
DTYPE_VALUES = (DTYPE_UINT32, DTYPE_UINT16, 2, 3, 256, 257, 65536, 65537, 2**31, U32_MAX)
"""Values the dtype field is set to: both defined codes, and codes whose low byte or low 16 bits
are a defined one (a reader of part of the field would accept them)."""


def _base(batch_size: int, seq_len: int, total: int, seed: int, dtype: int = 0) -> bytes:
    nb = total // batch_size
    records = pseudo_tokens(total * seq_len, salt=seed, dtype=dtype).reshape(total, seq_len)
    return assemble(Header(batch_size, seq_len, nb, seed, total, dtype=dtype), records)


BASES: tuple[bytes, ...] = (
    _base(2, 3, 5, 1),  # padding, a dropped record
    _base(4, 256, 8, 2),  # exactly one page per batch, no padding
    _base(5, 300, 5, 3),  # 6000 token bytes padded to 8192
    _base(1, 1, 3, 4),  # one token per batch
    _base(3, 5, 2, 5),  # no batches: the header alone
    _base(8, 512, 8, 6),  # 16 KiB, no padding
    _base(2, 4, 9, 7),  # four batches, one dropped record
    # dtype 1 (uint16 tokens)
    _base(2, 3, 5, 8, DTYPE_UINT16),  # padding: one page as either dtype
    _base(2, 1024, 4, 9, DTYPE_UINT16),  # exactly one page, no padding (two as uint32)
    _base(5, 600, 5, 10, DTYPE_UINT16),  # 6000 token bytes padded to 8192 (12288 as uint32)
    _base(3, 5, 2, 11, DTYPE_UINT16),  # no batches: the header alone
    _base(8, 1024, 8, 12, DTYPE_UINT16),  # 16 KiB, no padding
    _base(1, 1, 3, 13, DTYPE_UINT16),  # one token per batch
)
"""Valid files written per the spec (``zerobatch_conformance.generate.assemble``), of both
dtypes."""

U16_BASES = tuple(i for i, data in enumerate(BASES) if parse_header(data[:HEADER_SIZE]).dtype)
"""The indices of the dtype 1 bases."""


def sizing(h: Header) -> Header:
    """``h`` as far as sizes go: a header with an undefined dtype sized as dtype 0 (rule 4
    rejects it whatever its size; a mutation still wants a size to aim at)."""
    return h if h.dtype in TOKEN_DTYPES else dataclasses.replace(h, dtype=DTYPE_UINT32)


def set_field(data: bytearray, name: str, value: int) -> None:
    """Write header field ``name`` little-endian at its offset (the file grows if needed)."""
    width, at = FIELD_BYTES[name], FIELD_OFFSETS[name]
    if len(data) < at + width:
        data.extend(bytes(at + width - len(data)))
    data[at : at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")


def declared_size(data: bytes | bytearray) -> int | None:
    """The size the header declares, or ``None`` without a full header or with a zero shape."""
    if len(data) < HEADER_SIZE:
        return None
    h = parse_header(bytes(data[:HEADER_SIZE]))
    if h.batch_size == 0 or h.seq_len == 0:
        return None
    return sizing(h).file_size


def edit_bytes(data: bytearray, op: Sequence[Any]) -> bool:
    """Apply a byte-level mutation to ``data`` in place: ``("flip", offset, value)`` sets a
    byte (when there is one), ``("truncate", length)`` cuts, ``("append", count, byte)``
    appends; ``False`` (and nothing done) for any other op. The formats' own ops (and a
    tree's ops, less the file's name) use it."""
    kind = op[0]
    if kind == "flip":
        if op[1] < len(data):
            data[op[1]] = op[2]
    elif kind == "truncate":
        del data[op[1] :]
    elif kind == "append":
        data.extend(bytes([op[2]]) * op[1])
    else:
        return False
    return True


def apply_bytes(base: bytes, ops: Sequence[Op], edit: Callable[[bytearray, Op], bool]) -> bytes:
    """``ops`` applied to ``base`` in order: byte-level ones by ``edit_bytes``, the format's own
    by ``edit`` (which returns ``False`` for an op it does not know)."""
    data = bytearray(base)
    for op in ops:
        if not (edit_bytes(data, op) or edit(data, op)):
            raise ValueError(f"unknown mutation {op!r}")
    return bytes(data)


def _edit_header(data: bytearray, op: Op) -> bool:
    """The header's mutations (``field``, ``shape``, ``magic``, ``fit``) of ``data``."""
    kind = op[0]
    if kind == "field":
        set_field(data, op[1], op[2])
    elif kind == "shape":
        for name, value in zip(("batch_size", "seq_len", "num_batches"), op[1:], strict=True):
            set_field(data, name, value)
    elif kind == "magic":
        if len(data) < len(MAGIC):
            data.extend(bytes(len(MAGIC) - len(data)))
        data[: len(MAGIC)] = op[1]
    elif kind == "fit":
        size = declared_size(data)
        if size is not None and size <= FIT_LIMIT:
            if len(data) > size:
                del data[size:]
            else:
                data.extend(bytes([op[1]]) * (size - len(data)))
            if op[2]:
                h = parse_header(bytes(data[:HEADER_SIZE]))
                need = h.num_batches * h.batch_size
                if h.total_records < need <= U32_MAX:
                    set_field(data, "total_records", need)
    else:
        return False
    return True


def apply(base: bytes, ops: list[Op]) -> bytes:
    """The mutant: ``ops`` applied to ``base`` in order."""
    return apply_bytes(base, ops, _edit_header)


# -- random mutations (the standalone run) --------------------------------------------------


def _field_value(rng: random.Random, name: str, data: bytes) -> int:
    current = (
        int.from_bytes(data[FIELD_OFFSETS[name] :][: FIELD_BYTES[name]], "little")
        if len(data) >= FIELD_OFFSETS[name] + FIELD_BYTES[name]
        else 0
    )
    width = FIELD_BYTES[name] * 8
    roll = rng.random()
    if name == "dtype" and roll < 0.5:
        # a quarter of dtype mutations the other defined code (the file read with the other
        # token width), a quarter one of the listed codes
        other = DTYPE_UINT16 if current == DTYPE_UINT32 else DTYPE_UINT32
        value = other if roll < 0.25 else rng.choice(DTYPE_VALUES)
    elif roll < 0.6:
        value = rng.choice(U64_EXTREMES if width == 64 else U32_EXTREMES)
    elif roll < 0.75:
        value = current + rng.choice((-2, -1, 1, 2))
    elif roll < 0.85 and name == "num_batches" and len(data) >= HEADER_SIZE:
        # A count whose 64-bit product with the slot size wraps to (nearly) the real body size.
        h = sizing(parse_header(data[:HEADER_SIZE]))
        pad = max(h.padded_batch_bytes, 1)
        value = (1 << 64) // pad * rng.randrange(1, 4) + h.num_batches + rng.choice((-1, 0, 1))
    else:
        value = rng.getrandbits(width)
    return value % (1 << width)


def random_op(rng: random.Random, data: bytes) -> Op:
    """One mutation of ``data``, weighted towards the header and the rules' edge values."""
    roll = rng.random()
    n = len(data)
    if roll < 0.25:
        name = rng.choice(NUMERIC_FIELDS)
        return ("field", name, _field_value(rng, name, data))
    if roll < 0.33:
        sizes = (0, 1, 2, 3) * 3 + tuple(_field_value(rng, "num_batches", data) for _ in range(3))
        return (
            "shape",
            _field_value(rng, "batch_size", data),
            _field_value(rng, "seq_len", data),
            rng.choice(sizes),
        )
    if roll < 0.50:
        where = rng.random()
        if where < 0.5:
            offset = rng.randrange(RESERVED_OFFSET)
        elif where < 0.7:
            offset = rng.randrange(RESERVED_OFFSET, HEADER_SIZE)
        else:
            offset = rng.randrange(max(n, 1))
        old = data[offset] if offset < n else 0
        value = old ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
        return ("flip", offset, value)
    if roll < 0.55:
        return ("magic", rng.choice(MAGICS))
    if roll < 0.70:
        length = rng.choice(
            (0, 1, 7, 8, 39, 40, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, n - 1, n - 4096)
            + (rng.randrange(n + 1),) * 4
        )
        return ("truncate", max(0, length))
    if roll < 0.80:
        count = rng.choice((1, 3, 4, 4095, 4096, 4097, 8192, rng.randrange(1, 9000)))
        return ("append", count, 0 if rng.random() < 0.6 else rng.randrange(1, 256))
    return ("fit", 0 if rng.random() < 0.8 else rng.randrange(1, 256), rng.random() < 0.7)


T = TypeVar("T")


def draw(
    rng: random.Random,
    bases: Sequence[T],
    random_op: Callable[[random.Random, T], Op],
    apply: Callable[[T, list[Op]], T],
    counts: Sequence[int] = (1, 1, 2, 2, 3, 4),
    last: Callable[[random.Random, list[Op], T], Op | None] | None = None,
) -> tuple[int, list[Op], T]:
    """A mutant drawn with ``rng`` (every fuzzer's ``random_mutant``): a base, then
    ``rng.choice(counts)`` ops, each drawn from the mutant so far and applied to it, then the
    op ``last`` draws, if any. Returns the base's index, the ops and the mutant."""
    base = rng.randrange(len(bases))
    mutant = bases[base]
    ops: list[Op] = []
    for _ in range(rng.choice(counts)):
        op = random_op(rng, mutant)
        ops.append(op)
        mutant = apply(mutant, [op])
    final = last(rng, ops, mutant) if last is not None else None
    if final is not None:
        ops.append(final)
        mutant = apply(mutant, [final])
    return base, ops, mutant


def random_mutant(seed: int, index: int) -> tuple[int, list[Op], bytes]:
    """Mutant ``index`` of run ``seed``: its base, its ops and its bytes (deterministic)."""
    rng = random.Random((seed << 40) ^ index)
    return draw(rng, BASES, random_op, apply, (1, 1, 1, 2, 2, 3, 4))


# -- the oracle -----------------------------------------------------------------------------


def padding_fault(data: bytes, h: Header) -> int | None:
    """Index of the first batch whose slot padding has a non-zero byte, straight from bytes."""
    raw, padded = h.raw_batch_bytes, h.padded_batch_bytes
    if raw == padded:
        return None
    for i in range(h.num_batches):
        start = batch_offset(i, h.batch_size, h.seq_len, h.dtype)
        if any(data[start + raw : start + padded]):
            return i
    return None


def check(path: str, data: bytes) -> str:
    """Read the mutant at ``path`` (holding ``data``) every way; return its outcome.

    The outcome is ``"valid"``, ``"valid-deep-invalid"`` (rules 1-8 pass, padding is not zero)
    or the code of the first broken rule. Raises ``AssertionError`` when ZeroBatch disagrees
    with the spec's reference (``zerobatch_spec.find_violation``) or with itself; lets any
    exception that is not a ``ZeroBatchError`` escape.
    """
    expected = find_violation(data[:HEADER_SIZE], len(data))
    try:
        with BatchFileReader(path) as r:
            r.check_size()
            h = r.header
            assert r.token_dtype == TOKEN_DTYPES[h.dtype], "served dtype is not the header's"
            for i in range(len(r)):
                start = batch_offset(i, h.batch_size, h.seq_len, h.dtype)
                batch = r.read_batch(i)
                assert batch.dtype == r.token_dtype, f"batch {i} is {batch.dtype}"
                got = batch.tobytes()
                assert got == data[start : start + h.raw_batch_bytes], f"batch {i} bytes differ"
            if len(r):
                assert r.read_batches(0, len(r)).shape == (len(r), h.batch_size, h.seq_len)
                wide = r.read_batch_int32(-1)
                assert wide.dtype == np.int32
                if h.dtype == DTYPE_UINT32:  # a bit-cast view of the same bytes
                    assert wide.tobytes() == r.read_batch(-1).tobytes()
                else:  # uint16 widened: the same values, exactly
                    assert np.array_equal(wide, r.read_batch(-1))
                assert np.array_equal(r.read_batch_int64(0), r.read_batch(0))
    except FormatError as e:
        assert expected is not None, f"reader rejected a valid file: {e}"
        assert e.code is expected.code, f"reader says {e.code}, the spec {expected.code}"
        outcome = e.code.value
    except ZeroBatchError as e:
        raise AssertionError(f"reader raised {type(e).__name__} on a regular file: {e}") from e
    else:
        assert expected is None, f"reader accepted a file the spec rejects: {expected}"
        outcome = "valid"

    report = validate_file(path, deep=True)
    answer = describe_batch_file(path)
    if expected is not None:
        assert not report.valid and report.code is expected.code, report
        assert answer == {"valid": False, "error": expected.code.value}, answer
        return outcome
    h = parse_header(data[:HEADER_SIZE])
    bad = padding_fault(data, h)
    if bad is None:
        assert report.valid, report
        assert answer["valid"] is True and answer["header"] == h.as_dict(), answer
        assert answer["padded_batch_bytes"] == h.padded_batch_bytes
        assert len(answer["batch_sha256"]) == h.num_batches
        if h.num_batches:
            raw = h.raw_batch_bytes
            start = batch_offset(h.num_batches - 1, h.batch_size, h.seq_len, h.dtype)
            last = hashlib.sha256(data[start : start + raw]).hexdigest()
            assert answer["batch_sha256"][-1] == last
        return outcome
    assert not report.valid and report.code is ErrorCode.NONZERO_PADDING, report
    assert report.detail is not None and report.detail.startswith(f"batch {bad}:"), report
    assert answer == {"valid": False, "error": ErrorCode.NONZERO_PADDING.value}, answer
    return "valid-deep-invalid"


# == dataset directories and live datasets ======================================================
#
# The metadata fuzzers (``fuzz_datasets.py``, ``fuzz_live.py``) mutate a small valid *tree*: a
# dataset directory (``manifest.json``, ``checksums.xxh3``, shards) or a local live dataset
# (``live.json``, manifest versions, segments, batch objects, watermarks). A tree is its regular
# files' bytes by relative path plus *special* entries (a FIFO, a symbolic link, a directory in
# place of a file). A mutation is a JSON-serialisable tuple, so a mutant can be saved, read back
# and replayed (``--replay``):
#
# * ``("set", file, path, value)``: set the JSON value at ``path`` (keys and list indices) of
#   ``file`` to ``value`` (an extreme integer, another type, a hostile name, ...);
# * ``("drop", file, path)``: remove that key or list item;
# * ``("dup", file, path)``: duplicate a list item in place, or a key in its object's text
#   (strict JSON readers must refuse a key given twice);
# * ``("swap", file, path, i, j)``: swap two items of a list;
# * ``("fit", shard, n)``: shard ``shard`` of a dataset manifest claims ``n`` slots (``"max"``:
#   the most a u32 ``total_records`` allows), with the ``size`` and ``total_records`` that make
#   the entry consistent (so that huge counts pass the manifest's own rules and reach the code
#   that sizes memory from them);
# * ``("shape", batch_size, seq_len)``: a dataset manifest's shape, every shard's size refit;
# * ``("dtype", value, refit)``: a dataset manifest's ``dtype`` set (``None``: removed), with
#   ``refit`` every shard's size recomputed for it, so that only the shards' headers tell;
# * ``("fixsums",)``: the manifest's ``checksums.xxh3`` digest set to the checksums file's, so
#   that a mutated checksums file reaches the slot checks;
# * ``("flip", file, offset, value)``, ``("truncate", file, length)``,
#   ``("append", file, count, byte)``, ``("resize", file, length)``: bytes;
# * ``("fifo", file)``, ``("symlink", file, target)``, ``("dir", file)``, ``("remove", file)``:
#   the file replaced by a FIFO, a link, a directory, or nothing;
# * ``("copy", source, file)``: another file with ``source``'s bytes (a stray object);
# * version 2 datasets, the shard index (``SPEC.md`` section 23) named by the manifest:
#   ``("ihead", field, value, seal)`` a head field, ``("irun", k, column, value, seal)`` a run's
#   shard or slot count, ``("itable", p, column, value, seal)`` a page table entry's offset,
#   length or digest, ``("irecord", shard, field, value, seal)`` a field of a shard's record,
#   ``("iname", shard, name, seal)`` a name appended to the last page and the shard's record
#   pointed at it, ``("islots", n)`` every run's shards claiming ``n`` slots each (the head and
#   the manifest agreeing, sealed: huge consistent counts reach the code that sizes memory from
#   them); with ``seal`` (and ``("iseal", pages)``) the digests above the edit are recomputed
#   (each page's with ``pages``, the top's, the manifest's ``index.size`` and ``index.xxh3``),
#   so that the edit reaches the checks behind them;
# * live only: ``("ahead", delta, batches, start, offset)``: a new manifest version ``delta``
#   past the newest, valid on its own (no segments, no tail) but claiming ``batches``,
#   ``start`` and producer offsets ``offset``: the crafted far-ahead version;
#   ``("shrink", drop)``: a next version that lists ``drop`` fewer tail entries;
#   ``("mark", consumer, batch)``: a watermark object; ``("record", samples, batch_size,
#   foreign)``: ``record_watermark`` called with a hostile state (``foreign``: another
#   dataset's identity), keeping one watermark, as checkpoint rotation does;
#   ``("ldtype", value)``: ``live.json``'s ``dtype`` set (``None``: removed).

Tree = tuple[dict[str, bytes], dict[str, tuple[str, str]]]
"""A mutant tree: regular files' bytes by relative path, and special entries by relative path
(``("fifo", "")``, ``("symlink", target)``, ``("dir", "")``)."""

JSON_INTS = (
    -1,
    0,
    1,
    2,
    4095,
    4096,
    2**31 - 1,
    2**31,
    U32_MAX,
    2**32,
    2**40,
    2**52 + 1,
    2**62,
    2**63 - 1,
    2**63,
    U64_MAX,
    2**64,
    -(2**63),
    10**30,
)
"""Integers a JSON field is set to: the boundaries of every range the documents use."""

JSON_OTHERS: tuple[Any, ...] = (None, True, False, 1.0, 1e308, "1", "", "x" * 300, [], {}, [1, 2])
"""Values of another type."""

HOSTILE_NAMES = (
    "../outside.batch",
    "/dev/zero",
    "/etc/hostname",
    "a/b.batch",
    ".",
    "..",
    "",
    "a b.batch",
    "\u00e9.batch",
    "a\\b.batch",
    "a\nb.batch",
    "x" * 255,
    "x" * 256,
    "checksums.xxh3",
    "manifest.json",
    "shard-00000.batch",
    "~root",
    ".hidden.batch",
)
"""Shard names a crafted manifest may give: traversal, absolute, odd characters, metadata."""

LINK_TARGETS = ("../outside.batch", "/dev/zero", "/dev/null", ".", "missing.batch")
"""Where a symbolic link in a dataset may point (``../outside.batch`` is a valid LLMBATCH file
beside the dataset directory)."""


def _load_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return _INVALID


_INVALID = object()


def _dump_json(obj: Any) -> bytes:
    return (json.dumps(obj) + "\n").encode("utf-8")


def json_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``obj`` (the root excluded), depth first."""
    out: list[tuple[Any, ...]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.append((*prefix, key))
            out.extend(json_paths(value, (*prefix, key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out.append((*prefix, i))
            out.extend(json_paths(value, (*prefix, i)))
    return out


def _parent(obj: Any, path: Sequence[Any]) -> Any:
    for key in path[:-1]:
        if not _has(obj, key):
            return None
        obj = obj[key]
    return obj


def _has(parent: Any, key: Any) -> bool:
    if isinstance(parent, dict):
        return key in parent
    return isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent)


def _edit_json(files: dict[str, bytes], name: str, edit: Any) -> None:
    """Apply ``edit(obj) -> text or None`` to file ``name``'s JSON; a file that is not JSON,
    or an edit that does not apply, leaves the bytes as they are."""
    if name not in files:
        return
    obj = _load_json(files[name])
    if obj is _INVALID:
        return
    out = edit(obj)
    if out is not None:
        files[name] = out


def _set(obj: Any, op: Op) -> bytes | None:
    parent, key = _parent(obj, op[2]), op[2][-1]
    if not _has(parent, key):
        return None
    parent[key] = op[3]
    return _dump_json(obj)


def _drop(obj: Any, op: Op) -> bytes | None:
    parent, key = _parent(obj, op[2]), op[2][-1]
    if not _has(parent, key):
        return None
    del parent[key]
    return _dump_json(obj)


def _dup(obj: Any, op: Op) -> bytes | None:
    parent, key = _parent(obj, op[2]), op[2][-1]
    if not _has(parent, key):
        return None
    if isinstance(parent, list):
        parent.insert(key, parent[key])
        return _dump_json(obj)
    # A key twice in one object: the first occurrence of ``"key": value`` in the text, again.
    text = json.dumps(obj)
    pair = json.dumps({key: parent[key]})[1:-1]
    at = text.find(pair)
    return None if at < 0 else (text[: at + len(pair)] + ", " + text[at:] + "\n").encode()


def _swap(obj: Any, op: Op) -> bytes | None:
    items, i, j = _parent(obj, (*op[2], 0)), op[3], op[4]
    if not isinstance(items, list) or not (0 <= i < len(items) and 0 <= j < len(items)):
        return None
    items[i], items[j] = items[j], items[i]
    return _dump_json(obj)


def _manifest_dtype(obj: Any) -> int:
    """The dtype code a manifest's sizes are computed with: its ``dtype`` when that is a defined
    code, else 0 (a manifest with another ``dtype`` is refused whatever its sizes)."""
    code = obj.get("dtype", DTYPE_UINT32) if isinstance(obj, dict) else DTYPE_UINT32
    return code if type(code) is int and code in TOKEN_DTYPES else DTYPE_UINT32


def _fit_entry(entry: Any, b: int, t: int, n: int, dtype: int = DTYPE_UINT32) -> None:
    """Make a shard entry of ``n`` slots consistent with shape ``b`` x ``t`` and dtype code
    ``dtype``: its size, enough records, and a records range that spans them."""
    entry["size"] = expected_file_size(b, t, n, dtype)
    entry["total_records"] = max(int(entry["total_records"]), n * b)
    if entry.get("records") is not None:
        first = int(entry["records"][0])
        entry["records"] = [first, first + entry["total_records"]]


def _fit_shard(obj: Any, shard: int, n: int | str) -> bytes | None:
    try:
        entry = obj["shards"][shard]
        b, t = int(obj["batch_size"]), int(obj["seq_len"])
        # "max": the most slots total_records (a u32) allows at this batch size.
        n = U32_MAX // max(b, 1) if n == "max" else int(n)
        entry["num_batches"] = n
        _fit_entry(entry, b, t, n, _manifest_dtype(obj))
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return _dump_json(obj)


def _shape(obj: Any, b: int, t: int) -> bytes | None:
    try:
        obj["batch_size"], obj["seq_len"] = b, t
        for entry in obj["shards"]:
            _fit_entry(entry, b, t, int(entry["num_batches"]), _manifest_dtype(obj))
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return _dump_json(obj)


def _dtype(obj: Any, value: Any, refit: bool) -> bytes | None:
    """A manifest's ``dtype`` set to ``value`` (``None``: the key removed), and with ``refit``
    every shard's size recomputed for it, so that the shards' own headers must tell."""
    if not isinstance(obj, dict):
        return None
    obj.pop("dtype", None)
    if value is not None:
        obj["dtype"] = value
    if refit:
        try:
            b, t = int(obj["batch_size"]), int(obj["seq_len"])
            for entry in obj["shards"]:
                _fit_entry(entry, b, t, int(entry["num_batches"]), _manifest_dtype(obj))
        except (KeyError, IndexError, TypeError, ValueError):
            pass
    return _dump_json(obj)


def _bytes_op(files: dict[str, bytes], op: Op) -> None:
    kind, name = op[0], op[1]
    if name not in files:
        return
    data = bytearray(files[name])
    if kind == "resize":
        length = max(0, op[2])
        del data[length:]
        data.extend(bytes(length - len(data)))
    else:
        edit_bytes(data, (kind, *op[2:]))
    files[name] = bytes(data)


def apply_tree(tree: Tree, ops: Sequence[Op]) -> Tree:
    """The mutant: ``ops`` applied in order to a copy of ``tree`` (live-only ops excepted:
    ``apply_live`` handles those)."""
    files, special = dict(tree[0]), dict(tree[1])
    for op in ops:
        kind = op[0]
        if kind == "set":
            _edit_json(files, op[1], lambda obj, op=op: _set(obj, op))
        elif kind == "drop":
            _edit_json(files, op[1], lambda obj, op=op: _drop(obj, op))
        elif kind == "dup":
            _edit_json(files, op[1], lambda obj, op=op: _dup(obj, op))
        elif kind == "swap":
            _edit_json(files, op[1], lambda obj, op=op: _swap(obj, op))
        elif kind == "fit":
            _edit_json(files, MANIFEST_NAME, lambda obj, op=op: _fit_shard(obj, op[1], op[2]))
        elif kind == "shape":
            _edit_json(files, MANIFEST_NAME, lambda obj, op=op: _shape(obj, op[1], op[2]))
        elif kind == "dtype":
            _edit_json(files, MANIFEST_NAME, lambda obj, op=op: _dtype(obj, op[1], op[2]))
        elif kind == "fixsums":
            digest = bytes_xxh3(files.get(CHECKSUMS_NAME, b""))

            def fix(obj: Any, digest: str = digest) -> bytes | None:
                if not isinstance(obj, dict) or not isinstance(obj.get("checksums"), dict):
                    return None
                obj["checksums"]["xxh3"] = digest
                return _dump_json(obj)

            _edit_json(files, MANIFEST_NAME, fix)
        elif kind in ("flip", "truncate", "append", "resize"):
            _bytes_op(files, op)
        elif kind in ("fifo", "symlink", "dir", "remove"):
            files.pop(op[1], None)
            special.pop(op[1], None)
            if kind != "remove":
                special[op[1]] = (kind, op[2] if kind == "symlink" else "")
        elif kind == "copy":
            if op[1] in files:
                files[op[2]] = files[op[1]]
        elif kind in INDEX_OPS:
            _index_op(files, op)
        elif kind not in LIVE_OPS:
            raise ValueError(f"unknown mutation {op!r}")
    return files, special


# -- version 2: the shard index ---------------------------------------------------------------


def _layout(st: struct.Struct, names: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Each field of a little-endian struct: its offset and its ``struct`` code."""
    out: dict[str, tuple[int, str]] = {}
    at = 0
    codes = re.findall(r"(\d*)([a-zA-Z])", st.format[1:])
    for name, (count, code) in zip(names, codes, strict=True):
        one = f"<{count}{code}"
        out[name] = (at, one)
        at += struct.calcsize(one)
    return out


HEAD_LAYOUT = _layout(HEAD, (*HEAD_FIELDS, "top_xxh3"))
"""Offset and code of each field of an index head."""
RECORD_LAYOUT = _layout(RECORD, RECORD_FIELDS)
"""Offset and code of each field of a shard record."""
INDEX_FIELDS = tuple(n for n in HEAD_LAYOUT if n not in ("magic", "reserved", "top_xxh3"))
"""Head fields set to extreme integers."""


def _index_name(files: dict[str, bytes]) -> str | None:
    """The index's name as the manifest gives it (a version 2 manifest), else ``None``."""
    doc = _load_json(files.get(MANIFEST_NAME, b""))
    ref = doc.get("index") if isinstance(doc, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) and name in files else None


def _put(data: bytearray, at: int, code: str, value: Any) -> None:
    """Set the field of ``code`` at ``at`` (nothing outside the data), a number masked to its
    width."""
    size = struct.calcsize(code)
    if at < 0 or at + size > len(data):
        return
    if code.endswith("s"):
        raw = bytes(value) if isinstance(value, (bytes, bytearray, list)) else str(value).encode()
        data[at : at + size] = raw[:size].ljust(size, b"\0")
    else:
        data[at : at + size] = (int(value) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _get(data: bytes | bytearray, at: int, size: int) -> int | None:
    return int.from_bytes(data[at : at + size], "little") if at + size <= len(data) else None


def _page_entry(data: bytes | bytearray, page: int) -> int | None:
    """Offset in the index of page ``page``'s entry in the page table (``None`` if none)."""
    runs, pages = (
        _get(data, HEAD_LAYOUT["run_count"][0], 8),
        _get(data, HEAD_LAYOUT["page_count"][0], 8),
    )
    if runs is None or pages is None or not 0 <= page < pages:
        return None
    at = HEAD_SIZE + runs * RUN.size + page * PAGE_ENTRY.size
    return at if at + PAGE_ENTRY.size <= len(data) else None


def _record_at(data: bytes | bytearray, shard: int) -> int | None:
    """Offset in the index of shard ``shard``'s record, by its page's table entry."""
    per = _get(data, HEAD_LAYOUT["page_records"][0], 4)
    if not per:
        return None
    entry = _page_entry(data, shard // per)
    if entry is None:
        return None
    offset = _get(data, entry, 8)
    return None if offset is None else offset + (shard % per) * RECORD_SIZE


def seal_index(files: dict[str, bytes], pages: bool) -> None:
    """Recompute the digests above whatever the index holds: each page's (``pages``), the
    top's, and the manifest's ``index.size`` and ``index.xxh3``; parts that do not fit the
    file are left as they are."""
    name = _index_name(files)
    if name is None:
        return
    data = bytearray(files[name])
    top = top_size(bytes(data[:HEAD_SIZE]))
    if top is not None and top <= len(data):
        count = _get(data, HEAD_LAYOUT["page_count"][0], 8) or 0
        for page in range(count if pages else 0):
            entry = _page_entry(data, page)
            if entry is None:
                break
            offset, length = _get(data, entry, 8) or 0, _get(data, entry + 8, 8) or 0
            if offset + length <= len(data):
                _put(
                    data,
                    entry + 16,
                    "<Q",
                    xxhash.xxh3_64_intdigest(bytes(data[offset : offset + length])),
                )
        digest = xxhash.xxh3_64_intdigest(bytes(data[: HEAD_SIZE - 8] + data[HEAD_SIZE:top]))
        _put(data, HEAD_SIZE - 8, "<Q", digest)
    files[name] = bytes(data)
    stated = _get(data, HEAD_SIZE - 8, 8)

    def fix(obj: Any) -> bytes | None:
        ref = obj.get("index") if isinstance(obj, dict) else None
        if not isinstance(ref, dict):
            return None
        ref["size"] = len(data)
        if stated is not None:
            ref["xxh3"] = f"{stated:016x}"
        return _dump_json(obj)

    _edit_json(files, MANIFEST_NAME, fix)


def _index_op(files: dict[str, bytes], op: Op) -> None:
    """Apply an index mutation (``ihead``, ``irun``, ``itable``, ``irecord``, ``iname``,
    ``islots``, ``iseal``) to the index the manifest names, if it has one."""
    kind = op[0]
    if kind == "iseal":
        seal_index(files, bool(op[1]))
        return
    name = _index_name(files)
    if name is None:
        return
    data = bytearray(files[name])
    seal = bool(op[-1]) if kind != "islots" else True
    if kind == "ihead":
        at, code = HEAD_LAYOUT[op[1]]
        _put(data, at, code, op[2])
    elif kind == "irun":
        _put(data, HEAD_SIZE + op[1] * RUN.size + 8 * op[2], "<Q", op[3])
    elif kind == "itable":
        entry = _page_entry(data, op[1])
        if entry is not None:
            _put(data, entry + 8 * op[2], "<Q", op[3])
    elif kind == "irecord":
        at = _record_at(data, op[1])
        if at is not None:
            offset, code = RECORD_LAYOUT[op[2]]
            _put(data, at + offset, code, op[3])
    elif kind == "iname":
        at, count = _record_at(data, op[1]), _get(data, HEAD_LAYOUT["page_count"][0], 8) or 0
        entry = _page_entry(data, count - 1)
        if at is not None and entry is not None:
            start, length = _get(data, entry, 8) or 0, _get(data, entry + 8, 8) or 0
            raw = str(op[2]).encode("utf-8", "surrogateescape")
            if start <= at < start + length and start + length == len(data):
                _put(data, at + RECORD_LAYOUT["name_offset"][0], "<I", length)
                _put(data, at + RECORD_LAYOUT["name_length"][0], "<I", len(raw))
                _put(data, entry + 8, "<Q", length + len(raw))
                data += raw
    elif kind == "islots":
        shards = _get(data, HEAD_LAYOUT["shard_count"][0], 8)
        runs = _get(data, HEAD_LAYOUT["run_count"][0], 8)
        if shards and runs and HEAD_SIZE + runs * RUN.size <= len(data):
            n = int(op[1])  # every run's shards of n slots each
            for k in range(runs):
                _put(data, HEAD_SIZE + k * RUN.size + 8, "<Q", n)
            _put(data, HEAD_LAYOUT["num_batches"][0], "<Q", shards * n)

            def claim(obj: Any, total: int = shards * n) -> bytes | None:
                if not isinstance(obj, dict):
                    return None
                obj["num_batches"] = total
                return _dump_json(obj)

            _edit_json(files, MANIFEST_NAME, claim)
    files[name] = bytes(data)
    if seal:
        seal_index(files, True)


def random_index_op(rng: random.Random, files: dict[str, bytes]) -> Op:
    """One mutation of a version 2 dataset's index (its manifest names one)."""
    seal = rng.random() < 0.7
    data = files.get(_index_name(files) or "", b"")
    shards = _get(data, HEAD_LAYOUT["shard_count"][0], 8) or 1
    runs = _get(data, HEAD_LAYOUT["run_count"][0], 8) or 1
    shard = rng.randrange(min(shards, 1 << 16) + 1)
    roll = rng.random()
    if roll < 0.22:
        field = rng.choice(INDEX_FIELDS)
        value = rng.choice((*U64_EXTREMES, *U32_EXTREMES, 1, 2, 64, 65536, 65537))
        if rng.random() < 0.1:
            return ("ihead", "magic", rng.choice((b"ZBSHARDX", bytes(8))), seal)
        if rng.random() < 0.05:
            return ("ihead", "reserved", [1], seal)
        return ("ihead", field, value, seal)
    if roll < 0.36:
        value = rng.choice((*U64_EXTREMES, 1, 2, 3))
        return ("irun", rng.randrange(min(runs, 1 << 16) + 1), rng.randrange(2), value, seal)
    if roll < 0.48:
        value = rng.choice((*U64_EXTREMES, rng.randrange(len(data) + 2)))
        return ("itable", rng.randrange(2), rng.randrange(3), value, seal)
    if roll < 0.75:
        field = rng.choice(RECORD_FIELDS)
        value = rng.choice((*U64_EXTREMES, *U32_EXTREMES))
        return ("irecord", shard, field, value, seal)
    if roll < 0.88:
        name = rng.choice((*HOSTILE_NAMES, INDEX_NAME, "ok.batch", "shard-00001.batch"))
        return ("iname", shard, name, seal)
    if roll < 0.93:
        return ("islots", rng.choice((0, 1, 2, 3, 1 << 20, U32_MAX - 1, U32_MAX, U32_MAX + 1)))
    return ("iseal", rng.random() < 0.8)


def materialize(tree: Tree, root: str) -> None:
    """Write ``tree`` under the (new, empty) directory ``root``."""
    files, special = tree
    for name, data in files.items():
        path = os.path.join(root, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    for name, (kind, target) in special.items():
        if name in files:  # a later mutation wrote a regular file under that name
            continue
        path = os.path.join(root, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink":
            os.symlink(target, path)
        else:
            os.mkdir(path)


def _int_value(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.75:
        return rng.choice(JSON_INTS)
    if roll < 0.9:
        return rng.choice(JSON_OTHERS)
    return rng.getrandbits(rng.choice((8, 32, 64)))


def _json_op(rng: random.Random, name: str, obj: Any) -> Op | None:
    """A JSON-aware mutation of document ``name`` (``obj``, already parsed)."""
    paths = json_paths(obj)
    if not paths:
        return None
    path = list(rng.choice(paths))
    roll = rng.random()
    if roll < 0.55:
        return ("set", name, path, _int_value(rng))
    if roll < 0.7:
        return ("drop", name, path)
    if roll < 0.85:
        return ("dup", name, path)
    lists = [p for p in paths if isinstance(_parent(obj, (*p, 0)), list)]
    if not lists:
        return ("drop", name, path)
    where = rng.choice(lists)
    n = len(_parent(obj, (*where, 0)))
    if n < 2:
        return ("dup", name, [*where, 0]) if n else ("drop", name, list(where))
    return ("swap", name, list(where), rng.randrange(n), rng.randrange(n))


def _byte_op(rng: random.Random, name: str, data: bytes) -> Op:
    n = len(data)
    roll = rng.random()
    if roll < 0.5:
        offset = rng.randrange(max(n, 1))
        old = data[offset] if offset < n else 0
        value = old ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
        return ("flip", name, offset, value)
    if roll < 0.8:
        return ("truncate", name, rng.choice((0, 1, n // 2, max(0, n - 1), rng.randrange(n + 1))))
    return ("append", name, rng.choice((1, 7, 8, 4096, rng.randrange(1, 300))), rng.randrange(256))


# -- dataset directories ------------------------------------------------------------------


def _dataset_bases() -> tuple[Tree, ...]:
    """Six small valid dataset directories, built by ZeroBatch's own writers (the third of
    uint16 tokens, the last three of manifest version 2, with a shard index, the sixth with
    its names spread over 4 key prefixes), and the valid LLMBATCH file ``outside.batch`` that
    lives beside each (the target of traversal names)."""
    from zerobatch_core import create_dataset, write_batch_file, write_sharded_dataset

    bases: list[Tree] = []
    with tempfile.TemporaryDirectory() as tmp:
        a = os.path.join(tmp, "a")
        records = pseudo_tokens(11 * 8, salt=1).reshape(11, 8)
        write_sharded_dataset(
            a,
            [records],
            batch_size=2,
            seq_len=8,
            shard_batches=2,
            seed=5,
            sources=[Source("in.npy", (0, 11))],
        )
        b = os.path.join(tmp, "b")
        os.makedirs(b)
        for i, (name, rows) in enumerate((("b.batch", 6), ("a.batch", 3))):
            tokens = pseudo_tokens(rows * 300, salt=10 + i).reshape(rows, 300)
            write_batch_file(os.path.join(b, name), tokens, batch_size=3, seed=i)
        create_dataset(b, ["b.batch", "a.batch"], seed=9)
        c = os.path.join(tmp, "c")
        # 4 x 700 uint16 tokens: 5600 bytes padded to 8192 (as uint32, 12288): shards of 2
        # batches and 1 (one record dropped), rows that split over 2 ranks
        write_sharded_dataset(
            c,
            [pseudo_tokens(13 * 700, salt=3, dtype=DTYPE_UINT16).reshape(13, 700)],
            batch_size=4,
            seq_len=700,
            shard_batches=2,
            seed=6,
            sources=[Source("train.bin", (0, 13))],
            dtype="uint16",
        )
        # Version 2 (SPEC.md section 23): the first dataset described by a shard index (2
        # runs, generated names), and the second's files (names in the index's page).
        d = os.path.join(tmp, "d")
        write_sharded_dataset(
            d,
            [records],
            batch_size=2,
            seq_len=8,
            shard_batches=2,
            seed=5,
            sources=[Source("in.npy", (0, 11))],
            manifest_version=2,
        )
        e = os.path.join(tmp, "e")
        os.makedirs(e)
        for name in ("b.batch", "a.batch"):
            shutil.copyfile(os.path.join(b, name), os.path.join(e, name))
        create_dataset(e, ["b.batch", "a.batch"], seed=9, manifest_version=2)
        f = os.path.join(tmp, "f")  # shards 0-shard-00000.batch ... 1-shard-00005.batch
        write_sharded_dataset(
            f,
            [records],
            batch_size=2,
            seq_len=8,
            shard_batches=1,
            seed=7,
            manifest_version=2,
            prefixes=4,
        )
        for root in (a, b, c, d, e, f):
            files = {}
            for name in sorted(os.listdir(root)):
                with open(os.path.join(root, name), "rb") as f:
                    files[name] = f.read()
            bases.append((files, {}))
    return tuple(bases)


OUTSIDE = BASES[0]
"""The bytes of ``outside.batch``, a valid LLMBATCH file beside every dataset mutant."""

dataset_bases = functools.cache(_dataset_bases)
"""The dataset bases (built once per process)."""


def random_dataset_op(rng: random.Random, tree: Tree) -> Op:
    """One mutation of a dataset tree, weighted towards the manifest's numbers and names."""
    files, _ = tree
    manifest = _load_json(files.get(MANIFEST_NAME, b""))
    shards = (
        len(manifest["shards"])
        if isinstance(manifest, dict) and isinstance(manifest.get("shards"), list)
        else 0
    )
    index = _index_name(files)
    if index is not None and rng.random() < 0.45:
        if rng.random() < 0.1:
            return ("set", MANIFEST_NAME, ["index", "name"], rng.choice(HOSTILE_NAMES))
        if rng.random() < 0.15:
            return _byte_op(rng, index, files[index])
        return random_index_op(rng, files)
    roll = rng.random()
    if roll < 0.35 and manifest is not _INVALID:
        op = _json_op(rng, MANIFEST_NAME, manifest)
        if op is not None:
            return op
    if roll < 0.47 and shards:
        n = rng.choice((*JSON_INTS[1:16], rng.randrange(1, 1 << 20), "max", "max"))
        return ("fit", rng.randrange(shards), n)
    if roll < 0.52:
        return ("shape", rng.choice(JSON_INTS[2:12]), rng.choice(JSON_INTS[2:12]))
    if roll < 0.555:
        value = rng.choice((0, 1, 1, 2, 65537, -1, None, "uint16", True, 1.0))
        return ("dtype", value, rng.random() < 0.7)
    if roll < 0.60 and shards:
        return ("set", MANIFEST_NAME, ["shards", rng.randrange(shards), "name"],
                rng.choice(HOSTILE_NAMES))  # fmt: skip
    if roll < 0.66:
        return ("fixsums",)
    if roll < 0.72:
        size = len(files.get(CHECKSUMS_NAME, b""))
        return ("resize", CHECKSUMS_NAME, rng.choice((0, 8, size - 8, size + 8, size * 2, 1 << 16)))
    if roll < 0.86:
        name = rng.choice((MANIFEST_NAME, MANIFEST_NAME, CHECKSUMS_NAME))
        return _byte_op(rng, name, files.get(name, b""))
    shard_names = sorted(n for n in files if n.endswith(".batch"))
    name = rng.choice((MANIFEST_NAME, CHECKSUMS_NAME, *shard_names, *([index] if index else [])))
    roll = rng.random()
    if roll < 0.4:
        return ("symlink", name, rng.choice(LINK_TARGETS))
    if roll < 0.55:
        return ("fifo", name)
    if roll < 0.7:
        return ("dir", name)
    if roll < 0.85 or not shard_names:  # an earlier op may have removed every shard
        return ("remove", name)
    return ("copy", rng.choice(shard_names), rng.choice(("extra.batch", "shard-99999.batch")))


def _fixsums(rng: random.Random, ops: list[Op], tree: Tree) -> Op | None:
    """Let odd checksums reach the slots: the manifest's digest refitted, now and then; and
    (version 2) an index edited byte by byte sealed again, so that it reaches the checks
    behind its digests."""
    if _index_name(tree[0]) is not None and rng.random() < 0.3 and ops[-1][0] != "iseal":
        return ("iseal", rng.random() < 0.7)
    return ("fixsums",) if rng.random() < 0.3 and ops[-1][0] != "fixsums" else None


def random_dataset_mutant(seed: int, index: int) -> tuple[int, list[Op], Tree]:
    """Mutant ``index`` of run ``seed``: its base, its ops and its tree (deterministic)."""
    rng = random.Random((seed << 40) ^ index ^ 0xD5)
    return draw(rng, dataset_bases(), random_dataset_op, apply_tree, last=_fixsums)


# -- live datasets -------------------------------------------------------------------------

INDEX_OPS = ("ihead", "irun", "itable", "irecord", "iname", "islots", "iseal")
"""Mutations of a version 2 dataset's shard index (``_index_op``)."""

LIVE_OPS = ("ahead", "shrink", "mark", "record", "ldtype")
"""Mutations only ``apply_live`` knows (they need the live dataset's rules or its API)."""

LIVE_B, LIVE_T = 4, 16
LIVE_BATCHES = 12
LIVE_SEGMENT = 2
LIVE_MARK = 7
"""The live base: ``LIVE_BATCHES`` batches of one producer, committed one by one and sealed in
segments of ``LIVE_SEGMENT``, and a consumer whose checkpoint reads from batch ``LIVE_MARK``."""


def live_batch(i: int) -> npt.NDArray[np.uint32]:
    """Batch ``i`` of the live base: every row ``i * 32 + arange(T)``."""
    row = np.arange(LIVE_T, dtype=np.uint32) + np.uint32(i * 32)
    return np.broadcast_to(row, (LIVE_B, LIVE_T)).copy()


def live_identify(item: npt.NDArray[np.integer]) -> int | None:
    """The index of a whole live-base batch, or ``None`` for anything else."""
    i = int(item[0, 0]) // 32
    return i if item.shape == (LIVE_B, LIVE_T) and np.array_equal(item, live_batch(i)) else None


def read_tree(root: str) -> dict[str, bytes]:
    """Every file under ``root``, by its path relative to ``root`` (``/``-separated)."""
    files = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root).replace(os.sep, "/")] = f.read()
    return files


def _live_base() -> Tree:
    from zerobatch_core import BatchNativeLoader
    from zerobatch_core.live.producer import LiveProducer
    from zerobatch_core.live.retention import record_watermark
    from zerobatch_core.live.source import LiveSource

    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "live")
        with LiveProducer(
            root, "p-0", batch_size=LIVE_B, seq_len=LIVE_T, cadence=1, segment_size=LIVE_SEGMENT
        ) as producer:
            for i in range(LIVE_BATCHES):
                producer.append(live_batch(i))
        with LiveSource(root, timeout=5) as source:
            loader = BatchNativeLoader(source, dtype="uint32")
            items = iter(loader)
            for _ in range(LIVE_MARK):
                next(items)
            record_watermark(root, "c-1", loader.state_dict(), keep=2)
        return _deterministic(read_tree(root)), {}


def _deterministic(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` with the random dataset id and nonces replaced by fixed ones (segment
    digests refitted), so that mutant ``i`` is the same bytes in every process."""
    tokens: list[str] = [json.loads(files["live.json"])["id"]]
    for key, data in sorted(files.items()):
        if key.startswith("manifests/"):
            tokens.append(json.loads(data)["nonce"])
        elif key.startswith("batches/"):
            tokens.append(key.rsplit("-", 1)[1].removesuffix(".batch"))
    fixed = {t: f"{i + 1:0{len(t)}x}" for i, t in enumerate(dict.fromkeys(tokens))}

    def rewrite(text: str) -> str:
        for old, new in fixed.items():
            text = text.replace(old, new)
        return text

    out = {rewrite(k): (v if k.startswith("batches/") else rewrite(v.decode()).encode())
           for k, v in files.items()}  # fmt: skip
    for key in [k for k in out if k.startswith("manifests/")]:
        obj = json.loads(out[key])
        for ref in obj["segments"]:
            ref["xxh3"] = bytes_xxh3(out[ref["name"]])
        out[key] = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    return out


live_base = functools.cache(_live_base)
"""The live base tree (built once per process)."""


def _versions(files: dict[str, bytes]) -> list[str]:
    return sorted(k for k in files if k.startswith("manifests/") and k.endswith(".json"))


def _next_version(files: dict[str, bytes], delta: int, edit: Any) -> None:
    """A new manifest version ``delta`` past the newest that parses, made by ``edit(obj)``."""
    for key in reversed(_versions(files)):
        obj = _load_json(files[key])
        if isinstance(obj, dict) and isinstance(obj.get("manifest"), int):
            version = obj["manifest"] + delta
            if not 0 <= version < 10**20:
                return
            obj["manifest"] = version
            obj["writer"], obj["nonce"] = "p-9", "0123456789abcdef"
            try:
                made = edit(obj) is not False
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                made = False  # the newest version was mutated out of shape: nothing to extend
            if made:
                files[f"manifests/{version:020d}.json"] = _dump_json(obj)
            return


def apply_live(tree: Tree, ops: Sequence[Op]) -> Tree:
    """``apply_tree`` plus the live-only mutations (``record`` is left to the checker, which
    calls ``record_watermark`` on the materialised tree)."""
    files, special = apply_tree(tree, [op for op in ops if op[0] not in LIVE_OPS])
    for op in ops:
        if op[0] == "ahead":
            _, delta, batches, start, offset = op

            def ahead(obj: Any, b: int = batches, s: int = start, o: int = offset) -> None:
                obj.update(batches=b, start=s, segments=[], tail=[])
                producers = obj.get("producers")
                if isinstance(producers, dict):
                    for state in producers.values():
                        if isinstance(state, dict):
                            state["offset"] = o

            _next_version(files, delta, ahead)
        elif op[0] == "shrink":

            def shrink(obj: Any, drop: int = op[1]) -> bool:
                tail = obj.get("tail")
                if not isinstance(tail, list) or not tail:
                    return False
                kept = tail[: max(0, len(tail) - drop)]
                obj["tail"] = kept
                ends = [s["first"] + s["batches"] for s in obj.get("segments", [])]
                obj["batches"] = (
                    kept[-1]["first"] + kept[-1]["num_batches"]
                    if kept
                    else (ends[-1] if ends else obj.get("start", 0))
                )
                return True

            _next_version(files, 1, shrink)
        elif op[0] == "mark":
            files[f"watermarks/{op[1]}/{op[2]:020d}.json"] = _dump_json({"batch": op[2]})
        elif op[0] == "ldtype":

            def set_dtype(obj: Any, value: Any = op[1]) -> bytes | None:
                if not isinstance(obj, dict):
                    return None
                obj.pop("dtype", None)
                if value is not None:
                    obj["dtype"] = value
                return _dump_json(obj)

            _edit_json(files, "live.json", set_dtype)
    return files, special


def random_live_op(rng: random.Random, tree: Tree) -> Op:
    """One mutation of a live tree: its documents' numbers and shapes, a crafted version far
    ahead, a shrunk version, watermarks beyond the end or of another dataset, bytes, FIFOs."""
    files, _ = tree
    versions = _versions(files)
    roll = rng.random()
    if roll < 0.12:
        big = rng.choice((10**6, 2**40, 2**62, U64_MAX, LIVE_BATCHES + 1, LIVE_BATCHES * 4))
        # ``start == batches`` with no entries is a version valid on its own (the attack);
        # other starts break the contiguity rule, which every reader must catch.
        start = big if rng.random() < 0.75 else rng.choice((big - 1, LIVE_BATCHES, 0))
        return ("ahead", rng.choice((1, 1, 2, 1000, 10**12)), big, start,
                rng.choice((big, U64_MAX, LIVE_BATCHES + 5)))  # fmt: skip
    if roll < 0.17:
        return ("shrink", rng.choice((1, 2, 3, 100)))
    if roll < 0.25:
        batch = rng.choice((LIVE_BATCHES + 1, 2**40, U64_MAX, 10**19, 0, LIVE_MARK + 2))
        return ("mark", rng.choice(("c-1", "c-2", "other")), batch)
    if roll < 0.30:
        samples = rng.choice((LIVE_BATCHES * 4 * LIVE_B, 2**50, 10 * LIVE_B, -LIVE_B, 0))
        batch_size = rng.choice((LIVE_B, 1, 0, -1))
        # A state of this dataset inside the committed range is a legitimate checkpoint (its
        # watermark may rotate the real one out): only hostile states are drawn.
        legitimate = batch_size > 0 and 0 < samples // batch_size <= LIVE_BATCHES
        return ("record", samples, batch_size, legitimate or rng.random() < 0.5)
    if roll < 0.33:
        # The descriptor's dtype changed under uint32 batch objects of one page either way:
        # only each object's header can tell.
        return ("ldtype", rng.choice((1, 1, 1, 0, 2, 65537, "uint16", True, None)))
    documents = [k for k in files if k.endswith(".json")]
    weights = [
        6 if k in versions[-2:] else 3 if k.startswith("segments/") else 1 for k in documents
    ]
    name = rng.choices(documents, weights)[0]
    roll = rng.random()
    if roll < 0.6:
        op = _json_op(rng, name, _load_json(files[name]))
        if op is not None:
            return op
    if roll < 0.9:
        return _byte_op(rng, name, files[name])
    roll = rng.random()
    if roll < 0.3:
        return ("fifo", name)
    if roll < 0.5:
        return ("dir", name)
    if roll < 0.75:
        return ("remove", name)
    stray = rng.choice(("manifests/x.json", "manifests/.00000000000000000099.json.1a2b.tmp",
                        f"segments/{10**19}.json", "batches/p-0/99-00000000.batch"))  # fmt: skip
    return ("copy", name, stray)


def random_live_mutant(seed: int, index: int) -> tuple[int, list[Op], Tree]:
    """Live mutant ``index`` of run ``seed``: ``(0, ops, tree)`` (deterministic)."""
    rng = random.Random((seed << 40) ^ index ^ 0x11FE)
    tree = live_base()
    ops: list[Op] = []
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
        op = random_live_op(rng, tree)
        ops.append(op)
        tree = apply_live(tree, [op])
    return 0, ops, tree
