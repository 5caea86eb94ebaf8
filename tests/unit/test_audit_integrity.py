"""A corrupted slot of a local dataset raises on every read, never only on the first.

``verify="first"`` remembers the slots it has checked so that later reads skip the hash; a
reader that marked a slot as checked *before* the check passed would raise once and serve the
corrupted tokens on the next read (a retried step, the next epoch, a restored checkpoint).
These tests read the corrupted slot again and again, through the reader and through the
loader (the plain path and the int64 conversion thread), and check that no step ever serves
its tokens while the slots around it are served exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, padded_batch_bytes

from tests.helpers import records
from zerobatch_core import BatchNativeLoader, DatasetError
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.dataset import DatasetReader

B, T = 8, 16
BAD = 3
"""The corrupted slot: slot 3 of the dataset, slot 3 of shard 0."""


def _corrupt(dataset: Path, slot: int, row: int) -> None:
    """Flip one token's bits in ``row`` of ``slot`` of shard 0 (the checksums are kept)."""
    shard = dataset / "shard-00000.batch"
    data = bytearray(shard.read_bytes())
    data[HEADER_SIZE + slot * padded_batch_bytes(B, T) + row * T * 4 + 5] ^= 0xFF
    shard.write_bytes(bytes(data))


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    out = tmp_path / "clean"
    write_sharded_dataset(out, [records(200, T)], batch_size=B, seq_len=T, shard_batches=5, seed=3)
    return out


@pytest.fixture
def corrupted(tmp_path: Path, clean: Path) -> Path:
    out = tmp_path / "bad"
    out.mkdir()
    for f in clean.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    _corrupt(out, BAD, row=B - 1)  # the last row: a rank of two that reads rows 0..3 still fails
    return out


@pytest.mark.parametrize("verify", ["first", "always"])
def test_the_reader_raises_on_every_read_of_a_corrupted_slot(
    clean: Path, corrupted: Path, verify: Any
) -> None:
    good = DatasetReader(clean, verify="off")
    with DatasetReader(corrupted, verify=verify) as reader:
        for _ in range(4):
            with pytest.raises(DatasetError, match=rf"checksum_mismatch.*slot {BAD}"):
                reader.read_batch(BAD)
            for i in (BAD - 1, BAD + 1):  # its neighbours are served, checked, exactly
                assert np.array_equal(reader.read_batch(i), good.read_batch(i))
    good.close()


def test_off_serves_the_stored_bytes_unchecked(clean: Path, corrupted: Path) -> None:
    with DatasetReader(clean) as good, DatasetReader(corrupted, verify="off") as reader:
        served = np.array(reader.read_batch(BAD))
        assert not np.array_equal(served, good.read_batch(BAD))  # the corruption is there
        assert np.array_equal(served[: B - 1], good.read_batch(BAD)[: B - 1])


def _pass(loader: BatchNativeLoader) -> tuple[list[np.ndarray], BaseException | None]:
    """The items of one pass until it ends or raises, and what it raised."""
    items: list[np.ndarray] = []
    try:
        for item in loader:
            items.append(np.array(item))
    except DatasetError as e:
        return items, e
    return items, None


@pytest.mark.parametrize("verify", ["first", "always"])
@pytest.mark.parametrize("dtype", ["uint32", "int64"])
@pytest.mark.parametrize("world", [1, 2])
def test_the_loader_never_serves_a_corrupted_slot_however_often_it_is_asked(
    clean: Path, corrupted: Path, verify: Any, dtype: Any, world: int
) -> None:
    kw: dict[str, Any] = {"shuffle": False, "dtype": dtype, "rank": 0, "world_size": world}
    expected = [np.array(x) for x in BatchNativeLoader(clean, **kw)]
    loader = BatchNativeLoader(corrupted, verify=verify, **kw)
    state = loader.state_dict()
    for _ in range(3):  # the same loader again, a fresh one restored: the same failure each time
        for again in (loader, BatchNativeLoader(corrupted, verify=verify, **kw)):
            if again is not loader:
                again.load_state_dict(state)
            start = again.step
            items, error = _pass(again)
            assert error is not None and "checksum_mismatch" in str(error)
            # The steps before the corrupted one are served exactly (the int64 thread converts
            # several steps at once, so it may stop before them); the corrupted one never is.
            assert start + len(items) <= BAD
            served = zip(items, expected[start:], strict=False)
            assert all(np.array_equal(a, b) for a, b in served)
            assert again.step == start + len(items)
        state = loader.state_dict()
    # Past the corrupted step the loader serves the rest exactly (a caller that skips it).
    skipping = BatchNativeLoader(corrupted, verify=verify, skip_steps=[(BAD, BAD + 1)], **kw)
    rest, error = _pass(skipping)
    assert error is None
    wanted = expected[:BAD] + expected[BAD + 1 :]
    assert len(rest) == len(wanted)
    assert all(np.array_equal(a, b) for a, b in zip(rest, wanted, strict=True))


def test_a_second_epoch_raises_again_on_the_corrupted_slot(clean: Path, corrupted: Path) -> None:
    """The shuffled order of another epoch reaches the slot at another step: still raises."""
    kw: dict[str, Any] = {"seed": 11, "block_size": 4}
    with DatasetReader(clean) as good:
        wanted = {good.read_batch(i).tobytes() for i in range(len(good))}
        bad_tokens = good.read_batch(BAD).tobytes()
    loader = BatchNativeLoader(corrupted, verify="first", **kw)
    seen: list[bytes] = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        items, error = _pass(loader)
        assert error is not None, f"epoch {epoch} served every step"
        seen.extend(np.array(x).tobytes() for x in items)
    assert set(seen) <= wanted and bad_tokens not in seen
