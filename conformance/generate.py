"""Regenerate the conformance vectors from the spec, byte for byte.

Every vector is produced here from ``zerobatch_spec`` alone (never by the core writer, never by
hand): ``python -m zerobatch_conformance.generate DIR`` writes them, and ``--check DIR`` fails if
any file in DIR differs from what this script produces, or is missing, or is extra.

Vector files in DIR:
* ``<id>.batch`` or ``<id>.query.json``: the input an implementation is given;
* ``<id>.expected.json``: ``{"id", "comment", "flags", "input", "expected"}``;
* ``index.json``: every vector's id, input, flags and comment, in order.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec import (
    DOMAIN_RECORDS,
    HEADER_SIZE,
    MAGIC,
    RESERVED_OFFSET,
    TOKEN_DTYPE,
    U32_MAX,
    U64_MAX,
    Header,
    batch_offset,
    build_header,
    epoch_key,
    epoch_order,
    permute_array,
)
from zerobatch_spec.layout import RESERVED_SIZE
from zerobatch_spec.shuffle import mix64_array

BLOCK_ORDER_CASES = ((1, 0), (1, 1), (3, 0), (3, 7), (4, 2), (256, 0))
"""(block_size, epoch) pairs whose orders valid-file vectors pin (with the file's seed)."""

WRITER_INPUT_MAX_TOKENS = 4096
"""A valid vector lists its writer input (records, batch size, seed) up to this many tokens."""


@dataclass
class Vector:
    """One vector before it is written: its input bytes and expected answer."""

    id: str
    comment: str
    flags: list[str]
    suffix: str
    data: bytes
    expected: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def pseudo_tokens(count: int, salt: int) -> npt.NDArray[np.uint32]:
    """Deterministic tokens spread over the whole uint32 range (low half of SplitMix64)."""
    idx = np.arange(count, dtype=np.uint64) + np.uint64((salt << 32) & U64_MAX)
    with np.errstate(over="ignore"):
        return (mix64_array(idx) & np.uint64(U32_MAX)).astype(np.uint32)


def assemble(header: Header, records: npt.NDArray[np.uint32]) -> bytes:
    """File bytes for ``records`` ([total, T]) written per the spec's record permutation."""
    b, t, nb = header.batch_size, header.seq_len, header.num_batches
    total = header.total_records
    positions = np.arange(nb * b, dtype=np.uint64)
    source = permute_array(positions, total, header.seed, DOMAIN_RECORDS).astype(np.int64)
    tokens = records[source].reshape(nb, b * t).astype(TOKEN_DTYPE)
    slots = np.zeros((nb, header.slot_words), dtype=TOKEN_DTYPE)
    slots[:, : b * t] = tokens
    return build_header(header) + slots.tobytes()


def batch_digests(data: bytes, header: Header) -> list[str]:
    """SHA-256 of each batch's token bytes (its slot without the padding)."""
    b, t, raw = header.batch_size, header.seq_len, header.raw_batch_bytes
    offsets = (batch_offset(i, b, t) for i in range(header.num_batches))
    return [hashlib.sha256(data[off : off + raw]).hexdigest() for off in offsets]


def valid_vector(
    vid: str,
    comment: str,
    batch_size: int,
    seq_len: int,
    total: int,
    seed: int,
    flags: list[str],
    records: npt.NDArray[np.uint32] | None = None,
    total_records_field: int | None = None,
) -> Vector:
    """A valid file written from ``records`` (default: pseudo-random tokens)."""
    if records is None:
        records = pseudo_tokens(total * seq_len, salt=seed + total).reshape(total, seq_len)
    nb = total // batch_size
    header = Header(
        batch_size=batch_size,
        seq_len=seq_len,
        num_batches=nb,
        seed=seed,
        total_records=total if total_records_field is None else total_records_field,
    )
    data = assemble(Header(batch_size, seq_len, nb, seed, total), records)
    data = build_header(header) + data[HEADER_SIZE:]
    orders = [
        {
            "block_size": bs,
            "seed": seed,
            "epoch": ep,
            "order": epoch_order(nb, bs, epoch_key(seed, ep)).tolist() if nb else [],
        }
        for bs, ep in BLOCK_ORDER_CASES
    ]
    expected: dict[str, Any] = {
        "valid": True,
        "header": header.as_dict(),
        "padded_batch_bytes": header.padded_batch_bytes,
        "batch_sha256": batch_digests(data, header),
        "block_orders": orders,
    }
    extra: dict[str, Any] = {}
    if total_records_field is None and total * seq_len <= WRITER_INPUT_MAX_TOKENS:
        extra["writer_input"] = {
            "records": records.tolist(),
            "batch_size": batch_size,
            "seed": seed,
        }
    return Vector(vid, comment, ["valid", *flags], ".batch", data, expected, extra)


def small_header(**overrides: int) -> Header:
    fields = {"batch_size": 2, "seq_len": 4, "num_batches": 2, "seed": 5, "total_records": 4}
    fields.update(overrides)
    return Header(**fields)


def small_body(header: Header) -> bytes:
    recs = pseudo_tokens(header.num_batches * header.batch_size * header.seq_len, 99)
    nb, b, t = header.num_batches, header.batch_size, header.seq_len
    slots = np.zeros((nb, header.slot_words), dtype=TOKEN_DTYPE)
    slots[:, : b * t] = recs.reshape(nb, b * t)
    return slots.tobytes()


def invalid_vector(
    vid: str, comment: str, code: str, data: bytes, flags: list[str] | None = None
) -> Vector:
    return Vector(
        vid,
        comment,
        ["invalid", code, *(flags or [])],
        ".batch",
        data,
        {"valid": False, "error": code},
    )


def raw_header(header: Header, magic: bytes = MAGIC, reserved: bytes | None = None) -> bytes:
    return build_header(header, magic=magic, reserved=reserved)


def reserved_with(offset: int, value: int = 1) -> bytes:
    r = bytearray(RESERVED_SIZE)
    r[offset - RESERVED_OFFSET] = value
    return bytes(r)


def valid_vectors() -> Iterator[Vector]:
    yield valid_vector(
        "valid-basic",
        "4x8 batches, 13 records: one dropped",
        4,
        8,
        13,
        42,
        ["padding", "remainder"],
    )
    yield valid_vector(
        "valid-no-padding", "raw batch is exactly 4096 bytes", 4, 256, 8, 1, ["no-padding"]
    )
    yield valid_vector(
        "valid-multipage-padding", "raw 6000 bytes pad to 8192", 5, 300, 10, 3, ["padding"]
    )
    yield valid_vector(
        "valid-two-page-exact", "raw batch is exactly 8192 bytes", 8, 256, 16, 9, ["no-padding"]
    )
    yield valid_vector(
        "valid-zero-batches",
        "3 records, batch_size 4: header only",
        4,
        8,
        3,
        7,
        ["zero-batches", "remainder"],
    )
    yield valid_vector("valid-zero-records", "no records at all", 2, 2, 0, 0, ["zero-batches"])
    yield valid_vector(
        "valid-one-token", "batch_size 1, seq_len 1", 1, 1, 5, 11, ["one-token", "padding"]
    )
    extremes = np.array([[0, 1, 2**31 - 1, 2**31, U32_MAX - 1, U32_MAX]] * 4, dtype=np.uint32)
    extremes[1] = extremes[1][::-1]
    extremes[2, :] = U32_MAX
    extremes[3, :] = 0
    yield valid_vector(
        "valid-token-extremes",
        "tokens 0, 2^31-1, 2^31, 2^32-1",
        2,
        6,
        4,
        0,
        ["token-range"],
        records=extremes,
    )
    yield valid_vector(
        "valid-total-records-larger",
        "total_records above batches*batch_size",
        2,
        4,
        6,
        8,
        ["remainder"],
        total_records_field=1000,
    )
    yield valid_vector("valid-seed-max", "seed 2^32-1", 3, 5, 9, U32_MAX, ["seed"])
    yield valid_vector(
        "valid-many-batches",
        "40 batches for block orders",
        2,
        4,
        81,
        123,
        ["block-order", "remainder"],
    )
    yield valid_vector("valid-one-batch", "exactly one batch", 3, 3, 3, 2, ["padding"])


def invalid_vectors() -> Iterator[Vector]:
    good = small_header()
    body = small_body(good)
    full = raw_header(good) + body
    # 1. truncated_header
    for n in (0, 1, len(MAGIC), RESERVED_OFFSET, HEADER_SIZE - 1):
        yield invalid_vector(
            f"truncated-header-{n}",
            f"file of {n} bytes",
            "truncated_header",
            full[:n],
            ["off-by-one"] if n == HEADER_SIZE - 1 else [],
        )
    # 2. bad_magic
    for name, magic in (
        ("llmbatcx", b"LLMBATCX"),
        ("lowercase", b"llmbatch"),
        ("zeros", bytes(8)),
        ("nul-terminated", b"LLMBATC\x00"),
    ):
        yield invalid_vector(
            f"bad-magic-{name}",
            f"magic {magic!r}",
            "bad_magic",
            raw_header(good, magic=magic) + body,
        )
    # 3. unsupported_version
    for v in (0, 2, U32_MAX):
        yield invalid_vector(
            f"unsupported-version-{v}",
            f"version {v}",
            "unsupported_version",
            raw_header(small_header(version=v)) + body,
        )
    # 4. unsupported_dtype
    for d in (1, U32_MAX):
        yield invalid_vector(
            f"unsupported-dtype-{d}",
            f"dtype {d}",
            "unsupported_dtype",
            raw_header(small_header(dtype=d)) + body,
        )
    # 5. invalid_shape
    yield invalid_vector(
        "invalid-shape-batch-size-0",
        "batch_size 0",
        "invalid_shape",
        raw_header(small_header(batch_size=0, num_batches=0)),
    )
    yield invalid_vector(
        "invalid-shape-seq-len-0",
        "seq_len 0",
        "invalid_shape",
        raw_header(small_header(seq_len=0, num_batches=0)),
    )
    yield invalid_vector(
        "invalid-shape-both-0",
        "batch_size and seq_len 0",
        "invalid_shape",
        raw_header(small_header(batch_size=0, seq_len=0)) + body,
    )
    # 6. nonzero_reserved
    for off in (RESERVED_OFFSET, 2000, HEADER_SIZE - 1):
        yield invalid_vector(
            f"nonzero-reserved-{off}",
            f"byte {off} set",
            "nonzero_reserved",
            raw_header(good, reserved=reserved_with(off)) + body,
        )
    # 7. size_mismatch
    yield invalid_vector(
        "size-one-byte-short", "last byte missing", "size_mismatch", full[:-1], ["off-by-one"]
    )
    yield invalid_vector(
        "size-one-byte-extra", "one trailing byte", "size_mismatch", full + b"\x00", ["off-by-one"]
    )
    yield invalid_vector(
        "size-slot-missing",
        "num_batches one too high",
        "size_mismatch",
        raw_header(small_header(num_batches=3, total_records=6)) + body,
    )
    yield invalid_vector(
        "size-slot-extra",
        "a whole extra slot",
        "size_mismatch",
        full + bytes(good.padded_batch_bytes),
    )
    yield invalid_vector(
        "size-header-only-claims-batches",
        "header only, num_batches 2",
        "size_mismatch",
        raw_header(good),
    )
    yield invalid_vector(
        "size-overflow-max",
        "num_batches 2^64-1",
        "size_mismatch",
        raw_header(small_header(num_batches=U64_MAX, total_records=U32_MAX)) + body,
        ["overflow"],
    )
    # num_batches * padded_batch_bytes wraps modulo 2^64 to exactly this file's slot bytes.
    wrap = (U64_MAX + 1) // good.padded_batch_bytes + good.num_batches
    yield invalid_vector(
        "size-overflow-wraps",
        "num_batches*padded wraps to the real size",
        "size_mismatch",
        raw_header(small_header(num_batches=wrap, total_records=U32_MAX)) + body,
        ["overflow"],
    )
    # 8. record_count_mismatch
    yield invalid_vector(
        "record-count-one-short",
        "total_records = batches*B - 1",
        "record_count_mismatch",
        raw_header(small_header(total_records=3)) + body,
        ["off-by-one"],
    )
    yield invalid_vector(
        "record-count-zero",
        "total_records 0 with batches",
        "record_count_mismatch",
        raw_header(small_header(total_records=0)) + body,
    )
    # deep: nonzero_padding
    first = bytearray(full)
    first[HEADER_SIZE + good.raw_batch_bytes] = 1
    yield invalid_vector(
        "nonzero-padding-first",
        "first padding byte of batch 0",
        "nonzero_padding",
        bytes(first),
        ["deep"],
    )
    last = bytearray(full)
    last[-1] = 0x80
    yield invalid_vector(
        "nonzero-padding-last", "last byte of the file", "nonzero_padding", bytes(last), ["deep"]
    )
    # rule order: the first failing rule wins
    order_cases: list[tuple[str, str, bytes]] = [
        ("truncated-and-bad-magic", "truncated_header", b"NOTLLMBA"),
        (
            "magic-and-version",
            "bad_magic",
            raw_header(small_header(version=9), magic=b"XXXXXXXX") + body,
        ),
        (
            "version-and-dtype",
            "unsupported_version",
            raw_header(small_header(version=2, dtype=1)) + body,
        ),
        (
            "dtype-and-shape",
            "unsupported_dtype",
            raw_header(small_header(dtype=3, batch_size=0)) + body,
        ),
        (
            "shape-and-reserved",
            "invalid_shape",
            raw_header(small_header(seq_len=0), reserved=reserved_with(100)) + body,
        ),
        (
            "reserved-and-size",
            "nonzero_reserved",
            raw_header(good, reserved=reserved_with(41)) + body[:-5],
        ),
        (
            "size-and-record-count",
            "size_mismatch",
            raw_header(small_header(total_records=0)) + body + b"\x00",
        ),
        (
            "record-count-and-padding",
            "record_count_mismatch",
            raw_header(small_header(total_records=1)) + bytes(first[HEADER_SIZE:]),
        ),
    ]
    for name, code, data in order_cases:
        yield invalid_vector(
            f"order-{name}", f"several rules broken; {code} comes first", code, data, ["rule-order"]
        )


def query_vector(vid: str, comment: str, query: dict[str, Any], result: list[int]) -> Vector:
    data = (json.dumps(query, sort_keys=True) + "\n").encode()
    return Vector(
        vid, comment, ["query", str(query["op"])], ".query.json", data, {"result": result}
    )


def query_vectors() -> Iterator[Vector]:
    for n, seed in ((1, 0), (2, 0), (2, 1), (10, 42), (100, 0), (1000, U32_MAX), (4097, 9)):
        src = permute_array(np.arange(n, dtype=np.uint64), n, seed, DOMAIN_RECORDS)
        yield query_vector(
            f"record-permutation-n{n}-seed{seed}",
            f"writer permutation of {n} records",
            {"op": "record_permutation", "total_records": n, "seed": seed},
            [int(x) for x in src],
        )
    for nb, bs, seed, ep in (
        (1, 1, 0, 0),
        (7, 2, 3, 0),
        (7, 2, 3, 1),
        (100, 8, 42, 5),
        (1000, 64, U32_MAX, 2**40),
        (513, 256, 1, 0),
        (5, 10, 1, 1),
    ):
        yield query_vector(
            f"block-order-n{nb}-b{bs}-s{seed}-e{ep}",
            "block order with a short last block" if nb % bs else "block order",
            {"op": "block_order", "num_batches": nb, "block_size": bs, "seed": seed, "epoch": ep},
            epoch_order(nb, bs, epoch_key(seed, ep)).tolist(),
        )


ALL: tuple[Callable[[], Iterator[Vector]], ...] = (valid_vectors, invalid_vectors, query_vectors)


def write_vectors(directory: str) -> int:
    """Write every vector into ``directory``; return how many."""
    os.makedirs(directory, exist_ok=True)
    index = []
    for make in ALL:
        for v in make():
            name = v.id + v.suffix
            with open(os.path.join(directory, name), "wb") as f:
                f.write(v.data)
            doc = {
                "id": v.id,
                "comment": v.comment,
                "flags": v.flags,
                "input": name,
                "expected": v.expected,
                **v.extra,
            }
            with open(os.path.join(directory, v.id + ".expected.json"), "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.write("\n")
            index.append({"id": v.id, "input": name, "flags": v.flags, "comment": v.comment})
    with open(os.path.join(directory, "index.json"), "w", encoding="utf-8") as f:
        json.dump({"format": "zerobatch.conformance", "version": 1, "vectors": index}, f, indent=1)
        f.write("\n")
    return len(index)


def check_vectors(directory: str) -> list[str]:
    """Differences between ``directory`` and a fresh generation (empty when identical)."""
    with tempfile.TemporaryDirectory() as fresh:
        write_vectors(fresh)
        cmp = filecmp.dircmp(fresh, directory)
        problems = [f"missing: {n}" for n in cmp.left_only]
        problems += [f"unexpected: {n}" for n in cmp.right_only]
        _, mismatch, errors = filecmp.cmpfiles(fresh, directory, cmp.common_files, shallow=False)
        problems += [f"differs: {n}" for n in mismatch + errors]
        return sorted(problems)


def default_directory() -> str:
    return os.path.join(os.path.dirname(os.path.realpath(__file__)), "vectors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zerobatch_conformance.generate",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("directory", nargs="?", default=None, help="vector directory")
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args(argv)
    directory = args.directory or default_directory()
    if args.check:
        problems = check_vectors(directory)
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{directory}: {'OK' if not problems else f'{len(problems)} differences'}")
        return 1 if problems else 0
    n = write_vectors(directory)
    print(f"wrote {n} vectors to {directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
