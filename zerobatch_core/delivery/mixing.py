"""``MixtureSchedule``: the component and position of any global step of a mixture, fast.

``SPEC.md`` section 21 defines the rule step by step (``zerobatch_spec.mixture``: each step
depends on the counts before it). A loader needs any step at once: the first step after a
resume, a trace, a worker that serves every k-th step. Two facts make that cheap:

* A phase's sequence is periodic. After ``P = sum(w_i) / gcd(w)`` steps every count equals its
  reduced weight, every share is met exactly, and the rule's state is back to its start. For
  the weights people write (``0.5, 0.3, 0.2`` has ``P = 10``) one period is computed once, and
  step ``s`` of the phase is entry ``s mod P``, its count ``(s // P) * w_i`` plus the
  occurrences before it in the period.
* A phase whose period is too long to hold (weights with many digits) is computed in chunks of
  ``CHUNK`` steps from checkpoints of the counts, kept as they are reached: a step costs its
  chunk's computation once, then a lookup.

A component's position (section 21.2) is its count in the phases before plus its count in the
phase so far; the counts a whole phase ends with come from the same two forms.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from zerobatch_spec.mixture import Phase, check_phases, phase_at, select

PERIOD_LIMIT = 1 << 16
"""Longest phase period held as one array (steps); longer phases are computed in chunks."""
CHUNK = 2048
"""Steps computed at once, from a checkpoint of the counts, in a phase of a longer period."""
CACHED_CHUNKS = 8
"""Chunks of a long-period phase kept computed (a pass, and a worker or trace beside it)."""


def run_rule(weights: Sequence[int], counts: list[int], steps: int) -> npt.NDArray[np.int32]:
    """The next ``steps`` components of a phase from ``counts`` (updated in place)."""
    out = np.empty(steps, dtype=np.int32)
    for k in range(steps):
        i = select(weights, counts)
        out[k] = i
        counts[i] += 1
    return out


class _Periodic:
    """A phase whose period fits in memory: one period, and each component's occurrences."""

    def __init__(self, weights: Sequence[int]) -> None:
        g = math.gcd(*weights)
        self.reduced = [w // g for w in weights]
        self.period = sum(self.reduced)
        self.sequence = run_rule(self.reduced, [0] * len(weights), self.period)
        self.occurrences = [np.flatnonzero(self.sequence == i) for i in range(len(weights))]

    def at(self, s: int) -> tuple[int, int]:
        q, r = divmod(s, self.period)
        i = int(self.sequence[r])
        return i, q * self.reduced[i] + int(np.searchsorted(self.occurrences[i], r))

    def counts(self, s: int) -> list[int]:
        q, r = divmod(s, self.period)
        return [
            q * w + int(np.searchsorted(occ, r))
            for w, occ in zip(self.reduced, self.occurrences, strict=True)
        ]


class _Chunked:
    """A phase of a long period: chunks of ``CHUNK`` steps from checkpoints of the counts."""

    def __init__(self, weights: Sequence[int]) -> None:
        self.weights = list(weights)
        self.checkpoints: dict[int, list[int]] = {0: [0] * len(weights)}
        self.chunks: OrderedDict[int, tuple[npt.NDArray[np.int32], list[int]]] = OrderedDict()

    def _chunk(self, c: int) -> tuple[npt.NDArray[np.int32], list[int]]:
        found = self.chunks.get(c)
        if found is not None:
            self.chunks.move_to_end(c)
            return found
        known = max(k for k in self.checkpoints if k <= c)
        counts = list(self.checkpoints[known])
        for k in range(known, c):  # walk to chunk c, keeping every checkpoint on the way
            run_rule(self.weights, counts, CHUNK)
            self.checkpoints[k + 1] = list(counts)
        start = list(counts)
        sequence = run_rule(self.weights, counts, CHUNK)
        self.checkpoints[c + 1] = counts
        self.chunks[c] = (sequence, start)
        while len(self.chunks) > CACHED_CHUNKS:
            self.chunks.popitem(last=False)
        return sequence, start

    def at(self, s: int) -> tuple[int, int]:
        c, r = divmod(s, CHUNK)
        sequence, start = self._chunk(c)
        i = int(sequence[r])
        return i, start[i] + int(np.count_nonzero(sequence[:r] == i))

    def counts(self, s: int) -> list[int]:
        c, r = divmod(s, CHUNK)
        sequence, start = self._chunk(c)
        seen = np.bincount(sequence[:r], minlength=len(start))
        return [a + int(b) for a, b in zip(start, seen, strict=True)]


class MixtureSchedule:
    """The component serving each global step, and its position (``SPEC.md`` section 21).

    ``phases`` are checked (``zerobatch_spec.mixture.check_phases``). ``at(step)`` costs a
    lookup for phases of a short period, and a chunk's computation once per ``CHUNK`` steps
    otherwise; the first step of a phase needs the counts of the phases before (computed once).
    """

    def __init__(self, phases: Sequence[Phase]) -> None:
        check_phases(phases, len(phases[0].weights) if phases else 0)
        self.phases = tuple(phases)
        self.components = len(self.phases[0].weights)
        self._plans: dict[int, _Periodic | _Chunked] = {}
        self._bases: list[list[int]] = [[0] * self.components]  # positions at phase starts

    def _plan(self, k: int) -> _Periodic | _Chunked:
        plan = self._plans.get(k)
        if plan is None:
            weights = self.phases[k].weights
            period = sum(weights) // math.gcd(*weights)
            plan = _Periodic(weights) if period <= PERIOD_LIMIT else _Chunked(weights)
            self._plans[k] = plan
        return plan

    def _base(self, k: int) -> list[int]:
        """Every component's position at the start of phase ``k``."""
        while len(self._bases) <= k:
            j = len(self._bases) - 1
            length = self.phases[j + 1].start - self.phases[j].start
            counts = self._plan(j).counts(length)
            self._bases.append([a + b for a, b in zip(self._bases[j], counts, strict=True)])
        return self._bases[k]

    def at(self, step: int) -> tuple[int, int]:
        """``(component, position)`` of global ``step``."""
        k = phase_at(self.phases, step)
        i, count = self._plan(k).at(step - self.phases[k].start)
        return i, self._base(k)[i] + count

    def between(self, first: int, stop: int) -> npt.NDArray[np.int64]:
        """The component of every global step ``first..stop``, as one array (a lookup into the
        period for short-period phases, ``at`` step by step otherwise)."""
        out = np.empty(max(0, stop - first), dtype=np.int64)
        step = first
        while step < stop:
            k = phase_at(self.phases, step)
            end = stop if k + 1 == len(self.phases) else min(stop, self.phases[k + 1].start)
            plan, start = self._plan(k), self.phases[k].start
            if isinstance(plan, _Periodic):
                offset = (step - start) % plan.period  # steps may exceed int64
                local = (np.arange(end - step, dtype=np.int64) + offset) % plan.period
                out[step - first : end - first] = plan.sequence[local]
            else:
                for s in range(step, end):
                    out[s - first] = plan.at(s - start)[0]
            step = end
        return out

    def positions(self, step: int) -> list[int]:
        """Every component's position at global ``step`` (the batches it served before)."""
        k = phase_at(self.phases, step)
        counts = self._plan(k).counts(step - self.phases[k].start)
        return [a + b for a, b in zip(self._base(k), counts, strict=True)]

    def phase_counts(self, step: int) -> tuple[int, list[int]]:
        """``(phase index, the phase's counts)`` at global ``step`` (section 21.3's state)."""
        k = phase_at(self.phases, step)
        return k, self._plan(k).counts(step - self.phases[k].start)
