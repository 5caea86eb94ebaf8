"""The adapter contract: every adapter has one surface and serves exactly the core's batches.

Runs unchanged against every entry of ``contract_adapters.ADAPTERS`` (NumPy, PyTorch's
dataset and loader, JAX, tf.data): the constructor signature, order and epochs, ``len``,
``set_epoch``, rank rows, ``next_token``, the ``bos_id`` layout, resume in a new process,
states loaded across adapters, ``close`` and argument errors. Every expectation comes from
``BatchNativeLoader`` with the same arguments.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.adapters.contract_adapters import ADAPTERS, adapter_class, make
from tests.helpers import ArraySource, records, require
from zerobatch_core import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DTYPE,
    DEFAULT_PREFETCH,
    BatchFileReader,
    BatchNativeLoader,
    BatchStream,
    StateError,
    write_batch_file,
)

ROOT = Path(__file__).resolve().parents[2]
BATCH, SEQ_LEN, BATCHES = 8, 16, 11
ORDER: dict[str, Any] = {"block_size": 3, "seed": 99}  # blocks of 3 and a short one of 2
COMMON = {
    "block_size": DEFAULT_BLOCK_SIZE,
    "shuffle": True,
    "seed": None,
    "epoch": 0,
    "dtype": DEFAULT_DTYPE,
    "next_token": False,
    "rank": None,
    "world_size": None,
    "bos_id": None,
    "prefetch": DEFAULT_PREFETCH,
}
"""The shared constructor arguments, in order, with the one set of defaults."""
SURFACE = ("__iter__", "__len__", "set_epoch", "state_dict", "load_state_dict", "close")


@pytest.fixture(params=list(ADAPTERS))
def name(request: pytest.FixtureRequest) -> str:
    adapter: str = request.param
    module = ADAPTERS[adapter][0]
    if module != "numpy":
        require(module)
    return adapter


@pytest.fixture(params=["uint32", "uint16"])
def path(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """11 batches of unique rows (a row's first token names it), stored as uint32 tokens or as
    uint16 tokens (dtype 1): every adapter serves both the same way."""
    out = tmp_path / "contract.batch"
    tokens = records(BATCH * BATCHES, SEQ_LEN)
    write_batch_file(out, tokens, batch_size=BATCH, seed=5, dtype=request.param)
    return out


@pytest.fixture(autouse=True)
def _no_rank_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def copy(value: Any) -> Any:
    """A framework array as a NumPy copy (``.numpy()`` where the framework has it)."""
    return np.array(value.numpy() if hasattr(value, "numpy") else value)


def host(item: Any) -> Any:
    """An item (tensor, jax.Array, tf.Tensor, NumPy; pair or dict of them) as NumPy copies."""
    if isinstance(item, dict):
        return {key: copy(value) for key, value in item.items()}
    if isinstance(item, tuple):
        return tuple(copy(value) for value in item)
    return copy(item)


def core(path: Path, epochs: int = 1, **kw: Any) -> list[Any]:
    """``epochs`` passes of the core loader with the adapters' default dtype, as copies."""
    loader = BatchNativeLoader(path, **{"dtype": DEFAULT_DTYPE, **kw})
    return [host(item) for _ in range(epochs) for item in loader]


def assert_items(got: list[Any], want: list[Any], dtypes: bool = True) -> None:
    """Same structure and values; tokens/inputs also the same dtype (labels may differ: JAX
    serves them in the inputs' dtype, the other adapters as int64)."""
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        pairs = (
            [(k, g[k], w[k]) for k in w]
            if isinstance(w, dict)
            else list(zip(("inputs", "labels"), g, w, strict=True))
            if isinstance(w, tuple)
            else [("tokens", g, w)]
        )
        if isinstance(w, dict):
            assert sorted(g) == sorted(w), step
        for key, a, b in pairs:
            if dtypes and key in ("tokens", "inputs"):
                assert a.dtype == b.dtype, (step, key)
            np.testing.assert_array_equal(a, b, err_msg=f"step {step} {key}")


def firsts(items: list[Any]) -> list[int]:
    return [int((item[0] if isinstance(item, tuple) else item)[0, 0]) for item in items]


# -- one surface --------------------------------------------------------------------------------
def test_constructor_is_the_contract(name: str) -> None:
    """Same names, order and defaults; everything past the source keyword-only."""
    params = list(inspect.signature(adapter_class(name).__init__).parameters.values())
    assert params[1].name == "source" and params[1].kind is params[1].POSITIONAL_OR_KEYWORD
    shared = params[2 : 2 + len(COMMON)]
    assert [(p.name, p.default) for p in shared] == list(COMMON.items())
    assert all(p.kind is p.KEYWORD_ONLY for p in params[2:])
    for method in SURFACE:
        assert callable(getattr(adapter_class(name), method)), method


def test_order_epochs_and_len_are_the_cores(name: str, path: Path) -> None:
    with make(name, path, **ORDER) as data:
        assert len(data) == BATCHES
        got = [host(item) for item in data]  # epoch 0
        assert (data.epoch, data.step) == (1, 0)
        got += [host(item) for item in data]  # a new pass: the next epoch
    assert_items(got, core(path, 2, **ORDER))
    assert firsts(got[:BATCHES]) != firsts(got[BATCHES:])


@pytest.mark.parametrize("options", [{"shuffle": False}, {"block_size": 1, "epoch": 2**64 - 1}])
def test_unshuffled_and_the_last_epoch(name: str, path: Path, options: dict[str, Any]) -> None:
    with make(name, path, **options) as data:
        got = [host(item) for _ in range(2) for item in data]
    assert_items(got, core(path, 2, **options))


def test_set_epoch_keeps_or_moves_the_cursor(name: str, path: Path) -> None:
    e0, e3 = core(path, **ORDER), core(path, epoch=3, **ORDER)
    with make(name, path, **ORDER) as data:
        first = iter(data)
        got = [host(next(first)) for _ in range(3)]
        data.set_epoch(0)  # the current epoch: keeps the position
        assert (data.epoch, data.step) == (0, 3)
        got += [host(item) for item in data]  # ends the first pass, serves the rest
        assert next(first, None) is None
        assert_items(got, e0)
        data.set_epoch(3)
        assert (data.epoch, data.step) == (3, 0)
        assert_items([host(item) for item in data], e3)


def test_rank_rows_split_every_batch(name: str, path: Path) -> None:
    whole = core(path, **ORDER)
    parts = []
    for rank in range(2):
        with make(name, path, rank=rank, world_size=2, **ORDER) as data:
            assert (data.rank, data.world_size) != (None, None)
            parts.append([host(item) for item in data])
        assert_items(parts[-1], core(path, rank=rank, world_size=2, **ORDER))
    for step, batch in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([p[step] for p in parts]), batch)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_next_token_pairs(name: str, path: Path, dtype: str) -> None:
    if name == "jax" and dtype == "int64":
        dtype = "int32"  # 64-bit JAX is a process-wide switch: its refusal is tested below
    with make(name, path, next_token=True, dtype=dtype, **ORDER) as data:
        got = [host(item) for item in data]
    want = core(path, next_token=True, dtype=dtype, **ORDER)
    assert_items(got, want)
    for inputs, labels in got:
        assert inputs.shape == labels.shape == (BATCH, SEQ_LEN - 1)
        np.testing.assert_array_equal(labels[:, :-1], inputs[:, 1:])


@pytest.mark.parametrize("next_token", [False, True])
def test_bos_layout_is_the_cores(name: str, tmp_path: Path, next_token: bool) -> None:
    rows = np.random.default_rng(0).integers(0, 10, size=(BATCH * 5, SEQ_LEN))
    packed = tmp_path / "packed.batch"
    write_batch_file(packed, rows.astype(np.uint32), batch_size=BATCH, seed=3)
    kw: dict[str, Any] = {"bos_id": 7, "next_token": next_token, "block_size": 2}
    with make(name, packed, **kw) as data:
        got = [host(item) for item in data]
    assert_items(got, core(packed, **kw))


# -- resume ------------------------------------------------------------------------------------
RESUME_CHILD = r"""
import json, sys
from tests.adapters.contract_adapters import make
name, path, state, count = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
data = make(name, path, block_size=3, seed=99)
data.load_state_dict(state)
got = []
for epoch in range(data.epoch, 10):
    data.set_epoch(epoch)
    for item in data:
        got.append(int(item[0, 0]))
        if len(got) == count:
            break
    if len(got) == count:
        break
print(json.dumps({"firsts": got, "state": data.state_dict()}))
"""


@pytest.mark.parametrize("consumed", [4, BATCHES])  # mid-epoch, and right after its last batch
def test_resume_in_a_new_process_equals_an_uninterrupted_run(
    name: str, path: Path, consumed: int
) -> None:
    whole = firsts(core(path, 3, **ORDER))
    with make(name, path, **ORDER) as data:
        head = []
        for item in data:
            head.append(int(host(item)[0, 0]))
            if len(head) == consumed:
                break
        state = json.loads(json.dumps(data.state_dict()))
    assert (state["epoch"], state["step"]) == (0, consumed)
    child = subprocess.run(
        [sys.executable, "-c", RESUME_CHILD, name, str(path), json.dumps(state), "15"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert head + out["firsts"] == whole[: consumed + 15]


@pytest.mark.parametrize("target", list(ADAPTERS))
def test_a_state_loads_into_every_other_adapter(name: str, target: str, path: Path) -> None:
    if ADAPTERS[target][0] != "numpy":
        require(ADAPTERS[target][0])
    want = core(path, 2, **ORDER)
    with make(name, path, **ORDER) as source:
        it = iter(source)
        got = [host(next(it)) for _ in range(5)]
        state = json.loads(json.dumps(source.state_dict()))
    with make(target, path, **ORDER) as resumed:
        resumed.load_state_dict(state)
        assert (resumed.epoch, resumed.step) == (0, 5)
        got += [host(item) for _ in range(2) for item in resumed]
    assert_items(got, want[: len(got)])
    assert len(got) == 2 * BATCHES


def test_a_state_of_another_order_or_file_is_refused(name: str, path: Path) -> None:
    state = BatchNativeLoader(path, block_size=4, seed=99).state_dict()
    with make(name, path, **ORDER) as data, pytest.raises(StateError, match="block_size"):
        data.load_state_dict(state)
    for key, bad in (("epoch", -1), ("epoch", 2**64), ("step", BATCHES + 1), ("format", "x")):
        good = BatchNativeLoader(path, **ORDER).state_dict()
        with make(name, path, **ORDER) as data, pytest.raises(StateError):
            data.load_state_dict({**good, key: bad})


# -- lifetime and errors --------------------------------------------------------------------
def _mapped(path: Path) -> bool:
    """Whether this process has ``path`` open or mapped."""
    target = os.path.realpath(path)
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                return True
        except OSError:
            continue
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(target) for line in maps)


def test_close_releases_the_file(name: str, path: Path) -> None:
    data = make(name, path, **ORDER)
    it = iter(data)
    next(it), next(it)
    assert _mapped(path)
    data.close()
    del it
    gc.collect()
    assert not _mapped(path)
    assert (data.epoch, data.step) == (0, 2)  # the state outlives the file
    assert data.state_dict()["step"] == 2
    with pytest.raises(ValueError, match="closed"):
        next(iter(data))
    with make(name, path) as scoped:
        next(iter(scoped))
    assert scoped.loader.reader.closed


def test_bad_arguments_say_what_is_wrong(name: str, path: Path) -> None:
    with pytest.raises(TypeError):
        make(name, path, 3)  # the common arguments are keyword-only
    cases: list[tuple[dict[str, Any], str]] = [
        ({"block_size": 0}, "block_size must be at least 1"),
        ({"dtype": "float32"}, "dtype must be one of"),
        ({"seed": -1}, "seed"),
        ({"epoch": 2**64}, "epoch"),
        ({"rank": 1}, "both rank and world_size"),
        ({"rank": 2, "world_size": 2}, "outside world_size"),
        ({"rank": 0, "world_size": 3}, "does not split evenly"),
        ({"prefetch": -1}, "prefetch must be at least 0"),
        ({"bos_id": 2**32}, "bos_id"),
    ]
    for kw, message in cases:
        with pytest.raises(ValueError, match=message):
            make(name, path, **kw)
    with pytest.raises(TypeError, match="block_size must be an integer"):
        make(name, path, block_size=2.5)
    with pytest.raises(FileNotFoundError):
        make(name, path.with_name("missing.batch"))
    if name == "jax":
        with pytest.raises(ValueError, match="jax_enable_x64"):
            make(name, path, dtype="int64")


def test_every_adapter_is_a_batch_stream(name: str) -> None:
    assert issubclass(adapter_class(name), BatchStream)


@pytest.mark.parametrize("fetches", [False, True])
def test_a_source_built_outside_zerobatch_is_served_as_the_file(
    name: str, path: Path, fetches: bool
) -> None:
    """Adapters depend on the ``BatchSource`` protocol: an in-memory source holding the file's
    slots is served exactly as the file, with next-token pairs and a rank's rows. A source
    without ``token_dtype`` holds uint32 tokens; one of uint16 tokens says so."""
    with BatchFileReader(path) as reader:
        slots = np.array(reader.read_batches(0, reader.num_batches))
        seed = reader.seed
    options = {"next_token": True, "rank": 1, "world_size": 2, **ORDER}
    source = ArraySource(slots, seed, views=not fetches, fetches=fetches)
    if slots.dtype != np.uint32:
        source.token_dtype = slots.dtype  # type: ignore[attr-defined]
    with make(name, source, **options) as data:
        got = [host(item) for _ in range(2) for item in data]
    assert_items(got, core(path, 2, **options))
    assert not source.closed  # the caller's source: the adapter leaves it open
