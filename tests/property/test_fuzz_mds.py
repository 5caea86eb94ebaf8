"""Fuzz the MDS reader in CI: ZeroBatch errors or reads that agree with Streaming's decoding.

The long run (``tests/fuzz/fuzz_mds.py``) draws mutants of
five small MosaicML Streaming datasets (index edits, shard words set to extremes, byte flips,
truncations, appended bytes, corrupt shards recompressed, FIFOs and links) and runs each through
``is_mds``, ``expand_mds`` with every token read, and ``TokenFileSource`` in both layouts, in
worker processes under a 2 GiB address-space limit with a time limit per mutant. Here the same
harness runs the first 1,000 mutants of seed 0 (two workers), then a few attacks as explicit
mutants: counts and sizes that would size buffers at gigabytes, a decompressed size below the
real one, names and links that leave the dataset, and FIFOs that must be refused without
blocking. Any outcome other than a ZeroBatch error or a read that agrees with the reference
decoder fails the test with the mutant's traceback.
"""

from __future__ import annotations

import pytest

from tests.fuzz.harness import assert_both_sides, first_mutants, replay_attack

MODULE = "tests.fuzz.fuzz_mds"
MUTANTS = 1000


def test_first_mutants_give_zerobatch_errors_or_agreeing_reads() -> None:
    """No finding, and the reading entry points reach both sides (a fuzzer whose mutants all
    fail the first check would pass while testing nothing)."""
    summary = first_mutants(MODULE, MUTANTS, workers=2)
    assert_both_sides(summary, ("detect", "read", "records"))
    assert summary["results"]["read:ok"] >= MUTANTS // 10, summary["results"]


SHARD = "shard.00000.mds"
ZIP = "shard.00000.mds.zstd"
U32_MAX = 2**32 - 1

# (base, ops, the read entry's outcome): base 0 is the ndarray:uint16 dataset, 2 the
# dtype-less zstd one, 3 the merged index over p0/ and p1/ (see fuzz_mds._mds_bases).
ATTACKS = [
    pytest.param(
        0,
        [["word", SHARD, 0, U32_MAX], ["set", "index.json", ["shards", 0, "samples"], U32_MAX]],
        "error",
        id="num-samples-u32",
    ),
    pytest.param(0, [["word", SHARD, 8, U32_MAX], ["fitsizes"]], "error", id="offset-u32"),
    pytest.param(
        0,
        [["set", "index.json", ["shards", 0, "raw_data", "bytes"], U32_MAX]],
        "error",
        id="raw-bytes-u32",
    ),
    pytest.param(
        2,
        [["inner", ZIP, ["word", ZIP, 0, U32_MAX]], ["fitsizes"]],
        "error",
        id="zstd-inner-num-samples",
    ),
    pytest.param(
        2,
        [["set", "index.json", ["shards", 0, "raw_data", "bytes"], 10]],
        "error",
        id="zstd-decompresses-past-declared",
    ),
    pytest.param(
        2,
        [["set", "index.json", ["shards", 0, "raw_data", "bytes"], U32_MAX]],
        "error",
        id="zstd-declared-u32",
    ),
    pytest.param(
        3,
        [["set", "index.json", ["shards", 0, "column_encodings", 0], "ndarray:int32:99999999999"]],
        "error",
        id="fixed-shape-huge",
    ),
    pytest.param(
        0,
        [["set", "index.json", ["shards", 0, "raw_data", "basename"], "../outside.batch"]],
        "error",
        id="basename-outside",
    ),
    pytest.param(0, [["symlink", SHARD, "/dev/zero"]], "error", id="shard-dev-zero"),
    pytest.param(0, [["fifo", SHARD]], "error", id="shard-fifo"),
    pytest.param(0, [["fifo", "index.json"]], "error", id="index-fifo"),
    pytest.param(3, [["fifo", "p1/shard.00000.mds"]], "error", id="merged-shard-fifo"),
    pytest.param(0, [], "ok", id="unmutated"),
]


@pytest.mark.parametrize(("base", "ops", "read"), ATTACKS)
def test_attacks_give_zerobatch_errors(base: int, ops: list[list[object]], read: str) -> None:
    """Each attack through every entry point, under the fuzzer's limits."""
    done = replay_attack(MODULE, base, ops, 60)
    assert f"read: {read}" in done.stdout.splitlines(), done.stdout[-3000:]
