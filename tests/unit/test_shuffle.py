"""The keyed bijection and the block order: scalar reference equals the vectorised form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import (
    DOMAIN_BLOCKS,
    DOMAIN_RECORDS,
    batch_at,
    epoch_key,
    epoch_order,
    permute,
    permute_array,
    unpermute,
    unpermute_array,
)
from zerobatch_spec.dataset import DATASET_KEY_TAG, dataset_epoch_key
from zerobatch_spec.shuffle import GOLDEN_GAMMA, half_bits, mix64, round_keys

from zerobatch_core import BatchNativeLoader, write_batch_file


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 17, 63, 64, 65, 1000])
@pytest.mark.parametrize("key", [0, 1, 42, 2**32 - 1, 2**64 - 1])
def test_bijection_inverse_and_vectorised_agree(n: int, key: int) -> None:
    fwd = [permute(i, n, key, DOMAIN_RECORDS) for i in range(n)]
    assert sorted(fwd) == list(range(n))
    assert [unpermute(p, n, key, DOMAIN_RECORDS) for p in fwd] == list(range(n))
    arr = permute_array(np.arange(n), n, key, DOMAIN_RECORDS)
    assert arr.tolist() == fwd
    assert unpermute_array(arr, n, key, DOMAIN_RECORDS).tolist() == list(range(n))


def test_domains_and_keys_give_different_permutations() -> None:
    n = 1000
    a = permute_array(np.arange(n), n, 5, DOMAIN_RECORDS)
    assert a.tolist() != permute_array(np.arange(n), n, 5, DOMAIN_BLOCKS).tolist()
    assert a.tolist() != permute_array(np.arange(n), n, 6, DOMAIN_RECORDS).tolist()


def test_known_values_pin_the_algorithm() -> None:
    # Golden values: any change to mix64, the round keys or the walk changes these.
    assert mix64(0) == 0
    assert mix64(1) == 0x5692161D100B05E5
    assert half_bits(1) == 1 and half_bits(4) == 1 and half_bits(5) == 2 and half_bits(17) == 3
    assert len(round_keys(42, DOMAIN_RECORDS)) == 6
    assert [permute(i, 10, 42, DOMAIN_RECORDS) for i in range(10)] == [8, 3, 2, 9, 4, 5, 7, 6, 0, 1]


def test_permutation_is_not_near_identity() -> None:
    n = 10_000
    p = permute_array(np.arange(n), n, 1, DOMAIN_RECORDS).astype(np.int64)
    assert np.mean(p == np.arange(n)) < 0.01
    assert abs(np.corrcoef(p, np.arange(n))[0, 1]) < 0.05


@pytest.mark.parametrize("nb", [1, 2, 7, 16, 17, 100])
@pytest.mark.parametrize("bs", [1, 3, 16, 256])
@pytest.mark.parametrize("key", [0, 9])
def test_batch_at_matches_epoch_order(nb: int, bs: int, key: int) -> None:
    order = epoch_order(nb, bs, key)
    assert sorted(order.tolist()) == list(range(nb))
    assert [batch_at(s, nb, bs, key) for s in range(nb)] == order.tolist()
    # sequential inside every block
    starts = [s for s in range(nb) if s == 0 or order[s] != order[s - 1] + 1]
    assert all(order[s] % bs == 0 for s in starts)


def test_epoch_key_is_seed_xor_epoch_and_range_checked() -> None:
    assert epoch_key(0b1010, 0b0110) == 0b1100
    with pytest.raises(ValueError):
        epoch_key(-1, 0)
    with pytest.raises(ValueError):
        epoch_key(0, 2**64)


def test_out_of_range_indices_are_rejected() -> None:
    with pytest.raises(IndexError):
        permute(5, 5, 0, DOMAIN_RECORDS)
    with pytest.raises(IndexError):
        permute_array([0, 5], 5, 0, DOMAIN_RECORDS)


def test_file_epoch_key_is_seed_xor_epoch_and_the_loader_uses_it(tmp_path: Path) -> None:
    """SPEC.md section 8's key, named: ``seed ^ epoch`` (u64), and the file loader's order."""
    for seed, epoch in ((0, 0), (42, 1), (2**64 - 1, 5), (7, 2**64 - 1), (2**40 + 5, 3)):
        assert epoch_key(seed, epoch) == seed ^ epoch
    with pytest.raises(ValueError, match="epoch"):
        epoch_key(0, 2**64)
    path = tmp_path / "k.batch"
    write_batch_file(path, np.zeros((4 * 30, 2), dtype=np.uint32), batch_size=4, seed=9)
    loader = BatchNativeLoader(path, block_size=4, seed=2**40 + 5)
    for epoch in (0, 3, 2**64 - 1):
        key = (2**40 + 5) ^ epoch
        blocks = [permute(k, 8, key, DOMAIN_BLOCKS) for k in range(8)]
        want = [i for b in blocks for i in range(b * 4, min(b * 4 + 4, 30))]
        assert loader.epoch_order(epoch).tolist() == want


def test_dataset_epoch_key_is_the_mixed_formula() -> None:
    """SPEC.md section 14's key, named: mix64(mix64(seed ^ TAG) + epoch * GOLDEN_GAMMA)."""
    for seed, epoch in ((0, 0), (0, 1), (1, 0), (2**64 - 1, 2**64 - 1)):
        inner = mix64(seed ^ DATASET_KEY_TAG)
        assert dataset_epoch_key(seed, epoch) == mix64((inner + epoch * GOLDEN_GAMMA) % 2**64)
