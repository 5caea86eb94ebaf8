"""The installed ``zerobatch`` command and ``python -m zerobatch_core``, run as processes.

What a user sees: the exit statuses, one-line errors without tracebacks, ``--version`` and
``--help``. A missing optional dependency is made really missing: a directory put first on
``PYTHONPATH`` holds a ``pyarrow`` package whose import fails, as it does where pyarrow is not
installed, so the import machinery itself (not a stand-in for ZeroBatch's code) refuses it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import records, require
from zerobatch_core import __version__, write_batch_file
from zerobatch_core.cli import EXIT_CODES

SCRIPT = Path(sys.executable).parent / "zerobatch"
COMMANDS = {
    "console script": [str(SCRIPT)],
    "python -m": [sys.executable, "-m", "zerobatch_core"],
}
SUBCOMMANDS = ("inspect", "validate", "write", "convert", "conformance", "probe", "demo")

Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(params=sorted(COMMANDS))
def zerobatch(request: pytest.FixtureRequest) -> Run:
    """``zerobatch(*args, env=None)``: run the command the way the parameter names."""
    command = COMMANDS[request.param]
    if request.param == "console script":
        assert SCRIPT.exists(), f"{SCRIPT} is missing: install the package (pip install -e .)"

    def go(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *(str(a) for a in args)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )

    return go


def test_version_and_help(zerobatch: Run) -> None:
    proc = zerobatch("--version")
    assert (proc.returncode, proc.stdout) == (0, f"zerobatch {__version__}\n")
    proc = zerobatch("--help")
    assert proc.returncode == 0 and "``" not in proc.stdout
    assert all(name in proc.stdout for name in SUBCOMMANDS)
    assert all(f"  {code:>3}  " in proc.stdout for code, _ in EXIT_CODES)
    for name in SUBCOMMANDS:
        proc = zerobatch(name, "--help")
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: zerobatch {name}")
        assert "``" not in proc.stdout, name


def test_exit_statuses(zerobatch: Run, tmp_path: Path) -> None:
    good = tmp_path / "good.batch"
    write_batch_file(good, records(12, 8), batch_size=4, seed=1)
    bad = tmp_path / "bad.batch"
    bad.write_bytes(good.read_bytes()[:-1])

    proc = zerobatch("validate", good)
    assert proc.returncode == 0 and proc.stdout.startswith("OK ")
    proc = zerobatch("validate", bad)
    assert proc.returncode == 1 and "size_mismatch" in proc.stdout
    for args in (["validate", tmp_path / "missing.batch"], ["inspect", tmp_path]):
        proc = zerobatch(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert str(args[1]) in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = zerobatch("validate")
    assert proc.returncode == 2 and "usage: zerobatch validate" in proc.stderr
    proc = zerobatch("write", tmp_path / "in.npy", tmp_path / "o.batch", "--batch-size", "-3")
    assert proc.returncode == 2 and "--batch-size" in proc.stderr


def test_write_then_validate(zerobatch: Run, tmp_path: Path) -> None:
    np.save(tmp_path / "in.npy", records(10, 4))
    out = tmp_path / "o.batch"
    proc = zerobatch("write", tmp_path / "in.npy", out, "--batch-size", 3)
    assert proc.returncode == 0 and "3 batches" in proc.stdout and proc.stderr == ""
    proc = zerobatch("write", tmp_path / "in.npy", out, "--batch-size", 3)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    assert zerobatch("validate", out, "--deep").returncode == 0


def shadowed(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment in which ``import module`` fails: a package of that name, first on the
    path, raises ``ImportError`` when imported."""
    shadow = tmp_path / "shadow"
    (shadow / module).mkdir(parents=True)
    (shadow / module / "__init__.py").write_text(
        f"raise ImportError({f'No module named {module!r} (hidden for this test)'!r})\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow), env.get("PYTHONPATH")]))
    return env


def test_missing_dependency_exits_3(zerobatch: Run, tmp_path: Path) -> None:
    pa = require("pyarrow")
    pq = require("pyarrow.parquet")
    source = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(40)]}), source)
    args = ["convert", source, tmp_path / "o.batch", "--seq-len", 16, "--batch-size", 2]
    env = shadowed(tmp_path, "pyarrow")

    proc = zerobatch(*args, env=env)
    assert proc.returncode == 3, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "pyarrow" in proc.stderr and "pip install 'zerobatch[text]'" in proc.stderr
    assert not (tmp_path / "o.batch").exists()

    proc = zerobatch("--debug", *args, env=env)
    assert proc.returncode == 3 and "Traceback" in proc.stderr
    assert "hidden for this test" in proc.stderr  # the real import failure, as the cause

    proc = zerobatch(*args)  # with pyarrow importable, the same command succeeds
    assert proc.returncode == 0, proc.stderr
