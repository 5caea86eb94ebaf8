"""Mixtures (``SPEC.md`` section 21): which component serves each global step of a blend.

A mixture blends components by weight, in phases that start at given global steps. Each step
serves one whole global batch of one component, chosen by a rule with no random state
(``select``: Tijdeman's rule, which keeps every component within one step of its share at
every prefix of a phase). The state the rule needs is the phase's counts; everything here is
exact integer arithmetic, so every implementation serves the same component at every step.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .layout import U64_MAX

WEIGHT_DIGITS = 9
"""Fraction digits a weight may have: weights are read as exact decimals, in units of 1e-9."""
WEIGHT_SCALE = 10**WEIGHT_DIGITS
MAX_WEIGHT = 10**6
"""The largest weight."""
MAX_UNITS = MAX_WEIGHT * WEIGHT_SCALE
"""The largest weight in units of 1e-9."""
MAX_COMPONENTS = 4096
MAX_PHASES = 4096


class MixtureSpecError(ValueError):
    """A weight, phase or schedule that section 21 does not allow; the message names it."""


def weight_units(value: object, where: str = "weight") -> int:
    """``value`` (an int, a float, a decimal string or ``Decimal``) in units of 1e-9, exactly.

    A float is read as the shortest decimal that round-trips it (``repr``), so ``0.3`` is
    300,000,000 units, as a JSON document's ``0.3`` is. Refused: a bool, a negative or
    non-finite number, more than ``WEIGHT_DIGITS`` fraction digits, more than ``MAX_WEIGHT``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str, decimal.Decimal)):
        raise MixtureSpecError(f"{where} must be a number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MixtureSpecError(f"{where} must be finite, got {value!r}")
        text = repr(value)
    else:
        text = str(value)
    try:
        exact = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise MixtureSpecError(f"{where} must be a decimal number, got {value!r}") from None
    if not exact.is_finite() or exact < 0:
        raise MixtureSpecError(f"{where} must be a number >= 0, got {value!r}")
    if exact > MAX_WEIGHT:
        raise MixtureSpecError(f"{where} must be at most {MAX_WEIGHT}, got {value!r}")
    scaled = exact.scaleb(WEIGHT_DIGITS)
    if scaled != scaled.to_integral_value():
        raise MixtureSpecError(f"{where} has more than {WEIGHT_DIGITS} fraction digits: {value!r}")
    return int(scaled)


@dataclass(frozen=True)
class Phase:
    """The weights (units of 1e-9, one per component) in force from global step ``start``."""

    start: int
    weights: tuple[int, ...]


def check_phases(phases: Sequence[Phase], components: int) -> None:
    """Raise ``MixtureSpecError`` unless ``phases`` is a valid schedule of ``components``."""
    if not 1 <= len(phases) <= MAX_PHASES:
        raise MixtureSpecError(f"a schedule has 1 to {MAX_PHASES} phases, got {len(phases)}")
    if not 1 <= components <= MAX_COMPONENTS:
        raise MixtureSpecError(f"a mixture has 1 to {MAX_COMPONENTS} components, got {components}")
    if phases[0].start != 0:
        raise MixtureSpecError(f"the first phase starts at step 0, got {phases[0].start}")
    for k, phase in enumerate(phases):
        if isinstance(phase.start, bool) or not isinstance(phase.start, int):
            raise MixtureSpecError(f"phase {k}: start must be an integer, got {phase.start!r}")
        if not 0 <= phase.start <= U64_MAX:
            raise MixtureSpecError(f"phase {k}: start must be in [0, 2^64), got {phase.start}")
        if k and phase.start <= phases[k - 1].start:
            raise MixtureSpecError(
                f"phase {k}: starts must increase, got {phase.start} after {phases[k - 1].start}"
            )
        if len(phase.weights) != components:
            raise MixtureSpecError(
                f"phase {k}: {len(phase.weights)} weights for {components} components"
            )
        for i, w in enumerate(phase.weights):
            if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_UNITS:
                raise MixtureSpecError(f"phase {k}: weight {i} out of range: {w!r}")
        if not any(phase.weights):
            raise MixtureSpecError(f"phase {k}: every weight is 0 (at least one must be > 0)")


def select(weights: Sequence[int], counts: Sequence[int]) -> int:
    """The component a phase serves next, given how many of the phase's steps each served.

    Tijdeman's rule for the chairman assignment problem: with ``m`` components of weight above
    0, ``W = sum(weights)``, ``s = sum(counts)`` steps served and ``D = 2 * (m - 1)``, the
    *eligible* components are those whose share of the first ``s + 1`` steps exceeds their
    count by at least ``1 / D`` (``D * ((s + 1) * w_i - c_i * W) >= W``); the phase serves the
    eligible component with the earliest *due step* ``(c_i + 1 - 1/D) * W / w_i``, the lowest
    index on ties. A single component of weight above 0 is always served.
    """
    live = [i for i, w in enumerate(weights) if w > 0]
    if len(live) == 1:
        return live[0]
    total, s, d = sum(weights), sum(counts) + 1, 2 * (len(live) - 1)
    best = -1
    for i in live:
        w, c = weights[i], counts[i]
        if d * (s * w - c * total) < total:
            continue  # not eligible: served enough for now
        # Due steps compare as (d * (c + 1) - 1) / w (W and d are common factors).
        if best < 0 or (d * (c + 1) - 1) * weights[best] < (d * (counts[best] + 1) - 1) * w:
            best = i
    return best


def phase_at(phases: Sequence[Phase], step: int) -> int:
    """The index of the phase in force at global ``step``."""
    lo, hi = 0, len(phases)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if phases[mid].start <= step:
            lo = mid
        else:
            hi = mid
    return lo


def mixture_order(phases: Sequence[Phase], first: int, stop: int) -> Iterator[tuple[int, int]]:
    """``(component, position)`` served at each global step ``first..stop``: the component and
    how many steps it served before this one (its cursor, over every phase from step 0)."""
    n = len(phases[0].weights)
    positions = [0] * n
    counts = [0] * n
    phase = 0
    for step in range(stop):
        if phase + 1 < len(phases) and phases[phase + 1].start == step:
            phase, counts = phase + 1, [0] * n
        i = select(phases[phase].weights, counts)
        if step >= first:
            yield i, positions[i]
        counts[i] += 1
        positions[i] += 1
