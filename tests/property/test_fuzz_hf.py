"""Fuzz the Hugging Face token reader in CI: 1,000 mutants of Arrow and parquet files.

The mutants are the first 1,000 of the long run (``tests/fuzz/fuzz_hf.py``, seed 0): byte
flips, 4- and 8-byte words set to extreme values, truncations, appended bytes and duplicated
spans of two Arrow IPC streams, an Arrow IPC file and two parquet files. They run in a worker
process under the long run's harness, so that an abort or segfault in pyarrow's C++ is counted
against its mutant instead of ending pytest. Every mutant must either read consistently (every
token, document starts, records in both layouts, all agreeing with pyarrow's own reading) or
raise a ``ZeroBatchError``. The whole module takes a few seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz import fuzz_hf
from tests.fuzz.fuzz_hf import BASES, apply, check, make_parser, run

CI_MUTANTS = 1000


def run_mutants(tmp_path: Path, *argv: str) -> dict[str, Any]:
    args = make_parser().parse_args(["--out", str(tmp_path / "out"), *argv])
    return run(args, say=lambda line: None)


def test_mutants_read_consistently_or_give_zerobatch_errors(tmp_path: Path) -> None:
    summary = run_mutants(tmp_path, "--mutants", str(CI_MUTANTS), "--chunk", str(CI_MUTANTS))
    assert summary["mutants"] == CI_MUTANTS
    assert not any(summary["failures"].values()), summary["failure_details"]
    outcomes = summary["outcomes"]
    # The generator reaches the valid side and every family of refusal, not just rule one.
    assert outcomes["ok"] > 50, outcomes
    for kind in ("not-readable", "unit", "stream-end", "column", "token-range"):
        assert outcomes.get(kind, 0) > 0, (kind, outcomes)


def test_the_harness_counts_an_abort_and_a_hang_and_goes_on(tmp_path: Path) -> None:
    """A worker killed by a signal (as by an abort in pyarrow) or stuck is one failure of that
    mutant, and the rest of its chunk still runs."""
    summary = run_mutants(tmp_path, "--mutants", "30", "--crash-at", "7")
    assert summary["mutants"] == 30
    assert summary["failures"]["signal"] == 1
    assert summary["failure_details"][0]["index"] == 7
    assert "SIGABRT" in summary["failure_details"][0]["detail"]
    summary = run_mutants(tmp_path, "--mutants", "12", "--crash-at", "-7", "--hang-seconds", "1")
    assert summary["mutants"] == 12
    assert summary["failures"]["hang"] == 1 and summary["failure_details"][0]["index"] == 5


def place(tmp_path: Path, base: int, data: bytes) -> str:
    path = tmp_path / ("m.parquet" if BASES[base][0] == "parquet" else "m.arrow")
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("base", range(len(BASES)))
def test_the_bases_read_whole(tmp_path: Path, base: int) -> None:
    container, data = BASES[base]
    assert check(place(tmp_path, base, data), data, container) == "ok"


def name_flip(base: int, at: int, value: int) -> list[tuple[Any, ...]]:
    return [("flip", BASES[base][1].find(b"input_ids") + at, value)]


@pytest.mark.parametrize(
    ("base", "ops", "outcome"),
    [
        # The first finding: a column name that is not UTF-8 made pyarrow's Schema.names raise
        # UnicodeDecodeError while the "no column" message listed the columns (mutant 0:8889).
        (0, name_flip(0, 7, 0xB2), "other-error"),
        (3, name_flip(3, 7, 0xB2), "not-readable"),
        # A stream cut exactly between two record batches, or with bytes after its end.
        (0, [("truncate", len(BASES[0][1]) - 8)], "stream-end"),
        (1, [("append", 8, 0)], "stream-end"),
        # Lengths no file can hold: pyarrow's allocation fails, an IngestError names the file.
        (2, [("word", len(BASES[2][1]) - 10, 4, 2**31 - 1)], "not-readable"),
    ],
    ids=["utf8-name-stream", "utf8-name-parquet", "cut-at-batch", "after-eos", "footer-length"],
)
def test_pinned_mutants(
    tmp_path: Path, base: int, ops: list[tuple[Any, ...]], outcome: str
) -> None:
    data = apply(BASES[base][1], ops)
    assert check(place(tmp_path, base, data), data, fuzz_hf.container_of(data, base)) == outcome
    assert not os.path.exists(tmp_path / "out")
