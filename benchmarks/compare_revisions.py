"""Old revision against the working tree, in one run: did a change make any loader slower?

    python benchmarks/compare_revisions.py --base e9be9dd
    python benchmarks/compare_revisions.py --base HEAD~3 --systems zb_torch_int64,zb_jax_8dev

The base revision is checked out in ``bench-output/revisions/<rev>`` (a detached git worktree)
and imported through a path of its own, so both trees run the same ``loader_bench.py`` systems
(each tree's own copy of the script, which knows that tree's API) on the same file, in fresh
processes, alternating old and new ``--rounds`` times. The machine's speed drifts by tens of
percent over minutes, so the ratio reported is the median of the per-round ``new / old``
ratios, each round's two runs taken back to back. The format is unchanged between revisions, so
one generated file serves both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / "bench-output" / "revisions"
PACKAGES = {  # import name -> directory in a checkout (pyproject.toml's package-dir)
    "zerobatch_core": "zerobatch_core",
    "zerobatch_spec": "spec",
    "zerobatch_conformance": "conformance",
    "zerobatch_adapters": "adapters",
}
ADAPTER_SYSTEMS = (
    "zb_uint32",
    "zb_int32",
    "zb_int64",
    "zb_torch_int32",
    "zb_torch_int64",
    "zb_torch_loader_w2",
    "zb_jax_8dev",
    "zb_tf_int64",
)
JAX_ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def checkout(rev: str) -> tuple[Path, Path]:
    """A worktree of ``rev`` and a directory whose entries import that worktree's packages."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = SCRATCH / sha
    if not tree.exists():
        SCRATCH.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), sha],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    shim = SCRATCH / f"{sha}-path"
    shim.mkdir(exist_ok=True)
    for name, folder in PACKAGES.items():
        link = shim / name
        if not link.exists():
            link.symlink_to(tree / folder, target_is_directory=True)
    return tree, shim


def run(script: Path, args: list[str], env_extra: dict[str, str]) -> dict[str, Any]:
    """One ``loader_bench.py --run`` child; its last JSON line."""
    env = dict(os.environ, PYTHONHASHSEED="0", TF_CPP_MIN_LOG_LEVEL="3", **env_extra)
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=script.parent.parent,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="the revision to compare against")
    ap.add_argument("--systems", default=",".join(ADAPTER_SYSTEMS), help="loader_bench systems")
    ap.add_argument("--modes", default="yield,consume")
    ap.add_argument("--rounds", type=int, default=3, help="old/new pairs per system and mode")
    ap.add_argument("--trials", type=int, default=3, help="passes per run (median taken)")
    ap.add_argument("--seconds", type=float, default=1.0, help="time cap of one pass")
    ap.add_argument("--records", type=int, default=100_000, help="records of 512 tokens")
    ap.add_argument("--json", type=Path, default=SCRATCH / "compare.json")
    a = ap.parse_args()

    base_tree, shim = checkout(a.base)
    new_script = REPO / "benchmarks" / "loader_bench.py"
    old_script = base_tree / "benchmarks" / "loader_bench.py"
    data = SCRATCH / "data"
    gen = run(
        new_script, ["--run", "gen_main", "--out", str(data), "--records", str(a.records)], {}
    )
    if "error" in gen:
        sys.exit(f"generating the file failed: {gen['error']}")
    common = ["--out", str(data), "--trials", str(a.trials), "--seconds", str(a.seconds)]
    rows: list[dict[str, Any]] = []
    print(f"{'system':<20} {'mode':<8} {'old tok/s':>10} {'new tok/s':>10} {'new/old':>8}")
    for system in a.systems.split(","):
        env = JAX_ENV if system.startswith("zb_jax") else {}
        for mode in a.modes.split(","):
            args = ["--run", system, "--mode", mode, *common]
            old_rates, new_rates, ratios = [], [], []
            for r in range(a.rounds):
                pair: dict[str, float] = {}
                for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    if side == "old":
                        res = run(old_script, args, {**env, "PYTHONPATH": str(shim)})
                    else:
                        res = run(new_script, args, env)
                    if "error" in res:
                        sys.exit(f"{system} {mode} {side}: {res['error']}")
                    pair[side] = float(res["tok_s"])
                old_rates.append(pair["old"])
                new_rates.append(pair["new"])
                ratios.append(pair["new"] / pair["old"])
            row = {
                "system": system,
                "mode": mode,
                "old_tok_s": statistics.median(old_rates),
                "new_tok_s": statistics.median(new_rates),
                "new_over_old": statistics.median(ratios),
                "ratios": ratios,
            }
            rows.append(row)
            old, new = row["old_tok_s"] / 1e9, row["new_tok_s"] / 1e9
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"{system:<20} {mode:<8} {old:9.3f}G {new:9.3f}G "
                f"{row['new_over_old']:7.2f}x  (rounds: {each})",
                flush=True,
            )
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"base": a.base, "rows": rows}, indent=1))
    print(f"written {a.json}")


if __name__ == "__main__":
    main()
