"""Resources bounded by what exists: hostile manifests and states neither allocate nor spin.

A manifest's slot counts, ``batch_size`` and ``seq_len`` are claims until its shards are
opened, and a loader state's ``step``, ``num_workers`` and ``skip_steps`` are whatever the file
holding it says. Each case below runs in a child process under a 2 GiB address-space limit
and a wall-clock limit: a claim of terabytes must give ZeroBatch's own error (or a prompt
answer), never a ``MemoryError``, a crash or a loop that does not end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import U32_MAX, expected_file_size, padded_batch_bytes
from zerobatch_spec.dataset import MANIFEST_NAME, parse_manifest

from tests.helpers import records
from zerobatch_core import (
    BatchNativeLoader,
    DatasetError,
    DatasetReader,
    write_sharded_dataset,
)
from zerobatch_core.order import sharded_order

ADDRESS_SPACE = 2 << 30
WALL_SECONDS = 60  # each case takes well under a second; the margin is for a busy machine

PRELUDE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
path = sys.argv[1]
"""


def _run(code: str, path: Path) -> str:
    """Run ``code`` in a child under the limits; its stdout (the child must exit 0)."""
    script = PRELUDE.format(limit=ADDRESS_SPACE) + textwrap.dedent(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=WALL_SECONDS,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _hostile(tmp_path: Path, batch_size: int, seq_len: int, fakes: int) -> Path:
    """A real one-shard dataset whose manifest also lists ``fakes`` absent shards of the most
    slots the rules allow, every field consistent with the others (a few hundred bytes each)."""
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(8, 4)], batch_size=2, seq_len=4, shard_batches=4, seed=1)
    data = json.loads((out / MANIFEST_NAME).read_bytes())
    n = U32_MAX // batch_size
    data["batch_size"], data["seq_len"] = batch_size, seq_len
    data["shards"] = [
        {
            "name": f"fake-{i:05d}.batch",
            "num_batches": n,
            "seed": i,
            "total_records": U32_MAX,
            "size": expected_file_size(batch_size, seq_len, n),
            "header_xxh3": "0" * 16,
        }
        for i in range(fakes)
    ]
    data.pop("sources", None)
    (out / MANIFEST_NAME).write_text(json.dumps(data))
    checked = parse_manifest((out / MANIFEST_NAME).read_bytes())
    assert hasattr(checked, "shards"), checked  # every manifest rule holds
    return out


def test_a_manifest_claiming_terabytes_opens_and_fails_on_the_missing_shard(
    tmp_path: Path,
) -> None:
    path = _hostile(tmp_path, batch_size=1, seq_len=1, fakes=2000)  # 2**43 slots claimed
    out = _run(
        """
        from zerobatch_core import BatchNativeLoader, DatasetError, DatasetReader
        for verify in ("first", "always", "off"):
            reader = DatasetReader(path, verify=verify)
            assert reader.num_batches == 2000 * (2**32 - 1)
            loader = BatchNativeLoader(reader, block_size=1)
            try:
                next(iter(loader))
            except DatasetError as e:
                assert e.code.value == "shard_missing", e
                print(e.code.value)
            reader.close()
        """,
        path,
    )
    assert out.split() == ["shard_missing"] * 3


def test_a_huge_slot_claim_allocates_no_buffer_before_the_shard_is_opened(
    tmp_path: Path,
) -> None:
    # One slot claims 2**16 x 2**16 tokens (16 GiB); its int64 chunk would be 256 GiB.
    path = _hostile(tmp_path, batch_size=1 << 16, seq_len=1 << 16, fakes=4)
    out = _run(
        """
        from zerobatch_core import BatchNativeLoader, DatasetError
        for dtype, token in (("int64", False), ("uint32", True), ("int32", False)):
            loader = BatchNativeLoader(path, dtype=dtype, next_token=token, shuffle=False)
            try:
                next(iter(loader))
            except DatasetError as e:
                print(e.code.value)
            loader.source.close()
        """,
        path,
    )
    assert out.split() == ["shard_missing"] * 3


def test_trace_of_a_step_of_four_billion_rows_is_refused_by_name(tmp_path: Path) -> None:
    path = _hostile(tmp_path, batch_size=U32_MAX, seq_len=1, fakes=1)
    out = _run(
        """
        import contextlib, io
        from zerobatch_core.cli import main
        from zerobatch_core.errors import ZeroBatchError
        from zerobatch_core.delivery.provenance import trace_step
        try:
            trace_step(path, 0, shuffle=False)
        except ZeroBatchError as e:
            assert "4294967295 rows" in str(e), e
            print(type(e).__name__)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(["trace", path, "--step", "0"])
        print(status, "max" in err.getvalue() or "more than" in err.getvalue())
        """,
        path,
    )
    assert out.split() == ["TraceError", "1", "True"]


def test_trace_max_rows_is_the_commands_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerobatch_core.cli import main

    path = tmp_path / "ds"
    write_sharded_dataset(path, [records(16, 3)], batch_size=4, seq_len=3, shard_batches=2, seed=1)
    assert main(["trace", str(path), "--step", "1", "--max-rows", "3"]) == 1
    assert "more than the 3" in capsys.readouterr().err
    assert main(["trace", str(path), "--step", "1", "--max-rows", "4", "--json"]) == 0
    pieces = json.loads(capsys.readouterr().out)["pieces"]
    assert sum(len(p["origins"]) for p in pieces) == 4
    with pytest.raises(SystemExit) as usage:
        main(["trace", str(path), "--step", "1", "--max-rows", "0"])
    assert usage.value.code == 2


def test_skip_steps_covering_two_to_the_forty_steps_are_jumped_not_walked(
    tmp_path: Path,
) -> None:
    path = _hostile(tmp_path, batch_size=1, seq_len=1, fakes=600)  # about 2**41.2 steps
    out = _run(
        """
        from zerobatch_core import BatchNativeLoader, DatasetError
        skip = [(0, 2**40), (2**40 + 1, 2**40 + 2**39)]
        loader = BatchNativeLoader(path, skip_steps=skip, verify="off", shuffle=False)
        assert loader.served(loader.position) == len(loader) - 2**40 - 2**39 + 1
        try:
            next(iter(loader))  # step 2**40 is the first served: a missing shard
        except DatasetError as e:
            print(e.code.value, loader.step)
        loader.split_workers(1, 3)  # served: 2**40, then 2**40 + 2**39 on: worker 1's first
        print(loader.step == 2**40 + 2**39)
        state = loader.state_dict()
        twin = BatchNativeLoader(path, verify="off", shuffle=False)
        twin.load_state_dict(state)
        print(twin.position == loader.position)
        """,
        path,
    )
    assert out.split() == ["shard_missing", "0", "True", "True"]


@pytest.mark.parametrize(
    ("workers", "worker", "step", "origin"),
    [(2**60, 2**59, 2**59, 0), (2**62, 5, 2**61, 2**40), (3, 1, 2**40 + 1, 0)],
)
def test_states_with_huge_workers_and_steps_load_or_are_refused_at_once(
    tmp_path: Path, workers: int, worker: int, step: int, origin: int
) -> None:
    path = _hostile(tmp_path, batch_size=1, seq_len=1, fakes=300)
    out = _run(
        f"""
        from zerobatch_core import BatchNativeLoader, StateError
        loader = BatchNativeLoader(path, verify="off")
        state = loader.state_dict()
        state.update(num_workers={workers}, worker={worker}, step={step}, origin={origin})
        try:
            loader.load_state_dict(state)
            print("loaded", loader.step == {step})
        except StateError as e:
            print("StateError")
        state.update(num_workers=2**64, worker=0, step=0, origin=0)
        try:
            loader.load_state_dict(state)
        except StateError as e:
            assert "num_workers" in str(e), e
            print("StateError")
        """,
        path,
    )
    assert out.split()[-1] == "StateError"
    assert out.split()[0] in ("loaded", "StateError")


def test_the_dataset_order_of_claimed_terabytes_is_computed_not_built() -> None:
    code = """
    from zerobatch_core.order import sharded_order
    order = sharded_order([2**32 - 1, 7] * 10000, 2, seed=5)
    spans = order.spans(3, 2**44 + 5)
    span = next(spans)
    print(span.stop - span.start >= 1, sum(1 for _ in zip(range(10000), spans)))
    """
    out = _run(code, Path("."))
    assert out.split() == ["True", "10000"]


def test_the_computed_dataset_order_is_the_reference_order() -> None:
    from zerobatch_spec.dataset import dataset_epoch_order

    rng = np.random.default_rng(4)
    for _ in range(60):
        shards = [int(x) for x in rng.choice([0, 1, 2, 3, 5, 8, 13], rng.integers(0, 7))]
        block = int(rng.choice([1, 2, 3, 4, 9, 2**64 - 1]))
        seed, epoch, shuffle = (
            int(rng.integers(2**63)),
            int(rng.integers(4)),
            bool(rng.random() < 0.7),
        )
        order = sharded_order(shards, block, seed, shuffle)
        want = dataset_epoch_order(shards, block, seed, epoch, shuffle).tolist()
        for start in range(len(want) + 1):
            assert list(order.indices(epoch, start)) == want[start:]
    shards = [3, 7, 0, 5, 1] * 1000  # 7000 blocks: several chunks of order slots
    order = sharded_order(shards, 2, seed=12)
    for epoch in (0, 5):
        want = dataset_epoch_order(shards, 2, 12, epoch).tolist()
        assert order.epoch_order(epoch).tolist() == want
        for start in (1, 1023, 1024, 1025, 9000, len(want) - 1):
            assert list(order.indices(epoch, start)) == want[start:]


@pytest.mark.parametrize("gbs", [1, 2, 4, 8])
def test_skipped_steps_in_later_epochs_at_another_global_batch_size_are_exactly_those(
    tmp_path: Path, gbs: int
) -> None:
    """The computed skips and worker splits serve what walking every step would: each
    epoch's items minus the skipped global steps, dealt round-robin to the workers."""
    out = tmp_path / "small"
    write_sharded_dataset(out, [records(40, 4)], batch_size=4, seq_len=4, shard_batches=3)
    full = BatchNativeLoader(out, global_batch_size=gbs, block_size=2, seed=3)
    n = len(full)
    every = [np.array(item) for _ in range(3) for item in full]  # epochs 0, 1, 2
    skips = [(1, 3), (n - 1, n + 2), (2 * n + 1, 2 * n + n // 2 + 1), (5 * n, 9 * n)]
    kept = [g for g in range(3 * n) if not any(a <= g < b for a, b in skips)]
    for workers in (1, 3):
        for worker in range(workers):
            loader = BatchNativeLoader(
                out, global_batch_size=gbs, block_size=2, seed=3, skip_steps=skips
            )
            loader.split_workers(worker, workers)
            got = [np.array(item) for _ in range(3) for item in loader]
            want = [
                every[g]
                for e in range(3)
                for j, g in enumerate(g for g in kept if g // n == e)
                if j % workers == worker
            ]
            assert len(got) == len(want)
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
            loader.source.close()
    full.source.close()


@pytest.mark.parametrize("verify", ["first", "always"])
def test_slots_checked_per_shard_once_and_a_corrupted_one_raises_every_time(
    tmp_path: Path, verify: str
) -> None:
    out = tmp_path / "small"
    write_sharded_dataset(out, [records(40, 4)], batch_size=4, seq_len=4, shard_batches=3)
    shard = out / "shard-00001.batch"
    data = bytearray(shard.read_bytes())
    data[4096 + padded_batch_bytes(4, 4) + 7] ^= 0x01  # shard 1, slot 1: dataset slot 4
    shard.write_bytes(bytes(data))
    reader = DatasetReader(out, verify=verify)  # type: ignore[arg-type]
    for _ in range(3):
        with pytest.raises(DatasetError, match=r"checksum_mismatch.*dataset slot 4"):
            reader.read_batch(4)
    for index in (3, 5, 9, 0):
        reader.read_batch(index)
        before = reader.bytes_read
        reader.read_batch(index)  # checked again only under "always"
        assert reader.bytes_read - before == (padded_batch_bytes(4, 4) if verify == "always" else 0)
    reader.close()


def test_oversized_metadata_files_are_refused_before_they_are_read(tmp_path: Path) -> None:
    """A sparse checksums file of 3 GiB, a manifest of 65 MiB and a live manifest version of
    2 GiB cost no memory: each is refused by its size, naming it, under a 2 GiB address-space
    limit (they used to be read whole: MemoryError)."""
    path = tmp_path / "ds"
    write_sharded_dataset(path, [records(8, 3)], batch_size=2, seq_len=3, shard_batches=2)
    os.truncate(path / "checksums.xxh3", 3 << 30)
    big = tmp_path / "big"
    write_sharded_dataset(big, [records(8, 3)], batch_size=2, seq_len=3, shard_batches=2)
    with open(big / MANIFEST_NAME, "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.truncate(f.tell() + (65 << 20))
    live = tmp_path / "live"
    out = _run(
        f"""
        import os
        import numpy as np
        from zerobatch_core import BatchNativeLoader, DatasetError, DatasetReader
        from zerobatch_core.errors import ZeroBatchError
        from zerobatch_core.live import LiveProducer
        from zerobatch_core.live.source import LiveSource
        with DatasetReader(path, verify="first") as reader:
            try:
                reader.read_batch(0)
            except DatasetError as e:
                print(e.code.value, "more than" in str(e))
        try:
            DatasetReader({str(big)!r})
        except (DatasetError, OSError) as e:
            print(type(e).__name__, "more than" in str(e))
        with LiveProducer({str(live)!r}, "p", batch_size=2, seq_len=3, cadence=1) as p:
            p.append(np.zeros((2, 3), dtype=np.uint32))
        os.truncate({str(live)!r} + "/manifests/00000000000000000001.json", 2 << 30)
        try:
            LiveSource({str(live)!r}, timeout=1)
        except ZeroBatchError as e:
            print(type(e).__name__, "more than" in str(e))
        """,
        str(path),
    )
    assert out.split() == [
        "checksums_mismatch",
        "True",
        "ZeroBatchIOError",
        "True",
        "ZeroBatchIOError",
        "True",
    ]


def test_a_claimed_size_bounds_a_read_but_never_sizes_its_buffer(tmp_path: Path) -> None:
    """A manifest claiming 2^40 slots makes the checksums file's bound 8 TiB: the small file
    there is still read by its own size (a read sized by the bound asked for 8 TiB)."""
    small = tmp_path / "small"
    small.write_bytes(b"x" * 100)
    out = _run(
        """
        from zerobatch_core.stores.regular_files import read_regular_file
        print(len(read_regular_file(path, 1 << 43)))
        """,
        small,
    )
    assert out.split() == ["100"]
