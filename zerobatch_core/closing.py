"""``Closing``: the context-manager half of every ZeroBatch object that holds a resource.

Readers, datasets, remote sources, producers, conversion sources and streams all hold
descriptors, mappings, threads or connections that ``close()`` releases; ``with obj:`` must
release them on every exit. The two dunder methods are the same for all of them, so they
live here once.
"""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

__all__ = ["Closing"]

C = TypeVar("C", bound="Closing")


class Closing:
    """Mixin: ``with obj:`` returns ``obj`` and calls ``obj.close()`` when the block exits."""

    __slots__ = ()

    def close(self) -> None:
        """Release what the object holds; safe to call more than once."""
        raise NotImplementedError

    def __enter__(self: C) -> C:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
