"""Which part of every global batch one reader serves: data-parallel samples, context columns.

Every step of training consumes one *global batch* of ``global_batch_size`` samples (records),
taken in order from the epoch's sequence of stored batches (``batch_size`` samples each). All
ranks agree on that sequence. The ranks that read data split it two ways:

* data parallelism (DP): rank ``r`` of ``D`` reads samples ``[r * G / D, (r + 1) * G / D)`` of
  the step's ``G`` samples. With ``G == batch_size`` these are rows of one stored batch; with
  ``G`` a multiple of it, a step spans several stored batches (``G == D * batch_size`` gives
  every rank whole stored batches: "distinct batches"); with a divisor of it, one stored batch
  serves several steps.
* context parallelism (CP): rank ``c`` of ``C`` reads token chunk ``c`` of those samples'
  width ``W`` (``seq_len``, or ``seq_len - 1`` for next-token pairs), or with ``zigzag`` the
  load-balanced split for causal attention: ``2C`` chunks, rank ``c`` takes chunks ``c`` and
  ``2C - 1 - c`` (as Megatron's ``get_batch_on_this_cp_rank`` does after loading).

Tensor- and pipeline-parallel ranks of one DP/CP coordinate read identical data, so they need
no coordinate here. Each reader reads only its own samples' chunk bytes; with next-token pairs
a chunk's labels are the tokens one position later, including the first token of the next
chunk, so one extra column is read per range.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arguments import int_arg


@dataclass(frozen=True)
class Slicing:
    """A reader's coordinates: DP rank of size, CP rank(s) of size, and the CP split.

    ``cp_count`` consecutive CP ranks starting at ``cp_rank`` are served together (a process
    that feeds several devices of the context axis); their columns come in rank order.
    """

    dp_rank: int = 0
    dp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    cp_count: int = 1
    zigzag: bool = False

    def __post_init__(self) -> None:
        int_arg("world_size", self.dp_size, 1)
        int_arg("rank", self.dp_rank, 0)
        if self.dp_rank >= self.dp_size:
            raise ValueError(f"rank {self.dp_rank} is outside world_size {self.dp_size}")
        int_arg("context_size", self.cp_size, 1)
        int_arg("context_rank", self.cp_rank, 0)
        int_arg("context ranks served", self.cp_count, 1)
        if self.cp_rank + self.cp_count > self.cp_size:
            raise ValueError(
                f"context_rank {self.cp_rank} is outside context_size {self.cp_size}"
                if self.cp_count == 1
                else f"context ranks {self.cp_rank}..{self.cp_rank + self.cp_count - 1} "
                f"are outside context_size {self.cp_size}"
            )

    @property
    def whole_rows(self) -> bool:
        """Whether the columns are every token of each sample, in order."""
        return self.cp_count == self.cp_size and not self.zigzag

    def samples_per_step(self, global_batch_size: int) -> int:
        """Samples this DP rank reads per step."""
        return global_batch_size // self.dp_size

    def check(self, global_batch_size: int, batch_size: int, width: int) -> None:
        """Raise ``ValueError`` saying what would work when the layout cannot split evenly."""
        g, d = global_batch_size, self.dp_size
        if g % batch_size and batch_size % g:
            raise ValueError(
                f"global_batch_size {g} must be a multiple or a divisor of the stored "
                f"batch_size {batch_size} (e.g. {batch_size} or {2 * batch_size})"
            )
        if g % d:
            raise ValueError(
                f"batch_size {g} does not split evenly over world_size {d}: every rank must get "
                f"the same number of rows (use a world size that divides {g}, or write the "
                f"file with a batch size divisible by {d})"
            )
        parts = 2 * self.cp_size if self.zigzag else self.cp_size
        if width % parts:
            what = "2 * context_size" if self.zigzag else "context_size"
            raise ValueError(
                f"sequence width {width} does not split into {what} = {parts} equal chunks "
                f"(use a context size such that {what} divides {width}, or write records "
                f"whose width it divides)"
            )

    def columns(self, width: int) -> list[tuple[int, int]]:
        """Column ranges ``[lo, hi)`` this reader serves, in serving order, adjacent merged."""
        if not self.zigzag:
            chunk = width // self.cp_size
            return [(self.cp_rank * chunk, (self.cp_rank + self.cp_count) * chunk)]
        chunk = width // (2 * self.cp_size)
        ranges: list[tuple[int, int]] = []
        for c in range(self.cp_rank, self.cp_rank + self.cp_count):
            for k in (c, 2 * self.cp_size - 1 - c):
                lo, hi = k * chunk, (k + 1) * chunk
                if ranges and ranges[-1][1] == lo:
                    ranges[-1] = (ranges[-1][0], hi)
                else:
                    ranges.append((lo, hi))
        return ranges
