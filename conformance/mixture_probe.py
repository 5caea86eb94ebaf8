"""The probe's answer to a ``mixture_order`` query (``PROTOCOL.md``, ``SPEC.md`` section 21).

The query's schedule is checked field by field (a malformed one is answered ``invalid_query``
with the field named), then answered with the core's ``MixtureSchedule``, which computes any
step at once; the vectors come from ``zerobatch_spec.mixture``, which walks the rule step by
step, so the two implementations check each other.
"""

from __future__ import annotations

import math
from typing import Any

from zerobatch_spec import U64_MAX
from zerobatch_spec.mixture import (
    MAX_COMPONENTS,
    MAX_PHASES,
    MAX_UNITS,
    MixtureSpecError,
    Phase,
    check_phases,
)

from zerobatch_core.delivery import mixing
from zerobatch_core.delivery.mixing import MixtureSchedule

MAX_STEPS = 1 << 20
"""Longest range this probe answers; a longer one is answered ``unsupported``."""


class MixtureQueryError(Exception):
    """A malformed ``mixture_order`` query; the message names the field."""


def _integer(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MixtureQueryError(
            f"mixture_order: field {name} must be a JSON integer, got {value!r:.80}"
        )
    if not low <= value <= high:
        raise MixtureQueryError(
            f"mixture_order: field {name} must be in [{low}, {high}], got {value}"
        )
    return value


def _list(name: str, value: object, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise MixtureQueryError(
            f"mixture_order: field {name} must be a JSON list, got {value!r:.80}"
        )
    if not 1 <= len(value) <= most:
        raise MixtureQueryError(
            f"mixture_order: field {name} must hold 1 to {most} entries, got {len(value)}"
        )
    return value


def parse_mixture_query(query: dict[str, Any]) -> tuple[list[Phase], int, int]:
    """``(phases, first, stop)`` of a ``mixture_order`` query, every field checked."""
    for name in ("phases", "first", "stop"):
        if name not in query:
            raise MixtureQueryError(f"mixture_order: field {name} is missing")
    phases = []
    for k, entry in enumerate(_list("phases", query["phases"], MAX_PHASES)):
        if not isinstance(entry, dict):
            raise MixtureQueryError(
                f"mixture_order: phases[{k}] must be a JSON object, got {entry!r:.80}"
            )
        for name in ("start", "weights"):
            if name not in entry:
                raise MixtureQueryError(f"mixture_order: phases[{k}].{name} is missing")
        start = _integer(f"phases[{k}].start", entry["start"], 0, U64_MAX)
        weights = _list(f"phases[{k}].weights", entry["weights"], MAX_COMPONENTS)
        units = [
            _integer(f"phases[{k}].weights[{i}]", w, 0, MAX_UNITS) for i, w in enumerate(weights)
        ]
        phases.append(Phase(start, tuple(units)))
    first = _integer("first", query["first"], 0, U64_MAX)
    stop = _integer("stop", query["stop"], first, U64_MAX)
    try:
        check_phases(phases, len(phases[0].weights))
    except MixtureSpecError as e:
        raise MixtureQueryError(f"mixture_order: {e}") from None
    return phases, first, stop


def answer_mixture_order(query: dict[str, Any], invalid: str) -> dict[str, Any]:
    """The answer: ``[component, position]`` of every step ``first..stop``."""
    try:
        phases, first, stop = parse_mixture_query(query)
    except MixtureQueryError as e:
        return {"error": invalid, "detail": str(e)}
    if stop - first > MAX_STEPS:
        return {"unsupported": True, "detail": f"ranges longer than {MAX_STEPS} steps"}
    for k, phase in enumerate(phases):  # a phase of a long period is walked step by step
        end = min(stop, phases[k + 1].start if k + 1 < len(phases) else stop)
        long_period = sum(phase.weights) // math.gcd(*phase.weights) > mixing.PERIOD_LIMIT
        if long_period and end - phase.start > MAX_STEPS:
            return {"unsupported": True, "detail": f"phase {k} walked for over {MAX_STEPS} steps"}
    schedule = MixtureSchedule(phases)
    return {"result": [list(schedule.at(step)) for step in range(first, stop)]}
