"""uint16 token files end to end: a nanoGPT corpus converted with defaults, served by every adapter.

nanoGPT ``.bin`` shards of GPT-2 ids (a vocabulary of 50,257: every id fits in uint16) are
written byte for byte as nanoGPT's tools write them (an ``int32[256]`` header, then the uint16
tokens) and converted with ``zerobatch convert``: once with the defaults, which must choose
uint16, and once with ``--dtype uint32``, each as one file and as a dataset of shards. Then:

* the uint16 file is exactly the size the spec gives for dtype 1, half the uint32 file's bytes
  past the header (rows of ``B * T * 2`` bytes fill whole 4096-byte slots, so no padding hides
  the saving), and both hold the records the spec's permutation puts there, read straight
  from the ``.bin`` files;
* every adapter (PyTorch's loader on the host and through its device path, PyTorch's dataset
  in a ``DataLoader`` with worker processes, JAX, ``tf.data``) serves the same int32 and int64
  batches, in the same order, from the uint16 and the uint32 conversion.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import (
    DTYPE_UINT16,
    DTYPE_UINT32,
    HEADER_SIZE,
    SLOT_ALIGNMENT,
    expected_file_size,
    raw_batch_bytes,
)

from tests.helpers import expected_batches, require
from zerobatch_core import BatchFileReader, DatasetReader

torch = require("torch")
jax = require("jax")
tf = require("tensorflow")

from torch.utils.data import DataLoader  # noqa: E402
from zerobatch_adapters.jax import JaxBatchIterator, default_sharding  # noqa: E402
from zerobatch_adapters.tensorflow import tf_dataset  # noqa: E402
from zerobatch_adapters.torch import TorchBatchDataset, TorchBatchLoader  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MAGIC, VERSION = 20240520, 1  # nanoGPT's uint16 shard header (``fineweb.py``)
VOCAB = 50_257  # GPT-2
B, T = 8, 256  # B * T * 2 bytes = one 4096-byte slot: no padding in the uint16 file
SHARD_TOKENS = (70_000, 41_300, 63_000)
ORDER: dict[str, Any] = {"block_size": 4, "seed": 17}
# DataLoader workers: fork is unsafe once JAX or TensorFlow threads run in this process.
CTX = "forkserver"


def write_bin(path: Path, tokens: npt.NDArray[np.integer]) -> None:
    """A nanoGPT shard: 256 int32 header words (magic, version, token count), uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = MAGIC, VERSION, tokens.size
    path.write_bytes(header.tobytes() + tokens.astype(np.uint16).tobytes())  # little-endian host


def convert(inputs: str, output: Path, *flags: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "zerobatch_core", "convert", inputs, str(output),
         "--seq-len", str(T), "--batch-size", str(B), "--seed", "3", "--json", *flags],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("nanogpt16")
    rng = np.random.default_rng(24)
    shards = []
    for i, n in enumerate(SHARD_TOKENS):
        tokens = rng.integers(0, VOCAB, n)
        tokens[:2] = 0, VOCAB - 1  # both ends of the vocabulary
        write_bin(root / f"fineweb_train_{i:06d}.bin", tokens)
        shards.append(tokens)
    pattern = str(root / "fineweb_train_*.bin")
    out: dict[str, Any] = {"shards": shards, "summaries": {}}
    for name, flags in (("uint16", ()), ("uint32", ("--dtype", "uint32"))):
        file, dataset = root / f"{name}.batch", root / f"ds-{name}"
        out[f"file-{name}"] = file
        out[f"dataset-{name}"] = dataset
        out["summaries"][name] = convert(pattern, file, *flags)
        out["summaries"][f"ds-{name}"] = convert(pattern, dataset, "--shard-size", "16", *flags)
    return out


def source_records(shards: Iterable[npt.NDArray[np.integer]]) -> npt.NDArray[np.int64]:
    """The records a conversion cuts: each shard's tokens in rows of ``T``, its tail dropped."""
    rows = [s[: s.size // T * T].reshape(-1, T) for s in shards]
    return np.concatenate(rows).astype(np.int64)


def test_defaults_write_uint16_half_the_size_of_uint32(corpus: dict[str, Any]) -> None:
    summaries = corpus["summaries"]
    assert summaries["uint16"]["dtype"] == summaries["ds-uint16"]["dtype"] == "uint16"
    assert summaries["uint32"]["dtype"] == summaries["ds-uint32"]["dtype"] == "uint32"
    records = source_records(corpus["shards"])
    n = len(records) // B
    assert summaries["uint16"]["batches"] == summaries["uint32"]["batches"] == n
    size16 = corpus["file-uint16"].stat().st_size
    size32 = corpus["file-uint32"].stat().st_size
    # The exact sizes the spec gives: a header and n slots of B * T * 2 (or * 4) bytes, which
    # are whole multiples of the slot alignment here, so nothing is padding.
    assert raw_batch_bytes(B, T, DTYPE_UINT16) == SLOT_ALIGNMENT
    assert size16 == expected_file_size(B, T, n, DTYPE_UINT16) == HEADER_SIZE + n * SLOT_ALIGNMENT
    assert (
        size32 == expected_file_size(B, T, n, DTYPE_UINT32) == HEADER_SIZE + 2 * n * SLOT_ALIGNMENT
    )
    assert 2 * (size16 - HEADER_SIZE) == size32 - HEADER_SIZE
    # Both files hold what the spec's permutation puts there, read from the .bin files.
    want = expected_batches(records, B, 3)
    with (
        BatchFileReader(corpus["file-uint16"]) as narrow,
        BatchFileReader(corpus["file-uint32"]) as wide,
    ):
        assert narrow.token_dtype == np.dtype(np.uint16) and narrow.dtype == DTYPE_UINT16
        assert wide.token_dtype == np.dtype(np.uint32) and wide.dtype == DTYPE_UINT32
        for i in range(n):
            np.testing.assert_array_equal(narrow.read_batch(i), want[i])
            np.testing.assert_array_equal(wide.read_batch(i), want[i])
    shards16 = sorted(corpus["dataset-uint16"].glob("*.batch"))
    shards32 = sorted(corpus["dataset-uint32"].glob("*.batch"))
    assert len(shards16) == len(shards32) > 1
    for a, b in zip(shards16, shards32, strict=True):
        assert 2 * (a.stat().st_size - HEADER_SIZE) == b.stat().st_size - HEADER_SIZE
    with DatasetReader(corpus["dataset-uint16"]) as dataset:
        assert dataset.token_dtype == np.dtype(np.uint16)


# -- every adapter, the same batches from both conversions ------------------------------------
def as_host(item: Any) -> tuple[np.ndarray, ...]:
    """One item (a tensor or array, or an (inputs, labels) pair) as host NumPy copies."""
    fields = item if isinstance(item, tuple) else (item,)
    return tuple(np.array(f.numpy() if hasattr(f, "numpy") else f) for f in fields)


def torch_loader(path: Path, **kw: Any) -> list[Any]:
    return [as_host(item) for item in TorchBatchLoader(path, **kw, **ORDER)]


def torch_device_path(path: Path, **kw: Any) -> list[Any]:
    return [as_host(item) for item in TorchBatchLoader(path, device="cpu", **kw, **ORDER)]


def torch_workers(path: Path, **kw: Any) -> list[Any]:
    ds = TorchBatchDataset(path, **kw, **ORDER)
    dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=CTX)
    return [as_host(item) for item in dl]


def jax_arrays(path: Path, **kw: Any) -> list[Any]:
    devices = jax.devices()
    sharding = default_sharding(devices[: math.gcd(len(devices), B)])
    with (
        jax.enable_x64(kw["dtype"] == "int64"),
        JaxBatchIterator(path, sharding=sharding, **kw, **ORDER) as it,
    ):
        return [as_host(item) for item in it]


def tf_elements(path: Path, **kw: Any) -> list[Any]:
    return [as_host(item) for item in tf_dataset(path, **kw, **ORDER)]


ADAPTERS: dict[str, Callable[..., list[Any]]] = {
    "torch-loader": torch_loader,
    "torch-device-path": torch_device_path,
    "torch-dataloader-workers": torch_workers,
    "jax": jax_arrays,
    "tensorflow": tf_elements,
}


@pytest.mark.parametrize("source", ["file", "dataset"])
@pytest.mark.parametrize("next_token", [False, True])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_every_adapter_serves_the_same_batches_from_both(
    corpus: dict[str, Any], adapter: str, dtype: str, next_token: bool, source: str
) -> None:
    serve = ADAPTERS[adapter]
    kw: dict[str, Any] = {"dtype": dtype, "next_token": next_token}
    narrow = serve(corpus[f"{source}-uint16"], **kw)
    wide = serve(corpus[f"{source}-uint32"], **kw)
    n = corpus["summaries"]["uint16"]["batches"]
    assert len(narrow) == len(wide) == n
    width = T - 1 if next_token else T
    for step, (a, b) in enumerate(zip(narrow, wide, strict=True)):
        assert len(a) == len(b) == (2 if next_token else 1)
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            # JAX's labels share the inputs' dtype; everywhere else labels are int64.
            want = dtype if k == 0 or adapter == "jax" else "int64"
            assert x.dtype == y.dtype == np.dtype(want), (step, k, x.dtype, y.dtype)
            assert x.shape == y.shape == (B, width)
            np.testing.assert_array_equal(x, y, err_msg=f"{adapter} step {step} field {k}")
    # The batches hold the whole vocabulary's range, so a narrowing anywhere would show.
    top = max(int(f.max()) for item in narrow for f in item)
    assert 2**15 <= top < VOCAB
