"""Provenance: what one training step reads, and which input record each of its rows came from.

A step of ``BatchNativeLoader`` is a global batch of ``global_batch_size`` samples taken in order
from the epoch's sequence of stored batches; a DP rank reads its own samples of it, a CP rank its
token columns of them (``slicing.py``). ``trace_step`` answers, for the same order and slicing
parameters as the loader (and the same defaults), which stored batches the step's samples lie
in, which rows and columns of each the rank reads, and for every row where it came from:

1. Stored batch ``index`` of the dataset is slot ``local`` of shard ``s`` (``locate``).
2. Row ``r`` of that slot is record position ``p = local * batch_size + r`` of the shard. The file
   writer placed there the shard's input record ``permute(p, total_records, seed, 1)``
   (``zerobatch_spec.record_source`` with the shard's header seed and ``total_records``, both in
   the manifest).
3. The shard was written from the dataset's input records ``records = [first, last)`` (manifest),
   so the row is input record ``first + permute(...)``.
4. The manifest's ``sources`` say which input file gave which range of input records; the row is
   record ``record - source.first`` of that file, in the order its reader cuts records (for a
   nanoGPT shard cut contiguously, tokens ``[k * seq_len, (k + 1) * seq_len)`` of the file).

A single LLMBATCH file has steps 1-2 only (its input records are the writer's input, with no file
behind them); a dataset described by ``create_dataset`` has no ``records`` or ``sources`` and
stops at step 2 as well. Nothing here reads a token: the manifest (or the header) is enough.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from zerobatch_spec import record_source
from zerobatch_spec.dataset import Source
from zerobatch_spec.live import DESCRIPTOR_NAME

from ..arguments import int_arg
from ..datasets.dataset import DatasetReader, open_source
from ..errors import ZeroBatchError
from ..files.reader import BatchFileReader
from ..live.production import (
    PADDING,
    BatchesRecord,
    ProducerRecord,
    ProductionError,
    batches_key,
    read_batches,
    read_record,
)
from ..live.source import LiveSource
from ..stores.resolve import open_store
from ..stores.store import is_url
from .loader import DEFAULT_BLOCK_SIZE, BatchNativeLoader, Position
from .mixture import Mixture
from .mixture_loader import MixtureLike, MixtureLoader, is_mixture, open_mixture
from .sources import is_live

DEFAULT_MAX_ROWS = 1 << 16
"""Rows a trace accounts for at most by default: each costs one permutation evaluation and one
line of output, and a manifest's ``batch_size`` (up to ``2**32 - 1``) is only a claim."""


class TraceError(ZeroBatchError, ValueError):
    """A trace that would account for more rows than asked for (``max_rows``)."""


@dataclass(frozen=True)
class RowOrigin:
    """Where one row of a stored batch came from.

    ``shard_record`` is the row's index among the records its shard (or file) was written from;
    ``record`` its index among the dataset's input records, and ``file`` / ``file_record`` the
    input file and the record's index in it (``None`` where the manifest does not say).
    """

    row: int
    shard_record: int
    record: int | None
    file: str | None
    file_record: int | None
    produced: ProducedRow | None = None
    """For a live dataset's row written by ``produce``: its document, token and epoch."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {
            "row": self.row,
            "shard_record": self.shard_record,
            "record": self.record,
            "file": self.file,
            "file_record": self.file_record,
        }
        if self.produced is not None:
            out["produced"] = self.produced.as_dict()
        return out


@dataclass(frozen=True)
class ProducedRow:
    """Where a row that ``produce`` committed begins: epoch ``epoch`` of its producer's share,
    unit ``unit`` (``part``: the parquet row group, ``-1`` for a whole file), document
    ``document`` of the unit, token ``token`` of that document's ``[bos, *doc]`` sequence.
    ``padding`` rows hold padding only (and no document)."""

    padding: bool
    epoch: int
    unit: int
    part: int
    document: int
    token: int
    record: int | None = None
    """For a token file (nanoGPT shard, ``.npy`` array): the record of the file it is."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def describe(self, file: str | None) -> str:
        if self.padding:
            return "padding"
        if self.record is not None:
            return f"{file} record {self.record} (epoch {self.epoch}, unit {self.unit})"
        part = f" row group {self.part}" if self.part >= 0 else ""
        return (
            f"{file}{part} document {self.document} from token {self.token} (epoch "
            f"{self.epoch}, unit {self.unit})"
        )


@dataclass(frozen=True)
class TracePiece:
    """The rows ``[rows[0], rows[1])`` of one stored batch that a step gives this rank.

    ``shard`` is the shard's file name (``None`` for a single file), ``slot`` the stored batch
    within the shard (or file), ``dataset_slot`` its index in the dataset.
    """

    shard: str | None
    shard_index: int
    slot: int
    dataset_slot: int
    rows: tuple[int, int]
    origins: tuple[RowOrigin, ...]
    producer: str | None = None
    """For a live dataset: the producer of the batch object (``shard``) ..."""
    offset: int | None = None
    """... and the stored batch's offset in that producer's stream."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {
            "shard": self.shard,
            "shard_index": self.shard_index,
            "slot": self.slot,
            "dataset_slot": self.dataset_slot,
            "rows": list(self.rows),
            "origins": [o.as_dict() for o in self.origins],
        }
        if self.producer is not None:
            out["producer"] = self.producer
            out["offset"] = self.offset
        return out


@dataclass(frozen=True)
class StepTrace:
    """What one rank reads at one step, piece by piece, in the order the loader serves it.

    The rank's item is the pieces' rows stacked in order, restricted to ``columns`` (token
    ranges ``[lo, hi)`` of each record, concatenated in order; with ``next_token`` each range
    is read one token further, for the labels).
    """

    path: str
    epoch: int
    step: int
    steps_per_epoch: int
    global_batch_size: int
    block_size: int
    seed: int
    shuffle: bool
    rank: int
    world_size: int
    context_rank: int
    context_size: int
    zigzag: bool
    next_token: bool
    columns: tuple[tuple[int, int], ...]
    pieces: tuple[TracePiece, ...]
    dtype: str = "uint32"
    """The stored tokens' dtype (``uint32``, or ``uint16`` for a dtype 1 file or dataset)."""
    component: MixtureStep | None = None
    """For a mixture: the component serving the step, and the step of its own that it is
    (``path`` to ``pieces`` then describe that component's step)."""

    @property
    def global_step(self) -> int:
        """``epoch * steps_per_epoch + step``: the numbering ``skip_steps`` uses."""
        if self.component is not None:
            return self.component.global_step
        return self.epoch * self.steps_per_epoch + self.step

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form printed by ``zerobatch trace --json``."""
        return {
            "path": self.path,
            "epoch": self.epoch,
            "step": self.step,
            "global_step": self.global_step,
            "steps_per_epoch": self.steps_per_epoch,
            "global_batch_size": self.global_batch_size,
            "block_size": self.block_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "rank": self.rank,
            "world_size": self.world_size,
            "context_rank": self.context_rank,
            "context_size": self.context_size,
            "zigzag": self.zigzag,
            "next_token": self.next_token,
            "columns": [list(c) for c in self.columns],
            "dtype": self.dtype,
            "pieces": [p.as_dict() for p in self.pieces],
            "mixture": None if self.component is None else self.component.as_dict(),
        }

    def lines(self) -> list[str]:
        """A human-readable account: the step, then each piece and each row's origin."""
        order = f"block_size {self.block_size}, seed {self.seed}, " + (
            "shuffled" if self.shuffle else "storage order"
        )
        if any(p.producer is not None for p in self.pieces):
            order = "commit order (a live dataset's order is its producers')"
        cols = ", ".join(f"[{lo}, {hi})" for lo, hi in self.columns)
        out = [] if self.component is None else self.component.lines()
        out += [
            f"{self.path}: epoch {self.epoch}, step {self.step} of {self.steps_per_epoch} "
            f"(global step {self.epoch * self.steps_per_epoch + self.step}), "
            f"global batch {self.global_batch_size} of {self.dtype} tokens",
            f"  order: {order}",
            f"  rank {self.rank} of {self.world_size}, context rank {self.context_rank} of "
            f"{self.context_size}{' (zig-zag)' if self.zigzag else ''}: token columns {cols}"
            f"{' (+1 for labels)' if self.next_token else ''}",
        ]
        for p in self.pieces:
            where = f"{p.shard} slot {p.slot}" if p.shard is not None else f"slot {p.slot}"
            if p.producer is not None:
                out.append(
                    f"  global batch {p.dataset_slot}: {where}, producer {p.producer} offset "
                    f"{p.offset}, rows [{p.rows[0]}, {p.rows[1]}):"
                )
                for o in p.origins:
                    origin = (
                        "no production record"
                        if o.produced is None
                        else (o.produced.describe(o.file))
                    )
                    out.append(f"    row {o.row}: {origin}")
                continue
            out.append(
                f"  {where} (dataset slot {p.dataset_slot}), rows [{p.rows[0]}, {p.rows[1]}):"
            )
            for o in p.origins:
                line = f"    row {o.row}: shard record {o.shard_record}"
                if o.record is not None:
                    line += f" = input record {o.record}"
                if o.file is not None:
                    line += f" = {o.file} record {o.file_record}"
                out.append(line)
        return out


@dataclass(frozen=True)
class MixtureStep:
    """A mixture's step: which component serves it, and where that component stands."""

    path: str
    epoch: int
    step: int
    global_step: int
    name: str
    index: int
    component_epoch: int
    component_step: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "epoch": self.epoch,
            "step": self.step,
            "global_step": self.global_step,
            "component": self.name,
            "component_index": self.index,
            "component_epoch": self.component_epoch,
            "component_step": self.component_step,
        }

    def lines(self) -> list[str]:
        return [
            f"{self.path}: epoch {self.epoch}, step {self.step} (global step "
            f"{self.global_step}) serves component {self.name!r}: its epoch "
            f"{self.component_epoch}, step {self.component_step}"
        ]


class _Sources:
    """The manifest's sources, searchable by input record."""

    def __init__(self, sources: Sequence[Source]) -> None:
        kept = sorted((s for s in sources if s.records[1] > s.records[0]), key=lambda s: s.records)
        self._firsts = [s.records[0] for s in kept]
        self._sources = kept

    def find(self, record: int) -> tuple[str | None, int | None]:
        """``(file, record index in it)`` of dataset input record ``record``."""
        i = bisect.bisect_right(self._firsts, record) - 1
        if i < 0 or record >= self._sources[i].records[1]:
            return None, None
        return self._sources[i].path, record - self._sources[i].records[0]


def _is_live(source: object) -> bool:
    """Whether ``source`` names a live dataset: a local one, or one at a URL."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    if is_url(source):
        store = open_store(os.fspath(source))
        try:
            return store.exists(DESCRIPTOR_NAME)
        finally:
            store.close()
    return is_live(source)


class _LiveOrigins:
    """A live dataset's committed entries and production records, for the rows of a trace."""

    def __init__(self, source: LiveSource, last: int) -> None:
        source.refresh()
        if last >= source.committed:
            raise IndexError(
                f"{source.path}: the step reads global batch {last}, and {source.committed} "
                "are committed: trace a step that has been committed"
            )
        self.source = source
        self.entries = source.chain.entries(source.current, source.start)
        self.firsts = [e.first for e in self.entries]
        self.records: dict[str, ProducerRecord | None] = {}
        self.objects: dict[tuple[str, int], BatchesRecord | None] = {}

    def piece(self, index: int, rows: range) -> TracePiece:
        """The rows ``rows`` of global batch ``index``: its object, producer, offset, and each
        row's document where ``produce`` recorded it."""
        k = bisect.bisect_right(self.firsts, index) - 1
        if k < 0 or index >= self.entries[k].end:
            raise IndexError(f"{self.source.path}: global batch {index} was reclaimed")
        e = self.entries[k]
        slot = index - e.first
        record = self._record(e.producer)
        batches = self._object(e.producer, e.offset + e.num_batches)
        b = self.source.batch_size
        origins = []
        for r in rows:
            produced, file = None, None
            if record is not None and batches is not None:
                epoch, unit, document, token = (int(v) for v in batches.rows[slot * b + r])
                if epoch == PADDING:
                    produced = ProducedRow(True, -1, -1, -1, -1, -1)
                else:
                    entry, part = record.locate(unit)
                    file = entry.path
                    number = None
                    if record.unit_records:
                        number = part * record.unit_records + document
                    produced = ProducedRow(False, epoch, unit, part, document, token, number)
            origins.append(RowOrigin(r, slot * b + r, None, file, None, produced))
        return TracePiece(
            e.name,
            k,
            slot,
            index,
            (rows.start, rows.stop),
            tuple(origins),
            e.producer,
            e.offset + slot,
        )

    def _record(self, producer: str) -> ProducerRecord | None:
        if producer not in self.records:
            self.records[producer] = read_record(self.source.store, producer)
        return self.records[producer]

    def _object(self, producer: str, end: int) -> BatchesRecord | None:
        key = (producer, end)
        if key not in self.objects:
            found = read_batches(self.source.store, producer, end, self.source.batch_size)
            if found is not None and found.first + len(found.rows) // self.source.batch_size != end:
                raise ProductionError(
                    f"{self.source.store.where(batches_key(producer, end))}: its rows do not "
                    f"cover offsets [{found.first}, {end})"
                )
            self.objects[key] = found
        return self.objects[key]


def _origins(
    source: BatchFileReader | DatasetReader, sources: _Sources, index: int, rows: range
) -> tuple[str | None, int, int, tuple[RowOrigin, ...]]:
    """``(shard name, shard number, slot in shard, origins of rows)`` of stored batch ``index``."""
    b = source.batch_size
    if isinstance(source, BatchFileReader):
        h = source.header
        origins = tuple(
            RowOrigin(r, n, n, None, None)
            for r in rows
            for n in [record_source(index * b + r, h.total_records, h.seed)]
        )
        return None, 0, index, origins
    shard_index, local = source.locate(index)
    shard = source.manifest.shards[shard_index]
    found = []
    for r in rows:
        n = record_source(local * b + r, shard.total_records, shard.seed)
        record = None if shard.records is None else shard.records[0] + n
        file, file_record = (None, None) if record is None else sources.find(record)
        found.append(RowOrigin(r, n, record, file, file_record))
    return shard.name, shard_index, local, tuple(found)


def trace_step(
    source: str | os.PathLike[str] | BatchFileReader | DatasetReader | LiveSource | Mixture,
    step: int,
    *,
    epoch: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int | None = None,
    shuffle: bool = True,
    global_batch_size: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    context_rank: int = 0,
    context_size: int = 1,
    zigzag: bool = False,
    next_token: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> StepTrace:
    """What ``BatchNativeLoader(source, ...)`` with these parameters serves at ``(epoch, step)``.

    The parameters, and their defaults, are the loader's; ``step`` counts steps within the
    epoch, as the loader's cursor does (``skip_steps`` skip steps without renumbering the
    others, so a skipped step's trace is what it would have read). Arguments the loader
    refuses (a world size that does not divide the global batch, ...) raise the loader's
    ``ValueError``, and a step outside the epoch an ``IndexError``. A step whose share for
    this rank holds more than ``max_rows`` rows raises ``TraceError`` before any row is traced
    (the work and the output grow with the rows).

    >>> trace = trace_step("data/", step=3, rank=1, world_size=2)  # doctest: +SKIP
    >>> [(p.shard, p.slot, p.rows) for p in trace.pieces]  # doctest: +SKIP
    [('shard-00004.batch', 17, (16, 32))]
    """
    if isinstance(source, Mixture) or is_mixture(source):
        return _trace_mixture(
            source,
            step,
            epoch=epoch,
            block_size=block_size,
            seed=seed,
            shuffle=shuffle,
            global_batch_size=global_batch_size,
            rank=rank,
            world_size=world_size,
            context_rank=context_rank,
            context_size=context_size,
            zigzag=zigzag,
            next_token=next_token,
            max_rows=max_rows,
        )
    reader: BatchFileReader | DatasetReader | LiveSource
    if isinstance(source, (BatchFileReader, DatasetReader, LiveSource)):
        reader, opened = source, False
    elif _is_live(source):  # a live dataset: its manifest chain and production records
        reader, opened = LiveSource(os.fspath(source), verify="off"), True
    else:  # nothing is read but the manifest (or the header): no checksum to verify
        reader, opened = open_source(source, verify="off"), True
    try:
        loader = BatchNativeLoader(
            reader,
            block_size=block_size,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            next_token=next_token,
            rank=rank,
            world_size=world_size,
            context_rank=context_rank,
            context_size=context_size,
            zigzag=zigzag,
            global_batch_size=global_batch_size,
        )
        steps = loader.steps_per_epoch
        step = int_arg("step", step, 0)
        max_rows = int_arg("max_rows", max_rows, 1)
        if loader.per_step > max_rows:
            raise TraceError(
                f"{reader.path}: a step gives rank {loader.slicing.dp_rank} "
                f"{loader.per_step} rows (global batch size {loader.global_batch_size} over "
                f"world size {loader.slicing.dp_size}), more than the {max_rows} a trace "
                f"accounts for: trace one rank of a larger world size"
            )
        if step >= steps:
            raise IndexError(
                f"{reader.path}: step must be in [0, {steps}), the epoch's steps at global "
                f"batch size {loader.global_batch_size}; got {step}"
            )
        b, g = reader.batch_size, loader.global_batch_size
        # The rank's samples of the step, in the epoch's sequence of samples (slicing.py).
        first = step * g + loader.rows.start
        end = first + loader.per_step
        p0, p1 = first // b, (end - 1) // b
        indices = islice(loader.order.indices(loader.epoch, p0), p1 - p0 + 1)
        sources = _Sources(reader.manifest.sources if isinstance(reader, DatasetReader) else ())
        live = _LiveOrigins(reader, p1) if isinstance(reader, LiveSource) else None
        pieces = []
        for p, index in enumerate(indices, start=p0):
            rows = range(max(first, p * b) - p * b, min(end, (p + 1) * b) - p * b)
            if live is not None:
                pieces.append(live.piece(index, rows))
                continue
            assert not isinstance(reader, LiveSource)
            name, shard_index, slot, origins = _origins(reader, sources, index, rows)
            pieces.append(
                TracePiece(name, shard_index, slot, index, (rows.start, rows.stop), origins)
            )
        return StepTrace(
            path=reader.path,
            epoch=loader.epoch,
            step=step,
            steps_per_epoch=steps,
            global_batch_size=g,
            block_size=loader.block_size,
            seed=loader.seed,
            shuffle=loader.shuffle,
            rank=loader.slicing.dp_rank,
            world_size=loader.slicing.dp_size,
            context_rank=loader.slicing.cp_rank,
            context_size=loader.slicing.cp_size,
            zigzag=loader.slicing.zigzag,
            next_token=loader.next_token,
            columns=tuple(loader.columns),
            pieces=tuple(pieces),
            dtype=loader.token_dtype.name,
        )
    finally:
        if opened:
            reader.close()


def _trace_mixture(
    source: MixtureLike, step: int, *, epoch: int, global_batch_size: int | None, **kw: Any
) -> StepTrace:
    """A mixture's step: its component (section 21), then that component's own step traced."""
    mixture, owned = open_mixture(source, global_batch_size=global_batch_size, seed=kw["seed"])
    try:
        loader = MixtureLoader(
            mixture,
            dtype="uint32",  # no token is read: components open only as the trace needs them
            epoch=epoch,
            block_size=kw["block_size"],
            seed=kw["seed"],
            shuffle=kw["shuffle"],
            rank=kw["rank"],
            world_size=kw["world_size"],
            context_rank=kw["context_rank"],
            context_size=kw["context_size"],
            zigzag=kw["zigzag"],
            next_token=kw["next_token"],
        )
        step = int_arg("step", step, 0)
        if step >= loader.steps_per_epoch:
            raise IndexError(
                f"{mixture.path}: step must be in [0, {loader.steps_per_epoch}), the mixture's "
                f"steps per epoch; got {step}"
            )
        g = loader.global_step(Position(loader.epoch, step))
        index, (component_epoch, sample) = mixture.at(g)
        opened = mixture.component(index)
        component_step = sample // mixture.global_batch_size
        name = mixture.mixture.names[index]
        if not isinstance(opened, (BatchFileReader, DatasetReader)):
            raise TraceError(
                f"{mixture.path}: step {step} of epoch {loader.epoch} serves component {name!r}, "
                f"its epoch {component_epoch}, step {component_step}; {opened.path} is not a "
                "local file or dataset, which a trace reads"
            )
        trace = trace_step(
            opened,
            component_step,
            epoch=component_epoch,
            global_batch_size=mixture.global_batch_size,
            **{**kw, "seed": mixture.component_seed},
        )
        where = MixtureStep(
            mixture.path,
            loader.epoch,
            step,
            g,
            name,
            index,
            component_epoch,
            component_step,
        )
        return replace(trace, component=where)
    finally:
        if owned:
            mixture.close()


__all__ = [
    "MixtureStep",
    "ProducedRow",
    "RowOrigin",
    "StepTrace",
    "TraceError",
    "TracePiece",
    "trace_step",
]
