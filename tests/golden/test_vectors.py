"""Golden files: every conformance vector, the writer reproducing them, and the generator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from zerobatch_conformance.generate import check_vectors
from zerobatch_conformance.probe import probe
from zerobatch_conformance.runner import _compare, run_vectors
from zerobatch_spec import DTYPE_NAMES, HEADER_STRUCT, build_header, parse_header

from zerobatch_core import BatchFileReader, write_batch_dataset, write_batch_file

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "vectors"
INDEX = json.loads((VECTORS / "index.json").read_text())["vectors"]


def expected(vid: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads((VECTORS / f"{vid}.expected.json").read_text())
    return doc


def test_enough_vectors_and_every_code_covered() -> None:
    assert len(INDEX) >= 30
    codes = {f for e in INDEX for f in e["flags"]}
    for code in (
        "truncated_header",
        "bad_magic",
        "unsupported_version",
        "unsupported_dtype",
        "invalid_shape",
        "nonzero_reserved",
        "size_mismatch",
        "record_count_mismatch",
        "nonzero_padding",
        "rule-order",
        "overflow",
        "off-by-one",
        "zero-batches",
        "one-token",
        "token-range",
        "padding",
        "no-padding",
        "record_permutation",
        "block_order",
        "unreadable_path",
        "invalid_query",
        "max-shape",
        "uint16",
    ):
        assert code in codes, code


@pytest.mark.parametrize("entry", INDEX, ids=[e["id"] for e in INDEX])
def test_vector(entry: dict[str, str]) -> None:
    want = expected(entry["id"])["expected"]
    got = probe(str(VECTORS / entry["input"]))
    assert _compare(want, got) == ""  # type: ignore[arg-type]


def test_block_orders_through_the_runner() -> None:
    outcomes = run_vectors(lambda p: probe(p), str(VECTORS))
    failed = [o for o in outcomes if not o.passed]
    assert not failed
    assert sum("/order-" in o.id for o in outcomes) >= 6 * 10


WRITER = [e for e in INDEX if "writer_input" in expected(e["id"])]


@pytest.mark.parametrize("entry", WRITER, ids=[e["id"] for e in WRITER])
def test_writer_reproduces_vector_bytes(entry: dict[str, str], tmp_path: Path) -> None:
    spec = expected(entry["id"])["writer_input"]
    assert isinstance(spec, dict)
    seq_len, batch_size, seed = spec["seq_len"], spec["batch_size"], spec["seed"]
    dtype = spec.get("dtype", 0)  # the dtype code, stated only where it is not 0
    src = np.array(spec["records"], dtype=np.uint32).reshape(len(spec["records"]), seq_len)
    golden = (VECTORS / entry["input"]).read_bytes()
    write_batch_file(
        tmp_path / "a.batch", src, batch_size, seq_len, seed, allow_empty=True, dtype=dtype
    )
    assert (tmp_path / "a.batch").read_bytes() == golden
    write_batch_dataset(
        tmp_path / "b.batch",
        iter(src),
        len(src),
        batch_size,
        seq_len,
        seed,
        allow_empty=True,
        dtype=DTYPE_NAMES[dtype],  # the name, as users spell it
    )
    assert (tmp_path / "b.batch").read_bytes() == golden


def test_writer_input_names_its_seq_len() -> None:
    """With no records the shape cannot be derived, so every writer input states seq_len."""
    for entry in WRITER:
        spec = expected(entry["id"])["writer_input"]
        assert isinstance(spec, dict)
        assert isinstance(spec["seq_len"], int) and spec["seq_len"] >= 1
        assert all(len(r) == spec["seq_len"] for r in spec["records"])


def test_writer_vectors_exist() -> None:
    assert len(WRITER) >= 8
    assert sum("uint16" in e["flags"] for e in WRITER) >= 8


U16_WRITER = [e for e in WRITER if "uint16" in e["flags"]]


@pytest.mark.parametrize("entry", U16_WRITER, ids=[e["id"] for e in U16_WRITER])
def test_uint16_vector_holds_the_uint32_files_tokens_in_half_the_token_bytes(
    entry: dict[str, str], tmp_path: Path
) -> None:
    """A dtype 1 vector's writer input written as uint32 gives the same tokens, batch for batch,
    in slots of twice the token bytes (rounded up to pages)."""
    spec = expected(entry["id"])["writer_input"]
    assert isinstance(spec, dict) and spec["dtype"] == 1
    src = np.array(spec["records"], dtype=np.uint32).reshape(-1, spec["seq_len"])
    wide = tmp_path / "wide.batch"
    write_batch_file(wide, src, spec["batch_size"], spec["seq_len"], spec["seed"], allow_empty=True)
    with BatchFileReader(VECTORS / entry["input"]) as n, BatchFileReader(wide) as w:
        assert (n.dtype, w.dtype) == (1, 0)
        assert n.num_batches == w.num_batches
        words = spec["batch_size"] * spec["seq_len"]
        assert n.padded_batch_bytes == -(-words * 2 // 4096) * 4096
        assert w.padded_batch_bytes == -(-words * 4 // 4096) * 4096
        for i in range(n.num_batches):
            assert n.read_batch(i).dtype == np.uint16
            np.testing.assert_array_equal(n.read_batch(i), w.read_batch(i))


VALID = [e for e in INDEX if "valid" in e["flags"]]


@pytest.mark.parametrize("entry", VALID, ids=[e["id"] for e in VALID])
def test_construct_parse_build_identity_on_vectors(entry: dict[str, str]) -> None:
    head = (VECTORS / entry["input"]).read_bytes()[:4096]
    assert HEADER_STRUCT.build(HEADER_STRUCT.parse(head)) == head
    assert build_header(parse_header(head)) == head


def test_generator_reproduces_committed_vectors() -> None:
    assert check_vectors(str(VECTORS)) == []


def test_probe_answers_paths_that_are_not_files_without_blocking(tmp_path: Path) -> None:
    """A FIFO or a directory gets ``unreadable_path`` as JSON, exit 0, and never blocks."""
    fifo_batch, fifo_query = tmp_path / "f.batch", tmp_path / "f.query.json"
    os.mkfifo(fifo_batch)
    os.mkfifo(fifo_query)
    folder_query = tmp_path / "d.query.json"
    folder_query.mkdir()
    for path, answer in (
        (fifo_batch, {"valid": False, "error": "unreadable_path"}),
        (tmp_path, {"valid": False, "error": "unreadable_path"}),
        (fifo_query, {"error": "unreadable_path"}),
        (folder_query, {"error": "unreadable_path"}),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "zerobatch_conformance.probe", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert {k: got[k] for k in answer} == answer, got
        assert str(path) in got["detail"]


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000, '{"op": "block_order", "num_batches": 1e400}', "", "null"],
    ids=["nested-too-deep", "number-too-large-for-a-float", "empty", "null"],
)
def test_probe_answers_any_malformed_query(tmp_path: Path, text: str) -> None:
    path = tmp_path / "q.query.json"
    path.write_text(text)
    assert probe(str(path))["error"] == "invalid_query"


def test_probe_query_ranges_are_inclusive(tmp_path: Path) -> None:
    """The stated ranges' ends are accepted: a u32 seed of 2^32 - 1, a u64 epoch of 2^64 - 1."""
    path = tmp_path / "q.query.json"
    path.write_text(json.dumps({"op": "record_permutation", "total_records": 3, "seed": 2**32 - 1}))
    assert sorted(probe(str(path))["result"]) == [0, 1, 2]
    order = {"op": "block_order", "num_batches": 3, "block_size": 2**64 - 1}
    path.write_text(json.dumps({**order, "seed": 2**64 - 1, "epoch": 2**64 - 1}))
    assert probe(str(path))["result"] == [0, 1, 2]
    path.write_text(json.dumps({**order, "seed": 0, "epoch": 0, "block_size": 1, "x": None}))
    assert sorted(probe(str(path))["result"]) == [0, 1, 2]
