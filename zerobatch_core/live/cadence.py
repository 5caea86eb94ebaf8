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
``[1 - jitter, 1 + jitter]`` so producers do not fall into step. As the manifest grows, ``W``
grows and the gap widens, so the commit rate falls just enough to keep conflicts and overhead
within budget, and every commit carries more batches.

The model holds only if its inputs are those of the next attempt:

* ``W`` is measured from the read that finds no newer version, not from the reads before it
  that catch up with the versions committed since the last attempt (about ``N - 1`` of them:
  manifest I/O, but no commit landing during them can make this one fail), nor from the
  writes of the segments the commit seals (written before that read, for the same reason).
  With the default budgets and more than one producer the conflict bound is the larger, so
  the overhead bound, which that catching up would belong to, does not decide the gap.
* The gap uses the larger of an exponential moving average of the measured windows and the
  last one measured. Each producer measures ``W`` once per gap, and a growing manifest (or a
  commit carrying more entries) makes the next window longer than the average of the past
  ones: an average alone lags the growth and the gap comes out too short.
* ``N`` counts the distinct writers of the last manifest versions the producer has seen (read
  from the versions themselves, no messages), the producers it has seen preparing commits
  (below), *and the producer itself*: a producer that has only lost races so far is one of
  the contenders too. A producer that opens a dataset starts from the producers listed in the
  newest version's unsealed entries and from the time that read took (``start``), so one
  joining a running dataset does not first attempt as if alone.
* Closing a producer commits what is left only once the gap since its last attempt has passed
  (``delay``): producers that finish together would otherwise all attempt at once, outside
  the model, and most of those attempts would conflict.
* Producers that start together on a fresh dataset find nothing of each other in its
  versions until their first commits land, yet their batch objects are in the store before
  that. While the dataset is young, the producer lists them before each attempt and tells
  the cadence who else has objects no version holds yet (``contenders``); they count in
  ``N`` as writers do. When that widens the gap, the next attempt is put off to a time drawn
  uniformly across the new gap: producers that start together learn of each other at about
  the same time, and a gap that only grew by its jitter would bring their attempts together
  again, where the model assumes them independent. A producer that appends before any other
  has (it lists no one) attempts as if alone until a later listing or their versions show
  them: a transient of a few attempts.

``FixedCadence(k)`` commits after every ``k`` appended objects (``k = 1``: every append), the
baseline the benchmark compares against.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar


class Cadence:
    """Decides when a producer attempts a commit, from what it observes."""

    uses_contenders: ClassVar[bool] = False
    """Whether ``contenders`` informs this cadence (so a producer lists the batch objects of a
    young dataset before an attempt only for a cadence that uses what it finds)."""

    def due(self, pending: int, now: float) -> bool:
        """Whether to attempt a commit now, with ``pending`` objects appended but uncommitted."""
        raise NotImplementedError

    def observe(self, window: float, conflicted: bool, writers: list[str], now: float) -> None:
        """Record one attempt: its fragile window (seconds), whether it conflicted, and the
        writers of the manifest versions read since the last attempt (after a successful
        attempt, the last of them is this producer, the writer of the version it created)."""

    def start(self, window: float, writers: list[str], now: float) -> None:
        """Record what the producer saw when it opened the dataset: the seconds its read of the
        newest version took, and the producers that version lists as recent writers."""

    def contenders(self, producers: list[str], now: float) -> None:
        """Record the other producers seen preparing commits: those with objects in the store
        that no version lists yet, looked up just before an attempt on a young dataset (an
        attempt ``due`` no longer allows is put off)."""

    def delay(self, now: float) -> float:
        """Seconds from ``now`` until an attempt may start whatever is pending: what closing a
        producer waits before committing the rest (0: at once)."""
        return 0.0


@dataclass
class FixedCadence(Cadence):
    """Commit once every ``every`` appended objects."""

    every: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"a fixed cadence commits every k >= 1 appends, got {self.every!r}")

    def due(self, pending: int, now: float) -> bool:
        return pending >= self.every


_SELF = "\0"
"""Stands for this producer among the writers until a commit of its own names it."""


@dataclass
class AdaptiveCadence(Cadence):
    """The adaptive commit cadence (DAC; see the module docstring)."""

    uses_contenders: ClassVar[bool] = True
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
    latest: float = 0.0
    """The last fragile window measured, seconds."""
    _writers: deque[str] = field(default_factory=deque)
    _random: random.Random = field(default_factory=random.Random)
    _own: str = _SELF

    def __post_init__(self) -> None:
        if not 0 < self.conflict_budget < 1:
            raise ValueError(f"conflict_budget must be in (0, 1), got {self.conflict_budget!r}")
        if not 0 < self.overhead_budget <= 1:
            raise ValueError(f"overhead_budget must be in (0, 1], got {self.overhead_budget!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    @property
    def producers(self) -> int:
        """``N``: the distinct writers among the last ``history`` manifest versions seen, this
        producer included whether or not one of its commits is among them."""
        return len({*self._writers, self._own})

    @property
    def estimate(self) -> float:
        """``W`` as the gap uses it: the larger of the average and the last window measured."""
        return max(self.window, self.latest)

    def optimal_gap(self) -> float:
        """``g*``: the smallest gap that meets both budgets for the current ``W`` and ``N``."""
        w, n = self.estimate, self.producers
        conflicts = (n - 1) * w / -math.log1p(-self.conflict_budget) - w
        overhead = w / self.overhead_budget - w
        return max(0.0, conflicts, overhead)

    def due(self, pending: int, now: float) -> bool:
        return pending > 0 and now - self.last_attempt >= self.gap

    def delay(self, now: float) -> float:
        return max(0.0, self.last_attempt + self.gap - now)

    def start(self, window: float, writers: list[str], now: float) -> None:
        if self.window == 0:
            self.window = self.latest = window
        self._see(writers)
        self._next_gap(now)

    def contenders(self, producers: list[str], now: float) -> None:
        known = {*self._writers, self._own}
        new = [p for p in dict.fromkeys(producers) if p not in known]
        if not new:
            return
        self._see(new)
        # Producers that start together would all reach the wider gap together: a phase drawn
        # across the whole gap spreads their attempts as the model's independent ones.
        self.gap = self._random.uniform(0.0, self.optimal_gap())
        self.last_attempt = now

    def observe(self, window: float, conflicted: bool, writers: list[str], now: float) -> None:
        a = self.smoothing
        self.window = window if self.window == 0 else (1 - a) * self.window + a * window
        self.latest = window
        if not conflicted and writers:
            self._own = writers[-1]
        self._see(writers)
        self._next_gap(now)

    def _see(self, writers: list[str]) -> None:
        for writer in writers:
            self._writers.append(writer)
            while len(self._writers) > self.history:
                self._writers.popleft()

    def _next_gap(self, now: float) -> None:
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
