"""What every conformance vector is made of: the ``Vector`` record and the spec-only writers.

Shared by the file vectors (``generate.py``) and the dataset vectors (``dataset_vectors.py``).
Nothing here uses the core: files are assembled from ``zerobatch_spec``'s header layout and
record permutation alone, so the vectors test the core rather than echo it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec import (
    DOMAIN_RECORDS,
    DTYPE_UINT32,
    U64_MAX,
    Header,
    batch_offset,
    build_header,
    permute_array,
    token_max,
)
from zerobatch_spec.shuffle import mix64_array

INVALID_QUERY = "invalid_query"
"""The answer's ``error`` for a malformed query (``PROTOCOL.md``)."""


@dataclass
class Vector:
    """One vector before it is written: its input and expected answer.

    ``data`` is the input file's bytes; ``None`` means the input path must not exist at all,
    and ``directory`` that it is a directory (both answered ``unreadable_path``). ``tree``
    makes the input a directory with these files (relative path to bytes; ``None`` for a
    folder that holds only a README), as a dataset vector's input is.
    """

    id: str
    comment: str
    flags: list[str]
    suffix: str
    data: bytes | None
    expected: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    directory: bool = False
    tree: dict[str, bytes | None] | None = None


def pseudo_tokens(count: int, salt: int, dtype: int = DTYPE_UINT32) -> npt.NDArray[np.uint32]:
    """Deterministic tokens spread over the whole range of dtype code ``dtype`` (the low bits of
    SplitMix64), as uint32 values whichever the dtype."""
    idx = np.arange(count, dtype=np.uint64) + np.uint64((salt << 32) & U64_MAX)
    with np.errstate(over="ignore"):
        return (mix64_array(idx) & np.uint64(token_max(dtype))).astype(np.uint32)


def assemble(header: Header, records: npt.NDArray[np.uint32]) -> bytes:
    """File bytes for ``records`` ([total, T]) written per the spec's record permutation, as
    tokens of the header's dtype (every value must fit it: nothing is truncated)."""
    b, t, nb = header.batch_size, header.seq_len, header.num_batches
    total = header.total_records
    if nb == 0:  # nothing but the header (a [0, slot_words] array may not even exist in NumPy)
        return build_header(header)
    assert int(records.max(initial=0)) <= token_max(header.dtype), "a token does not fit"
    positions = np.arange(nb * b, dtype=np.uint64)
    source = permute_array(positions, total, header.seed, DOMAIN_RECORDS).astype(np.int64)
    tokens = records[source].reshape(nb, b * t).astype(header.token_dtype)
    slots = np.zeros((nb, header.slot_words), dtype=header.token_dtype)
    slots[:, : b * t] = tokens
    return build_header(header) + slots.tobytes()


def batch_digests(data: bytes, header: Header) -> list[str]:
    """SHA-256 of each batch's token bytes (its slot without the padding)."""
    b, t, raw = header.batch_size, header.seq_len, header.raw_batch_bytes
    offsets = (batch_offset(i, b, t, header.dtype) for i in range(header.num_batches))
    return [hashlib.sha256(data[off : off + raw]).hexdigest() for off in offsets]


def query_vector(vid: str, comment: str, query: dict[str, Any], result: object) -> Vector:
    """A well-formed query and its ``result`` (a list, or an integer for the key ops)."""
    data = (json.dumps(query, sort_keys=True) + "\n").encode()
    return Vector(
        vid, comment, ["query", str(query["op"])], ".query.json", data, {"result": result}
    )


def invalid_query_vector(vid: str, comment: str, query: object) -> Vector:
    """A malformed query (``query`` is the JSON value, or the raw bytes of a non-JSON file)."""
    if isinstance(query, bytes):
        data = query
    else:
        data = (json.dumps(query, sort_keys=True) + "\n").encode()
    op = query.get("op") if isinstance(query, dict) else None
    flags = ["query", INVALID_QUERY, *([op] if isinstance(op, str) else [])]
    return Vector(vid, comment, flags, ".query.json", data, {"error": INVALID_QUERY})
