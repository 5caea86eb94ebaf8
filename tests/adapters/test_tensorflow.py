"""``zerobatch_adapters.tensorflow``: the tf.data pipeline serves exactly the core loader's order.

Every comparison is against ``BatchNativeLoader`` with the same parameters, so the adapter is
checked for order, rank rows, epochs and resume without restating the spec here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.adapters.twins import NARROW, NARROW_MAX, WIDE, narrow_tokens, write_twins
from tests.helpers import items_with_states, require
from zerobatch_core import (
    BatchNativeLoader,
    FormatError,
    StateError,
    write_batch_file,
)
from zerobatch_core.order import BlockOrder

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = require("tensorflow")

from zerobatch_adapters.tensorflow import tf_dataset  # noqa: E402

MakeFile = Callable[..., Path]


def core_epochs(path: Path, epochs: int, **kwargs: Any) -> list[Any]:
    """``epochs`` consecutive passes of the core loader, items copied out of the mapping
    (``dtype`` defaults to the adapters' default, int32)."""
    loader = BatchNativeLoader(path, **{"dtype": "int32", **kwargs})
    out: list[Any] = []
    for _ in range(epochs):
        for item in loader:
            out.append(
                tuple(np.array(a) for a in item) if isinstance(item, tuple) else np.array(item)
            )
    return out


def as_numpy(ds: Any) -> list[Any]:
    return [
        tuple(a.numpy() for a in item) if isinstance(item, tuple) else item.numpy() for item in ds
    ]


def assert_same(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if isinstance(e, tuple):
            assert isinstance(g, tuple) and len(g) == len(e)
            for ga, ea in zip(g, e, strict=True):
                assert ga.dtype == ea.dtype
                np.testing.assert_array_equal(ga, ea)
        else:
            assert g.dtype == e.dtype
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize(
    ("n", "seq_len", "block_size", "shuffle", "dtype"),
    [
        (40, 8, 3, True, "int64"),  # padded slots, 10 batches: short last block of 1
        (40, 8, 4, True, "int32"),  # short last block of 2
        (40, 8, 1, True, "int64"),
        (40, 8, 256, True, "int32"),  # one block longer than the file
        (40, 8, 3, False, "int64"),
        (36, 256, 4, True, "int64"),  # unpadded: 4 * 256 * 4 bytes is exactly one page
        (36, 256, 5, True, "int32"),
    ],
)
def test_three_epochs_match_core(
    make_file: MakeFile, n: int, seq_len: int, block_size: int, shuffle: bool, dtype: str
) -> None:
    path = make_file(n=n, seq_len=seq_len)
    kw: dict[str, Any] = {"block_size": block_size, "shuffle": shuffle, "dtype": dtype}
    ds = tf_dataset(path, num_epochs=3, seed=11, **kw)
    expected = core_epochs(path, 3, seed=11, **kw)
    assert len(ds) == len(expected) == 3 * (n // 4)
    assert_same(as_numpy(ds), expected)
    assert ds.element_spec == tf.TensorSpec((4, seq_len), getattr(tf, dtype))


def test_default_seed_is_the_headers_and_epoch_argument(make_file: MakeFile) -> None:
    path = make_file(seed=99)
    got = as_numpy(tf_dataset(path, block_size=2, epoch=5, num_epochs=2, prefetch=0))
    assert_same(got, core_epochs(path, 2, block_size=2, epoch=5))


def test_next_token_pairs(make_file: MakeFile) -> None:
    path = make_file()
    ds = tf_dataset(path, block_size=3, next_token=True, dtype="int32", num_epochs=2)
    assert ds.element_spec == (
        tf.TensorSpec((4, 7), tf.int32),
        tf.TensorSpec((4, 7), tf.int64),
    )
    expected = core_epochs(path, 2, block_size=3, next_token=True, dtype="int32")
    assert_same(as_numpy(ds), expected)


def test_ids_above_2_31_wrap_in_int32_and_stay_exact_in_int64(tmp_path: Path) -> None:
    path = tmp_path / "big.batch"
    tokens = (np.uint32(2**32 - 64) + np.arange(64, dtype=np.uint32)).reshape(8, 8)
    write_batch_file(path, tokens, batch_size=2, seed=3)
    for dtype in ("int32", "int64"):
        got = as_numpy(tf_dataset(path, block_size=2, dtype=dtype))
        assert_same(got, core_epochs(path, 1, block_size=2, dtype=dtype))
    assert as_numpy(tf_dataset(path, dtype="int32"))[0].min() < 0
    assert as_numpy(tf_dataset(path, dtype="int64"))[0].min() >= 2**32 - 64


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_split_rows_and_cover_every_row_once(make_file: MakeFile, world_size: int) -> None:
    path = make_file(n=40, seq_len=8, batch_size=4)
    firsts: list[int] = []
    for rank in range(world_size):
        ds = tf_dataset(path, block_size=3, rank=rank, world_size=world_size)
        assert ds.element_spec.shape == (4 // world_size, 8)
        got = as_numpy(ds)
        kw = {"block_size": 3, "rank": rank, "world_size": world_size}
        assert_same(got, core_epochs(path, 1, **kw))
        firsts.extend(int(row[0]) // 8 for batch in got for row in batch)
    assert sorted(firsts) == list(range(40))  # row i starts with token i * seq_len


def test_rank_and_world_from_environment(make_file: MakeFile, monkeypatch: Any) -> None:
    path = make_file()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = as_numpy(tf_dataset(path, block_size=3))
    assert_same(got, core_epochs(path, 1, block_size=3, rank=1, world_size=2))
    with pytest.raises(ValueError, match="both"):
        tf_dataset(path, rank=0)


@pytest.mark.parametrize("consumed", [1, 7, 10, 13])
def test_resume_from_core_state_equals_tail(make_file: MakeFile, consumed: int) -> None:
    path = make_file()  # 10 batches: consumed=10 is an epoch boundary, 13 is inside epoch 1
    kw: dict[str, Any] = {"block_size": 3, "dtype": "int64"}
    full = core_epochs(path, 3, **kw)
    loader = BatchNativeLoader(path, **kw)
    states = [state for _ in range(3) for _item, state in items_with_states(loader)]
    state = states[consumed - 1]  # the cursor right after the consumed-th item
    served = state["epoch"] + (state["step"] >= 10)  # a served epoch (pass open) is done
    ds = tf_dataset(path, state=state, num_epochs=3 - served, **kw)
    assert len(ds) == 30 - consumed
    assert_same(as_numpy(ds), full[consumed:])


def test_finished_epoch_state_resumes_at_next_epoch(make_file: MakeFile) -> None:
    path = make_file()
    state = dict(BatchNativeLoader(path, block_size=3).state_dict(), step=10)
    got = as_numpy(tf_dataset(path, block_size=3, state=state))
    assert_same(got, core_epochs(path, 2, block_size=3)[10:])


def test_bad_states_and_arguments_are_rejected(make_file: MakeFile) -> None:
    path = make_file()
    state = BatchNativeLoader(path, block_size=3).state_dict()
    with pytest.raises(StateError, match="block_size"):
        tf_dataset(path, block_size=4, state=state)
    with pytest.raises(StateError, match="step"):
        tf_dataset(path, block_size=3, state=dict(state, step=11))
    with pytest.raises(ValueError, match="dtype"):
        tf_dataset(path, dtype="uint32")
    with pytest.raises(ValueError, match="num_epochs"):
        tf_dataset(path, num_epochs=-1)
    with pytest.raises(ValueError, match="evenly"):
        tf_dataset(path, rank=0, world_size=3)


def test_repeat_forever_and_spans_computed_once_per_epoch(
    make_file: MakeFile, monkeypatch: Any
) -> None:
    calls: list[int] = []
    spans = BlockOrder.spans

    def counting(self: BlockOrder, epoch: int, start: int = 0) -> Any:
        calls.append(epoch)
        return spans(self, epoch, start)

    path = make_file()
    expected = core_epochs(path, 4, block_size=3, epoch=2)[4:35]
    state = dict(BatchNativeLoader(path, block_size=3, epoch=2).state_dict(), step=4)
    monkeypatch.setattr(BlockOrder, "spans", counting)
    ds = tf_dataset(path, block_size=3, num_epochs=None, state=state, prefetch=0)
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY
    got = as_numpy(ds.take(6 + 10 + 10 + 5))
    assert_same(got, expected)
    assert calls == [2, 3, 4, 5]  # one span list per epoch, never per element


def test_empty_file_is_empty_even_repeated(tmp_path: Path) -> None:
    path = tmp_path / "empty.batch"
    write_batch_file(path, np.zeros((3, 8), np.uint32), batch_size=4, allow_empty=True)
    assert as_numpy(tf_dataset(path, num_epochs=None)) == []


def test_broken_file_raises_format_error(make_file: MakeFile) -> None:
    path = make_file()
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 1)
    with pytest.raises(FormatError, match="size_mismatch"):
        tf_dataset(path)


def test_keras_fit_next_token(tmp_path: Path) -> None:
    keras = require("keras")
    path = tmp_path / "lm.batch"
    tokens: npt.NDArray[np.int64] = np.random.default_rng(0).integers(0, 64, size=(64, 17))
    assert write_batch_file(path, tokens, batch_size=8, seed=1) == 8
    ds = tf_dataset(path, block_size=2, num_epochs=None, next_token=True)
    model = keras.Sequential(
        [
            keras.Input((16,), dtype="int32"),
            keras.layers.Embedding(64, 8),
            keras.layers.Dense(64),
        ]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = model.fit(ds, epochs=2, steps_per_epoch=4, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 2 and all(np.isfinite(losses))


# -- uint16 files and datasets ---------------------------------------------------------------
def twin_datasets(
    directory: Path, tokens: npt.NDArray[np.integer], seq_len: int
) -> dict[str, Path]:
    """The same records as a dataset of uint32 shards and one of uint16 shards."""
    from zerobatch_core.datasets.build import write_sharded_dataset

    out = {}
    for dtype in (WIDE, NARROW):
        path = directory / f"ds-{dtype}"
        write_sharded_dataset(
            path, iter([tokens]), batch_size=4, seq_len=seq_len, shard_batches=3, seed=2,
            dtype=dtype,
        )  # fmt: skip
        out[dtype] = path
    return out


def twin_elements(paths: dict[str, Path], **kw: Any) -> tuple[list[Any], list[Any]]:
    return tuple(as_numpy(tf_dataset(paths[name], **kw)) for name in (WIDE, NARROW))  # type: ignore[return-value]


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 2)])
def test_uint16_file_serves_the_uint32_files_elements(
    tmp_path: Path, dtype: str, next_token: bool, rank: int, world: int
) -> None:
    """TensorFlow's record reader decodes the uint16 slots (half the bytes) and casts them in
    the graph: the elements, their spec and their order equal the uint32 file's."""
    from zerobatch_adapters.tensorflow import TFBatchDataset

    paths = write_twins(tmp_path)
    kw: dict[str, Any] = {"dtype": dtype, "next_token": next_token, "rank": rank}
    kw |= {"world_size": world, "block_size": 3, "seed": 5}
    with TFBatchDataset(paths[NARROW], **kw) as data:
        assert data._native()  # the graph reads the file: no Python per element
        narrow_spec = data.dataset().element_spec
    assert narrow_spec == tf_dataset(paths[WIDE], **kw).element_spec
    wide, narrow = twin_elements(paths, num_epochs=2, **kw)
    assert len(narrow) == 2 * 13
    assert_same(narrow, wide)
    assert_same(narrow, core_epochs(paths[WIDE], 2, **kw))
    assert (
        max(int(np.max(e)) for item in narrow for e in (item if next_token else (item,))) >= 2**15
    )


def test_uint16_records_are_slots_of_two_byte_tokens(tmp_path: Path) -> None:
    from zerobatch_adapters.tensorflow import _slot_locator
    from zerobatch_spec import DTYPE_UINT16, batch_offset, padded_batch_bytes

    from zerobatch_core import BatchFileReader

    paths = write_twins(tmp_path, n=4 * 300, seq_len=1000, batch_size=4)  # 8,000-byte slots
    with BatchFileReader(paths[NARROW]) as reader:
        _, slot, locate = _slot_locator(reader)
        assert slot == padded_batch_bytes(4, 1000, DTYPE_UINT16) == reader.padded_batch_bytes
        before, after = locate(5, 9)[1:]
        assert before == batch_offset(5, 4, 1000, DTYPE_UINT16)
        assert after == reader.file_size - batch_offset(9, 4, 1000, DTYPE_UINT16)
    wide, narrow = twin_elements(paths, block_size=7, seed=3)
    assert_same(narrow, wide)


def test_uint16_generated_path_serves_the_uint32_files_elements(tmp_path: Path) -> None:
    """Steps the record reader cannot serve (two stored batches a step, skipped steps) come
    from the core loader, which widens the uint16 tokens: the same elements."""
    paths = write_twins(tmp_path, seq_len=9)  # next-token pairs 8 wide: 2 context chunks
    for kw in (
        {"global_batch_size": 8},
        {"skip_steps": [(2, 5)]},
        {"context_size": 2, "context_rank": 1},
    ):
        opts: dict[str, Any] = {"block_size": 3, "next_token": True, "dtype": "int64", **kw}
        wide, narrow = twin_elements(paths, **opts)
        assert_same(narrow, wide)
        assert_same(narrow, core_epochs(paths[WIDE], 1, **opts))


def test_uint16_documents_equal_the_uint32_files(tmp_path: Path) -> None:
    tokens = narrow_tokens(4 * 13, 8)
    tokens[:, ::3] = NARROW_MAX  # the BOS id: the largest uint16 token
    paths = write_twins(tmp_path, tokens=tokens)
    for next_token in (False, True):
        kw: dict[str, Any] = {"bos_id": NARROW_MAX, "next_token": next_token, "block_size": 3}
        wide, narrow = (
            [{k: v.numpy() for k, v in e.items()} for e in tf_dataset(paths[name], **kw)]
            for name in (WIDE, NARROW)
        )
        core = [dict(item) for item in BatchNativeLoader(paths[WIDE], dtype="int32", **kw)]
        assert len(narrow) == len(wide) == len(core) == 13
        for n, w, c in zip(narrow, wide, core, strict=True):
            assert sorted(n) == sorted(w) == sorted(c)
            for key in n:
                assert n[key].dtype == w[key].dtype
                np.testing.assert_array_equal(n[key], w[key])
                np.testing.assert_array_equal(n[key], c[key])


@pytest.mark.parametrize("verify", ["off", "always"])
def test_uint16_dataset_of_shards_serves_the_uint32_datasets_elements(
    tmp_path: Path, verify: str
) -> None:
    """A dataset of uint16 shards: read by the record reader shard by shard (``verify="off"``)
    or through the core loader, which checks every slot's checksum (``"always"``)."""
    from zerobatch_adapters.tensorflow import TFBatchDataset

    tokens = narrow_tokens(4 * 14, 8)
    paths = twin_datasets(tmp_path, tokens, 8)
    kw: dict[str, Any] = {"block_size": 2, "seed": 9, "verify": verify, "next_token": True}
    with TFBatchDataset(paths[NARROW], **kw) as data:
        assert data._native() == (verify == "off")
        assert data.loader.source.token_dtype == np.dtype(np.uint16)
    wide, narrow = twin_elements(paths, num_epochs=2, **kw)
    assert len(narrow) == 2 * 14
    assert_same(narrow, wide)
    assert_same(narrow, core_epochs(paths[WIDE], 2, **kw))


def test_uint16_input_context_pipelines_read_their_rows(tmp_path: Path) -> None:
    from zerobatch_adapters.tensorflow import TFBatchDataset

    paths = write_twins(tmp_path)
    rows: dict[str, list[Any]] = {WIDE: [], NARROW: []}
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline)
        for name, path in paths.items():
            with TFBatchDataset(path, input_context=context, block_size=3) as data:
                rows[name].append(as_numpy(data.dataset()))
        assert_same(rows[NARROW][pipeline], rows[WIDE][pipeline])
        want = core_epochs(paths[WIDE], 1, block_size=3, rank=pipeline, world_size=2)
        assert_same(rows[NARROW][pipeline], want)
