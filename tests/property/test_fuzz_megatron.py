"""Fuzz the Megatron indexed dataset reader in CI: the long run's first 1,000 mutants.

``tests/fuzz/fuzz_megatron.py`` draws mutants of small valid ``.idx`` / ``.bin`` pairs (byte
flips, header fields and array entries set to extreme values, truncations, appended bytes, odd
counts with the index resized to them, refitted pointers, missing files, FIFOs) and checks each
against an independent reference of the format's rules: the reader refuses exactly the
mutants that break a rule, naming the file and a broken field, and serves the others' exact
tokens, document starts and records. Here the first 1,000 mutants of seed 0 run in this
process (about a second), must reach every rule and the valid side, and the oracle is shown to
catch a reader that skips a rule or serves wrong values; the harness is shown to count a crash
and a hang.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fuzz.fuzz_megatron import FIELDS, main, run_mutants
from tests.fuzz.harness import run_module
from zerobatch_core.ingest.megatron import MegatronFile


def test_first_mutants_agree_with_the_reference(tmp_path: Path) -> None:
    counts = run_mutants(0, 0, 1000, str(tmp_path))
    assert sum(counts.values()) == 1000
    reached = set(counts)
    assert reached == {"valid", "valid:token-range", *(f"error {f}" for f in FIELDS)}, counts


def _skip_document_index(orig: Callable[..., Any]) -> Callable[..., Any]:
    return lambda self, src: None


def _reversed_tokens(orig: Callable[..., Any]) -> Callable[..., Any]:
    return lambda self, a, b: orig(self, a, b)[::-1].copy()


def _late_documents(orig: Callable[..., Any]) -> Callable[..., Any]:
    return lambda self: np.minimum(orig(self) + 1, self.num_tokens)


def _foreign_error(orig: Callable[..., Any]) -> Callable[..., Any]:
    def go(self: MegatronFile, a: int, b: int) -> Any:
        if b - a > 20:
            raise ValueError("not a ZeroBatch error")
        return orig(self, a, b)

    return go


@pytest.mark.parametrize(
    ("method", "sabotage"),
    [
        ("_check_document_index", _skip_document_index),
        ("read_tokens", _reversed_tokens),
        ("document_starts", _late_documents),
        ("read_tokens", _foreign_error),
    ],
)
def test_the_oracle_catches_a_broken_reader(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    sabotage: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    monkeypatch.setattr(MegatronFile, method, sabotage(getattr(MegatronFile, method)))
    with pytest.raises(AssertionError, match=r"mutant 0:\d+ \(ops "):
        run_mutants(0, 0, 1000, str(tmp_path))


def test_the_harness_counts_a_crash_and_a_hang(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    argv = ["--mutants", "200", "--chunk", "100", "--crash-at", "20", "--hang-at", "120"]
    argv += ["--hang-seconds", "1", "--summary", str(summary), "--report-seconds", "1000"]
    done = run_module("tests.fuzz.fuzz_megatron", argv, 120)
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(summary.read_text())
    assert result["mutants"] == 200
    assert result["findings"] == {
        "exception": 0,
        "memory": 0,
        "disagreement": 0,
        "signal": 1,
        "hang": 1,
    }
    assert sum(result["outcomes"].values()) == 198
    assert [(f["kind"], f["index"]) for f in result["failures"]] == [("signal", 20), ("hang", 120)]


def test_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--replay", "0:5"]) == 0
    assert main(["--replay", "0:1", "--ops", '[["entry", "lengths", 0, -1]]']) == 0
    out = capsys.readouterr().out
    assert "'idx:sequence_lengths'" in out and "outcome: error idx:sequence_lengths" in out
