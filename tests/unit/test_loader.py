"""BatchNativeLoader: coverage per epoch, the pinned order, the cursor, and its state."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import epoch_key, epoch_order

from tests.helpers import records
from zerobatch_core import BatchFileReader, BatchNativeLoader, StateError, write_batch_file
from zerobatch_core.order import BlockOrder


def first_tokens(batches: list[np.ndarray]) -> list[int]:
    return [int(b[0, 0]) for b in batches]


def index_of(reader: BatchFileReader) -> dict[int, int]:
    return {int(reader.read_batch(i)[0, 0]): i for i in range(len(reader))}


def test_epoch_serves_each_batch_once_in_the_spec_order(make_file: Callable[..., Path]) -> None:
    path = make_file(n=4 * 37, batch_size=4)
    loader = BatchNativeLoader(path, block_size=5, seed=11)
    pos = index_of(loader.reader)
    served = [pos[t] for t in first_tokens(list(loader))]
    assert served == epoch_order(37, 5, epoch_key(11, 0)).tolist()
    assert sorted(served) == list(range(37))


def test_epochs_differ_and_plain_second_pass_is_next_epoch(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=400, batch_size=4), block_size=4)
    e0 = first_tokens(list(loader))
    assert loader.epoch == 1 and loader.step == 0
    e1 = first_tokens(list(loader))
    assert e0 != e1 and sorted(e0) == sorted(e1)
    loader.set_epoch(0)
    assert first_tokens(list(loader)) == e0


def test_default_seed_is_the_files_seed(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(seed=1234))
    assert loader.seed == 1234


def test_unshuffled_is_file_order(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=80, batch_size=4), shuffle=False, block_size=3)
    assert loader.epoch_order().tolist() == list(range(20))
    pos = index_of(loader.reader)
    assert [pos[t] for t in first_tokens(list(loader))] == list(range(20))


@pytest.mark.parametrize("dtype", ["uint32", "int32", "int64"])
def test_output_dtypes(make_file: Callable[..., Path], dtype: str) -> None:
    loader = BatchNativeLoader(make_file(), dtype=dtype)  # type: ignore[arg-type]
    batch = next(iter(loader))
    assert batch.dtype == np.dtype(dtype) and batch.shape == (4, 8)


def test_set_epoch_keeps_the_position_within_the_same_epoch(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(), block_size=2)
    it = iter(loader)
    next(it), next(it)
    loader.set_epoch(0)
    assert loader.step == 2
    loader.set_epoch(3)
    assert (loader.epoch, loader.step) == (3, 0)
    assert list(it) == []  # moving the cursor ended the old pass


def test_state_round_trip_resumes_exactly(make_file: Callable[..., Path]) -> None:
    path = make_file(n=4 * 23, batch_size=4)
    full = BatchNativeLoader(path, block_size=4)
    reference = first_tokens(list(full)) + first_tokens(list(full))
    for k in (0, 1, 7, 22, 23, 30):
        a = BatchNativeLoader(path, block_size=4)
        got: list[int] = []
        it = iter(a)
        for _ in range(k):
            try:
                got.append(int(next(it)[0, 0]))
            except StopIteration:
                it = iter(a)
                got.append(int(next(it)[0, 0]))
        state = json.loads(json.dumps(a.state_dict()))  # survives JSON
        b = BatchNativeLoader(path, block_size=4)
        b.load_state_dict(state)
        while len(got) < 46:
            got.extend(first_tokens(list(b)))
        assert got[:46] == reference, k


def test_state_after_last_batch_is_start_of_next_epoch(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=8, batch_size=4))
    list(loader)  # the pass ran to its end
    s = loader.state_dict()
    assert (s["epoch"], s["step"]) == (1, 0)


def test_a_served_epoch_whose_pass_is_open_resumes_inside_that_pass(
    make_file: Callable[..., Path],
) -> None:
    """After the last batch, before the pass ends, the cursor is ``(e, num_batches)``.

    A loader restored from that state finishes the open pass (nothing is left to serve) and
    then serves epoch ``e + 1``: the same batches, and the same passes, as the run it came from.
    """
    path = make_file(n=16, batch_size=4)  # 4 batches
    whole = BatchNativeLoader(path, block_size=2)
    e0, e1 = first_tokens(list(whole)), first_tokens(list(whole))
    loader = BatchNativeLoader(path, block_size=2)
    it = iter(loader)
    got = first_tokens([next(it) for _ in range(4)])
    s = loader.state_dict()
    assert (s["epoch"], s["step"]) == (0, 4) and loader.epoch == 0
    assert next(it, None) is None and loader.position == (1, 0)  # the pass ends
    resumed = BatchNativeLoader(path, block_size=2)
    resumed.load_state_dict(s)
    assert list(resumed) == [] and resumed.position == (1, 0)  # the rest of the open pass
    assert got + first_tokens(list(resumed)) == e0 + e1
    again = BatchNativeLoader(path, block_size=2)
    again.load_state_dict(s)
    again.set_epoch(1)  # an epoch loop moves on explicitly
    assert first_tokens(list(again)) == e1


def test_epoch_after_the_last_u64_epoch_wraps_to_zero(make_file: Callable[..., Path]) -> None:
    last = 2**64 - 1
    loader = BatchNativeLoader(make_file(n=8, batch_size=4), epoch=last)
    list(loader)
    assert (loader.epoch, loader.step) == (0, 0)
    s = dict(loader.state_dict(), epoch=last, step=2)  # the last epoch served, its pass open
    loader.load_state_dict(s)
    assert list(loader) == [] and (loader.epoch, loader.step) == (0, 0)


def test_mismatched_states_are_rejected(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(), block_size=4)
    good = loader.state_dict()
    for key, value in (
        ("block_size", 8),
        ("seed", 1),
        ("num_batches", 3),
        ("shuffle", False),
        ("step", 11),
        ("step", -1),
        ("version", 2),
        ("format", "x"),
    ):
        bad = dict(good, **{key: value})
        with pytest.raises(StateError, match=key if key not in ("version", "format") else None):
            loader.load_state_dict(bad)
    with pytest.raises(StateError):
        loader.load_state_dict([])  # type: ignore[arg-type]


def test_argument_checks(make_file: Callable[..., Path]) -> None:
    path = make_file()
    with pytest.raises(ValueError, match="block_size"):
        BatchNativeLoader(path, block_size=0)
    with pytest.raises(ValueError, match="dtype"):
        BatchNativeLoader(path, dtype="float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        BatchNativeLoader(path, seed=-1)
    with pytest.raises(ValueError, match="epoch"):
        BatchNativeLoader(path).set_epoch(2**64)


def test_zero_batch_file_iterates_nothing(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=3, batch_size=4))
    assert len(loader) == 0 and list(loader) == []


@pytest.mark.parametrize("n", [1, 9, 10, 11, 64])
@pytest.mark.parametrize("bs", [1, 3, 10, 100])
@pytest.mark.parametrize("shuffle", [True, False])
def test_block_order_spans_resume_from_any_step(n: int, bs: int, shuffle: bool) -> None:
    order = BlockOrder(n, bs, seed=5, shuffle=shuffle)
    full = order.epoch_order(2).tolist()
    for start in range(n + 1):
        assert list(order.indices(2, start)) == full[start:]


def test_spec_cursor_example_is_what_state_dict_returns(tmp_path: Path) -> None:
    """SPEC.md section 10's cursor JSON, and the two end-of-epoch forms it names."""
    spec = (Path(__file__).resolve().parents[2] / "spec" / "SPEC.md").read_text()
    example = spec[spec.index("**Cursor.**") :]
    block = example[example.index("```json") + len("```json") : example.index("```\n", 10)]
    path = tmp_path / "cursor.batch"
    write_batch_file(path, records(20, 4), batch_size=2, seed=42)
    loader = BatchNativeLoader(path, block_size=3)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    assert state.pop("source") == loader.identity()  # depends on the tokens: not in the example
    assert state == json.loads(block)
    resumed = BatchNativeLoader(path, block_size=3)
    resumed.load_state_dict(json.loads(block))
    np.testing.assert_array_equal(next(iter(resumed)), resumed.reader.read_batch(3))
    for _ in range(6):
        next(it)
    assert (loader.epoch, loader.step) == (0, 10)
    assert next(it, None) is None and (loader.epoch, loader.step) == (1, 0)


def test_file_identity_is_the_spec_formula(tmp_path: Path) -> None:
    """SPEC.md section 9's ``source`` for a file, recomputed here from the bytes on disk."""
    import xxhash

    path = tmp_path / "ident.batch"
    write_batch_file(path, records(4 * 37, 300), batch_size=4, seed=3)  # 37 batches of 1200
    data = path.read_bytes()
    sample = xxhash.xxh3_64()
    for i in sorted({i * 37 // 16 for i in range(16)}):
        start = 4096 + i * 8192  # 1200 tokens = 4800 bytes: two-page slots
        sample.update(data[start : start + 1024 * 4])
    want = {
        "file": {
            "size": len(data),
            "header_xxh3": f"{xxhash.xxh3_64_intdigest(data[:4096]):016x}",
            "sample_xxh3": sample.hexdigest(),
        }
    }
    assert BatchNativeLoader(path).state_dict()["source"] == want
    other = tmp_path / "other.batch"
    changed = bytearray(data)
    changed[4096 + 8192 * 2 + 8] ^= 1  # a token inside sampled slot 2
    other.write_bytes(bytes(changed))
    assert BatchNativeLoader(other).state_dict()["source"] != want
