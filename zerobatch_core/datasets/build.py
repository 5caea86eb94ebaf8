"""Building datasets: shard a stream of records, or describe LLMBATCH files already written.

``write_sharded_dataset`` cuts a record stream into consecutive ranges of ``shard_batches *
batch_size`` records and writes each range as one LLMBATCH file with the file writer (so every
shard is a file in its own right: shard ``i``'s records are input records ``[first, last)``,
permuted with the shard's seed by the file writer's rule). ``create_dataset`` describes files
that already exist. Both then write ``checksums.xxh3`` and, last, ``manifest.json``, each
atomically: a directory without a manifest is not a dataset, and a manifest never names a shard
that is missing or partial.

Every shard of a dataset has one token dtype (``SPEC.md`` section 12), recorded in the
manifest (``Manifest.dtype``): ``write_sharded_dataset`` writes every shard with its ``dtype``
(``"auto"``: uint16 while every shard's tokens fit it; a shard that needs uint32 makes the
shards before it be rewritten as uint32, from their own bytes, so the dataset is the one a
uint32 write would have given), and ``create_dataset`` refuses files of mixed dtypes.

``write_sharded_dataset`` owns the names ``shard-NNNNN.batch``, ``checksums.xxh3`` and
``manifest.json`` in its directory: it refuses a directory that holds a manifest or shards
unless ``overwrite=True`` (a manifest: an existing dataset; shards alone: an unfinished write),
replaces a checksums file no manifest refers to, and never writes over one of its ``inputs``.

Replacing a dataset (``overwrite=True`` on a directory with a manifest), by either function,
never touches the old dataset until the new one is whole: the new one is staged in a sibling
directory ``.NAME.zerobatch-new-RAND``, fsynced, and swapped with the old directory in one step
(``renameat2(RENAME_EXCHANGE)``), so the path holds the old dataset or the new one at every
instant, a kill or Ctrl-C included. The old directory's files that the new dataset does not
replace are carried over as hard links, so the directory holds exactly the new dataset plus
the user's other files (``write_sharded_dataset`` drops the old dataset's listed shards and
every ``shard-NNNNN.batch``; ``create_dataset`` only the old manifest and checksums). The
staging and the swap are ``replace.py``'s (shared with ``ingest/ray_convert.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_NAMES, DTYPE_UINT16, DTYPE_UINT32, U32_MAX, build_header
from zerobatch_spec.dataset import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    MANIFEST_VERSION_INDEXED,
    MANIFEST_VERSIONS,
    MAX_PREFIXES,
    SHARD_NAME_FORMAT,
    IndexRef,
    Manifest,
    Shard,
    Source,
    build_manifest,
    bytes_xxh3,
    header_xxh3,
    is_shard_name,
    parse_manifest,
    shard_file_name,
    shard_seed,
)
from zerobatch_spec.index import (
    INDEX_NAME,
    IndexedShard,
    IndexTop,
    build_index,
    iter_shards,
    parse_top,
)

from ..arguments import int_arg
from ..errors import WriteError
from ..files.reader import BatchFileReader
from ..files.writer import (
    DtypeArg,
    retype_batch_file,
    swept_once,
    token_dtype_code,
    write_batch_dataset,
    write_bytes_atomic,
)
from ..stores.regular_files import read_regular_file
from .dataset import slot_checksums
from .replace import StagedReplacement, check_replaceable, refuse_aside, remove_stale_staging

SHARD_PATTERN = SHARD_NAME_FORMAT
"""File names of the shards ``write_sharded_dataset`` writes (``SPEC.md`` section 12)."""

SHARD_NAME = re.compile(r"\A(?:[0-9a-f]{1,4}-)?shard-[0-9]{5,}\.batch\Z")
"""Matches every name ``SHARD_PATTERN`` gives (shard 100000 on has more digits), behind a key
prefix or not (``shard_file_name``)."""

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
    *,
    dtype: int = DTYPE_UINT32,
    manifest_version: int = MANIFEST_VERSION,
    prefixes: int = 1,
) -> Manifest:
    """Write the checksums, then (version 2) the shard index, then the manifest (last): the
    dataset exists from that moment.

    ``shards`` and their slot ``checksums`` in dataset order, every shard's tokens of dtype
    code ``dtype``; every source's record range must lie within the shards' input records.
    ``manifest_version`` 2 describes the shards in ``shards.zbi`` (``SPEC.md`` section 23)
    instead of the manifest; the manifest returned lists them either way. ``prefixes``
    (version 2) records that shard ``i`` is named ``shard_file_name(i, prefixes)``.
    """
    if manifest_version not in MANIFEST_VERSIONS:
        raise WriteError(f"{directory}: manifest_version must be 1 or 2, got {manifest_version!r}")
    prefixes = check_prefixes(directory, prefixes, manifest_version)
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
    manifest = Manifest(
        batch_size,
        seq_len,
        seed,
        tuple(shards),
        bytes_xxh3(data),
        tuple(sources),
        dtype=dtype,
    )
    if manifest_version == MANIFEST_VERSION_INDEXED:
        index = build_index(
            shards,
            data,
            batch_size=batch_size,
            seq_len=seq_len,
            dtype=dtype,
            seed=seed,
            prefixes=prefixes,
        )
        write_bytes_atomic(os.path.join(directory, INDEX_NAME), index, overwrite=True)
        top = parse_top(index, len(index))
        assert isinstance(top, IndexTop)
        manifest = replace(
            manifest,
            version=MANIFEST_VERSION_INDEXED,
            index=IndexRef(INDEX_NAME, len(index), top.xxh3),
            shard_count=len(shards),
            declared_batches=sum(s.num_batches for s in shards),
            prefixes=prefixes,
        )
    write_bytes_atomic(
        os.path.join(directory, MANIFEST_NAME), build_manifest(manifest), overwrite=overwrite
    )
    return manifest


def check_prefixes(directory: PathLike, prefixes: object, manifest_version: int) -> int:
    """``prefixes`` as an int, checked: 1 to ``MAX_PREFIXES``, and above 1 only for a version
    2 manifest (a version 1 manifest lists names and records no prefixes)."""
    count = int_arg("prefixes", prefixes, 1, MAX_PREFIXES, WriteError)
    if count > 1 and manifest_version != MANIFEST_VERSION_INDEXED:
        raise WriteError(
            f"{os.fspath(directory)}: prefixes={count} needs manifest_version=2 (a version 1 "
            "manifest records no key prefixes)"
        )
    return count


def _check_directory(directory: str | os.PathLike[str], overwrite: bool) -> str:
    path = os.fspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise WriteError(f"{path}: exists and is not a directory (a dataset is a directory)")
    refuse_aside(path)
    os.makedirs(path, exist_ok=True)
    if _is_dataset(path):
        if not overwrite:
            raise WriteError(
                f"{path}: already a dataset (it has a {MANIFEST_NAME}); pass overwrite=True "
                "(--overwrite on the command line) to replace it"
            )
        check_replaceable(path, _metadata_only)
    return path


_METADATA = (MANIFEST_NAME, CHECKSUMS_NAME, INDEX_NAME)


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
    (``shard-NNNNN.batch``) without a manifest, unless ``overwrite``; a dataset that cannot be
    replaced whole (a mount point, or one holding a subdirectory or another entry that is not
    a regular file or symbolic link: see ``write_sharded_dataset``); a dataset an interrupted
    overwrite moved aside (``replace.ASIDE_TAG``); and, always, an input that is one of
    the files the write would replace (a shard, the checksums or the manifest).
    """
    path = os.fspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise WriteError(f"{path}: output path exists and is not a directory (a dataset is one)")
    refuse_aside(path)
    if os.path.isdir(path):
        real = os.path.realpath(path)
        for item in inputs:
            name = os.fspath(item)
            where, base = os.path.split(os.path.realpath(name))
            if where == real and (SHARD_NAME.match(base) or base in _METADATA):
                raise WriteError(
                    f"{name}: input file would be replaced by the dataset written into {path}"
                )
        if _is_dataset(path):
            if not overwrite:
                raise WriteError(
                    f"{path}: already a dataset (it has a {MANIFEST_NAME}); pass overwrite=True "
                    "(--overwrite on the command line) to replace it"
                )
            check_replaceable(path, sharded_writer_drops(path))
        leftovers = shard_file_names(path)
        if leftovers and not overwrite:
            raise WriteError(
                f"{path}: holds shard files ({leftovers[0]}, ...) but no {MANIFEST_NAME}, left "
                "by an unfinished write; pass overwrite=True (--overwrite on the command line) "
                "to replace them"
            )
    return path


def dataset_shard_names(directory: PathLike, names: Sequence[str] | None = None) -> list[str]:
    """The shard names ``create_dataset`` would list for ``directory``, checked.

    ``names`` default to every ``*.batch`` entry of the directory, sorted. Refused with one
    ``WriteError`` naming every bad name: a name the manifest's name rule rejects (``SPEC.md``
    section 12.2: 1 to 255 ASCII letters, digits, ``.``, ``_`` or ``-``, not ``.`` or ``..``,
    so no space, path separator, backslash, control or non-ASCII character), a dataset
    metadata name (``manifest.json``, ``checksums.xxh3``), and a name given twice; or no name
    at all. Nothing is written.
    """
    path = os.fspath(directory)
    if names is None:
        names = sorted(n for n in os.listdir(path) if n.endswith(".batch"))
    if not names:
        raise WriteError(f"{path}: no LLMBATCH files to describe (*.batch)")
    bad: list[str] = []
    seen: set[str] = set()
    for name in names:
        if not is_shard_name(name):
            bad.append(f"{name!r} (not {SHARD_NAME_RULE})")
        elif name in _METADATA:
            bad.append(f"{name!r} (the dataset's own metadata file)")
        elif name in seen:
            bad.append(f"{name!r} (given twice)")
        seen.add(name)
    if bad:
        raise WriteError(
            f"{path}: {len(bad)} shard {'name breaks' if len(bad) == 1 else 'names break'} the "
            f"manifest's name rule (SPEC.md 12.2): {', '.join(bad[:10])}"
            + (f", and {len(bad) - 10} more" if len(bad) > 10 else "")
            + "; rename the files (nothing was written)"
        )
    return list(names)


SHARD_NAME_RULE = "1 to 255 ASCII letters, digits, '.', '_' or '-', and neither '.' nor '..'"
"""The manifest's shard name rule in words (``SPEC.md`` section 12.2)."""


def create_dataset(
    directory: str | os.PathLike[str],
    names: Sequence[str] | None = None,
    *,
    seed: int | None = None,
    sources: Sequence[Source] = (),
    overwrite: bool = False,
    manifest_version: int = MANIFEST_VERSION,
) -> Manifest:
    """Describe LLMBATCH files in ``directory`` as a dataset: checksums, then the manifest.

    ``names`` are the shard file names in dataset order (default: every ``*.batch`` file in
    the directory, sorted), checked by ``dataset_shard_names`` before anything is written.
    They must share ``batch_size``, ``seq_len`` and the token dtype (which the manifest
    records). ``seed`` is the dataset's default order
    seed (default: the first shard's header seed). Every slot is read once to checksum it.
    ``manifest_version`` 2 lists the shards in a shard index (``commit_manifest``).

    Replacing a dataset (``overwrite``, a directory with a manifest) never changes the old one
    until the new one is whole: the new manifest and checksums are written into a staging
    directory beside it that holds hard links to every other file of the directory (the
    shards, listed or not, and any other file: they are the user's), and the two directories
    are then swapped in one step (see ``write_sharded_dataset``). An interruption or an error
    before the swap leaves the old dataset exactly as it was.
    """
    path = _check_directory(directory, overwrite)
    remove_stale_staging(path)
    names = dataset_shard_names(path, names)
    if not (overwrite and _is_dataset(path)):
        return _describe(path, path, names, seed, sources, overwrite, manifest_version)
    stage = StagedReplacement(path, _metadata_only)
    try:
        stage.carry()  # the shards as hard links: the manifest describes these very files
        manifest = _describe(path, stage.path, names, seed, sources, False, manifest_version)
        stage.commit()
    except BaseException:
        stage.discard()
        raise
    return manifest


def _describe(
    path: str,
    out: str,
    names: Sequence[str],
    seed: int | None,
    sources: Sequence[Source],
    overwrite: bool,
    manifest_version: int = MANIFEST_VERSION,
) -> Manifest:
    """``create_dataset``'s work: read the shards ``names`` in ``out`` and commit their
    manifest there (errors name ``path``, the dataset's own path)."""
    shards: list[Shard] = []
    checksums: list[npt.NDArray[np.uint64]] = []
    shape: tuple[int, int] | None = None
    dtype = DTYPE_UINT32
    for name in names:
        with BatchFileReader(os.path.join(path, name)) as reader:
            if out != path and not os.path.samefile(
                os.path.join(path, name), os.path.join(out, name)
            ):
                raise WriteError(f"{path}: {name} was replaced while the dataset was written")
            if shape is None:
                shape, dtype = (reader.batch_size, reader.seq_len), reader.dtype
            elif reader.dtype != dtype:
                raise WriteError(
                    f"{path}: {name} holds {DTYPE_NAMES[reader.dtype]} tokens; the first shard, "
                    f"{names[0]}, holds {DTYPE_NAMES[dtype]}: a dataset's shards share one dtype "
                    "(rewrite one of them with zerobatch_core.files.writer.retype_batch_file)"
                )
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
    return commit_manifest(
        out,
        shards,
        checksums,
        *shape,
        first_seed,
        sources,
        overwrite,
        dtype=dtype,
        manifest_version=manifest_version,
    )


def _old_dataset_names(path: str) -> frozenset[str]:
    """The files of the dataset in ``path`` that its replacement drops: its manifest, its
    checksums, the shards its manifest lists (when it parses), and the sharded writer's
    ``shard-NNNNN.batch`` names."""
    names = set(_METADATA)
    data = b""
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(path, MANIFEST_NAME), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):  # never wait on a FIFO
                with os.fdopen(os.dup(fd), "rb") as f:
                    data = f.read(_OLD_MANIFEST_LIMIT + 1)
        finally:
            os.close(fd)
    if data and len(data) <= _OLD_MANIFEST_LIMIT:
        parsed = parse_manifest(data)
        if isinstance(parsed, Manifest):
            names.update(s.name for s in parsed.shards)
            if parsed.index is not None:  # version 2: the shards its index lists
                names.add(parsed.index.name)
                names.update(_indexed_names(os.path.join(path, parsed.index.name)))
    return frozenset(names)


def _indexed_names(path: str) -> list[str]:
    """The shard names of a version 2 index file, as far as it reads and checks (a broken
    index gives the names before its first broken page: the rest are kept as the user's)."""
    try:
        data = read_regular_file(path, _OLD_MANIFEST_LIMIT)
    except OSError:
        return []
    top = parse_top(data, len(data))
    if not isinstance(top, IndexTop):
        return []
    names = []
    for entry in iter_shards(top, data):
        if not isinstance(entry, IndexedShard):
            break
        names.append(entry.shard.name)
    return names


_OLD_MANIFEST_LIMIT = 256 * 2**20
"""Largest old manifest read to learn which files its replacement drops (larger: only the
sharded writer's own names are dropped)."""


def _is_dataset(path: str) -> bool:
    return os.path.lexists(os.path.join(path, MANIFEST_NAME))


def _metadata_only(name: str) -> bool:
    """What ``create_dataset`` drops of the dataset it replaces: its manifest and checksums
    (every other file is the user's, listed or not)."""
    return name in _METADATA


def sharded_writer_drops(path: str) -> Callable[[str], bool]:
    """What ``write_sharded_dataset`` drops of the dataset in ``path`` when it replaces it:
    the old dataset's own files (``_old_dataset_names``) and every ``shard-NNNNN.batch``."""
    old = _old_dataset_names(path)
    return lambda name: name in old or SHARD_NAME.match(name) is not None


class _ShardCutter:
    """Cuts a stream of ``[k, seq_len]`` record blocks into consecutive runs of ``n`` records."""

    def __init__(self, blocks: Iterable[npt.NDArray[np.integer]], seq_len: int) -> None:
        self._blocks = iter(blocks)
        self._pending: list[npt.NDArray[np.integer]] = []
        self.seq_len = seq_len

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
    dtype: DtypeArg = "uint32",
    manifest_version: int = MANIFEST_VERSION,
    prefixes: int = 1,
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
    anything fails before the manifest is written (a source error, an interruption, a token
    the dtype cannot hold), the shards and checksums file this call wrote are removed.

    Every shard stores its tokens as ``dtype`` (``write_batch_file`` takes the same values),
    recorded in the manifest. With ``"auto"`` each shard is written as the file writer's
    ``"auto"`` writes it while the shards so far are uint16; the first shard that needs
    uint32 makes every shard before it be rewritten as uint32 (``retype_batch_file``: a read
    of the shards written, never of the stream again) and the rest be written as uint32, so
    the result is always byte for byte the dataset that the chosen dtype, given up front,
    would have written.

    ``prefixes`` above 1 (with ``manifest_version=2``) spreads the shards' names over that
    many key prefixes, recorded in the manifest: shard ``i`` is ``shard_file_name(i,
    prefixes)`` (``3-shard-00003.batch`` of 16), so that a job reading the dataset from an
    object store divides its request rate among them (stores limit requests per prefix).

    Replacing a dataset (``overwrite``, a directory with a manifest) is atomic: the new
    dataset is written whole into a staging directory beside the old one
    (``.NAME.zerobatch-new-RAND``, same parent, hence same file system), fsynced, and the two
    directories are swapped in one step (Linux ``renameat2(RENAME_EXCHANGE)``); the old one is
    then removed. At every instant, a kill included, ``directory`` holds the whole old dataset
    or the whole new one; an error or an interruption before the swap removes the staging
    directory and leaves the old dataset as it was. The old directory's other files are
    carried over (regular files as hard links, symbolic links recreated); dropped are only
    the old dataset's manifest, checksums and listed shards, and every ``shard-NNNNN.batch``.
    A directory holding anything else (a subdirectory, a FIFO) is refused, naming it. Where
    the system cannot swap in one step, two renames are used: between them ``directory`` is
    missing and the old dataset lies whole at ``.NAME.zerobatch-old-RAND`` beside it, which
    later writes refuse to overlook (``check_dataset_output``). The next write removes staging
    directories left by killed writers (``remove_stale_staging``).
    """
    batch_size = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    seq_len = int_arg("seq_len", seq_len, 1, U32_MAX, WriteError)
    shard_batches = int_arg("shard_batches", shard_batches, 1, U32_MAX // batch_size, WriteError)
    seed = int_arg("seed", seed, 0, U32_MAX, WriteError)
    code = token_dtype_code(dtype, auto=True)
    prefixes = check_prefixes(directory, prefixes, manifest_version)
    path = check_dataset_output(directory, overwrite=overwrite, inputs=inputs)
    remove_stale_staging(path)
    os.makedirs(path, exist_ok=True)
    stage = (
        StagedReplacement(path, sharded_writer_drops(path))
        if overwrite and _is_dataset(path)
        else None
    )
    out = path if stage is None else stage.path
    cutter = _ShardCutter(records, seq_len)
    per_shard = shard_batches * batch_size
    shards: list[Shard] = []
    checksums: list[npt.NDArray[np.uint64]] = []
    first = 0
    chosen = DTYPE_UINT16 if code is None else code  # the dtype of every shard so far
    with swept_once(out):  # stale temporaries removed once, not at each shard's write
        try:
            while not cutter.empty():
                name = shard_file_name(len(shards), prefixes)
                target = os.path.join(out, name)
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
                    dtype="auto" if code is None and chosen == DTYPE_UINT16 else chosen,
                )
                with BatchFileReader(target) as reader:
                    if reader.dtype != chosen:  # "auto": this shard needs uint32, so do the others
                        chosen = reader.dtype
                        _retype_shards(out, shards, checksums, chosen)
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
            manifest = commit_manifest(
                out,  # the staging directory, or the dataset's own where nothing is staged
                shards,
                checksums,
                batch_size,
                seq_len,
                seed,
                listed,
                overwrite and stage is None,
                dtype=chosen,
                manifest_version=manifest_version,
                prefixes=prefixes,
            )
            if stage is not None:
                stage.commit()
                return manifest
        except BaseException:
            if stage is not None:
                stage.discard()
            elif not os.path.lexists(os.path.join(path, MANIFEST_NAME)):
                # No dataset was there (else it would be staged) and none was committed: the
                # shards and checksums this call wrote are listed by no manifest.
                for name in [*(s.name for s in shards), CHECKSUMS_NAME, INDEX_NAME]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(path, name))
            raise
    if overwrite:  # shards an unfinished write left (there was no manifest)
        kept = {s.name for s in shards}
        for name in shard_file_names(path):
            if name not in kept:
                os.unlink(os.path.join(path, name))
    return manifest


def _retype_shards(
    directory: str, shards: list[Shard], checksums: list[npt.NDArray[np.uint64]], dtype: int
) -> None:
    """Rewrite the shards written so far with tokens of dtype code ``dtype``, in place, and
    their manifest entries and slot checksums with them (``write_sharded_dataset``'s
    ``"auto"``)."""
    for i, shard in enumerate(shards):
        target = os.path.join(directory, shard.name)
        retype_batch_file(target, target, dtype, overwrite=True)
        with BatchFileReader(target) as reader:
            shards[i] = describe_shard(reader, shard.name, shard.records)
            checksums[i] = slot_checksums(reader)


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
    "SHARD_NAME_RULE",
    "SHARD_PATTERN",
    "check_dataset_output",
    "check_prefixes",
    "commit_manifest",
    "create_dataset",
    "dataset_shard_names",
    "describe_shard",
    "shard_file_names",
    "sharded_writer_drops",
    "write_sharded_dataset",
]
