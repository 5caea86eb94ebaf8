"""Golden datasets: every dataset vector against the reference (``zerobatch_spec.dataset``) and
the core (the probe, ``DatasetReader``, ``validate_dataset``, the loader's order, the sharded
writer, ``create_dataset``), and SPEC.md's section 12 example and section 15 test values
recomputed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from zerobatch_conformance.probe import probe
from zerobatch_conformance.runner import _compare, run_vectors, vector_kind
from zerobatch_spec import permute
from zerobatch_spec.dataset import (
    CHECKSUMS_NAME,
    DATASET_KEY_TAG,
    DOMAIN_DATASET_BLOCKS,
    MANIFEST_NAME,
    DatasetCode,
    DatasetViolation,
    Manifest,
    Source,
    build_manifest,
    dataset_blocks,
    dataset_epoch_key,
    dataset_epoch_order,
    parse_manifest,
    shard_seed,
)
from zerobatch_spec.index import IndexedShard, IndexTop, iter_shards, parse_top
from zerobatch_spec.shuffle import GOLDEN_GAMMA, mix64

from zerobatch_core import FormatError, ZeroBatchIOError
from zerobatch_core.datasets.build import create_dataset, write_sharded_dataset
from zerobatch_core.datasets.dataset import DatasetError, DatasetReader
from zerobatch_core.datasets.validation import validate_dataset
from zerobatch_core.order import sharded_order

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "conformance" / "vectors"
INDEX = json.loads((VECTORS / "index.json").read_text())["vectors"]
DATASETS = [e for e in INDEX if vector_kind(e["input"]) == "dataset"]
DATASET_OPS = ("dataset_order", "dataset_epoch_key", "shard_seed")
QUERIES = [
    e for e in INDEX if "query" in e["flags"] and any(op in e["flags"] for op in DATASET_OPS)
]


def doc(entry: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((VECTORS / f"{entry['id']}.expected.json").read_text())
    return loaded


def ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entries]


def of(flag: str) -> list[dict[str, Any]]:
    return [e for e in DATASETS if flag in e["flags"]]


VALID, MANIFESTS = of("dataset-valid"), of("manifest")


def test_every_dataset_code_and_case_has_vectors() -> None:
    flags = {f for e in DATASETS for f in e["flags"]}
    assert {c.value for c in DatasetCode} <= flags
    for flag in ("bad_magic", "size_mismatch", "nonzero_padding", "unreadable_path"):
        assert flag in flags, flag
    for flag in ("empty-shard", "one-shard", "no-shards", "unknown-keys", "rule-order", "overflow"):
        assert flag in flags, flag
    assert len(VALID) >= 5 and len(MANIFESTS) >= 40 and len(DATASETS) >= 90
    ops = {f for e in QUERIES for f in e["flags"]}
    assert set(DATASET_OPS) <= ops
    assert sum("invalid_query" in e["flags"] for e in QUERIES) >= 10


@pytest.mark.parametrize("entry", DATASETS + QUERIES, ids=ids(DATASETS + QUERIES))
def test_probe_answers_the_vector(entry: dict[str, Any]) -> None:
    assert _compare(doc(entry)["expected"], probe(str(VECTORS / entry["input"]))) == ""


def test_dataset_orders_through_the_runner() -> None:
    outcomes = run_vectors(probe, str(VECTORS), frozenset({"dataset", "query"}))
    assert [o for o in outcomes if not o.passed] == []
    derived = [o for o in outcomes if o.id.startswith("dataset-") and "/order-" in o.id]
    assert len(derived) == 5 * len(VALID)


@pytest.mark.parametrize("entry", DATASETS, ids=[e["id"] for e in DATASETS])
def test_deep_validation_reports_the_vector_first(entry: dict[str, Any]) -> None:
    """``validate_dataset`` lists every failure in section 13's order: its first is the
    vector's answer, naming the same field or shard and slot."""
    want = doc(entry)["expected"]
    path = VECTORS / entry["input"]
    if want.get("error") == "unreadable_path":
        with pytest.raises(ZeroBatchIOError):
            validate_dataset(path, deep=True)
        return
    report = validate_dataset(path, deep=True)
    assert report.valid is want["valid"]
    if not want["valid"]:
        first = report.failures[0]
        got = (first.code, first.shard or first.where, first.slot)
        assert got == (want["error"], want["where"], want.get("slot"))


# -- the reference -------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", MANIFESTS, ids=ids(MANIFESTS))
def test_the_reference_parser_reports_the_vector_rule(entry: dict[str, Any]) -> None:
    want = doc(entry)["expected"]
    got = parse_manifest((VECTORS / entry["input"] / MANIFEST_NAME).read_bytes())
    assert isinstance(got, DatasetViolation)
    assert (got.code.value, got.where) == (want["error"], want["where"])
    with pytest.raises(DatasetError) as err:  # the core refuses it at open, naming the field
        DatasetReader(VECTORS / entry["input"])
    assert (err.value.code.value, err.value.where) == (want["error"], want["where"])
    assert want["where"] in str(err.value)


@pytest.mark.parametrize("entry", VALID, ids=ids(VALID))
def test_valid_dataset_through_the_reference_and_the_core(entry: dict[str, Any]) -> None:
    want = doc(entry)["expected"]
    path = VECTORS / entry["input"]
    raw = (path / MANIFEST_NAME).read_bytes()
    manifest = parse_manifest(raw)
    assert isinstance(manifest, Manifest)
    assert reference_shard_batches(path, manifest) == want["shard_batches"]
    if "unknown-keys" not in entry["flags"]:  # written by a writer: the canonical bytes
        assert build_manifest(manifest) == raw
    sums = np.frombuffer((path / CHECKSUMS_NAME).read_bytes(), dtype="<u8")
    assert sums.size == want["num_batches"]
    with DatasetReader(path, verify="always") as reader:
        assert reader.manifest_sha256 == want["manifest_sha256"]
        digests = [
            hashlib.sha256(reader.read_batch(i).tobytes()).hexdigest()
            for i in range(reader.num_batches)
        ]
        assert digests == want["batch_sha256"]
        for case in want["dataset_orders"]:
            args = (case["block_size"], case["seed"], case["epoch"], case["shuffle"])
            spec = dataset_epoch_order(want["shard_batches"], *args)
            assert spec.tolist() == case["order"]
            core = reader.order(case["block_size"], case["seed"], case["shuffle"])
            assert core.epoch_order(case["epoch"]).tolist() == case["order"]


def reference_shard_batches(path: Path, manifest: Manifest) -> list[int]:
    """Each shard's slot count by the reference: the manifest's list (version 1), or every
    record of the index, each page checked (version 2), which must agree with its runs."""
    if manifest.index is None:
        return manifest.shard_batches
    assert manifest.version == 2
    data = (path / manifest.index.name).read_bytes()
    assert len(data) == manifest.index.size
    top = parse_top(data, len(data))
    assert isinstance(top, IndexTop) and top.xxh3 == manifest.index.xxh3
    assert (top.shard_count, top.num_batches) == (manifest.shard_count, manifest.num_batches)
    entries = list(iter_shards(top, data))
    assert all(isinstance(e, IndexedShard) for e in entries)
    counts = [e.shard.num_batches for e in entries if isinstance(e, IndexedShard)]
    assert counts == top.shard_batches().tolist()
    return counts


def test_version_2_vectors_exist() -> None:
    """Version 2 (SPEC.md section 23): valid datasets of every kind, and a broken index for
    each check of section 23.3."""
    v2 = of("v2")
    valid = [e for e in v2 if "dataset-valid" in e["flags"]]
    assert len(valid) >= 8 and len(v2) >= 100
    for flag in ("writer", "described", "no-shards", "uint16", "pages", "index-name"):
        assert any(flag in e["flags"] for e in valid), flag
    flags = {f for e in v2 for f in e["flags"]}
    for flag in ("index_missing", "index_mismatch", "checksums_mismatch", "extra_shard", "page"):
        assert flag in flags, flag
    wheres = {doc(e)["expected"].get("where") for e in v2}
    for where in ("index", "index.top_xxh3", "index.runs", "index.pages[1]", "index.magic"):
        assert where in wheres, where


WRITTEN = [e for e in VALID if "dataset_writer_input" in doc(e)]
DESCRIBED = [e for e in VALID if "dataset_create_input" in doc(e)]


def same_tree(made: Path, golden: Path) -> None:
    names = sorted(os.listdir(made))
    assert names == sorted(os.listdir(golden))
    for name in names:
        assert (made / name).read_bytes() == (golden / name).read_bytes(), name


@pytest.mark.parametrize("entry", WRITTEN, ids=ids(WRITTEN))
def test_the_sharded_writer_reproduces_the_vector(entry: dict[str, Any], tmp_path: Path) -> None:
    spec = doc(entry)["dataset_writer_input"]
    records = np.array(spec["records"], dtype=np.uint32).reshape(-1, spec["seq_len"])
    write_sharded_dataset(
        tmp_path / "out",
        iter([records]),
        batch_size=spec["batch_size"],
        seq_len=spec["seq_len"],
        shard_batches=spec["shard_batches"],
        seed=spec["seed"],
        sources=[Source(s["path"], tuple(s["records"])) for s in spec["sources"]],
        allow_empty=True,
        dtype=spec.get("dtype", 0),  # the dtype code, stated only where it is not 0
        manifest_version=spec.get("manifest_version", 1),  # stated only where it is not 1
        prefixes=spec.get("prefixes", 1),  # stated only where it is not 1
    )
    same_tree(tmp_path / "out", VECTORS / entry["input"])


@pytest.mark.parametrize("entry", DESCRIBED, ids=ids(DESCRIBED))
def test_create_dataset_reproduces_the_vector(entry: dict[str, Any], tmp_path: Path) -> None:
    spec = doc(entry)["dataset_create_input"]
    out = tmp_path / "out"
    out.mkdir()
    for name in spec["names"]:
        shutil.copyfile(VECTORS / entry["input"] / name, out / name)
    create_dataset(
        out, spec["names"], seed=spec["seed"], manifest_version=spec.get("manifest_version", 1)
    )
    same_tree(out, VECTORS / entry["input"])


def test_writer_vectors_exist() -> None:
    assert len(WRITTEN) >= 4 and len(DESCRIBED) >= 1
    assert sum("uint16" in e["flags"] for e in WRITTEN) >= 2
    assert sum("uint16" in e["flags"] for e in DESCRIBED) >= 1
    assert sum("manifest_version" in doc(e)["dataset_writer_input"] for e in WRITTEN) >= 4
    assert sum("manifest_version" in doc(e)["dataset_create_input"] for e in DESCRIBED) >= 2


# -- what a loader finds on read, and what only deep validation finds ---------------------------
READ = [
    e
    for e in DATASETS
    if "dataset-invalid" in e["flags"]
    and not ({"manifest", "rule-order", "unreadable_path"} & set(e["flags"]))
]


def read_everything(path: Path) -> None:
    with DatasetReader(path, verify="always") as reader:
        for i in range(reader.num_batches):
            reader.read_batch(i)


KNOWN_GAPS: dict[str, str] = {}
"""Vectors the core's reader does not yet answer with the spec's code (strict: fixing one
fails the test until its entry is removed)."""


def read_params() -> list[Any]:
    return [
        pytest.param(
            e,
            id=e["id"],
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[e["id"]])]
            if e["id"] in KNOWN_GAPS
            else [],
        )
        for e in READ
    ]


@pytest.mark.parametrize("entry", read_params())
def test_reading_every_slot_meets_the_failure_or_serves(entry: dict[str, Any]) -> None:
    """Shard, checksums and slot failures stop a reader that verifies every slot, naming the
    shard; only ``extra_shard`` and padding covered by its checksum are left to deep
    validation, and such a dataset is served."""
    want = doc(entry)["expected"]
    path = VECTORS / entry["input"]
    if want["error"] in ("extra_shard", "nonzero_padding"):
        read_everything(path)
        return
    with pytest.raises((DatasetError, FormatError)) as err:
        read_everything(path)
    assert err.value.code.value == want["error"]
    assert want["where"] in str(err.value)
    if "slot" in want:
        assert f"slot {want['slot']} " in str(err.value)


# -- queries against the reference --------------------------------------------------------------
ANSWERED = [e for e in QUERIES if "invalid_query" not in e["flags"]]


@pytest.mark.parametrize("entry", ANSWERED, ids=ids(ANSWERED))
def test_query_results_are_the_reference(entry: dict[str, Any]) -> None:
    query = json.loads((VECTORS / entry["input"]).read_text())
    want = doc(entry)["expected"]["result"]
    if query["op"] == "dataset_order":
        args = [query[k] for k in ("shard_batches", "block_size", "seed", "epoch", "shuffle")]
        assert dataset_epoch_order(*args).tolist() == want
        first, length = dataset_blocks(query["shard_batches"], query["block_size"])
        key = dataset_epoch_key(query["seed"], query["epoch"])
        if query["shuffle"]:  # section 14, written out: permuted blocks, each in slot order
            slots = [permute(k, first.size, key, DOMAIN_DATASET_BLOCKS) for k in range(first.size)]
        else:
            slots = list(range(first.size))
        assert [int(first[k]) + j for k in slots for j in range(int(length[k]))] == want
        core = sharded_order(query["shard_batches"], query["block_size"], query["seed"])
        if query["shuffle"]:
            assert core.epoch_order(query["epoch"]).tolist() == want
    elif query["op"] == "dataset_epoch_key":
        inner = mix64(query["seed"] ^ DATASET_KEY_TAG)
        assert want == mix64((inner + query["epoch"] * GOLDEN_GAMMA) % 2**64)
        assert want == dataset_epoch_key(query["seed"], query["epoch"])
    else:
        assert want == mix64((query["seed"] + GOLDEN_GAMMA * (query["shard"] + 1)) % 2**64) % 2**32
        assert want == shard_seed(query["seed"], query["shard"])


def test_probe_refuses_a_fifo_manifest_without_blocking(tmp_path: Path) -> None:
    folder = tmp_path / "x.dataset"
    folder.mkdir()
    os.mkfifo(folder / MANIFEST_NAME)
    proc = subprocess.run(
        [sys.executable, "-m", "zerobatch_conformance.probe", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["error"] == "unreadable_path"


# -- SPEC.md section 15 --------------------------------------------------------------------------
def test_section_15_values_are_the_reference() -> None:
    spec = (ROOT / "spec" / "SPEC.md").read_text(encoding="utf-8")
    section_15 = spec[spec.index("## 15. Dataset test values") :]
    keys = re.findall(r"`dataset_epoch_key\(([^,]+), ([^)]+)\) = (0x[0-9a-f]{16})`", section_15)
    seeds = re.findall(r"`shard_seed\(([^,]+), ([^)]+)\) = (\d+)`", section_15)
    hashes = re.findall(r"`XXH3-64\(([^)]*)\) = (0x[0-9a-f]{16})`", section_15)
    assert len(keys) >= 8 and len(seeds) >= 8 and len(hashes) >= 3

    def value(text: str) -> int:
        return {"TAG": DATASET_KEY_TAG, "2^64-1": 2**64 - 1}.get(text) or int(text, 0)

    for seed, epoch, key in keys:
        assert dataset_epoch_key(value(seed), value(epoch)) == int(key, 16), (seed, epoch)
    for seed, shard, want in seeds:
        assert shard_seed(value(seed), value(shard)) == int(want), (seed, shard)
    inputs = {
        "empty input": b"",
        "4096 zero bytes": bytes(4096),
        '"abc"': b"abc",
    }
    for text, digest in hashes:
        assert xxhash.xxh3_64_intdigest(inputs[text]) == int(digest, 16), text
    order = dataset_epoch_order([3, 0, 5, 1], 2, 42, 0).tolist()
    assert f"`{order}`" in section_15
    assert str(dataset_epoch_order([3, 0, 5, 1], 2, 42, 1).tolist()) in section_15
    first, length = dataset_blocks([3, 0, 5, 1], 2)
    assert str(first.tolist()) in section_15 and str(length.tolist()) in section_15
    inner = re.search(r"`mix64\(42 \^ TAG\) = (0x[0-9a-f]{16})`", section_15)
    assert inner is not None and mix64(42 ^ DATASET_KEY_TAG) == int(inner.group(1), 16)


def test_section_12_canonical_manifest_is_the_vector() -> None:
    spec = (ROOT / "spec" / "SPEC.md").read_text(encoding="utf-8")
    section = spec[spec.index("**Canonical manifest.**") :]
    start = section.index("```\n") + 4
    block = section[start : section.index("```\n", start)]
    golden = VECTORS / "dataset-valid-empty-last-shard.dataset" / MANIFEST_NAME
    assert block.encode() == golden.read_bytes()
