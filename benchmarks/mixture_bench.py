"""Mixtures: the per-batch cost of a 16-component blend against one dataset, and lazy opening.

One data set of ``--batches`` stored batches of ``[32, 512]`` uint32 (default 8,192: 512 MiB)
is written twice: as one sharded dataset, and as 16 datasets of ``batches / 16`` batches each
(the same tokens cut in 16). A child process (``_common.run_child``, warm page cache) then
serves ``--batches`` global steps from each (the first ``WARMUP`` untimed: they open the
components and shards), alternating the two ``--trials`` times so both see the same machine
state, in four cells:

- ``views``: uint32 batches (``BatchNativeLoader`` views), ``yield`` (the loop takes each batch
  and does nothing) and ``consume`` (it sums every token);
- ``int64``: int64 batches (converted ahead by the loader's chunk stage), yield and consume.

The blend's weights are ``1, 2, 3, 4`` repeated (SPEC.md section 21: a period of 40 steps), so
components are read unevenly, several epochs of the small-weight ones less than one. Reported:
microseconds per batch (median over trials) and the ratio mixture / single dataset, against
the memcpy rate of a 64 KiB batch measured in the same run; the target is 1.1x or less.

**Lazy opening**: the same 16 datasets on a real S3-compatible server on loopback
(``tests/s3server.py``, through its counting proxy): constructing a ``MixtureLoader`` with a
``global_batch_size`` must open one component (one ``manifest.json`` read); the requests are
counted after construction and after the first 4 steps, and the time to the first batch.

::

    python benchmarks/mixture_bench.py                     # 8,192 batches, ~2 min here
    python benchmarks/mixture_bench.py --batches 1024 --trials 3 --json mix.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import MIB, run_child, scratch_dir, warm

BATCH, SEQ, COMPONENTS = 32, 512, 16
WEIGHTS = [1 + i % 4 for i in range(COMPONENTS)]
WARMUP = 512
"""Steps served before the clock starts: every component and its first shards opened."""
CELLS = (
    ("views", "uint32", False),
    ("views", "uint32", True),
    ("int64", "int64", False),
    ("int64", "int64", True),
)


def _build(directory: Path, batches: int) -> dict[str, Any]:
    import numpy as np

    from zerobatch_core import write_sharded_dataset

    per = batches // COMPONENTS
    t0 = time.perf_counter()
    tokens = np.arange(batches * BATCH * SEQ, dtype=np.uint64).astype(np.uint32)
    rows = tokens.reshape(batches * BATCH, SEQ)
    write_sharded_dataset(
        directory / "single", [rows], batch_size=BATCH, seq_len=SEQ, shard_batches=64
    )
    for c in range(COMPONENTS):
        part = rows[c * per * BATCH : (c + 1) * per * BATCH]
        write_sharded_dataset(
            directory / f"c{c:02d}", [part], batch_size=BATCH, seq_len=SEQ, shard_batches=64, seed=c
        )
    return {"write_s": time.perf_counter() - t0}


def _mixture(directory: Path | str, lazy: bool = False) -> Any:
    from zerobatch_core import Mixture

    root = str(directory).rstrip("/")
    components = [(f"c{c:02d}", f"{root}/c{c:02d}", WEIGHTS[c]) for c in range(COMPONENTS)]
    return Mixture(components, global_batch_size=BATCH)


def _pass(loader: Any, warmup: int, steps: int, consume: bool) -> float:
    """Seconds per step over ``steps`` steps, after ``warmup`` untimed ones (which open the
    components and their first shards: that is opening, not serving)."""
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    n = 0
    t0 = time.perf_counter()
    if consume:
        for b in it:
            b.sum(dtype=b.dtype)
            n += 1
            if n == steps:
                break
    else:
        for _ in it:
            n += 1
            if n == steps:
                break
    elapsed = time.perf_counter() - t0
    assert n == steps, (n, steps)
    return elapsed / steps


def _serve(directory: Path, batches: int, trials: int) -> dict[str, Any]:
    import numpy as np

    from zerobatch_core import BatchNativeLoader

    for path in sorted(directory.rglob("*.batch")):
        warm(path)
    mix = _mixture(directory)
    out: dict[str, Any] = {}
    small, dst = np.zeros(BATCH * SEQ, np.uint32), np.empty(BATCH * SEQ, np.uint32)
    t0 = time.perf_counter()
    for _ in range(20_000):
        np.copyto(dst, small)
    out["memcpy_64KiB_us"] = (time.perf_counter() - t0) / 20_000 * 1e6
    for name, dtype, consume in CELLS:
        single_s, mixed_s = [], []
        for _ in range(trials):
            for kind in ("single", "mixture"):
                source = directory / "single" if kind == "single" else mix
                loader = BatchNativeLoader(source, dtype=dtype, verify="off")
                timed = _pass(loader, WARMUP, batches - WARMUP, consume)
                (single_s if kind == "single" else mixed_s).append(timed)
                loader.source.close()
        key = f"{name}_{'consume' if consume else 'yield'}"
        out[key] = {
            "single_us": statistics.median(single_s) * 1e6,
            "mixture_us": statistics.median(mixed_s) * 1e6,
        }
    return out


def _lazy(directory: Path) -> dict[str, Any]:
    from tests.remote.conftest import upload
    from tests.s3server import S3Proxy, S3Server, environment
    from zerobatch_core import BatchNativeLoader

    server = S3Server()
    try:
        server.create_bucket("mix")
        with environment(server.endpoint):
            for c in range(COMPONENTS):
                upload(directory / f"c{c:02d}", f"s3://mix/c{c:02d}")
        proxy = S3Proxy(server.endpoint)
        try:
            with environment(proxy.endpoint):
                before = proxy.counts["requests"]
                t0 = time.perf_counter()
                loader = BatchNativeLoader(_mixture("s3://mix"), verify="off")
                opened_s = time.perf_counter() - t0
                at_open = proxy.counts["requests"] - before
                opened = len(loader.source._opened)
                it = iter(loader)
                next(it)
                first_s = time.perf_counter() - t0
                for _ in range(3):
                    next(it)
                after = len(loader.source._opened)
                requests = proxy.counts["requests"] - before
                loader.source.close()
        finally:
            proxy.stop()
    finally:
        server.stop()
    return {
        "open_s": opened_s,
        "first_batch_s": first_s,
        "requests_at_open": at_open,
        "components_opened": opened,
        "components_after_4_steps": after,
        "requests_after_4_steps": requests,
    }


def child(payload: dict[str, Any]) -> dict[str, Any]:
    directory = Path(payload["dir"])
    if payload["role"] == "build":
        return _build(directory, int(payload["batches"]))
    if payload["role"] == "serve":
        return _serve(directory, int(payload["batches"]), int(payload["trials"]))
    if payload["role"] == "lazy":
        return _lazy(directory)
    raise ValueError(payload["role"])


def report(results: dict[str, Any]) -> list[str]:
    serve = results["serve"]
    lines = [
        f"memcpy of one 64 KiB batch: {serve['memcpy_64KiB_us']:.2f} us",
        "",
        f"{'cell':<16} {'single us/batch':>16} {'mixture us/batch':>17} {'ratio':>7}  target 1.1x",
    ]
    for name, _, consume in CELLS:
        key = f"{name}_{'consume' if consume else 'yield'}"
        r = serve[key]
        ratio = r["mixture_us"] / r["single_us"]
        verdict = "ok" if ratio <= 1.1 else "ABOVE"
        lines.append(
            f"{key:<16} {r['single_us']:>16.2f} {r['mixture_us']:>17.2f} {ratio:>6.2f}x  {verdict}"
        )
    lazy = results.get("lazy")
    if lazy:
        lines += [
            "",
            f"16 remote components: open {lazy['open_s'] * 1e3:.1f} ms, "
            f"{lazy['requests_at_open']} requests, {lazy['components_opened']} component opened; "
            f"after 4 steps {lazy['components_after_4_steps']} opened, "
            f"{lazy['requests_after_4_steps']} requests; first batch at "
            f"{lazy['first_batch_s'] * 1e3:.1f} ms",
        ]
    return lines


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8192, help="stored batches in all")
    parser.add_argument("--trials", type=int, default=5, help="passes of each source per cell")
    parser.add_argument("--no-remote", action="store_true", help="skip the lazy-opening probe")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if args.batches % (COMPONENTS * 64):
        parser.error(f"--batches must be a multiple of {COMPONENTS * 64}")
    script = Path(__file__).resolve()
    work = scratch_dir("mixture-bench-")
    results: dict[str, Any] = {"argv": sys.argv[1:], "load_start": os.getloadavg()[0]}
    started = time.perf_counter()
    size = args.batches * BATCH * SEQ * 4 / MIB
    print(
        f"load average {results['load_start']:.2f}; {args.batches:,} batches ({size:.0f} MiB) twice"
    )
    try:
        results["build"] = run_child(
            script, {"role": "build", "dir": str(work), "batches": args.batches}
        ).report
        payload = {
            "role": "serve",
            "dir": str(work),
            "batches": args.batches,
            "trials": args.trials,
        }
        results["serve"] = run_child(script, payload).report
        if not args.no_remote:
            results["lazy"] = run_child(script, {"role": "lazy", "dir": str(work)}).report
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_end"] = os.getloadavg()[0]
    results["seconds"] = time.perf_counter() - started
    print("\n".join(report(results)))
    print(
        f"\nload average {results['load_start']:.2f} at the start, {results['load_end']:.2f} at "
        f"the end; {results['seconds']:.0f} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
