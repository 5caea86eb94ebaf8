"""The two shuffles that make LLMBATCH files and batch orders reproducible in any language.

Both are built on one keyed bijection over ``[0, n)``: a 6-round balanced Feistel network over
``2h`` bits (the smallest even width with ``4**h >= n``) whose round function is the SplitMix64
finalizer, made a bijection on ``[0, n)`` by cycle-walking. It maps one index in O(1) memory, is
invertible, and NumPy evaluates it over whole index arrays with wrapping uint64 arithmetic.

* Record permutation (writer): output record position ``p`` holds input record
  ``permute(p, n_records, seed, DOMAIN_RECORDS)``.
* Block order (loader): with ``n_blocks = ceil(num_batches / block_size)``, the ``k``-th block
  served in an epoch is ``permute(k, n_blocks, seed ^ epoch, DOMAIN_BLOCKS)``; batches inside a
  block are served in file order.

Every function has a pure-integer scalar form (the reference, mirrored in ``SPEC.md``) and a
vectorised ``*_array`` form that a test proves equal to it.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

MASK64: Final = 2**64 - 1
GOLDEN_GAMMA: Final = 0x9E3779B97F4A7C15
MIX_MUL_1: Final = 0xBF58476D1CE4E5B9
MIX_MUL_2: Final = 0x94D049BB133111EB
ROUNDS: Final = 6

DOMAIN_RECORDS: Final = 1
"""Domain tag of the writer's record permutation."""
DOMAIN_BLOCKS: Final = 2
"""Domain tag of the loader's block order."""

IndexArray = npt.NDArray[np.uint64]


def mix64(z: int) -> int:
    """SplitMix64's finalizer on a 64-bit integer."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX_MUL_1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_MUL_2) & MASK64
    return z ^ (z >> 31)


def round_keys(key: int, domain: int) -> list[int]:
    """The six round keys: ``mix64(key + GOLDEN_GAMMA * (8 * domain + j + 1))`` for ``j < 6``."""
    if not 0 <= key <= MASK64:
        raise ValueError(f"shuffle key must be in [0, 2**64), got {key}")
    return [mix64((key + GOLDEN_GAMMA * (8 * domain + j + 1)) & MASK64) for j in range(ROUNDS)]


def half_bits(n: int) -> int:
    """Half-width ``h`` of the Feistel domain: the smallest ``h >= 1`` with ``4**h >= n``."""
    h = 1
    while 4**h < n:
        h += 1
    return h


def _feistel(x: int, h: int, keys: list[int]) -> int:
    mask = (1 << h) - 1
    left, right = x >> h, x & mask
    for k in keys:
        left, right = right, left ^ (mix64(right ^ k) & mask)
    return (left << h) | right


def _feistel_inverse(x: int, h: int, keys: list[int]) -> int:
    mask = (1 << h) - 1
    left, right = x >> h, x & mask
    for k in reversed(keys):
        left, right = right ^ (mix64(left ^ k) & mask), left
    return (left << h) | right


def _check_index(i: int, n: int) -> None:
    if not 0 <= i < n:
        raise IndexError(f"index {i} is outside [0, {n})")


def _walk(i: int, n: int, key: int, domain: int, inverse: bool) -> int:
    """Cycle-walk the Feistel network (or its inverse) from ``i`` until it lands in ``[0, n)``."""
    _check_index(i, n)
    if n == 1:
        return 0
    h, keys = half_bits(n), round_keys(key, domain)
    step = _feistel_inverse if inverse else _feistel
    x = step(i, h, keys)
    while x >= n:
        x = step(x, h, keys)
    return x


def permute(i: int, n: int, key: int, domain: int) -> int:
    """Image of ``i`` under the keyed bijection of ``[0, n)``."""
    return _walk(i, n, key, domain, inverse=False)


def unpermute(p: int, n: int, key: int, domain: int) -> int:
    """Inverse of ``permute``: the ``i`` with ``permute(i, n, key, domain) == p``."""
    return _walk(p, n, key, domain, inverse=True)


def _mix64_inplace(z: IndexArray, scratch: IndexArray) -> None:
    """``z = mix64(z)`` elementwise, in place (``scratch``: same shape, overwritten)."""
    np.right_shift(z, np.uint64(30), out=scratch)
    z ^= scratch
    z *= np.uint64(MIX_MUL_1)
    np.right_shift(z, np.uint64(27), out=scratch)
    z ^= scratch
    z *= np.uint64(MIX_MUL_2)
    np.right_shift(z, np.uint64(31), out=scratch)
    z ^= scratch


def mix64_array(z: npt.ArrayLike) -> IndexArray:
    """``mix64`` applied elementwise (uint64 result, wrapping arithmetic)."""
    out = np.array(z, dtype=np.uint64, copy=True)
    with np.errstate(over="ignore"):
        _mix64_inplace(out, np.empty_like(out))
    return out


def _feistel_array(x: IndexArray, h: int, keys: list[int], inverse: bool) -> IndexArray:
    mask = np.uint64((1 << h) - 1)
    shift = np.uint64(h)
    left, right = x >> shift, x & mask
    f, scratch = np.empty_like(x), np.empty_like(x)
    for k in reversed(keys) if inverse else keys:
        kk = np.uint64(k)
        src, dst = (left, right) if inverse else (right, left)
        np.bitwise_xor(src, kk, out=f)
        _mix64_inplace(f, scratch)
        f &= mask
        dst ^= f  # the round: one half absorbs the keyed mix of the other
        left, right = right, left
    left <<= shift
    left |= right
    return left


def _walk_array(indices: npt.ArrayLike, n: int, key: int, domain: int, inverse: bool) -> IndexArray:
    x = np.array(indices, dtype=np.uint64, copy=True)
    if x.size and int(x.max()) >= n:
        raise IndexError(f"index {int(x.max())} is outside [0, {n})")
    if n <= 1:
        return x
    h, keys = half_bits(n), round_keys(key, domain)
    with np.errstate(over="ignore"):
        x = _feistel_array(x, h, keys, inverse)
        out = x >= np.uint64(n)
        while out.any():
            x[out] = _feistel_array(x[out], h, keys, inverse)
            out = x >= np.uint64(n)
    return x


def permute_array(indices: npt.ArrayLike, n: int, key: int, domain: int) -> IndexArray:
    """``permute`` applied elementwise to an array of indices (uint64 result)."""
    return _walk_array(indices, n, key, domain, inverse=False)


def unpermute_array(indices: npt.ArrayLike, n: int, key: int, domain: int) -> IndexArray:
    """``unpermute`` applied elementwise to an array of indices (uint64 result)."""
    return _walk_array(indices, n, key, domain, inverse=True)


def record_source(position: int, total_records: int, seed: int) -> int:
    """Input record index that the writer places at output record ``position``."""
    return permute(position, total_records, seed, DOMAIN_RECORDS)


def epoch_key(seed: int, epoch: int) -> int:
    """Key of an epoch's block order: ``seed XOR epoch`` (both in ``[0, 2**64)``)."""
    for name, value in (("seed", seed), ("epoch", epoch)):
        if not 0 <= value <= MASK64:
            raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return seed ^ epoch


def num_blocks(num_batches: int, block_size: int) -> int:
    """Blocks per epoch: ``ceil(num_batches / block_size)``; the last may be short."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    return -(-num_batches // block_size)


def block_at(k: int, num_batches: int, block_size: int, key: int) -> int:
    """Block id served ``k``-th in an epoch keyed by ``key``."""
    return permute(k, num_blocks(num_batches, block_size), key, DOMAIN_BLOCKS)


def batch_at(step: int, num_batches: int, block_size: int, key: int) -> int:
    """Batch index served at position ``step`` of an epoch, in O(1) time and memory.

    Blocks are full except the last one (id ``n_blocks - 1``), which can sit anywhere in the
    order; its order position ``q`` is found with ``unpermute`` so that no prefix sums are needed.
    """
    _check_index(step, num_batches)
    nb = num_blocks(num_batches, block_size)
    short = num_batches - (nb - 1) * block_size
    q = unpermute(nb - 1, nb, key, DOMAIN_BLOCKS)
    if step < q * block_size:
        k, offset = divmod(step, block_size)
    elif step < q * block_size + short:
        k, offset = q, step - q * block_size
    else:
        k = (step - short) // block_size + 1
        offset = step - ((k - 1) * block_size + short)
    return block_at(k, num_batches, block_size, key) * block_size + offset


def epoch_order(num_batches: int, block_size: int, key: int) -> npt.NDArray[np.int64]:
    """The whole epoch's batch order (O(num_batches) memory; for tests and vectors)."""
    nb = num_blocks(num_batches, block_size)
    blocks = permute_array(np.arange(nb, dtype=np.uint64), nb, key, DOMAIN_BLOCKS)
    parts = [
        np.arange(b * block_size, min((b + 1) * block_size, num_batches), dtype=np.int64)
        for b in blocks.tolist()
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
