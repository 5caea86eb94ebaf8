"""Hostile mixture files: ``load_mixture`` answers any JSON with a ``Mixture`` or a
``MixtureError`` naming the file, never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobatch_core import Mixture, MixtureError, load_mixture

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["1e999999999", "1e-999999999", "NaN", "-0", "0.5", "3e-1", "0x10"]),
)


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)


values = st.recursive(scalars, _nested, max_leaves=12)
component = st.fixed_dictionaries(
    {
        "name": st.one_of(st.text(max_size=4), values),
        "source": st.one_of(st.just("x.batch"), values),
    },
    optional={"weight": st.one_of(scalars, values)},
)
documents = st.fixed_dictionaries(
    {
        "format": st.one_of(st.just("zerobatch.mixture"), values),
        "version": st.one_of(st.just(1), values),
        "components": st.one_of(st.lists(component, max_size=4), values),
    },
    optional={
        "schedule": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"start": st.one_of(st.integers(-5, 2**65), values), "weights": values}
                ),
                max_size=3,
            ),
            values,
        ),
        "global_batch_size": st.one_of(st.integers(-3, 2**70), values),
        "steps": st.one_of(st.integers(-3, 2**70), values),
    },
)


@SETTINGS
@given(documents)
def test_any_document_is_a_mixture_or_a_named_refusal(doc: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mix.json"
        path.write_text(json.dumps(doc))
        try:
            mixture = load_mixture(path)
        except MixtureError as e:
            assert str(path) in str(e)
        else:
            assert isinstance(mixture, Mixture)
            assert len(mixture.components) == len(doc["components"])
