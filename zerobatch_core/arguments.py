"""Checks for integer arguments, shared so every entry point words its errors the same way."""

from __future__ import annotations

import numpy as np
from zerobatch_spec import U32_MAX, U64_MAX

# The bounds are zerobatch_spec's; they are re-exported for the modules that check arguments.
__all__ = ["U32_MAX", "U64_MAX", "int_arg"]

_NAMED = {U32_MAX: "2**32 - 1", U64_MAX: "2**64 - 1"}


def int_arg(
    name: str,
    value: object,
    low: int,
    high: int | None = None,
    error: type[ValueError] = ValueError,
) -> int:
    """``value`` as an ``int`` in ``[low, high]``, or ``error`` naming the argument and rule.

    Booleans and floats are refused even though Python would coerce them: a ``batch_size`` of
    ``True`` or ``32.0`` is a caller's bug, not a request.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        kind = TypeError if error is ValueError else error
        raise kind(f"{name} must be an integer, got {type(value).__name__}")
    v = int(value)
    if v < low or (high is not None and v > high):
        if high is None:
            raise error(f"{name} must be at least {low}, got {v}")
        raise error(f"{name} must be in [{low}, {_NAMED.get(high, high)}], got {v}")
    return v
