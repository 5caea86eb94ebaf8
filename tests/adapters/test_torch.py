"""``zerobatch_adapters.torch``: tensors, DataLoader workers, ranks and exact resume.

Every expectation comes from ``BatchNativeLoader`` with the same arguments, so these tests
check the adapter's plumbing (tensors, workers, cursors) without restating the spec. Rows of
the ``make_file`` records are unique, so a row's first token names it.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from tests.adapters.twins import NARROW, NARROW_MAX, WIDE, narrow_tokens, write_twins
from tests.helpers import require
from zerobatch_core import BatchFileReader, BatchNativeLoader, StateError

torch = require("torch")

from torch.utils.data import DataLoader  # noqa: E402
from zerobatch_adapters.torch import (  # noqa: E402
    MeshCoordinates,
    NextTokenBatch,
    TorchBatchDataset,
    TorchBatchLoader,
    mesh_coordinates,
)

# Forking a process that runs JAX or TensorFlow threads can deadlock: when another test module
# has imported either, DataLoader workers start from a fork server instead (much slower, so
# `make test` runs this module in a pytest process of its own, where plain fork is safe).
CTX = "forkserver" if {"jax", "tensorflow"} & set(sys.modules) else "fork"

MakeFile = Callable[..., Path]
ROOT = Path(__file__).resolve().parents[2]
ORDER: dict[str, Any] = {"block_size": 3, "seed": 99}  # 13 batches: blocks of 3 and a short one
TOO_MANY_WORKERS = "ignore:This DataLoader will create:UserWarning"  # 3 workers on 2 cores
SET_VITAL = "ignore:'set_vital' is deprecated:UserWarning"  # torchdata 0.11 on newer torch
READONLY = "The given NumPy array is not writable"


def small(make_file: MakeFile, batch_size: int = 4, batches: int = 13, seq_len: int = 8) -> Path:
    return make_file(n=batch_size * batches, seq_len=seq_len, batch_size=batch_size)


def firsts(items: Any) -> list[int]:
    """First token of row 0 of each item (a tensor, a NextTokenBatch or a NumPy array)."""
    out = []
    for item in items:
        batch = item[0] if isinstance(item, tuple) else item
        out.append(int(batch[0, 0]))
    return out


def core_firsts(path: Path, epoch: int = 0) -> list[int]:
    return firsts(BatchNativeLoader(path, epoch=epoch, **ORDER))


def rows(batch: Any) -> list[int]:
    return [int(r[0]) for r in batch]


# -- tensors --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 2)])
def test_tensors_equal_the_core_order(
    make_file: MakeFile, dtype: str, next_token: bool, rank: int, world: int
) -> None:
    path = small(make_file)
    kw: dict[str, Any] = dict(ORDER, dtype=dtype, next_token=next_token)
    want = list(BatchNativeLoader(path, rank=rank, world_size=world, **kw))
    ds = TorchBatchDataset(path, rank=rank, world_size=world, **kw)
    got = list(ds)
    assert len(got) == len(want) == len(ds) == 13
    wide = torch.int32 if dtype == "int32" else torch.int64
    for g, w in zip(got, want, strict=True):
        if next_token:
            assert isinstance(g, NextTokenBatch)
            assert g.inputs.dtype == wide and g.labels.dtype == torch.int64
            assert g.inputs.shape == g.labels.shape == (4 // world, 7)
            np.testing.assert_array_equal(g.inputs.numpy(), w[0])
            np.testing.assert_array_equal(g.labels.numpy(), w[1])
            assert torch.equal(g.inputs[:, 1:].long(), g.labels[:, :-1])
        else:
            assert isinstance(g, torch.Tensor) and g.dtype == wide and g.shape == (4 // world, 8)
            np.testing.assert_array_equal(g.numpy(), w)
    assert ds.epoch == 1  # like the core: the next pass is the next epoch
    assert firsts(ds) == firsts(BatchNativeLoader(path, epoch=1, rank=rank, world_size=world, **kw))


def test_int32_is_a_zero_copy_view_of_the_file(make_file: MakeFile) -> None:
    path = small(make_file)
    ds = TorchBatchDataset(path, dtype="int32", rank=1, world_size=2, **ORDER)  # rows 2..3
    pairs = TorchBatchDataset(path, dtype="int32", next_token=True, **ORDER)
    copies = TorchBatchDataset(path, dtype="int64", **ORDER)
    order = ds.loader.epoch_order(0)
    for index, t, pair, copy in zip(order, ds, pairs, copies, strict=True):
        assert isinstance(t, torch.Tensor) and isinstance(copy, torch.Tensor)
        assert isinstance(pair, NextTokenBatch)
        i = int(index)  # each dataset maps the file on its own: compare with its own reader
        assert t.data_ptr() == ds.loader.reader.read_batch_int32(i)[2:].ctypes.data
        assert pair.inputs.data_ptr() == pairs.loader.reader.read_batch(i).ctypes.data
        assert pair.inputs.stride() == (8, 1) and pair.inputs.shape == (4, 7)
        assert not np.shares_memory(copy.numpy(), copies.loader.reader.read_batch(i))


def test_readonly_warning_filter_is_narrow(make_file: MakeFile) -> None:
    """Only the read-only message, only as a UserWarning, only from the adapter module."""
    ds = TorchBatchDataset(small(make_file), dtype="int32")
    msg = READONLY + ", and PyTorch does not support non-writable tensors."
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # drops every filter, the adapter's too
        warnings.simplefilter("always")
        next(iter(ds))  # reinstalls the adapter's filter
        assert sum(f[0] == "ignore" for f in warnings.filters) == 1
        next(iter(ds))  # once
        assert sum(f[0] == "ignore" for f in warnings.filters) == 1
        here = "zerobatch_adapters.torch"
        warnings.warn_explicit(msg, UserWarning, "torch.py", 1, module=here)
        warnings.warn_explicit(msg, UserWarning, "other.py", 1, module="other")
        warnings.warn_explicit("something else", UserWarning, "torch.py", 2, module=here)
        warnings.warn_explicit(msg, RuntimeWarning, "torch.py", 3, module=here)
        warnings.warn_explicit(msg, UserWarning, "x.py", 4, module=here + ".sub")
    assert [(str(w.message)[:9], w.category, w.lineno) for w in caught] == [
        (msg[:9], UserWarning, 1),
        ("something", UserWarning, 2),
        (msg[:9], RuntimeWarning, 3),
        (msg[:9], UserWarning, 4),
    ]


# -- DataLoader workers and ranks -----------------------------------------------------------
@pytest.mark.filterwarnings(TOO_MANY_WORKERS)
@pytest.mark.parametrize("workers", [2, 3])
def test_dataloader_workers_keep_the_single_process_order(
    make_file: MakeFile, workers: int
) -> None:
    path = small(make_file)
    ds = TorchBatchDataset(path, dtype="int32", next_token=True, **ORDER)
    dl = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=CTX)
    assert len(dl) == 13
    got = list(dl)
    assert all(isinstance(x, NextTokenBatch) for x in got)  # kept a (named) tuple
    assert firsts(got) == core_firsts(path)
    assert ds.epoch == 0  # the workers iterated copies
    ds.set_epoch(1)
    assert firsts(dl) == core_firsts(path, epoch=1) != core_firsts(path)


@pytest.mark.filterwarnings(TOO_MANY_WORKERS)
@pytest.mark.parametrize(("world", "workers"), [(2, 2), (4, 2), (4, 3)])
def test_every_row_once_over_workers_and_ranks(
    make_file: MakeFile, world: int, workers: int
) -> None:
    path = small(make_file, batch_size=8, batches=11, seq_len=4)
    seen: Counter[int] = Counter()
    per_step: dict[int, list[int]] = {}
    for rank in range(world):
        ds = TorchBatchDataset(path, rank=rank, world_size=world, **ORDER)
        dl = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=CTX)
        for step, batch in enumerate(dl):
            assert batch.shape == (8 // world, 4)
            seen.update(rows(batch))
            per_step.setdefault(step, []).extend(rows(batch))
    assert len(seen) == 11 * 8 and set(seen.values()) == {1}
    whole = BatchNativeLoader(path, **ORDER)
    assert {s: sorted(r) for s, r in per_step.items()} == {
        s: sorted(rows(b)) for s, b in enumerate(whole)
    }


def test_dataset_pickles_with_its_cursor(make_file: MakeFile) -> None:
    """What a spawn-started worker receives: the same file, order and cursor."""
    path = small(make_file)
    ds = TorchBatchDataset(path, dtype="int32", **ORDER)
    it = iter(ds)
    for _ in range(5):
        next(it)
    clone = pickle.loads(pickle.dumps(ds))
    assert firsts(clone) == core_firsts(path)[5:]
    assert clone.loader.reader.path == str(path)


# -- ranks ----------------------------------------------------------------------------------
def test_rank_from_arguments_distributed_then_environment(
    make_file: MakeFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = small(make_file, batch_size=8, batches=3)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (TorchBatchDataset(path).rank, TorchBatchDataset(path).world_size) == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    env = TorchBatchDataset(path, **ORDER)
    assert (env.rank, env.world_size) == (3, 4)
    want = [b[6:] for b in BatchNativeLoader(path, **ORDER)]
    for got, w in zip(env, want, strict=True):
        assert isinstance(got, torch.Tensor) and got.shape == (2, 8)
        np.testing.assert_array_equal(got.numpy(), w)
    explicit = TorchBatchDataset(path, rank=0, world_size=2)
    assert (explicit.rank, explicit.world_size) == (0, 2)
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    detected = TorchBatchDataset(path)  # an initialised group wins over the environment
    assert (detected.rank, detected.world_size) == (1, 2)
    assert TorchBatchDataset(path, rank=2, world_size=4).rank == 2  # arguments win over both


class FakeMesh:
    """What the adapter asks of a ``DeviceMesh``: dimension names, shape, this rank's coordinate.

    (A real mesh needs an initialised process group; ``test_torchrun.py`` uses real ones.)
    """

    def __init__(
        self, names: tuple[str, ...] | None, shape: tuple[int, ...], coordinate: tuple[int, ...]
    ) -> None:
        self.mesh_dim_names, self.shape, self.coordinate = names, shape, coordinate

    def get_coordinate(self) -> tuple[int, ...] | None:
        return self.coordinate or None


@pytest.mark.parametrize(
    ("names", "shape", "coordinate", "want"),
    [
        (("dp", "cp"), (4, 2), (3, 1), (3, 4, 1, 2)),
        (("data", "context"), (2, 4), (1, 2), (1, 2, 2, 4)),
        # HSDP: replicate x shard multiply row-major into one DP coordinate; tp is a replica
        (("dp_replicate", "dp_shard", "cp", "tp"), (2, 3, 2, 2), (1, 2, 0, 1), (5, 6, 0, 2)),
        (("pp", "dp", "tp"), (2, 4, 2), (1, 3, 0), (3, 4, 0, 1)),
        (("tp",), (8,), (5,), (0, 1, 0, 1)),  # pure tensor parallelism: every rank all data
    ],
)
def test_mesh_coordinates_from_named_dimensions(
    names: tuple[str, ...],
    shape: tuple[int, ...],
    coordinate: tuple[int, ...],
    want: tuple[int, ...],
) -> None:
    mesh: Any = FakeMesh(names, shape, coordinate)
    assert mesh_coordinates(mesh) == MeshCoordinates(*want)


def test_device_mesh_gives_dp_and_cp_and_arguments_win(
    make_file: MakeFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_file(n=8 * 3, seq_len=17, batch_size=8)  # next-token width 16: 2C = 4 chunks
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    mesh: Any = FakeMesh(("dp", "cp", "tp"), (2, 2, 2), (1, 0, 1))
    kw: dict[str, Any] = {"next_token": True, "zigzag": True, **ORDER}
    for cls in (TorchBatchDataset, TorchBatchLoader):  # one implementation, both classes
        data = cls(path, device_mesh=mesh, **kw)
        s = data.loader.slicing
        assert (s.dp_rank, s.dp_size, s.cp_rank, s.cp_size, s.zigzag) == (1, 2, 0, 2, True)
        core = BatchNativeLoader(
            path, rank=1, world_size=2, context_rank=0, context_size=2, dtype="int32", **kw
        )
        for got, want in zip(data, core, strict=True):
            assert isinstance(got, NextTokenBatch) and got.inputs.shape == (4, 8)
            np.testing.assert_array_equal(got.inputs.numpy(), want[0])
            np.testing.assert_array_equal(got.labels.numpy(), want[1])
        data.close()
    explicit = TorchBatchDataset(
        path, device_mesh=mesh, rank=0, world_size=4, context_rank=1, context_size=2, **kw
    )  # arguments win over the mesh, pair by pair
    s = explicit.loader.slicing
    assert (s.dp_rank, s.dp_size, s.cp_rank, s.cp_size) == (0, 4, 1, 2)
    dp_only = TorchBatchDataset(path, device_mesh=mesh, context_rank=1, context_size=2, **kw)
    assert (dp_only.rank, dp_only.world_size, dp_only.loader.slicing.cp_rank) == (1, 2, 1)
    cp_mesh: Any = FakeMesh(("cp",), (2,), (1,))  # no DP dimension: the environment is ignored
    assert TorchBatchDataset(path, device_mesh=cp_mesh, **kw).world_size == 1
    clone = pickle.loads(pickle.dumps(TorchBatchDataset(path, device_mesh=mesh, **kw)))
    assert clone.loader.slicing == data.loader.slicing  # workers get plain coordinates


def test_device_mesh_errors_name_the_problem(make_file: MakeFile) -> None:
    path = make_file(n=8 * 3, seq_len=17, batch_size=8)
    unnamed: Any = FakeMesh(None, (2,), (0,))
    with pytest.raises(ValueError, match=r"no dimension names.*mesh_dim_names"):
        TorchBatchDataset(path, device_mesh=unnamed)
    outside: Any = FakeMesh(("dp",), (2,), ())
    with pytest.raises(ValueError, match="not part of device_mesh"):
        TorchBatchLoader(path, device_mesh=outside)
    with pytest.raises(TypeError, match="DeviceMesh"):
        TorchBatchDataset(path, device_mesh=cast(Any, (2, 2)))
    three: Any = FakeMesh(("dp",), (3,), (0,))
    with pytest.raises(ValueError, match="does not split evenly over world_size 3"):
        TorchBatchDataset(path, device_mesh=three)
    cp3: Any = FakeMesh(("cp",), (3,), (0,))
    with pytest.raises(ValueError, match="width 16 does not split into context_size = 3"):
        TorchBatchDataset(path, device_mesh=cp3, next_token=True)


def test_bad_arguments_say_what_is_wrong(make_file: MakeFile) -> None:
    path = small(make_file)
    for dtype in ("uint32", "float32"):
        with pytest.raises(ValueError, match=r"'int32'.*'int64'"):
            TorchBatchDataset(path, dtype=dtype)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both rank and world_size"):
        TorchBatchDataset(path, rank=1)
    with pytest.raises(ValueError, match="outside world_size"):
        TorchBatchDataset(path, rank=2, world_size=2)
    with pytest.raises(ValueError, match="does not split evenly"):
        TorchBatchDataset(path, rank=0, world_size=3)
    with pytest.raises(ValueError, match="block_size"):
        TorchBatchLoader(path, block_size=0)
    with pytest.raises(ValueError, match="num_workers must be at least 0"):
        TorchBatchLoader(path, num_workers=-1)
    with pytest.raises(TypeError, match="num_workers must be an integer"):
        TorchBatchLoader(path, num_workers=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefetch must be at least 0"):
        TorchBatchLoader(path, prefetch=-1)
    with pytest.raises(RuntimeError):
        TorchBatchLoader(path, device="no-such-device")
    worker_state = BatchNativeLoader(path, **ORDER)
    worker_state.split_workers(1, 2)
    with pytest.raises(StateError, match="worker 1 of 2"):
        TorchBatchLoader(path, **ORDER).load_state_dict(worker_state.state_dict())
    with pytest.raises(StateError, match="block_size"):
        TorchBatchLoader(path, block_size=4).load_state_dict(TorchBatchLoader(path).state_dict())


def wait_until_read_ahead(loader: TorchBatchLoader, depth: int, timeout: float = 30.0) -> None:
    """Block until the loader's device stage holds ``depth`` batches read ahead of the loop, so
    a check of the delivered cursor never depends on how far the thread happened to get."""
    stage = loader._pass._ahead if loader._pass is not None else None
    assert stage is not None, "the device stage should be running"
    deadline = time.monotonic() + timeout
    while stage._queue.qsize() < depth:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the read-ahead never filled"
        time.sleep(0.005)


# -- TorchBatchLoader -----------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_epochs_state_and_device_prefetch(make_file: MakeFile, workers: int) -> None:
    path = small(make_file)
    e0, e1, e2 = (core_firsts(path, epoch=e) for e in range(3))
    loader = TorchBatchLoader(
        path,
        next_token=True,
        num_workers=workers,
        device="cpu",
        prefetch=2,
        multiprocessing_context=CTX,
        **ORDER,
    )
    assert len(loader) == 13
    it = iter(loader)
    got = [next(it) for _ in range(4)]
    assert all(isinstance(x, NextTokenBatch) and x.inputs.device.type == "cpu" for x in got)
    wait_until_read_ahead(loader, 2)  # the read-ahead has happened: the state must not count it
    state = json.loads(json.dumps(loader.state_dict()))
    assert (state["epoch"], state["step"], state["num_workers"]) == (0, 4, 1)
    rest = list(it)
    assert firsts(got + rest) == e0 and (loader.epoch, loader.step) == (1, 0)
    assert firsts(loader) == e1  # next iter: next epoch
    resumed = TorchBatchLoader(
        path,
        next_token=True,
        num_workers=workers,
        device="cpu",
        multiprocessing_context=CTX,
        **ORDER,
    )
    resumed.load_state_dict(state)
    assert firsts(resumed) == e0[4:]
    assert firsts(resumed) == e1
    resumed.set_epoch(2)
    assert firsts(resumed) == e2


def test_loader_pass_ends_when_the_cursor_moves(make_file: MakeFile) -> None:
    path = small(make_file)
    e0, e1 = core_firsts(path), core_firsts(path, epoch=1)
    loader = TorchBatchLoader(path, num_workers=2, multiprocessing_context=CTX, **ORDER)
    first = iter(loader)
    assert firsts([next(first), next(first)]) == e0[:2]
    second = iter(loader)  # a new pass continues from the delivered cursor
    assert next(first, None) is None  # and ends the old one
    assert firsts([next(second)]) == e0[2:3]
    loader.set_epoch(1)
    assert next(second, None) is None
    assert (loader.epoch, loader.step) == (1, 0)
    for _ in zip(range(3), loader, strict=False):
        pass  # break out after 3 batches
    assert (loader.epoch, loader.step) == (1, 3)
    assert firsts(loader) == e1[3:]


# -- resume in a new process ----------------------------------------------------------------
LOADER_CHILD = r"""
import json, sys
from zerobatch_adapters.torch import TorchBatchLoader
path, state_path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
loader = TorchBatchLoader(
    path, block_size=3, seed=99, dtype="int32", next_token=True, num_workers=2
)
with open(state_path) as f:
    loader.load_state_dict(json.load(f))
firsts = []
while len(firsts) < count:
    for inputs, labels in loader:
        firsts.append(int(inputs[0, 0]))
        if len(firsts) == count:
            break
print(json.dumps({"firsts": firsts, "state": loader.state_dict()}))
"""

STATEFUL_CHILD = r"""
import json, sys
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from zerobatch_adapters.torch import TorchBatchDataset
path, out = sys.argv[1], []
for state_path in sys.argv[2:]:
    ds = TorchBatchDataset(path, block_size=3, seed=99, dtype="int32")
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    saved = torch.load(state_path)
    dl.load_state_dict(saved["loader"])
    firsts = []
    for epoch in range(saved["epoch"], 2):
        ds.set_epoch(epoch)
        firsts += [int(b[0, 0]) for b in dl]
    out.append(firsts)
print(json.dumps(out))
"""


def run_child(script: str, *args: object) -> Any:
    """Run ``script`` in a fresh interpreter where ``torch.from_numpy``'s read-only warning
    is an error: the int32 batches would raise it in the workers without the adapter's filter.
    """
    out = subprocess.run(
        [sys.executable, "-W", f"error:{READONLY}:UserWarning", "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_loader_resumes_in_a_new_process_across_an_epoch(
    make_file: MakeFile, tmp_path: Path
) -> None:
    path = small(make_file)
    whole = core_firsts(path) + core_firsts(path, epoch=1)
    loader = TorchBatchLoader(
        path, dtype="int32", next_token=True, num_workers=2, multiprocessing_context=CTX, **ORDER
    )
    head: list[int] = []
    for inputs, _ in loader:
        head.append(int(inputs[0, 0]))
        if len(head) == 9:
            break
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(loader.state_dict()))
    child = run_child(LOADER_CHILD, path, state_path, 13)  # 4 of epoch 0, 9 of epoch 1
    assert head + child["firsts"] == whole[:22]
    assert (child["state"]["epoch"], child["state"]["step"]) == (1, 9)


@pytest.mark.filterwarnings(SET_VITAL)
def test_stateful_dataloader_resumes_in_a_new_process(make_file: MakeFile, tmp_path: Path) -> None:
    """StatefulDataLoader keeps one dataset state per worker; resume mid-epoch and at its end.

    13 batches over 2 workers: after 12 batches worker 1 has served its last step (its core
    cursor is already in epoch 1) while worker 0 still owes step 12; after 13, both are done
    but the pass has not ended. Either way the resumed pass must finish epoch 0, not start 1.
    """
    stateful = require("torchdata.stateful_dataloader")
    path = small(make_file)
    e0, e1 = core_firsts(path), core_firsts(path, epoch=1)
    ds = TorchBatchDataset(path, dtype="int32", **ORDER)
    dl = stateful.StatefulDataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=CTX
    )
    stops = (5, 12, 13)
    got: list[int] = []
    for batch in dl:
        got.append(int(batch[0, 0]))
        if len(got) in stops:
            torch.save({"loader": dl.state_dict(), "epoch": 0}, tmp_path / f"s{len(got)}.pt")
    assert got == e0
    states = [tmp_path / f"s{k}.pt" for k in stops]
    assert run_child(STATEFUL_CHILD, path, *states) == [e0[k:] + e1 for k in stops]


@pytest.mark.filterwarnings(SET_VITAL)
def test_stateful_dataloader_in_process_without_workers(make_file: MakeFile) -> None:
    stateful = require("torchdata.stateful_dataloader")
    path = small(make_file)
    e0, e1 = core_firsts(path), core_firsts(path, epoch=1)
    saved: list[tuple[Any, int, list[int]]] = []  # state, epoch to resume at, what follows
    ds = TorchBatchDataset(path, **ORDER)
    dl = stateful.StatefulDataLoader(ds, batch_size=None, num_workers=0)
    for k, _ in enumerate(dl, 1):
        if k in (5, 13):  # 13: the last batch, before the pass ended
            saved.append((dl.state_dict(), 0, e0[k:] + e1))
    saved.append((dl.state_dict(), 1, e1))  # after the pass ended: resume at epoch 1
    for state, start, want in saved:
        ds = TorchBatchDataset(path, **ORDER)
        dl = stateful.StatefulDataLoader(ds, batch_size=None, num_workers=0)
        dl.load_state_dict(state)
        resumed = []
        for epoch in range(start, 2):
            ds.set_epoch(epoch)
            resumed += firsts(dl)
        assert resumed == want


# -- batches from DataLoader workers --------------------------------------------------------
def torch_items(items: Any) -> list[Any]:
    """Items as NumPy copies: tensors, NextTokenBatch pairs, or dicts of tensors."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            out.append({k: v.numpy().copy() for k, v in item.items()})
        elif isinstance(item, tuple):
            out.append(tuple(v.numpy().copy() for v in item))
        else:
            out.append(item.numpy().copy())
    return out


def core_items(path: Path, **kw: Any) -> list[Any]:
    items = BatchNativeLoader(path, **ORDER, **kw)
    return [
        {k: np.array(v) for k, v in i.items()}
        if isinstance(i, dict)
        else tuple(np.array(v) for v in i)
        if isinstance(i, tuple)
        else np.array(i)
        for i in items
    ]


def assert_same_items(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, dict):
            assert sorted(g) == sorted(w)
            pairs = [(g[k], w[k]) for k in w]
        elif isinstance(w, tuple):
            pairs = list(zip(g, w, strict=True))
        else:
            pairs = [(g, w)]
        for a, b in pairs:
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
def test_worker_batches_arrive_as_views_of_this_processs_mapping(
    make_file: MakeFile, dtype: str, next_token: bool
) -> None:
    """Unchanged batches cross as file coordinates: the parent's tensors are made from its own
    mapping of the file (int32: views of it), never from a shared-memory segment per batch."""
    from zerobatch_adapters import torch_transfer as adapter

    path = small(make_file)
    kw: dict[str, Any] = {"dtype": dtype, "next_token": next_token, "rank": 1, "world_size": 2}
    ds = TorchBatchDataset(path, **ORDER, **kw)
    dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=CTX)
    got = list(dl)
    assert_same_items(torch_items(got), core_items(path, **kw))
    tensors = [t for item in got for t in (item if isinstance(item, tuple) else (item,))]
    assert all(type(t) is torch.Tensor and not t.is_shared() for t in tensors)
    if dtype == "int32":
        (reader,) = [r for (p, _), r in adapter._READERS.items() if p == str(path)]
        order = BatchNativeLoader(path, **ORDER).epoch_order()
        for item, index in zip(got, order, strict=True):
            inputs = item[0] if next_token else item
            assert inputs.data_ptr() == reader.read_batch(int(index))[2:].ctypes.data


class Doubled(TorchBatchDataset):
    """A worker-side transform that makes new tensors."""

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            yield batch * 2


class MaskedInPlace(TorchBatchDataset):
    """A worker-side transform that changes int64 batches in place: through torch when the
    first row's number is odd, through NumPy (which torch's version counter does not see) else."""

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            if int(batch[0, 0]) // batch.shape[1] % 2:
                batch[:, 0] = -1
            else:
                batch.numpy()[:, 1] = -2
            yield batch


class Wrapped(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """A wrapper dataset whose transform keeps only the first half of each row."""

    def __init__(self, inner: TorchBatchDataset) -> None:
        self.inner = inner

    def __iter__(self) -> Any:
        return (batch[:, : batch.shape[1] // 2] for batch in self.inner)


@pytest.mark.filterwarnings(TOO_MANY_WORKERS)
@pytest.mark.parametrize("workers", [2, 4])
def test_worker_side_transforms_apply(make_file: MakeFile, workers: int) -> None:
    path = small(make_file)
    core32 = core_items(path, dtype="int32")
    core64 = core_items(path, dtype="int64")

    def run(ds: Any, **kw: Any) -> list[Any]:
        dl = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=CTX, **kw)
        return torch_items(dl)

    assert_same_items(run(Doubled(path, dtype="int32", **ORDER)), [b * 2 for b in core32])
    masked = []
    for b in core64:
        b = b.copy()
        if b[0, 0] // 8 % 2:
            b[:, 0] = -1
        else:
            b[:, 1] = -2
        masked.append(b)
    assert {int(b[0, 0]) // 8 % 2 for b in core64} == {0, 1}  # both kinds of change happen
    assert_same_items(run(MaskedInPlace(path, dtype="int64", **ORDER)), masked)
    wrapped = Wrapped(TorchBatchDataset(path, dtype="int64", **ORDER))
    assert_same_items(run(wrapped), [b[:, :4] for b in core64])
    plus_one = run(TorchBatchDataset(path, dtype="int32", **ORDER), collate_fn=lambda b: b + 1)
    assert_same_items(plus_one, [b + 1 for b in core32])


@pytest.mark.filterwarnings(TOO_MANY_WORKERS)
def test_worker_batches_that_are_not_one_region_arrive_intact(make_file: MakeFile) -> None:
    path = small(make_file, batches=12, seq_len=9)  # next-token width 8: 4 zig-zag chunks
    zigzag = {"next_token": True, "context_size": 2, "zigzag": True, "context_rank": 1}
    for kw in ({"global_batch_size": 8}, zigzag):
        ds = TorchBatchDataset(path, dtype="int64", **ORDER, **kw)
        dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=CTX)
        assert_same_items(torch_items(dl), core_items(path, dtype="int64", **kw))


def test_a_worker_reading_another_file_at_the_same_path_is_an_error(
    make_file: MakeFile, tmp_path: Path
) -> None:
    from zerobatch_adapters import torch_transfer as adapter

    from zerobatch_core import ZeroBatchIOError

    path = str(small(make_file))
    with pytest.raises(ZeroBatchIOError, match="another file"):
        adapter._rebuild_region(path, (0, 0, 0, 0), 0, 0, 4, 0, 8, "torch.int32")


def test_loader_workers_start_no_process(make_file: MakeFile) -> None:
    import multiprocessing

    path = small(make_file)
    loader = TorchBatchLoader(path, num_workers=4, multiprocessing_context=CTX, **ORDER)
    it = iter(loader)
    first = next(it)
    assert multiprocessing.active_children() == []
    assert firsts([first, *it]) == core_firsts(path)
    assert loader.num_workers == 4


# -- the device path ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
def test_device_path_moves_int32_and_widens_on_the_device(
    tmp_path: Path, dtype: str, next_token: bool
) -> None:
    """int32 crosses through a reused staging ring; ``dtype`` (and int64 labels) arrive, equal
    to the core's, uint32 ids of 2**31 and above included. Without an accelerator the ring's
    buffers are not pinned, but their reuse is the same."""
    from zerobatch_core import write_batch_file

    path = tmp_path / "wide.batch"
    tokens = np.arange(4 * 20 * 8, dtype=np.uint64).reshape(80, 8) * 53_687_091 + 7
    write_batch_file(path, (tokens % 2**32).astype(np.uint32), 4, seed=3)
    want = core_items(path, dtype=dtype, next_token=next_token)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no accelerator here: "batches are not pinned"
        loader = TorchBatchLoader(
            path, dtype=dtype, next_token=next_token, device="cpu", pin_memory=True, **ORDER
        )
    ring = loader.ring
    assert ring is not None and loader.loader.dtype == "int32"  # no conversion on the host
    got = list(loader)
    if dtype == "int32":  # ids of 2**31 and above are negative as int32, as on the host
        want = [tuple(w) if next_token else w for w in want]
    assert_same_items(torch_items(got), want)
    fields = 2 if next_token else 1
    assert ring.allocations == fields * ring.slots < len(got)  # not one per batch
    width = 7 if next_token else 8
    assert ring.bytes_sent == len(got) * fields * 4 * width * 4  # int32: 4 bytes a token
    assert all(b.dtype == torch.uint8 for bufs in ring.buffers.values() for b in bufs)
    before = {k: [b.data_ptr() for b in v] for k, v in ring.buffers.items()}
    assert len(list(loader)) == len(got)  # a second epoch: the same buffers, no new ones
    assert {k: [b.data_ptr() for b in v] for k, v in ring.buffers.items()} == before
    assert ring.allocations == fields * ring.slots


def test_staging_ring_reuses_its_buffers_and_grows_only_for_larger_tensors() -> None:
    from zerobatch_adapters.torch import StagingRing

    ring = StagingRing(torch.device("cpu"), 3, pin=False)
    sent = [torch.arange(k, k + 12, dtype=torch.int32).reshape(3, 4)[:, :3] for k in range(10)]
    moved = [ring.send("tokens", t) for t in sent]
    for m, t in zip(moved, sent, strict=True):  # copies: reusing a buffer changes none of them
        assert torch.equal(m, t) and m.is_contiguous()
    assert ring.allocations == 3 and len({b.data_ptr() for b in ring.buffers["tokens"]}) == 3
    ring.send("tokens", torch.zeros(5, 5, dtype=torch.int64))  # larger: that slot grows
    assert ring.allocations == 4
    ring.send("labels", torch.zeros(2, dtype=torch.int64))  # each field has its own slots
    assert ring.allocations == 5 and ring.bytes_sent == 10 * 9 * 4 + 25 * 8 + 16


# -- uint16 files ---------------------------------------------------------------------------
def twin_items(paths: dict[str, Path], make: Callable[[Path], Any]) -> tuple[Any, Any]:
    """``make``'s items for the uint32 and the uint16 file, as NumPy copies."""
    return torch_items(make(paths[WIDE])), torch_items(make(paths[NARROW]))


def fields(item: Any) -> tuple[Any, ...]:
    return tuple(item) if isinstance(item, tuple) else (item,)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 2)])
@pytest.mark.parametrize("kind", ["dataset", "loader", "device"])
def test_uint16_file_serves_the_uint32_files_tensors(
    tmp_path: Path, dtype: str, next_token: bool, rank: int, world: int, kind: str
) -> None:
    """Values, dtypes (int64 labels), shapes and order equal the uint32 file's, on the host
    (the core widens) and through the device path (the device widens)."""
    paths = write_twins(tmp_path)
    kw: dict[str, Any] = {"dtype": dtype, "next_token": next_token, "rank": rank}
    kw |= {"world_size": world}
    makers: dict[str, Callable[[Path], Any]] = {
        "dataset": lambda p: TorchBatchDataset(p, **kw, **ORDER),
        "loader": lambda p: TorchBatchLoader(p, **kw, **ORDER),
        "device": lambda p: TorchBatchLoader(p, device="cpu", **kw, **ORDER),
    }
    wide, narrow = twin_items(paths, makers[kind])
    assert len(narrow) == 13
    assert_same_items(narrow, wide)
    # and both are the core's uint32 batches, which hold ids of 32,768 and above
    assert_same_items(narrow, core_items(paths[WIDE], **kw))
    flat = np.concatenate([np.ravel(f) for item in narrow for f in fields(item)])
    assert flat.max() >= 2**15 and flat.min() >= 0


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
def test_device_path_moves_uint16_and_widens_on_the_device(
    tmp_path: Path, dtype: str, next_token: bool
) -> None:
    """A uint16 file's tokens cross as stored (half the uint32 file's bytes through the ring)
    and arrive as ``dtype`` (labels int64), equal to the uint32 file's; the host widens nothing."""
    paths = write_twins(tmp_path)
    sent = {}
    for name, path in paths.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no accelerator here: "batches are not pinned"
            loader = TorchBatchLoader(
                path, dtype=dtype, next_token=next_token, device="cpu", pin_memory=True, **ORDER
            )
        got = list(loader)
        assert_same_items(
            torch_items(got), core_items(paths[WIDE], dtype=dtype, next_token=next_token)
        )
        ring = loader.ring
        assert ring is not None
        sent[name] = ring.bytes_sent
        staged = {b.dtype for bufs in ring.buffers.values() for b in bufs}
        assert staged == {torch.uint8}
    narrow = TorchBatchLoader(paths[NARROW], dtype=dtype, next_token=next_token, device="cpu")
    assert narrow.token_dtype == np.dtype(np.uint16)
    assert (narrow.loader.dtype, narrow.loader.label_dtype) == (NARROW, NARROW)  # views
    fields_sent = 2 if next_token else 1
    width = 7 if next_token else 8
    assert sent[NARROW] == 13 * fields_sent * 4 * width * np.dtype(np.uint16).itemsize
    assert sent[NARROW] * 2 == sent[WIDE]


def test_device_path_sends_uint16_tensors_and_widens_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What crosses is a torch.uint16 tensor: ``to(device)`` sees uint16, then widens."""
    paths = write_twins(tmp_path)
    loader = TorchBatchLoader(paths[NARROW], dtype="int64", next_token=True, device="cpu")
    crossed: list[torch.dtype] = []
    real_to = torch.Tensor.to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args and isinstance(args[0], torch.device):
            crossed.append(self.dtype)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    first = next(iter(loader))
    loader.close()
    assert crossed[:2] == [torch.uint16, torch.uint16]
    assert first.inputs.dtype == first.labels.dtype == torch.int64


@pytest.mark.parametrize("device", [None, "cpu"])
def test_uint16_documents_equal_the_uint32_files(tmp_path: Path, device: str | None) -> None:
    tokens = narrow_tokens(4 * 13, 8)
    tokens[:, ::3] = NARROW_MAX  # the BOS id: the largest uint16 token
    paths = write_twins(tmp_path, tokens=tokens)
    for next_token in (False, True):
        kw: dict[str, Any] = {"bos_id": NARROW_MAX, "next_token": next_token}
        wide, narrow = twin_items(
            paths, lambda p, kw=kw: TorchBatchLoader(p, device=device, **kw, **ORDER)
        )
        assert_same_items(narrow, wide)
        assert_same_items(narrow, core_items(paths[WIDE], dtype="int32", **kw))
        assert min(len(item["cu_seqlens"]) for item in narrow) > 4 + 1  # BOS ids were found


class CountedRebuilds:
    """Counts how worker batches arrive in this process: as file coordinates, or as bytes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from zerobatch_adapters import torch_transfer as adapter

        self.regions: list[str] = []
        self.bytes = 0
        region, raw = adapter._rebuild_region, adapter._rebuild_bytes

        def rebuild_region(*args: Any) -> Any:
            self.regions.append(args[-1])
            return region(*args)

        def rebuild_bytes(*args: Any) -> Any:
            self.bytes += 1
            return raw(*args)

        for fake, real in ((rebuild_region, region), (rebuild_bytes, raw)):
            fake.__qualname__ = fake.__name__ = real.__name__
            fake.__module__ = real.__module__
            monkeypatch.setattr(adapter, real.__name__, fake)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("next_token", [False, True])
def test_uint16_worker_batches_arrive_as_coordinates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, next_token: bool
) -> None:
    """int32 of uint16 tokens is a widened copy, not a view, yet it still crosses as file
    coordinates (its values are checked against the region) and is widened again here."""
    paths = write_twins(tmp_path)
    counted = CountedRebuilds(monkeypatch)
    kw: dict[str, Any] = {"dtype": dtype, "next_token": next_token, "rank": 1, "world_size": 2}
    ds = TorchBatchDataset(paths[NARROW], **ORDER, **kw)
    dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=CTX)
    got = torch_items(dl)
    assert_same_items(got, core_items(paths[WIDE], **kw))
    fields_sent = 2 if next_token else 1
    labels = ["torch.int64"] if next_token else []
    assert counted.bytes == 0
    assert sorted(counted.regions) == sorted([f"torch.{dtype}", *labels] * 13)
    assert len(counted.regions) == 13 * fields_sent


class FirstColumnInPlace(TorchBatchDataset):
    """A worker-side transform that overwrites each batch's first column in place."""

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            batch[:, 0] = -1
            yield batch


@pytest.mark.filterwarnings(TOO_MANY_WORKERS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_uint16_worker_side_transforms_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    """A uint16 file's int32 batches are copies a transform may change in place: the change
    is seen (values compared with the region) and the batch travels as its bytes."""
    paths = write_twins(tmp_path)
    counted = CountedRebuilds(monkeypatch)
    want = core_items(paths[WIDE], dtype=dtype)

    def run(ds: Any) -> list[Any]:
        dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=CTX)
        return torch_items(dl)

    assert_same_items(run(Doubled(paths[NARROW], dtype=dtype, **ORDER)), [b * 2 for b in want])
    assert counted.regions == []  # new tensors: not file coordinates
    masked = [b.copy() for b in want]
    for b in masked:
        b[:, 0] = -1
    assert_same_items(run(FirstColumnInPlace(paths[NARROW], dtype=dtype, **ORDER)), masked)
    assert counted.bytes == 13 and counted.regions == []


def test_uint16_regions_rebuild_in_the_dtype_asked_for(tmp_path: Path) -> None:
    from zerobatch_adapters import torch_transfer as adapter

    paths = write_twins(tmp_path)
    path = str(paths[NARROW])
    identity = adapter.file_identity(path)
    with BatchFileReader(paths[NARROW]) as reader:
        region = np.array(reader.read_batch(2)[1:3, 2:7])
    for dtype in ("torch.int32", "torch.int64", "torch.uint16"):
        got = adapter._rebuild_region(path, identity, 2, 1, 3, 2, 7, dtype)
        assert str(got.dtype) == dtype and got.shape == (2, 5)
        np.testing.assert_array_equal(got.numpy().astype(np.int64), region.astype(np.int64))
    rebuilt = adapter._rebuild_bytes(region.tobytes(), "torch.uint16", region.shape)
    assert rebuilt.dtype == torch.uint16
    np.testing.assert_array_equal(rebuilt.numpy(), region)
