"""The module paths of ZeroBatch 0.1, before the core was laid out in wings, kept importable.

``import zerobatch_core.loader`` (or ``from zerobatch_core.storage import LocalStore``) still
works: each old path is an alias of its new home, the very same module object, so code written
against the old paths (and ``monkeypatch`` targets naming them) keeps working. New code should
import from the wings (``zerobatch_core.delivery.loader``) or from ``zerobatch_core`` itself.
Two old modules were split when their imports were untangled; their old paths name the module
that imports the rest: ``storage`` is ``stores`` (the interface, ``LocalStore`` and
``open_store``) and ``validation`` is ``datasets.validation`` (which also offers
``validate_file`` and ``ValidationReport``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

MOVED = {
    "reader": "files.reader",
    "writer": "files.writer",
    "pages": "files.pages",
    "validation": "datasets.validation",
    "storage": "stores",
    "object_stores": "stores.object_stores",
    "range_cache": "stores.range_cache",
    "regular_files": "stores.regular_files",
    "dataset": "datasets.dataset",
    "dataset_build": "datasets.build",
    "dataset_replace": "datasets.replace",
    "remote": "datasets.remote",
    "live_manifests": "live.manifests",
    "live_source": "live.source",
    "commit_cadence": "live.cadence",
    "retention": "live.retention",
    "sources": "delivery.sources",
    "loader": "delivery.loader",
    "stream": "delivery.stream",
    "slicing": "delivery.slicing",
    "provenance": "delivery.provenance",
    "buffers": "delivery.buffers",
    "documents": "delivery.documents",
    "distributed": "delivery.distributed",
    "ray_convert": "ingest.ray_convert",
    "speed_demo": "cli.speed_demo",
}
"""Old module name (under ``zerobatch_core``) -> its new home."""

_PREFIX = "zerobatch_core."


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths and loads each as its new home's module object."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(_PREFIX) and fullname[len(_PREFIX) :] in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(_PREFIX + MOVED[spec.name[len(_PREFIX) :]])
        spec.loader_state = module.__spec__  # the import machinery puts the alias's spec on it
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and spec.loader is self and spec.loader_state is not None:
            module.__spec__ = spec.loader_state  # it stays the module of its new home


def install() -> None:
    """Make the old paths importable (once per process)."""
    if not any(isinstance(finder, _Aliases) for finder in sys.meta_path):
        sys.meta_path.append(_Aliases())
