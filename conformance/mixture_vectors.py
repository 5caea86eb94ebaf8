"""Query vectors for mixtures (``SPEC.md`` section 21): ``mixture_order`` answers, and refusals.

Every answer comes from ``zerobatch_spec.mixture.mixture_order``, which walks section 21.2's
rule step by step from step 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from zerobatch_spec import U64_MAX
from zerobatch_spec.mixture import MAX_UNITS, Phase, mixture_order

from .vector import Vector, invalid_query_vector, query_vector

CASES: list[tuple[str, str, list[tuple[int, list[int]]], int, int]] = [
    (
        "weights-50-30-20",
        "weights 0.5, 0.3, 0.2 in units",
        [(0, [500_000_000, 300_000_000, 200_000_000])],
        0,
        200,
    ),
    ("equal-weights", "equal weights: a round robin", [(0, [1, 1, 1, 1])], 0, 40),
    ("one-component", "a single component", [(0, [7])], 0, 10),
    ("zero-weight", "a component of weight 0 is never served", [(0, [3, 0, 1])], 0, 60),
    (
        "largest-deficit-lags",
        "weights where serving the largest deficit lags by more than one step",
        [(0, [8, 40, 392, 392])],
        0,
        900,
    ),
    (
        "two-phases",
        "an annealing phase from step 90: counts restart, positions carry on",
        [
            (0, [600_000_000, 300_000_000, 100_000_000]),
            (90, [200_000_000, 200_000_000, 600_000_000]),
        ],
        0,
        300,
    ),
    (
        "phases-range",
        "a range inside the third phase of four, the first phase dropping a component",
        [(0, [0, 1, 1]), (17, [5, 0, 2]), (40, [1, 2, 3]), (1000, [1, 1, 1])],
        500,
        700,
    ),
    (
        "long-period",
        "weights with nine fraction digits: a period of over 10^9 steps",
        [(0, [123_456_789, 987_654_321, 555_555_555])],
        0,
        3000,
    ),
    (
        "max-units",
        "the largest weight (10^6, 10^15 units) beside the smallest",
        [(0, [MAX_UNITS, 1, MAX_UNITS])],
        0,
        50,
    ),
    (
        "late-phase",
        "a phase starting near 2^64: steps far beyond the range are never reached",
        [(0, [1, 2]), (U64_MAX - 5, [2, 1])],
        100,
        130,
    ),
    ("empty-range", "first = stop: no steps", [(0, [1, 1])], 12, 12),
]


def _query(phases: list[tuple[int, list[int]]], first: int, stop: int) -> dict[str, Any]:
    return {
        "op": "mixture_order",
        "phases": [{"start": s, "weights": w} for s, w in phases],
        "first": first,
        "stop": stop,
    }


def mixture_query_vectors() -> Iterator[Vector]:
    for name, comment, phases, first, stop in CASES:
        spec = [Phase(s, tuple(w)) for s, w in phases]
        result = [list(pair) for pair in mixture_order(spec, first, stop)]
        yield query_vector(f"mixture-order-{name}", comment, _query(phases, first, stop), result)
    good = _query([(0, [1, 2]), (10, [3, 1])], 0, 20)
    bad: list[tuple[str, str, object]] = [
        ("missing-phases", "no phases", {k: v for k, v in good.items() if k != "phases"}),
        ("missing-stop", "no stop", {k: v for k, v in good.items() if k != "stop"}),
        ("no-phase", "an empty schedule", {**good, "phases": []}),
        ("phases-not-a-list", "phases is an object", {**good, "phases": {"start": 0}}),
        ("phase-not-an-object", "a phase that is a list", {**good, "phases": [[0, [1, 2]]]}),
        ("first-phase-late", "the first phase starts at step 1", _query([(1, [1, 2])], 0, 5)),
        (
            "starts-not-increasing",
            "two phases start at step 10",
            _query([(0, [1, 2]), (10, [1, 1]), (10, [2, 1])], 0, 5),
        ),
        (
            "weight-count-differs",
            "a phase with another number of weights",
            _query([(0, [1, 2]), (10, [1, 2, 3])], 0, 5),
        ),
        (
            "all-weights-zero",
            "a phase whose weights are all 0",
            _query([(0, [1, 2]), (10, [0, 0])], 0, 5),
        ),
        ("weight-negative", "weight -1", _query([(0, [1, -1])], 0, 5)),
        ("weight-above-max", "weight 10^15 + 1 units", _query([(0, [1, MAX_UNITS + 1])], 0, 5)),
        ("weight-fraction", "weight 0.5: weights are integer units", _query([(0, [1, 0.5])], 0, 5)),  # type: ignore[list-item]
        ("missing-weights", "a phase without weights", {**good, "phases": [{"start": 0}]}),
        ("stop-before-first", "stop 4 before first 5", _query([(0, [1, 2])], 5, 4)),
        (
            "start-above-u64",
            "a phase start of 2^64",
            _query([(0, [1, 2]), (U64_MAX + 1, [1, 1])], 0, 5),
        ),
        ("weight-boolean", "weight true", _query([(0, [1, True])], 0, 5)),
    ]
    for name, comment, query in bad:
        yield invalid_query_vector(f"invalid-query-mixture-{name}", comment, query)
