"""``bos_id`` in every adapter: the document layout served beside the tokens is the core's.

The file holds packed-like rows drawn from ten token ids, one of which is the BOS id, so
documents start at random places (and at every row start). Every expectation is the core
``BatchNativeLoader`` item with the same options, compared key by key: the torch and JAX
adapters reuse the core's layout, and the tf.data graph recomputes it with TensorFlow ops, so
these tests pin both to ``zerobatch_core.delivery.documents``.

Each framework is imported inside its own tests (``require``), so a run of this file alone
forks the PyTorch workers before JAX or TensorFlow start any thread.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import require
from zerobatch_core import BatchNativeLoader, write_batch_file

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BOS = 7
BATCH, SEQ_LEN, BATCHES = 8, 16, 7
ORDER: dict[str, Any] = {"block_size": 2, "seed": 5}  # blocks of 2 and a short one
LAYOUT = ("segment_ids", "positions", "cu_seqlens")
READONLY = "The given NumPy array is not writable"


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    """Rows of ids 0..9 where ``BOS`` (7) starts a document wherever it falls."""
    rows = np.random.default_rng(0).integers(0, 10, size=(BATCH * BATCHES, SEQ_LEN))
    path = tmp_path / "packed.batch"
    write_batch_file(path, rows.astype(np.uint32), batch_size=BATCH, seed=3)
    return path


def core_items(path: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """One epoch of the core loader's ``bos_id`` dicts, arrays copied out of the mapping."""
    loader = BatchNativeLoader(path, bos_id=BOS, **ORDER, **kwargs)
    return [{key: np.array(array) for key, array in item.items()} for item in loader]


def token_keys(next_token: bool) -> list[str]:
    return ["inputs", "labels"] if next_token else ["tokens"]


def assert_items(got: list[dict[str, Any]], want: list[dict[str, Any]], dtypes: bool) -> None:
    """Same keys, same values (and with ``dtypes``, same dtypes), item by item."""
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for key, expected in w.items():
            value = np.asarray(g[key])
            if dtypes:
                assert value.dtype == expected.dtype, key
            np.testing.assert_array_equal(value, expected, err_msg=key)


def test_the_file_has_documents_inside_rows(packed: Path) -> None:
    """The fixture exercises the layout: BOS mid-row, rows of one document, varying lengths."""
    items = core_items(packed)
    lengths = {len(item["cu_seqlens"]) for item in items}
    assert len(lengths) > 1  # cu_seqlens varies from batch to batch
    segments = np.concatenate([item["segment_ids"].max(axis=1) for item in items])
    assert segments.max() > 2 and (segments == 1).sum() < len(segments)


# -- PyTorch ------------------------------------------------------------------------------------
def torch_items(items: Any) -> list[dict[str, Any]]:
    out = []
    for item in items:
        assert isinstance(item, dict)
        assert all(type(t).__name__ == "Tensor" for t in item.values())
        out.append({key: t.numpy() for key, t in item.items()})
    return out


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
def test_torch_dataset_items_are_the_core_dicts(packed: Path, dtype: str, next_token: bool) -> None:
    require("torch")
    from zerobatch_adapters.torch import TorchBatchDataset

    kw: dict[str, Any] = {"dtype": dtype, "next_token": next_token}
    ds = TorchBatchDataset(packed, bos_id=BOS, **ORDER, **kw)
    assert_items(torch_items(ds), core_items(packed, **kw), dtypes=True)
    # Rank rows: each rank's layout is its own rows', as the core derives it.
    half = TorchBatchDataset(packed, bos_id=BOS, rank=1, world_size=2, **ORDER, **kw)
    want = core_items(packed, rank=1, world_size=2, **kw)
    assert_items(torch_items(half), want, dtypes=True)


def test_torch_int32_tokens_stay_zero_copy(packed: Path) -> None:
    require("torch")
    from zerobatch_adapters.torch import TorchBatchDataset

    ds = TorchBatchDataset(packed, dtype="int32", bos_id=BOS, **ORDER)
    pairs = TorchBatchDataset(packed, dtype="int32", next_token=True, bos_id=BOS, **ORDER)
    order = ds.loader.epoch_order(0)
    with warnings.catch_warnings(record=True) as caught:
        for index, item, pair in zip(order, ds, pairs, strict=True):
            i = int(index)
            assert item["tokens"].data_ptr() == ds.loader.reader.read_batch(i).ctypes.data
            assert pair["inputs"].data_ptr() == pairs.loader.reader.read_batch(i).ctypes.data
    assert not [w for w in caught if READONLY in str(w.message)]


@pytest.mark.parametrize("next_token", [False, True])
def test_torch_dicts_through_dataloader_workers(packed: Path, next_token: bool) -> None:
    """``DataLoader(batch_size=None)`` workers and ``TorchBatchLoader`` (workers, device move,
    resume) keep the dicts of tensors as the core's items."""
    torch = require("torch")
    from torch.utils.data import DataLoader
    from zerobatch_adapters.torch import TorchBatchDataset, TorchBatchLoader

    # Forking after JAX or TensorFlow started threads can deadlock: use a fork server then.
    ctx = "forkserver" if {"jax", "tensorflow"} & set(sys.modules) else "fork"
    want = core_items(packed, dtype="int64", next_token=next_token)
    ds = TorchBatchDataset(packed, dtype="int64", next_token=next_token, bos_id=BOS, **ORDER)
    workers = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=ctx)
    assert_items(torch_items(workers), want, dtypes=True)

    loader = TorchBatchLoader(
        packed,
        dtype="int64",
        next_token=next_token,
        bos_id=BOS,
        num_workers=2,
        device="cpu",
        multiprocessing_context=ctx,
        **ORDER,
    )
    batches = iter(loader)
    first = [next(batches) for _ in range(3)]
    assert all(t.device == torch.device("cpu") for item in first for t in item.values())
    state = loader.state_dict()
    batches.close()
    resumed = TorchBatchLoader(packed, dtype="int64", next_token=next_token, bos_id=BOS, **ORDER)
    resumed.load_state_dict(state)
    assert_items(torch_items(first) + torch_items(resumed), want, dtypes=True)


@pytest.mark.filterwarnings("ignore:.*pin_memory:UserWarning")  # no accelerator: not pinned
def test_torch_pin_memory_keeps_dicts(packed: Path) -> None:
    torch = require("torch")
    from zerobatch_adapters.torch import TorchBatchLoader

    loader = TorchBatchLoader(packed, next_token=True, bos_id=BOS, pin_memory=True, **ORDER)
    got = list(loader)
    assert_items(torch_items(got), core_items(packed, dtype="int32", next_token=True), True)
    if torch.cuda.is_available():
        assert all(t.is_pinned() for item in got for t in item.values())


# -- JAX ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("next_token", [False, True])
def test_jax_items_are_the_core_dicts_sharded(packed: Path, next_token: bool) -> None:
    jax = require("jax")
    from zerobatch_adapters.jax import JaxBatchIterator, default_sharding

    devices = jax.devices()
    sharding = default_sharding(devices[: math.gcd(len(devices), BATCH)])
    want = core_items(packed, dtype="int32", next_token=next_token)
    with JaxBatchIterator(
        packed, sharding=sharding, next_token=next_token, bos_id=BOS, prefetch=2, **ORDER
    ) as it:
        got = list(it)
    assert len(got) == len(want)
    for item in got:
        assert sorted(item) == sorted([*token_keys(next_token), *LAYOUT])
        for key, value in item.items():
            if key == "cu_seqlens":  # variable length: stays on the host
                assert isinstance(value, np.ndarray) and value.dtype == np.int32
            else:
                assert isinstance(value, jax.Array) and value.dtype == np.int32
                assert value.sharding == sharding and value.shape == it.global_shape
    # Labels are int32 in JAX (int64 in the core): compare values only.
    assert_items([{k: np.asarray(v) for k, v in item.items()} for item in got], want, False)


# -- TensorFlow ---------------------------------------------------------------------------------
def tf_items(ds: Any) -> list[dict[str, Any]]:
    return [{key: t.numpy() for key, t in item.items()} for item in ds]


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
def test_tf_elements_are_the_core_dicts(packed: Path, dtype: str, next_token: bool) -> None:
    tf = require("tensorflow")
    from zerobatch_adapters.tensorflow import tf_dataset

    kw: dict[str, Any] = {"dtype": dtype, "next_token": next_token}
    ds = tf_dataset(packed, bos_id=BOS, **ORDER, **kw)
    spec = ds.element_spec
    assert sorted(spec) == sorted([*token_keys(next_token), *LAYOUT])
    width = SEQ_LEN - 1 if next_token else SEQ_LEN
    assert spec["segment_ids"].shape == spec["positions"].shape == (BATCH, width)
    assert spec["cu_seqlens"].shape.as_list() == [None]
    assert spec["cu_seqlens"].dtype == tf.int32
    assert_items(tf_items(ds), core_items(packed, **kw), dtypes=True)
    # One rank's rows, resumed mid-epoch, over two epochs.
    loader = BatchNativeLoader(packed, bos_id=BOS, rank=1, world_size=4, **ORDER, **kw)
    loader.load_state_dict({**loader.state_dict(), "step": 3})
    ranked = tf_dataset(
        packed,
        bos_id=BOS,
        rank=1,
        world_size=4,
        state=loader.state_dict(),
        num_epochs=2,
        **ORDER,
        **kw,
    )
    want = [{k: np.array(a) for k, a in item.items()} for _ in range(2) for item in loader]
    assert_items(tf_items(ranked), want, dtypes=True)


def test_tf_layout_for_ids_above_2_31(tmp_path: Path) -> None:
    """The graph compares the BOS id's uint32 bits, so a BOS id >= 2**31 works too."""
    require("tensorflow")
    from zerobatch_adapters.tensorflow import tf_dataset

    high = 2**32 - 10
    rows = high + np.random.default_rng(1).integers(0, 10, size=(4 * 3, 6))
    path = tmp_path / "high.batch"
    write_batch_file(path, rows.astype(np.uint32), batch_size=4, seed=1)
    bos = high + BOS
    for next_token in (False, True):
        ds = tf_dataset(path, bos_id=bos, next_token=next_token, block_size=2, dtype="int64")
        loader = BatchNativeLoader(
            path, bos_id=bos, next_token=next_token, block_size=2, dtype="int64"
        )
        want = [{k: np.array(a) for k, a in item.items()} for item in loader]
        assert_items(tf_items(ds), want, dtypes=True)
