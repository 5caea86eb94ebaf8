"""Exceptions raised by ZeroBatch; every one names the file (or argument) and the rule broken."""

from __future__ import annotations

import os

from zerobatch_spec import ErrorCode, Violation
from zerobatch_spec.dataset import DatasetViolation

from .redaction import scrub


class ZeroBatchError(Exception):
    """Base class of every error ZeroBatch raises on purpose.

    Its text never carries credentials: ``str()`` is scrubbed of URL user information and of
    every secret this process was given (``redaction.scrub``), whatever the message was built
    from (a path given by the caller, an object-store client's error text).
    """

    def __str__(self) -> str:
        return scrub(super().__str__())


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


class DatasetError(ZeroBatchError, ValueError):
    """A dataset that does not match its manifest, or a manifest that breaks a rule.

    ``code`` is the stable code (``zerobatch_spec.dataset.DatasetCode``), ``path`` the manifest
    or shard concerned, ``where`` the manifest field or slot, and the message carries all three.
    """

    def __init__(self, path: str, violation: DatasetViolation) -> None:
        self.path = path
        self.code, self.where, self.detail = violation.code, violation.where, violation.detail
        super().__init__(f"{path}: {self.code.value}: {self.where}: {self.detail}")


class WriteError(ZeroBatchError, ValueError):
    """Arguments or input records that cannot be written as an LLMBATCH file."""


class StateError(ZeroBatchError, ValueError):
    """A loader state (checkpoint) that does not match the loader it is loaded into."""


class IngestError(ZeroBatchError, ValueError):
    """Input data (text, documents, token arrays) that cannot be ingested into records.

    The message names the file and the position in it (row group, line, byte offset) so that a
    bad record in a large corpus can be found without re-running the ingestion.
    """


class ZeroBatchIOError(ZeroBatchError, OSError):
    """An operating-system error (disk full, permission denied, a vanished file) while ZeroBatch
    read or wrote ``path``.

    Still an ``OSError`` (``errno`` and ``filename`` are set), so existing ``except OSError``
    handlers keep working; the message says which path and, where it helps (``ENOSPC``), how
    many bytes the operation needed.
    """

    def __init__(self, errno: int, message: str, path: str | os.PathLike[str]) -> None:
        super().__init__(errno, message, os.fspath(path))


class MissingDependencyError(ZeroBatchError, ImportError):
    """An optional dependency is not installed; ``extra`` is the ``pip install zerobatch[...]``
    extra that provides it."""

    def __init__(self, module: str, extra: str, what: str) -> None:
        self.module, self.extra = module, extra
        super().__init__(
            f"{what} needs the optional dependency {module!r}: pip install 'zerobatch[{extra}]'",
            name=module,
        )
