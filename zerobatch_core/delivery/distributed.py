"""Data-parallel splitting shared by every adapter: which rows of each batch a rank owns.

Every rank walks the same batch order and takes its own contiguous rows of each batch, so one
step of all ranks together is exactly one batch of the file. Because the cursor counts steps,
not rows, a checkpoint taken with one world size resumes with another.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..arguments import int_arg


def rank_rows(batch_size: int, rank: int, world_size: int) -> slice:
    """Rows ``rank`` owns in a ``batch_size``-row batch split over ``world_size`` ranks."""
    w = int_arg("world_size", world_size, 1)
    r = int_arg("rank", rank, 0)
    if r >= w:
        raise ValueError(f"rank {r} is outside world_size {w}")
    if batch_size % w:
        raise ValueError(
            f"batch_size {batch_size} does not split evenly over world_size {w}: every rank "
            f"must get the same number of rows (write the file with a batch size divisible by {w})"
        )
    per = batch_size // w
    return slice(r * per, (r + 1) * per)


def env_rank_world(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` from the environment (as set by ``torchrun``), if both are set."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except ValueError:
        raise ValueError(
            f"RANK={env['RANK']!r} and WORLD_SIZE={env['WORLD_SIZE']!r} must be integers"
        ) from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}")
    return rank, world


def resolve_rank_world(
    rank: int | None,
    world_size: int | None,
    detected: tuple[int, int] | None = None,
    *,
    names: tuple[str, str] = ("rank", "world_size"),
    environment: bool = True,
) -> tuple[int, int]:
    """Explicit arguments first, then ``detected`` (a framework's own), then the environment
    (``RANK``/``WORLD_SIZE``, when ``environment``), else ``(0, 1)``."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"give both {names[0]} and {names[1]}, or neither")
    if rank is not None and world_size is not None:
        return rank, world_size
    return detected or (env_rank_world() if environment else None) or (0, 1)
