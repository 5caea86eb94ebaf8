"""When a live-dataset producer commits: fixed cadences and the adaptive one (DAC).

Every commit attempt reads the newest manifest version and tries to create the next; the time
from that read to the end of the attempt is the *fragile window* ``W``: another producer's
commit that lands inside it makes this attempt fail. ``W`` is measured on every attempt and
grows with the manifest, the producer count and the store's latency, all at once.

``AdaptiveCadence`` is the decentralized adaptive commit (DAC): after each attempt a producer
waits a gap ``g`` before the next. Modelling the other ``N - 1`` producers' attempt starts as
Poisson processes of rate ``(N - 1) / (W + g)``, an attempt conflicts with probability
``1 - exp(-(N - 1) W / (W + g))``, and a producer spends the fraction ``W / (W + g)`` of its
time in manifest I/O. Two budgets bound them: conflicts at most ``conflict_budget`` (epsilon),
manifest I/O at most ``overhead_budget`` (delta) of the time. Solving each for ``g``:

    g >= (N - 1) W / -ln(1 - epsilon) - W        (conflicts)
    g >= W / delta - W                            (overhead)

and the producer takes the smallest feasible gap ``g* = max(0, both)``, jittered by a factor in
``[1 - jitter, 1 + jitter]`` so producers do not fall into step. ``W`` is an exponential moving
average of the measured windows; ``N`` counts the distinct writers of the last manifest
versions the producer has seen (read from the versions themselves, no messages). As the
manifest grows, ``W`` grows and the gap widens, so the commit rate falls just enough to keep
conflicts and overhead within budget, and every commit carries more batches.

``FixedCadence(k)`` commits after every ``k`` appended objects (``k = 1``: every append), the
baseline the benchmark compares against.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field


class Cadence:
    """Decides when a producer attempts a commit, from what it observes."""

    def due(self, pending: int, now: float) -> bool:
        """Whether to attempt a commit now, with ``pending`` objects appended but uncommitted."""
        raise NotImplementedError

    def observe(self, window: float, conflicted: bool, writers: list[str], now: float) -> None:
        """Record one attempt: its fragile window (seconds), whether it conflicted, and the
        writers of the manifest versions read since the last attempt."""


@dataclass
class FixedCadence(Cadence):
    """Commit once every ``every`` appended objects."""

    every: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"a fixed cadence commits every k >= 1 appends, got {self.every!r}")

    def due(self, pending: int, now: float) -> bool:
        return pending >= self.every


@dataclass
class AdaptiveCadence(Cadence):
    """The adaptive commit cadence (DAC; see the module docstring)."""

    conflict_budget: float = 0.1
    overhead_budget: float = 0.25
    jitter: float = 0.2
    smoothing: float = 0.3
    history: int = 64
    window: float = 0.0
    """EMA of the fragile window, seconds (0 until the first attempt)."""
    gap: float = 0.0
    """The current jittered gap, seconds."""
    last_attempt: float = field(default_factory=time.monotonic)
    _writers: deque[str] = field(default_factory=deque)
    _random: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if not 0 < self.conflict_budget < 1:
            raise ValueError(f"conflict_budget must be in (0, 1), got {self.conflict_budget!r}")
        if not 0 < self.overhead_budget <= 1:
            raise ValueError(f"overhead_budget must be in (0, 1], got {self.overhead_budget!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    @property
    def producers(self) -> int:
        """Distinct writers among the last ``history`` manifest versions seen (at least 1)."""
        return max(1, len(set(self._writers)))

    def optimal_gap(self) -> float:
        """``g*``: the smallest gap that meets both budgets for the current ``W`` and ``N``."""
        w, n = self.window, self.producers
        conflicts = (n - 1) * w / -math.log1p(-self.conflict_budget) - w
        overhead = w / self.overhead_budget - w
        return max(0.0, conflicts, overhead)

    def due(self, pending: int, now: float) -> bool:
        return pending > 0 and now - self.last_attempt >= self.gap

    def observe(self, window: float, conflicted: bool, writers: list[str], now: float) -> None:
        a = self.smoothing
        self.window = window if self.window == 0 else (1 - a) * self.window + a * window
        for writer in writers:
            self._writers.append(writer)
            while len(self._writers) > self.history:
                self._writers.popleft()
        g = self.optimal_gap()
        self.gap = g * (1 + self._random.uniform(-self.jitter, self.jitter))
        self.last_attempt = now


def make_cadence(cadence: Cadence | int | str) -> Cadence:
    """A cadence from a ``Cadence``, ``"adaptive"``, or ``k`` (commit every ``k`` appends)."""
    if isinstance(cadence, Cadence):
        return cadence
    if cadence == "adaptive":
        return AdaptiveCadence()
    if isinstance(cadence, int) and not isinstance(cadence, bool):
        return FixedCadence(cadence)
    raise ValueError(f"cadence must be 'adaptive', an integer k >= 1 or a Cadence, got {cadence!r}")
