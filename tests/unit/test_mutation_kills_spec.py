"""Format-reference (``zerobatch_spec``) behaviours that mutation testing found unpinned
(tests/README.md)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, RESERVED_OFFSET, Header, build_header
from zerobatch_spec.dataset import (
    MANIFEST_NAME,
    DatasetCode,
    DatasetViolation,
    Manifest,
    Source,
    dataset_block_at,
    dataset_blocks,
    dataset_epoch_key,
    dataset_epoch_order,
    parse_manifest,
    shard_seed,
)
from zerobatch_spec.rules import ErrorCode, Violation, find_violation
from zerobatch_spec.shuffle import (
    GOLDEN_GAMMA,
    epoch_order,
    mix64,
    mix64_array,
    num_blocks,
    permute,
    permute_array,
)

from tests.helpers import records
from zerobatch_core import write_sharded_dataset


def test_a_header_is_an_immutable_value() -> None:
    header = Header(batch_size=4, seq_len=8, num_batches=2, seed=1, total_records=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        header.seed = 2  # type: ignore[misc]


def valid_header() -> bytes:
    return build_header(Header(batch_size=4, seq_len=8, num_batches=1, seed=1, total_records=4))


def test_a_violation_is_an_immutable_value() -> None:
    violation = Violation(ErrorCode.BAD_MAGIC, "magic", "detail")
    with pytest.raises(dataclasses.FrozenInstanceError):
        violation.field = "other"  # type: ignore[misc]


def test_a_whole_header_in_a_file_too_short_for_it_is_a_truncated_header() -> None:
    found = find_violation(valid_header(), 100)
    assert found is not None and (found.code, found.detail) == (
        ErrorCode.TRUNCATED_HEADER,
        f"file is 100 bytes; the header alone needs {HEADER_SIZE}",
    )


def test_nonzero_reserved_names_the_byte_and_the_reserved_range() -> None:
    data = bytearray(valid_header())
    data[RESERVED_OFFSET + 5] = 1
    found = find_violation(bytes(data), HEADER_SIZE + 4096)
    assert found is not None and found.detail == (
        f"byte {RESERVED_OFFSET + 5} is 0x01; bytes {RESERVED_OFFSET}..4095 must be zero"
    )


# -- datasets (zerobatch_spec.dataset) -----------------------------------------------------------


@pytest.fixture
def manifest(tmp_path: Path) -> dict[str, Any]:
    """The manifest of a written dataset: two shards of 2 batches of [4, 8] and one of 1."""
    data = records(20, 8)
    write_sharded_dataset(tmp_path / "ds", iter([data]), batch_size=4, seq_len=8, shard_batches=2)
    loaded: dict[str, Any] = json.loads((tmp_path / "ds" / MANIFEST_NAME).read_bytes())
    return loaded


def violation(manifest: dict[str, Any]) -> DatasetViolation:
    found = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(found, DatasetViolation), found
    return found


def test_manifests_are_version_1(manifest: dict[str, Any]) -> None:
    # SPEC.md's manifest example: "version": 1.
    assert manifest["version"] == 1


def test_a_boolean_is_not_an_integer_field(manifest: dict[str, Any]) -> None:
    manifest["shards"][0]["seed"] = True
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "shards[0].seed",
    )


@pytest.mark.parametrize("key", ["num_batches", "seed"])
def test_a_negative_shard_count_or_seed_is_a_bad_field(manifest: dict[str, Any], key: str) -> None:
    manifest["shards"][0][key] = -1
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        f"shards[0].{key}",
    )


def test_a_record_range_of_the_wrong_length_names_its_length(manifest: dict[str, Any]) -> None:
    shard = manifest["shards"][0]
    shard["records"] = [2, 5]
    assert violation(manifest).detail == (
        f"{shard['name']}: records [2, 5] cover 3 input records, "
        f"total_records is {shard['total_records']}"
    )


@pytest.mark.parametrize("checksums", ["xxh3-64", {"algorithm": "md5"}])
def test_checksums_must_be_an_object_naming_xxh3_64(
    manifest: dict[str, Any], checksums: object
) -> None:
    manifest["checksums"] = checksums
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "checksums",
    )


@pytest.mark.parametrize(("seed", "shard"), [(0, 0), (7, 2), (2**64 - 1, 5)])
def test_shard_seed_is_the_spec_formula(seed: int, shard: int) -> None:
    # SPEC.md: shard_seed(S, i) = mix64(S + GOLDEN_GAMMA * (i + 1)) & 0xFFFFFFFF, u64 wrapping.
    want = mix64((seed + GOLDEN_GAMMA * (shard + 1)) % 2**64) % 2**32
    assert shard_seed(seed, shard) == want


def test_a_dataset_without_batches_has_an_empty_epoch() -> None:
    assert dataset_epoch_order([0, 0], block_size=4, seed=1, epoch=0).size == 0


@pytest.mark.parametrize(("seed", "epoch"), [(0, 0), (42, 1), (2**64 - 1, 2**63)])
def test_dataset_epoch_key_is_the_spec_formula_with_the_zbdatase_tag(seed: int, epoch: int) -> None:
    # SPEC.md: mix64(mix64(seed ^ TAG) + epoch * GOLDEN_GAMMA), TAG the ASCII bytes "ZBDATASE".
    tag = int.from_bytes(b"ZBDATASE", "big")
    want = mix64((mix64(seed ^ tag) + epoch * GOLDEN_GAMMA) % 2**64)
    assert dataset_epoch_key(seed, epoch) == want


def test_a_parsed_manifest_is_an_immutable_value(manifest: dict[str, Any]) -> None:
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.seed = 2  # type: ignore[misc]


def test_integer_fields_include_their_upper_bound(manifest: dict[str, Any]) -> None:
    manifest["shards"][0]["seed"] = 2**32 - 1
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest) and parsed.shards[0].seed == 2**32 - 1


@pytest.mark.parametrize("records", [[True, 8], [0, 8, 9]], ids=["boolean", "three"])
def test_a_record_range_is_two_integers(manifest: dict[str, Any], records: list[Any]) -> None:
    manifest["shards"][0]["records"] = records
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "shards[0].records",
    )


def test_a_zero_seq_len_is_a_bad_field(manifest: dict[str, Any]) -> None:
    manifest["seq_len"] = 0
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "seq_len",
    )


def test_dataset_epoch_key_refuses_a_seed_outside_u64() -> None:
    with pytest.raises(ValueError, match="seed must be in"):
        dataset_epoch_key(-1, 0)


def test_batch_size_and_seq_len_one_are_valid(tmp_path: Path) -> None:
    write_sharded_dataset(
        tmp_path / "ds", iter([records(6, 1)]), batch_size=1, seq_len=1, shard_batches=4
    )
    parsed = parse_manifest((tmp_path / "ds" / MANIFEST_NAME).read_bytes())
    assert isinstance(parsed, Manifest) and (parsed.batch_size, parsed.seq_len) == (1, 1)


@pytest.mark.parametrize("slot", [0, 3, 6])
def test_dataset_blocks_are_permuted_in_domain_3(slot: int) -> None:
    # SPEC.md: block slot k of an epoch serves block permute(k, num_blocks, key, 3).
    key = dataset_epoch_key(5, 1)
    assert dataset_block_at(slot, 7, key) == permute(slot, 7, key, 3)


def test_a_record_range_may_start_at_zero(manifest: dict[str, Any]) -> None:
    shard = manifest["shards"][0]
    shard["records"] = [0, shard["total_records"]]
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest) and parsed.shards[0].records == (0, shard["total_records"])


def test_a_negative_record_range_is_a_bad_field(manifest: dict[str, Any]) -> None:
    shard = manifest["shards"][0]
    shard["records"] = [-1, shard["total_records"] - 1]
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "shards[0].records",
    )


def test_a_negative_total_records_is_a_bad_field(manifest: dict[str, Any]) -> None:
    manifest["shards"][0]["total_records"] = -1
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "shards[0].total_records",
    )


def test_dataset_blocks_of_one_slot_each() -> None:
    first, length = dataset_blocks([3], 1)
    assert (first.tolist(), length.tolist()) == ([0, 1, 2], [1, 1, 1])


def test_dataset_blocks_refuse_block_size_zero() -> None:
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        dataset_blocks([3], 0)


def test_a_parsed_shard_is_an_immutable_value(manifest: dict[str, Any]) -> None:
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.shards[0].seed = 2  # type: ignore[misc]


def test_a_shard_without_records_is_valid(manifest: dict[str, Any]) -> None:
    shard = manifest["shards"][-1]
    shard.update(num_batches=0, total_records=0, size=HEADER_SIZE)
    shard.pop("records", None)
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest) and parsed.shards[-1].total_records == 0


def test_manifest_sources_parse_to_immutable_sources(manifest: dict[str, Any]) -> None:
    manifest["sources"] = [{"path": "train.npy", "records": [0, 20]}]
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest) and parsed.sources == (Source("train.npy", (0, 20)),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.sources[0].path = "other"  # type: ignore[misc]


def test_a_source_without_a_path_is_a_bad_field(manifest: dict[str, Any]) -> None:
    manifest["sources"] = [{"records": [0, 20]}]
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "sources[0]",
    )


def test_a_dataset_violation_is_an_immutable_value(manifest: dict[str, Any]) -> None:
    manifest["seq_len"] = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        violation(manifest).where = "other"  # type: ignore[misc]


def test_unknown_manifest_keys_do_not_change_what_it_describes(manifest: dict[str, Any]) -> None:
    plain = parse_manifest(json.dumps(manifest).encode())
    noted = parse_manifest(json.dumps(dict(manifest, note="kept, not compared")).encode())
    assert plain == noted


def test_a_negative_dataset_seed_is_a_bad_field(manifest: dict[str, Any]) -> None:
    manifest["seed"] = -1
    assert (violation(manifest).code, violation(manifest).where) == (
        DatasetCode.MANIFEST_BAD_FIELD,
        "seed",
    )


def test_an_empty_record_range_is_valid_for_an_empty_shard(manifest: dict[str, Any]) -> None:
    shard = manifest["shards"][-1]
    shard.update(num_batches=0, total_records=0, size=HEADER_SIZE, records=[20, 20])
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest) and parsed.shards[-1].records == (20, 20)


def test_a_negative_shuffle_key_is_refused() -> None:
    with pytest.raises(ValueError, match=r"shuffle key must be in \[0, 2\*\*64\), got -1"):
        permute_array([0], 10, -1, 1)


def test_an_epoch_refuses_block_size_zero() -> None:
    assert num_blocks(10, 1) == 10
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        num_blocks(10, 0)


def test_mixing_an_array_leaves_the_callers_array_alone() -> None:
    z = np.arange(5, dtype=np.uint64)
    mixed = mix64_array(z)
    assert z.tolist() == [0, 1, 2, 3, 4]
    assert mixed.tolist() == [mix64(i) for i in range(5)]


def test_dataset_blocks_of_shards_without_slots_are_none_and_warn_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by a zero block size on the way
        first, length = dataset_blocks([0, 0], 5)
    assert (first.tolist(), length.tolist()) == ([], [])


def test_a_record_range_may_end_at_the_u64_maximum(manifest: dict[str, Any]) -> None:
    total = manifest["shards"][0]["total_records"]
    manifest["shards"][0]["records"] = [2**64 - 1 - total, 2**64 - 1]
    parsed = parse_manifest(json.dumps(manifest).encode())
    assert isinstance(parsed, Manifest)
    assert parsed.shards[0].records == (2**64 - 1 - total, 2**64 - 1)


def test_the_epoch_order_of_no_batches_is_empty() -> None:
    order = epoch_order(0, 4, 7)
    assert order.dtype == np.int64 and order.tolist() == []


def test_a_negative_index_is_outside_the_permutation() -> None:
    assert permute(0, 10, 7, 1) in range(10)
    with pytest.raises(IndexError, match=r"index -1 is outside \[0, 10\)"):
        permute(-1, 10, 7, 1)
