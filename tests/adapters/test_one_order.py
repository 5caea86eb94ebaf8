"""One order, four outputs: the core loader and the three adapters yield the same tokens.

For the same file, seed, epoch, rank and world size, PyTorch, JAX, tf.data and the core
``BatchNativeLoader`` must serve identical token sequences, so switching framework never
changes what a model sees.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from tests.helpers import require
from zerobatch_core import BatchNativeLoader

torch = require("torch")
jax = require("jax")
tf = require("tensorflow")

from zerobatch_adapters.jax import JaxBatchIterator  # noqa: E402
from zerobatch_adapters.tensorflow import tf_dataset  # noqa: E402
from zerobatch_adapters.torch import TorchBatchDataset  # noqa: E402

CASES = [
    {"block_size": 3, "seed": 11, "epoch": 0},
    {"block_size": 1, "seed": 2**40 + 5, "epoch": 3},
    {"block_size": 256, "seed": 0, "epoch": 1},
]


def core_epoch(path: Path, rank: int = 0, world: int = 1, **order: int) -> list[np.ndarray]:
    loader = BatchNativeLoader(path, dtype="int64", rank=rank, world_size=world, **order)
    return [np.asarray(b) for b in loader]


@pytest.mark.parametrize("order", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("world", [1, 2])
def test_four_outputs_one_sequence(
    make_file: Callable[..., Path], order: dict[str, int], world: int
) -> None:
    path = make_file(n=8 * 21 + 3, seq_len=16, batch_size=8, seed=5)  # 21 batches, short block
    for rank in range(world):
        want = core_epoch(path, rank, world, **order)
        assert len(want) == 21
        got_torch = [
            t.numpy()
            for t in TorchBatchDataset(path, dtype="int64", rank=rank, world_size=world, **order)
        ]
        got_tf = [
            t.numpy()
            for t in tf_dataset(
                path, dtype="int64", rank=rank, world_size=world, num_epochs=1, **order
            )
        ]
        for name, got in (("torch", got_torch), ("tf", got_tf)):
            assert len(got) == len(want), name
            for step, (a, b) in enumerate(zip(got, want, strict=True)):
                np.testing.assert_array_equal(a, b, err_msg=f"{name} step {step} rank {rank}")
    # JAX serves the global batch, its rows spread over all devices: every rank's rows in order.
    whole = core_epoch(path, **order)
    with JaxBatchIterator(path, prefetch=2, **order) as it:
        got_jax = [np.asarray(a) for a in it]
    assert len(got_jax) == len(whole)
    for step, (a, b) in enumerate(zip(got_jax, whole, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"jax step {step}")
    if world > 1:  # the ranks' rows, stacked, are the whole batch
        parts = [core_epoch(path, r, world, **order) for r in range(world)]
        for step in range(21):
            np.testing.assert_array_equal(np.concatenate([p[step] for p in parts]), whole[step])


def test_next_token_pairs_agree(make_file: Callable[..., Path]) -> None:
    path = make_file(n=8 * 9, seq_len=6, batch_size=8, seed=3)
    core = list(BatchNativeLoader(path, block_size=2, dtype="int64", next_token=True))
    torch_pairs = list(TorchBatchDataset(path, block_size=2, next_token=True))
    tf_pairs = list(tf_dataset(path, block_size=2, next_token=True))
    with JaxBatchIterator(path, block_size=2, next_token=True) as it:
        jax_pairs = [(np.asarray(i), np.asarray(label)) for i, label in it]
    for k, (inputs, labels) in enumerate(core):
        for name, (i, label) in (
            ("torch", torch_pairs[k]),
            ("tf", tf_pairs[k]),
            ("jax", jax_pairs[k]),
        ):
            np.testing.assert_array_equal(np.asarray(i), inputs, err_msg=f"{name} {k}")
            np.testing.assert_array_equal(np.asarray(label), labels, err_msg=f"{name} {k}")
