"""The probe's answer for a live-dataset vector (``<id>.live``: ``PROTOCOL.md``).

The descriptor (``live.json``) is checked first, then the manifest version (``manifest.json``)
against it, by ``SPEC.md`` section 18's rules in order; the first failure is answered with its
code and field (a descriptor's field prefixed ``live.json:``), a valid manifest with what a
reader derives from it.
"""

from __future__ import annotations

import os
from typing import Any

from zerobatch_spec.live import (
    DESCRIPTOR_NAME,
    LiveViolation,
    parse_descriptor,
    parse_live_manifest,
)

MANIFEST_FILE = "manifest.json"


def describe_live(path: str) -> dict[str, Any]:
    """Protocol answer for a ``.live`` vector."""
    try:
        with open(os.path.join(path, DESCRIPTOR_NAME), "rb") as f:
            descriptor_bytes = f.read()
        with open(os.path.join(path, MANIFEST_FILE), "rb") as f:
            manifest_bytes = f.read()
    except OSError as e:
        return {"valid": False, "error": "unreadable_path", "detail": str(e)}
    descriptor = parse_descriptor(descriptor_bytes)
    if isinstance(descriptor, LiveViolation):
        where = f"{DESCRIPTOR_NAME}:{descriptor.where}"
        return {"valid": False, "error": descriptor.code.value, "where": where}
    m = parse_live_manifest(manifest_bytes, descriptor)
    if isinstance(m, LiveViolation):
        return {"valid": False, "error": m.code.value, "where": m.where, "detail": m.detail}
    return {
        "valid": True,
        "version": m.version,
        "batches": m.batches,
        "start": m.start,
        "segments": [[r.first, r.num_batches, r.entries] for r in m.segments],
        "entries": [[e.name, e.first, e.num_batches, e.producer, e.offset] for e in m.tail],
        "producers": {p: s.offset for p, s in sorted(m.producers.items())},
    }
