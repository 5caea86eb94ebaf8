"""Property-based tests: write/read round trips, header round trips, and a parser fuzz."""

from __future__ import annotations

import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zerobatch_spec import HEADER_STRUCT, Header, build_header, find_violation, parse_header

from tests.helpers import expected_batches
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    FormatError,
    write_batch_dataset,
    write_batch_file,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    n=st.integers(0, 300),
    seq_len=st.integers(1, 40),
    batch_size=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_write_then_read_is_the_seed_permuted_input(
    n: int, seq_len: int, batch_size: int, seed: int, data: st.DataObject
) -> None:
    src = data.draw(
        st.sampled_from(["low", "high"]).map(
            lambda kind: (
                np.random.default_rng(seed)
                .integers(
                    0 if kind == "low" else 2**32 - 3,
                    2**32 if kind == "high" else 100,
                    size=(n, seq_len),
                    dtype=np.uint64,
                )
                .astype(np.uint32)
            )
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "a.batch"), os.path.join(tmp, "b.batch")
        nb = write_batch_file(a, src, batch_size, seed=seed, allow_empty=True)
        assert nb == n // batch_size
        write_batch_dataset(b, iter(src), n, batch_size, seq_len, seed=seed, allow_empty=True)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read()
        with BatchFileReader(a) as r:
            assert (r.num_batches, r.total_records, r.seed) == (nb, n, seed)
            np.testing.assert_array_equal(
                r.read_batches(0, nb), expected_batches(src, batch_size, seed)
            )


headers = st.builds(
    Header,
    batch_size=st.integers(0, 2**32 - 1),
    seq_len=st.integers(0, 2**32 - 1),
    num_batches=st.integers(0, 2**64 - 1),
    seed=st.integers(0, 2**32 - 1),
    total_records=st.integers(0, 2**32 - 1),
    version=st.integers(0, 2**32 - 1),
    dtype=st.integers(0, 2**32 - 1),
)


@settings(max_examples=300)
@given(headers)
def test_header_build_parse_round_trip(h: Header) -> None:
    data = build_header(h)
    assert len(data) == HEADER_STRUCT.sizeof() == 4096
    assert parse_header(data) == h
    assert HEADER_STRUCT.build(HEADER_STRUCT.parse(data)) == data


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.binary(max_size=64),
    flips=st.lists(st.tuples(st.integers(0, 4200), st.integers(0, 255)), max_size=6),
    tail=st.integers(-5000, 9000),
)
def test_reader_rejects_garbage_with_its_own_error_only(
    prefix: bytes, flips: list[tuple[int, int]], tail: int
) -> None:
    base = bytearray(build_header(Header(2, 3, 1, 0, 2)) + bytes(4096))
    base[: len(prefix)] = prefix
    for off, val in flips:
        if off < len(base):
            base[off] = val
    data = bytes(base[: max(0, len(base) + min(tail, 0))]) + bytes(max(tail, 0))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzz.batch")
        with open(path, "wb") as f:
            f.write(data)
        violation = find_violation(data[:4096], len(data))
        try:
            with BatchFileReader(path) as r:
                for i in range(len(r)):
                    r.read_batch(i).sum()
            assert violation is None
        except FormatError as e:  # anything else escaping is a bug
            assert violation is not None and e.code is violation.code


@settings(max_examples=40, deadline=None)
@given(
    n_batches=st.integers(1, 60),
    block_size=st.integers(1, 20),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**64 - 1),
    stop=st.integers(0, 60),
)
def test_loader_resume_at_any_point_matches(
    n_batches: int, block_size: int, seed: int, epoch: int, stop: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.batch")
        src = np.arange(n_batches, dtype=np.uint32).reshape(n_batches, 1)
        write_batch_file(path, src, 1, seed=0)
        full = BatchNativeLoader(path, block_size=block_size, seed=seed, epoch=epoch)
        want = [int(b[0, 0]) for b in full]
        assert sorted(want) == list(range(n_batches))
        a = BatchNativeLoader(path, block_size=block_size, seed=seed, epoch=epoch)
        head = [int(b[0, 0]) for _, b in zip(range(min(stop, n_batches)), a, strict=False)]
        b = BatchNativeLoader(path, block_size=block_size, seed=seed)
        b.load_state_dict(a.state_dict())
        rest = [int(x[0, 0]) for x in b] if len(head) < n_batches else []
        assert head + rest == want
