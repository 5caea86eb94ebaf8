"""LLMBATCH datasets: shards, their manifest, per-slot checksums and the dataset order.

A dataset is a directory of LLMBATCH files (shards) with one ``batch_size`` and ``seq_len``,
described by ``manifest.json`` (written last, atomically) and ``checksums.xxh3`` (one
little-endian u64 XXH3-64 per slot, shard by shard). This module is the reference for both
files and for the order a loader serves a dataset in (``SPEC.md`` sections 12 to 14): parsing
applies the manifest rules in order and reports the first broken one, as ``rules.py`` does for
files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, TypeGuard

import numpy as np
import numpy.typing as npt
import xxhash

from .layout import (
    DEFINED_DTYPES,
    DTYPE_UINT32,
    HEADER_SIZE,
    U32_MAX,
    U64_MAX,
    dtype_field,
    expected_file_size,
)
from .shuffle import GOLDEN_GAMMA, MASK64, mix64, permute, permute_array

MANIFEST_NAME: Final = "manifest.json"
"""The manifest's file name inside a dataset directory."""

CHECKSUMS_NAME: Final = "checksums.xxh3"
"""The per-slot checksums' file name inside a dataset directory."""

MANIFEST_FORMAT: Final = "zerobatch.dataset"
MANIFEST_VERSION: Final = 1
"""The manifest's own version, independent of the file format's and of any library's: 1 lists
every shard in the JSON."""
MANIFEST_VERSION_INDEXED: Final = 2
"""Version 2: the JSON names a shard index (``index.py``) that lists the shards."""
MANIFEST_VERSIONS: Final = (MANIFEST_VERSION, MANIFEST_VERSION_INDEXED)

CHECKSUM_ALGORITHM: Final = "xxh3-64"
CHECKSUM_BYTES: Final = 8

DOMAIN_DATASET_BLOCKS: Final = 3
"""Domain tag of the dataset's block order (files use 1 for records, 2 for blocks)."""

DATASET_KEY_TAG: Final = 0x5A42_4441_5441_5345  # "ZBDATASE"
"""Mixed into the dataset seed before the epoch, so dataset keys never equal file keys."""

_SHARD_NAME = re.compile(r"\A[A-Za-z0-9._-]{1,255}\Z")


def is_shard_name(name: object) -> TypeGuard[str]:
    """Whether ``name`` passes the shard name rule (``SPEC.md`` section 12.2): 1 to 255 ASCII
    letters, digits, ``.``, ``_`` or ``-``, and neither ``.`` nor ``..``. Readers refuse a
    manifest with any other name; writers check names with it before they write one."""
    return isinstance(name, str) and bool(_SHARD_NAME.match(name)) and name not in (".", "..")


SHARD_NAME_FORMAT: Final = "shard-{:05d}.batch"
"""Name the sharded writer gives shard ``i`` (``SPEC.md`` section 12): ``shard-00000.batch``,
``shard-00001.batch``, ... (shard 100000 on has more digits)."""

MAX_PREFIXES: Final = 65536
"""Most key prefixes a version 2 dataset's shard names spread over (``SPEC.md`` 23.1)."""


def shard_file_name(shard: int, prefixes: int = 1) -> str:
    """The name the sharded writer gives shard ``shard`` of a dataset whose names spread over
    ``prefixes`` key prefixes (``SPEC.md`` 23.1): ``SHARD_NAME_FORMAT``'s name, behind
    ``shard mod prefixes`` in lowercase hexadecimal, zero-padded to the digits of
    ``prefixes - 1``, and a ``-`` when ``prefixes > 1`` (``3-shard-00003.batch`` of 16,
    ``2a-shard-00042.batch`` of 256). Consecutive shards, which a step reads together, land
    under different prefixes, so an object store's per-prefix request rate divides by
    ``prefixes``."""
    name = SHARD_NAME_FORMAT.format(shard)
    if prefixes <= 1:
        return name
    return f"{shard % prefixes:0{len(f'{prefixes - 1:x}')}x}-{name}"


def key_prefix(name: str, prefixes: int) -> str:
    """The key prefix of a shard named ``name`` in a dataset of ``prefixes`` prefixes: the
    hexadecimal digits and ``-`` before ``shard-`` (``""`` without prefixes)."""
    if prefixes <= 1:
        return ""
    return name[: len(f"{prefixes - 1:x}") + 1]


class DatasetCode(str, Enum):
    """Stable error codes of manifests and datasets (``SPEC.md`` section 13)."""

    MANIFEST_NOT_JSON = "manifest_not_json"
    MANIFEST_BAD_FORMAT = "manifest_bad_format"
    MANIFEST_UNSUPPORTED_VERSION = "manifest_unsupported_version"
    MANIFEST_BAD_FIELD = "manifest_bad_field"
    MANIFEST_BAD_SHARD = "manifest_bad_shard"
    SHARD_MISSING = "shard_missing"
    SHARD_SIZE_MISMATCH = "shard_size_mismatch"
    SHARD_HEADER_MISMATCH = "shard_header_mismatch"
    CHECKSUMS_MISMATCH = "checksums_mismatch"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    EXTRA_SHARD = "extra_shard"
    INDEX_MISSING = "index_missing"
    INDEX_MISMATCH = "index_mismatch"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DatasetViolation:
    """One broken dataset rule: its code, where (a manifest field or a shard), and what."""

    code: DatasetCode
    where: str
    detail: str


@dataclass(frozen=True)
class Shard:
    """One shard as the manifest describes it: an LLMBATCH file of the dataset's shape.

    ``records`` is the range ``[first, last)`` of the dataset's input records it was written
    from (``None`` when unknown): shard position ``p`` holds input record
    ``first + permute(p, total_records, seed, 1)``, the file writer's rule.
    """

    name: str
    num_batches: int
    seed: int
    total_records: int
    size: int
    header_xxh3: str
    records: tuple[int, int] | None = None


@dataclass(frozen=True)
class Source:
    """An input file and the range ``[first, last)`` of the dataset's input records it gave."""

    path: str
    records: tuple[int, int]


@dataclass(frozen=True)
class IndexRef:
    """A version 2 manifest's ``index``: the shard index's name, size and top digest."""

    name: str
    size: int
    xxh3: str


@dataclass(frozen=True)
class Manifest:
    """A parsed, checked manifest.

    A version 2 manifest names its shard index (``index``) and gives ``shard_count`` and
    ``declared_batches`` instead of listing the shards: its ``shards`` stay empty until a
    reader of the index fills them in (``with_shards``).
    """

    batch_size: int
    seq_len: int
    seed: int
    shards: Sequence[Shard]
    checksums_xxh3: str
    sources: tuple[Source, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    dtype: int = DTYPE_UINT32
    """The token dtype code of every shard (``"dtype"`` in the JSON, absent for 0)."""
    version: int = MANIFEST_VERSION
    index: IndexRef | None = None
    shard_count: int | None = None
    """Version 2: the number of shards the index lists."""
    declared_batches: int | None = None
    """Version 2: the number of slots the index's shards hold."""
    prefixes: int = 1
    """Version 2: the key prefixes the shards' generated names spread over (``"prefixes"``
    in the JSON, absent for 1; ``shard_file_name``)."""

    @property
    def num_batches(self) -> int:
        """Slots over all shards (version 2: as the manifest declares them)."""
        if self.declared_batches is not None:
            return self.declared_batches
        return sum(s.num_batches for s in self.shards)

    @property
    def num_shards(self) -> int:
        """Shards of the dataset (version 2: as the manifest declares them)."""
        return self.shard_count if self.shard_count is not None else len(self.shards)

    @property
    def shard_batches(self) -> list[int]:
        """Each shard's slot count, in manifest order (a version 2 manifest's only once a
        reader has filled in its shards from the index: ``ValueError`` before)."""
        if self.shard_count is not None and len(self.shards) != self.shard_count:
            raise ValueError(
                "a version 2 manifest lists its shards in its index: open the dataset to read "
                "them (zerobatch_spec.index)"
            )
        return [s.num_batches for s in self.shards]

    def first_batches(self) -> npt.NDArray[np.int64]:
        """Dataset index of each shard's first slot, plus the total (``len(shards) + 1``)."""
        return np.concatenate([[0], np.cumsum(self.shard_batches, dtype=np.int64)]).astype(np.int64)


def slot_checksum(slot: Any) -> int:
    """XXH3-64 (seed 0) of one slot's bytes, padding included."""
    return int(xxhash.xxh3_64_intdigest(slot))


def bytes_xxh3(data: Any) -> str:
    """XXH3-64 (seed 0) of ``data`` as 16 lowercase hex digits."""
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def header_xxh3(header: bytes) -> str:
    """The manifest's digest of a shard header: XXH3-64 of its 4096 bytes, lowercase hex."""
    return bytes_xxh3(header[:HEADER_SIZE])


# -- parsing -------------------------------------------------------------------------------------
class _ManifestError(Exception):
    def __init__(self, code: DatasetCode, where: str, detail: str) -> None:
        super().__init__(detail)
        self.violation = DatasetViolation(code, where, detail)


def _int(obj: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            f"{where}{key}",
            f"expected an integer in [{low}, {high}], found {value!r:.60}",
        )
    return value


def _hex16(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{16}", value):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            f"{where}{key}",
            f"expected 16 lowercase hex digits, found {value!r:.60}",
        )
    return value


def _range(value: object, where: str) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not 0 <= value[0] <= value[1] <= U64_MAX
    ):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            where,
            f"expected [first, last] integers with 0 <= first <= last, found {value!r:.60}",
        )
    return int(value[0]), int(value[1])


def _shard(obj: object, i: int, batch_size: int, seq_len: int, dtype: int) -> Shard:
    where = f"shards[{i}]."
    if not isinstance(obj, dict):
        raise _ManifestError(DatasetCode.MANIFEST_BAD_FIELD, f"shards[{i}]", "expected an object")
    name = obj.get("name")
    if not is_shard_name(name):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            f"{where}name",
            f"expected a plain file name (letters, digits, '.', '_', '-'), found {name!r:.60}",
        )
    n = _int(obj, "num_batches", where, 0, U64_MAX)
    seed = _int(obj, "seed", where, 0, U32_MAX)
    total = _int(obj, "total_records", where, 0, U32_MAX)
    size = _int(obj, "size", where, HEADER_SIZE, U64_MAX)
    digest = _hex16(obj, "header_xxh3", where)
    records = None if obj.get("records") is None else _range(obj["records"], f"{where}records")
    if total < n * batch_size:
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_SHARD,
            f"{where}total_records",
            f"{name}: total_records {total} < num_batches {n} * batch_size {batch_size}",
        )
    if size != expected_file_size(batch_size, seq_len, n, dtype):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_SHARD,
            f"{where}size",
            f"{name}: size {size} is not 4096 + num_batches * slot bytes = "
            f"{expected_file_size(batch_size, seq_len, n, dtype)}",
        )
    if records is not None and records[1] - records[0] != total:
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_SHARD,
            f"{where}records",
            f"{name}: records {list(records)} cover {records[1] - records[0]} input records, "
            f"total_records is {total}",
        )
    return Shard(name, n, seed, total, size, digest, records)


def _source(obj: object, i: int) -> Source:
    where = f"sources[{i}]"
    if not isinstance(obj, dict) or not isinstance(obj.get("path"), str):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD, where, "expected {'path': str, 'records': ...}"
        )
    return Source(obj["path"], _range(obj.get("records"), f"{where}.records"))


class _LongInteger(int):
    """Stand-in for a JSON integer too long for CPython to convert (over 4300 digits).

    Its value, ``+-2**64``, lies outside every manifest field's range exactly as the true value
    does, so the field is reported out of range (or, under an unknown key, ignored) instead of
    the conversion raising.
    """

    digits: int

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _json_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        stand_in = _LongInteger(-(2**64) if text.startswith("-") else 2**64)
        stand_in.digits = len(text.lstrip("-"))
        return stand_in


def _json_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r:.60} appears twice in one object")
        obj[key] = value
    return obj


def loads_strict(text: str) -> Any:
    """``text`` parsed as JSON the way metadata is read: ``NaN`` and ``Infinity`` and a key
    given twice in one object are refused (``ValueError``), as they are in a manifest."""
    return json.loads(text, parse_constant=_json_constant, object_pairs_hook=_json_object)


def _parse(data: bytes) -> Manifest:
    try:
        obj = json.loads(
            data.decode("utf-8"),
            parse_int=_json_int,
            parse_constant=_json_constant,
            object_pairs_hook=_json_object,
        )
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError included
        raise _ManifestError(
            DatasetCode.MANIFEST_NOT_JSON, "manifest", f"not UTF-8 JSON: {e}"
        ) from e
    if not isinstance(obj, dict):
        raise _ManifestError(DatasetCode.MANIFEST_NOT_JSON, "manifest", "expected a JSON object")
    if obj.get("format") != MANIFEST_FORMAT:
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FORMAT,
            "format",
            f"expected {MANIFEST_FORMAT!r}, found {obj.get('format')!r:.60}",
        )
    version = obj.get("version")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or version not in MANIFEST_VERSIONS
    ):
        raise _ManifestError(
            DatasetCode.MANIFEST_UNSUPPORTED_VERSION,
            "version",
            f"this reader knows manifest versions 1 and 2, found {version!r:.60}",
        )
    batch_size = _int(obj, "batch_size", "", 1, U32_MAX)
    seq_len = _int(obj, "seq_len", "", 1, U32_MAX)
    dtype = _dtype(obj)
    seed = _int(obj, "seed", "", 0, U64_MAX)
    checksums = obj.get("checksums")
    if not isinstance(checksums, dict) or checksums.get("algorithm") != CHECKSUM_ALGORITHM:
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            "checksums",
            f"expected {{'algorithm': {CHECKSUM_ALGORITHM!r}, 'xxh3': ...}}, found "
            f"{checksums!r:.80}",
        )
    digest = _hex16(checksums, "xxh3", "checksums.")
    if version == MANIFEST_VERSION_INDEXED:
        return _parse_indexed(obj, batch_size, seq_len, dtype, seed, digest)
    shards_obj, sources_obj = obj.get("shards"), obj.get("sources", [])
    if not isinstance(shards_obj, list):
        raise _ManifestError(DatasetCode.MANIFEST_BAD_FIELD, "shards", "expected a list of shards")
    if not isinstance(sources_obj, list):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD, "sources", "expected a list of sources"
        )
    shards = tuple(_shard(s, i, batch_size, seq_len, dtype) for i, s in enumerate(shards_obj))
    seen: set[str] = set()
    for i, s in enumerate(shards):
        if s.name in seen:
            raise _ManifestError(
                DatasetCode.MANIFEST_BAD_SHARD, f"shards[{i}].name", f"{s.name} is listed twice"
            )
        seen.add(s.name)
    sources = tuple(_source(s, i) for i, s in enumerate(sources_obj))
    known = {"format", "version", "batch_size", "seq_len", "dtype", "seed", "checksums", "shards"}
    extra = {k: v for k, v in obj.items() if k not in known | {"sources"}}
    return Manifest(batch_size, seq_len, seed, shards, digest, sources, extra, dtype)


_INDEXED_KEYS: Final = frozenset(
    ("format", "version", "batch_size", "seq_len", "dtype", "seed", "checksums", "index")
) | frozenset(("shard_count", "num_batches", "prefixes", "sources"))


def _parse_indexed(
    obj: dict[str, Any], batch_size: int, seq_len: int, dtype: int, seed: int, digest: str
) -> Manifest:
    """The rest of a version 2 manifest: ``index``, ``shard_count``, ``num_batches``,
    ``prefixes``, ``sources`` (rule 4, in this order)."""
    index = obj.get("index")
    if not isinstance(index, dict):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            "index",
            "expected {'name': ..., 'size': ..., 'xxh3': ...}",
        )
    name = index.get("name")
    if not is_shard_name(name) or name in (MANIFEST_NAME, CHECKSUMS_NAME):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            "index.name",
            f"expected a plain file name other than {MANIFEST_NAME} and {CHECKSUMS_NAME}, "
            f"found {name!r:.60}",
        )
    size = _int(index, "size", "index.", 0, U64_MAX)
    top = _hex16(index, "xxh3", "index.")
    shard_count = _int(obj, "shard_count", "", 0, U64_MAX)
    num_batches = _int(obj, "num_batches", "", 0, U64_MAX)
    prefixes = _int(obj, "prefixes", "", 1, MAX_PREFIXES) if "prefixes" in obj else 1
    sources_obj = obj.get("sources", [])
    if not isinstance(sources_obj, list):
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD, "sources", "expected a list of sources"
        )
    sources = tuple(_source(s, i) for i, s in enumerate(sources_obj))
    extra = {k: v for k, v in obj.items() if k not in _INDEXED_KEYS}
    return Manifest(
        batch_size,
        seq_len,
        seed,
        (),
        digest,
        sources,
        extra,
        dtype,
        MANIFEST_VERSION_INDEXED,
        IndexRef(name, size, top),
        shard_count,
        num_batches,
        prefixes,
    )


def _dtype(obj: dict[str, Any]) -> int:
    """The optional ``dtype`` field: a defined token dtype code, 0 (uint32) when absent."""
    code = dtype_field(obj)
    if code is None:
        raise _ManifestError(
            DatasetCode.MANIFEST_BAD_FIELD,
            "dtype",
            f"expected a token dtype code ({DEFINED_DTYPES}), found {obj['dtype']!r:.60}",
        )
    return code


def parse_manifest(data: bytes) -> Manifest | DatasetViolation:
    """The manifest in ``data``, or the first rule it breaks (``SPEC.md`` section 13).

    Unknown keys are allowed (and kept in ``Manifest.extra``); hostile input (deep nesting,
    huge numbers, odd names) gives a violation, never an exception. The document must be strict
    JSON: ``NaN`` and ``Infinity`` (which Python's parser accepts) and a key given twice in one
    object are ``manifest_not_json``; ``version`` must be the JSON integer 1 (not ``true`` or
    ``1.0``, which compare equal to 1 in Python).
    """
    try:
        return _parse(data)
    except _ManifestError as e:
        return e.violation


def build_manifest(manifest: Manifest) -> bytes:
    """The canonical bytes of ``manifest``: UTF-8 JSON, keys in a fixed order, one shard a line.

    Writers use this so that the same dataset always has the same manifest bytes (and digest).
    """

    if manifest.version == MANIFEST_VERSION_INDEXED:
        return _build_indexed(manifest)

    def shard(s: Shard) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": s.name,
            "num_batches": s.num_batches,
            "seed": s.seed,
            "total_records": s.total_records,
            "size": s.size,
            "header_xxh3": s.header_xxh3,
        }
        if s.records is not None:
            out["records"] = list(s.records)
        return out

    head: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "batch_size": manifest.batch_size,
        "seq_len": manifest.seq_len,
        **({"dtype": manifest.dtype} if manifest.dtype != DTYPE_UINT32 else {}),
        "seed": manifest.seed,
        "checksums": {"algorithm": CHECKSUM_ALGORITHM, "xxh3": manifest.checksums_xxh3},
        **manifest.extra,
    }
    lines = [json.dumps(head)[:-1] + ', "shards": [']
    lines += [
        "  " + json.dumps(shard(s)) + ("," if i + 1 < len(manifest.shards) else "")
        for i, s in enumerate(manifest.shards)
    ]
    sources = [{"path": s.path, "records": list(s.records)} for s in manifest.sources]
    lines.append("], " + json.dumps({"sources": sources})[1:])
    return ("\n".join(lines) + "\n").encode("utf-8")


def _build_indexed(manifest: Manifest) -> bytes:
    """A version 2 manifest's canonical bytes: one line of JSON, keys in the order of the
    specification, then a line feed."""
    if manifest.index is None or manifest.shard_count is None or manifest.declared_batches is None:
        raise ValueError("a version 2 manifest needs its index, shard_count and num_batches")
    index = manifest.index
    obj: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION_INDEXED,
        "batch_size": manifest.batch_size,
        "seq_len": manifest.seq_len,
        **({"dtype": manifest.dtype} if manifest.dtype != DTYPE_UINT32 else {}),
        "seed": manifest.seed,
        "checksums": {"algorithm": CHECKSUM_ALGORITHM, "xxh3": manifest.checksums_xxh3},
        "index": {"name": index.name, "size": index.size, "xxh3": index.xxh3},
        "shard_count": manifest.shard_count,
        "num_batches": manifest.declared_batches,
        **({"prefixes": manifest.prefixes} if manifest.prefixes > 1 else {}),
        **manifest.extra,
        "sources": [{"path": s.path, "records": list(s.records)} for s in manifest.sources],
    }
    return (json.dumps(obj) + "\n").encode("utf-8")


# -- order ---------------------------------------------------------------------------------------
def dataset_epoch_key(seed: int, epoch: int) -> int:
    """Key of a dataset epoch's block order: ``mix64(mix64(seed ^ TAG) + epoch * GOLDEN_GAMMA)``.

    For a fixed seed, distinct epochs get distinct keys (each step is a bijection of the
    epoch), and no simple relation between seeds makes two ``(seed, epoch)`` pairs collide, as
    ``seed ^ epoch`` (the file order's key) does for ``(0, 1)`` and ``(1, 0)``.
    """
    for name, value in (("seed", seed), ("epoch", epoch)):
        if not 0 <= value <= MASK64:
            raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return mix64((mix64(seed ^ DATASET_KEY_TAG) + epoch * GOLDEN_GAMMA) & MASK64)


def shard_seed(seed: int, shard: int) -> int:
    """The file seed of shard ``shard`` of a dataset written with ``seed``: a u32 derived as
    ``mix64((seed + GOLDEN_GAMMA * (shard + 1)) mod 2**64) mod 2**32``, so shards of one
    dataset never share their record permutation."""
    return mix64((seed + GOLDEN_GAMMA * (shard + 1)) & MASK64) & U32_MAX


def dataset_blocks(
    shard_batches: Sequence[int], block_size: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(first, length)`` of every block, shard by shard: blocks never cross a shard's end.

    Shard ``i`` (``n_i`` slots, first dataset index ``f_i``) has ``ceil(n_i / block_size)``
    blocks; block ``j`` of it starts at ``f_i + j * block_size`` and the last may be short.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    counts = np.asarray(shard_batches, dtype=np.int64)
    # A block never outgrows its shard, so a block_size beyond the largest shard acts like it;
    # clamped, it stays an int64 (the loader accepts block sizes up to 2**64 - 1).
    block_size = min(block_size, max(1, int(counts.max(initial=0))))
    per_shard = -(-counts // block_size)
    starts = np.concatenate([[0], np.cumsum(counts)])[:-1]
    shard_of = np.repeat(np.arange(counts.size), per_shard)
    block_start = np.cumsum(per_shard) - per_shard  # first block index of each shard
    within = np.arange(int(per_shard.sum())) - np.repeat(block_start, per_shard)
    first = starts[shard_of] + within * block_size
    length = np.minimum(block_size, counts[shard_of] - within * block_size)
    return first.astype(np.int64), length.astype(np.int64)


def dataset_block_at(slot: int, num_blocks: int, key: int) -> int:
    """The block served at order slot ``slot``: ``permute(slot, num_blocks, key, 3)``."""
    return permute(slot, num_blocks, key, DOMAIN_DATASET_BLOCKS)


def dataset_epoch_order(
    shard_batches: Sequence[int], block_size: int, seed: int, epoch: int, shuffle: bool = True
) -> npt.NDArray[np.int64]:
    """Every dataset slot index of an epoch in serving order (O(num_batches) memory).

    The reference the loader's lazy order is tested against: blocks in the order of
    ``permute(k, num_blocks, dataset_epoch_key(seed, epoch), 3)``, each block's slots in
    increasing order; unshuffled, the dataset order itself.
    """
    first, length = dataset_blocks(shard_batches, block_size)
    if not shuffle or first.size == 0:
        return np.arange(int(length.sum()), dtype=np.int64)
    key = dataset_epoch_key(seed, epoch)
    blocks = permute_array(np.arange(first.size), first.size, key, DOMAIN_DATASET_BLOCKS)
    blocks = blocks.astype(np.int64)
    runs = [np.arange(f, f + n) for f, n in zip(first[blocks], length[blocks], strict=True)]
    return np.concatenate(runs)
