"""Building datasets: shard a stream of records, or describe LLMBATCH files already written.

``write_sharded_dataset`` cuts a record stream into consecutive ranges of ``shard_batches *
batch_size`` records and writes each range as one LLMBATCH file with the file writer (so every
shard is a file in its own right: shard ``i``'s records are input records ``[first, last)``,
permuted with the shard's seed by the file writer's rule). ``create_dataset`` describes files
that already exist. Both then write ``checksums.xxh3`` and, last, ``manifest.json``, each
atomically: a directory without a manifest is not a dataset, and a manifest never names a shard
that is missing or partial.

``write_sharded_dataset`` owns the names ``shard-NNNNN.batch``, ``checksums.xxh3`` and
``manifest.json`` in its directory: it refuses a directory that holds any of them unless
``overwrite=True`` (a manifest: an existing dataset; shards alone: an unfinished write), never
writes over one of its ``inputs``, and after an overwrite removes the shard files of the earlier
dataset that the new manifest does not list, so the directory holds exactly the new dataset.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
from zerobatch_spec import U32_MAX, build_header
from zerobatch_spec.dataset import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    SHARD_NAME_FORMAT,
    Manifest,
    Shard,
    Source,
    build_manifest,
    bytes_xxh3,
    header_xxh3,
    shard_seed,
)

from .arguments import int_arg
from .dataset import slot_checksums
from .errors import WriteError
from .reader import BatchFileReader
from .writer import write_batch_dataset, write_bytes_atomic

SHARD_PATTERN = SHARD_NAME_FORMAT
"""File names of the shards ``write_sharded_dataset`` writes (``SPEC.md`` section 12)."""

SHARD_NAME = re.compile(r"\Ashard-[0-9]{5,}\.batch\Z")
"""Matches every name ``SHARD_PATTERN`` gives (shard 100000 on has more digits)."""

PathLike = str | os.PathLike[str]
SourcesArg = Sequence[Source] | Callable[[], Sequence[Source]]
"""The manifest's sources, or a function giving them once the record stream is exhausted (for
inputs whose record counts are known only after reading them)."""

U32Rows = npt.NDArray[np.uint32]


def describe_shard(reader: BatchFileReader, name: str, records: tuple[int, int] | None) -> Shard:
    """The manifest entry of the open shard ``reader``, named ``name``, written from input
    records ``records``."""
    h = reader.header
    return Shard(
        name=name,
        num_batches=h.num_batches,
        seed=h.seed,
        total_records=h.total_records,
        size=h.file_size,
        header_xxh3=header_xxh3(build_header(h)),
        records=records,
    )


def commit_manifest(
    directory: str,
    shards: list[Shard],
    checksums: list[npt.NDArray[np.uint64]],
    batch_size: int,
    seq_len: int,
    seed: int,
    sources: Sequence[Source],
    overwrite: bool,
) -> Manifest:
    """Write the checksums, then the manifest (last): the dataset exists from that moment.

    ``shards`` and their slot ``checksums`` in dataset order; every source's record range must
    lie within the shards' input records.
    """
    total = sum(s.total_records for s in shards)
    for source in sources:
        first, last = source.records
        if not 0 <= first <= last <= total:
            raise WriteError(
                f"{directory}: source {source.path}: records [{first}, {last}) are outside the "
                f"dataset's {total:,} input records"
            )
    data = np.concatenate(checksums).astype("<u8").tobytes() if checksums else b""
    write_bytes_atomic(os.path.join(directory, CHECKSUMS_NAME), data, overwrite=True)
    manifest = Manifest(batch_size, seq_len, seed, tuple(shards), bytes_xxh3(data), tuple(sources))
    write_bytes_atomic(
        os.path.join(directory, MANIFEST_NAME), build_manifest(manifest), overwrite=overwrite
    )
    return manifest


def _check_directory(directory: str | os.PathLike[str], overwrite: bool) -> str:
    path = os.fspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise WriteError(f"{path}: exists and is not a directory (a dataset is a directory)")
    os.makedirs(path, exist_ok=True)
    if os.path.exists(os.path.join(path, MANIFEST_NAME)) and not overwrite:
        raise WriteError(
            f"{path}: already a dataset (it has a {MANIFEST_NAME}); pass overwrite=True "
            "(--overwrite on the command line) to replace it"
        )
    return path


_METADATA = (MANIFEST_NAME, CHECKSUMS_NAME)


def shard_file_names(path: str) -> list[str]:
    """The shard files in ``path`` named as ``write_sharded_dataset`` names them, sorted."""
    try:
        return sorted(n for n in os.listdir(path) if SHARD_NAME.match(n))
    except FileNotFoundError:
        return []


def check_dataset_output(
    directory: PathLike, *, overwrite: bool = False, inputs: Iterable[PathLike] = ()
) -> str:
    """``directory`` as a string, after the checks ``write_sharded_dataset`` makes first.

    Nothing is created. Refused with a ``WriteError`` naming the path: an existing path that is
    not a directory; a directory that is already a dataset, or that holds shard files
    (``shard-NNNNN.batch``) without a manifest, unless ``overwrite``; and, always, an input
    that is one of the files the write would replace (a shard, the checksums or the manifest).
    """
    path = os.fspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise WriteError(f"{path}: output path exists and is not a directory (a dataset is one)")
    if os.path.isdir(path):
        real = os.path.realpath(path)
        for item in inputs:
            name = os.fspath(item)
            where, base = os.path.split(os.path.realpath(name))
            if where == real and (SHARD_NAME.match(base) or base in _METADATA):
                raise WriteError(
                    f"{name}: input file would be replaced by the dataset written into {path}"
                )
        if os.path.exists(os.path.join(path, MANIFEST_NAME)) and not overwrite:
            raise WriteError(
                f"{path}: already a dataset (it has a {MANIFEST_NAME}); pass overwrite=True "
                "(--overwrite on the command line) to replace it"
            )
        leftovers = shard_file_names(path)
        if leftovers and not overwrite:
            raise WriteError(
                f"{path}: holds shard files ({leftovers[0]}, ...) but no {MANIFEST_NAME}, left "
                "by an unfinished write; pass overwrite=True (--overwrite on the command line) "
                "to replace them"
            )
    return path


def create_dataset(
    directory: str | os.PathLike[str],
    names: Sequence[str] | None = None,
    *,
    seed: int | None = None,
    sources: Sequence[Source] = (),
    overwrite: bool = False,
) -> Manifest:
    """Describe LLMBATCH files in ``directory`` as a dataset: checksums, then the manifest.

    ``names`` are the shard file names in dataset order (default: every ``*.batch`` file in
    the directory, sorted). They must share ``batch_size`` and ``seq_len``. ``seed`` is the
    dataset's default order seed (default: the first shard's header seed). Every slot is read
    once to checksum it.
    """
    path = _check_directory(directory, overwrite)
    if names is None:
        names = sorted(n for n in os.listdir(path) if n.endswith(".batch"))
    if not names:
        raise WriteError(f"{path}: no LLMBATCH files to describe (*.batch)")
    shards: list[Shard] = []
    checksums: list[npt.NDArray[np.uint64]] = []
    shape: tuple[int, int] | None = None
    for name in names:
        if os.path.basename(name) != name:
            raise WriteError(f"{path}: shard {name!r} must be a file name inside the directory")
        with BatchFileReader(os.path.join(path, name)) as reader:
            if shape is None:
                shape = (reader.batch_size, reader.seq_len)
            elif shape != (reader.batch_size, reader.seq_len):
                raise WriteError(
                    f"{path}: {name} has batch_size, seq_len = "
                    f"{(reader.batch_size, reader.seq_len)}; the first shard, {names[0]}, has "
                    f"{shape}: a dataset's shards share one shape"
                )
            shards.append(describe_shard(reader, name, None))
            checksums.append(slot_checksums(reader))
    assert shape is not None
    first_seed = shards[0].seed if seed is None else int_arg("seed", seed, 0)
    return commit_manifest(path, shards, checksums, *shape, first_seed, sources, overwrite)


class _ShardCutter:
    """Cuts a stream of ``[k, seq_len]`` record blocks into consecutive runs of ``n`` records."""

    def __init__(self, blocks: Iterable[npt.NDArray[np.integer]], seq_len: int) -> None:
        self._blocks = iter(blocks)
        self._pending: list[npt.NDArray[np.integer]] = []
        self.seq_len = seq_len
        self.exhausted = False

    def _next_block(self) -> npt.NDArray[np.integer] | None:
        if self._pending:
            return self._pending.pop()
        for block in self._blocks:
            arr = np.asarray(block)
            if arr.ndim == 1:
                arr = arr.reshape(1, -1)
            if arr.ndim != 2 or arr.shape[1] != self.seq_len:
                raise WriteError(
                    f"records must be [k, seq_len={self.seq_len}] blocks, got shape {arr.shape}"
                )
            if arr.shape[0]:
                return arr
        self.exhausted = True
        return None

    def run(self, n: int) -> Iterator[npt.NDArray[np.integer]]:
        """The next ``n`` records (fewer if the stream ends), block by block."""
        left = n
        while left > 0:
            block = self._next_block()
            if block is None:
                return
            if block.shape[0] > left:
                self._pending.append(block[left:])
                block = block[:left]
            left -= block.shape[0]
            yield block

    def empty(self) -> bool:
        """Whether no record is left."""
        block = self._next_block()
        if block is None:
            return True
        self._pending.append(block)
        return False


def write_sharded_dataset(
    directory: str | os.PathLike[str],
    records: Iterable[npt.NDArray[np.integer]],
    *,
    batch_size: int,
    seq_len: int,
    shard_batches: int,
    seed: int = 0,
    sources: SourcesArg = (),
    overwrite: bool = False,
    allow_empty: bool = False,
    inputs: Iterable[PathLike] = (),
) -> Manifest:
    """Write a record stream as a dataset of shards of ``shard_batches`` batches each.

    ``records`` yields ``[k, seq_len]`` integer blocks (or single records). Shard ``i`` holds
    records ``[i * shard_batches * batch_size, ...)`` of the stream, written by the file
    writer with seed ``shard_seed(seed, i)``; only the last shard can be shorter, and only it
    drops a remainder (its record count modulo ``batch_size``). Memory stays bounded by the
    file writer's bound; the disk needs room for one shard's scratch space at a time.

    ``sources`` go into the manifest: which input file gave which range of the stream's
    records (a function is called once the stream is exhausted). A stream that fills no batch
    is refused unless ``allow_empty`` (a stream of no record at all writes a dataset of no
    shard). The directory is checked first (``check_dataset_output``, with ``inputs``). If
    anything fails before the manifest is written (a source error, an interruption), the
    shards this call wrote are removed.
    """
    batch_size = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    seq_len = int_arg("seq_len", seq_len, 1, U32_MAX, WriteError)
    shard_batches = int_arg("shard_batches", shard_batches, 1, U32_MAX // batch_size, WriteError)
    seed = int_arg("seed", seed, 0, U32_MAX, WriteError)
    path = check_dataset_output(directory, overwrite=overwrite, inputs=inputs)
    os.makedirs(path, exist_ok=True)
    cutter = _ShardCutter(records, seq_len)
    per_shard = shard_batches * batch_size
    shards: list[Shard] = []
    checksums: list[npt.NDArray[np.uint64]] = []
    first = 0
    try:
        while not cutter.empty():
            name = SHARD_PATTERN.format(len(shards))
            target = os.path.join(path, name)
            written = _Counted(cutter.run(per_shard))
            write_batch_dataset(
                target,
                written,
                total_records=None,
                batch_size=batch_size,
                seq_len=seq_len,
                seed=shard_seed(seed, len(shards)),
                overwrite=True,
                allow_empty=True,
            )
            with BatchFileReader(target) as reader:
                shards.append(describe_shard(reader, name, (first, first + written.count)))
                checksums.append(slot_checksums(reader))
            first += written.count
        if not allow_empty and sum(s.num_batches for s in shards) == 0:
            raise WriteError(
                f"{path}: the dataset would hold 0 batches: {first:,} "
                f"{'record is' if first == 1 else 'records are'} fewer than "
                f"batch_size={batch_size}; pass allow_empty=True (--allow-empty on the command "
                "line) to write it anyway"
            )
        listed = sources() if callable(sources) else sources
    except BaseException:
        for shard in shards:  # listed by no manifest: not left behind
            os.unlink(os.path.join(path, shard.name))
        raise
    manifest = commit_manifest(
        path, shards, checksums, batch_size, seq_len, seed, listed, overwrite
    )
    if overwrite:  # the earlier dataset's shards that the new manifest does not list
        kept = {s.name for s in shards}
        for name in shard_file_names(path):
            if name not in kept:
                os.unlink(os.path.join(path, name))
    return manifest


class _Counted(Iterator[npt.NDArray[np.integer]]):
    """Passes blocks through, counting their records."""

    def __init__(self, blocks: Iterator[npt.NDArray[np.integer]]) -> None:
        self._blocks, self.count = blocks, 0

    def __next__(self) -> npt.NDArray[np.integer]:
        block = next(self._blocks)
        self.count += block.shape[0]
        return block


__all__ = [
    "SHARD_NAME",
    "SHARD_PATTERN",
    "check_dataset_output",
    "commit_manifest",
    "create_dataset",
    "describe_shard",
    "shard_file_names",
    "write_sharded_dataset",
]
