"""ZeroBatch's own implementation of the conformance protocol (``PROTOCOL.md``).

``zerobatch probe PATH`` answers one vector: a ``.batch`` file is validated (rules 1-8 and the
deep padding check) and described; a ``.dataset`` directory is validated (``SPEC.md`` section
13, deep checks included) and described; a ``.query.json`` file asks for a shuffle order, a
dataset epoch key or a shard seed. Answers go through the public core API (the file reader and
writer, ``DatasetReader`` for the manifest, the checksums file and each shard's checks against
the manifest, the loader's orders), so the vectors exercise the core itself; for a version 2
dataset the reader's shard table reads and checks the shard index (its top at open, a page at
a shard's first use). The checks only deep validation makes (every slot's padding and
checksum, each shard's range of the checksums file against its index record, unlisted shards)
are made here from the core's slot views and ``zerobatch_spec``. Every input gets a JSON
answer: a path that cannot be read is answered with the code ``unreadable_path``, and a
malformed query with ``invalid_query``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec import U32_MAX, U64_MAX, ErrorCode
from zerobatch_spec.dataset import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    DatasetCode,
    bytes_xxh3,
    dataset_epoch_key,
    shard_seed,
)

from zerobatch_core import BatchFileReader, FormatError, write_batch_file
from zerobatch_core.datasets.dataset import DatasetError, DatasetReader, file_slot_checksum
from zerobatch_core.files.validation import find_padding_violation
from zerobatch_core.order import BlockOrder, sharded_order

from .live_probe import describe_live
from .mixture_probe import answer_mixture_order

INVALID_QUERY = "invalid_query"
"""The ``error`` of a query that is not a JSON object with the fields its ``op`` needs, each a
JSON integer in its range (``PROTOCOL.md``)."""

QUERY_FIELDS: dict[str, dict[str, tuple[int, int]]] = {
    "record_permutation": {"total_records": (0, U32_MAX), "seed": (0, U32_MAX)},
    "block_order": {
        "num_batches": (0, U64_MAX),
        "block_size": (1, U64_MAX),
        "seed": (0, U64_MAX),
        "epoch": (0, U64_MAX),
    },
    "dataset_order": {"block_size": (1, U64_MAX), "seed": (0, U64_MAX), "epoch": (0, U64_MAX)},
    "dataset_epoch_key": {"seed": (0, U64_MAX), "epoch": (0, U64_MAX)},
    "shard_seed": {"seed": (0, U64_MAX), "shard": (0, U64_MAX)},
}
"""Each op's integer fields and their inclusive ranges, as ``PROTOCOL.md`` states them."""

QUERY_LISTS: dict[str, dict[str, tuple[int, int]]] = {
    "dataset_order": {"shard_batches": (0, U64_MAX)},
}
"""Each op's list fields: a JSON list of JSON integers, each and their sum in the range."""

QUERY_BOOLEANS: dict[str, tuple[str, ...]] = {"dataset_order": ("shuffle",)}
"""Each op's boolean fields: JSON ``true`` or ``false``."""

MAX_ANSWER = 1 << 24
"""Longest list this probe answers; a longer one is answered ``unsupported`` (``PROTOCOL.md``
lets an implementation decline an answer it cannot hold; the vectors stay far below this)."""


def unreadable(path: str, error: OSError, query: bool = False) -> dict[str, Any]:
    """Protocol answer for a path that cannot be opened and read as a regular file."""
    answer: dict[str, Any] = {} if query else {"valid": False}
    answer["error"] = ErrorCode.UNREADABLE_PATH.value
    answer["detail"] = f"{path}: {error.strerror or error}"
    return answer


def describe_batch_file(path: str) -> dict[str, Any]:
    """Protocol answer for a ``.batch`` vector."""
    try:
        reader = BatchFileReader(path)
    except FormatError as e:
        return {"valid": False, "error": e.code.value}
    except OSError as e:  # missing, permission denied, not a regular file
        return unreadable(path, e)
    with reader:
        try:
            violation = find_padding_violation(reader)
        except FormatError as e:  # the file shrank while it was read
            return {"valid": False, "error": e.code.value}
        if violation is not None:
            return {"valid": False, "error": violation.code.value}
        digests = [
            hashlib.sha256(reader.read_batch(i).tobytes()).hexdigest()
            for i in range(reader.num_batches)
        ]
        return {
            "valid": True,
            "header": reader.header.as_dict(),
            "padded_batch_bytes": reader.padded_batch_bytes,
            "batch_sha256": digests,
        }


def record_permutation(total_records: int, seed: int) -> list[int]:
    """Source record at each output position, observed by writing records ``0..n-1``."""
    if total_records == 0:
        return []
    records = np.arange(total_records, dtype=np.uint32).reshape(total_records, 1)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perm.batch")
        write_batch_file(out, records, batch_size=1, seed=seed)
        with BatchFileReader(out) as reader:
            return [int(v) for v in reader.read_batches(0, reader.num_batches).reshape(-1)]


class QueryError(Exception):
    """A malformed query; the message says which field and why."""


def _integer(op: str, name: str, value: object, low: int, high: int) -> int:
    # JSON true/false decode as Python bool, an int subclass: they are not JSON integers.
    if not isinstance(value, int) or isinstance(value, bool):
        raise QueryError(f"{op}: field {name} must be a JSON integer, got {value!r:.80}")
    if not low <= value <= high:
        raise QueryError(f"{op}: field {name} must be in [{low}, {high}], got {value}")
    return value


def query_fields(query: object) -> tuple[str | None, dict[str, Any]]:
    """The query's op and its fields, each checked to be of its JSON type and in its range.

    Integer fields are ``int``, list fields ``list[int]``, boolean fields ``bool``. Returns
    ``(None, {})`` for a well-formed query whose op this probe does not know. Extra keys are
    ignored, as the protocol requires.
    """
    if not isinstance(query, dict):
        raise QueryError(f"a query is a JSON object, got {type(query).__name__}")
    op = query.get("op")
    if not isinstance(op, str):
        raise QueryError(f"field op must be a string, got {op!r:.80}")
    fields = QUERY_FIELDS.get(op)
    if fields is None:
        return None, {}
    names = [*fields, *QUERY_LISTS.get(op, {}), *QUERY_BOOLEANS.get(op, ())]
    missing = [name for name in names if name not in query]
    if missing:
        raise QueryError(f"{op}: field {missing[0]} is missing")
    values: dict[str, Any] = {}
    for name, (low, high) in fields.items():
        values[name] = _integer(op, name, query[name], low, high)
    for name, (low, high) in QUERY_LISTS.get(op, {}).items():
        items = query[name]
        if not isinstance(items, list):
            raise QueryError(f"{op}: field {name} must be a JSON list, got {items!r:.80}")
        values[name] = [_integer(op, f"{name}[{i}]", v, low, high) for i, v in enumerate(items)]
        _integer(op, f"the sum of {name}", sum(values[name]), low, high)
    for name in QUERY_BOOLEANS.get(op, ()):
        if not isinstance(query[name], bool):
            raise QueryError(f"{op}: field {name} must be true or false, got {query[name]!r:.80}")
        values[name] = query[name]
    return op, values


def answer_query(query: object) -> dict[str, Any]:
    """Protocol answer for a parsed ``.query.json`` vector."""
    if isinstance(query, dict) and query.get("op") == "mixture_order":
        return answer_mixture_order(query, INVALID_QUERY)
    try:
        op, q = query_fields(query)
    except QueryError as e:
        return {"error": INVALID_QUERY, "detail": str(e)}
    if op == "record_permutation":
        if q["total_records"] > MAX_ANSWER:
            return {"unsupported": True, "detail": f"answers longer than {MAX_ANSWER}"}
        return {"result": record_permutation(q["total_records"], q["seed"])}
    if op == "block_order":
        if q["num_batches"] > MAX_ANSWER:
            return {"unsupported": True, "detail": f"answers longer than {MAX_ANSWER}"}
        order = BlockOrder(q["num_batches"], q["block_size"], q["seed"])
        return {"result": order.epoch_order(q["epoch"]).tolist()}
    if op == "dataset_order":
        if sum(q["shard_batches"]) > MAX_ANSWER:
            return {"unsupported": True, "detail": f"answers longer than {MAX_ANSWER}"}
        dataset = sharded_order(q["shard_batches"], q["block_size"], q["seed"], q["shuffle"])
        return {"result": dataset.epoch_order(q["epoch"]).tolist()}
    if op == "dataset_epoch_key":
        return {"result": dataset_epoch_key(q["seed"], q["epoch"])}
    if op == "shard_seed":
        return {"result": shard_seed(q["seed"], q["shard"])}
    return {"unsupported": True}


def probe(path: str) -> dict[str, Any]:
    """Answer the vector at ``path`` per ``PROTOCOL.md``."""
    if path.rstrip(os.sep).endswith(DATASET_SUFFIX):
        return describe_dataset(path)
    if path.rstrip(os.sep).endswith(LIVE_SUFFIX):
        return describe_live(path)
    if not path.endswith(".query.json"):
        return describe_batch_file(path)
    try:
        data = read_regular_file(path)
    except OSError as e:
        return unreadable(path, e, query=True)
    try:
        query = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        return {"error": INVALID_QUERY, "detail": f"not a UTF-8 JSON document: {e}"}
    return answer_query(query)


DATASET_SUFFIX = ".dataset"
"""Name ending of a dataset directory vector (``PROTOCOL.md``)."""

LIVE_SUFFIX = ".live"
"""Name ending of a live-dataset vector: a descriptor and one manifest version."""

BATCH_SUFFIX = b".batch"
"""Name ending of the directory entries deep validation counts as shards (``extra_shard``)."""


def dataset_failure(code: str, where: str, slot: int | None = None) -> dict[str, Any]:
    """Protocol answer for a dataset that breaks a rule."""
    answer: dict[str, Any] = {"valid": False, "error": code, "where": where}
    if slot is not None:
        answer["slot"] = slot
    return answer


def describe_dataset(path: str) -> dict[str, Any]:
    """Protocol answer for a ``.dataset`` vector: its first failure in ``SPEC.md`` section 13's
    order (deep checks included), or its shape, per-slot SHA-256 and manifest digest."""
    manifest_path = os.path.join(path, MANIFEST_NAME)
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a dataset directory", path)
        read_regular_file(manifest_path)  # refuses a FIFO without blocking, unlike open()
        reader = DatasetReader(path, verify="off")
    except DatasetError as e:
        return dataset_failure(e.code.value, e.where)
    except OSError as e:  # no directory, no manifest, or one that cannot be read
        return unreadable(os.fsdecode(e.filename) if e.filename else path, e)
    with reader:
        failure = first_dataset_failure(reader)
        if failure is not None:
            return failure
        manifest = reader.manifest
        return {
            "valid": True,
            "batch_size": manifest.batch_size,
            "seq_len": manifest.seq_len,
            "dtype": manifest.dtype,
            "seed": manifest.seed,
            "num_batches": reader.num_batches,
            "shard_batches": [int(n) for n in reader.table.counts],
            "manifest_sha256": reader.manifest_sha256,
            "batch_sha256": [
                hashlib.sha256(reader.read_batch(i).tobytes()).hexdigest()
                for i in range(reader.num_batches)
            ],
        }


def first_dataset_failure(reader: DatasetReader) -> dict[str, Any] | None:
    """The first rule an opened dataset breaks after its manifest, in section 13's order.

    The checksums file against the manifest; then shard by shard, its checks against the
    manifest as ``DatasetReader`` opens it, then each of its slots' padding and checksum;
    then the directory's ``*.batch`` entries the manifest does not list, in byte order.
    """
    sums_path = os.path.join(reader.path, CHECKSUMS_NAME)
    try:
        if not stat.S_ISREG(os.stat(sums_path).st_mode):  # reader.checksums() would open it
            return dataset_failure(DatasetCode.CHECKSUMS_MISMATCH.value, CHECKSUMS_NAME)
        sums = reader.checksums()
    except DatasetError as e:
        return dataset_failure(e.code.value, e.where)
    except OSError:  # missing, or cannot be read
        return dataset_failure(DatasetCode.CHECKSUMS_MISMATCH.value, CHECKSUMS_NAME)
    table = reader.table
    first = table.firsts
    for i in range(len(table)):
        try:
            entry = table.entry(i)  # version 2: the shard's page of the index, checked
        except DatasetError as e:
            return dataset_failure(e.code.value, e.where)
        try:
            shard = reader.shard(i)
            shard.check_size()  # a shard shrunk since it was opened: reported, never touched
        except DatasetError as e:
            return dataset_failure(e.code.value, e.where)
        except FormatError as e:  # the shard breaks a file rule (section 4)
            return dataset_failure(e.code.value, entry.name)
        except OSError:  # present but cannot be opened or read
            return dataset_failure(DatasetCode.SHARD_MISSING.value, entry.name)
        start, stop = int(first[i]), int(first[i + 1])
        for local in range(entry.num_batches):
            if shard.slot_padding(local, local + 1).any():
                return dataset_failure(ErrorCode.NONZERO_PADDING.value, entry.name, local)
            if local == 0 and not range_matches(table.checksums_xxh3(i), sums[start:stop]):
                return dataset_failure(DatasetCode.CHECKSUMS_MISMATCH.value, CHECKSUMS_NAME)
            if file_slot_checksum(shard, local) != int(sums[start + local]):
                return dataset_failure(DatasetCode.CHECKSUM_MISMATCH.value, entry.name, local)
    listed = {s.name for s in table.entries()}
    if reader.manifest.index is not None:  # validation ignores the index's own name
        listed.add(reader.manifest.index.name)
    for raw in sorted(os.listdir(os.fsencode(reader.path))):
        name = os.fsdecode(raw)
        if raw.endswith(BATCH_SUFFIX) and name not in listed:
            return dataset_failure(DatasetCode.EXTRA_SHARD.value, name)
    return None


def range_matches(digest: str | None, sums: npt.NDArray[np.uint64]) -> bool:
    """Whether a shard's range of ``checksums.xxh3`` has the digest its index record states
    (version 2, ``SPEC.md`` section 23.3: a checked read checks it before its slot); always
    true for version 1, which has no such digest."""
    return digest is None or bytes_xxh3(sums.tobytes()) == digest


def read_regular_file(path: str) -> bytes:
    """The bytes of ``path``; ``OSError`` if it is missing, unreadable or not a regular file.

    Opened without blocking and checked before reading, so a FIFO is refused rather than
    waited on.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
            raise OSError(code, "not a regular file", path)
        return f.read()


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        print("usage: python -m zerobatch_conformance.probe PATH", file=sys.stderr)
        raise SystemExit(2)
    print(json.dumps(probe(sys.argv[1])))
