"""Fuzz the reader in CI: thousands of mutants of valid files, ZeroBatch errors or full reads.

Each mutant is a valid base file with a few mutations applied (byte flips in the header and the
slots, extreme header field values, truncations, appended bytes, a resize to whatever the mutated
header declares); see ``tests/fuzz/mutants.py``. ``mutants.check`` accepts exactly two outcomes:
a ``FormatError`` with the code ``zerobatch_spec``'s reference rules give, or every batch read
back with the bytes the spec places there; deep validation and the conformance probe must agree.
Any other exception fails the test. The long run of the same oracle is
``tests/fuzz/fuzz_reader.py`` (a million mutants, ``tests/fuzz/README.md``).

With ``HYPOTHESIS_PROFILE=ci`` the examples are derandomized, so CI replays the same mutants on
every run; the whole module takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from zerobatch_spec import HEADER_SIZE, U32_MAX, U64_MAX

from tests.fuzz.mutants import (
    BASES,
    DTYPE_VALUES,
    MAGICS,
    NUMERIC_FIELDS,
    U16_BASES,
    U32_EXTREMES,
    U64_EXTREMES,
    Op,
    apply,
    check,
    random_mutant,
)

FUZZ = settings(
    max_examples=2500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

LENGTHS = (0, 1, 7, 8, 39, 40, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1)

field_ops = st.tuples(
    st.just("field"),
    st.sampled_from(NUMERIC_FIELDS),
    st.one_of(st.sampled_from(U32_EXTREMES + U64_EXTREMES), st.integers(0, U64_MAX)),
)
flip_ops = st.tuples(
    st.just("flip"),
    st.one_of(st.integers(0, 39), st.integers(40, HEADER_SIZE - 1), st.integers(0, 24_000)),
    st.integers(0, 255),
)
u32s = st.one_of(st.sampled_from(U32_EXTREMES), st.integers(0, U32_MAX))
shape_ops = st.tuples(
    st.just("shape"),
    u32s,
    u32s,
    st.one_of(st.integers(0, 3), st.sampled_from(U64_EXTREMES), st.integers(0, U64_MAX)),
)
magic_ops = st.tuples(st.just("magic"), st.sampled_from(MAGICS))
truncate_ops = st.tuples(
    st.just("truncate"), st.one_of(st.sampled_from(LENGTHS), st.integers(0, 24_000))
)
append_ops = st.tuples(
    st.just("append"),
    st.one_of(st.sampled_from((1, 4095, 4096, 4097)), st.integers(1, 9000)),
    st.sampled_from((0, 1, 0xFF)),
)
fit_ops = st.tuples(st.just("fit"), st.sampled_from((0, 0, 1, 0x80)), st.booleans())
dtype_ops = st.tuples(
    st.just("field"), st.just("dtype"), st.one_of(st.sampled_from(DTYPE_VALUES), u32s)
)
mutations = st.lists(
    st.one_of(
        field_ops, shape_ops, flip_ops, magic_ops, truncate_ops, append_ops, fit_ops, dtype_ops
    ),
    min_size=1,
    max_size=4,
)

U16_PADDED, U16_PAGE, U16_MULTIPAGE, U16_EMPTY, U16_BIG, U16_ONE = U16_BASES
"""The dtype 1 bases, named for the explicit examples (``tests/fuzz/mutants.py``)."""


@pytest.fixture(scope="module")
def scratch() -> Iterator[str]:
    """One scratch file path, on tmpfs when the machine has one (``/dev/shm``)."""
    shm = "/dev/shm"
    root = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    directory = tempfile.mkdtemp(prefix="zerobatch-fuzz-", dir=root)
    yield os.path.join(directory, "mutant.batch")
    shutil.rmtree(directory, ignore_errors=True)


def run_mutant(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return check(path, data)


@FUZZ
@given(base=st.integers(0, len(BASES) - 1), ops=mutations)
# The defect this fuzzing found first: a valid 0-batch file whose shape NumPy cannot represent
# (conformance vector valid-zero-batches-max-shape).
@example(base=4, ops=[("field", "batch_size", U32_MAX), ("field", "seq_len", U32_MAX)])
@example(base=4, ops=[("field", "batch_size", 2**31), ("field", "seq_len", 2**30)])
# A count whose 64-bit product with the slot size wraps to the real size.
@example(base=6, ops=[("field", "num_batches", 2**52 + 4), ("field", "total_records", U32_MAX)])
# Odd shapes made valid: header resized to what it declares, records fixed up.
@example(base=0, ops=[("field", "seq_len", 1025), ("fit", 0, True)])
@example(base=3, ops=[("field", "batch_size", 4096), ("fit", 0x80, True)])
# dtype 1: the largest shape without batches; the uint16 wrap; the other token width over the
# same bytes (same size: valid, or deep-invalid padding; other size: size_mismatch, or resized
# to it); codes whose low byte or low half is a defined one.
@example(base=U16_EMPTY, ops=[("field", "batch_size", U32_MAX), ("field", "seq_len", U32_MAX)])
@example(base=U16_PAGE, ops=[("field", "num_batches", 2**52 + 2), ("field", "total_records", 9)])
@example(base=U16_PADDED, ops=[("field", "dtype", 0)])
@example(base=0, ops=[("field", "dtype", 1)])
@example(base=U16_PAGE, ops=[("field", "dtype", 0)])
@example(base=U16_MULTIPAGE, ops=[("field", "dtype", 0), ("fit", 0, True)])
@example(base=1, ops=[("field", "dtype", 1), ("fit", 0, True)])
@example(base=U16_BIG, ops=[("field", "dtype", 65537)])
@example(base=U16_ONE, ops=[("field", "dtype", 256)])
def test_mutants_give_zerobatch_errors_or_full_reads(
    scratch: str, base: int, ops: list[Op]
) -> None:
    run_mutant(scratch, apply(BASES[base], ops))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, 2**40 - 1))
def test_standalone_run_mutants(scratch: str, index: int) -> None:
    """Mutants as the long run draws them (``random_mutant``): the same oracle, other shapes."""
    _, _, data = random_mutant(0, index)
    run_mutant(scratch, data)


def test_mutations_reach_every_outcome(scratch: str) -> None:
    """The long run's generator reaches every rule, valid files and deep-invalid ones alike,
    from the uint32 bases and from the uint16 ones.

    A fuzzer whose mutants all fail rule 1 would "pass" while testing nothing; this pins that
    the first few thousand mutants of the standard run cover every outcome.
    """
    seen: dict[bool, set[str]] = {False: set(), True: set()}
    for i in range(3000):
        base, _, data = random_mutant(0, i)
        seen[base in U16_BASES].add(run_mutant(scratch, data))
    every = {
        "valid",
        "valid-deep-invalid",
        "truncated_header",
        "bad_magic",
        "unsupported_version",
        "unsupported_dtype",
        "invalid_shape",
        "nonzero_reserved",
        "size_mismatch",
        "record_count_mismatch",
    }
    assert seen[False] == every  # mutants of uint32 files
    assert seen[True] == every  # mutants of uint16 files
