"""Fuzz dataset and live-dataset metadata in CI: ZeroBatch errors or working reads, nothing lost.

The long runs (``tests/fuzz/fuzz_datasets.py``, ``tests/fuzz/fuzz_live.py``, figures in
``tests/fuzz/README.md``) draw mutants of a small dataset directory (manifest, checksums file,
shard names, links, FIFOs) and of a small live dataset (descriptor, manifest versions,
segments, watermarks) and run each through every entry point that reads them, in worker
processes under a 2 GiB address-space limit with a 10 s limit per mutant. Here the same
harness runs the first mutants of seed 0 (3,000 in all, two workers), then the attacks
the fuzzers found, each as an explicit mutant:

* a crafted manifest version far ahead of the real ones, a version that drops committed
  entries, a newest version that names another object for a committed entry, and
  watermarks of another dataset or beyond the committed end: ``reclaim`` must delete no
  batch object that the unmutated dataset's reclaim keeps;
* manifests whose consistent but huge slot counts or shapes would size the verify bitmap or
  the int64 buffers at gigabytes before any shard is opened;
* metadata files that are FIFOs, which must be refused without blocking.

An outcome other than a ZeroBatch error or a working read (another exception, a
``MemoryError``, a crash, a hang, data lost by reclaim) fails the test with the mutant's
traceback.
"""

from __future__ import annotations

import pytest

from tests.fuzz.harness import assert_both_sides, first_mutants, replay_attack

DATASETS = "tests.fuzz.fuzz_datasets"
LIVE = "tests.fuzz.fuzz_live"
WATERMARK = "watermarks/c-1/00000000000000000007.json"
"""The base live dataset's one real watermark (consumer ``c-1``, batch 7)."""
NEWEST = "manifests/00000000000000000012.json"
"""The base live dataset's newest manifest version (its tail: the entries of batches 10, 11)."""


@pytest.mark.parametrize(("module", "mutants"), [(DATASETS, 2000), (LIVE, 1000)])
def test_first_mutants_give_zerobatch_errors_or_work(module: str, mutants: int) -> None:
    """The long run's first mutants: no finding, and every entry point reaches both sides
    (a fuzzer whose mutants all fail the first rule would pass while testing nothing)."""
    assert_both_sides(first_mutants(module, mutants, workers=2))


ATTACKS = [
    # Retention (live datasets): nothing the real watermarks need may be deleted.
    pytest.param(LIVE, 1, [["ahead", 1, 2**40, 2**40, 2**40]], id="live-version-far-ahead"),
    pytest.param(LIVE, 1, [["ahead", 1000, 2**64 - 1, 2**64 - 1, 2**64 - 1]], id="live-u64-ahead"),
    pytest.param(LIVE, 1, [["shrink", 1]], id="live-version-drops-entries"),
    # The newest version names another object for its last entry (one nonce digit changed):
    # the committed object must not be taken for an uncommitted producer's leftover.
    pytest.param(
        LIVE,
        1,
        [
            [
                "set",
                NEWEST,
                ["tail", 1, "name"],
                "batches/p-0/00000000000000000011-00000000000000ff.batch",
            ]
        ],
        id="live-entry-renamed",
    ),
    pytest.param(LIVE, 1, [["record", 40, 4, True]], id="live-watermark-of-another-dataset"),
    pytest.param(LIVE, 1, [["record", 2**50, 4, False]], id="live-watermark-beyond-end"),
    pytest.param(
        LIVE, 1, [["remove", WATERMARK], ["mark", "c-1", 2**40]], id="live-only-mark-beyond-end"
    ),
    # The loader over a live dataset with two steps per stored batch (the loader's mode of
    # live mutant 0, 4, 8, ...: a global batch size of half the stored batch size).
    pytest.param(LIVE, 0, [], id="live-half-batch-steps"),
    pytest.param(LIVE, 1, [["fifo", "live.json"]], id="live-descriptor-fifo"),
    # Resources bounded by what exists (dataset directories).
    pytest.param(
        DATASETS, 0, [["fit", 0, "max"], ["fit", 1, "max"], ["fit", 2, "max"]], id="slots-u32"
    ),
    pytest.param(DATASETS, 1, [["shape", 4096, 2**31 - 1]], id="huge-shape"),
    # Token dtypes: the uint16 dataset read every way; a manifest whose dtype is not its
    # shards' (sizes refitted, so that only each shard's header tells, or left as they are);
    # a live descriptor that says uint16 over uint32 batch objects of the same size.
    pytest.param(DATASETS, 2, [], id="uint16-dataset"),
    pytest.param(DATASETS, 0, [["dtype", 1, True]], id="uint32-shards-in-a-uint16-manifest"),
    pytest.param(DATASETS, 2, [["dtype", None, True]], id="uint16-shards-without-dtype"),
    pytest.param(DATASETS, 2, [["dtype", 0, False]], id="uint16-sizes-under-dtype-0"),
    pytest.param(LIVE, 1, [["ldtype", 1]], id="live-descriptor-says-uint16"),
    # Metadata files that are not regular files, refused without blocking.
    pytest.param(DATASETS, 0, [["fifo", "manifest.json"]], id="manifest-fifo"),
    pytest.param(DATASETS, 1, [["fifo", "checksums.xxh3"]], id="checksums-fifo"),
    # A version 2 index (bases 3 and 4) whose runs claim 2**32 - 1 slots a shard, resealed.
    pytest.param(DATASETS, 3, [["islots", 4294967295]], id="index-runs-claim-u32-max-slots"),
    pytest.param(DATASETS, 4, [["fifo", "shards.zbi"]], id="index-fifo"),
]


@pytest.mark.parametrize(("module", "base", "ops"), ATTACKS)
def test_attacks_give_zerobatch_errors_and_lose_nothing(
    module: str, base: int, ops: list[list[object]]
) -> None:
    """Each attack, through every entry point of its fuzzer, under the same limits (``base``
    also picks the loader's settings: live base 1 steps one stored batch at a time)."""
    replay_attack(module, base, ops, 30)
