"""A pytest plugin for the coverage map of a mutation session: each test's lines are recorded
under the test's node id (``coverage run -m pytest -p coverage_contexts``), so that a mutant can
be tried first against the tests that execute its line (tests/mutation/select_tests.py)."""

from __future__ import annotations

from collections.abc import Iterator

import coverage
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")
