"""zerobatch convert: every source kind end to end, summaries, crashes and corrupt inputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zerobatch_core import BatchFileReader, validate_file
from zerobatch_core.cli import main
from zerobatch_core.errors import IngestError, WriteError
from zerobatch_core.files import writer as writer_module
from zerobatch_core.ingest import source as source_module
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
    assert summary["records_read"] == 100 + 33 and summary["batches"] == 33
    assert summary["records"] == 132 and summary["tokens"] == 1320
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
from zerobatch_core.files import writer
from zerobatch_core.ingest.convert import convert
writer.CHUNK_BYTES = writer.WINDOW_BYTES = writer.STAGE_BYTES = 4096
writer.POSITIONS_AHEAD = 4
if sys.argv[3] == "named":
    writer._open_unnamed = lambda directory: None
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


@pytest.mark.parametrize("files", ["unnamed", "named"])
def test_killed_conversion_leaves_no_valid_looking_file_and_rerun_is_clean(
    tmp_path: Path, files: str
) -> None:
    np.save(tmp_path / "src.npy", np.arange(16 * 400, dtype=np.uint32).reshape(400, 16))
    out = tmp_path / "out.batch"
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(tmp_path / "src.npy"), str(out), files], check=False
    )
    assert proc.returncode == -9
    assert not out.exists()
    left = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    if files == "unnamed":
        assert left == []  # the unnamed file died with its writer
    else:
        assert len(left) == 1  # the killed writer's temp file: not a valid LLMBATCH file
        assert validate_file(tmp_path / left[0]).code is not None
    src = str(tmp_path / "src.npy")
    convert([src], str(tmp_path / "ref.batch"), seq_len=16, batch_size=4, seed=5)
    assert sorted(os.listdir(tmp_path)) == ["ref.batch", "src.npy"]  # any stale temp is gone
    convert([src], str(out), seq_len=16, batch_size=4, seed=5)
    assert out.read_bytes() == (tmp_path / "ref.batch").read_bytes()


# --- what the summary says ------------------------------------------------------------------


def test_summary_counts_what_was_written_and_every_drop(tmp_path: Path) -> None:
    write_shard(tmp_path / "s_000.bin", np.arange(1000, dtype=np.uint16))
    write_shard(tmp_path / "s_001.bin", np.arange(333, dtype=np.uint16))
    sources = [str(tmp_path / "s_000.bin"), str(tmp_path / "s_001.bin")]
    s = convert(sources, str(tmp_path / "o.batch"), seq_len=10, batch_size=4)
    assert (s.records_read, s.records, s.batches, s.tokens) == (133, 132, 33, 1320)
    assert (s.source_tokens, s.dropped_records, s.dropped_tokens) == (1333, 1, 13)
    assert [(d.reason, d.records, d.tokens) for d in s.drops] == [
        ("shard_tails", 0, 3),
        ("batch_remainder", 1, 10),
    ]
    lines = s.lines()
    assert lines[0].startswith(f"wrote {tmp_path / 'o.batch'}: 33 batches, 132 records, 1,320 ")
    assert lines[1] == "  read 133 records from 1,333 source tokens"
    assert lines[2].startswith("  dropped 3 tokens: the last num_tokens % 10 tokens of each")
    assert lines[3].startswith("  dropped 1 record, 10 tokens: the records past the last whole")
    assert not any("warning" in line for line in lines)  # 13 of 1,333 tokens: under 10%
    d = s.as_dict()
    assert d["drops"][1] == {
        "reason": "batch_remainder",
        "records": 1,
        "tokens": 10,
        "detail": s.drops[1].detail,
    }
    assert json.loads(json.dumps(d))["dropped_tokens"] == 13


def test_summary_plurals_and_nothing_dropped(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(4, dtype=np.uint32).reshape(4, 1))
    s = convert([str(tmp_path / "a.npy")], str(tmp_path / "o.batch"), seq_len=1, batch_size=4)
    lines = s.lines()
    assert "1 batch, 4 records, 4 tokens," in lines[0]
    assert lines[1] == "  read 4 records from 4 source tokens" and lines[2] == "  dropped nothing"
    np.save(tmp_path / "b.npy", np.arange(5, dtype=np.uint32))  # flat: 1 token left over
    s = convert([str(tmp_path / "b.npy")], str(tmp_path / "p.batch"), seq_len=2, batch_size=1)
    assert "2 batches, 2 records, 4 tokens," in s.lines()[0]
    assert s.lines()[2].startswith("  dropped 1 token: the last num_tokens % 2 tokens")
    assert "warning: 20.0% of the input was dropped, most of it as array tails" in s.lines()[3]


def test_large_drop_from_bos_alignment_is_called_out(tmp_path: Path) -> None:
    toks = np.arange(2000, dtype=np.uint16) % 7 + 1
    toks[::100] = 0  # a document every 100 tokens; records of 10 keep a tenth of each
    write_shard(tmp_path / "b.bin", toks)
    s = convert(
        [str(tmp_path / "b.bin")],
        str(tmp_path / "o.batch"),
        seq_len=10,
        batch_size=2,
        align="bos",
        bos_token=0,
    )
    assert (s.records_read, s.records, s.source_tokens, s.dropped_tokens) == (20, 20, 2000, 1800)
    assert [(d.reason, d.tokens) for d in s.drops] == [("bos_alignment", 1800)]
    warning = [line for line in s.lines() if "warning" in line]
    assert warning == [
        "  warning: 90.0% of the input was dropped, most of it as bos alignment; records start "
        "only at BOS tokens, so documents longer than the sequence length lose their tail; a "
        "longer sequence length or contiguous alignment keeps more"
    ]


def test_text_summary_reports_the_final_partial_record(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("abcdefghij" * 3)  # 1 BOS + 30 bytes = 31 tokens
    s = convert([str(tmp_path / "c.txt")], str(tmp_path / "o.batch"), seq_len=8, batch_size=2)
    assert (s.source_tokens, s.records_read, s.records) == (31, 3, 2)
    assert [(d.reason, d.records, d.tokens) for d in s.drops] == [
        ("final_partial_record", 0, 7),
        ("batch_remainder", 1, 8),
    ]
    assert s.dropped_tokens == 15 and any("warning: 48.4%" in line for line in s.lines())


# --- refused outputs --------------------------------------------------------------------------


def test_output_that_is_a_source_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(64, dtype=np.uint32).reshape(8, 8))
    toks = np.arange(200, dtype=np.uint16) % 9
    write_shard(tmp_path / "s.bin", toks)
    np.flatnonzero(toks == 0).astype(np.int32).tofile(tmp_path / "s.bos.idx")
    (tmp_path / "t.txt").write_text("some text " * 20)
    os.symlink(tmp_path / "a.npy", tmp_path / "alias.batch")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("a.npy", "a.npy", {}),
        ("a.npy", "alias.batch", {}),
        ("s.bin", "s.bin", {}),
        ("s.bin", "s.bos.idx", {"align": "bos", "bos_token": 0}),
        ("s.bin", "s.bos.idx", {}),  # the side file is read in either mode: protected too
        ("t.txt", "t.txt", {}),
    ]
    for source, output, options in cases:
        with pytest.raises(WriteError, match="is the input file"):
            convert(
                [str(tmp_path / source)],
                str(tmp_path / output),
                seq_len=8,
                batch_size=1,
                overwrite=True,
                **options,
            )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_existing_output_and_empty_output_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(40, dtype=np.uint32).reshape(5, 8))
    out = tmp_path / "o.batch"
    out.write_bytes(b"keep me")
    with pytest.raises(WriteError, match=r"o\.batch: output file already exists; pass overwrite"):
        convert([str(tmp_path / "a.npy")], str(out), seq_len=8, batch_size=2)
    assert out.read_bytes() == b"keep me"
    out.unlink()
    message = (
        r"o\.batch: the output would hold 0 batches: the sources give 5 records of 8 tokens, "
        r"fewer than batch_size=8; pass allow_empty=True"
    )
    with pytest.raises(WriteError, match=message):
        convert([str(tmp_path / "a.npy")], str(out), seq_len=8, batch_size=8)
    assert sorted(os.listdir(tmp_path)) == ["a.npy"]
    s = convert([str(tmp_path / "a.npy")], str(out), seq_len=8, batch_size=8, allow_empty=True)
    assert (s.batches, s.records, s.dropped_records) == (0, 0, 5)
    assert s.lines()[0].startswith(f"wrote {out}: 0 batches, 0 records, 0 tokens")
    assert validate_file(out, deep=True).valid
    (tmp_path / "e.txt").write_text("tiny")  # counted once read: 5 tokens, no record of 8
    with pytest.raises(WriteError, match="0 batches: 0 records are fewer than batch_size=4"):
        convert([str(tmp_path / "e.txt")], str(tmp_path / "e.batch"), seq_len=8, batch_size=4)
    assert sorted(os.listdir(tmp_path)) == ["a.npy", "e.txt", "o.batch"]


# --- sources that change under the converter --------------------------------------------------


@pytest.mark.parametrize("kind", ["nanogpt", "nanogpt-bos", "npy-records", "npy-flat"])
def test_source_truncated_mid_conversion_is_a_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The source shrinks after the writer took its first block: a named error, no SIGBUS, and
    no output or temporary file left."""
    data, out_dir = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out_dir.mkdir()
    tokens = np.arange(64 * 500, dtype=np.uint16) % 1000
    options: dict[str, Any] = {}
    if kind.startswith("nanogpt"):
        source = data / "s.bin"
        write_shard(source, tokens)
        if kind == "nanogpt-bos":
            options = {"align": "bos", "bos_token": 0}
    else:
        source = data / "a.npy"
        np.save(source, tokens.reshape(500, 64) if kind == "npy-records" else tokens)
    monkeypatch.setattr(source_module, "default_chunk_records", lambda seq_len: 20)
    real_add = writer_module._WindowedOutput.add
    calls = [0]

    def add_then_truncate(self: object, rows: np.ndarray) -> None:
        calls[0] += 1
        if calls[0] == 1:
            os.truncate(source, os.path.getsize(source) // 2)
        real_add(self, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module._WindowedOutput, "add", add_then_truncate)
    with pytest.raises(IngestError) as info:
        convert([str(source)], str(out_dir / "o.batch"), seq_len=64, batch_size=4, **options)
    message = str(info.value)
    assert message.startswith(f"{source}: truncated while reading: expected ")
    assert re.search(r"expected [\d,]+ bytes at offset [\d,]+, got [\d,]+", message), message
    assert calls[0] >= 1 and os.listdir(out_dir) == []


def test_memory_bound_is_documented() -> None:
    assert 0 < MEMORY_BOUND_BYTES < 2**30
