"""Serving ``[32, 512]`` batches to a training loop: ZeroBatch against peers and the machine.

One command generates a synthetic token corpus, writes it in each system's own format, puts
every file in the same page-cache state, and measures each system in a fresh child process
(``--run SYSTEM`` prints one JSON line), in two modes:

- ``yield``: the loop only receives the batch;
- ``consume``: the loop reads every token once (a sum in the output's own dtype and framework).

Reported per system: tokens/s (median and min..max over trials), per-batch latency p50/p99
(the time of ``next()`` alone), time to first batch (construction to first batch), CPU time
per batch (the process's CPU seconds, every thread and reaped worker process included, over
each pass, divided by the batches it served), and the child's peak RSS. Baselines in the same
run: the same consume operation on batches already in RAM (the ideal, per framework and dtype),
memcpy bandwidth, uint32->int64 conversion into a preallocated buffer, page-cache read
bandwidth through a fresh mmap, and cold sequential reads after ``posix_fadvise(DONTNEED)``.

    .venv/bin/python benchmarks/loader_bench.py                 # 100k x 512 tokens, ~4 min
    .venv/bin/python benchmarks/loader_bench.py --records 20000 --trials 3   # quick
    bash benchmarks/peers_env.sh   # once: HF datasets, MosaicML streaming, grain (own venv)

The parent imports only the standard library (children inherit its peak RSS at ``execve``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench-output" / "loader"
PEERS_PY = REPO / "bench-output" / "peers-venv" / "bin" / "python"
MIB = 2**20
VOCAB = 50257  # GPT-2: fits nanoGPT's uint16 shards
BATCH, SEQ = 32, 512
SEED = 1234

# name -> (environment, output description, kind). kind: zb (ZeroBatch), peer, floor.
SYSTEMS: dict[str, tuple[str, str, str]] = {
    "zb_uint32": ("main", "numpy uint32 view", "zb"),
    "zb_int32": ("main", "numpy int32 view", "zb"),
    "zb_int64": ("main", "numpy int64 (converted ahead in chunks)", "zb"),
    "zb_int64_out": ("main", "numpy int64 read_batch_int64(out=) reused buffer", "zb"),
    "zb_torch_int32": ("main", "torch int32 zero-copy, TorchBatchDataset", "zb"),
    "zb_torch_int64": ("main", "torch int64, TorchBatchDataset", "zb"),
    "zb_torch_loader_w2": ("main", "torch int64, TorchBatchLoader num_workers=2", "zb"),
    # Workers against none, consume mode (the rule: workers never slow a loader down).
    **{
        f"zb_{kind}_{dtype}_w{k}": ("main", f"torch {dtype}, {what} num_workers={k}", "zb")
        for kind, what in (
            ("torch_loader", "TorchBatchLoader"),
            ("dataloader", "DataLoader(TorchBatchDataset, batch_size=None)"),
        )
        for dtype in ("int32", "int64")
        for k in (0, 2, 4)
    },
    "zb_jax_8dev": ("main", "jax int32 sharded over 8 CPU devices", "zb"),
    "zb_tf_int64": ("main", "tf.data int64, tf_dataset", "zb"),
    "zb_uint32_cold": ("main", "numpy uint32 view, file dropped from cache", "zb"),
    "nanogpt_get_batch": ("main", "torch int64, nanoGPT get_batch", "peer"),
    "dl_map": ("main", "torch int64, DataLoader map-style per sample", "peer"),
    "dl_map_w2": ("main", "torch int64, DataLoader map-style, 2 workers", "peer"),
    "dl_getitems": ("main", "torch int64, DataLoader batched __getitems__", "peer"),
    "hf_datasets": ("peers", "torch int64, HF datasets with_format('torch')", "peer"),
    "mosaic_mds": ("peers", "torch int64, MosaicML StreamingDataset (MDS)", "peer"),
    "grain": ("peers", "numpy int64, grain MapDataset over ArrayRecord", "peer"),
    # Framework floors: the fastest each framework hands a [32, 512] batch already in RAM to a
    # Python loop (no file, no loader). A loader built on the framework cannot beat it.
    "floor_tf_data": ("main", "tf.data from_tensors(in-RAM int64 batch).repeat(), eager", "floor"),
    "floor_jax_put": ("main", "jax.device_put(in-RAM int32 batch, 8-device sharding)", "floor"),
}
IDEALS = ("numpy_uint32", "numpy_int32", "numpy_int64", "torch_int32", "torch_int64")
IDEALS += ("jax_int32", "tf_int64")
# The ideal (in-RAM consume of the same output type) each system is compared with.
IDEAL_OF = {
    "zb_uint32": "numpy_uint32",
    "zb_int32": "numpy_int32",
    "zb_int64": "numpy_int64",
    "zb_int64_out": "numpy_int64",
    "zb_torch_int32": "torch_int32",
    "zb_torch_int64": "torch_int64",
    "zb_torch_loader_w2": "torch_int64",
    **{
        f"zb_{kind}_{dtype}_w{k}": f"torch_{dtype}"
        for kind in ("torch_loader", "dataloader")
        for dtype in ("int32", "int64")
        for k in (0, 2, 4)
    },
    "zb_jax_8dev": "jax_int32",
    "zb_tf_int64": "tf_int64",
    "zb_uint32_cold": "numpy_uint32",
    "grain": "numpy_int64",
    "floor_tf_data": "tf_int64",
    "floor_jax_put": "jax_int32",
}
JAX_ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


# --- files and page cache (parent: standard library only) ------------------------------------


def files(out: Path) -> dict[str, Path]:
    return {
        "batch": out / "train.batch",
        "records": out / "records.u32",
        "nanogpt": out / "train.bin",
        "hf": out / "hf",
        "mds": out / "mds",
        "grain": out / "grain.array_record",
    }


def _file_list(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.exists() else []


def drop_cache(path: Path) -> None:
    """fsync and ``posix_fadvise(DONTNEED)`` every file under ``path``."""
    for p in _file_list(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cache_state(path: Path) -> None:
    """The same page-cache state for every format: dropped, then read back in 8 MiB reads."""
    drop_cache(path)
    for p in _file_list(path):
        with open(p, "rb", buffering=0) as f:
            while f.read(8 * MIB):
                pass


# --- child side: generation -------------------------------------------------------------------


def _write_large(path: Path, data: Any) -> None:
    """Write an array's bytes in 8 MiB writes (page-cache state depends on the write size)."""
    mv = memoryview(data).cast("B")
    with open(path, "wb", buffering=0) as f:
        for i in range(0, len(mv), 8 * MIB):
            f.write(mv[i : i + 8 * MIB])
        os.fsync(f.fileno())


def gen_main(out: Path, records: int) -> dict[str, Any]:
    import numpy as np

    from zerobatch_core import write_batch_file

    f = files(out)
    out.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(SEED).integers(0, VOCAB, size=(records, SEQ), dtype=np.uint32)
    t0 = time.perf_counter()
    nb = write_batch_file(f["batch"], tokens, batch_size=BATCH, seed=SEED, overwrite=True)
    t_batch = time.perf_counter() - t0
    _write_large(f["records"], np.ascontiguousarray(tokens))
    _write_large(f["nanogpt"], tokens.astype(np.uint16).reshape(-1))
    return {"num_batches": nb, "write_batch_s": t_batch}


def _import_streaming() -> Any:
    """Import MosaicML streaming without torchvision (its vision module alone needs it).

    torchvision resolves to a CUDA build that fails beside CPU torch (PERF-NOTES), so the
    peers' venv lacks it; placeholder modules let ``streaming/__init__`` import, and nothing
    this benchmark calls touches them.
    """
    import types

    try:
        import torchvision  # noqa: F401
    except ImportError:
        # transformers probes torchvision with find_spec at import: import it before the stub.
        import transformers.feature_extraction_utils  # noqa: F401

        tv = types.ModuleType("torchvision")
        tv_ds = types.ModuleType("torchvision.datasets")
        tv_tr = types.ModuleType("torchvision.transforms")
        tv_fn = types.ModuleType("torchvision.transforms.functional")
        tv_ds.VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
        tv_ds.CIFAR10 = type("CIFAR10", (), {})  # type: ignore[attr-defined]
        tv_fn.to_tensor = lambda x: x  # type: ignore[attr-defined]
        for name, mod in (
            ("torchvision", tv),
            ("torchvision.datasets", tv_ds),
            ("torchvision.transforms", tv_tr),
            ("torchvision.transforms.functional", tv_fn),
        ):
            sys.modules[name] = mod
    import streaming

    return streaming


def gen_peers(out: Path, records: int) -> dict[str, Any]:
    """Peer formats, written in the peers' venv from the same records."""
    import shutil

    import numpy as np

    f = files(out)
    tokens = np.memmap(f["records"], dtype=np.uint32, mode="r").reshape(-1, SEQ)[:records]
    done: dict[str, Any] = {}
    try:
        import datasets

        shutil.rmtree(f["hf"], ignore_errors=True)
        ds = datasets.Dataset.from_dict({"input_ids": np.asarray(tokens, dtype=np.int32)})
        ds.save_to_disk(str(f["hf"]))
        done["hf"] = True
    except Exception as e:  # report and go on: a missing peer is not fatal
        done["hf"] = f"{type(e).__name__}: {e}"
    try:
        mds_writer = _import_streaming().MDSWriter

        shutil.rmtree(f["mds"], ignore_errors=True)
        cols = {"input_ids": f"ndarray:uint32:{SEQ}"}
        with mds_writer(out=str(f["mds"]), columns=cols, size_limit=64 * MIB) as w:
            for row in tokens:
                w.write({"input_ids": np.asarray(row)})
        done["mds"] = True
    except Exception as e:
        done["mds"] = f"{type(e).__name__}: {e}"
    try:
        from array_record.python.array_record_module import ArrayRecordWriter

        w = ArrayRecordWriter(str(f["grain"]), "group_size:1")
        for row in tokens:
            w.write(np.asarray(row).tobytes())
        w.close()
        done["grain"] = True
    except Exception as e:
        done["grain"] = f"{type(e).__name__}: {e}"
    return done


# --- child side: measurement ------------------------------------------------------------------


def _consumer(framework: str) -> Any:
    """The consume operation: read every token once (a sum in the batch's own dtype)."""
    if framework == "numpy":
        return lambda b: b.sum(dtype=b.dtype)
    if framework == "torch":
        import torch

        return lambda b: torch.sum(b, dtype=b.dtype)
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda x: jnp.sum(x, dtype=x.dtype))
        return lambda b: f(b).block_until_ready()
    if framework == "tf":
        import tensorflow as tf

        return lambda b: tf.reduce_sum(b).numpy()
    raise ValueError(framework)


def _timed(
    make_iter: Any, consume: Any, trials: int, seconds: float, n_max: int, after: Any = None
) -> dict:
    """Run ``trials`` passes of at most ``n_max`` batches / ``seconds``; collect the figures.

    ``after(trial)``, if given, runs untimed after each pass (the paired ideal pass).
    """
    rates, lat_ns, ttfb, served, cpu = [], [], [], 0, []
    pc = time.perf_counter_ns
    prepare = getattr(make_iter, "prepare", None)
    for trial in range(trials):
        if prepare is not None:
            prepare(trial)
        cpu0 = _cpu_seconds()
        t0 = pc()
        it = iter(make_iter(trial))
        b = next(it)
        t1 = pc()
        ttfb.append((t1 - t0) / 1e9)
        toks = _ntok(b)
        if consume is not None:
            consume(b)
        n, start, deadline = 1, pc(), pc() + int(seconds * 1e9)
        lat: list[int] = []
        while n < n_max:
            a = pc()
            try:
                b = next(it)
            except StopIteration:
                break
            lat.append(pc() - a)
            if consume is not None:
                consume(b)
            n += 1
            if lat[-1] and n % 8 == 0 and pc() > deadline:
                break
        elapsed = (pc() - start) / 1e9
        rates.append((n - 1) * toks / elapsed if n > 1 else 0.0)
        lat_ns.extend(lat)
        served += n
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it, b
        cpu.append((_cpu_seconds() - cpu0) / n)
        if after is not None:
            after(trial)
    lat_ns.sort()

    def pct(q: float) -> float:
        return lat_ns[min(len(lat_ns) - 1, int(q * len(lat_ns)))] / 1e3 if lat_ns else math.nan

    rates_sorted = sorted(rates)
    return {
        "tok_s": rates_sorted[len(rates) // 2],
        "tok_s_min": rates_sorted[0],
        "tok_s_max": rates_sorted[-1],
        "trials": rates,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "ttfb_s": sorted(ttfb)[len(ttfb) // 2],
        "batches": served,
        "cpu_s_per_batch": sorted(cpu)[len(cpu) // 2],
    }


def _cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of the children it has reaped."""
    import resource

    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _ntok(b: Any) -> int:
    if isinstance(b, dict):
        b = next(iter(b.values()))
    shape = tuple(b.shape)
    return int(shape[0]) * int(shape[1])


def _framework(system: str) -> str:
    if system.startswith(("zb_torch", "zb_dataloader", "nanogpt", "dl_", "hf_", "mosaic")):
        return "torch"
    if system.startswith(("zb_jax", "floor_jax")):
        return "jax"
    if system.startswith(("zb_tf", "floor_tf")):
        return "tf"
    return "numpy"


def _make_iter(system: str, out: Path) -> Any:
    """``trial -> iterable of [32, 512] batches`` for one system (fresh reader per trial)."""
    f = files(out)
    if system in ("zb_uint32", "zb_int32", "zb_int64", "zb_uint32_cold"):
        from zerobatch_core import BatchNativeLoader

        dtype = "uint32" if system == "zb_uint32_cold" else system[3:]

        def it(trial: int) -> Any:
            return BatchNativeLoader(f["batch"], dtype=dtype, epoch=trial)

        def prepare(trial: int) -> None:
            # The disk's own sequential rate right before each pass: the pair's ratio is what
            # counts, as the virtual disk's rate varies several-fold over minutes.
            _DISK_GBPS.append(sequential_read_gbps(f["batch"]))
            drop_cache(f["batch"])

        if system == "zb_uint32_cold":
            it.prepare = prepare  # type: ignore[attr-defined]  # untimed, before each pass
        return it
    if system == "zb_int64_out":
        import numpy as np

        from zerobatch_core import BatchFileReader, BatchNativeLoader

        def it_out(trial: int) -> Any:
            reader = BatchFileReader(f["batch"])
            order = BatchNativeLoader(reader, epoch=trial).epoch_order()
            buf = np.empty((reader.batch_size, reader.seq_len), dtype=np.int64)
            return (reader.read_batch_int64(int(i), out=buf) for i in order)

        return it_out
    if system in ("zb_torch_int32", "zb_torch_int64"):
        from zerobatch_adapters.torch import TorchBatchDataset

        return lambda trial: TorchBatchDataset(f["batch"], dtype=system[9:], epoch=trial)
    if system == "zb_torch_loader_w2":
        from zerobatch_adapters.torch import TorchBatchLoader

        return lambda trial: TorchBatchLoader(f["batch"], epoch=trial, dtype="int64", num_workers=2)
    if system.startswith(("zb_torch_loader_int", "zb_dataloader_int")):
        return _workers(system, f["batch"])
    if system == "zb_jax_8dev":
        from zerobatch_adapters.jax import JaxBatchIterator

        def it_jax(trial: int) -> Any:
            return (b.block_until_ready() for b in JaxBatchIterator(f["batch"], epoch=trial))

        return it_jax
    if system == "zb_tf_int64":
        from zerobatch_adapters.tensorflow import tf_dataset

        return lambda trial: tf_dataset(f["batch"], epoch=trial, dtype="int64")
    if system in ("floor_tf_data", "floor_jax_put"):
        return _floor(system, f["batch"])
    if system == "nanogpt_get_batch":
        return _nanogpt(f["nanogpt"])
    if system in ("dl_map", "dl_map_w2", "dl_getitems"):
        return _dataloader(system, f["records"])
    if system == "hf_datasets":
        return _hf(f["hf"])
    if system == "mosaic_mds":
        return _mds(f["mds"])
    if system == "grain":
        return _grain(f["grain"])
    raise ValueError(f"unknown system {system!r}")


def _workers(system: str, path: Path) -> Any:
    """``TorchBatchLoader`` or a plain ``DataLoader(TorchBatchDataset)`` with k workers."""
    from torch.utils.data import DataLoader
    from zerobatch_adapters.torch import TorchBatchDataset, TorchBatchLoader

    *_, dtype, workers = system.split("_")
    k = int(workers[1:])
    ctx = {"multiprocessing_context": "fork"} if k else {}
    if system.startswith("zb_torch_loader"):
        return lambda trial: TorchBatchLoader(path, epoch=trial, dtype=dtype, num_workers=k)

    def it(trial: int) -> Any:
        ds = TorchBatchDataset(path, epoch=trial, dtype=dtype)
        return DataLoader(ds, batch_size=None, num_workers=k, **ctx)

    return it


def _floor(system: str, path: Path) -> Any:
    """One epoch's worth of a single in-RAM batch, through the framework's own machinery."""
    import numpy as np

    from zerobatch_core import BatchFileReader

    with BatchFileReader(path) as r:
        host, n = np.array(r.read_batch(0)), len(r)
    if system == "floor_tf_data":
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensors(host.astype(np.int64)).repeat(n)
        return lambda trial: ds
    import jax
    from zerobatch_adapters.jax import default_sharding

    sh, h32 = default_sharding(), host.view(np.int32)
    return lambda trial: (jax.device_put(h32, sh).block_until_ready() for _ in range(n))


def _nanogpt(path: Path) -> Any:
    """nanoGPT's ``get_batch`` (train.py): a new memmap per call, random offsets, stack.

    Only ``x`` is built (the other systems serve one [32, 512] batch, not an (x, y) pair).
    """
    import numpy as np
    import torch

    def get_batch() -> Any:
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - SEQ, (BATCH,))
        return torch.stack([torch.from_numpy(data[i : i + SEQ].astype(np.int64)) for i in ix])

    def it(trial: int) -> Any:
        torch.manual_seed(trial)
        n = os.path.getsize(path) // 2 // (BATCH * SEQ)
        return (get_batch() for _ in range(n))

    return it


class _Records:
    """Map-style dataset over a ``[N, 512]`` uint32 memmap: int64 tensor per record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = os.path.getsize(path) // (4 * SEQ)
        self.mm: Any = None

    def _data(self) -> Any:
        if self.mm is None:
            import numpy as np

            self.mm = np.memmap(self.path, dtype=np.uint32, mode="r").reshape(-1, SEQ)
        return self.mm

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import numpy as np
        import torch

        return torch.from_numpy(self._data()[i].astype(np.int64))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "n": self.n, "mm": None}


class _BatchedRecords(_Records):
    """Adds ``__getitems__``: one fancy-indexed read and conversion per batch."""

    def __getitems__(self, indices: list[int]) -> Any:
        import numpy as np
        import torch

        return torch.from_numpy(self._data()[np.asarray(indices)].astype(np.int64))


def _identity(batch: Any) -> Any:
    return batch


def _dataloader(system: str, path: Path) -> Any:
    import torch
    from torch.utils.data import DataLoader

    if system == "dl_getitems":
        ds: Any = _BatchedRecords(path)
        kw: dict[str, Any] = {"collate_fn": _identity}
    else:
        ds, kw = _Records(path), {}
    workers = 2 if system == "dl_map_w2" else 0
    if workers:
        kw.update(persistent_workers=False, prefetch_factor=2)

    def it(trial: int) -> Any:
        g = torch.Generator().manual_seed(trial)
        return DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=g, **kw
        )

    return it


def _hf(path: Path) -> Any:
    import datasets
    from torch.utils.data import DataLoader

    ds = datasets.load_from_disk(str(path)).with_format("torch")

    def it(trial: int) -> Any:
        import torch

        g = torch.Generator().manual_seed(trial)
        dl = DataLoader(ds, batch_size=BATCH, shuffle=True, generator=g)
        return (b["input_ids"].long() for b in dl)

    return it


def _mds(path: Path) -> Any:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    streaming_dataset = _import_streaming().StreamingDataset

    def collate(rows: list[dict[str, Any]]) -> Any:
        return torch.from_numpy(np.stack([r["input_ids"] for r in rows]).astype(np.int64))

    def it(trial: int) -> Any:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = streaming_dataset(local=str(path), batch_size=BATCH, shuffle=True, shuffle_seed=trial)
        return DataLoader(ds, batch_size=BATCH, collate_fn=collate, num_workers=0)

    return it


def _grain(path: Path) -> Any:
    import grain
    import numpy as np

    src = grain.sources.ArrayRecordDataSource([str(path)])

    def decode(b: bytes) -> Any:
        return np.frombuffer(b, dtype=np.uint32).astype(np.int64)

    def it(trial: int) -> Any:
        ds = grain.MapDataset.source(src).shuffle(seed=trial).map(decode).batch(BATCH)
        # No read threads: on 2 cores grain's default 16 threads are slower (PERF-NOTES).
        opts = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        return ds.to_iter_dataset(read_options=opts)

    return it


_DISK_GBPS: list[float] = []


def sequential_read_gbps(path: Path) -> float:
    """The file read cold from disk start to end in 8 MiB reads, in GB/s."""
    buf = bytearray(8 * MIB)
    drop_cache(path)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass
    return os.path.getsize(path) / (time.perf_counter() - t0) / 1e9


def run_system(system: str, out: Path, mode: str, trials: int, seconds: float) -> dict:
    fw = _framework(system)
    consume = _consumer(fw) if mode == "consume" else None
    make = _make_iter(system, out)
    ideal_rates: list[float] = []
    after = None
    if consume is not None and system.startswith(("zb_", "floor_")) and system in IDEAL_OF:
        # The ideal again in this process, one pass after each of the system's passes: the
        # machine's speed drifts by tens of percent over minutes, so ratios are taken per pair.
        ideal_make = _ideal_source(IDEAL_OF[system], out)

        def after(trial: int) -> None:
            ideal_rates.append(_timed(ideal_make, consume, 1, seconds, n_max=10**9)["tok_s"])

    res = _timed(make, consume, trials, seconds, n_max=10**9, after=after)
    res.update(framework=fw)
    if ideal_rates:
        pairs = sorted(r / i for r, i in zip(res["trials"], ideal_rates, strict=True) if i)
        res["ideal_paired_tok_s"] = ideal_rates
        res["vs_ideal_paired"] = pairs[len(pairs) // 2]
    if _DISK_GBPS:  # cold passes: each pass's bytes/s over the disk rate measured just before
        ratios = sorted(r * 4 / 1e9 / d for r, d in zip(res["trials"], _DISK_GBPS, strict=True))
        res["disk_GBps"] = list(_DISK_GBPS)
        res["vs_disk"] = ratios[len(ratios) // 2]
    return res


def run_ideal(name: str, out: Path, trials: int, seconds: float) -> dict:
    """The consume operation on batches already in RAM, in the output type of ``name``."""
    fw = name.split("_")[0]
    return _timed(_ideal_source(name, out), _consumer(fw), trials, seconds, n_max=10**9)


def _ideal_source(name: str, out: Path) -> Any:
    """``trial -> an epoch's worth of batches`` cycling over 512 batches held in RAM."""
    import numpy as np

    from zerobatch_core import BatchFileReader

    fw, dtype = name.split("_")
    with BatchFileReader(files(out)["batch"]) as r:
        k = min(len(r), 512)  # 32 MiB of uint32: beyond the caches, like the real data
        host = [
            np.array(r.read_batch(i)).view(np.int32 if dtype == "int32" else np.uint32)
            for i in range(k)
        ]
        n_epoch = len(r)
    if dtype == "int64":
        host = [h.astype(np.int64) for h in host]
    if fw == "torch":
        import torch

        batches: list[Any] = [torch.from_numpy(h) for h in host]
    elif fw == "jax":
        import jax
        from zerobatch_adapters.jax import default_sharding

        sh = default_sharding()
        batches = [jax.device_put(h, sh).block_until_ready() for h in host]
    elif fw == "tf":
        import tensorflow as tf

        batches = [tf.constant(h) for h in host]
    else:
        batches = host

    def make(trial: int) -> Any:
        return (batches[i % k] for i in range(n_epoch))

    return make


def run_baselines(out: Path, trials: int) -> dict:
    import mmap

    import numpy as np

    f = files(out)["batch"]
    res: dict[str, Any] = {}

    def best(fn: Any) -> float:
        times = []
        for _ in range(trials):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    big = np.random.default_rng(0).integers(0, VOCAB, size=64 * MIB // 4, dtype=np.uint32)
    dst = np.empty_like(big)
    np.copyto(dst, big)
    res["memcpy_GBps"] = big.nbytes / best(lambda: np.copyto(dst, big)) / 1e9
    b64k, d64k = big[: BATCH * SEQ].copy(), np.empty(BATCH * SEQ, np.uint32)

    def small() -> None:
        for _ in range(20000):
            np.copyto(d64k, b64k)

    res["memcpy_64KiB_GBps"] = 20000 * b64k.nbytes / best(small) / 1e9
    i64 = np.empty(big.shape, np.int64)
    np.copyto(i64, big)
    res["u32_i64_prealloc_tok_s"] = big.size / best(lambda: np.copyto(i64, big))
    out64 = np.empty(BATCH * SEQ, np.int64)

    def small64() -> None:
        for _ in range(20000):
            np.copyto(out64, b64k)

    res["u32_i64_prealloc_batch_tok_s"] = 20000 * BATCH * SEQ / best(small64)

    def alloc64() -> None:
        for _ in range(5000):
            b64k.astype(np.int64)

    res["u32_i64_astype_batch_tok_s"] = 5000 * BATCH * SEQ / best(alloc64)
    size = os.path.getsize(f)

    def mmap_read() -> None:  # a fresh mapping each time: first touch of every page included
        with open(f, "rb") as fh:
            m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            a = np.frombuffer(m, dtype=np.uint64)
            step = 8 * MIB // 8
            for i in range(0, a.size, step):
                a[i : i + step].sum(dtype=np.uint64)
            del a
            m.close()

    cache_state(f)
    res["mmap_pagecache_GBps"] = size / best(mmap_read) / 1e9
    colds = sorted(sequential_read_gbps(f) for _ in range(trials))
    res["cold_read_GBps"] = colds[len(colds) // 2]
    cache_state(f)
    return res


def child_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--mode", default="yield")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--records", type=int, default=0)
    a = p.parse_args(argv)
    if a.run == "gen_main":
        res = gen_main(a.out, a.records)
    elif a.run == "gen_peers":
        res = gen_peers(a.out, a.records)
    elif a.run == "baselines":
        res = run_baselines(a.out, a.trials)
    elif a.run.startswith("ideal:"):
        res = run_ideal(a.run[6:], a.out, a.trials, a.seconds)
    else:
        res = run_system(a.run, a.out, a.mode, a.trials, a.seconds)
    sys.stdout.flush()
    print("\n" + json.dumps(res), flush=True)
    os._exit(0)  # do not wait for threads that libraries leave behind


# --- parent -----------------------------------------------------------------------------------


def spawn(python: Path | str, args: list[str], env_extra: dict[str, str] | None = None) -> dict:
    env = dict(os.environ, PYTHONHASHSEED="0", TF_CPP_MIN_LOG_LEVEL="3", **(env_extra or {}))
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        proc = subprocess.Popen(
            [str(python), str(Path(__file__).resolve()), *args],
            stdout=fo,
            stderr=fe,
            env=env,
            cwd=REPO,
        )
        # wait4: this child's own peak RSS (the maximum over it and the children it waited for).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    rss = int(usage.ru_maxrss) * 1024
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1])
    res["peak_rss_bytes"] = rss
    res["wall_s"] = wall
    return res


def _g(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def main() -> None:
    if "--run" in sys.argv:
        child_main(sys.argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000, help="records of 512 tokens")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0, help="time cap of one trial's pass")
    ap.add_argument("--out", type=Path, default=OUT, help="scratch folder for the files")
    ap.add_argument("--json", type=Path, default=OUT / "results.json")
    ap.add_argument("--png", type=Path, default=OUT / "tokens_per_s.png")
    ap.add_argument("--only", default="", help="comma-separated systems (default: all)")
    ap.add_argument("--keep", action="store_true", help="reuse existing files of the same size")
    a = ap.parse_args()
    t_start = time.perf_counter()
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    f = files(out)
    meta = out / "meta.json"
    old = json.loads(meta.read_text()) if meta.exists() else {}
    main_py = sys.executable
    peers_ok = PEERS_PY.exists()
    if not (a.keep and old.get("records") == a.records):
        print(f"generating {a.records} x {SEQ} tokens ...", flush=True)
        gen = spawn(main_py, ["--run", "gen_main", "--out", str(out), "--records", str(a.records)])
        if "error" in gen:
            sys.exit(f"generation failed: {gen['error']}")
        peers_gen: dict[str, Any] = {}
        if peers_ok:
            args = ["--run", "gen_peers", "--out", str(out), "--records", str(a.records)]
            peers_gen = spawn(PEERS_PY, args)
        meta.write_text(json.dumps({"records": a.records, "gen": gen, "peers_gen": peers_gen}))
        old = json.loads(meta.read_text())
    print(f"files ready ({time.perf_counter() - t_start:.0f} s)", flush=True)
    common = ["--out", str(out), "--trials", str(a.trials), "--seconds", str(a.seconds)]
    only = {s for s in a.only.split(",") if s}
    results: dict[str, Any] = {"systems": {}, "ideals": {}}

    for p in f.values():
        cache_state(p)
    results["baselines"] = spawn(main_py, ["--run", "baselines", *common])
    print("baselines", json.dumps(results["baselines"]), flush=True)
    for name in IDEALS:
        env = JAX_ENV if name.startswith("jax") else None
        cache_state(f["batch"])
        results["ideals"][name] = spawn(main_py, ["--run", f"ideal:{name}", *common], env)
        print(f"ideal {name}: {_g(results['ideals'][name].get('tok_s', math.nan))} tok/s")
    for system, (envname, desc, kind) in SYSTEMS.items():
        if only and system not in only:
            continue
        entry: dict[str, Any] = {"output": desc, "kind": kind}
        results["systems"][system] = entry
        python: Path | str = main_py
        if envname == "peers":
            fmt = {"hf_datasets": "hf", "mosaic_mds": "mds", "grain": "grain"}[system]
            gen_state = old.get("peers_gen", {}).get(fmt)
            if not peers_ok:
                entry["error"] = "not installed (run benchmarks/peers_env.sh)"
                continue
            if gen_state is not True:
                entry["error"] = f"format not written: {gen_state}"
                continue
            python = PEERS_PY
        for mode in ("yield", "consume"):
            for p in f.values():  # every format's files in the same page-cache state
                cache_state(p)
            env = JAX_ENV if system.startswith(("zb_jax", "floor_jax")) else None
            r = spawn(python, ["--run", system, "--mode", mode, *common], env)
            entry[mode] = r
            shown = _g(r.get("tok_s", math.nan)) if "error" not in r else r["error"][:120]
            print(f"{system:20s} {mode:8s} {shown}", flush=True)
    results["config"] = {
        "records": a.records,
        "batch": [BATCH, SEQ],
        "trials": a.trials,
        "trial_cap_s": a.seconds,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs {platform.platform()}",
        "peers_python": str(PEERS_PY) if peers_ok else None,
        "total_s": time.perf_counter() - t_start,
    }
    table = render(results)
    print(table)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(results, indent=1))
    (a.json.with_suffix(".txt")).write_text(table + "\n")
    print(f"JSON: {a.json}")
    plot(results, a.png)


def render(results: dict[str, Any]) -> str:
    """A markdown table: tokens/s, spread, latency, TTFB, RSS, ratios to ideal and peers."""
    ideals = results["ideals"]
    systems = results["systems"]
    peers = {s: e for s, e in systems.items() if e["kind"] == "peer"}

    def rate(e: dict[str, Any], mode: str) -> float:
        r = e.get(mode) or {}
        return float(r.get("tok_s", 0.0)) if "error" not in r else 0.0

    best_peer = {}
    for mode in ("yield", "consume"):
        cands = [(rate(e, mode), s) for s, e in peers.items() if rate(e, mode) > 0]
        best_peer[mode] = max(cands) if cands else (0.0, "-")
    plain = {m: rate(systems.get("dl_map", {}), m) for m in ("yield", "consume")}
    lines = [
        "| system | output | mode | tok/s median | min..max | p50 us | p99 us | first batch ms "
        "| CPU us/batch | peak RSS MiB | vs ideal | vs best peer | vs plain DataLoader |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, e in systems.items():
        if "error" in e:
            lines.append(f"| {s} | {e['output']} | - | {e['error']} ||||||||||")
            continue
        for mode in ("yield", "consume"):
            r = e.get(mode) or {}
            if "error" in r:
                lines.append(
                    f"| {s} | {e['output']} | {mode} | error: {r['error'][:80]} ||||||||||"
                )
                continue
            ideal_name = IDEAL_OF.get(s, "torch_int64")
            ideal = float(ideals.get(ideal_name, {}).get("tok_s", 0.0))
            t = r["tok_s"]
            # The ideal is a consume figure: a ratio only for the consume mode. Paired (the
            # ideal run in the same process after each pass) where measured, else run-level.
            if "vs_ideal_paired" in r:
                vs_ideal = f"{r['vs_ideal_paired']:.2f}x ({ideal_name}, paired)"
            elif ideal and mode == "consume":
                vs_ideal = f"{t / ideal:.2f}x ({ideal_name})"
            else:
                vs_ideal = "-"
            bp = best_peer[mode][0]
            vs_peer = f"{t / bp:.1f}x" if bp and e["kind"] == "zb" else "-"
            vs_plain = f"{t / plain[mode]:.1f}x" if plain[mode] else "-"
            lines.append(
                f"| {s} | {e['output']} | {mode} | {_g(t)} | {_g(r['tok_s_min'])}..."
                f"{_g(r['tok_s_max'])} | {r['p50_us']:.2f} | {r['p99_us']:.2f} | "
                f"{r['ttfb_s'] * 1e3:.1f} | {r.get('cpu_s_per_batch', math.nan) * 1e6:.1f} | "
                f"{r['peak_rss_bytes'] / MIB:.0f} | {vs_ideal} | "
                f"{vs_peer} | {vs_plain} |"
            )
    cold = (systems.get("zb_uint32_cold") or {}).get("consume") or {}
    if "vs_disk" in cold:
        disk = ", ".join(f"{d:.2f}" for d in cold["disk_GBps"])
        warm = rate(systems.get("zb_uint32", {}), "consume") * 4 / 1e9
        lines.append("")
        lines.append(
            f"cold reads: zb_uint32_cold consume at {cold['vs_disk']:.2f}x the disk's sequential "
            f"rate (median over passes of each pass against a cold read of the file just before "
            f"it: {disk} GB/s); the same loop on a warm cache (zb_uint32 consume) moves "
            f"{warm:.2f} GB/s, so a cold pass can reach at most min(disk, warm)."
        )
    for zb, floor in (("zb_tf_int64", "floor_tf_data"), ("zb_jax_8dev", "floor_jax_put")):
        z, fl = systems.get(zb, {}), systems.get(floor, {})
        pairs = [(m, rate(z, m), rate(fl, m)) for m in ("yield", "consume")]
        if all(a and b for _, a, b in pairs):
            shown = ", ".join(f"{m} {a / b:.2f}x" for m, a, b in pairs)
            lines.append("")
            lines.append(f"{zb} against its framework's floor ({floor}): {shown}")
    lines.append("")
    lines.append(
        f"best peer: yield {best_peer['yield'][1]} ({_g(best_peer['yield'][0])} tok/s), "
        f"consume {best_peer['consume'][1]} ({_g(best_peer['consume'][0])} tok/s)"
    )
    lines.append("")
    lines.append("| ideal: consume on batches in RAM | tok/s | p50 us | p99 us |")
    lines.append("|---|---|---|---|")
    for name, r in ideals.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} | | |")
        else:
            lines.append(f"| {name} | {_g(r['tok_s'])} | {r['p50_us']:.2f} | {r['p99_us']:.2f} |")
    lines.append("")
    b = results.get("baselines", {})
    lines.append("| machine baseline | figure |")
    lines.append("|---|---|")
    for k, v in b.items():
        if k in ("peak_rss_bytes", "wall_s"):
            continue
        lines.append(f"| {k} | {_g(v) if isinstance(v, float) else v} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no PNG plot (pip install matplotlib)")
        return
    names, y, c = [], [], []
    for s, e in results["systems"].items():
        r = e.get("consume") or {}
        if "error" in e or "error" in r or not r:
            continue
        names.append(s)
        y.append(r["tok_s"])
        c.append({"zb": "tab:blue", "peer": "tab:orange"}.get(e["kind"], "tab:gray"))
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(names) + 1.5))
    ax.barh(names, y, color=c)
    ideal = results["ideals"].get("numpy_uint32", {}).get("tok_s")
    if ideal:
        ax.axvline(ideal, color="k", ls="--", lw=1, label="ideal (uint32 in RAM)")
        ax.legend()
    ax.set_xscale("log")
    ax.set_xlabel(
        "tokens/s, consume mode (log scale); blue ZeroBatch, orange peers, gray framework floors"
    )
    ax.invert_yaxis()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    print(f"PNG: {png}")


if __name__ == "__main__":
    main()
