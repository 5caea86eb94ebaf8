"""End to end: stop after k batches, resume in a fresh process, get the uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import records
from zerobatch_core import write_batch_file

CHILD = r"""
import hashlib, json, sys
from zerobatch_core import BatchNativeLoader
path, state_in, state_out, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
loader = BatchNativeLoader(path, block_size=3, seed=99, dtype="int64")
if state_in != "-":
    with open(state_in) as f:
        loader.load_state_dict(json.load(f))
digests = []
while len(digests) < count:
    for batch in loader:
        digests.append(hashlib.sha256(batch.tobytes()).hexdigest())
        if len(digests) == count:
            break
with open(state_out, "w") as f:
    json.dump(loader.state_dict(), f)
print(json.dumps(digests))
"""


def run(path: Path, state_in: str, state_out: Path, count: int) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), state_in, str(state_out), str(count)],
        capture_output=True,
        text=True,
        check=True,
    )
    digests: list[str] = json.loads(out.stdout)
    return digests


def test_resume_in_a_new_process_equals_uninterrupted(tmp_path: Path) -> None:
    path = tmp_path / "d.batch"
    write_batch_file(path, records(4 * 25, 16), batch_size=4, seed=5)  # 25 batches
    total = 60  # two epochs and a bit
    whole = run(path, "-", tmp_path / "s0.json", total)
    first = run(path, "-", tmp_path / "s1.json", 17)
    second = run(path, str(tmp_path / "s1.json"), tmp_path / "s2.json", 21)  # crosses epoch 0/1
    third = run(path, str(tmp_path / "s2.json"), tmp_path / "s3.json", total - 38)
    assert first + second + third == whole
    assert len(set(whole[:25])) == 25  # first epoch: every batch once
    state = json.loads((tmp_path / "s3.json").read_text())
    assert (state["epoch"], state["step"]) == (2, 10)
