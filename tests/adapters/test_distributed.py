"""Data x context parallelism through the frameworks: JAX meshes, real JAX processes, tf.distribute.

* JAX on 8 simulated CPU devices with a 2-D ``("data", "context")`` mesh (4 x 2), zig-zag off
  and on: every global array is the core's global batch (columns in zig-zag order with
  ``zigzag``), every device holds exactly its block (the core loader of its DP and CP rank), and
  processes simulated as groups of devices (rows, columns, 2 x 1 blocks, single devices) each
  read exactly their block, their ``bytes_read`` their share.
* Two real JAX processes (``jax.distributed`` on loopback, 4 devices each) with 2-D meshes
  across both: one split by rows between the processes, one by columns (context parallelism
  across processes); each process reads only its block, and the global array gathered over
  both processes is the core's global batch.
* ``tf.distribute``: an ``InputContext``'s pipeline is the data-parallel rank, in-process, and
  ``MirroredStrategy.distribute_datasets_from_function`` over two logical CPUs gives each
  replica its rows with the documented ``rebatch``.

The runs that need a device count of their own, or several processes, run this file as a
script in subprocesses (XLA fixes the device count when its backend starts).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from tests.helpers import records, require
from zerobatch_core import BatchNativeLoader, Slicing, write_batch_file

ROOT = Path(__file__).resolve().parents[2]
DEVICE_FLAG = "--xla_force_host_platform_device_count"
B, T, N = 16, 17, 4  # 17-token rows: 16-token next-token pairs, 2C = 4 chunks of 4
D, C = 4, 2  # the mesh: 4 data x 2 context
ORDER: dict[str, Any] = {"block_size": 2, "seed": 5}
TOKEN_BYTES = 4


def write(tmp_path: Path, seq_len: int = T, name: str = "mesh.batch") -> Path:
    path = tmp_path / name
    write_batch_file(path, records(B * N, seq_len), batch_size=B, seed=8)
    return path


def fields(item: Any) -> tuple[Any, ...]:
    return tuple(item) if isinstance(item, tuple) else (item,)


def host_items(loader: Iterable[Any]) -> list[tuple[np.ndarray, ...]]:
    """Every item of one pass as tuples of NumPy copies."""
    return [tuple(np.array(f) for f in fields(item)) for item in loader]


def zigzag_order(width: int, contexts: int) -> np.ndarray:
    """Token columns in zig-zag order: for each context index ``c``, chunks ``c`` and
    ``2C - 1 - c`` of ``2C``."""
    chunk = width // (2 * contexts)
    starts = [k for c in range(contexts) for k in (c, 2 * contexts - 1 - c)]
    return np.concatenate([np.arange(k * chunk, (k + 1) * chunk) for k in starts])


def expected_bytes(steps: int, rows: int, columns: int, ranges: int, next_token: bool) -> int:
    """Tokens a block reads: its rows x columns, plus one label token per column range."""
    return steps * rows * (columns + (ranges if next_token else 0)) * TOKEN_BYTES


# -- children: this file run as a script ---------------------------------------------------------
class Subset:
    """A sharding seen from a process that owns only ``devices``: what the iterator's
    constructor asks of a sharding, to simulate processes inside one."""

    def __init__(self, sharding: Any, devices: list[Any]) -> None:
        self.sharding, self.devices = sharding, devices

    def addressable_devices_indices_map(self, shape: tuple[int, ...]) -> dict[Any, Any]:
        full = self.sharding.devices_indices_map(shape)
        return {d: full[d] for d in self.devices}


def eight_devices(tokens: str, pairs: str) -> dict[str, Any]:
    """A 4 x 2 (data, context) mesh in one process, zig-zag off and on: ``tokens`` (16-token
    rows) served as tokens, ``pairs`` (17-token rows) as 16-token next-token pairs."""
    import jax
    from zerobatch_adapters.jax import JaxBatchIterator, data_context_sharding

    devices = jax.devices()
    assert len(devices) == 8, devices
    sharding = data_context_sharding(C)
    grid = sharding.mesh.devices
    assert grid.shape == (D, C) and sharding.mesh.axis_names == ("data", "context")
    where = {grid[i, c]: (i, c) for i in range(D) for c in range(C)}
    layouts = {  # processes simulated as groups of devices
        "rows": [list(grid[2 * p : 2 * p + 2].flat) for p in range(2)],
        "columns": [list(grid[:, c]) for c in range(C)],
        "blocks": [list(grid[2 * p : 2 * p + 2, c]) for p in range(2) for c in range(C)],
        "devices": [[d] for d in grid.flat],
    }
    width = T - 1
    checked: dict[str, Any] = {}
    for path, next_token in ((tokens, False), (pairs, True)):
        natural = host_items(BatchNativeLoader(path, dtype="int32", next_token=next_token, **ORDER))
        for zigzag in (False, True):
            kw: dict[str, Any] = {"next_token": next_token, "zigzag": zigzag, **ORDER}
            per_device = {
                (i, c): host_items(
                    BatchNativeLoader(
                        path,
                        dtype="int32",
                        rank=i,
                        world_size=D,
                        context_rank=c,
                        context_size=C,
                        **kw,
                    )
                )
                for i, c in where.values()
            }
            columns = zigzag_order(width, C) if zigzag else np.arange(width)
            it = JaxBatchIterator(path, sharding=sharding, prefetch=2, **kw)
            global_items = []
            for step, item in enumerate(it):
                arrays = []
                for j, g in enumerate(fields(item)):
                    assert g.sharding == sharding and g.dtype == np.int32
                    full = np.asarray(g)
                    # the global array is the stored batch, its columns zig-zag when zigzag
                    np.testing.assert_array_equal(full, natural[step][j][:, columns])
                    assert len(g.addressable_shards) == 8
                    for s in g.addressable_shards:  # each device holds exactly its block
                        assert s.data.shape == (B // D, width // C)
                        want = per_device[where[s.device]][step][j]
                        np.testing.assert_array_equal(np.asarray(s.data), want)
                    arrays.append(full)
                global_items.append(arrays)
            steps = len(global_items)
            assert steps == N
            # one process holds every device: it reads the whole step once
            ranges = len(it.loader.columns)
            assert it.loader.bytes_read == expected_bytes(steps, B, width, ranges, next_token)
            it.close()
            for layout, groups in layouts.items():
                area, blocks = 0, set()
                for devs in groups:
                    sub = JaxBatchIterator(path, sharding=Subset(sharding, devs), **kw)
                    rows, cols = sub.rows, sub.columns
                    for step, item in enumerate(sub.loader):
                        for j, part in enumerate(fields(item)):
                            np.testing.assert_array_equal(part, global_items[step][j][rows, cols])
                    r, w = rows.stop - rows.start, cols.stop - cols.start
                    ranges = len(sub.loader.columns)
                    assert sub.loader.bytes_read == expected_bytes(steps, r, w, ranges, next_token)
                    area += r * w
                    blocks.add((rows.start, cols.start))
                    sub.close()
                assert area == B * width and len(blocks) == len(groups), layout
                checked[f"{layout},zigzag={zigzag},next_token={next_token}"] = len(groups)
    return {"devices": len(devices), "checked": checked}


def two_processes(path: str, port: str, pid: str) -> dict[str, Any]:
    """One of two JAX processes (4 devices each) on a (data, context) mesh across both."""
    import jax

    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=int(pid), initialization_timeout=60
    )
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from zerobatch_adapters.jax import JaxBatchIterator, data_context_sharding

    me = jax.process_index()
    assert jax.process_count() == 2 and len(jax.devices()) == 8
    by_process = [
        sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
        for p in range(2)
    ]
    spec = PartitionSpec("data", "context")
    # "rows": process p holds data rows 2p, 2p + 1 of the mesh and both context columns;
    # "columns": process p holds context column p and every data row (CP across processes).
    columns_mesh = Mesh(np.stack(by_process, axis=1), ("data", "context"))
    shardings = {
        "rows": data_context_sharding(C),
        "columns": NamedSharding(columns_mesh, spec),
    }
    coordinates = {  # this process's core slicing, from the layouts above
        "rows": lambda zigzag: Slicing(me, 2, 0, C, C, zigzag),
        "columns": lambda zigzag: Slicing(0, 1, me, C, 1, zigzag),
    }
    width = T - 1
    natural = host_items(BatchNativeLoader(path, dtype="int32", next_token=True, **ORDER))
    order = {False: np.arange(width), True: zigzag_order(width, C)}
    report: dict[str, Any] = {"process": me}
    for name, sharding in shardings.items():
        grid = sharding.mesh.devices
        where = {grid[i, c]: (i, c) for i in range(D) for c in range(C)}
        for zigzag in (False, True):
            kw: dict[str, Any] = {"next_token": True, "zigzag": zigzag, **ORDER}
            it = JaxBatchIterator(path, sharding=sharding, **kw)
            assert it.loader.slicing == coordinates[name](zigzag), it.loader.slicing
            mine = host_items(
                BatchNativeLoader(path, dtype="int32", slicing=it.loader.slicing, **kw)
            )
            per_device = {
                (i, c): host_items(
                    BatchNativeLoader(
                        path,
                        dtype="int32",
                        rank=i,
                        world_size=D,
                        context_rank=c,
                        context_size=C,
                        **kw,
                    )
                )
                for i, c in where.values()
            }
            rows, cols = it.rows, it.columns
            steps = 0
            for step, item in enumerate(it):
                for j, g in enumerate(fields(item)):
                    assert g.shape == (B, width) and not g.is_fully_addressable
                    local = np.zeros((rows.stop - rows.start, cols.stop - cols.start), np.int32)
                    assert len(g.addressable_shards) == 4
                    for s in g.addressable_shards:  # each device: exactly its block
                        np.testing.assert_array_equal(
                            np.asarray(s.data), per_device[where[s.device]][step][j]
                        )
                        r, c = s.index
                        local[
                            r.start - rows.start : r.stop - rows.start,
                            c.start - cols.start : c.stop - cols.start,
                        ] = np.asarray(s.data)
                    np.testing.assert_array_equal(local, mine[step][j])  # the process's block
                    whole = multihost_utils.process_allgather(g, tiled=True)  # a collective
                    np.testing.assert_array_equal(whole, natural[step][j][:, order[zigzag]])
                steps += 1
            report[f"{name},zigzag={zigzag}"] = {
                "rows": [rows.start, rows.stop],
                "columns": [cols.start, cols.stop],
                "steps": steps,
                "ranges": len(it.loader.columns),
                "bytes_read": it.loader.bytes_read,
                "state": it.state_dict(),
            }
            it.close()
    jax.distributed.shutdown()
    return report


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def mirrored_replicas(path: str) -> dict[str, Any]:
    """``MirroredStrategy`` over two logical CPUs: one input pipeline, two replicas."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from zerobatch_adapters.tensorflow import TFBatchDataset

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    contexts = []

    def dataset_fn(ctx: Any) -> Any:
        contexts.append([ctx.input_pipeline_id, ctx.num_input_pipelines, ctx.num_replicas_in_sync])
        data = TFBatchDataset(path, input_context=ctx, next_token=True, **ORDER)
        return data.dataset().rebatch(ctx.get_per_replica_batch_size(B))  # as documented

    batches = strategy.distribute_datasets_from_function(dataset_fn)
    steps = host_items(BatchNativeLoader(path, next_token=True, **ORDER))
    served = 0
    for step, (inputs, labels) in enumerate(batches):
        for replica, (i, lab) in enumerate(
            zip(
                strategy.experimental_local_results(inputs),
                strategy.experimental_local_results(labels),
                strict=True,
            )
        ):  # replica j of the pipeline gets data-parallel rows j of 2
            rows = slice(replica * B // 2, (replica + 1) * B // 2)
            np.testing.assert_array_equal(i.numpy(), steps[step][0][rows])
            np.testing.assert_array_equal(lab.numpy(), steps[step][1][rows])
        served += 1
    return {"contexts": contexts, "steps": served}


def child_env(devices: int) -> dict[str, str]:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(
        XLA_FLAGS=" ".join([*flags, f"{DEVICE_FLAG}={devices}"]),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def start_child(role: str, *args: object, devices: int = 8) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, role, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(devices),
        cwd=ROOT,
    )


def results(procs: list[subprocess.Popen[str]], timeout: float = 180) -> list[Any]:
    """Each child's last stdout line as JSON; a failed child fails the test with its output."""
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"child failed:\n{stdout[-2000:]}\n{stderr[-6000:]}"
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def test_jax_eight_devices_data_by_context_mesh(tmp_path: Path) -> None:
    require("jax")
    tokens, pairs = write(tmp_path, T - 1, "tokens.batch"), write(tmp_path)
    (out,) = results([start_child("eight-devices", tokens, pairs)])
    assert out["devices"] == 8
    assert out["checked"] == {
        f"{layout},zigzag={z},next_token={n}": count
        for n in (False, True)
        for z in (False, True)
        for layout, count in (("rows", 2), ("columns", 2), ("blocks", 4), ("devices", 8))
    }


def test_jax_two_processes_on_a_mesh_across_both(tmp_path: Path) -> None:
    require("jax")
    path = write(tmp_path)
    port = free_port()
    outs = results([start_child("two-processes", path, port, pid, devices=4) for pid in (0, 1)])
    assert [o["process"] for o in outs] == [0, 1]
    width = T - 1
    for zigzag in (False, True):
        rows = [o[f"rows,zigzag={zigzag}"] for o in outs]
        columns = [o[f"columns,zigzag={zigzag}"] for o in outs]
        assert [r["rows"] for r in rows] == [[0, B // 2], [B // 2, B]]
        assert [r["columns"] for r in rows] == [[0, width]] * 2
        assert [c["rows"] for c in columns] == [[0, B]] * 2
        assert [c["columns"] for c in columns] == [[0, width // 2], [width // 2, width]]
        # zig-zag: process 0's chunks 0 and 3 are two ranges, process 1's chunks 1-2 one
        assert [c["ranges"] for c in columns] == ([2, 1] if zigzag else [1, 1])
        for r in rows:  # half the rows, every column: one label token per range
            assert r["bytes_read"] == expected_bytes(N, B // 2, width, r["ranges"], True)
        for c in columns:  # every row, half the columns
            assert c["bytes_read"] == expected_bytes(N, B, width // 2, c["ranges"], True)
        for pair in (rows, columns):
            assert [p["steps"] for p in pair] == [N, N]
            assert pair[0]["state"] == pair[1]["state"]


def test_tf_input_context_pipelines_are_data_parallel_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tf = require("tensorflow")
    from zerobatch_adapters.tensorflow import TFBatchDataset

    monkeypatch.setenv("RANK", "0")  # an input context wins over the environment
    monkeypatch.setenv("WORLD_SIZE", "4")
    path = write(tmp_path)
    whole = host_items(BatchNativeLoader(path, next_token=True, **ORDER))
    pipelines = []
    for pipeline in range(2):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2
        )
        with TFBatchDataset(path, input_context=ctx, next_token=True, **ORDER) as data:
            assert (data.rank, data.world_size) == (pipeline, 2)
            described = host_items(data.dataset())
            served = host_items(data)
        assert len(served) == len(described) == N
        for a, b in zip(served, described, strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)
        pipelines.append(served)
    for step, want in enumerate(whole):  # the pipelines' shares reassemble every global batch
        for field in range(2):
            got = np.concatenate([pipelines[p][step][field] for p in range(2)])
            np.testing.assert_array_equal(got, want[field])
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    explicit = TFBatchDataset(path, input_context=ctx, rank=0, world_size=1)
    assert (explicit.rank, explicit.world_size) == (0, 1)  # arguments win
    explicit.close()
    with pytest.raises(TypeError, match="InputContext"):
        TFBatchDataset(path, input_context=cast(Any, (0, 2)))
    with pytest.raises(ValueError, match="does not split evenly over world_size 3"):
        TFBatchDataset(path, input_context=tf.distribute.InputContext(3, 0))


def test_tf_mirrored_strategy_replicas_get_their_rows(tmp_path: Path) -> None:
    require("tensorflow")
    path = write(tmp_path)
    (out,) = results([start_child("mirrored", path, devices=1)])
    assert out == {"contexts": [[0, 1, 2]], "steps": N}


if __name__ == "__main__":
    role, argv = sys.argv[1], sys.argv[2:]
    if role == "eight-devices":
        print(json.dumps(eight_devices(*argv)))
    elif role == "two-processes":
        print(json.dumps(two_processes(*argv)))
    elif role == "mirrored":
        print(json.dumps(mirrored_replicas(*argv)))
    else:
        raise SystemExit(f"unknown role {role!r}")
