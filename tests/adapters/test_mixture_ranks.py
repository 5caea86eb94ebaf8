"""A mixture across real processes: ``torchrun`` (2 processes, gloo) and ``jax.distributed``
(2 processes of 4 CPU devices on loopback).

Every process reads a mixture file (a file and a sharded dataset, two phases) for its share
of each step; the shares, gathered, must rebuild exactly the global batch of the component
SPEC.md section 21 names for that step, and each process must name that component
(``last_component``); a ``DataLoader`` with worker processes reads it too, and the training
loop names each batch's component by its step (``component_at``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.adapters.test_distributed import child_env, free_port, results
from tests.adapters.test_torchrun import launch
from tests.helpers import records, require
from zerobatch_core import write_batch_file
from zerobatch_core.datasets.build import write_sharded_dataset

ROOT = Path(__file__).resolve().parents[2]
G, T, STEPS = 8, 17, 14  # next-token width 16
ORDER: dict[str, Any] = {"block_size": 2}


def write_mixture(tmp_path: Path) -> Path:
    write_batch_file(tmp_path / "web.batch", records(8 * 5, T), batch_size=8, seed=1)
    rows = records(4 * 15, T) + 70_000
    write_sharded_dataset(tmp_path / "code", [rows], batch_size=4, seq_len=T, shard_batches=4)
    doc = {
        "format": "zerobatch.mixture",
        "version": 1,
        "components": [
            {"name": "web", "source": "web.batch", "weight": 0.7},
            {"name": "code", "source": "code", "weight": 0.3},
        ],
        "schedule": [{"start": 6, "weights": {"web": 0.2, "code": 0.8}}],
        "global_batch_size": G,
        "steps": STEPS,
    }
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(doc))
    return path


def expected(path: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    """The core's global batches and components, one process reading everything."""
    from zerobatch_core import BatchNativeLoader

    loader = BatchNativeLoader(path, dtype="int32", next_token=True, **ORDER)
    names = [loader.component_at((0, k)) for k in range(STEPS)]  # type: ignore[attr-defined]
    return [(np.array(i), np.array(lab)) for i, lab in loader], names


# -- torchrun --------------------------------------------------------------------------------
def torch_worker(path: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from zerobatch_adapters.torch import TorchBatchDataset, TorchBatchLoader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    whole, names = expected(path)

    def gathered(t: torch.Tensor) -> np.ndarray:
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return np.concatenate([p.numpy() for p in parts])

    report: dict[str, Any] = {"rank": rank}
    loader = TorchBatchLoader(path, next_token=True, **ORDER)
    seen = []
    for step, (inputs, labels) in enumerate(loader):
        np.testing.assert_array_equal(gathered(inputs), whole[step][0])
        np.testing.assert_array_equal(gathered(labels), whole[step][1])
        seen.append(loader.last_component)
    report["loader"] = {"seen": seen, "state": loader.state_dict()["mixture"]}
    dataset = TorchBatchDataset(path, next_token=True, **ORDER)
    steps = 0
    for step, (inputs, _) in enumerate(DataLoader(dataset, batch_size=None, num_workers=2)):
        np.testing.assert_array_equal(gathered(inputs), whole[step][0])
        steps += 1
    report["workers"] = {
        "steps": steps,
        "names": [dataset.component_at(0, k) for k in range(steps)],
    }
    report["names"] = names
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def test_two_torchrun_processes_rebuild_each_steps_component_batch(tmp_path: Path) -> None:
    require("torch")
    path = write_mixture(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    launch(__file__, "torchrun", path, out)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    names = reports[0]["names"]
    assert names[6:].count("code") > names[:6].count("code")  # the second phase
    for r in reports:
        assert r["loader"]["seen"] == names
        assert r["workers"] == {"steps": STEPS, "names": names}
    assert reports[0]["loader"]["state"] == reports[1]["loader"]["state"]


# -- JAX -------------------------------------------------------------------------------------
def jax_process(path: str, port: str, pid: str) -> dict[str, Any]:
    import jax

    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=int(pid), initialization_timeout=60
    )
    from jax.experimental import multihost_utils
    from zerobatch_adapters.jax import JaxBatchIterator, data_context_sharding

    whole, names = expected(path)
    it = JaxBatchIterator(path, sharding=data_context_sharding(2), next_token=True, **ORDER)
    seen, steps = [], 0
    for step, (inputs, labels) in enumerate(it):
        for g, want in ((inputs, whole[step][0]), (labels, whole[step][1])):
            assert not g.is_fully_addressable
            got = multihost_utils.process_allgather(g, tiled=True)
            np.testing.assert_array_equal(got, want)
        seen.append(it.last_component)
        steps += 1
    report = {
        "process": jax.process_index(),
        "rows": [it.rows.start, it.rows.stop],
        "steps": steps,
        "seen": seen,
        "names": names,
    }
    it.close()
    jax.distributed.shutdown()
    return report


def test_two_jax_processes_rebuild_each_steps_component_batch(tmp_path: Path) -> None:
    require("jax")
    path = write_mixture(tmp_path)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "jax", str(path), str(port), str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(4),
            cwd=ROOT,
        )
        for pid in (0, 1)
    ]
    outs = results(procs)
    assert [o["process"] for o in outs] == [0, 1]
    assert [o["rows"] for o in outs] == [[0, G // 2], [G // 2, G]]
    for o in outs:
        assert o["steps"] == STEPS and o["seen"] == o["names"]


if __name__ == "__main__":
    role, argv = sys.argv[1], sys.argv[2:]
    if role == "torchrun":
        torch_worker(*argv)
    elif role == "jax":
        print(json.dumps(jax_process(*argv)))
    else:
        raise SystemExit(f"unknown role {role!r}")
