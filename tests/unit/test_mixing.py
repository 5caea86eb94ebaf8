"""``MixtureSchedule`` answers any step as ``zerobatch_spec.mixture`` does, step by step."""

from __future__ import annotations

import random

import numpy as np
import pytest
from zerobatch_spec.mixture import MixtureSpecError, Phase, mixture_order, weight_units

from zerobatch_core.delivery import mixing
from zerobatch_core.delivery.mixing import MixtureSchedule

CASES = [
    [Phase(0, (500_000_000, 300_000_000, 200_000_000))],
    [Phase(0, (1, 1, 1))],
    [Phase(0, (5, 5)), Phase(3, (0, 1)), Phase(9, (2, 7))],
    [Phase(0, (8, 40, 392, 392))],
    [Phase(0, (123_456_789, 987_654_321, 5)), Phase(5000, (1, 0, 0)), Phase(5001, (0, 3, 1))],
    [Phase(0, (0, 7, 0))],
]


@pytest.mark.parametrize("phases", CASES)
@pytest.mark.parametrize("limit", [mixing.PERIOD_LIMIT, 1])  # periodic, and chunked phases
def test_every_step_matches_the_reference_in_any_order(
    phases: list[Phase], limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mixing, "PERIOD_LIMIT", limit)
    monkeypatch.setattr(mixing, "CHUNK", 64)
    monkeypatch.setattr(mixing, "CACHED_CHUNKS", 2)
    stop = 6000
    want = list(mixture_order(phases, 0, stop))
    schedule = MixtureSchedule(phases)
    steps = list(range(stop))
    random.Random(5).shuffle(steps)
    for step in steps[:1500] + sorted(steps[1500:3000]) + steps[3000:3100]:
        assert schedule.at(step) == want[step], step
    n = len(phases[0].weights)
    for step in (0, 1, 63, 64, 65, 4999, 5000, 5001, 5999):
        served = [0] * n
        for component, _ in want[:step]:
            served[component] += 1
        assert schedule.positions(step) == served
        k, counts = schedule.phase_counts(step)
        start = phases[k].start
        assert counts == [sum(1 for c, _ in want[start:step] if c == i) for i in range(n)]


def test_weights_are_exact_decimals() -> None:
    assert weight_units(0.3) == weight_units("0.3") == weight_units("3e-1") == 300_000_000
    assert weight_units(5) == 5 * 10**9
    assert weight_units("0.000000001") == 1
    assert weight_units(0) == 0
    for bad in (-1, "1e-10", float("nan"), float("inf"), 10**6 + 1, True, None, "x", [1]):
        with pytest.raises(MixtureSpecError):
            weight_units(bad)


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        ([], "1 to 4096 phases"),
        ([Phase(1, (1,))], "starts at step 0"),
        ([Phase(0, (1, 1)), Phase(0, (1, 1))], "must increase"),
        ([Phase(0, (1, 1)), Phase(4, (1,))], "1 weights for 2 components"),
        ([Phase(0, (0, 0))], "every weight is 0"),
        ([Phase(0, (-1, 2))], "weight 0 out of range"),
    ],
)
def test_bad_schedules_are_refused_by_name(phases: list[Phase], message: str) -> None:
    with pytest.raises(MixtureSpecError, match=message):
        MixtureSchedule(phases)


@pytest.mark.parametrize("phases", CASES)
@pytest.mark.parametrize("limit", [mixing.PERIOD_LIMIT, 1])
def test_between_gives_every_steps_component_at_once(
    phases: list[Phase], limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mixing, "PERIOD_LIMIT", limit)
    monkeypatch.setattr(mixing, "CHUNK", 64)
    want = [c for c, _ in mixture_order(phases, 0, 6000)]
    schedule = MixtureSchedule(phases)
    ranges = ((0, 6000), (1, 2), (1, 9), (2, 9), (4990, 5010), (5000, 5001), (7, 7), (9, 3))
    for first, stop in ranges:
        got = schedule.between(first, stop)
        assert got.dtype == np.int64 and got.tolist() == want[first:stop], (first, stop)
