"""Manifest vectors: one or more per manifest rule of ``SPEC.md`` section 13, in rule order.

Each is a dataset directory holding only ``manifest.json`` (the manifest is checked first, and
alone), made by editing the base dataset's manifest. Every expectation is checked here against
``zerobatch_spec``'s parser, so a vector cannot state a rule the reference does not apply.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from zerobatch_spec import DTYPE_UINT16, DTYPE_UINT32, HEADER_SIZE, U32_MAX, U64_MAX, Header
from zerobatch_spec.dataset import MANIFEST_NAME, DatasetCode, DatasetViolation, parse_manifest

from .dataset_files import SHARD0, SHARD1, base, broken, indexed
from .vector import Vector


def manifest_doc(version: int = 1) -> dict[str, Any]:
    """The base dataset's manifest as a JSON object, to edit (``version`` 2: the manifest of
    the same dataset described by a shard index)."""
    files = base() if version == 1 else indexed(base())
    raw = files[MANIFEST_NAME]
    assert raw is not None
    doc: dict[str, Any] = json.loads(raw)
    return doc


def edited(edit: Callable[[dict[str, Any]], object], version: int = 1) -> dict[str, Any]:
    """The base manifest (of ``version``) with ``edit`` applied to a copy."""
    doc = copy.deepcopy(manifest_doc(version))
    edit(doc)
    return doc


def dumps(doc: object) -> bytes:
    """``doc`` as JSON bytes (not canonical: a broken manifest need not be)."""
    return (json.dumps(doc) + "\n").encode()


def manifest_vector(
    vid: str,
    comment: str,
    code: DatasetCode,
    where: str,
    manifest: bytes | dict[str, Any],
    flags: Sequence[str] = (),
) -> Vector:
    """A dataset whose manifest breaks a rule: only ``manifest.json`` is there (it is checked
    first, and alone). The expectation is checked against ``zerobatch_spec``'s parser."""
    data = manifest if isinstance(manifest, bytes) else dumps(manifest)
    got = parse_manifest(data)
    assert isinstance(got, DatasetViolation), (vid, got)
    assert (got.code, got.where) == (code, where), (vid, got)
    return broken(vid, comment, code.value, where, {MANIFEST_NAME: data}, ["manifest", *flags])


def set_path(path: Sequence[str | int], value: object) -> Callable[[dict[str, Any]], None]:
    """An edit that sets ``doc[path...] = value`` (or deletes the key when ``value`` is
    ``DELETE``)."""

    def edit(doc: dict[str, Any]) -> None:
        target: Any = doc
        for step in path[:-1]:
            target = target[step]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return edit


DELETE = object()
"""Marks a key ``set_path`` removes."""


def manifest_vectors() -> Iterator[Vector]:
    """One vector or more per manifest rule (section 13, rules 1 to 5), in rule order."""
    good = base()[MANIFEST_NAME]
    assert good is not None
    text = dumps(manifest_doc())
    not_json = DatasetCode.MANIFEST_NOT_JSON
    cases: list[tuple[str, str, bytes]] = [
        ("truncated", "the manifest cut after 50 bytes", good[:50]),
        ("empty", "an empty manifest", b""),
        (
            "not-utf8",
            "a byte that is not UTF-8 inside a string",
            good.replace(b"input", b"in\xffput"),
        ),
        ("array", "a JSON array around the manifest object", b"[" + good.rstrip() + b"]\n"),
        ("string", "a JSON string, not an object", b'"zerobatch.dataset"\n'),
        (
            "nan",
            "NaN as a value: not JSON (RFC 8259)",
            text.replace(b'"seed": 3,', b'"seed": NaN,', 1),
        ),
        (
            "infinity",
            "-Infinity under an unknown key: not JSON even where the value is ignored",
            text.replace(b"{", b'{"x": -Infinity, ', 1),
        ),
        (
            "duplicate-key",
            "batch_size given twice, with the same value: duplicate keys are refused",
            text.replace(b'"batch_size": 2,', b'"batch_size": 2, "batch_size": 2,', 1),
        ),
        ("bom", "a UTF-8 byte order mark before the object", b"\xef\xbb\xbf" + good),
    ]
    for name, comment, data in cases:
        yield manifest_vector(
            f"dataset-manifest-not-json-{name}", comment, not_json, "manifest", data
        )

    bad_format = DatasetCode.MANIFEST_BAD_FORMAT
    for name, comment, edit in (
        ("other", 'format "zerobatch.datasets"', set_path(["format"], "zerobatch.datasets")),
        ("missing", "no format key", set_path(["format"], DELETE)),
        ("llmbatch", 'format "LLMBATCH" (a file, not a dataset)', set_path(["format"], "LLMBATCH")),
    ):
        yield manifest_vector(
            f"dataset-manifest-format-{name}", comment, bad_format, "format", edited(edit)
        )

    version = DatasetCode.MANIFEST_UNSUPPORTED_VERSION
    for name, comment, value in (
        ("3", "version 3 (from the future)", 3),
        ("0", "version 0", 0),
        ("missing", "no version key", DELETE),
        ("string", 'version "1" (a string)', "1"),
        ("float", "version 1.0 (a fraction, not the integer 1)", 1.0),
        ("true", "version true (a boolean, not the integer 1)", True),
    ):
        yield manifest_vector(
            f"dataset-manifest-version-{name}",
            comment,
            version,
            "version",
            edited(set_path(["version"], value)),
        )

    yield from bad_field_vectors(text)
    yield from bad_shard_vectors()
    yield from manifest_order_vectors()
    yield from indexed_manifest_vectors()


def bad_field_vectors(text: bytes) -> Iterator[Vector]:
    """``manifest_bad_field``: a field missing, of the wrong JSON type or out of its range."""
    bad = DatasetCode.MANIFEST_BAD_FIELD
    long_integer = b"9" * 5000
    yield manifest_vector(
        "dataset-manifest-batch-size-5000-digits",
        "batch_size is an integer of 5000 digits: out of range, not a parse failure",
        bad,
        "batch_size",
        text.replace(b'"batch_size": 2,', b'"batch_size": ' + long_integer + b",", 1),
        ["overflow"],
    )
    s0: list[str | int] = ["shards", 0]
    s1: list[str | int] = ["shards", 1]
    cases: list[tuple[str, str, list[str | int], object, str]] = [
        ("batch-size-0", "batch_size 0", ["batch_size"], 0, "batch_size"),
        ("batch-size-above-u32", "batch_size 2^32", ["batch_size"], U32_MAX + 1, "batch_size"),
        ("batch-size-string", 'batch_size "2"', ["batch_size"], "2", "batch_size"),
        ("batch-size-float", "batch_size 2.0", ["batch_size"], 2.0, "batch_size"),
        ("seq-len-missing", "no seq_len", ["seq_len"], DELETE, "seq_len"),
        ("seq-len-true", "seq_len true", ["seq_len"], True, "seq_len"),
        ("dtype-2", "dtype 2: not a defined token type", ["dtype"], 2, "dtype"),
        ("dtype-negative", "dtype -1", ["dtype"], -1, "dtype"),
        ("dtype-above-u32", "dtype 2^32 + 1", ["dtype"], U32_MAX + 2, "dtype"),
        ("dtype-string", 'dtype "uint16": the name, not the code', ["dtype"], "uint16", "dtype"),
        ("dtype-true", "dtype true (a boolean, not the integer 1)", ["dtype"], True, "dtype"),
        ("dtype-float", "dtype 1.0 (a fraction, not the integer 1)", ["dtype"], 1.0, "dtype"),
        (
            "dtype-null",
            "dtype null (absent means 0, null is not allowed)",
            ["dtype"],
            None,
            "dtype",
        ),
        ("seed-negative", "seed -1", ["seed"], -1, "seed"),
        ("seed-above-u64", "seed 2^64 (u64)", ["seed"], U64_MAX + 1, "seed"),
        ("checksums-missing", "no checksums object", ["checksums"], DELETE, "checksums"),
        (
            "checksums-algorithm",
            'checksums algorithm "crc32c"',
            ["checksums", "algorithm"],
            "crc32c",
            "checksums",
        ),
        (
            "checksums-uppercase",
            "checksums xxh3 in uppercase hex",
            ["checksums", "xxh3"],
            "ABCDEF0123456789",
            "checksums.xxh3",
        ),
        (
            "checksums-15-digits",
            "checksums xxh3 of 15 hex digits",
            ["checksums", "xxh3"],
            "abcdef012345678",
            "checksums.xxh3",
        ),
        ("shards-missing", "no shards key", ["shards"], DELETE, "shards"),
        ("shards-object", "shards is an object, not a list", ["shards"], {}, "shards"),
        (
            "sources-null",
            "sources null (absent is allowed, null is not)",
            ["sources"],
            None,
            "sources",
        ),
        ("shard-string", "shards[1] is a string", s1, SHARD1, "shards[1]"),
        (
            "name-parent",
            'shard name "../x": outside the directory',
            [*s1, "name"],
            "../x",
            "shards[1].name",
        ),
        ("name-slash", 'shard name "a/b"', [*s0, "name"], "a/b", "shards[0].name"),
        ("name-empty", "empty shard name", [*s0, "name"], "", "shards[0].name"),
        ("name-dot", 'shard name "."', [*s0, "name"], ".", "shards[0].name"),
        ("name-dot-dot", 'shard name ".."', [*s0, "name"], "..", "shards[0].name"),
        (
            "name-256",
            "shard name of 256 characters",
            [*s0, "name"],
            "a" * 250 + ".batch",
            "shards[0].name",
        ),
        (
            "name-space",
            'shard name "shard 0.batch"',
            [*s0, "name"],
            "shard 0.batch",
            "shards[0].name",
        ),
        (
            "name-not-ascii",
            "shard name with a letter outside ASCII",
            [*s0, "name"],
            "\u00e9.batch",
            "shards[0].name",
        ),
        ("name-integer", "shard name 7", [*s0, "name"], 7, "shards[0].name"),
        (
            "num-batches-above-u64",
            "num_batches 2^64",
            [*s0, "num_batches"],
            U64_MAX + 1,
            "shards[0].num_batches",
        ),
        (
            "num-batches-negative",
            "num_batches -1",
            [*s0, "num_batches"],
            -1,
            "shards[0].num_batches",
        ),
        (
            "shard-seed-above-u32",
            "a shard's seed 2^32 (u32)",
            [*s0, "seed"],
            U32_MAX + 1,
            "shards[0].seed",
        ),
        (
            "total-records-above-u32",
            "total_records 2^32 (u32)",
            [*s0, "total_records"],
            U32_MAX + 1,
            "shards[0].total_records",
        ),
        ("size-below-header", "size 4095", [*s0, "size"], HEADER_SIZE - 1, "shards[0].size"),
        (
            "header-xxh3-uppercase",
            "header_xxh3 in uppercase hex",
            [*s0, "header_xxh3"],
            "ABCDEF0123456789",
            "shards[0].header_xxh3",
        ),
        ("records-reversed", "records [5, 3]", [*s0, "records"], [5, 3], "shards[0].records"),
        ("records-three", "records [0, 4, 8]", [*s0, "records"], [0, 4, 8], "shards[0].records"),
        (
            "records-above-u64",
            "records [0, 2^64]",
            [*s0, "records"],
            [0, U64_MAX + 1],
            "shards[0].records",
        ),
        ("records-string", 'records "0-4"', [*s0, "records"], "0-4", "shards[0].records"),
        (
            "source-no-path",
            "sources[0] without a path",
            ["sources", 0, "path"],
            DELETE,
            "sources[0]",
        ),
        ("source-path-integer", "sources[0] path 5", ["sources", 0, "path"], 5, "sources[0]"),
        (
            "source-records-missing",
            "sources[0] without records",
            ["sources", 0, "records"],
            DELETE,
            "sources[0].records",
        ),
    ]
    for name, comment, path, value, where in cases:
        flags = ["overflow"] if "above" in name else []
        yield manifest_vector(
            f"dataset-manifest-{name}", comment, bad, where, edited(set_path(path, value)), flags
        )


def bad_shard_vectors() -> Iterator[Vector]:
    """``manifest_bad_shard``: shard entries whose fields are each in range but disagree."""
    bad = DatasetCode.MANIFEST_BAD_SHARD
    s0: list[str | int] = ["shards", 0]
    s1: list[str | int] = ["shards", 1]
    cases: list[tuple[str, str, list[str | int], object, str, list[str]]] = [
        (
            "total-records-short",
            "total_records 3 < num_batches 2 * batch_size 2",
            [*s0, "total_records"],
            3,
            "shards[0].total_records",
            ["off-by-one"],
        ),
        (
            "num-batches-product-wraps",
            "num_batches 2^63: num_batches * batch_size is 2^64, which wraps to 0 in u64",
            [*s0, "num_batches"],
            2**63,
            "shards[0].total_records",
            ["overflow"],
        ),
        (
            "size-one-slot-short",
            "size one slot short of 4096 + num_batches * padded_batch_bytes",
            [*s0, "size"],
            HEADER_SIZE * 2,
            "shards[0].size",
            [],
        ),
        (
            "records-span",
            "records [4, 6] span 2 input records, total_records is 3",
            [*s1, "records"],
            [4, 6],
            "shards[1].records",
            ["off-by-one"],
        ),
        (
            "duplicate-name",
            "shards[1] has the name of shards[0]",
            [*s1, "name"],
            SHARD0,
            "shards[1].name",
            [],
        ),
    ]
    for name, comment, path, value, where, flags in cases:
        yield manifest_vector(
            f"dataset-manifest-{name}", comment, bad, where, edited(set_path(path, value)), flags
        )
    # batch_size 1, seq_len 2^32-1: 2^22 pages a slot. 2^30 + 1 slots need 2^64 + 2^34 + 4096
    # bytes; a size check in wrapping u64 finds 2^34 + 4096 and passes.
    n = 2**30 + 1
    wrapped = (HEADER_SIZE + n * 2**34) % 2**64

    def wrap(doc: dict[str, Any]) -> None:
        doc.update(batch_size=1, seq_len=U32_MAX)
        doc["shards"] = [
            {**doc["shards"][0], "num_batches": n, "total_records": n, "size": wrapped}
        ]
        del doc["shards"][0]["records"]

    # 2 x 2048 tokens: 8192 bytes a slot as uint16, 16384 as uint32.
    for name, comment, dtype, sized in (
        (
            "size-uint32-in-uint16-manifest",
            '"dtype": 1 with every shard sized for uint32 tokens',
            DTYPE_UINT16,
            DTYPE_UINT32,
        ),
        (
            "size-uint16-without-dtype",
            "no dtype key (so 0, uint32) with every shard sized for uint16 tokens",
            DTYPE_UINT32,
            DTYPE_UINT16,
        ),
    ):

        def resize(doc: dict[str, Any], dtype: int = dtype, sized: int = sized) -> None:
            doc.update(batch_size=2, seq_len=2048)
            if dtype != DTYPE_UINT32:
                doc["dtype"] = dtype
            for shard in doc["shards"]:
                shard["size"] = Header(2, 2048, shard["num_batches"], 0, 0, dtype=sized).file_size

        yield manifest_vector(
            f"dataset-manifest-{name}",
            comment,
            bad,
            "shards[0].size",
            edited(resize),
            ["uint16"],
        )
    yield manifest_vector(
        "dataset-manifest-size-wraps",
        "size 2^34 + 4096 where 4096 + num_batches * padded_batch_bytes = 2^64 + 2^34 + 4096",
        bad,
        "shards[0].size",
        edited(wrap),
        ["overflow"],
    )


def manifest_order_vectors() -> Iterator[Vector]:
    """Several manifest rules broken at once: the first in section 13's order is reported."""
    bad_field, bad_shard = DatasetCode.MANIFEST_BAD_FIELD, DatasetCode.MANIFEST_BAD_SHARD

    def both(*edits: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        doc = copy.deepcopy(manifest_doc())
        for edit in edits:
            edit(doc)
        return doc

    bad_name = set_path(["shards", 0, "name"], "../x")
    cases: list[tuple[str, str, DatasetCode, str, dict[str, Any]]] = [
        (
            "format-and-version",
            "format and version both wrong",
            DatasetCode.MANIFEST_BAD_FORMAT,
            "format",
            both(set_path(["format"], "x"), set_path(["version"], 9)),
        ),
        (
            "version-and-field",
            "version 3 and batch_size 0",
            DatasetCode.MANIFEST_UNSUPPORTED_VERSION,
            "version",
            both(set_path(["version"], 3), set_path(["batch_size"], 0)),
        ),
        (
            "seq-len-before-dtype",
            "seq_len 0 and dtype 2: seq_len is checked first",
            bad_field,
            "seq_len",
            both(set_path(["seq_len"], 0), set_path(["dtype"], 2)),
        ),
        (
            "dtype-before-seed",
            'dtype "uint16" and seed -1: dtype is checked before seed',
            bad_field,
            "dtype",
            both(set_path(["dtype"], "uint16"), set_path(["seed"], -1)),
        ),
        (
            "checksums-and-shard",
            "checksums algorithm and a shard name both wrong: top-level fields first",
            bad_field,
            "checksums",
            both(set_path(["checksums", "algorithm"], "md5"), bad_name),
        ),
        (
            "sources-type-and-shard",
            "sources not a list and a shard name wrong: both lists' types before their entries",
            bad_field,
            "sources",
            both(set_path(["sources"], "input.bin"), bad_name),
        ),
        (
            "shard-before-next-shard",
            "shards[0] inconsistent (size) and shards[1] with a bad name: entries in order",
            bad_shard,
            "shards[0].size",
            both(
                set_path(["shards", 0, "size"], HEADER_SIZE),
                set_path(["shards", 1, "name"], "../x"),
            ),
        ),
        (
            "field-before-consistency",
            "shards[0] seed 2^32 and a wrong size: an entry's fields before its consistency",
            bad_field,
            "shards[0].seed",
            both(
                set_path(["shards", 0, "seed"], U32_MAX + 1),
                set_path(["shards", 0, "size"], HEADER_SIZE),
            ),
        ),
        (
            "duplicate-before-sources",
            "a duplicate shard name and sources[0] without a path: names before sources",
            bad_shard,
            "shards[1].name",
            both(set_path(["shards", 1, "name"], SHARD0), set_path(["sources", 0, "path"], DELETE)),
        ),
    ]
    for name, comment, code, where, doc in cases:
        yield manifest_vector(
            f"dataset-manifest-rule-order-{name}", comment, code, where, doc, ["rule-order"]
        )


def indexed_manifest_vectors() -> Iterator[Vector]:
    """Version 2 manifests (section 23.1): rule 4 over ``index``, ``shard_count``,
    ``num_batches``, ``prefixes`` and ``sources``, after the fields both versions share, in
    that order."""
    bad = DatasetCode.MANIFEST_BAD_FIELD
    v2 = ["v2"]
    yield manifest_vector(
        "dataset-manifest-v2-version-1-with-index",
        "a version 2 manifest relabelled version 1: no shards list (index is an unknown key)",
        bad,
        "shards",
        edited(set_path(["version"], 1), 2),
        v2,
    )
    yield manifest_vector(
        "dataset-manifest-v2-shards-without-index",
        "a version 1 manifest relabelled version 2: its shards list is an unknown key, and it "
        "names no index",
        bad,
        "index",
        edited(set_path(["version"], 2)),
        v2,
    )
    idx: list[str | int] = ["index"]
    cases: list[tuple[str, str, list[str | int], object, str]] = [
        ("index-missing", "no index key", idx, DELETE, "index"),
        ("index-null", "index null", idx, None, "index"),
        ("index-list", "index is a list", idx, ["shards.zbi", 400, "0" * 16], "index"),
        ("index-string", 'index "shards.zbi", not an object', idx, "shards.zbi", "index"),
        ("index-name-missing", "index without a name", [*idx, "name"], DELETE, "index.name"),
        ("index-name-empty", "index name empty", [*idx, "name"], "", "index.name"),
        (
            "index-name-parent",
            'index name "../shards.zbi"',
            [*idx, "name"],
            "../shards.zbi",
            "index.name",
        ),
        (
            "index-name-slash",
            'index name "a/shards.zbi"',
            [*idx, "name"],
            "a/shards.zbi",
            "index.name",
        ),
        ("index-name-dot", 'index name "."', [*idx, "name"], ".", "index.name"),
        (
            "index-name-256",
            "index name of 256 characters",
            [*idx, "name"],
            "x" * 252 + ".zbi",
            "index.name",
        ),
        (
            "index-name-manifest",
            "the index named manifest.json",
            [*idx, "name"],
            MANIFEST_NAME,
            "index.name",
        ),
        (
            "index-name-checksums",
            "the index named checksums.xxh3",
            [*idx, "name"],
            "checksums.xxh3",
            "index.name",
        ),
        ("index-name-integer", "index name 7", [*idx, "name"], 7, "index.name"),
        ("index-size-missing", "index without a size", [*idx, "size"], DELETE, "index.size"),
        ("index-size-negative", "index size -1", [*idx, "size"], -1, "index.size"),
        ("index-size-above-u64", "index size 2^64", [*idx, "size"], U64_MAX + 1, "index.size"),
        ("index-size-string", 'index size "400"', [*idx, "size"], "400", "index.size"),
        ("index-size-float", "index size 400.0", [*idx, "size"], 400.0, "index.size"),
        ("index-xxh3-missing", "index without xxh3", [*idx, "xxh3"], DELETE, "index.xxh3"),
        (
            "index-xxh3-uppercase",
            "index xxh3 in uppercase hex",
            [*idx, "xxh3"],
            "ABCDEF0123456789",
            "index.xxh3",
        ),
        (
            "index-xxh3-17-digits",
            "index xxh3 of 17 hex digits",
            [*idx, "xxh3"],
            "abcdef01234567890",
            "index.xxh3",
        ),
        ("index-xxh3-integer", "index xxh3 as an integer", [*idx, "xxh3"], 12345, "index.xxh3"),
        ("shard-count-missing", "no shard_count", ["shard_count"], DELETE, "shard_count"),
        ("shard-count-negative", "shard_count -1", ["shard_count"], -1, "shard_count"),
        (
            "shard-count-above-u64",
            "shard_count 2^64",
            ["shard_count"],
            U64_MAX + 1,
            "shard_count",
        ),
        ("shard-count-string", 'shard_count "2"', ["shard_count"], "2", "shard_count"),
        ("num-batches-missing", "no num_batches", ["num_batches"], DELETE, "num_batches"),
        ("num-batches-float", "num_batches 3.0", ["num_batches"], 3.0, "num_batches"),
        ("num-batches-true", "num_batches true", ["num_batches"], True, "num_batches"),
        (
            "num-batches-above-u64",
            "num_batches 2^64",
            ["num_batches"],
            U64_MAX + 1,
            "num_batches",
        ),
        ("prefixes-0", "prefixes 0", ["prefixes"], 0, "prefixes"),
        ("prefixes-negative", "prefixes -1", ["prefixes"], -1, "prefixes"),
        ("prefixes-above", "prefixes 65537 (at most 65536)", ["prefixes"], 65537, "prefixes"),
        ("prefixes-string", 'prefixes "4"', ["prefixes"], "4", "prefixes"),
        ("prefixes-float", "prefixes 4.0", ["prefixes"], 4.0, "prefixes"),
        ("prefixes-true", "prefixes true", ["prefixes"], True, "prefixes"),
        ("prefixes-null", "prefixes null", ["prefixes"], None, "prefixes"),
        ("sources-null", "sources null", ["sources"], None, "sources"),
        ("sources-object", "sources is an object", ["sources"], {}, "sources"),
        (
            "source-no-path",
            "sources[0] without a path",
            ["sources", 0, "path"],
            DELETE,
            "sources[0]",
        ),
        (
            "source-records-reversed",
            "sources[0] records [7, 0]",
            ["sources", 0, "records"],
            [7, 0],
            "sources[0].records",
        ),
    ]
    for name, comment, path, value, where in cases:
        flags = [*v2, "overflow"] if "above-u64" in name else v2
        flags = [*flags, "off-by-one"] if name == "prefixes-above" else flags
        yield manifest_vector(
            f"dataset-manifest-v2-{name}",
            comment,
            bad,
            where,
            edited(set_path(path, value), 2),
            flags,
        )
    yield from indexed_order_vectors()


def indexed_order_vectors() -> Iterator[Vector]:
    """Several version 2 manifest rules broken at once: the first in rule 4's order."""
    bad = DatasetCode.MANIFEST_BAD_FIELD

    def both(*edits: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        doc = copy.deepcopy(manifest_doc(2))
        for edit in edits:
            edit(doc)
        return doc

    cases: list[tuple[str, str, DatasetCode, str, dict[str, Any]]] = [
        (
            "version-before-index",
            "version 3 and no index",
            DatasetCode.MANIFEST_UNSUPPORTED_VERSION,
            "version",
            both(set_path(["version"], 3), set_path(["index"], DELETE)),
        ),
        (
            "seed-before-index",
            "seed -1 and no index: the fields both versions share come first",
            bad,
            "seed",
            both(set_path(["seed"], -1), set_path(["index"], DELETE)),
        ),
        (
            "checksums-before-index",
            "checksums xxh3 in uppercase and index name ../x",
            bad,
            "checksums.xxh3",
            both(
                set_path(["checksums", "xxh3"], "ABCDEF0123456789"),
                set_path(["index", "name"], "../x"),
            ),
        ),
        (
            "index-name-before-size",
            "index name manifest.json and index size -1: name, size, xxh3 in order",
            bad,
            "index.name",
            both(set_path(["index", "name"], MANIFEST_NAME), set_path(["index", "size"], -1)),
        ),
        (
            "index-size-before-xxh3",
            "index size 2^64 and index xxh3 of 15 digits",
            bad,
            "index.size",
            both(
                set_path(["index", "size"], U64_MAX + 1),
                set_path(["index", "xxh3"], "abcdef012345678"),
            ),
        ),
        (
            "index-before-shard-count",
            "index xxh3 uppercase and shard_count -1",
            bad,
            "index.xxh3",
            both(set_path(["index", "xxh3"], "ABCDEF0123456789"), set_path(["shard_count"], -1)),
        ),
        (
            "shard-count-before-num-batches",
            "shard_count missing and num_batches -1",
            bad,
            "shard_count",
            both(set_path(["shard_count"], DELETE), set_path(["num_batches"], -1)),
        ),
        (
            "num-batches-before-sources",
            "num_batches 2^64 and sources null",
            bad,
            "num_batches",
            both(set_path(["num_batches"], U64_MAX + 1), set_path(["sources"], None)),
        ),
        (
            "num-batches-before-prefixes",
            "num_batches -1 and prefixes 0",
            bad,
            "num_batches",
            both(set_path(["num_batches"], -1), set_path(["prefixes"], 0)),
        ),
        (
            "prefixes-before-sources",
            "prefixes 1.5 and sources null",
            bad,
            "prefixes",
            both(set_path(["prefixes"], 1.5), set_path(["sources"], None)),
        ),
    ]
    for name, comment, code, where, doc in cases:
        yield manifest_vector(
            f"dataset-manifest-v2-rule-order-{name}",
            comment,
            code,
            where,
            doc,
            ["v2", "rule-order"],
        )
