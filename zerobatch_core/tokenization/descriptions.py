"""Tokenizers described as JSON: plain data that a worker process rebuilds a tokenizer from.

A description is a JSON object whose ``"kind"`` is the tokenizer's spec kind (``byte``, ``hf``,
``tiktoken``) and whose other fields are strings, integers, string-to-integer objects and
``null`` only, never code: each kind writes its own with :func:`write_description` in its
``to_json`` and reads it back in its ``from_description``, checking every field with
:func:`description_field` or :func:`optional_field` so that a bad description gets an error
naming the field, not a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import IngestError
from .protocol import KINDS

T = TypeVar("T")


def write_description(kind: str, **fields: object) -> str:
    """The JSON description ``{"kind": kind, **fields}`` (compact, non-ASCII kept as is)."""
    return json.dumps({"kind": kind, **fields}, ensure_ascii=False, separators=(",", ":"))


def read_description(text: str) -> dict[str, Any]:
    """Parse a tokenizer description: a JSON object whose ``"kind"`` is one of :data:`KINDS`."""
    if not isinstance(text, str):
        raise IngestError(f"a tokenizer description must be a str, got {type(text).__name__}")
    try:
        desc = json.loads(text)
    except json.JSONDecodeError as e:
        raise IngestError(f"tokenizer description: not JSON: {e}") from e
    if not isinstance(desc, dict):
        raise IngestError(
            f"tokenizer description: expected a JSON object, got {type(desc).__name__}"
        )
    kind = desc.get("kind")
    if kind not in KINDS:
        raise IngestError(
            f"tokenizer description: field 'kind' is {kind!r}, expected one of "
            f"{', '.join(map(repr, KINDS))}"
        )
    return desc


def optional_field(desc: Mapping[str, Any], key: str, expected: type[T]) -> T | None:
    """``desc[key]``, checked to be an ``expected`` or ``null`` (``None``).

    A missing field or one of another type raises ``IngestError`` naming the kind, the field,
    the expected and the found type. ``bool`` is not accepted where ``int`` is expected.
    """
    if key not in desc:
        raise IngestError(f"{_where(desc)}: field {key!r} is missing")
    value = desc[key]
    if value is not None and (
        not isinstance(value, expected) or (expected is int and isinstance(value, bool))
    ):
        raise IngestError(
            f"{_where(desc)}: field {key!r} is {type(value).__name__}, expected {expected.__name__}"
        )
    return value


def description_field(desc: Mapping[str, Any], key: str, expected: type[T]) -> T:
    """``desc[key]``, checked to be an ``expected``; as :func:`optional_field`, ``null`` refused."""
    value = optional_field(desc, key, expected)
    if value is None:
        raise IngestError(f"{_where(desc)}: field {key!r} is null, expected {expected.__name__}")
    return value


def _where(desc: Mapping[str, Any]) -> str:
    return f"{desc.get('kind')} tokenizer description"
