"""The documented hazard: truncating a mapped file under a live reader raises SIGBUS.

Validation at open makes a file that is already short impossible to map; this shows why the
files must not be modified while mapped, in a child process so the test process survives.
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
from zerobatch_core.reader import BatchFileReader

CHILD = r"""
import os, sys
from zerobatch_core import BatchFileReader
r = BatchFileReader(sys.argv[1])
os.truncate(sys.argv[1], 4096)
print(int(r.read_batch(len(r) - 1).sum()))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="SIGBUS semantics checked on Linux")
def test_truncation_under_a_live_mapping_is_sigbus(tmp_path: Path) -> None:
    path = tmp_path / "t.batch"
    write_batch_file(path, records(64, 1024), batch_size=4, seed=1)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, check=False
    )
    assert proc.returncode == -signal.SIGBUS


def test_truncated_before_open_is_rejected_not_mapped(tmp_path: Path) -> None:
    path = tmp_path / "t.batch"
    write_batch_file(path, records(64, 1024), batch_size=4, seed=1)
    os.truncate(path, os.path.getsize(path) - 4096)
    with pytest.raises(FormatError, match="size_mismatch"):
        BatchFileReader(path)
