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

import hashlib
import random
from typing import Any

import numpy as np
from zerobatch_conformance.generate import assemble, pseudo_tokens
from zerobatch_conformance.probe import describe_batch_file
from zerobatch_spec import (
    FIELD_OFFSETS,
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    RESERVED_OFFSET,
    U32_MAX,
    U64_MAX,
    ErrorCode,
    Header,
    batch_offset,
    find_violation,
    parse_header,
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


def _base(batch_size: int, seq_len: int, total: int, seed: int) -> bytes:
    nb = total // batch_size
    records = pseudo_tokens(total * seq_len, salt=seed).reshape(total, seq_len)
    return assemble(Header(batch_size, seq_len, nb, seed, total), records)


BASES: tuple[bytes, ...] = (
    _base(2, 3, 5, 1),  # padding, a dropped record
    _base(4, 256, 8, 2),  # exactly one page per batch, no padding
    _base(5, 300, 5, 3),  # 6000 token bytes padded to 8192
    _base(1, 1, 3, 4),  # one token per batch
    _base(3, 5, 2, 5),  # no batches: the header alone
    _base(8, 512, 8, 6),  # 16 KiB, no padding
    _base(2, 4, 9, 7),  # four batches, one dropped record
)
"""Valid files written per the spec (``zerobatch_conformance.generate.assemble``)."""


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
    return h.file_size


def apply(base: bytes, ops: list[Op]) -> bytes:
    """The mutant: ``ops`` applied to ``base`` in order."""
    data = bytearray(base)
    for op in ops:
        kind = op[0]
        if kind == "flip":
            if op[1] < len(data):
                data[op[1]] = op[2]
        elif kind == "field":
            set_field(data, op[1], op[2])
        elif kind == "shape":
            for name, value in zip(("batch_size", "seq_len", "num_batches"), op[1:], strict=True):
                set_field(data, name, value)
        elif kind == "magic":
            if len(data) < len(MAGIC):
                data.extend(bytes(len(MAGIC) - len(data)))
            data[: len(MAGIC)] = op[1]
        elif kind == "truncate":
            del data[op[1] :]
        elif kind == "append":
            data.extend(bytes([op[2]]) * op[1])
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
            raise ValueError(f"unknown mutation {op!r}")
    return bytes(data)


# -- random mutations (the standalone run) --------------------------------------------------


def _field_value(rng: random.Random, name: str, data: bytes) -> int:
    current = (
        int.from_bytes(data[FIELD_OFFSETS[name] :][: FIELD_BYTES[name]], "little")
        if len(data) >= FIELD_OFFSETS[name] + FIELD_BYTES[name]
        else 0
    )
    width = FIELD_BYTES[name] * 8
    roll = rng.random()
    if roll < 0.6:
        value = rng.choice(U64_EXTREMES if width == 64 else U32_EXTREMES)
    elif roll < 0.75:
        value = current + rng.choice((-2, -1, 1, 2))
    elif roll < 0.85 and name == "num_batches" and len(data) >= HEADER_SIZE:
        # A count whose 64-bit product with the slot size wraps to (nearly) the real body size.
        h = parse_header(data[:HEADER_SIZE])
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


def random_mutant(seed: int, index: int) -> tuple[int, list[Op], bytes]:
    """Mutant ``index`` of run ``seed``: its base, its ops and its bytes (deterministic)."""
    rng = random.Random((seed << 40) ^ index)
    base = rng.randrange(len(BASES))
    data = BASES[base]
    ops: list[Op] = []
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        op = random_op(rng, data)
        ops.append(op)
        data = apply(data, [op])
    return base, ops, data


# -- the oracle -----------------------------------------------------------------------------


def padding_fault(data: bytes, h: Header) -> int | None:
    """Index of the first batch whose slot padding has a non-zero byte, straight from bytes."""
    raw, padded = h.raw_batch_bytes, h.padded_batch_bytes
    if raw == padded:
        return None
    for i in range(h.num_batches):
        start = batch_offset(i, h.batch_size, h.seq_len)
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
            for i in range(len(r)):
                start = batch_offset(i, h.batch_size, h.seq_len)
                got = r.read_batch(i).tobytes()
                assert got == data[start : start + h.raw_batch_bytes], f"batch {i} bytes differ"
            if len(r):
                assert r.read_batches(0, len(r)).shape == (len(r), h.batch_size, h.seq_len)
                assert r.read_batch_int32(-1).tobytes() == r.read_batch(-1).tobytes()
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
            start = batch_offset(h.num_batches - 1, h.batch_size, h.seq_len)
            last = hashlib.sha256(data[start : start + raw]).hexdigest()
            assert answer["batch_sha256"][-1] == last
        return outcome
    assert not report.valid and report.code is ErrorCode.NONZERO_PADDING, report
    assert report.detail is not None and report.detail.startswith(f"batch {bad}:"), report
    assert answer == {"valid": False, "error": ErrorCode.NONZERO_PADDING.value}, answer
    return "valid-deep-invalid"
