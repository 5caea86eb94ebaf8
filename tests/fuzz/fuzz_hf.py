"""Long fuzz run of the Hugging Face token-file reader (``zerobatch_core.ingest.hf_datasets``).

Run from the repository root::

    nice -n 19 .venv/bin/python -m tests.fuzz.fuzz_hf --mutants 100000 --workers 1

Bases: small valid files written with pyarrow directly (``BASES``): two Arrow IPC streams (a
``list<int32>`` token column beside a string column, several record batches, empty rows; a
zstd-compressed ``large_list<uint16>``), an Arrow IPC file (``fixed_size_list<int64>``) and two
parquet files (``list<int32>`` in three row groups, uncompressed and without checksums, so that
flips reach the decoders; ``large_list<uint16>`` snappy-compressed with page checksums).

Mutant ``i`` of a run is a pure function of ``(--seed, i)`` (``random_mutant``: a
``random.Random`` seeded from both): one base and one to four mutations, applied in order:

* ``("flip", offset, value)``: set one byte;
* ``("word", offset, width, value)``: set a little-endian 4- or 8-byte word (aligned) to an
  extreme value or the current one plus or minus a little: the lengths, counts and offsets of
  Arrow's metadata and buffers, and parquet's, are such words;
* ``("truncate", length)``: cut the file (anywhere, or around its last 8 bytes);
* ``("append", count, byte)``: append bytes;
* ``("dup", start, length, at)``: insert a copy of ``data[start:start + length]`` at ``at`` (a
  record batch message given twice, a page repeated).

The oracle (``check``): opening the file (``expand_hf``), ``num_tokens``, reading every token at
once and in ascending pieces, one read backwards (a stream restarts), ``document_starts``, and
cutting records in both layouts (``TokenFileSource``) must either all succeed and agree with one
another, with a plain NumPy cut of the tokens, and with pyarrow's own reading of the same bytes,
or raise a ``ZeroBatchError``. Each worker process runs under a 2 GiB address-space limit
(``RLIMIT_AS``). Anything else is a failure: another exception (**exception**), a
``MemoryError`` that is not a ZeroBatch error (**memory**), a disagreement
(**disagreement**), a worker killed by a signal (an abort or segfault in pyarrow's C++,
**signal**), or a mutant that makes no progress for ``--hang-seconds`` (**hang**). As in
every run (``harness.py``), each worker writes the mutant index it is on to a status file
shared with the parent through ``mmap``, so a worker that dies or hangs is charged to that
mutant, which is saved, and a new worker goes on with the rest of its chunk. The run exits 1
on any failure. ``--replay I`` runs mutant ``I`` alone and prints its outcome or traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import resource
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from tests.fuzz.harness import (
    Fleet,
    Layout,
    Worker,
    attempt,
    limit_address_space,
    parser,
    run_saving,
    sabotage,
    save_input,
    saved_failure,
    say_flushed,
    say_outcomes,
    say_saved_failures,
    serve,
)
from tests.fuzz.mutants import apply_bytes, draw
from zerobatch_core.errors import ZeroBatchError
from zerobatch_core.ingest.hf_datasets import expand_hf
from zerobatch_core.ingest.token_files import LAYOUTS, TokenFileSource, record_starts

Op = tuple[Any, ...]

COLUMN = "input_ids"
SEQ_LEN = 3
"""Tokens per record when cutting records: small, so that the bases have many records."""

ERRORS: tuple[tuple[str, str], ...] = (
    ("not a readable", "not-readable"),
    ("end-of-stream", "stream-end"),
    ("no column", "column"),
    ("has type", "column"),
    ("is null", "null"),
    ("outside [0, 2**32 - 1]", "token-range"),
    ("cannot read column", "unit"),
    ("changed", "changed"),
)
"""An error's outcome: the first of these phrases its message holds (else ``other-error``)."""

FAILURE_KINDS = ("exception", "memory", "disagreement", "signal", "hang")
OUTCOMES = (
    "ok",
    *dict.fromkeys(name for _, name in ERRORS),
    "other-error",
    *FAILURE_KINDS,
)
FLEET = Fleet("tests.fuzz.fuzz_hf", Layout(OUTCOMES), FAILURE_KINDS, "failures", poll_seconds=0.1)


# -- bases ----------------------------------------------------------------------------------


def _rows(seed: int, n: int, high: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(high) for _ in range(rng.choice((0, 1, 2, 3, 5, 8)))] for _ in range(n)]


def _stream(table: pa.Table, rows_per_batch: int, **options: Any) -> bytes:
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(**options)
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            w.write_batch(batch)
    return bytes(sink.getvalue())


def _ipc_file(table: pa.Table, rows_per_batch: int) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            w.write_batch(batch)
    return bytes(sink.getvalue())


def _parquet(table: pa.Table, row_group_size: int, **options: Any) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=row_group_size, **options)
    return bytes(sink.getvalue())


def build_bases() -> tuple[tuple[str, bytes], ...]:
    """``(container, bytes)`` of each base (deterministic for one pyarrow version)."""
    rows = _rows(1, 10, 50_000)
    texts = [f"doc {i}" * (i % 3) for i in range(len(rows))]
    t0 = pa.table({COLUMN: pa.array(rows, type=pa.list_(pa.int32())), "text": pa.array(texts)})
    t1 = pa.table({COLUMN: pa.array(_rows(2, 9, 2**16), type=pa.large_list(pa.uint16()))})
    fixed = [list(range(i, i + 3)) for i in range(0, 18, 3)]
    t2 = pa.table({COLUMN: pa.array(fixed, type=pa.list_(pa.int64(), 3))})
    t3 = pa.table({COLUMN: pa.array(_rows(3, 9, 1000), type=pa.list_(pa.int32()))})
    t4 = pa.table({COLUMN: pa.array(_rows(4, 8, 2**16), type=pa.large_list(pa.uint16()))})
    return (
        ("stream", _stream(t0, 4)),
        ("stream", _stream(t1, 3, compression="zstd")),
        ("file", _ipc_file(t2, 2)),
        ("parquet", _parquet(t3, 3, compression="none", write_statistics=False)),
        ("parquet", _parquet(t4, 4, compression="snappy", write_page_checksum=True)),
    )


BASES = build_bases()

WORD_VALUES = (
    0,
    1,
    2,
    7,
    8,
    0x7F,
    0xFF,
    0xFFFF,
    2**31 - 8,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**40,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 8,
    2**64 - 1,
)


# -- mutations ------------------------------------------------------------------------------


def _edit(data: bytearray, op: Op) -> bool:
    """The mutations of this fuzzer beyond ``mutants.edit_bytes``: ``word`` and ``dup``."""
    if op[0] == "word":
        offset, width, value = op[1:]
        if offset + width <= len(data):
            data[offset : offset + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    elif op[0] == "dup":
        start, length, at = op[1:]
        data[at:at] = data[start : start + length]
    else:
        return False
    return True


def apply(base: bytes, ops: list[Op]) -> bytes:
    """The mutant: ``ops`` applied to ``base`` in order."""
    return apply_bytes(base, ops, _edit)


def random_op(rng: random.Random, data: bytes) -> Op:
    """One mutation of ``data``."""
    n = len(data)
    roll = rng.random()
    if roll < 0.45 or n < 16:
        offset = rng.randrange(max(n, 1))
        old = data[offset] if offset < n else 0
        value = old ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
        return ("flip", offset, value)
    if roll < 0.65:
        width = rng.choice((4, 8))
        offset = rng.randrange(0, n - width + 1, 4 if rng.random() < 0.8 else 1)
        current = int.from_bytes(data[offset : offset + width], "little")
        if rng.random() < 0.6:
            value = rng.choice(WORD_VALUES)
        else:
            value = current + rng.choice((-9, -8, -1, 1, 8, 9, 64))
        return ("word", offset, width, value % (1 << (8 * width)))
    if roll < 0.82:
        length = rng.choice(
            (0, 1, 4, 8, n - 1, n - 4, n - 8, n - 12, n // 2) + (rng.randrange(n),) * 4
        )
        return ("truncate", max(0, length))
    if roll < 0.92:
        count = rng.choice((1, 4, 8, rng.randrange(1, 200)))
        return ("append", count, rng.choice((0, 0xFF, rng.randrange(256))))
    start = rng.randrange(n)
    length = rng.choice((8, 16, 64, rng.randrange(1, n - start + 1)))
    return ("dup", start, length, rng.randrange(n + 1))


def random_mutant(seed: int, index: int) -> tuple[int, list[Op], bytes]:
    """Mutant ``index`` of run ``seed``: its base, its ops and its bytes (deterministic)."""
    rng = random.Random((seed << 40) ^ index)
    return draw(rng, [data for _, data in BASES], random_op, apply, (1, 1, 1, 2, 2, 3, 4))


# -- the oracle -----------------------------------------------------------------------------


def error_outcome(message: str) -> str:
    for phrase, name in ERRORS:
        if phrase in message:
            return name
    return "other-error"


def reference(data: bytes, container: str) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """Tokens and document starts as pyarrow reads ``data`` (only once ZeroBatch accepted it)."""
    buf = pa.BufferReader(data)
    if container == "parquet":
        table = pq.read_table(buf, columns=[COLUMN])
    else:
        probe = pa.ipc.open_file(buf) if container == "file" else pa.ipc.open_stream(buf)
        opts = pa.ipc.IpcReadOptions(included_fields=[probe.schema.get_field_index(COLUMN)])
        buf = pa.BufferReader(data)
        reader = (
            pa.ipc.open_file(buf, options=opts)
            if container == "file"
            else pa.ipc.open_stream(buf, options=opts)
        )
        table = reader.read_all()
    table.validate(full=True)  # flatten() of an invalid list array can abort the process
    tokens: list[npt.NDArray[Any]] = []
    starts: list[npt.NDArray[np.int64]] = []
    base = 0
    for chunk in table.column(COLUMN).chunks:
        flat = chunk.flatten().to_numpy(zero_copy_only=False)
        if pa.types.is_fixed_size_list(chunk.type):
            rel = np.arange(len(chunk), dtype=np.int64) * chunk.type.list_size
        else:
            off = chunk.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
            rel = off[:-1] - off[0]
        starts.append(rel + base)
        tokens.append(flat)
        base += flat.size
    return (
        np.concatenate(tokens) if tokens else np.empty(0, dtype=np.int64),
        np.concatenate(starts) if starts else np.empty(0, dtype=np.int64),
    )


def read_everything(path: str) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """Every entry point on the file at ``path``; raises ``AssertionError`` on disagreement."""
    files = expand_hf(path, column=COLUMN)
    try:
        assert len(files) == 1, files
        f = files[0]
        n = f.num_tokens
        whole = f.read_tokens(0, n)
        assert whole.shape == (n,) and whole.dtype == f.dtype, (whole.shape, whole.dtype)
        pieces = [f.read_tokens(a, min(n, a + 5)) for a in range(0, n, 5)]
        got = np.concatenate(pieces) if pieces else whole[:0]
        assert np.array_equal(got, whole), "ascending pieces differ from the whole"
        if n:
            assert np.array_equal(f.read_tokens(n // 2, n), whole[n // 2 :])
            assert np.array_equal(f.read_tokens(0, 1), whole[:1]), "a backward read differs"
        starts = np.array(f.document_starts())
        assert starts.ndim == 1 and starts.dtype == np.int64
        if starts.size:
            assert starts[0] >= 0 and starts[-1] <= n and bool((np.diff(starts) >= 0).all())
        for layout in LAYOUTS:
            src = TokenFileSource([f], SEQ_LEN, layout, chunk_records=2)
            at = record_starts(f, SEQ_LEN, layout)
            blocks = list(src.iter_blocks())
            got_records = np.concatenate(blocks) if blocks else np.empty((0, SEQ_LEN), np.uint32)
            tokens = whole.astype(np.uint32)
            want = tokens[at[:, None] + np.arange(SEQ_LEN)] if at.size else got_records[:0]
            assert src.num_records == at.size == len(got_records), layout
            assert np.array_equal(got_records, want), f"{layout} records differ"
        return whole, starts
    finally:
        for f in files:
            f.close()


def check(path: str, data: bytes, container: str) -> str:
    """The outcome of mutant ``data`` (written at ``path``): ``ok`` or the error's kind.

    Raises ``AssertionError`` on a disagreement; lets any exception that is not a
    ``ZeroBatchError`` escape.
    """
    try:
        tokens, starts = read_everything(path)
    except ZeroBatchError as e:
        return error_outcome(str(e))
    if container == "stream" and data[:6] == b"ARROW1":  # a flip made it look like a file
        container = "file"
    want_tokens, want_starts = reference(data, container)
    assert np.array_equal(tokens, want_tokens), "tokens differ from pyarrow's reading"
    assert tokens.dtype == want_tokens.dtype, (tokens.dtype, want_tokens.dtype)
    assert np.array_equal(starts, want_starts), "document starts differ from pyarrow's"
    return "ok"


def container_of(data: bytes, base: int) -> str:
    """How the reader takes the mutant: by its first bytes, as ``sniff_container`` does."""
    if data.startswith(b"PAR1"):
        return "parquet"
    if data[:6] == b"ARROW1":
        return "file"
    return "stream"


# -- worker ---------------------------------------------------------------------------------


def suffix_of(base: int) -> str:
    return ".parquet" if BASES[base][0] == "parquet" else ".arrow"


def run_one(path: str, seed: int, index: int) -> tuple[str, str]:
    """Mutant ``index``: its outcome, and a detail for a failure."""
    base, _, data = random_mutant(seed, index)
    target = path + suffix_of(base)
    with open(target, "wb") as f:
        f.write(data)
    try:
        return attempt(lambda: check(target, data, container_of(data, base)), FAILURE_KINDS)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(target)


def save_failure(out: str, seed: int, index: int, kind: str, detail: str) -> str:
    """Write mutant ``index`` (rebuilt from the seed) and what went wrong into ``out``."""
    base, ops, data = random_mutant(seed, index)
    record = {"seed": seed, "index": index, "kind": kind, "base": base, "ops": ops}
    return save_input(out, record | {"detail": detail}, data, suffix_of(base))


def run_worker(args: argparse.Namespace) -> int:
    """Check mutants ``--start..--stop``, keeping the status file current after every mutant.

    ``--crash-at`` checks the harness: on that mutant the worker aborts (``SIGABRT``, as a
    failed assertion in pyarrow's C++ would) or, given ``-2 - index``, hangs; the run must
    count one signal (or hang) there and go on with the rest of the chunk.
    """
    limit_address_space()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind

    def step(worker: Worker, index: int) -> None:
        sabotage(index, args.crash_at, -2 - args.crash_at, os.abort)
        kind, detail = run_one(os.path.join(worker.scratch, "mutant"), args.seed, index)
        worker.count(kind)
        if kind in FAILURE_KINDS:
            worker.failure(saved_failure(save_failure, args.out, args.seed, index, kind, detail))

    return serve(FLEET.layout, args, step)


# -- parent ---------------------------------------------------------------------------------


def run(args: argparse.Namespace, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``args.mutants`` mutants in worker processes; the run's figures."""
    result, out = run_saving(FLEET, args, save_failure, "zerobatch-fuzz-hf-", say)
    totals = result.totals
    summary = {
        **result.figures(args),
        "outcomes": {k: totals.counts[k] for k in OUTCOMES if totals.counts[k]},
        "failures": {k: totals.counts[k] for k in FAILURE_KINDS},
        "failure_details": totals.failures[:50],
        "out": out,
    }
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    result.head(say, args)
    say_outcomes(say, totals.counts, [k for k in OUTCOMES if k not in FAILURE_KINDS], 14)
    for kind in FAILURE_KINDS:
        say(f"{kind}: {totals.counts[kind]}")
    say_saved_failures(say, totals.failures)
    say(f"summary and failing inputs: {out}")
    return summary


def replay(seed: int, index: int) -> int:
    """Run mutant ``index`` alone, under the address-space limit, printing what happened."""
    limit_address_space()
    base, ops, data = random_mutant(seed, index)
    print(f"mutant {seed}:{index}: base {base} ({BASES[base][0]}), ops {json.dumps(ops)}")
    work = tempfile.mkdtemp(prefix="zerobatch-fuzz-hf-replay-")
    try:
        kind, detail = run_one(os.path.join(work, "mutant"), seed, index)
        if kind not in FAILURE_KINDS:
            path = os.path.join(work, "again" + (".parquet" if data[:4] == b"PAR1" else ".arrow"))
            with open(path, "wb") as f:
                f.write(data)
            buf = io.StringIO()
            try:
                read_everything(path)
            except ZeroBatchError as e:
                buf.write(f"{type(e).__name__}: {e}")
            detail = buf.getvalue()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(kind)
    if detail:
        print(re.sub(r"\n+$", "", detail))
    return 1 if kind in FAILURE_KINDS else 0


def make_parser() -> argparse.ArgumentParser:
    """The command line of the run (``main``); ``parse_args`` of it gives ``run`` its options."""
    p = parser(
        "tests.fuzz.fuzz_hf",
        "Fuzz the Hugging Face Arrow/parquet token reader with mutants.",
        mutants=100_000,
        chunk=5_000,
        hang_seconds=10.0,
        report_seconds=60.0,
        out=True,
    )
    p.add_argument("--replay", type=int, default=None, metavar="INDEX", help="one mutant")
    p.add_argument(
        "--crash-at",
        type=int,
        default=-1,
        help="harness self-check: the worker aborts on this mutant (-2 - I: hangs on mutant I)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.replay is not None:
        return replay(args.seed, args.replay)
    if args.worker:
        return run_worker(args)
    summary = run(args, say_flushed)
    return 1 if any(summary["failures"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
