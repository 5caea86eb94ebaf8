"""The adapters the contract suite (``test_contract.py``) runs against, by name.

Each entry builds an adapter for a file with the common constructor arguments. Adding a
framework means adding an entry here (and a converter in ``adapters/``); the contract tests
then run against it unchanged. Child processes of the resume tests import this module too.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

Factory = Callable[..., Any]


def _numpy(path: Path, **kw: Any) -> Any:
    from zerobatch_core import BatchStream

    return BatchStream(path, **kw)


def _torch_dataset(path: Path, **kw: Any) -> Any:
    from zerobatch_adapters.torch import TorchBatchDataset

    return TorchBatchDataset(path, **kw)


def _torch_loader(path: Path, **kw: Any) -> Any:
    from zerobatch_adapters.torch import TorchBatchLoader

    return TorchBatchLoader(path, device="cpu", **kw)  # read ahead on a thread


def _jax(path: Path, **kw: Any) -> Any:
    import jax
    from zerobatch_adapters.jax import JaxBatchIterator, default_sharding

    from zerobatch_core import BatchFileReader, BatchSource, Mixture

    if isinstance(path, Mixture):  # a blend: its global batch
        rows = (path.global_batch_size or 1) // kw.get("world_size", 1)
    elif isinstance(path, BatchSource):  # a source built outside ZeroBatch
        rows = path.batch_size // kw.get("world_size", 1)
    else:
        with BatchFileReader(path) as reader:
            rows = reader.batch_size // kw.get("world_size", 1)
    devices = jax.devices()
    sharding = default_sharding(devices[: math.gcd(len(devices), rows)])
    return JaxBatchIterator(path, sharding=sharding, **kw)


def _tf(path: Path, **kw: Any) -> Any:
    from zerobatch_adapters.tensorflow import TFBatchDataset

    return TFBatchDataset(path, **kw)


ADAPTERS: dict[str, tuple[str, Factory]] = {
    "numpy": ("numpy", _numpy),
    "torch-dataset": ("torch", _torch_dataset),
    "torch-loader": ("torch", _torch_loader),
    "jax": ("jax", _jax),
    "tensorflow": ("tensorflow", _tf),
}
"""Adapter name -> (the module it needs, a factory taking the file and common arguments)."""

CLASSES: dict[str, tuple[str, str]] = {
    "numpy": ("zerobatch_core", "BatchStream"),
    "torch-dataset": ("zerobatch_adapters.torch", "TorchBatchDataset"),
    "torch-loader": ("zerobatch_adapters.torch", "TorchBatchLoader"),
    "jax": ("zerobatch_adapters.jax", "JaxBatchIterator"),
    "tensorflow": ("zerobatch_adapters.tensorflow", "TFBatchDataset"),
}
"""Adapter name -> (module, class): for checking constructor signatures."""


def adapter_class(name: str) -> Any:
    module, cls = CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def make(name: str, path: Path, **kw: Any) -> Any:
    return ADAPTERS[name][1](path, **kw)
