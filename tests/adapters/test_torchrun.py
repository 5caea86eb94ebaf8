"""Real ``torch.distributed``: two processes on loopback, launched by ``torchrun``, gloo backend.

The test starts ``torchrun --nproc_per_node 2`` on this file; each process (``worker``) builds
``TorchBatchLoader`` and ``TorchBatchDataset`` (in a ``DataLoader`` with worker processes) from
what ``torch.distributed`` says, consumes its slices of the same global batches, and
``all_gather``s them: the gathered slices must reassemble exactly the core loader's global
batches, step by step. Coordinates come from the default process group (data parallel: rows),
from a 1 x 2 ``DeviceMesh`` ``("dp", "cp")`` (context parallel: token chunks, zig-zag on and
off) and from a ``("tp",)`` mesh (replicas: identical data). Each process also reports its
coordinates, bytes read and final state, which the test compares across processes.

``make test`` runs this module in the PyTorch-only pytest process (``TORCH_TESTS``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers import records, require
from zerobatch_core import write_batch_file

ROOT = Path(__file__).resolve().parents[2]
B, T, N = 8, 17, 5  # next-token width 16: 2 x 2 zig-zag chunks of 4 tokens
ORDER: dict[str, Any] = {"block_size": 2, "seed": 3}
TOKEN_BYTES = 4


# -- the worker: runs in each torchrun process ------------------------------------------------
def worker(path: str, out_dir: str) -> None:
    """One rank: every layout below, each step's slices gathered and checked against the core."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.data import DataLoader
    from zerobatch_adapters.torch import TorchBatchDataset, TorchBatchLoader

    from zerobatch_core import BatchNativeLoader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2 and os.environ["RANK"] == str(rank)
    whole = [
        (np.array(i), np.array(lab))
        for i, lab in BatchNativeLoader(path, dtype="int32", next_token=True, **ORDER)
    ]
    report: dict[str, Any] = {"rank": rank}

    def gathered(t: torch.Tensor) -> list[np.ndarray]:
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return [p.numpy() for p in parts]

    def check(name: str, data: Any, items: Any, join: Any) -> None:
        """Gather each step's slices from every rank; ``join`` must rebuild the global batch."""
        steps = 0
        for step, batch in enumerate(items):
            for field, (tensor, want) in enumerate(zip(batch, whole[step], strict=True)):
                got = join(gathered(tensor))
                np.testing.assert_array_equal(got, want, err_msg=f"{name} step {step} {field}")
            steps += 1
        assert steps == len(whole), (name, steps)
        s = data.loader.slicing
        report[name] = {
            "slicing": [s.dp_rank, s.dp_size, s.cp_rank, s.cp_size, s.cp_count, s.zigzag],
            "state": data.state_dict(),
            "bytes_read": data.loader.bytes_read,
        }

    def rows(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts, axis=0)

    def columns(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts, axis=1)

    def zigzag_columns(parts: list[np.ndarray]) -> np.ndarray:
        """Rank c holds chunks c and 2C - 1 - c: put the 2C chunks back in token order."""
        c = len(parts)
        chunks: list[Any] = [None] * (2 * c)
        for k, part in enumerate(parts):
            chunks[k], chunks[2 * c - 1 - k] = np.split(part, 2, axis=1)
        return np.concatenate(chunks, axis=1)

    def identical(parts: list[np.ndarray]) -> np.ndarray:
        for part in parts[1:]:
            np.testing.assert_array_equal(part, parts[0])
        return parts[0]

    # 1. The default process group: data parallelism over the two processes.
    loader = TorchBatchLoader(path, next_token=True, **ORDER)
    check("group_loader", loader, loader, rows)
    dataset = TorchBatchDataset(path, next_token=True, **ORDER)
    workers = DataLoader(dataset, batch_size=None, num_workers=2)
    check("group_dataset", dataset, workers, rows)

    # 2. A 1 x 2 ("dp", "cp") mesh: one data-parallel rank, two context-parallel ranks.
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "cp"))
    for zigzag, join in ((False, columns), (True, zigzag_columns)):
        tag = "zigzag" if zigzag else "chunks"
        kw: dict[str, Any] = {"next_token": True, "zigzag": zigzag, **ORDER}
        cp_loader = TorchBatchLoader(path, device_mesh=mesh, **kw)
        check(f"mesh_{tag}_loader", cp_loader, cp_loader, join)
        cp_data = TorchBatchDataset(path, device_mesh=mesh, **kw)
        check(f"mesh_{tag}_dataset", cp_data, DataLoader(cp_data, batch_size=None), join)

    # 3. A ("tp",) mesh: tensor-parallel replicas read identical, whole batches.
    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    replica = TorchBatchLoader(path, next_token=True, device_mesh=tp, **ORDER)
    check("tp_loader", replica, replica, identical)

    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


# -- the test: launches torchrun ----------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def torchrun() -> list[str]:
    """The ``torchrun`` of this interpreter's environment (its console script)."""
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def launch(script: str, *args: object) -> None:
    """Run ``script args`` in two processes under ``torchrun`` (loopback, gloo); fail the test
    with their output if either fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [
        *torchrun(),
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "--max_restarts=0",
        script,
        *map(str, args),
    ]
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240, check=False
    )
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_two_torchrun_processes_reassemble_every_global_batch(tmp_path: Path) -> None:
    require("torch")
    path = tmp_path / "ranks.batch"
    write_batch_file(path, records(B * N, T), batch_size=B, seed=11)
    out = tmp_path / "out"
    out.mkdir()
    launch(__file__, path, out)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in reports] == [0, 1]
    per_rows = (B // 2) * T * TOKEN_BYTES  # half the rows; 16 inputs + 1 label token each
    chunk = B * (16 // 2 + 1) * TOKEN_BYTES  # all rows; one contiguous chunk and its label
    expected = {
        "group_loader": ([[0, 2, 0, 1, 1, False], [1, 2, 0, 1, 1, False]], [per_rows] * 2),
        "mesh_chunks_loader": ([[0, 1, 0, 2, 1, False], [0, 1, 1, 2, 1, False]], [chunk] * 2),
        # zig-zag: rank 0's chunks 0 and 3 are two ranges (a label token each), rank 1's 1-2 one
        "mesh_zigzag_loader": (
            [[0, 1, 0, 2, 1, True], [0, 1, 1, 2, 1, True]],
            [chunk + B * TOKEN_BYTES, chunk],
        ),
        "tp_loader": ([[0, 1, 0, 1, 1, False]] * 2, [B * T * TOKEN_BYTES] * 2),
    }
    for name, (slicings, step_bytes) in expected.items():
        assert [r[name]["slicing"] for r in reports] == slicings, name
        assert [r[name]["bytes_read"] for r in reports] == [N * b for b in step_bytes], name
    for name in ("group_dataset", "mesh_chunks_dataset", "mesh_zigzag_dataset"):
        loader_name = name.replace("dataset", "loader")
        assert [r[name]["slicing"] for r in reports] == expected[loader_name][0], name
    for name in (n for n in reports[0] if n != "rank"):
        states = [r[name]["state"] for r in reports]
        assert states[0] == states[1], name  # every rank at the same cursor
        if name.endswith("loader"):  # an epoch served: the next one starts
            assert (states[0]["epoch"], states[0]["step"]) == (1, 0), name


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
