"""Serving order of an epoch: which batch comes at each step, with no I/O involved.

Kept apart from reading so that the loader, the framework adapters and the conformance probe
all share one implementation of the block order pinned in ``SPEC.md``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from zerobatch_spec import block_at, epoch_key, num_blocks, permute_array, unpermute
from zerobatch_spec.dataset import DOMAIN_DATASET_BLOCKS, dataset_epoch_key
from zerobatch_spec.shuffle import DOMAIN_BLOCKS, unpermute_array


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


SPAN_CHUNK_FIRST = 512
SPAN_CHUNK_MAX = 8192
"""Order slots a ``ShardedBlockOrder`` maps to blocks at once: ``SPAN_CHUNK_FIRST`` first (so
starting a pass, or resuming one, costs about a millisecond), then ``SPAN_CHUNK_MAX`` at a
time (each ``permute_array`` call has a fixed cost, which larger chunks spread thinner)."""


@dataclass(frozen=True)
class _Layout:
    """The blocks of a list of shards, as per-shard arrays (``O(shards)`` memory).

    Shard ``i`` has ``n_i`` slots from dataset slot ``slots[i]`` on and ``ceil(n_i / size)``
    blocks from block id ``blocks[i]`` on; only its last block may be short, by
    ``size - n_i mod size`` slots: ``short_ids`` lists those short blocks and ``deficits`` how
    many slots each lacks.
    """

    size: int
    counts: npt.NDArray[np.int64]
    slots: npt.NDArray[np.int64]
    blocks: npt.NDArray[np.int64]
    short_ids: npt.NDArray[np.uint64]
    deficits: npt.NDArray[np.int64]

    @classmethod
    def of(cls, shard_batches: npt.NDArray[np.int64], block_size: int) -> _Layout:
        counts = np.asarray(shard_batches, dtype=np.int64)
        # As in ``dataset_blocks``: a block never outgrows its shard, so a block size beyond
        # the largest shard acts like it (and stays an int64).
        size = min(block_size, max(1, int(counts.max(initial=0))))
        per_shard = -(-counts // size)
        blocks = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)
        slots = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rest = counts % size
        short = np.flatnonzero(rest)
        return cls(
            size,
            counts,
            slots,
            blocks,
            (blocks[short + 1] - 1).astype(np.uint64),
            (size - rest[short]).astype(np.int64),
        )

    @property
    def num_blocks(self) -> int:
        return int(self.blocks[-1])


@dataclass(frozen=True, eq=False)
class ShardedBlockOrder:
    """The dataset order (``SPEC.md`` section 14): blocks that never cross a shard's end.

    Shard ``i``'s slots are split into blocks of ``block_size`` (its last block may be short),
    the blocks of all shards are permuted together with ``dataset_epoch_key(seed, epoch)``, and
    each block is served in slot order, so reads stay sequential within one shard.

    Nothing proportional to the number of slots or blocks is ever built: a manifest's slot
    counts are only claims until its shards are opened, so memory and work follow the number
    of shards (the manifest's own length) and the blocks actually served. Every block is full
    but the short last block of some shards; the serving position of order slot ``k`` is
    ``k * block_size`` less the slots missing from the short blocks served before it, found
    from those blocks' order slots (``unpermute`` of each, computed once per epoch). Blocks
    are mapped to their slots a chunk of order slots at a time (``permute_array``), so the
    per-batch cost depends on neither the number of shards nor the number of slots.
    """

    shard_batches: npt.NDArray[np.int64]
    """Each shard's slot count, in dataset order (read only)."""
    block_size: int
    seed: int
    shuffle: bool = True
    _layout: _Layout | None = field(default=None, compare=False, repr=False)
    _cache: dict[int | None, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        counts = np.array(self.shard_batches, dtype=np.int64)  # the order's own copy
        counts.flags.writeable = False
        object.__setattr__(self, "shard_batches", counts)
        object.__setattr__(self, "_layout", _Layout.of(counts, self.block_size))

    def __repr__(self) -> str:
        n = self.shard_batches.shape[0]
        counts = str(tuple(self.shard_batches.tolist())) if n <= 16 else f"<{n} shards>"
        return (
            f"ShardedBlockOrder(shard_batches={counts}, block_size={self.block_size}, "
            f"seed={self.seed}, shuffle={self.shuffle})"
        )

    def _identity(self) -> tuple[bytes, int, int, bool]:
        return (self.shard_batches.tobytes(), self.block_size, self.seed, self.shuffle)

    def __eq__(self, other: object) -> bool:
        """Orders are equal when they serve the same slots: same shards, block size, seed and
        shuffling (whatever each has cached)."""
        if not isinstance(other, ShardedBlockOrder):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    @property
    def num_batches(self) -> int:
        """Slots over all shards."""
        return int(self._blocks().slots[-1])

    def _blocks(self) -> _Layout:
        assert self._layout is not None  # set by __post_init__
        return self._layout

    def _key(self, epoch: int) -> int:
        return dataset_epoch_key(self.seed, epoch)

    def _short(self, epoch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(order slots, cumulative deficits)`` of the epoch's short blocks, by order slot:
        ``deficits[j]`` slots are missing from the short blocks served before ``slots[j]``
        (one entry per shard at most, kept for the last epoch asked for)."""
        tag = epoch if self.shuffle else None  # unshuffled: the same for every epoch
        cached = self._cache.get(tag)
        if cached is not None:
            return cached
        layout = self._blocks()
        ids = layout.short_ids
        if self.shuffle and ids.size:
            slots = unpermute_array(ids, layout.num_blocks, self._key(epoch), DOMAIN_DATASET_BLOCKS)
        else:
            slots = ids
        by_slot = np.argsort(slots, kind="stable")
        result = (
            slots[by_slot].astype(np.int64),
            np.concatenate([[0], np.cumsum(layout.deficits[by_slot])]).astype(np.int64),
        )
        self._cache.clear()  # one epoch at a time: bounded memory
        self._cache[tag] = result
        return result

    def _position(self, slot: int, short: tuple[npt.NDArray[np.int64], ...]) -> int:
        """Serving position of the first slot of order slot ``slot``."""
        slots, deficits = short
        return slot * self._blocks().size - int(deficits[int(np.searchsorted(slots, slot))])

    def spans(self, epoch: int, start: int = 0) -> Iterator[Span]:
        """The epoch's blocks in serving order from serving position ``start`` on."""
        layout = self._blocks()
        if start >= int(layout.slots[-1]):
            return
        short = self._short(epoch)
        # The last order slot whose position is at most start (positions grow with the slot;
        # order slot 0's is 0, so a start below it begins there too).
        after = bisect.bisect_right(
            range(layout.num_blocks), start, key=lambda k: self._position(k, short)
        )
        lo = max(0, after - 1)
        begin = self._position(lo, short)
        chunk, k0 = SPAN_CHUNK_FIRST, lo
        while k0 < layout.num_blocks:  # order slots mapped to blocks a chunk at a time
            k1 = min(k0 + chunk, layout.num_blocks)
            chunk = SPAN_CHUNK_MAX
            ids = np.arange(k0, k1, dtype=np.uint64)
            if self.shuffle:
                ids = permute_array(ids, layout.num_blocks, self._key(epoch), DOMAIN_DATASET_BLOCKS)
            blocks = ids.astype(np.int64)
            shard = np.searchsorted(layout.blocks, blocks, side="right") - 1
            within = (blocks - layout.blocks[shard]) * layout.size
            first = layout.slots[shard] + within
            length = np.minimum(layout.size, layout.counts[shard] - within)
            for f, n in zip(first.tolist(), length.tolist(), strict=True):
                yield Span(f + max(0, start - begin), f + n)
                begin += n
            k0 = k1

    def indices(self, epoch: int, start: int = 0) -> Iterator[int]:
        """Slot indices of ``epoch`` in serving order from position ``start`` on."""
        return _indices(self.spans(epoch, start))

    def epoch_order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The whole epoch as an array (O(num_batches) memory)."""
        return np.fromiter(self.indices(epoch), dtype=np.int64, count=self.num_batches)


Order = BlockOrder | ShardedBlockOrder
"""An epoch order over a file's batches or a dataset's slots: both serve ``spans``."""


def sharded_order(
    shard_batches: Sequence[int] | npt.NDArray[np.int64],
    block_size: int,
    seed: int,
    shuffle: bool = True,
) -> ShardedBlockOrder:
    """The dataset order of shards with these slot counts."""
    return ShardedBlockOrder(np.asarray(shard_batches, dtype=np.int64), block_size, seed, shuffle)
