"""ZeroBatch's own implementation of the conformance protocol (``PROTOCOL.md``).

``zerobatch probe PATH`` answers one vector: a ``.batch`` file is validated (rules 1-8 and the
deep padding check) and described; a ``.query.json`` file asks for a shuffle order. Answers go
through the public core API, so the vectors exercise the reader, writer and loader themselves.
Every input gets a JSON answer: a path that cannot be read as a regular file is answered with
the code ``unreadable_path``, and a malformed query with ``invalid_query``.
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
from zerobatch_spec import U32_MAX, U64_MAX, ErrorCode

from zerobatch_core import BatchFileReader, FormatError, write_batch_file
from zerobatch_core.order import BlockOrder
from zerobatch_core.validation import find_padding_violation

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
}
"""Each op's fields and their inclusive ranges, as ``PROTOCOL.md`` states them."""

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


def query_fields(query: object) -> tuple[str | None, dict[str, int]]:
    """The query's op and its fields, each checked to be a JSON integer in its range.

    Returns ``(None, {})`` for a well-formed query whose op this probe does not know. Extra
    keys are ignored, as the protocol requires.
    """
    if not isinstance(query, dict):
        raise QueryError(f"a query is a JSON object, got {type(query).__name__}")
    op = query.get("op")
    if not isinstance(op, str):
        raise QueryError(f"field op must be a string, got {op!r:.80}")
    fields = QUERY_FIELDS.get(op)
    if fields is None:
        return None, {}
    values: dict[str, int] = {}
    for name, (low, high) in fields.items():
        if name not in query:
            raise QueryError(f"{op}: field {name} is missing")
        value = query[name]
        # JSON true/false decode as Python bool, an int subclass: they are not JSON integers.
        if not isinstance(value, int) or isinstance(value, bool):
            raise QueryError(f"{op}: field {name} must be a JSON integer, got {value!r:.80}")
        if not low <= value <= high:
            raise QueryError(f"{op}: field {name} must be in [{low}, {high}], got {value}")
        values[name] = value
    return op, values


def answer_query(query: object) -> dict[str, Any]:
    """Protocol answer for a parsed ``.query.json`` vector."""
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
    return {"unsupported": True}


def probe(path: str) -> dict[str, Any]:
    """Answer the vector at ``path`` per ``PROTOCOL.md``."""
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
