"""ZeroBatch's own implementation of the conformance protocol (``PROTOCOL.md``).

``zerobatch probe PATH`` answers one vector: a ``.batch`` file is validated (rules 1-8 and the
deep padding check) and described; a ``.query.json`` file asks for a shuffle order. Answers go
through the public core API, so the vectors exercise the reader, writer and loader themselves.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

import numpy as np

from zerobatch_core import BatchFileReader, FormatError, write_batch_file
from zerobatch_core.order import BlockOrder
from zerobatch_core.validation import find_padding_violation


def describe_batch_file(path: str) -> dict[str, Any]:
    """Protocol answer for a ``.batch`` vector."""
    try:
        reader = BatchFileReader(path)
    except FormatError as e:
        return {"valid": False, "error": e.code.value}
    with reader:
        violation = find_padding_violation(reader)
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


def answer_query(query: dict[str, Any]) -> dict[str, Any]:
    """Protocol answer for a ``.query.json`` vector."""
    op = query.get("op")
    if op == "record_permutation":
        return {"result": record_permutation(int(query["total_records"]), int(query["seed"]))}
    if op == "block_order":
        order = BlockOrder(int(query["num_batches"]), int(query["block_size"]), int(query["seed"]))
        return {"result": order.epoch_order(int(query["epoch"])).tolist()}
    return {"unsupported": True}


def probe(path: str) -> dict[str, Any]:
    """Answer the vector at ``path`` per ``PROTOCOL.md``."""
    if path.endswith(".query.json"):
        with open(path, encoding="utf-8") as f:
            return answer_query(json.load(f))
    return describe_batch_file(path)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        print("usage: python -m zerobatch_conformance.probe PATH", file=sys.stderr)
        raise SystemExit(2)
    print(json.dumps(probe(sys.argv[1])))
