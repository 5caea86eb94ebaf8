"""Fixtures shared by the unit tests of the command line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from zerobatch_core.cli import main


@dataclass
class Run:
    status: int
    out: str
    err: str


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    """``run(*argv)``: the exit status of ``zerobatch argv`` and what it printed."""

    def go(*argv: object) -> Run:
        capsys.readouterr()
        status = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Run(status, captured.out, captured.err)

    return go
