"""Serving order of an epoch: which batch comes at each step, with no I/O involved.

Kept apart from reading so that the loader, the framework adapters and the conformance probe
all share one implementation of the block order pinned in ``SPEC.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from zerobatch_spec import block_at, epoch_key, num_blocks, unpermute
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
        for span in self.spans(epoch, start):
            yield from range(span.start, span.stop)

    def epoch_order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The whole epoch as an array (O(num_batches) memory)."""
        return np.fromiter(self.indices(epoch), dtype=np.int64, count=self.num_batches)
