"""Properties of the mixture rule (SPEC.md section 21) over random weights and schedules."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zerobatch_spec.mixture import MAX_UNITS, Phase, check_phases, mixture_order, select

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

weights = st.lists(
    st.one_of(st.integers(0, 10), st.integers(0, MAX_UNITS), st.sampled_from([0, 1])),
    min_size=1,
    max_size=16,
).filter(any)


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[Phase], int]:
    first = draw(weights)
    n = len(first)
    phases = [Phase(0, tuple(first))]
    for _ in range(draw(st.integers(0, 3))):
        start = phases[-1].start + draw(st.integers(1, 300))
        w = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n).filter(any))
        phases.append(Phase(start, tuple(w)))
    return phases, draw(st.integers(1, 900))


@SETTINGS
@given(schedules())
def test_every_prefix_of_a_phase_is_within_one_step_of_its_targets(
    case: tuple[list[Phase], int],
) -> None:
    phases, stop = case
    check_phases(phases, len(phases[0].weights))
    served = list(mixture_order(phases, 0, stop))
    positions = [0] * len(phases[0].weights)
    for k, phase in enumerate(phases):
        end = phases[k + 1].start if k + 1 < len(phases) else stop
        total = sum(phase.weights)
        counts = [0] * len(phase.weights)
        for t, (component, position) in enumerate(served[phase.start : end], start=1):
            assert phase.weights[component] > 0  # a weight of 0 is never served
            assert position == positions[component]  # positions count over every phase
            positions[component] += 1
            counts[component] += 1
            for c, w in zip(counts, phase.weights, strict=True):
                assert abs(c - Fraction(t * w, total)) < 1


@SETTINGS
@given(schedules(), st.integers(0, 900), st.integers(1, 50))
def test_a_range_is_the_slice_of_the_whole_order_and_ratios_alone_matter(
    case: tuple[list[Phase], int], first: int, factor: int
) -> None:
    phases, stop = case
    first = min(first, stop)
    whole = list(mixture_order(phases, 0, stop))
    assert list(mixture_order(phases, first, stop)) == whole[first:]
    scaled = [Phase(p.start, tuple(w * factor for w in p.weights)) for p in phases]
    if all(w <= MAX_UNITS for p in scaled for w in p.weights):
        assert list(mixture_order(scaled, 0, stop)) == whole


@SETTINGS
@given(weights, st.data())
def test_select_serves_the_earliest_due_eligible_component(
    w: list[int], data: st.DataObject
) -> None:
    counts = data.draw(st.lists(st.integers(0, 50), min_size=len(w), max_size=len(w)))
    live = [i for i, x in enumerate(w) if x > 0]
    got = select(w, counts)
    if len(live) == 1:
        assert got == live[0]
        return
    s, total, delta = sum(counts) + 1, sum(w), Fraction(1, 2 * (len(live) - 1))
    eligible = [i for i in live if Fraction(s * w[i], total) - counts[i] >= delta]
    due = {i: (counts[i] + 1 - delta) * Fraction(total, w[i]) for i in eligible}
    want = min(eligible, key=lambda i: (due[i], i)) if eligible else -1
    assert got == want


def test_a_lag_the_largest_deficit_rule_cannot_keep_within_one_step() -> None:
    """Weights 8, 40, 392, 392: serving the largest deficit first leaves a component 53/52
    steps behind at step 34; the rule keeps every count within one step."""
    weights = (8, 40, 392, 392)
    counts = [0] * 4
    for t, (component, _) in enumerate(mixture_order([Phase(0, weights)], 0, 2000), start=1):
        counts[component] += 1
        for c, w in zip(counts, weights, strict=True):
            assert abs(c - Fraction(t * w, 832)) < 1
