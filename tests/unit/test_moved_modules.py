"""The module paths from before the wings stay importable (``zerobatch_core/_moved.py``)."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

from zerobatch_core import _moved


@pytest.mark.parametrize(("old", "new"), sorted(_moved.MOVED.items()))
def test_an_old_path_is_its_new_homes_module(old: str, new: str) -> None:
    module = importlib.import_module(f"zerobatch_core.{old}")
    assert module is importlib.import_module(f"zerobatch_core.{new}")
    assert module.__spec__ is not None
    assert module.__name__ == module.__spec__.name == f"zerobatch_core.{new}"


def test_the_old_names_of_the_split_modules_still_import() -> None:
    from zerobatch_core.datasets.validation import DatasetReport, validate_dataset
    from zerobatch_core.files.validation import ValidationReport, validate_file
    from zerobatch_core.stores.resolve import open_store
    from zerobatch_core.stores.store import LocalStore, Store, StoreError, split_url

    assert LocalStore.__module__ == "zerobatch_core.stores.store" and issubclass(LocalStore, Store)
    assert open_store.__module__ == "zerobatch_core.stores.resolve"
    assert StoreError.__module__ == split_url.__module__ == "zerobatch_core.stores.store"
    assert (
        validate_file.__module__ == ValidationReport.__module__ == "zerobatch_core.files.validation"
    )
    assert (
        validate_dataset.__module__
        == DatasetReport.__module__
        == "zerobatch_core.datasets.validation"
    )


def test_the_readme_imports_of_live_datasets_work() -> None:
    from zerobatch_core.datasets.remote import RemoteSource
    from zerobatch_core.live.producer import LiveProducer
    from zerobatch_core.live.retention import reclaim, record_watermark
    from zerobatch_core.live.source import LiveSource

    assert issubclass(LiveSource, RemoteSource) and callable(reclaim) and callable(record_watermark)
    assert LiveProducer.__module__ == "zerobatch_core.live.producer"


def test_objects_pickled_by_their_class_still_load() -> None:
    from zerobatch_core.delivery.loader import Position

    assert pickle.loads(pickle.dumps(Position(1, 2))) == Position(1, 2)


def test_an_old_path_imports_in_a_fresh_process() -> None:
    # Nothing else imported first: the alias is found through the package alone.
    code = (
        "import sys, zerobatch_core.loader as m; "
        "print(m.__name__, 'zerobatch_core.loader' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["zerobatch_core.delivery.loader", "True"]


def test_an_unknown_old_path_is_not_invented() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("zerobatch_core.no_such_module")
