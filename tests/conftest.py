"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from tests.helpers import records
from zerobatch_core import write_batch_file

# CI replays the same examples on every run, so a red build is always reproducible; local runs
# keep exploring new ones. Select with HYPOTHESIS_PROFILE=ci.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def make_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a small LLMBATCH file from unique records and return its path."""

    def make(
        n: int = 40, seq_len: int = 8, batch_size: int = 4, seed: int = 7, name: str = "f.batch"
    ) -> Path:
        path = tmp_path / name
        write_batch_file(path, records(n, seq_len), batch_size, seed=seed, allow_empty=True)
        return path

    return make


@pytest.fixture
def vectors_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "conformance" / "vectors"


def pytest_report_header() -> str:
    return f"zerobatch tests, cpu count {os.cpu_count()}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ZEROBATCH_REQUIRE_FRAMEWORKS=1 (CI), a skipped test fails the run."""
    if os.environ.get("ZEROBATCH_REQUIRE_FRAMEWORKS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        print(f"\n{len(skipped)} skipped test(s): skips are failures in CI")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
