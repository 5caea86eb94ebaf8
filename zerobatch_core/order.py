"""Serving order of an epoch: which batch comes at each step, with no I/O involved.

Kept apart from reading so that the loader, the framework adapters and the conformance probe
all share one implementation of the block order pinned in ``SPEC.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from zerobatch_spec import block_at, epoch_key, num_blocks, permute_array, unpermute
from zerobatch_spec.dataset import DOMAIN_DATASET_BLOCKS, dataset_blocks, dataset_epoch_key
from zerobatch_spec.shuffle import DOMAIN_BLOCKS


@dataclass(frozen=True)
class Span:
    """A run of consecutive batches ``start..stop`` served in file order."""

    start: int
    stop: int


@dataclass(frozen=True)
class BlockOrder:
    """Block-shuffled (or sequential) order of ``num_batches`` batches for any epoch."""

    num_batches: int
    block_size: int
    seed: int
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.num_batches < 0:
            raise ValueError(f"num_batches must be non-negative, got {self.num_batches}")

    def spans(self, epoch: int, start: int = 0) -> Iterator[Span]:
        """The epoch's blocks in serving order, from serving position ``start`` on.

        The first span is cut so that it begins exactly at ``start``. Each block costs one
        O(1) permutation evaluation; nothing proportional to the epoch is materialised.
        """
        n, bs = self.num_batches, self.block_size
        if start >= n:
            return
        if not self.shuffle:
            for first in range(start - start % bs, n, bs):
                yield Span(max(first, start), min(first + bs, n))
            return
        key = epoch_key(self.seed, epoch)
        nb = num_blocks(n, bs)
        short = n - (nb - 1) * bs
        short_pos = unpermute(nb - 1, nb, key, DOMAIN_BLOCKS)
        # Serving position of order slot k: k * bs, less (bs - short) once the short block passed.
        k = start // bs if start < short_pos * bs + short else (start - short) // bs + 1
        begin = k * bs if k <= short_pos else k * bs - (bs - short)
        for slot in range(k, nb):
            length = short if slot == short_pos else bs
            first = block_at(slot, n, bs, key) * bs
            yield Span(first + max(0, start - begin), first + length)
            begin += length

    def indices(self, epoch: int, start: int = 0) -> Iterator[int]:
        """Batch indices of ``epoch`` in serving order from position ``start`` on."""
        return _indices(self.spans(epoch, start))

    def epoch_order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The whole epoch as an array (O(num_batches) memory)."""
        return np.fromiter(self.indices(epoch), dtype=np.int64, count=self.num_batches)


def _indices(spans: Iterator[Span]) -> Iterator[int]:
    for span in spans:
        yield from range(span.start, span.stop)


@dataclass(frozen=True)
class ShardedBlockOrder:
    """The dataset order (``SPEC.md`` section 14): blocks that never cross a shard's end.

    Shard ``i``'s slots are split into blocks of ``block_size`` (its last block may be short),
    the blocks of all shards are permuted together with ``dataset_epoch_key(seed, epoch)``, and
    each block is served in slot order, so reads stay sequential within one shard. Finding
    where a serving position falls takes the epoch's block lengths in serving order: one array
    of ``ceil(slots / block_size)``-ish entries per epoch, computed once and kept for the last
    epoch asked for, so per-batch cost does not depend on the number of shards.
    """

    shard_batches: tuple[int, ...]
    block_size: int
    seed: int
    shuffle: bool = True
    _cache: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")

    @property
    def num_batches(self) -> int:
        """Slots over all shards."""
        return sum(self.shard_batches)

    def _served(self, epoch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(first slot, end position)`` of each block in serving order for ``epoch``."""
        key = epoch if self.shuffle else -1
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        first, length = dataset_blocks(self.shard_batches, self.block_size)
        if self.shuffle and first.size:
            k = dataset_epoch_key(self.seed, epoch)
            order = permute_array(np.arange(first.size), first.size, k, DOMAIN_DATASET_BLOCKS)
            first, length = first[order.astype(np.int64)], length[order.astype(np.int64)]
        result = (first, np.cumsum(length))
        self._cache.clear()  # one epoch at a time: bounded memory
        self._cache[key] = result
        return result

    def spans(self, epoch: int, start: int = 0) -> Iterator[Span]:
        """The epoch's blocks in serving order from serving position ``start`` on."""
        if start >= self.num_batches:
            return
        first, ends = self._served(epoch)
        slot = int(np.searchsorted(ends, start, side="right"))
        begin = int(ends[slot - 1]) if slot else 0
        for k in range(slot, first.size):
            f, end = int(first[k]), int(ends[k])
            yield Span(f + max(0, start - begin), f + end - begin)
            begin = end

    def indices(self, epoch: int, start: int = 0) -> Iterator[int]:
        """Slot indices of ``epoch`` in serving order from position ``start`` on."""
        return _indices(self.spans(epoch, start))

    def epoch_order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The whole epoch as an array (O(num_batches) memory)."""
        return np.fromiter(self.indices(epoch), dtype=np.int64, count=self.num_batches)


Order = BlockOrder | ShardedBlockOrder
"""An epoch order over a file's batches or a dataset's slots: both serve ``spans``."""


def sharded_order(
    shard_batches: Sequence[int], block_size: int, seed: int, shuffle: bool = True
) -> ShardedBlockOrder:
    """The dataset order of shards with these slot counts."""
    return ShardedBlockOrder(tuple(int(n) for n in shard_batches), block_size, seed, shuffle)
