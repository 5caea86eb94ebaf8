"""How random is ZeroBatch's order? Measured beside a full random shuffle of the same records.

ZeroBatch shuffles twice: the writer places records in the spec's seeded permutation once, and
the loader serves blocks of ``block_size`` consecutive batches in a new order every epoch. Batch
composition is therefore fixed when the file is written; only the order of blocks changes. This
script computes, for the default benchmark corpus shape (100,000 records, batches of 32,
``block_size`` 256) over 64 epochs, for three orders:

- ``zerobatch``: the file's record permutation plus the loader's block order (what users get);
- ``block_only``: the loader's block order over a file written in source order (no record
  permutation: what block shuffling alone would give);
- ``random``: every epoch a fresh uniform permutation of all records, cut into batches.

Figures:

- ``consecutive_distance``: for each pair of consecutive batches, the mean distance in source
  order between a record of one and a record of the other, as a fraction of the corpus (a
  uniform shuffle gives about 1/3), averaged over steps;
- ``near_next``: fraction of steps whose next batch holds a record within ``batch_size``
  source positions of a record of this batch (neighbours served back to back);
- ``position_chi2``: each record's serving position over the epochs, binned into 8 equal
  parts; the chi-square statistic of that histogram against uniform, averaged over records
  (independent uniform positions give about 7, the degrees of freedom);
- ``position_lag1``: correlation of a record's position in one epoch with the next (0 ideal);
- ``batch_repeat``: of the record pairs that share a batch in one epoch, the fraction that
  share a batch again in the next (a uniform shuffle gives ``(B - 1) / (N - 1)``).

    python benchmarks/shuffle_quality.py [--records N] [--epochs E] [--block-size K] [--json F]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec.shuffle import DOMAIN_RECORDS, epoch_key, epoch_order, permute_array

I64 = npt.NDArray[np.int64]


def served_sources(
    kind: str, n: int, batch: int, block: int, seed: int, epoch: int, rng: np.random.Generator
) -> I64:
    """Source indices of the records in serving order for one epoch, ``[num_batches, batch]``."""
    nb = n // batch
    if kind == "random":
        return rng.permutation(n)[: nb * batch].reshape(nb, batch).astype(np.int64)
    order = epoch_order(nb, block, epoch_key(seed, epoch))
    positions = (order[:, None] * batch + np.arange(batch)[None, :]).astype(np.int64)
    if kind == "block_only":
        return positions
    # The writer puts source record permute(p) at file record p (SPEC: record permutation).
    return (
        permute_array(positions.ravel(), n, seed, DOMAIN_RECORDS)
        .astype(np.int64)
        .reshape(nb, batch)
    )


def consecutive(src: I64, n: int, batch: int) -> tuple[float, float]:
    a, b = src[:-1, :, None], src[1:, None, :]
    d = np.abs(a - b)
    return float(d.mean() / n), float((d.min(axis=(1, 2)) <= batch).mean())


def measure(kind: str, n: int, batch: int, block: int, epochs: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    nb = n // batch
    used = nb * batch
    position = np.full((n, epochs), -1, dtype=np.int64)
    batch_of = np.full((n, epochs), -1, dtype=np.int64)
    dist, near = [], []
    for e in range(epochs):
        src = served_sources(kind, n, batch, block, seed, e, rng)
        flat = src.ravel()
        position[flat, e] = np.arange(used) // batch
        batch_of[flat, e] = np.repeat(np.arange(nb), batch)
        if e < 4:
            d, m = consecutive(src, n, batch)
            dist.append(d)
            near.append(m)
    served = (position >= 0).all(axis=1)  # records dropped with the remainder never appear
    pos = position[served] / nb
    bins = 8
    counts = np.stack([(np.floor(pos * bins) == k).sum(axis=1) for k in range(bins)], axis=1)
    expected = epochs / bins
    chi2 = ((counts - expected) ** 2 / expected).sum(axis=1)
    lag = [float(np.corrcoef(pos[:, e], pos[:, e + 1])[0, 1]) for e in range(epochs - 1)]
    repeats = []
    for e in range(min(epochs - 1, 8)):
        pair = batch_of[served, e] * nb + batch_of[served, e + 1]
        _, c = np.unique(pair, return_counts=True)
        same_again = float((c * (c - 1) // 2).sum())
        total = nb * batch * (batch - 1) / 2
        repeats.append(same_again / total)
    return {
        "consecutive_distance": float(np.mean(dist)),
        "near_next": float(np.mean(near)),
        "position_chi2": float(chi2.mean()),
        "position_lag1": float(np.mean(lag)),
        "batch_repeat": float(np.mean(repeats)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    n, b = a.records, a.batch_size
    rows = {
        kind: measure(kind, n, b, a.block_size, a.epochs, a.seed)
        for kind in ("zerobatch", "block_only", "random")
    }
    print(
        f"{n} records, batches of {b}, block_size {a.block_size} "
        f"({-(-(n // b) // a.block_size)} blocks), {a.epochs} epochs, seed {a.seed}\n"
    )
    keys = list(rows["random"])
    print("| order | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for kind, r in rows.items():
        print(f"| {kind} | " + " | ".join(f"{r[k]:.4g}" for k in keys) + " |")
    print(
        f"\nexpected for a uniform shuffle: consecutive_distance ~0.333, position_chi2 ~{8 - 1}, "
        f"position_lag1 ~0, batch_repeat ~{(b - 1) / (n - 1):.2g}"
    )
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"config": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
