"""Exceptions raised by ZeroBatch; every one names the file (or argument) and the rule broken."""

from __future__ import annotations

import os

from zerobatch_spec import ErrorCode, Violation


class ZeroBatchError(Exception):
    """Base class of every error ZeroBatch raises on purpose."""


class FormatError(ZeroBatchError, ValueError):
    """A file breaks an LLMBATCH validation rule.

    ``code`` is the stable error code (see ``SPEC.md``), ``field`` the header field or region
    concerned, ``path`` the file. The message carries all three.
    """

    def __init__(self, path: str | os.PathLike[str], violation: Violation) -> None:
        self.path = os.fspath(path)
        self.code: ErrorCode = violation.code
        self.field = violation.field
        self.detail = violation.detail
        super().__init__(f"{self.path}: {self.code.value}: field {self.field}: {self.detail}")


class WriteError(ZeroBatchError, ValueError):
    """Arguments or input records that cannot be written as an LLMBATCH file."""


class StateError(ZeroBatchError, ValueError):
    """A loader state (checkpoint) that does not match the loader it is loaded into."""


class IngestError(ZeroBatchError, ValueError):
    """Input data (text, documents, token arrays) that cannot be ingested into records.

    The message names the file and the position in it (row group, line, byte offset) so that a
    bad record in a large corpus can be found without re-running the ingestion.
    """
