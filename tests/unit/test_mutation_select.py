"""The mutation runner's test selection (tests/mutation/select_tests.py): which lines a mutant
changed and which recorded statements they belong to."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SELECT = Path(__file__).resolve().parents[1] / "mutation" / "select_tests.py"


@pytest.fixture(scope="module")
def select() -> ModuleType:
    spec = importlib.util.spec_from_file_location("select_tests", SELECT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("select_tests", module)
    spec.loader.exec_module(module)
    return module


SOURCE = """\
def f(x):
    if (x >
            3):
        return [
            x,
            x + 1,
        ]
    return x
"""


def test_changed_lines_are_those_of_the_pristine_text(select: ModuleType) -> None:
    mutated = SOURCE.replace("x + 1", "x - 1")
    assert select.changed_lines(SOURCE, mutated) == [6]
    assert select.changed_lines(SOURCE, SOURCE) == []
    shorter = SOURCE.replace("            3):\n", "")  # a mutant that removes a line
    assert select.changed_lines(SOURCE, shorter) == [3]


def test_a_line_maps_to_the_first_line_of_its_innermost_statement(select: ModuleType) -> None:
    # line 3 is inside the ``if`` condition (statement at line 2); line 6 inside the
    # ``return`` at line 4; line 8 is a statement of its own.
    assert select.statement_lines(SOURCE, [3, 6, 8]) == {2, 4, 8}
    assert select.statement_lines(SOURCE, [1]) == {1}


def test_the_command_runs_the_covering_tests_first_then_the_rest(
    select: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m.py").write_text(SOURCE.replace("x + 1", "x - 1"))
    (tmp_path / "orig.py").write_text(SOURCE)
    (tmp_path / "map.json").write_text('{"lines": {"4": ["t.py::a"], "8": ["", "t.py::b"]}}')
    runs: list[list[str]] = []
    outcomes = iter([0, 5])  # the covering test passes; the rest deselected entirely

    def pytest_run(args: list[str]) -> int:
        runs.append(args)
        return next(outcomes)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(select, "pytest", pytest_run)
    assert select.main(["m.py", "orig.py", "map.json", "--", "t.py"]) == 0
    assert runs == [["t.py::a"], ["t.py", "--deselect=t.py::a"]]

    runs.clear()
    outcomes = iter([1])
    assert select.main(["m.py", "orig.py", "map.json", "--", "t.py"]) == 1  # killed at once
    assert runs == [["t.py::a"]]

    runs.clear()
    outcomes = iter([0])
    (tmp_path / "m.py").write_text(SOURCE.replace("return x\n", "return -x\n"))
    assert select.main(["m.py", "orig.py", "map.json", "--", "t.py"]) == 0
    assert runs == [["t.py"]]  # a line also run at import: the whole list
