"""A file truncated under a live mapping: a named error at block starts, a report on SIGBUS.

Validation at open makes a file that is already short impossible to map. A file truncated while
it is mapped is detected by the loader's size check at the start of every block
(``BatchFileReader.check_size``: one ``fstat``) and reported as ``size_mismatch`` naming the
file. A truncation inside a block cannot be caught before the next touch of a lost page, which
raises SIGBUS; the reader enabled ``faulthandler``, so the process says what happened before it
dies. Each case runs in a child process so the test process survives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import records
from zerobatch_core import FormatError, write_batch_file
from zerobatch_core.files.reader import BatchFileReader

BLOCK = 4
BATCHES = 64

AT_BLOCK_BOUNDARY = r"""
import os, sys
from zerobatch_core import BatchNativeLoader, FormatError
path, block = sys.argv[1], int(sys.argv[2])
loader = BatchNativeLoader(path, block_size=block, seed=3)
items = iter(loader)
served = [int(next(items).sum()) for _ in range(2 * block)]  # two whole blocks, all touched
os.truncate(path, 4096)  # header only: every batch is gone
try:
    next(items)  # the first batch of the third block
except FormatError as e:
    print(e.code.value)
    print(e)
    raise SystemExit(0)
print("no error at the block start")
raise SystemExit(3)
"""

INSIDE_A_BLOCK = r"""
import os, sys
from zerobatch_core import BatchNativeLoader
path = sys.argv[1]
loader = BatchNativeLoader(path, block_size=64, seed=3)  # the whole file is one block
items = iter(loader)
int(next(items).sum())
os.truncate(path, 4096)
for item in items:
    int(item.sum())  # touches a page that no longer exists
print("survived")
"""


def _child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _file(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "t.batch"
    write_batch_file(path, records(BATCHES * 4, 1024), batch_size=4, seed=1)  # 16 KiB batches
    return path, os.path.getsize(path)


@pytest.mark.skipif(sys.platform != "linux", reason="truncation semantics checked on Linux")
def test_truncation_between_blocks_is_a_named_error(tmp_path: Path) -> None:
    """The loader checks the file's size at each block start: a clear ``FormatError``."""
    path, size = _file(tmp_path)
    proc = _child(AT_BLOCK_BOUNDARY, str(path), str(BLOCK))
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    code, message = proc.stdout.splitlines()[:2]
    assert code == "size_mismatch"
    assert str(path) in message
    assert "4096 bytes now" in message and f"requires {size}" in message


@pytest.mark.skipif(sys.platform != "linux", reason="SIGBUS semantics checked on Linux")
def test_truncation_inside_a_block_reports_the_sigbus(tmp_path: Path) -> None:
    """Inside a block no check runs: SIGBUS still ends the process, but not silently."""
    path, _ = _file(tmp_path)
    proc = _child(INSIDE_A_BLOCK, str(path))
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])
    assert "survived" not in proc.stdout
    assert "Fatal Python error: Bus error" in proc.stderr
    # faulthandler's traceback points at the line that touched the lost page.
    assert 'File "<string>", line 10' in proc.stderr


def test_truncated_before_open_is_rejected_not_mapped(tmp_path: Path) -> None:
    path, size = _file(tmp_path)
    os.truncate(path, size - 4096)
    with pytest.raises(FormatError, match="size_mismatch"):
        BatchFileReader(path)
