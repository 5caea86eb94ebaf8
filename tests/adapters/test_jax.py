"""``zerobatch_adapters.jax``: sharded device batches that are exactly the core loader's.

Every expectation comes from ``BatchNativeLoader`` with the same parameters (and the same
``rank``/``world_size`` for one device's or one process's rows), so the adapter is checked for
order, row placement, epochs, prefetch and resume without restating the spec here.

The checks that need 8 devices (or 2 processes) run in subprocesses with
``--xla_force_host_platform_device_count``, because XLA fixes the device count when the
backend starts and another test module may have started it already; the in-process tests
work with whatever device count this process has.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from tests.adapters.twins import NARROW, NARROW_MAX, WIDE, narrow_tokens, write_twins
from tests.helpers import items_with_states, require
from zerobatch_core import BatchNativeLoader, StateError
from zerobatch_core.delivery.distributed import rank_rows

DEVICE_FLAG = "--xla_force_host_platform_device_count"
os.environ.setdefault("XLA_FLAGS", f"{DEVICE_FLAG}=8")
jax = require("jax")

from zerobatch_adapters.jax import (  # noqa: E402
    JaxBatchIterator,
    ProcessBlock,
    ProcessRows,
    data_context_sharding,
    default_sharding,
    process_block,
    process_rows,
)

MakeFile = Callable[..., Path]
ROOT = Path(__file__).resolve().parents[2]
FULL = slice(None)


# -- helpers -----------------------------------------------------------------------------------
def local_sharding() -> Any:
    """Batch axis over as many of this process's devices as divide a batch of 8."""
    devices = jax.devices()
    return default_sharding(devices[: math.gcd(len(devices), 8)])


def child_env(devices: int) -> dict[str, str]:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_FLAG}={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    return env


def run_child(script: str, *args: str, devices: int = 8) -> Any:
    """Run ``script`` in a fresh Python with ``devices`` CPU devices; its last line is JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=child_env(devices),
        cwd=ROOT,
        timeout=180,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def core_items(loader: BatchNativeLoader, count: int) -> list[Any]:
    """``count`` items of the core loader across epochs, copied out of the mapping (a pass that
    reaches the end of its epoch is run to its end, so the cursor is in the next epoch)."""
    out: list[Any] = []
    while len(out) < count:
        for item in loader:
            out.append(tuple(np.array(a) for a in item) if isinstance(item, tuple) else item.copy())
            if len(out) == count and loader.step < len(loader):
                break
    return out


def assert_array(got: Any, want: Any, sharding: Any) -> None:
    assert isinstance(got, jax.Array)
    assert got.dtype == np.int32 and got.shape == want.shape
    assert got.sharding == sharding
    np.testing.assert_array_equal(np.asarray(got), want)


# -- process_rows: which rows a process owns, from fake multi-process index maps ---------------
def rows_map(spans: dict[int, tuple[int, int]]) -> dict[int, tuple[slice, slice]]:
    """A fake ``addressable_devices_indices_map``: device id -> (rows, whole sequence)."""
    return {d: (slice(a, b), FULL) for d, (a, b) in spans.items()}


def test_process_rows_devices_4_to_7_of_8_are_rank_1_of_2() -> None:
    fake = rows_map({d: (2 * d, 2 * d + 2) for d in range(4, 8)})  # process 1 of a 2-host mesh
    got = process_rows(fake, (16, 8))
    assert got == ProcessRows(1, 2, slice(8, 16))
    assert rank_rows(16, got.rank, got.world_size) == slice(8, 16)


@pytest.mark.parametrize("processes", [1, 2, 4, 8])
def test_process_rows_every_process_of_an_even_split(processes: int) -> None:
    per_device = 4  # 32 rows over 8 devices
    devices_per_process = 8 // processes
    for p in range(processes):
        ids = range(p * devices_per_process, (p + 1) * devices_per_process)
        fake = rows_map({d: (d * per_device, (d + 1) * per_device) for d in ids})
        got = process_rows(fake, (32, 5))
        assert (got.rank, got.world_size) == (p, processes)
        assert got.rows == rank_rows(32, p, processes)


def test_process_rows_replicated_and_whole() -> None:
    # A (data=2, model=2) mesh whose process holds data index 1: rows [8, 16) on two devices,
    # each with half of the sequence (the process still has all of it).
    fake = {
        0: (slice(8, 16), slice(0, 4)),
        1: (slice(8, 16), slice(4, 8)),
        2: (slice(8, 16), slice(0, 4)),
        3: (slice(8, 16), slice(4, 8)),
    }
    assert process_rows(fake, (16, 8)) == ProcessRows(1, 2, slice(8, 16))
    assert process_rows({0: (FULL, FULL), 1: (FULL, FULL)}, (16, 8)) == (0, 1, slice(0, 16))
    assert process_rows({0: None}, (16, 8)) == (0, 1, slice(0, 16))
    assert process_rows({0: (FULL,)}, (16, 8)) == (0, 1, slice(0, 16))  # short index


def test_process_rows_from_real_index_maps() -> None:
    """Devices of this process split into fake 'processes' of adjacent devices."""
    devices = jax.devices()
    n = len(devices)
    sharding = default_sharding(devices)
    shape = (8 * n, 3)
    full = sharding.devices_indices_map(shape)
    for processes in (p for p in range(1, n + 1) if n % p == 0):
        per = n // processes
        for p in range(processes):
            mine = {d: full[d] for d in devices[p * per : (p + 1) * per]}
            got = process_rows(mine, shape)
            assert (got.rank, got.world_size) == (p, processes)
            assert got.rows == slice(p * 8 * per, (p + 1) * 8 * per)


@pytest.mark.parametrize(
    ("index_map", "shape", "message"),
    [
        # devices 0, 1, 4, 5 of an 8-device batch split: two runs of rows
        (rows_map({0: (0, 2), 1: (2, 4), 4: (8, 10), 5: (10, 12)}), (16, 8), "non-contiguous"),
        # interleaved mesh order: this process holds every other device's rows
        (rows_map({0: (0, 2), 2: (4, 6), 4: (8, 10), 6: (12, 14)}), (16, 8), "non-contiguous"),
        (rows_map({0: (0, 3), 1: (3, 6)}), (16, 8), "equal parts"),  # 6 rows: not a part of 16
        (rows_map({0: (2, 4), 1: (4, 6)}), (8, 8), "equal parts"),  # 4 rows, not at 0 or 4
        ({}, (16, 8), "no device"),
        ({0: (slice(0, 8), slice(0, 4))}, (16, 8), "only the batch axis"),
        ({0: (slice(0, 16, 2), FULL)}, (16, 8), "step"),
    ],
)
def test_process_rows_rejects_what_the_core_cannot_read(
    index_map: dict[int, Any], shape: tuple[int, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        process_rows(index_map, shape)


class FakeSharding:
    """Only what the constructor asks of a sharding: this process's device index map."""

    def __init__(self, spans: dict[int, tuple[int, int]]) -> None:
        self.spans = spans

    def addressable_devices_indices_map(self, shape: tuple[int, ...]) -> dict[int, Any]:
        return rows_map(self.spans)


def test_constructor_maps_the_sharding_to_the_core_rank(make_file: MakeFile) -> None:
    path = make_file(n=64, seq_len=6, batch_size=16)
    fake = cast(Any, FakeSharding({d: (2 * d, 2 * d + 2) for d in range(4, 8)}))
    it = JaxBatchIterator(path, sharding=fake, block_size=2)
    assert it.rows == slice(8, 16)
    assert it.loader.rows == slice(8, 16)  # the core reads exactly this process's rows
    assert it.loader.batch_shape == (8, 6)
    it.close()
    bad = cast(Any, FakeSharding({0: (0, 2), 1: (2, 4), 4: (8, 10)}))
    with pytest.raises(ValueError, match="non-contiguous"):
        JaxBatchIterator(path, sharding=bad)


# -- process_block: rows and columns (data x context), from fake index maps --------------------
def block(rows: tuple[int, int], cols: tuple[int, int]) -> tuple[slice, slice]:
    return slice(*rows), slice(*cols)


@pytest.mark.parametrize(
    ("index_map", "shape", "want"),
    [
        # rows [8, 16) of 16, columns [4, 8) of 8 on two replica devices: DP 1 of 2, CP 1 of 2
        (
            {0: block((8, 16), (4, 8)), 1: block((8, 16), (4, 8))},
            (16, 8),
            ProcessBlock(1, 2, slice(8, 16), 1, 2, 1, slice(4, 8)),
        ),
        # a 2 x 2 corner of a (4, 2) mesh: rows [0, 8) of 16, both column blocks
        (
            {
                0: block((0, 4), (0, 4)),
                1: block((0, 4), (4, 8)),
                2: block((4, 8), (0, 4)),
                3: block((4, 8), (4, 8)),
            },
            (16, 8),
            ProcessBlock(0, 2, slice(0, 8), 0, 2, 2, slice(0, 8)),
        ),
        # three of four column blocks: context ranks 1, 2, 3 served together
        (
            {d: block((0, 4), (2 * d, 2 * d + 2)) for d in (1, 2, 3)},
            (4, 8),
            ProcessBlock(0, 1, slice(0, 4), 1, 4, 3, slice(2, 8)),
        ),
        ({0: None}, (4, 8), ProcessBlock(0, 1, slice(0, 4), 0, 1, 1, slice(0, 8))),
    ],
)
def test_process_block_maps_rows_and_columns(
    index_map: dict[int, Any], shape: tuple[int, int], want: ProcessBlock
) -> None:
    assert process_block(index_map, shape) == want
    if want.context_size == 1:  # whole columns: the same rows as process_rows gives
        assert process_rows(index_map, shape) == want[:3]


@pytest.mark.parametrize(
    ("index_map", "shape", "message"),
    [
        ({0: block((0, 4), (0, 2)), 1: block((0, 4), (4, 6))}, (4, 8), "non-contiguous columns"),
        ({0: block((0, 4), (0, 2)), 1: block((0, 4), (2, 6))}, (4, 8), "not equal parts"),
        ({0: block((0, 4), (0, 3))}, (4, 8), "not equal parts"),  # 3 columns do not split 8
        ({0: block((0, 4), (1, 3))}, (4, 8), "not equal parts"),  # not on a block boundary
        ({0: block((0, 4), (0, 4)), 1: block((8, 12), (0, 4))}, (16, 8), "non-contiguous rows"),
        ({0: (slice(0, 4), slice(0, 4), slice(0, 1))}, (4, 8, 2), "batch and sequence axes"),
        ({0: (slice(0, 4),)}, (4,), "global_shape must be"),
        ({}, (4, 8), "no device"),
    ],
)
def test_process_block_rejects_what_the_core_cannot_read(
    index_map: dict[int, Any], shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        process_block(index_map, shape)


def test_data_context_sharding_is_a_2d_named_sharding() -> None:
    devices = jax.devices()
    n = len(devices)
    s = data_context_sharding(1)
    assert s.mesh.axis_names == ("data", "context")
    assert dict(s.mesh.shape) == {"data": n, "context": 1}
    assert s.spec == jax.sharding.PartitionSpec("data", "context")
    if n % 2 == 0:
        two = data_context_sharding(2)
        assert two.mesh.devices.shape == (n // 2, 2)
        assert list(two.mesh.devices.flat) == devices  # row-major: context groups adjacent
    with pytest.raises(ValueError, match="divides the device count"):
        data_context_sharding(n + 1)
    with pytest.raises(ValueError, match="positive integer"):
        data_context_sharding(0)


class FakeBlocks:
    """A sharding stand-in giving this process the blocks ``index_map`` names."""

    def __init__(self, index_map: dict[int, Any]) -> None:
        self.index_map = index_map

    def addressable_devices_indices_map(self, shape: tuple[int, ...]) -> dict[int, Any]:
        return self.index_map


def test_constructor_maps_a_block_to_dp_and_cp_ranks(make_file: MakeFile) -> None:
    path = make_file(n=16 * 4, seq_len=17, batch_size=16)  # next-token width 16
    # process with rows [8, 16) and context devices 2, 3 of 4 (columns [8, 16) of 16)
    mine = cast(Any, FakeBlocks({0: block((8, 16), (8, 12)), 1: block((8, 16), (12, 16))}))
    for zigzag in (False, True):
        it = JaxBatchIterator(path, sharding=mine, next_token=True, zigzag=zigzag, block_size=2)
        assert it.global_shape == (16, 16)
        assert (it.rows, it.columns) == (slice(8, 16), slice(8, 16))
        s = it.loader.slicing
        assert (s.dp_rank, s.dp_size, s.cp_rank, s.cp_size, s.cp_count) == (1, 2, 2, 4, 2)
        core = BatchNativeLoader(path, next_token=True, block_size=2, dtype="int32")
        # zig-zag: devices 2, 3 of 4 hold chunks 2, 5 and 3, 4 of 8 (2 tokens each)
        cols = np.r_[4:6, 10:12, 6:10] if zigzag else np.r_[8:16]
        for (inputs, labels), (want_in, want_lab) in zip(it.loader, core, strict=True):
            np.testing.assert_array_equal(inputs, want_in[8:16][:, cols])
            np.testing.assert_array_equal(labels, want_lab[8:16][:, cols])
        it.close()
    # an explicit context share, split again by the sharding: context 1 of 2, then 2 of 4
    half = cast(Any, FakeBlocks({0: block((0, 16), (4, 8))}))
    it = JaxBatchIterator(path, sharding=half, next_token=True, context_rank=1, context_size=2)
    assert it.global_shape == (16, 8)
    s = it.loader.slicing
    assert (s.cp_rank, s.cp_size, s.cp_count, it.loader.columns) == (3, 4, 1, [(12, 16)])
    it.close()
    with pytest.raises(ValueError, match="give one of them"):
        JaxBatchIterator(
            path, sharding=half, next_token=True, zigzag=True, context_rank=1, context_size=2
        )
    odd = make_file(n=16 * 2, seq_len=13, batch_size=16, name="odd.batch")  # width 12
    quarter = cast(Any, FakeBlocks({0: block((0, 16), (0, 3))}))  # 4 column blocks of 3
    with pytest.raises(ValueError, match="cuts the width 12 into 8 chunks"):
        JaxBatchIterator(odd, sharding=quarter, next_token=True, zigzag=True)


def test_constructor_rejects_bad_prefetch(make_file: MakeFile) -> None:
    path = make_file(batch_size=8)
    with pytest.raises(ValueError, match="prefetch"):
        JaxBatchIterator(path, sharding=local_sharding(), prefetch=-1)
    with pytest.raises(TypeError, match="prefetch"):
        JaxBatchIterator(path, sharding=local_sharding(), prefetch=cast(Any, 1.5))


def test_default_sharding_splits_the_batch_axis_over_all_devices() -> None:
    s = default_sharding()
    assert s.mesh.axis_names == ("data",)
    assert list(s.mesh.devices.flat) == jax.devices()
    assert s.spec == jax.sharding.PartitionSpec("data")


# -- in-process iteration (any device count) ----------------------------------------------------
def test_epochs_len_and_set_epoch_follow_the_core(make_file: MakeFile) -> None:
    path = make_file(n=56, seq_len=5, batch_size=8)  # 7 batches
    sharding = local_sharding()
    kw: dict[str, Any] = {"block_size": 3, "seed": 21}
    it = JaxBatchIterator(path, sharding=sharding, prefetch=2, **kw)
    core = BatchNativeLoader(path, dtype="int32", **kw)
    assert len(it) == len(core) == 7
    for _ in range(2):  # a new iter() after the end of an epoch serves the next one
        got, want = list(it), core_items(core, 7)
        assert len(got) == 7
        for g, w in zip(got, want, strict=True):
            assert_array(g, w, sharding)
    assert it.state_dict() == core.state_dict()
    assert it.state_dict()["epoch"] == 2
    # set_epoch of the current epoch keeps the position; another epoch starts from its top
    first = iter(it)
    next(first)
    it.set_epoch(2)
    core.set_epoch(2)
    next(core_iter := iter(core))
    np.testing.assert_array_equal(np.asarray(next(iter(it))), next(core_iter))
    it.set_epoch(5)
    core.set_epoch(5)
    for g, w in zip(it, core_items(core, 7), strict=True):
        assert_array(g, w, sharding)
    it.close()


def test_start_epoch_and_unshuffled(make_file: MakeFile) -> None:
    path = make_file(n=40, seq_len=4, batch_size=8)
    it = JaxBatchIterator(path, sharding=local_sharding(), shuffle=False, epoch=3)
    assert [int(np.asarray(b)[0, 0]) for b in it] == [
        int(b[0, 0]) for b in BatchNativeLoader(path, shuffle=False)
    ]
    assert it.state_dict()["epoch"] == 4
    it.close()


def test_next_token_pairs_are_int32_and_sharded(make_file: MakeFile) -> None:
    path = make_file(n=48, seq_len=9, batch_size=8)
    sharding = local_sharding()
    it = JaxBatchIterator(path, sharding=sharding, block_size=2, next_token=True)
    core = BatchNativeLoader(path, block_size=2, dtype="int32", next_token=True)
    assert it.global_shape == (8, 8)
    pairs = list(it)
    assert len(pairs) == 6
    for (inputs, labels), (want_in, want_lab) in zip(pairs, core_items(core, 6), strict=True):
        assert_array(inputs, want_in, sharding)
        assert_array(labels, want_lab.astype(np.int32), sharding)
        np.testing.assert_array_equal(np.asarray(labels)[:, :-1], np.asarray(inputs)[:, 1:])
    it.close()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_state_dict_counts_only_delivered_batches(make_file: MakeFile) -> None:
    path = make_file(n=80, seq_len=4, batch_size=8)  # 10 batches
    sharding = local_sharding()
    kw: dict[str, Any] = {"block_size": 3, "seed": 5}
    it = JaxBatchIterator(path, sharding=sharding, prefetch=3, **kw)
    core = BatchNativeLoader(path, dtype="int32", **kw)
    expected = [(item.copy(), state) for item, state in items_with_states(core)]
    k = 4
    stream = iter(it)
    for i in range(k):
        assert_array(next(stream), expected[i][0], sharding)
        assert it.state_dict() == expected[i][1]
    wait_for(lambda: it.loader.step >= k + 3)  # 3 more are already in flight
    saved = json.loads(json.dumps(it.state_dict()))
    assert saved == expected[k - 1][1] and saved["step"] == k

    # A new pass drops the read-ahead and resumes at the first undelivered batch.
    again = iter(it)
    with pytest.raises(StopIteration):
        next(stream)  # the previous pass is over
    assert_array(next(again), expected[k][0], sharding)
    assert it.state_dict() == expected[k][1]

    # The saved state resumes a fresh iterator, and the core loader, at batch k.
    fresh = JaxBatchIterator(path, sharding=sharding, prefetch=1, **kw)
    fresh.load_state_dict(saved)
    rest = [np.asarray(b) for b in fresh]
    assert len(rest) == 10 - k
    for got, (want, _) in zip(rest, expected[k:], strict=True):
        np.testing.assert_array_equal(got, want)
    other = BatchNativeLoader(path, **kw)
    other.load_state_dict(saved)
    np.testing.assert_array_equal(next(iter(other)), expected[k][0])

    with pytest.raises(StateError):
        fresh.load_state_dict({**saved, "seed": 6})
    it.close()
    fresh.close()


def test_close_stops_prefetch_and_keeps_the_state(make_file: MakeFile) -> None:
    path = make_file(n=80, seq_len=4, batch_size=8)
    with JaxBatchIterator(path, sharding=local_sharding(), prefetch=2) as it:
        stream: Iterator[Any] = iter(it)
        next(stream)
        next(stream)
    assert it.state_dict()["step"] == 2
    with pytest.raises(StopIteration):
        next(stream)
    with pytest.raises(ValueError, match="closed"):
        next(iter(it))


def test_uneven_batch_over_the_devices_is_a_clear_error(make_file: MakeFile) -> None:
    path = make_file(n=30, seq_len=4, batch_size=3)
    devices = jax.devices()
    if len(devices) == 1:  # one device holds any batch: fake a 2-device split of 3 rows
        sharding = cast(Any, FakeSharding({0: (0, 2)}))
        message = "equal parts"
    else:
        sharding = default_sharding(devices[:2])
        message = "cannot split"
    with pytest.raises(ValueError, match=message):
        JaxBatchIterator(path, sharding=sharding)


# -- 8 devices, in a subprocess ----------------------------------------------------------------
SHARDS_CHILD = r"""
import json, sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from zerobatch_core import BatchNativeLoader
from zerobatch_core.delivery.distributed import rank_rows
from zerobatch_adapters.jax import JaxBatchIterator, default_sharding

path = sys.argv[1]
devices = jax.devices()
assert len(devices) == 8, devices
kw = dict(block_size=3, seed=11)
B = BatchNativeLoader(path).reader.batch_size
checked = {}

# Default sharding: device k of the mesh is core rank k of 8, holding only its rows.
sharding = default_sharding()
position = {d: k for k, d in enumerate(sharding.mesh.devices.flat)}
for next_token in (False, True):
    it = JaxBatchIterator(path, sharding=sharding, prefetch=2, next_token=next_token, **kw)
    whole = BatchNativeLoader(path, dtype="int32", next_token=next_token, **kw)
    ranks = [BatchNativeLoader(path, dtype="int32", next_token=next_token, rank=k, world_size=8,
                               **kw) for k in range(8)]
    n = 0
    for _ in range(2):  # two epochs: the second is a new iter() after the first ends
        for got, want, *per_rank in zip(it, whole, *ranks, strict=True):
            got, want = (got, want) if next_token else ((got,), (want,))
            per_rank = per_rank if next_token else [(r,) for r in per_rank]
            for j, (g, w) in enumerate(zip(got, want, strict=True)):
                w = w.astype(np.int32)
                assert g.dtype == np.int32 and g.shape == w.shape and g.sharding == sharding
                assert np.array_equal(np.asarray(g), w)  # the global array is the core batch
                shards = g.addressable_shards
                assert len(shards) == 8 and {s.device for s in shards} == set(devices)
                for s in shards:
                    k = position[s.device]
                    assert s.index[0] == rank_rows(B, k, 8), (s.index, k)
                    assert s.data.shape == (B // 8, w.shape[1])  # only its rows, no gather
                    assert np.array_equal(np.asarray(s.data), per_rank[k][j].astype(np.int32))
            n += 1
    assert n == 2 * len(it)
    checked[f"default_next_token={next_token}"] = n
    it.close()

# 2-D meshes: rows over "data", replicated over or splitting the sequence by "model".
mesh = Mesh(np.asarray(devices).reshape(4, 2), ("data", "model"))
for spec in (P("data"), P("data", "model")):
    sharding = NamedSharding(mesh, spec)
    it = JaxBatchIterator(path, sharding=sharding, **kw)
    n = 0
    for g, w in zip(it, BatchNativeLoader(path, dtype="int32", **kw), strict=True):
        assert np.array_equal(np.asarray(g), w) and g.sharding == sharding
        for s in g.addressable_shards:
            assert np.array_equal(np.asarray(s.data), w[s.index])
            assert s.data.shape[0] == B // 4
        n += 1
    checked[",".join(str(a) for a in spec)] = n
    it.close()
print(json.dumps({"devices": len(devices), "checked": checked}))
"""


def test_eight_devices_hold_exactly_their_rows_in_core_order(make_file: MakeFile) -> None:
    path = make_file(n=16 * 7, seq_len=8, batch_size=16)  # 7 batches of 16 rows
    out = run_child(SHARDS_CHILD, str(path))
    assert out["devices"] == 8
    assert out["checked"] == {
        "default_next_token=False": 14,
        "default_next_token=True": 14,
        "data": 7,
        "data,model": 7,
    }


TRAIN_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from zerobatch_adapters.jax import JaxBatchIterator, default_sharding

path, vocab = sys.argv[1], int(sys.argv[2])
sharding = default_sharding()
it = JaxBatchIterator(path, sharding=sharding, block_size=2, seed=3, next_token=True, prefetch=2)
replicated = NamedSharding(sharding.mesh, P())
k1, k2 = jax.random.split(jax.random.key(0))
params = {"emb": 0.1 * jax.random.normal(k1, (vocab, 32)),
          "out": 0.1 * jax.random.normal(k2, (32, vocab))}
params = jax.device_put(params, replicated)

def loss_fn(params, inputs, labels):
    # Row i of the file is i * T + arange(T): modulo T the next token is (token + 1) % T,
    # one bigram table shared by every row, so a T-token vocabulary learns it in a few steps.
    inputs, labels = inputs % vocab, labels % vocab
    logits = params["emb"][inputs] @ params["out"]  # [B, T - 1, vocab]
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1).mean()

@jax.jit
def step(params, inputs, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, labels)
    return jax.tree.map(lambda p, g: p - 1.0 * g, params, grads), loss

losses, epochs = [], []
for epoch in range(3):
    for inputs, labels in it:
        assert inputs.sharding == sharding and labels.sharding == sharding
        assert inputs.dtype == labels.dtype == jnp.int32
        params, loss = step(params, inputs, labels)
        losses.append(float(loss))
    epochs.append(it.state_dict()["epoch"])
print(json.dumps({"losses": losses, "epochs": epochs, "devices": len(jax.devices())}))
"""


def test_jitted_training_step_on_sharded_batches_learns(make_file: MakeFile) -> None:
    seq_len = 8
    path = make_file(n=16 * 6, seq_len=seq_len, batch_size=16)  # 6 batches of 16 rows
    out = run_child(TRAIN_CHILD, str(path), str(seq_len))
    losses = out["losses"]
    assert out["devices"] == 8 and out["epochs"] == [1, 2, 3]
    assert len(losses) == 18 and all(math.isfinite(v) for v in losses)
    assert losses[0] > 2.0  # about ln(8): the untrained model guesses
    assert all(b < a for a, b in itertools.pairwise(losses[:8])), losses
    assert losses[-1] < 0.5 * losses[0], losses


RESUME_CHILD = r"""
import hashlib, json, sys
import numpy as np
from zerobatch_adapters.jax import JaxBatchIterator

path, state_in, state_out, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
it = JaxBatchIterator(path, block_size=3, seed=99, next_token=True, prefetch=3)
if state_in != "-":
    with open(state_in) as f:
        it.load_state_dict(json.load(f))
digests = []
while len(digests) < count:
    for inputs, labels in it:
        h = hashlib.sha256(np.asarray(inputs).tobytes() + np.asarray(labels).tobytes())
        digests.append(h.hexdigest())
        if len(digests) == count:
            break  # the prefetcher has read ahead: the state must not count those batches
with open(state_out, "w") as f:
    json.dump(it.state_dict(), f)
it.close()
print(json.dumps(digests))
"""


def test_resume_in_a_new_process_equals_uninterrupted(make_file: MakeFile, tmp_path: Path) -> None:
    path = make_file(n=16 * 9, seq_len=6, batch_size=16)  # 9 batches per epoch
    total, k = 22, 7  # the second run crosses the epoch 0/1 and 1/2 boundaries

    def run(state_in: str, state_out: str, count: int) -> list[str]:
        out: list[str] = run_child(
            RESUME_CHILD, str(path), state_in, str(tmp_path / state_out), str(count)
        )
        return out

    whole = run("-", "s0.json", total)
    first = run("-", "s1.json", k)
    second = run(str(tmp_path / "s1.json"), "s2.json", total - k)
    assert first + second == whole
    assert len(set(whole[:9])) == 9  # the first epoch serves every batch once
    s1 = json.loads((tmp_path / "s1.json").read_text())
    s2 = json.loads((tmp_path / "s2.json").read_text())
    assert (s1["epoch"], s1["step"]) == (0, k)
    assert (s2["epoch"], s2["step"]) == (2, 4)
    assert s2 == json.loads((tmp_path / "s0.json").read_text())


# -- two processes of 4 devices each, a real multi-process JAX run on CPU ----------------------
MULTIHOST_CHILD = r"""
import json, sys
import jax, numpy as np
path, port, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=60)
from zerobatch_core import BatchNativeLoader
from zerobatch_core.delivery.distributed import rank_rows
from zerobatch_adapters.jax import JaxBatchIterator

assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4
it = JaxBatchIterator(path, block_size=2, seed=4)  # default sharding over all 8 devices
B = it.global_shape[0]
position = {d: k for k, d in enumerate(it.sharding.mesh.devices.flat)}
mine = BatchNativeLoader(path, dtype="int32", block_size=2, seed=4, rank=pid, world_size=2)
ranks = {k: BatchNativeLoader(path, dtype="int32", block_size=2, seed=4, rank=k, world_size=8)
         for k in range(8)}
n = 0
for g, local, *per_device in zip(it, mine, *ranks.values(), strict=True):
    assert g.shape == (B, mine.reader.seq_len) and not g.is_fully_addressable
    shards = sorted(g.addressable_shards, key=lambda s: position[s.device])
    assert len(shards) == 4
    assert np.array_equal(np.concatenate([np.asarray(s.data) for s in shards]), local)
    for s in shards:
        k = position[s.device]
        assert s.index[0] == rank_rows(B, k, 8)
        assert np.array_equal(np.asarray(s.data), per_device[k])
    n += 1
print(json.dumps({"process": jax.process_index(), "rows": [it.rows.start, it.rows.stop],
                  "batches": n, "state": it.state_dict()}))
it.close()
jax.distributed.shutdown()
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_two_processes_each_read_only_their_rows(make_file: MakeFile) -> None:
    path = make_file(n=16 * 5, seq_len=4, batch_size=16)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MULTIHOST_CHILD, str(path), port, str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(4),
            cwd=ROOT,
        )
        for pid in (0, 1)
    ]
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"child failed:\n{stdout[-2000:]}\n{stderr[-6000:]}"
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [o["process"] for o in outs] == [0, 1]
    assert [o["rows"] for o in outs] == [[0, 8], [8, 16]]
    assert [o["batches"] for o in outs] == [5, 5]
    assert outs[0]["state"] == outs[1]["state"]


# -- uint16 files ------------------------------------------------------------------------------
def host(item: Any) -> list[np.ndarray]:
    """Every field of an item (an array, a pair, or a document dict) as host arrays."""
    if isinstance(item, dict):
        return [np.asarray(item[k]) for k in sorted(item)]
    return [np.asarray(a) for a in (item if isinstance(item, tuple) else (item,))]


@pytest.mark.parametrize("next_token", [False, True])
@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 2)])
def test_uint16_file_serves_the_uint32_files_arrays(
    tmp_path: Path, next_token: bool, rank: int, world: int
) -> None:
    """The same int32 global arrays, sharded alike, in the same order, over two epochs."""
    paths = write_twins(tmp_path, n=8 * 9, batch_size=8)
    kw: dict[str, Any] = {"next_token": next_token, "rank": rank, "world_size": world}
    sharding = default_sharding(jax.devices()[: math.gcd(len(jax.devices()), 8 // world)])
    got: dict[str, list[Any]] = {}
    for name, path in paths.items():
        with JaxBatchIterator(path, sharding=sharding, block_size=2, seed=5, **kw) as it:
            items = [it_item for _ in range(2) for it_item in it]
        for item in items:
            for array in item if isinstance(item, tuple) else (item,):
                assert array.dtype == np.int32 and array.sharding == sharding
        got[name] = [host(item) for item in items]
    core = BatchNativeLoader(paths[WIDE], dtype="int32", block_size=2, seed=5, **kw)
    want = [host(item) for item in core_items(core, 18)]
    assert len(got[NARROW]) == len(want) == 18
    for narrow, wide, expected in zip(got[NARROW], got[WIDE], want, strict=True):
        for a, b, c in zip(narrow, wide, expected, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c.astype(np.int32))
    assert max(int(a.max()) for item in got[NARROW] for a in item) >= 2**15


def test_uint16_crosses_as_stored_and_widens_once_per_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the host hands to the devices is the stored uint16 block (half the bytes of
    int32); one compiled conversion per array shape widens it, for every batch and epoch."""
    import zerobatch_adapters.jax as adapter

    paths = write_twins(tmp_path, n=8 * 9, batch_size=8)
    crossed: dict[str, list[np.dtype[Any]]] = {WIDE: [], NARROW: []}
    real = adapter._make_array
    name = WIDE

    def make_array(sharding: Any, block: np.ndarray, shape: tuple[int, int]) -> Any:
        crossed[name].append(block.dtype)
        return real(sharding, block, shape)

    monkeypatch.setattr(adapter, "_make_array", make_array)
    for name in (WIDE, NARROW):
        with JaxBatchIterator(paths[name], sharding=local_sharding(), next_token=True) as it:
            for _ in range(2):
                for inputs, labels in it:
                    assert inputs.dtype == labels.dtype == np.int32
            if name == NARROW:
                assert it.loader.dtype == it.loader.label_dtype == NARROW  # views, no copies
                assert it._widen._cache_size() == 1  # inputs and labels: one shape
    assert set(crossed[NARROW]) == {np.dtype(np.uint16)} and len(crossed[NARROW]) == 2 * 2 * 9
    assert set(crossed[WIDE]) == {np.dtype(np.int32)}  # uint32 files: as before


def test_uint16_documents_equal_the_uint32_files(tmp_path: Path) -> None:
    tokens = narrow_tokens(8 * 9, 8)
    tokens[:, ::3] = NARROW_MAX  # the BOS id: the largest uint16 token
    paths = write_twins(tmp_path, n=8 * 9, batch_size=8, tokens=tokens)
    for next_token in (False, True):
        kw: dict[str, Any] = {"bos_id": NARROW_MAX, "next_token": next_token, "block_size": 2}
        got = {}
        for name, path in paths.items():
            with JaxBatchIterator(path, sharding=local_sharding(), **kw) as it:
                got[name] = [host(item) for item in it]
        core = BatchNativeLoader(paths[WIDE], dtype="int32", **kw)
        want = [[np.asarray(item[k]) for k in sorted(item)] for item in core]
        for narrow, wide, expected in zip(got[NARROW], got[WIDE], want, strict=True):
            for a, b, c in zip(narrow, wide, expected, strict=True):
                np.testing.assert_array_equal(a, b)
                np.testing.assert_array_equal(a, c)
                assert a.dtype == np.int32


UINT16_SHARDS_CHILD = r"""
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from zerobatch_core import BatchNativeLoader
from zerobatch_adapters.jax import JaxBatchIterator, data_context_sharding, default_sharding

wide, narrow = sys.argv[1], sys.argv[2]
devices = jax.devices()
assert len(devices) == 8, devices
kw = dict(block_size=3, seed=11)
mesh = Mesh(np.asarray(devices).reshape(4, 2), ("data", "model"))
# (sharding, options, next_token values): columns split in two need the 8-wide pairs.
layouts = {
    "default": (default_sharding(), {}, (False, True)),
    "data": (NamedSharding(mesh, P("data")), {}, (False, True)),
    "data,model": (NamedSharding(mesh, P("data", "model")), {}, (True,)),
    "context": (data_context_sharding(2), {}, (True,)),
    "context-zigzag": (data_context_sharding(2), {"zigzag": True}, (True,)),
}
checked = {}
for name, (sharding, extra, pairs) in layouts.items():
    for dtype in ("int32", "int64"):
        for next_token in pairs:
            opts = dict(kw, dtype=dtype, next_token=next_token, **extra)
            its = [JaxBatchIterator(p, sharding=sharding, **opts) for p in (wide, narrow)]
            core = BatchNativeLoader(wide, **{k: v for k, v in opts.items() if k != "zigzag"})
            n = 0
            for _ in range(2):
                for a, b, w in zip(*its, core, strict=True):
                    a, b = (a, b) if next_token else ((a,), (b,))
                    w = w if next_token else (w,)
                    for x, y, z in zip(a, b, w, strict=True):
                        assert x.dtype == y.dtype == np.dtype(dtype), (x.dtype, y.dtype)
                        assert x.shape == y.shape and x.sharding == y.sharding == sharding
                        assert np.array_equal(np.asarray(x), np.asarray(y))
                        for s, t in zip(x.addressable_shards, y.addressable_shards, strict=True):
                            assert s.device == t.device and s.index == t.index
                            assert np.array_equal(np.asarray(s.data), np.asarray(t.data))
                        if not extra:  # zig-zag reorders columns: equal to the twin is enough
                            assert np.array_equal(np.asarray(x), z.astype(dtype))
                    n += 1
            narrow_it = its[1]
            assert narrow_it.loader.dtype == "uint16" and narrow_it._widen._cache_size() == 1
            checked[f"{name},{dtype},next_token={next_token}"] = n
            for it in its:
                it.close()
print(json.dumps({"devices": len(devices), "checked": checked}))
"""


def test_uint16_eight_devices_serve_the_uint32_global_batches(tmp_path: Path) -> None:
    """On 8 devices, with row, row x column and (zig-zag) context shardings and int32 and
    int64: every global array and every device's shard of the uint16 file equals the uint32
    file's."""
    paths = write_twins(tmp_path, n=16 * 7, seq_len=9, batch_size=16)  # 8 next-token columns
    out = run_child(UINT16_SHARDS_CHILD, str(paths[WIDE]), str(paths[NARROW]))
    assert out["devices"] == 8
    layouts = {
        "default": (False, True),
        "data": (False, True),
        "data,model": (True,),
        "context": (True,),
        "context-zigzag": (True,),
    }
    assert out["checked"] == {
        f"{name},{dtype},next_token={n}": 14
        for name, pairs in layouts.items()
        for dtype in ("int32", "int64")
        for n in pairs
    }


UINT16_MULTIHOST_CHILD = r"""
import json, sys
import jax, numpy as np
wide, narrow, port, pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=60)
from jax.experimental import multihost_utils
from zerobatch_core import BatchNativeLoader
from zerobatch_adapters.jax import JaxBatchIterator, data_context_sharding

assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4
report = {"process": jax.process_index()}
for name, sharding in (("rows", None), ("context", data_context_sharding(2))):
    kw = dict(block_size=2, seed=4, next_token=True, sharding=sharding)
    its = [JaxBatchIterator(p, **kw) for p in (wide, narrow)]
    whole = BatchNativeLoader(wide, dtype="int32", block_size=2, seed=4, next_token=True)
    n = 0
    for a, b, w in zip(*its, whole, strict=True):
        for x, y, z in zip(a, b, w, strict=True):
            assert not y.is_fully_addressable and y.dtype == np.int32
            for s, t in zip(x.addressable_shards, y.addressable_shards, strict=True):
                assert s.device == t.device and s.index == t.index
                assert np.array_equal(np.asarray(s.data), np.asarray(t.data))
            gathered = multihost_utils.process_allgather(y, tiled=True)  # a collective
            assert np.array_equal(gathered, z)
        n += 1
    report[name] = {"batches": n, "bytes_read": [it.loader.bytes_read for it in its],
                    "states": [{k: v for k, v in it.state_dict().items() if k != "source"}
                               for it in its]}
    for it in its:
        it.close()
print(json.dumps(report))
jax.distributed.shutdown()
"""


def test_uint16_two_processes_serve_the_uint32_global_batches(tmp_path: Path) -> None:
    """Two JAX processes of 4 devices: each reads its rows of the uint16 file, half the bytes
    of the uint32 file's, and the global arrays gathered over both are the uint32 file's."""
    paths = write_twins(tmp_path, n=16 * 5, seq_len=9, batch_size=16)
    port = str(free_port())
    argv = [sys.executable, "-c", UINT16_MULTIHOST_CHILD, str(paths[WIDE]), str(paths[NARROW])]
    procs = [
        subprocess.Popen(
            [*argv, port, str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(4),
            cwd=ROOT,
        )
        for pid in (0, 1)
    ]
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=180)
            assert proc.returncode == 0, f"child failed:\n{stdout[-2000:]}\n{stderr[-6000:]}"
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [o["process"] for o in outs] == [0, 1]
    for out in outs:
        for name in ("rows", "context"):
            wide, narrow = out[name]["bytes_read"]
            wide_state, narrow_state = out[name]["states"]
            assert out[name]["batches"] == 5 and wide_state == narrow_state  # but the source
            assert narrow * 2 == wide > 0
