"""The adaptive commit cadence (DAC) against its own conflict budget, at scale.

A deterministic discrete-event simulation drives real ``AdaptiveCadence`` objects the way
``LiveProducer`` does: a producer opens the dataset (``start``: the read's time and the
producers of the newest version's entries), appends one object every so often, attempts a
commit when ``due`` says so (on a young dataset, once it has told the cadence which other
producers have uncommitted objects in the store: ``contenders``), and reports each attempt
(``observe``: its fragile window, whether it conflicted, the writers of the versions it
read); closing waits ``delay`` and then retries lost races after ``min(0.5 s, gap)`` until
the rest is committed. An attempt conflicts when
another producer's version is created inside its fragile window, the whole window counting as
fragile (the model's own assumption). The window grows with the committed batches, as a
manifest does, and producers join and leave during the run.

The conflict rate is measured per span of committed batches, as ``benchmarks/live_bench.py``
measures it, once every producer present has committed, over the attempts made while closing,
and over every attempt of producers that start together on a fresh dataset (the cold start,
before they have read each other's versions, included).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zerobatch_spec.live import manifest_name

from zerobatch_core.live import producer as producer_module
from zerobatch_core.live.cadence import AdaptiveCadence, Cadence
from zerobatch_core.live.producer import CONTENDERS_LISTED_BELOW, LiveProducer

Window = Callable[[float, int], float]
"""The fragile window (seconds) of an attempt starting at a time with so many batches
committed."""


@dataclass
class Attempt:
    """One simulated commit attempt: who, when it ended, whether it landed, the batches
    committed after it, and whether its producer was closing or every producer then present
    had committed once (``warm``)."""

    producer: int
    end: float
    ok: bool
    committed: int
    closing: bool
    warm: bool


@dataclass
class _Producer:
    """A simulated producer's state; ``attempt`` is the one in flight (start, window, the
    writers it read)."""

    cadence: AdaptiveCadence
    opens: float
    count: int
    appended: int = 0
    pending: int = 0
    seen: int = 0
    closing: bool = False
    committed_once: bool = False
    attempt: tuple[float, float, list[str]] | None = None


@dataclass
class Run:
    """A simulated run: every attempt, the batches committed, the end of its last attempt."""

    attempts: list[Attempt] = field(default_factory=list)
    committed: int = 0
    end: float = 0.0


def simulate(
    schedule: list[tuple[float, int]],
    window: Window,
    *,
    append_every: float,
    seed: int,
    budget: float = 0.1,
    young: int = CONTENDERS_LISTED_BELOW,
) -> Run:
    """Producers ``k`` opening at ``schedule[k][0]`` and appending ``schedule[k][1]`` objects
    of one batch each, one every ``append_every`` seconds on average, then closing; while
    fewer than ``young`` batches are committed, each attempt is preceded by a listing of the
    store (0: never, as a cadence that ignored ``contenders`` would run)."""
    rng = random.Random(seed)
    run = Run()
    versions: list[tuple[float, str]] = []  # (created at, writer)
    events: list[tuple[float, int, str, int]] = []
    order = 0

    def push(t: float, kind: str, k: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, k))

    producers = [
        _Producer(
            AdaptiveCadence(
                conflict_budget=budget, last_attempt=opens, _random=random.Random(seed * 97 + k)
            ),
            opens,
            count,
        )
        for k, (opens, count) in enumerate(schedule)
    ]
    for k, p in enumerate(producers):
        push(p.opens, "open", k)

    def read(p: _Producer, until: float) -> list[str]:
        new = [w for t, w in versions[p.seen :] if t <= until]
        p.seen += len(new)
        return new

    def begin(k: int, t: float) -> None:
        p = producers[k]
        p.attempt = (t, window(t, run.committed), read(p, t))
        push(t + p.attempt[1], "end", k)

    def next_append(k: int, t: float) -> None:
        push(t + append_every * rng.uniform(0.5, 1.5), "append", k)

    def close(k: int, t: float) -> None:
        p = producers[k]
        p.closing = True
        push(t + p.cadence.delay(t), "final", k)

    while events:
        t, _, kind, k = heapq.heappop(events)
        p = producers[k]
        if kind == "open":
            p.seen = len(versions)
            recent = list(dict.fromkeys(w for _, w in reversed(versions[-16:]) if w != f"p{k}"))
            p.cadence.start(window(t, run.committed), recent[::-1], t)
            next_append(k, t)
        elif kind == "append":
            p.appended += 1
            p.pending += 1
            if p.cadence.due(p.pending, t) and run.committed < young:
                # The producer lists the store: the others with objects no version holds yet.
                pending = [f"p{j}" for j, q in enumerate(producers) if j != k and q.pending]
                p.cadence.contenders(pending, t)
            if p.cadence.due(p.pending, t):
                begin(k, t)
            elif p.appended < p.count:
                next_append(k, t)
            else:
                close(k, t)
        elif kind == "final":
            begin(k, t)
        else:  # the end of an attempt
            assert p.attempt is not None
            started, w, writers = p.attempt
            ok = not any(started < at <= t for at, _ in versions[p.seen :])
            if ok:
                run.committed += p.pending
                p.pending = 0
                versions.append((t, f"p{k}"))
                p.seen = len(versions)
                writers = [*writers, f"p{k}"]
                p.committed_once = True
            else:
                writers = [*writers, *read(p, t)]
            p.cadence.observe(w, not ok, writers, t)
            warm = all(q.committed_once for q in producers if q.opens <= started)
            run.attempts.append(Attempt(k, t, ok, run.committed, p.closing, warm))
            run.end = max(run.end, t)
            if p.closing:
                if p.pending:
                    push(t + min(0.5, p.cadence.gap), "final", k)
            elif p.appended < p.count:
                next_append(k, t)
            else:
                close(k, t)
    return run


def buckets(run: Run, size: int) -> list[list[Attempt]]:
    """The warm attempts by span of ``size`` committed batches (as the benchmark cuts them)."""
    out: list[list[Attempt]] = [[] for _ in range(math.ceil(run.committed / size))]
    for a in run.attempts:
        if a.warm and a.committed > 0:
            out[(a.committed - 1) // size].append(a)
    return out


def conflicts(attempts: list[Attempt]) -> float:
    return sum(not a.ok for a in attempts) / len(attempts)


def within_budget(attempts: list[Attempt], budget: float = 0.1) -> bool:
    """Whether ``attempts`` conflict at most about ``budget`` of the time: three binomial
    standard deviations above it, and two points for the model's approximations."""
    n = len(attempts)
    return conflicts(attempts) <= budget + 3 * math.sqrt(budget * (1 - budget) / n) + 0.02


def growing(t: float, committed: int) -> float:
    """A window growing twelvefold over 12,000 batches, plus a longer one every 256 batches
    (the attempt that writes a sealed segment)."""
    return 0.05 + 0.55 * min(committed, 12_000) / 12_000 + (0.1 if committed % 256 < 32 else 0)


SEEDS = range(8)


def test_steady_producers_meet_the_budget_as_the_window_grows() -> None:
    """Eight producers over 12,000 batches while the window grows twelvefold: the warm
    attempts stay within the budget in every span of 2,000 batches, and so do the attempts
    made while closing (all eight finish at about the same time)."""
    schedule = [(0.03 * k, 1500) for k in range(8)]
    runs = [simulate(schedule, growing, append_every=8 / 150, seed=s) for s in SEEDS]
    spans = [
        [a for b in cut for a in b] for cut in zip(*(buckets(r, 2000) for r in runs), strict=True)
    ]
    assert len(spans) == 6 and all(len(span) >= 20 for span in spans)
    assert all(within_budget(span) for span in spans), [conflicts(span) for span in spans]
    closing = [a for r in runs for a in r.attempts if a.closing]
    assert within_budget(closing), conflicts(closing)
    steady = [a for r in runs for a in r.attempts if a.warm and not a.closing]
    assert conflicts(steady) <= 0.12, conflicts(steady)


def test_producers_joining_and_leaving_meet_the_budget() -> None:
    """Four producers, four more joining a third of the way in, and the producers leaving at
    different times: the warm attempts and those made while closing stay within budget, and
    producers that join a running dataset mostly do not start by conflicting (they start
    from the producers the newest version lists; they cannot know of each other)."""
    schedule = [(0.02 * k, 2400 - 300 * k) for k in range(4)]
    schedule += [(25.0 + 0.02 * k, 900 + 300 * k) for k in range(4)]
    runs = [simulate(schedule, growing, append_every=8 / 150, seed=s) for s in SEEDS]
    steady = [a for r in runs for a in r.attempts if a.warm and not a.closing]
    closing = [a for r in runs for a in r.attempts if a.closing]
    assert len(steady) >= 300
    assert within_budget(steady), conflicts(steady)
    assert within_budget(closing), conflicts(closing)
    joined = [next(a for a in r.attempts if a.producer == k) for r in runs for k in range(4, 8)]
    assert conflicts(joined) <= 1 / 3, conflicts(joined)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    producers=st.integers(2, 16),
    seed=st.integers(0, 2**16),
    w0=st.floats(0.01, 0.2),
    growth=st.floats(1.0, 20.0),
)
def test_the_budget_holds_for_any_producer_count_and_growth(
    producers: int, seed: int, w0: float, growth: float
) -> None:
    """For 2 to 16 producers, any starting window and growth up to twentyfold, the warm
    attempts of a run (closing ones included) stay within the budget."""

    def window(t: float, committed: int) -> float:
        return w0 * (1 + (growth - 1) * min(committed, 8000) / 8000)

    per = 8000 // producers
    run = simulate(
        [(0.03 * k, per) for k in range(producers)],
        window,
        append_every=producers / 150,
        seed=seed,
    )
    warm = [a for a in run.attempts if a.warm]
    assert within_budget(warm), (len(warm), conflicts(warm))


def test_closing_waits_until_the_cadence_lets_an_attempt_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close`` commits the rest only once the cadence's ``delay`` has passed (a fixed
    cadence's is none: it never waits); ``commit`` does not wait."""

    class Slow(Cadence):
        def due(self, pending: int, now: float) -> bool:
            return False

        def delay(self, now: float) -> float:
            return 7.5

    slept: list[float] = []

    class Clock:
        monotonic = staticmethod(time.monotonic)
        sleep = staticmethod(slept.append)

    monkeypatch.setattr(producer_module, "time", Clock)
    batch = np.zeros((1, 2, 3), dtype=np.uint32)
    with LiveProducer(str(tmp_path / "a"), "p", batch_size=2, seq_len=3, cadence=Slow()) as p:
        p.append(batch)
    assert slept == [7.5] and p.committed == 1
    slept.clear()
    with LiveProducer(str(tmp_path / "b"), "p", batch_size=2, seq_len=3, cadence=Slow()) as p:
        p.append(batch)
        p.commit()
    assert slept == []
    with LiveProducer(str(tmp_path / "c"), "p", batch_size=2, seq_len=3, cadence=3) as p:
        p.append(batch)
    assert slept == []


def test_a_producer_starts_from_the_writers_of_the_newest_entries(tmp_path: Path) -> None:
    """Opening a dataset starts the cadence from the producers of the newest version's
    unsealed entries (itself left out: it counts once anyway) and the time of that read."""
    path = str(tmp_path / "live")
    batch = np.zeros((1, 2, 3), dtype=np.uint32)
    for name in ("p-0", "p-1", "p-2"):
        with LiveProducer(path, name, batch_size=2, seq_len=3, cadence=1) as p:
            p.append(batch)
    cadence = AdaptiveCadence()
    before = time.monotonic()
    joined = LiveProducer(path, "p-1", cadence=cadence)
    assert cadence.producers == 3  # p-0, p-2 and itself
    assert before <= cadence.last_attempt <= time.monotonic()
    assert 0 < cadence.window == cadence.latest
    assert cadence.gap == pytest.approx(cadence.optimal_gap(), rel=cadence.jitter)
    joined.close()


def test_the_window_estimate_follows_growth_and_the_producer_counts_itself() -> None:
    """The gap uses the larger of the average window and the last one (an average alone lags
    a growing manifest), and ``N`` counts this producer before any commit of its own."""
    cadence = AdaptiveCadence(jitter=0.0)
    cadence.observe(0.1, False, ["p-0"], 0.0)
    cadence.observe(1.0, False, ["p-0"], 1.0)
    assert cadence.window == pytest.approx(0.1 * 0.7 + 1.0 * 0.3)
    assert cadence.estimate == 1.0
    assert cadence.gap == pytest.approx(1.0 / 0.25 - 1.0)
    lost = AdaptiveCadence(jitter=0.0)
    lost.observe(0.1, True, ["p-1"], 0.0)  # lost a race to p-1: two producers, not one
    assert lost.producers == 2
    assert lost.gap == pytest.approx(0.1 / -math.log1p(-0.1) - 0.1)
    assert lost.delay(0.25) == pytest.approx(lost.gap - 0.25)
    assert lost.delay(100.0) == 0.0


@pytest.mark.parametrize("count", [8, 16])
def test_producers_starting_together_meet_the_budget_from_the_start(count: int) -> None:
    """Producers that open a fresh dataset within a second of each other: every attempt of
    the first fifth of the run (the cold start included) and of the whole run stays within
    the budget."""
    schedule = [(0.1 * k, 8000 // count) for k in range(count)]
    runs = [simulate(schedule, growing, append_every=count / 150, seed=s) for s in SEEDS]
    first = [a for r in runs for a in r.attempts if a.committed <= r.committed // 5]
    every = [a for r in runs for a in r.attempts]
    assert within_budget(first), (len(first), conflicts(first))
    assert within_budget(every), (len(every), conflicts(every))


def test_contenders_widen_the_gap_to_a_phase_drawn_across_it() -> None:
    """Producers seen preparing commits count in ``N`` as writers do; when they widen the
    gap, the next attempt is put off to a time drawn uniformly across the new gap (not
    bunched near its end, where producers that learnt together would meet again); producers
    already counted change nothing."""
    phases = []
    for seed in range(400):
        cadence = AdaptiveCadence(last_attempt=0.0, _random=random.Random(seed))
        cadence.start(0.1, [], 0.0)
        assert cadence.producers == 1 and cadence.gap < 0.1 / 0.25
        cadence.contenders([f"p-{k}" for k in range(15)], 2.0)
        assert cadence.producers == 16 and cadence.last_attempt == 2.0
        full = 15 * 0.1 / -math.log1p(-0.1) - 0.1
        assert cadence.optimal_gap() == pytest.approx(full)
        assert 0 <= cadence.gap <= full
        phases.append(cadence.gap / full)
        drawn = cadence.gap
        cadence.contenders(["p-3", "p-7"], 3.0)
        assert (cadence.gap, cadence.last_attempt, cadence.producers) == (drawn, 2.0, 16)
    # Uniform on [0, 1]: mean 1/2, a quarter in each quarter (+- 5 binomial sd of 400).
    assert abs(sum(phases) / len(phases) - 0.5) < 0.05
    quarters = [sum(q / 4 <= x < (q + 1) / 4 for x in phases) for q in range(4)]
    assert all(abs(n - 100) < 5 * math.sqrt(400 * 0.25 * 0.75) for n in quarters), quarters


def test_a_producer_lists_the_producers_preparing_commits_on_a_young_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before an attempt on a young dataset, a producer tells the cadence which other
    producers have batch objects beyond their committed offset (not itself, not one whose
    objects are all committed), and attempts only if the cadence still says so; on a
    dataset past ``CONTENDERS_LISTED_BELOW`` entries it lists nothing."""

    class Never(Cadence):
        def due(self, pending: int, now: float) -> bool:
            return False

    class Listening(Cadence):
        """Due, unless the contenders it has just heard of put the attempt off."""

        uses_contenders = True

        def __init__(self) -> None:
            self.heard: list[list[str]] = []
            self.put_off = False

        def due(self, pending: int, now: float) -> bool:
            put_off, self.put_off = self.put_off, False
            return not put_off

        def contenders(self, producers: list[str], now: float) -> None:
            self.heard.append(sorted(producers))
            self.put_off = bool(producers)

    path = str(tmp_path / "live")
    batch = np.zeros((1, 2, 3), dtype=np.uint32)
    with LiveProducer(path, "p-0", batch_size=2, seq_len=3, cadence=1) as p0:
        p0.append(batch)
    p1 = LiveProducer(path, "p-1", cadence=Never())
    p1.append(batch)
    p1.append(batch)
    listening = Listening()
    p2 = LiveProducer(path, "p-2", cadence=listening)
    p2.append(batch)
    assert listening.heard == [["p-1"]] and p2.pending == 1  # the attempt was put off
    p1.close()
    assert p2.commit() and p2.committed == 1  # an explicit commit lists nothing
    assert listening.heard == [["p-1"]]
    p2.append(batch)  # on a base that holds every object of p-1's
    assert listening.heard == [["p-1"], []] and p2.pending == 0 and p2.committed == 2
    monkeypatch.setattr(producer_module, "CONTENDERS_LISTED_BELOW", 2)
    p2.append(batch)
    assert len(listening.heard) == 2 and p2.committed == 3
    p2.close()


def test_segments_are_written_before_the_fragile_window_opens(tmp_path: Path) -> None:
    """A commit that seals a segment writes it, then reads the next version again: the read
    that finds none (where the fragile window opens) comes after the segment's write, and
    nothing but the version's create follows it."""
    batch = np.zeros((1, 2, 3), dtype=np.uint32)
    p = LiveProducer(
        str(tmp_path / "live"), "p", batch_size=2, seq_len=3, cadence=1, segment_size=2
    )
    p.append(batch)
    p.append(batch)  # versions 1 and 2: two entries in the tail, none sealed
    events: list[tuple[str, str]] = []
    for name in ("read", "write", "create"):

        def call(key: str, *args: object, _name: str = name) -> object:
            events.append((_name, key))
            return getattr(type(p.store), _name)(p.store, key, *args)

        setattr(p.store, name, call)
    p.append(batch)  # version 3 seals the first two entries
    assert p.base.version == 3 and len(p.base.segments) == 1
    create = events.index(("create", manifest_name(3)))
    segment = next(i for i, (_, key) in enumerate(events) if key.startswith("segments/"))
    version = ("read", manifest_name(3))
    reads = [i for i, e in enumerate(events[:create]) if e == version]  # found none
    assert events[segment][0] == "write" and len(reads) == 2, events
    assert reads[0] < segment < reads[1] == create - 1, events
    p.close()
