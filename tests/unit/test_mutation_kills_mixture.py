"""Exact behaviour of ``zerobatch_spec.mixture`` at its bounds and in its messages, and rule
sequences that tell Tijdeman's constants apart (each case fails with a slip in the rule)."""

from __future__ import annotations

import dataclasses

import pytest
from zerobatch_spec import U64_MAX
from zerobatch_spec.mixture import (
    MixtureSpecError,
    Phase,
    check_phases,
    mixture_order,
    select,
    weight_units,
)


def order(weights: tuple[int, ...], steps: int) -> list[int]:
    return [c for c, _ in mixture_order([Phase(0, weights)], 0, steps)]


@pytest.mark.parametrize(
    ("weights", "first"),
    [
        ((7, 3, 1, 0), [0, 0, 1, 0, 1, 0, 0, 2, 0, 1, 0, 0]),  # weight 0: not one of the m
        ((0, 7, 2), [1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 2]),
        ((0, 1, 3), [2, 1, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2]),  # D = 2 (m - 1), not 3 (m - 1)
        ((7, 7, 1), [0, 1, 0, 1, 0, 1, 0, 1, 2, 0, 1, 0]),  # D = 2 (m - 1), not 2 (m + 1)
        ((5, 7), [1, 0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1]),  # D = 2 (m - 1), not 2 m
        ((1, 7, 5), [1, 2, 1, 2, 1, 2, 1, 1, 0, 2, 1, 2]),  # due steps (c + 1 - 1/D) W / w
    ],
)
def test_sequences_that_pin_the_rules_constants(weights: tuple[int, ...], first: list[int]) -> None:
    assert order(weights, len(first)) == first


def test_select_with_one_live_component_and_zero_weights() -> None:
    assert select([0, 4, 0], [0, 3, 0]) == 1
    assert select([2, 2], [0, 0]) == 0 and select([2, 2], [1, 0]) == 1


def test_weights_at_their_bounds() -> None:
    assert weight_units("1000000") == 10**15  # the largest weight, in units of 1e-9
    assert weight_units(10**6) == 10**15
    assert weight_units("0.000000001") == 1
    with pytest.raises(MixtureSpecError, match="at most 1000000"):
        weight_units("1000000.000000001")
    for bad in (True, None, [1]):
        with pytest.raises(MixtureSpecError, match="must be a number, got"):
            weight_units(bad)


def test_schedules_at_their_bounds() -> None:
    check_phases([Phase(0, (10**15, 1))], 2)
    with pytest.raises(MixtureSpecError, match="weight 0 out of range"):
        check_phases([Phase(0, (10**15 + 1, 1))], 2)
    check_phases([Phase(0, (1,) * 4096)], 4096)
    with pytest.raises(MixtureSpecError, match="1 to 4096 components, got 4097"):
        check_phases([Phase(0, (1,) * 4097)], 4097)
    with pytest.raises(MixtureSpecError, match="1 to 4096 components, got 0"):
        check_phases([Phase(0, ())], 0)
    check_phases([Phase(k, (1,)) for k in range(4096)], 1)
    with pytest.raises(MixtureSpecError, match="1 to 4096 phases"):
        check_phases([Phase(k, (1,)) for k in range(4097)], 1)
    check_phases([Phase(0, (1,)), Phase(U64_MAX, (1,))], 1)  # the last step a phase can start
    with pytest.raises(MixtureSpecError, match=r"start must be in \[0, 2\^64\), got -1"):
        check_phases([Phase(0, (1,)), Phase(-1, (1,))], 1)
    with pytest.raises(MixtureSpecError, match="start must be an integer"):
        check_phases([Phase(0, (1,)), Phase(True, (1,))], 1)  # type: ignore[arg-type]
    for weight in (True, 1.5):
        with pytest.raises(MixtureSpecError, match="weight 0 out of range"):
            check_phases([Phase(0, (weight,))], 1)  # type: ignore[arg-type]


def test_schedule_messages_name_the_values() -> None:
    with pytest.raises(MixtureSpecError, match="starts at step 0, got 3"):
        check_phases([Phase(3, (1,)), Phase(9, (1,))], 1)
    with pytest.raises(MixtureSpecError, match="phase 2: starts must increase, got 5 after 7"):
        check_phases([Phase(0, (1,)), Phase(7, (1,)), Phase(5, (1,))], 1)


def test_phases_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Phase(0, (1,)).start = 3  # type: ignore[misc]
