"""zerobatch convert: every source kind end to end, summaries, crashes and corrupt inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from zerobatch_core import BatchFileReader, validate_file
from zerobatch_core.cli import main
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.convert import MEMORY_BOUND_BYTES, convert, detect_kind


def write_shard(path: Path, tokens: np.ndarray, magic: int = 20240520) -> None:
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, 1, len(tokens)
    if magic != 20240520:
        header[3] = tokens.dtype.itemsize
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def rows(path: Path) -> Counter[tuple[int, ...]]:
    with BatchFileReader(path) as r:
        data = r.read_batches(0, len(r)).reshape(-1, r.seq_len)
        return Counter(tuple(int(x) for x in row) for row in data)


def test_nanogpt_shards_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = np.arange(1000, dtype=np.uint16)
    b = np.arange(5000, 5333, dtype=np.uint16)
    write_shard(tmp_path / "s_000.bin", a)
    write_shard(tmp_path / "s_001.bin", b)
    out = tmp_path / "out.batch"
    argv = [
        "convert",
        str(tmp_path / "s_*.bin"),
        str(out),
        "--seq-len",
        "10",
        "--batch-size",
        "4",
        "--seed",
        "9",
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 100 + 33 and summary["batches"] == 33
    assert summary["dropped_records"] == 1 and summary["kind"] == "nanogpt"
    source = Counter(
        tuple(int(x) for x in r)
        for r in np.concatenate([a.reshape(-1, 10), b[:330].reshape(-1, 10)])
    )
    got = rows(out)
    assert sum(got.values()) == 132 and not (got - source)  # a subset of the source records
    assert validate_file(out, deep=True).valid


def test_npy_and_text_sources(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(60, dtype=np.int64).reshape(12, 5))
    s = convert([str(tmp_path / "a.npy")], str(tmp_path / "n.batch"), seq_len=5, batch_size=4)
    assert (s.records, s.batches, s.dropped_records, s.padding_fraction) == (12, 3, 0, None)
    docs = [f"doc {i} " * (i % 5 + 1) for i in range(200)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    s = convert(
        [str(tmp_path / "c.jsonl")],
        str(tmp_path / "t.batch"),
        seq_len=32,
        batch_size=8,
        seed=1,
        text_field="body",
        mode="pad",
        pad_id=0,
    )
    assert s.kind == "text" and s.records == 200 and s.batches == 25
    assert s.padding_fraction is not None and 0.0 < s.padding_fraction < 1.0
    assert s.packing["documents"] == 200
    assert validate_file(tmp_path / "t.batch", deep=True).valid


def test_kind_detection_errors() -> None:
    with pytest.raises(IngestError, match="suffix"):
        detect_kind(["x.csv"])
    with pytest.raises(IngestError, match="mix kinds"):
        detect_kind(["a.bin", "b.npy"])


def test_corrupt_input_names_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    write_shard(tmp_path / "bad.bin", np.arange(100, dtype=np.uint16))
    with open(tmp_path / "bad.bin", "r+b") as f:
        f.truncate(1024 + 150)  # header says 100 tokens, 75 are there
    with pytest.raises(IngestError, match=r"bad\.bin"):
        convert([str(tmp_path / "bad.bin")], str(tmp_path / "o.batch"), seq_len=10, batch_size=2)
    assert sorted(os.listdir(tmp_path)) == ["bad.bin"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": broken\n')
    with pytest.raises(IngestError, match=r"bad\.jsonl.*line 2"):
        convert([str(tmp_path / "bad.jsonl")], str(tmp_path / "o.batch"), seq_len=4, batch_size=1)
    assert sorted(os.listdir(tmp_path)) == ["bad.bin", "bad.jsonl"]


CRASH = r"""
import os, signal, sys
import numpy as np
from zerobatch_core import writer
from zerobatch_core.ingest.convert import convert
writer.CHUNK_BYTES = writer.WINDOW_BYTES = writer.STAGE_BYTES = 4096
writer.POSITIONS_AHEAD = 4
calls = [0]
real = writer.permute_array
def dying(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # die mid-write, like a node failure
    return real(*args, **kwargs)
writer.permute_array = dying
convert([sys.argv[1]], sys.argv[2], seq_len=16, batch_size=4, seed=5)
"""


def test_killed_conversion_leaves_no_valid_looking_file_and_rerun_is_clean(
    tmp_path: Path,
) -> None:
    np.save(tmp_path / "src.npy", np.arange(16 * 400, dtype=np.uint32).reshape(400, 16))
    out = tmp_path / "out.batch"
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(tmp_path / "src.npy"), str(out)], check=False
    )
    assert proc.returncode == -9
    assert not out.exists()
    left = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(left) == 1  # the killed writer's temp file: not a valid LLMBATCH file
    assert validate_file(tmp_path / left[0]).code is not None
    convert([str(tmp_path / "src.npy")], str(out), seq_len=16, batch_size=4, seed=5)
    assert sorted(os.listdir(tmp_path)) == ["out.batch", "src.npy"]  # the stale temp is gone
    convert(
        [str(tmp_path / "src.npy")], str(tmp_path / "ref.batch"), seq_len=16, batch_size=4, seed=5
    )
    assert out.read_bytes() == (tmp_path / "ref.batch").read_bytes()


def test_memory_bound_is_documented() -> None:
    assert 0 < MEMORY_BOUND_BYTES < 2**30
