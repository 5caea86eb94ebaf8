"""The test command of a mutation session: the tests that execute the mutated line first.

Cosmic Ray applies a mutant to the module in the current directory and runs this command; it
exits non-zero when some test fails (the mutant is killed), zero when every test passes.
Usage (written by tests/mutation/run.py into the session's configuration)::

    python select_tests.py MODULE PRISTINE COVERAGE_MAP -- TEST_PATH...

A mutant is usually caught by one of the few tests that execute its line, not by the tests
that happen to be listed first, so those run first (``pytest -x``). When they all pass, the
other tests run too, so a survivor has passed every listed test: the coverage map only sees
this process's lines, not those of the CLI subprocesses and servers some tests start. A line
the map does not attribute to tests (import-time code, lines only subprocesses run) runs the
whole list at once.
"""

from __future__ import annotations

import ast
import difflib
import json
import subprocess
import sys
from pathlib import Path

NO_TESTS_COLLECTED = 5


def changed_lines(pristine: str, mutated: str) -> list[int]:
    """1-based lines of ``pristine`` that the mutant replaced or removed."""
    a, b = pristine.splitlines(), mutated.splitlines()
    lines: list[int] = []
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            lines.extend(range(i1 + 1, max(i2, i1 + 1) + 1))
    return lines


def statement_lines(source: str, lines: list[int]) -> set[int]:
    """The first line of the innermost statement holding each line: coverage records a
    statement under its first line."""
    spans = [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.stmt)
    ]
    found = set()
    for line in lines:
        holding = [start for start, end in spans if start <= line <= end]
        found.add(max(holding) if holding else line)
    return found


def pytest(args: list[str]) -> int:
    base = [sys.executable, "-m", "pytest", "-x", "-q", "--no-header", "-p", "no:cacheprovider"]
    return subprocess.run([*base, *args]).returncode


def main(argv: list[str]) -> int:
    sep = argv.index("--")
    module, pristine_path, map_path = argv[:sep]
    tests = argv[sep + 1 :]
    pristine = Path(pristine_path).read_text()
    lines = changed_lines(pristine, Path(module).read_text())
    by_line: dict[str, list[str]] = json.loads(Path(map_path).read_text())["lines"]
    covering: list[str] = []
    for line in sorted(statement_lines(pristine, lines)):
        for nodeid in by_line.get(str(line), [""]):
            if nodeid not in covering:
                covering.append(nodeid)
    if not covering or "" in covering:
        return pytest(tests)
    status = pytest(covering)
    if status != 0:
        return status
    status = pytest([*tests, *(f"--deselect={nodeid}" for nodeid in covering)])
    return 0 if status == NO_TESTS_COLLECTED else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
