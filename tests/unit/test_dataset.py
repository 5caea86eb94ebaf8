"""Datasets: sharded writing, the manifest, lazy checked shards, checksums and the dataset order."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import permute
from zerobatch_spec.dataset import (
    CHECKSUMS_NAME,
    DOMAIN_DATASET_BLOCKS,
    MANIFEST_NAME,
    DatasetCode,
    DatasetViolation,
    build_manifest,
    dataset_blocks,
    dataset_epoch_key,
    dataset_epoch_order,
    parse_manifest,
    shard_seed,
)
from zerobatch_spec.shuffle import DOMAIN_RECORDS, epoch_key

from tests.helpers import records
from zerobatch_core import (
    BatchNativeLoader,
    BatchStream,
    DatasetError,
    DatasetReader,
    StateError,
    WriteError,
    create_dataset,
    write_batch_file,
    write_sharded_dataset,
)
from zerobatch_core.datasets.dataset import OPEN_AHEAD, _opener

B, T = 4, 8


def blocks(n: int, chunk: int = 7) -> Any:
    data = records(n, T)
    for i in range(0, n, chunk):
        yield data[i : i + chunk]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """5 shards of 3 batches and a last one of 1 (+2 dropped records): 16 slots, 66 records."""
    out = tmp_path / "ds"
    write_sharded_dataset(out, blocks(66), batch_size=B, seq_len=T, shard_batches=3, seed=11)
    return out


def first_tokens(items: Any) -> list[int]:
    return [int(np.asarray(b)[0, 0]) for b in items]


# -- writing -------------------------------------------------------------------------------------
def test_sharded_writer_cuts_consecutive_record_ranges(dataset: Path) -> None:
    with DatasetReader(dataset) as ds:
        assert [s.num_batches for s in ds.shards] == [3, 3, 3, 3, 3, 1]
        assert ds.num_batches == 16 and (ds.batch_size, ds.seq_len) == (B, T)
        source = records(66, T)
        first = 0
        for i, shard in enumerate(ds.shards):
            assert shard.records == (first, first + shard.total_records)
            assert shard.seed == shard_seed(11, i)
            reader = ds.shard(i)
            for p in range(shard.num_batches * B):  # the file writer's rule, per shard
                want = first + permute(p, shard.total_records, shard.seed, DOMAIN_RECORDS)
                np.testing.assert_array_equal(reader.read_batch(p // B)[p % B], source[want])
            first += shard.total_records
        assert first == 66  # the last shard holds 6 records: 1 batch, 2 dropped


def test_manifest_is_canonical_and_round_trips(dataset: Path) -> None:
    data = (dataset / MANIFEST_NAME).read_bytes()
    manifest = parse_manifest(data)
    assert not isinstance(manifest, DatasetViolation)
    assert build_manifest(manifest) == data
    assert manifest.checksums_xxh3 == DatasetReader(dataset).manifest.checksums_xxh3
    assert len((dataset / CHECKSUMS_NAME).read_bytes()) == 16 * 8


def test_create_dataset_over_existing_files(tmp_path: Path) -> None:
    out = tmp_path / "made"
    out.mkdir()
    for i, n in enumerate((12, 20, 8)):
        write_batch_file(out / f"part-{i}.batch", records(n, T) + i * 1000, batch_size=B, seed=i)
    manifest = create_dataset(out, seed=5)
    assert [s.name for s in manifest.shards] == ["part-0.batch", "part-1.batch", "part-2.batch"]
    assert manifest.num_batches == 3 + 5 + 2 and manifest.seed == 5
    with pytest.raises(WriteError, match="already a dataset"):
        create_dataset(out)
    create_dataset(out, ["part-2.batch", "part-0.batch"], overwrite=True)
    assert DatasetReader(out).num_batches == 5
    write_batch_file(out / "odd.batch", records(8, 5), batch_size=B)
    with pytest.raises(WriteError, match="batch_size, seq_len"):
        create_dataset(out, ["part-0.batch", "odd.batch"], overwrite=True)


# -- order ---------------------------------------------------------------------------------------
def test_blocks_never_cross_a_shard_and_the_order_is_the_reference(dataset: Path) -> None:
    first, length = dataset_blocks([3, 3, 3, 3, 3, 1], 2)
    assert first.tolist() == [0, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15]
    assert length.tolist() == [2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 1]
    loader = BatchNativeLoader(dataset, block_size=2, verify="off")
    for epoch in (0, 1, 7):
        order = loader.epoch_order(epoch).tolist()
        assert order == dataset_epoch_order([3, 3, 3, 3, 3, 1], 2, 11, epoch).tolist()
        assert sorted(order) == list(range(16))
        key = dataset_epoch_key(11, epoch)
        slots = [permute(k, 11, key, DOMAIN_DATASET_BLOCKS) for k in range(11)]
        assert order == [
            int(f) + j for k in slots for j in range(int(length[k])) for f in [first[k]]
        ]


def test_dataset_keys_do_not_collide_where_seed_xor_epoch_does() -> None:
    assert epoch_key(0, 1) == epoch_key(1, 0)  # the file order's v1 key, kept for compatibility
    assert dataset_epoch_key(0, 1) != dataset_epoch_key(1, 0)
    keys = {dataset_epoch_key(s, e) for s in range(64) for e in range(64)}
    assert len(keys) == 64 * 64


def test_loader_serves_the_dataset_and_resumes(dataset: Path) -> None:
    with DatasetReader(dataset) as ds:
        by_token = {int(ds.read_batch(i)[0, 0]): i for i in range(ds.num_batches)}
    loader = BatchNativeLoader(dataset, block_size=2)
    e0 = [by_token[t] for t in first_tokens(loader)]
    assert e0 == loader.epoch_order(0).tolist()
    it = iter(loader)
    head = first_tokens(next(it) for _ in range(5))
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["source"]["dataset"] == DatasetReader(dataset).manifest_sha256
    resumed = BatchStream(dataset, block_size=2, dtype="uint32")
    resumed.load_state_dict(state)
    assert head + first_tokens(resumed) == first_tokens(
        BatchNativeLoader(dataset, block_size=2, epoch=1)
    )


def test_a_state_of_another_dataset_is_refused(dataset: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(dataset, other)
    data = records(66, T)
    data[0, 0] = 999_999  # the same shape, one token different
    write_sharded_dataset(
        other, iter([data]), batch_size=B, seq_len=T, shard_batches=3, seed=11, overwrite=True
    )
    state = BatchNativeLoader(dataset).state_dict()
    with pytest.raises(StateError, match="another file or dataset"):
        BatchNativeLoader(other).load_state_dict(state)


# -- integrity -----------------------------------------------------------------------------------
def test_a_corrupted_slot_is_never_served(dataset: Path) -> None:
    with DatasetReader(dataset) as ds:
        shard, local = ds.locate(7)
        path = ds.shard_path(shard)
        offset = 4096 + local * 4096 + 12  # a byte inside slot 7's tokens
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    loader = BatchNativeLoader(dataset, shuffle=False)
    with pytest.raises(
        DatasetError, match=rf"{os.path.basename(path)}.*checksum_mismatch.*slot {local}"
    ) as err:
        list(loader)
    assert err.value.code is DatasetCode.CHECKSUM_MISMATCH
    assert len(first_tokens(BatchNativeLoader(dataset, shuffle=False, verify="off"))) == 16


def test_a_missing_or_resized_or_replaced_shard_names_the_shard(dataset: Path) -> None:
    name = "shard-00002.batch"
    target = dataset / name
    saved = target.read_bytes()
    target.unlink()
    with pytest.raises(DatasetError, match=f"{name}.*shard_missing"):
        list(BatchNativeLoader(dataset, verify="off"))
    target.write_bytes(saved + bytes(4096))
    with pytest.raises(DatasetError, match=f"{name}.*shard_size_mismatch"):
        list(BatchNativeLoader(dataset, verify="off"))
    write_batch_file(target, records(12, T), batch_size=B, seed=1, overwrite=True)  # same size
    with pytest.raises(DatasetError, match=f"{name}.*shard_header_mismatch"):
        list(BatchNativeLoader(dataset, verify="off"))


def test_broken_checksums_file_is_refused(dataset: Path) -> None:
    path = dataset / CHECKSUMS_NAME
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(DatasetError, match="checksums_mismatch"):
        next(iter(BatchNativeLoader(dataset)))
    next(iter(BatchNativeLoader(dataset, verify="off")))  # nothing to check against: served


@pytest.mark.parametrize(
    ("edit", "code", "where"),
    [
        (lambda m: m.update(format="x"), "manifest_bad_format", "format"),
        (lambda m: m.update(version=3), "manifest_unsupported_version", "version"),
        (lambda m: m.update(batch_size=0), "manifest_bad_field", "batch_size"),
        (
            lambda m: m["shards"][1].update(name="../etc/passwd"),
            "manifest_bad_field",
            "shards[1].name",
        ),
        (lambda m: m["shards"][0].update(num_batches=2**70), "manifest_bad_field", "num_batches"),
        (lambda m: m["shards"][0].update(size=5), "manifest_bad_field", "size"),
        (lambda m: m["shards"][0].update(size=4096 * 3), "manifest_bad_shard", "size"),
        (lambda m: m["shards"][2].update(name="shard-00000.batch"), "manifest_bad_shard", "name"),
        (lambda m: m["shards"][0].update(header_xxh3="ABC"), "manifest_bad_field", "header_xxh3"),
        (lambda m: m.update(checksums={"algorithm": "md5"}), "manifest_bad_field", "checksums"),
    ],
)
def test_manifest_rules_name_the_field(dataset: Path, edit: Any, code: str, where: str) -> None:
    manifest = json.loads((dataset / MANIFEST_NAME).read_text())
    edit(manifest)
    (dataset / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=f"{code}: .*{re.escape(where)}"):
        DatasetReader(dataset)


def test_hostile_manifest_bytes_are_a_dataset_error(dataset: Path) -> None:
    for data in (b"\xff\xfe", b"[" * 100_000, b"{}", b'{"format": "zerobatch.dataset"}', b"null"):
        (dataset / MANIFEST_NAME).write_bytes(data)
        with pytest.raises(DatasetError):
            DatasetReader(dataset)


# -- many shards ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def thousand_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("many")
    first = out / "s-0000.batch"
    write_batch_file(first, records(2 * B, T), batch_size=B, seed=3)
    for i in range(1, 1000):
        shutil.copyfile(first, out / f"s-{i:04d}.batch")
    create_dataset(out)
    return out


def test_a_thousand_shards_open_in_well_under_a_second(thousand_shards: Path) -> None:
    t0 = time.perf_counter()
    with DatasetReader(thousand_shards) as ds:
        opened = time.perf_counter() - t0
        assert ds.num_batches == 2000 and len(ds.shards) == 1000
    assert opened < 1.0, opened


def _settled_descriptors() -> int:
    """This process's open descriptors once nothing earlier is still releasing any: readers
    of earlier tests collected, the opening thread's queued closes done, the count steady."""
    gc.collect()
    _opener().submit(lambda: None).result()  # one thread, in order: every earlier close is done
    count, deadline = len(os.listdir("/proc/self/fd")), time.monotonic() + 5.0
    while time.monotonic() < deadline:  # a read-ahead hint may still hold a closed reader's
        time.sleep(0.05)
        now = len(os.listdir("/proc/self/fd"))
        if now == count:
            break
        count = now
    return count


def test_open_shards_stay_bounded(thousand_shards: Path) -> None:
    fds = _settled_descriptors()
    loader = BatchNativeLoader(DatasetReader(thousand_shards, max_open=8), block_size=1)
    seen = 0
    peak = 0
    for _batch in loader:
        seen += 1
        if seen % 50 == 0:
            peak = max(peak, len(os.listdir("/proc/self/fd")) - fds)
    del _batch  # a view held keeps its shard's mapping (and its descriptor) alive
    # Two descriptors per open shard (the reader's and its mapping's), the shards being opened
    # ahead, and one shard being closed on the opening thread (released right after).
    assert seen == 2000 and 0 < peak <= 2 * (8 + OPEN_AHEAD) + 2
    loader.source.close()
    assert len(os.listdir("/proc/self/fd")) <= fds  # close waits for the background closes
    assert _settled_descriptors() == fds


def test_a_forked_child_opens_its_own_shards(thousand_shards: Path) -> None:
    """Shards being opened ahead by the parent's thread are not waited for in a child."""
    with DatasetReader(thousand_shards, max_open=4) as ds:
        ds.read_ahead(0, 40)  # several shards now being opened on the parent's thread
        pid = os.fork()
        if pid == 0:  # the child: must read on its own, never wait for the parent's thread
            ok = all(ds.read_batch(i).shape == (B, T) for i in range(0, 60, 3))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert ds.read_batch(5).shape == (B, T)
