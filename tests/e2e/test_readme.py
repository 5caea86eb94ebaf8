"""Every Python example in README.md runs as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.helpers import require

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
FRAMEWORKS = ("torch", "jax", "tensorflow")


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 6


def test_readme_examples_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FRAMEWORKS:
        if any(f"import {name}" in block for block in BLOCKS):
            require(name)
    monkeypatch.chdir(tmp_path)
    for i, block in enumerate(BLOCKS):
        exec(compile(block, f"README.md python block {i}", "exec"), {"__name__": "__readme__"})
    assert os.path.getsize("train.batch") == 4096 + 62 * 8192
