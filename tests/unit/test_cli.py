"""The zerobatch command line: output, JSON, and the 0/1/2 exit-status contract."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import expected_batches, records
from zerobatch_core import BatchFileReader
from zerobatch_core.cli import main


def test_inspect_text_and_json(
    make_file: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_file(n=42)
    assert main(["inspect", str(path)]) == 0
    assert "num_batches" in capsys.readouterr().out
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_batches"] == 10 and info["dropped_records"] == 2


def test_validate_exit_codes(
    make_file: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = make_file()
    assert main(["validate", str(good), "--deep"]) == 0
    assert capsys.readouterr().out.startswith("OK ")
    bad = tmp_path / "bad.batch"
    bad.write_bytes(good.read_bytes()[:-1])
    assert main(["validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "size_mismatch" in out and str(bad) in out
    assert main(["validate", str(bad), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "size_mismatch"
    assert main(["inspect", str(bad)]) == 1
    assert main(["validate", str(tmp_path / "missing.batch")]) == 2
    assert "missing.batch" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        [],
        ["validate"],
        ["nonsense"],
        ["write", "a.npy", "b.batch"],
        ["write", "a.npy", "b.batch", "--batch-size", "0"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2


def test_write_from_npy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = records(50, 6)
    np.save(tmp_path / "in.npy", src)
    out = tmp_path / "out.batch"
    assert (
        main(["write", str(tmp_path / "in.npy"), str(out), "--batch-size", "8", "--seed", "3"]) == 0
    )
    assert "6 batches" in capsys.readouterr().out
    with BatchFileReader(out) as r:
        np.testing.assert_array_equal(r.read_batches(0, 6), expected_batches(src, 8, 3))


def test_write_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "f.npy", np.zeros((4, 4), dtype=np.float64))
    assert (
        main(["write", str(tmp_path / "f.npy"), str(tmp_path / "o.batch"), "--batch-size", "2"])
        == 1
    )
    assert "integer dtype" in capsys.readouterr().err
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    assert (
        main(["write", str(tmp_path / "junk.npy"), str(tmp_path / "o.batch"), "--batch-size", "2"])
        == 2
    )
    np.save(tmp_path / "obj.npy", np.array([object()], dtype=object), allow_pickle=True)
    assert (
        main(["write", str(tmp_path / "obj.npy"), str(tmp_path / "o.batch"), "--batch-size", "2"])
        == 2
    )  # never unpickles
    assert not (tmp_path / "o.batch").exists()
