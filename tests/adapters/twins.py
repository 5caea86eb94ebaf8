"""The same tokens stored twice, as a uint32 file (dtype 0) and a uint16 file (dtype 1).

Every adapter must serve a uint16 file's batches exactly as it serves the uint32 file of the
same tokens: the same values, dtypes, shapes and order. The tokens span the whole uint16 range,
0 and 65,535 included, and half of them are 32,768 or more, so a sign or width mistake anywhere
(an int16 reading, a narrowing) changes values the tests compare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_NAMES, DTYPE_UINT16, DTYPE_UINT32, token_max

from tests.helpers import records
from zerobatch_core import write_batch_file

WIDE, NARROW = DTYPE_NAMES[DTYPE_UINT32], DTYPE_NAMES[DTYPE_UINT16]
"""``"uint32"`` and ``"uint16"``: the writers' names of the two token dtypes."""

NARROW_MAX = token_max(DTYPE_UINT16)
"""The largest uint16 token, 65,535."""


def narrow_tokens(n: int, seq_len: int) -> npt.NDArray[np.uint32]:
    """``[n, seq_len]`` ids spread over the whole uint16 range, held as uint32.

    Each token is its ``records`` number times an odd constant modulo 2**16, a bijection: up to
    65,536 tokens, no two are equal (so every row is unique). The first token is 0, and the
    last is set to 65,535.
    """
    numbered = records(n, seq_len).astype(np.int64)
    tokens = (numbered * 40_503) % (NARROW_MAX + 1)
    tokens[-1, -1] = NARROW_MAX
    return tokens.astype(np.uint32)


def write_twins(
    directory: Path,
    n: int = 4 * 13,
    seq_len: int = 8,
    batch_size: int = 4,
    seed: int = 7,
    tokens: npt.NDArray[np.integer] | None = None,
) -> dict[str, Path]:
    """``{"uint32": path, "uint16": path}``: ``tokens`` (default ``narrow_tokens``) written
    with the same batch size and seed in each token dtype."""
    data = narrow_tokens(n, seq_len) if tokens is None else tokens
    out = {}
    for dtype in (WIDE, NARROW):
        path = directory / f"{dtype}.batch"
        write_batch_file(path, data, batch_size, seed=seed, dtype=dtype)
        out[dtype] = path
    return out
