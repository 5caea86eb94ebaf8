"""Fuzz the Atlas reader in CI: ZeroBatch errors or consistent reads, and no pickle ever runs.

The long run (``tests/fuzz/fuzz_atlas.py``) draws mutants of four small valid Atlas datasets
(one per compression strategy: byte flips, truncations and appended bytes of ``data.bin``,
``index.npy``, ``meta.json`` and the dictionaries, JSON-aware edits of the ``meta.json``
files, an index refitted to a changed ``data.bin``, crafted blocks planted with the shard's own
compression, FIFOs and links) and reads each through every entry point (``is_atlas`` and
``expand_atlas``, all tokens at once and in ascending windows, ``document_starts``, records in
both layouts against a NumPy cut) in worker processes under a 2 GiB address-space limit and a
10 s limit per mutant. Here the same harness runs its first 1,000 mutants, then the attacks
the format invites, each as an explicit mutant of each strategy's base: pickles that would run
code (they must be refused, and the marker file they would create must not exist), a
decompression bomb, a FIFO in place of ``data.bin``, a missing dictionary.
"""

from __future__ import annotations

import os

import pytest

from tests.fuzz.fuzz_atlas import ENTRIES, MARKER
from tests.fuzz.harness import assert_both_sides, first_mutants, replay_attack

MODULE = "tests.fuzz.fuzz_atlas"


def test_first_mutants_give_zerobatch_errors_or_consistent_reads() -> None:
    """The long run's first 1,000 mutants: no finding, and every entry point reaches both
    sides (a fuzzer whose mutants all fail the first check would pass while testing
    nothing)."""
    assert_both_sides(first_mutants(MODULE, 1000, workers=1), ENTRIES)
    assert not os.path.exists(MARKER)


ATTACKS = [
    pytest.param([["block", "0", 1, "system"]], "posix.system", id="os-system"),
    pytest.param([["block", "1", 0, "popen"]], "subprocess.Popen", id="subprocess-popen"),
    pytest.param([["block", "0", 7, "exec"]], ".exec", id="builtins-exec"),
    pytest.param([["block", "0", 2, "persistent"]], "opcode PERSID", id="persistent-id"),
    pytest.param([["block", "0", 3, "bomb"]], None, id="bomb"),
    pytest.param([["fifo", "0/data.bin"]], "not a regular file (a FIFO)", id="data-fifo"),
    pytest.param([["remove", "0/zstd_dict.bin"], ["remove", "zstd_dict.bin"]], None, id="no-dict"),
]


@pytest.mark.parametrize("base", [0, 1, 2, 3])
@pytest.mark.parametrize(("ops", "expected"), ATTACKS)
def test_attacks_are_refused_without_running_anything(
    base: int, ops: list[list[object]], expected: str | None
) -> None:
    """Each attack on each strategy's base (``--replay 0:BASE`` also picks the cap: base 0 and
    3 read with the 16 KiB cap, under which the 256 KiB bomb is refused), through every entry
    point, under the fuzzer's limits."""
    done = replay_attack(MODULE, base, ops, 60)
    assert not os.path.exists(MARKER), "a crafted pickle ran"
    if expected is not None:
        assert "read: error" in done.stdout and expected in done.stdout, done.stdout[-3000:]
    if ops[0][0] == "remove" and base in (2, 3):  # the strategies with dictionaries
        assert "zstd dictionary (strategy" in done.stdout and "is missing" in done.stdout
    if ops[0][3:] == ["bomb"] and base in (0, 3):
        assert "decompression bomb" in done.stdout or "max_block_bytes" in done.stdout
