"""``produce``: tokenize a share of a text corpus into a live dataset while trainers read it.

nanochat tokenizes its parquet shards inside the training job, each rank taking every N-th row
group; BatchWeave moves that work to producers on other machines that append global batches
to a versioned manifest. ``produce`` is the second shape built from the first's parts: producer
``index`` of ``producers`` reads its share of the input units (``units.py``: a parquet row
group, a JSONL or text file; units ``index, index + producers, ...``), tokenizes and packs them
as ``convert`` does (``pack``: ``[bos, *doc]`` sequences cut into ``seq_len`` rows; ``pad``: a
row per document), groups rows into ``[batch_size, seq_len]`` batches and appends them to the
live dataset at ``dataset`` with a ``LiveProducer``. It loops over its share epoch after epoch,
each epoch in its own unit order (keyed by ``seed`` and the epoch), until ``epochs`` are done or
``stop()`` says so. Trainers follow the dataset with ``LiveSource`` and get the first batch as
soon as the first commit lands (objects start at one batch and double up to
``batches_per_object``).

Exactly once at the source
    The batch stream is a function of the configuration alone, so its offsets name places in
    the input. Before each object is appended, its production record (``live/production.py``)
    stores each row's origin and the cursor after the object. A producer restarted with the
    same id and configuration reads the committed offset from the manifest and the cursor of
    the object ending there, re-reads the unit the cursor is in (skipping the documents and
    tokens before it) and carries on: the stream after a restart is the stream that was
    interrupted, batch for batch, so every document of the share is committed once per epoch.
    A restart with other inputs, tokenizer, packing, shape, seed or share is refused, naming
    what differs, before anything is appended.

The end of the run
    After the last epoch, the rows left over are completed with ``pad_id`` into a last batch
    (rows of padding only have origin ``-1``); without a ``pad_id`` (the tokenizer has no EOS
    and none was given) they are dropped and counted in the summary.

Token dtype
    ``dtype`` (``--dtype``) is the dtype of the batches, recorded in the live dataset
    (``live.json``) and in the production record. ``"auto"`` (the default) takes the dataset's
    own when it exists, so that every producer of a dataset and every restart writes its dtype;
    for a new dataset it is uint16 when every id the inputs can give fits (text: the
    tokenizer's vocabulary, its BOS id and the pad id, as ``convert`` decides; token files:
    16-bit inputs and pad id, never a scan: each producer reads only its share), else uint32.
    A forced dtype other than the dataset's is refused by ``LiveProducer``, naming both; a
    restart with another dtype than its record's, like any other change. A production record
    written before dtypes were recorded stands for its dataset's dtype.

Memory is bounded by one object's rows, one document, and the tokenization batches in flight,
whatever the corpus size.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash
from zerobatch_spec import DTYPE_NAMES, DTYPE_UINT16, DTYPE_UINT32, TOKEN_BYTES, token_max
from zerobatch_spec.live import DESCRIPTOR_NAME, LiveViolation, parse_descriptor

from ..arguments import U32_MAX, int_arg
from ..errors import IngestError
from ..live.cadence import Cadence
from ..live.producer import LiveProducer
from ..live.production import (
    ORIGIN_FIELDS,
    PADDING,
    START,
    BatchesRecord,
    Cursor,
    InputEntry,
    ProducerRecord,
    ProductionError,
    create_record,
    read_batches,
    read_record,
    write_batches,
)
from ..stores.resolve import open_store
from ..stores.store import Store
from ..tokenization.parallel import DEFAULT_BATCH_DOCS, tokenize_documents
from ..tokenization.protocol import Tokenizer
from ..tokenization.resolve import load_tokenizer
from .convert import Kind, detect_kind
from .dtypes import (
    UINT16_MAX,
    DtypePlan,
    check_dtype_option,
    plan_text_dtype,
    tokenizer_ids,
)
from .nanogpt import Align
from .packing import Mode
from .source import Patterns, check_seq_len, expand_paths
from .text import Format, detect_format
from .units import TokenFiles, plan_units, unit_documents

DEFAULT_OBJECT_BYTES = 4 * 2**20
"""Token bytes a batch object holds at most by default (``batches_per_object``)."""


class ProduceError(IngestError):
    """A producer that cannot start or resume: another configuration under its id, a share
    with nothing in it, a committed offset without its production record."""


@dataclass(frozen=True)
class ProduceProgress:
    """Where a producer stands after a commit: its committed offset and its cursor."""

    producer: str
    committed: int
    appended: int
    cursor: Cursor


@dataclass
class ProduceSummary:
    """What one run of a producer did."""

    producer: str
    index: int
    producers: int
    resumed_at: int
    """The committed offset the run started from (0 for a fresh producer)."""
    committed: int
    """The committed offset at the end of the run."""
    cursor: Cursor
    """Where the next run resumes in the share's documents."""
    finished: bool
    """Whether every epoch asked for is done (never for a run without ``epochs``)."""
    documents: int = 0
    tokens: int = 0
    """Document tokens packed this run (BOS excluded)."""
    padding_rows: int = 0
    dropped_tokens: int = 0
    seconds: float = 0.0
    commits: int = 0
    conflicts: int = 0
    dtype: str = "uint32"
    """The token dtype of the batches (the live dataset's)."""

    @property
    def batches(self) -> int:
        """Batches committed by this run."""
        return self.committed - self.resumed_at

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cursor"] = self.cursor.as_list()
        out["batches"] = self.batches
        out["tokens_per_second"] = self.tokens_per_second
        return out

    def lines(self) -> list[str]:
        state = "finished" if self.finished else "stopped"
        out = [
            f"producer {self.producer} ({self.index} of {self.producers}): {state} at offset "
            f"{self.committed:,} ({self.batches:,} batches committed this run, resumed at "
            f"{self.resumed_at:,})",
            f"  {self.documents:,} documents, {self.tokens:,} tokens in {self.seconds:.1f} s "
            f"({self.tokens_per_second:,.0f} tokens/s); {self.commits} commits, "
            f"{self.conflicts} conflicts; tokens stored as {self.dtype}",
        ]
        if self.padding_rows:
            out.append(f"  last batch completed with {self.padding_rows} rows of padding")
        if self.dropped_tokens:
            out.append(
                f"  {self.dropped_tokens:,} tokens after the last whole batch dropped (no pad id)"
            )
        return out


@dataclass
class _Piece:
    """Tokens of one document not yet in a batch: from token ``token`` of its sequence on."""

    epoch: int
    position: int
    unit: int
    document: int
    token: int
    ids: npt.NDArray[np.uint32]

    def skip(self, start: Cursor) -> _Piece:
        """The piece without the tokens before ``start``, if ``start`` is in its document."""
        if (self.epoch, self.position, self.document) != (
            start.epoch,
            start.position,
            start.document,
        ):
            return self
        t = start.token
        return _Piece(self.epoch, self.position, self.unit, self.document, t, self.ids[t:])


@dataclass
class _Packer:
    """Pieces waiting to become rows, and the rows' origins when they are cut."""

    seq_len: int
    pieces: deque[_Piece] = field(default_factory=deque)
    tokens: int = 0
    last: Cursor = START

    def add(self, piece: _Piece) -> None:
        if piece.ids.size:
            self.pieces.append(piece)
            self.tokens += piece.ids.size

    def cursor(self) -> Cursor:
        """Where the tokens not yet taken begin."""
        if self.pieces:
            p = self.pieces[0]
            return Cursor(p.epoch, p.position, p.document, p.token)
        return self.last

    def take(self, tokens: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
        """The first ``tokens`` tokens (at most what is held) and the origin of each row."""
        taken: list[_Piece] = []
        got = 0
        while got < tokens and self.pieces:
            p = self.pieces.popleft()
            need = tokens - got
            if p.ids.size > need:
                rest = _Piece(p.epoch, p.position, p.unit, p.document, p.token + need, p.ids[need:])
                self.pieces.appendleft(rest)
                p = _Piece(p.epoch, p.position, p.unit, p.document, p.token, p.ids[:need])
            taken.append(p)
            got += p.ids.size
        self.tokens -= got
        if taken:
            end = taken[-1]
            self.last = Cursor(end.epoch, end.position, end.document, end.token + end.ids.size)
        flat = np.concatenate([p.ids for p in taken]) if taken else np.empty(0, np.uint32)
        sizes = np.fromiter((p.ids.size for p in taken), dtype=np.int64, count=len(taken))
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        meta = np.array(
            [(p.epoch, p.unit, p.document, p.token) for p in taken], dtype=np.int64
        ).reshape(-1, ORIGIN_FIELDS)
        row_starts = np.arange(0, got, self.seq_len, dtype=np.int64)
        at = np.searchsorted(starts, row_starts, side="right") - 1
        origins = meta[at].copy()
        origins[:, 3] += row_starts - starts[at]
        return flat, origins


def produce(
    sources: Patterns,
    dataset: str | os.PathLike[str] | Store,
    *,
    producer_id: str,
    seq_len: int,
    batch_size: int,
    producers: int = 1,
    index: int = 0,
    tokenizer: str | Tokenizer = "byte",
    mode: Mode = "pack",
    pad_id: int | None = None,
    text_field: str = "text",
    per_line: bool = False,
    format: Format | None = None,
    kind: Kind | None = None,
    align: Align = "contiguous",
    bos_token: int | None = None,
    unit_records: int | None = None,
    seed: int = 0,
    epochs: int | None = None,
    batches_per_object: int | None = None,
    workers: int = 1,
    batch_docs: int = DEFAULT_BATCH_DOCS,
    cadence: Cadence | int | str = "adaptive",
    stop: Callable[[], bool] | None = None,
    on_commit: Callable[[ProduceProgress], None] | None = None,
    dtype: str = "auto",
) -> ProduceSummary:
    """Run producer ``index`` of ``producers`` (id ``producer_id``) over ``sources`` into the
    live dataset ``dataset`` (a URL, a path or a ``Store``; created with ``batch_size``,
    ``seq_len`` and ``seed`` if it does not exist), resuming where this id's committed batches
    end. See the module docstring.

    Text is tokenized with ``tokenizer``; nanoGPT shards and ``.npy`` arrays (``kind``, by
    default from the suffixes) hold tokens already, cut into records as ``convert`` cuts them
    (``align``, ``bos_token``) and shared in units of ``unit_records`` records (default: about
    a million tokens). ``pad_id`` defaults to the tokenizer's EOS id (``mode="pad"`` needs
    one). ``epochs=None``
    runs until ``stop()`` returns true (checked between objects); ``on_commit`` is called after
    every commit that moves the committed offset. ``workers`` tokenizer processes; the output
    is the same for any number. ``dtype`` is ``"auto"``, ``"uint16"`` or ``"uint32"`` (module
    docstring, "Token dtype").
    """
    want = check_dtype_option(dtype)
    started = time.monotonic()
    plan = _Plan.make(
        sources,
        producer_id=producer_id,
        seq_len=seq_len,
        batch_size=batch_size,
        producers=producers,
        index=index,
        tokenizer=tokenizer,
        mode=mode,
        pad_id=pad_id,
        text_field=text_field,
        per_line=per_line,
        format=format,
        kind=kind,
        align=align,
        bos_token=bos_token,
        unit_records=unit_records,
        seed=seed,
        batches_per_object=batches_per_object,
        dtype=want,
    )
    if epochs is not None:
        epochs = int_arg("epochs", epochs, 1, None, IngestError)
    workers = int_arg("workers", workers, 1, None, IngestError)
    store = open_store(dataset)
    try:
        existing = _dataset_dtype(store)
        code = plan.resolve_dtype(want, existing, store.url)
        plan.record = dataclasses.replace(plan.record, dtype=DTYPE_NAMES[code])
        found = read_record(store, producer_id)
        if found is not None and found.dtype is None:  # recorded before dtypes were
            had = DTYPE_UINT32 if existing is None else existing
            found = dataclasses.replace(found, dtype=DTYPE_NAMES[had])
        if found is not None and found != plan.record:
            raise ProduceError(
                f"{store.url}: producer {producer_id} was started with another configuration: "
                f"{'; '.join(found.differences(plan.record))}; resume it with its own, or start "
                "a producer under a new id"
            )
        with LiveProducer(
            store,
            producer_id,
            batch_size=batch_size,
            seq_len=seq_len,
            seed=seed,
            cadence=cadence,
            dtype=code,
        ) as producer:
            if found is None and producer.offset:
                raise ProduceError(
                    f"{store.url}: producer {producer_id} has {producer.offset:,} committed "
                    "batches but no production record: they were not written by produce; "
                    "start a producer under a new id"
                )
            create_record(store, plan.record)
            run = _Run(plan, store, producer, epochs, workers, batch_docs, tokenizer, on_commit)
            finished = run.run(stop)
        return ProduceSummary(
            producer=producer_id,
            index=plan.record.index,
            producers=plan.record.producers,
            resumed_at=run.resumed_at,
            committed=producer.committed,
            cursor=run.cursor,
            finished=finished,
            documents=run.documents,
            tokens=run.tokens,
            padding_rows=run.padding_rows,
            dropped_tokens=run.dropped_tokens,
            seconds=time.monotonic() - started,
            commits=producer.stats.commits,
            conflicts=producer.stats.conflicts,
            dtype=DTYPE_NAMES[code],
        )
    finally:
        store.close()


def _dataset_dtype(store: Store) -> int | None:
    """The dtype code of the live dataset in ``store``, or ``None`` if there is none yet (a
    descriptor that does not parse is left to ``LiveProducer``, which names its fault)."""
    try:
        data = store.read(DESCRIPTOR_NAME)
    except FileNotFoundError:
        return None
    found = parse_descriptor(data)
    return None if isinstance(found, LiveViolation) else found.dtype


@dataclass
class _Plan:
    """A producer's validated configuration and its tokenizer."""

    record: ProducerRecord
    tokenizer: Tokenizer | None
    token_files: TokenFiles | None
    dtypes: DtypePlan
    """The dtype for a new dataset (``"auto"``: from the ids the inputs can give)."""
    largest: int | None
    """The largest id the inputs can give, where known before reading them."""
    ids: str
    """Those ids in words, for messages."""

    def resolve_dtype(self, want: str, existing: int | None, where: str) -> int:
        """The dtype code of the batches: ``want``, or for ``"auto"`` the dataset's own
        (``existing``) where there is one, else ``dtypes``'s."""
        assert self.dtypes.code is not None
        if want != "auto" or existing is None:
            return self.dtypes.code
        if existing == DTYPE_UINT16 and self.largest is not None and self.largest > UINT16_MAX:
            raise ProduceError(
                f"{where}: the live dataset holds uint16 tokens (ids up to {UINT16_MAX:,}), "
                f"and this producer's inputs do not fit: {self.ids}; write to a uint32 dataset"
            )
        return existing

    @classmethod
    def make(
        cls,
        sources: Patterns,
        *,
        producer_id: str,
        seq_len: int,
        batch_size: int,
        producers: int,
        index: int,
        tokenizer: str | Tokenizer,
        mode: Mode,
        pad_id: int | None,
        text_field: str,
        per_line: bool,
        format: Format | None,
        kind: Kind | None,
        align: Align,
        bos_token: int | None,
        unit_records: int | None,
        seed: int,
        batches_per_object: int | None,
        dtype: str = "auto",
    ) -> _Plan:
        t = check_seq_len(seq_len)
        b = int_arg("batch_size", batch_size, 1, U32_MAX, IngestError)
        n = int_arg("producers", producers, 1, None, IngestError)
        i = int_arg("index", index, 0, n - 1, IngestError)
        s = int_arg("seed", seed, 0, 2**64 - 1, IngestError)
        if mode not in ("pack", "pad"):
            raise IngestError(f"mode must be 'pack' or 'pad', got {mode!r}")
        k = (
            max(1, DEFAULT_OBJECT_BYTES // (TOKEN_BYTES * b * t))
            if batches_per_object is None
            else int_arg("batches_per_object", batches_per_object, 1, None, IngestError)
        )
        files = expand_paths(sources, "input")
        found = kind or detect_kind(files)
        if found == "text":
            tok: Tokenizer | None = (
                load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
            )
            assert tok is not None
            name, digest = tok.name, f"{xxhash.xxh3_64_intdigest(tok.to_json().encode()):016x}"
            bos: int | None = int(tok.bos_id)
            pad = (
                tok.eos_id if pad_id is None else int_arg("pad_id", pad_id, 0, U32_MAX, IngestError)
            )
            if mode == "pad" and pad is None:
                raise IngestError(
                    f"mode='pad' needs a pad_id (tokenizer {tok.name!r} has no EOS to default to)"
                )
            if align != "contiguous" or bos_token is not None or unit_records is not None:
                raise IngestError(
                    "align, bos_token and unit_records apply to token files, not to text"
                )
            units, inputs = plan_units(files, text_field=text_field, format=format)
            ends = [later.first_unit for later in inputs[1:]] + [len(units)]
            counts = [end - entry.first_unit for entry, end in zip(inputs, ends, strict=True)]
            formats: list[str] = [format or detect_format(p) for p in files]
            per_unit, token_files = 0, None
            ids = tokenizer_ids(tok, pad)
            dtypes = plan_text_dtype(ids, dtype, tok.name)
            largest = ids.largest
            said = ids.describe() if largest is not None else f"tokenizer {tok.name!r}"
        elif found not in ("nanogpt", "npy"):
            raise IngestError(
                f"produce reads text, nanoGPT shards and .npy arrays, not {found} inputs: "
                "convert them to a dataset first (zerobatch convert)"
            )
        else:
            if mode != "pack":
                raise IngestError(f"mode={mode!r} applies to text; {found} files hold records")
            if not isinstance(tokenizer, str) or tokenizer != "byte":
                raise IngestError(f"{found} files hold tokens already: give no tokenizer")
            if align not in ("contiguous", "bos") or (align == "bos") != (bos_token is not None):
                raise IngestError("align='bos' needs a bos_token, and only it takes one")
            if found == "npy" and align != "contiguous":
                raise IngestError("align='bos' applies to nanoGPT shards, not to .npy arrays")
            tok, name, digest, bos = None, "none", "", None
            pad = None if pad_id is None else int_arg("pad_id", pad_id, 0, U32_MAX, IngestError)
            if unit_records is not None:
                unit_records = int_arg("unit_records", unit_records, 1, None, IngestError)
            token_files = TokenFiles(
                found, t, align=align, bos_token=bos_token, per_unit=unit_records
            )
            per_unit = token_files.per_unit
            counts = [token_files.units(p) for p in files]
            formats = [found] * len(files)
            dtypes, largest, said = _token_files_dtype(
                [token_files.dtype(p) for p in files], pad, dtype
            )
        entries = [
            InputEntry(os.path.abspath(p), fmt, os.path.getsize(p), c)
            for p, fmt, c in zip(files, formats, counts, strict=True)
        ]
        record = ProducerRecord(
            producer=producer_id,
            producers=n,
            index=i,
            inputs=tuple(entries),
            tokenizer=name,
            tokenizer_xxh3=digest,
            mode=mode,
            bos_id=bos,
            pad_id=pad,
            text_field=text_field,
            per_line=bool(per_line),
            align=align,
            bos_token=bos_token,
            unit_records=per_unit,
            seq_len=t,
            batch_size=b,
            seed=s,
            batches_per_object=k,
        )
        if record.share().size == 0:
            raise ProduceError(
                f"producer {i} of {n} has no input units: the inputs hold {record.units} "
                "(a parquet row group or a whole JSONL or text file each); run at most "
                f"{record.units} producers"
            )
        return cls(record, tok, token_files, dtypes, largest, said)


def _token_files_dtype(
    dtypes: list[np.dtype[Any]], pad: int | None, dtype: str
) -> tuple[DtypePlan, int | None, str]:
    """The dtype plan of a producer of token files stored as ``dtypes`` (with ``pad``), the
    largest id they can give where known, and those ids in words."""
    names = "/".join(sorted({d.name for d in dtypes}))
    narrow = all(d.itemsize <= 2 for d in dtypes)
    largest = None if not narrow else max(UINT16_MAX, -1 if pad is None else pad)
    said = f"{names} inputs" + ("" if pad is None else f", pad id {pad:,}")
    if pad is not None and pad > UINT16_MAX and dtype == "uint16":
        raise IngestError(f"dtype='uint16' cannot hold pad_id {pad:,} (ids up to {UINT16_MAX:,})")
    if dtype == "uint32":
        return DtypePlan(DTYPE_UINT32, "asked for"), largest, said
    if dtype == "uint16":
        return DtypePlan(DTYPE_UINT16, "asked for", None if narrow else UINT16_MAX), largest, said
    fits = largest is not None and largest <= UINT16_MAX
    return DtypePlan(DTYPE_UINT16 if fits else DTYPE_UINT32, said), largest, said


class _Run:
    """One run of a producer: resume, produce objects, flush at the end."""

    def __init__(
        self,
        plan: _Plan,
        store: Store,
        producer: LiveProducer,
        epochs: int | None,
        workers: int,
        batch_docs: int,
        given: str | Tokenizer,
        on_commit: Callable[[ProduceProgress], None] | None,
    ) -> None:
        self.plan, self.record, self.store, self.producer = plan, plan.record, store, producer
        self.epochs, self.workers, self.batch_docs = epochs, workers, batch_docs
        self.given, self.on_commit = given, on_commit
        self.tokens_files = plan.token_files
        self.resumed_at = producer.offset
        self.cursor = self._resume_cursor()
        self.documents = self.tokens = self.padding_rows = self.dropped_tokens = 0
        self.listed = 0
        """Documents (records of a token file) read from the inputs, skipped ones included."""

    def _resume_cursor(self) -> Cursor:
        offset = self.producer.offset
        if offset == 0:
            return START
        found = read_batches(self.store, self.record.producer, offset, self.record.batch_size)
        if found is None:
            raise ProductionError(
                f"{self.store.url}: producer {self.record.producer} committed {offset:,} "
                "batches but the production record of the object ending there is missing: "
                "its place in the input is unknown"
            )
        return found.next

    def object_batches(self, offset: int) -> int:
        """Batches in the object starting at ``offset``: 1, 2, 4, ... up to the maximum, so the
        first commit comes at once and the boundaries depend on the offset alone."""
        return min(self.record.batches_per_object, offset + 1)

    def run(self, stop: Callable[[], bool] | None) -> bool:
        """Produce until the epochs are done (``True``) or ``stop()`` (``False``)."""
        if self.epochs is not None and self.cursor.epoch >= self.epochs:
            return True
        r = self.record
        row_tokens = r.batch_size * r.seq_len
        packer = _Packer(r.seq_len, last=self.cursor)
        pieces = self._pieces(self.cursor)
        try:
            for piece in pieces:
                packer.add(piece)
                while packer.tokens >= self.object_batches(self.producer.offset) * row_tokens:
                    n = self.object_batches(self.producer.offset)
                    flat, origins = packer.take(n * row_tokens)
                    self._emit(flat, origins, n, packer.cursor())
                    if stop is not None and stop():
                        return False
        finally:
            pieces.close()
        self._flush(packer)
        return True

    def _flush(self, packer: _Packer) -> None:
        """The rows left after the last epoch: completed with padding into a last batch, or
        dropped when there is no pad id."""
        r = self.record
        row_tokens = r.batch_size * r.seq_len
        end = Cursor(self.epochs or 0, 0, 0, 0)
        if not packer.tokens:
            return
        if r.pad_id is None:
            whole = packer.tokens // row_tokens
            if whole:
                flat, origins = packer.take(whole * row_tokens)
                self._emit(flat, origins, whole, packer.cursor() if packer.tokens else end)
            self.dropped_tokens += packer.tokens
            self.cursor = end
            return
        flat, origins = packer.take(packer.tokens)
        n = -(-flat.size // row_tokens)
        full = np.full(n * row_tokens, r.pad_id, dtype=np.uint32)
        full[: flat.size] = flat
        rows = np.full((n * r.batch_size, 4), PADDING, dtype=np.int64)
        rows[: origins.shape[0]] = origins
        self.padding_rows += n * r.batch_size - origins.shape[0]
        self._emit(full, rows, n, end)

    def _emit(
        self, flat: npt.NDArray[np.uint32], origins: npt.NDArray[np.int64], n: int, after: Cursor
    ) -> None:
        """Record, then append, one object of ``n`` batches; report a commit that landed."""
        r = self.record
        self._check_fits(flat, origins)
        first = self.producer.offset
        write_batches(self.store, BatchesRecord(r.producer, first, first + n, after, origins))
        before = self.producer.committed
        self.producer.append(flat.reshape(n, r.batch_size, r.seq_len))
        self.cursor = after
        if self.producer.committed != before and self.on_commit is not None:
            self.on_commit(
                ProduceProgress(r.producer, self.producer.committed, self.producer.offset, after)
            )

    def _check_fits(self, flat: npt.NDArray[np.uint32], origins: npt.NDArray[np.int64]) -> None:
        """Refuse, before anything of the object is stored, a token the dataset's dtype
        cannot hold, naming the row it is in by its origin (epoch, unit, document, token)."""
        top = token_max(self.producer.dtype)
        if not flat.size or int(flat.max()) <= top:
            return
        i = int(np.flatnonzero(flat > top)[0])
        row, column = divmod(i, self.record.seq_len)
        epoch, unit, document, token = (int(v) for v in origins[row])
        name = DTYPE_NAMES[self.producer.dtype]
        if unit == PADDING:
            raise ProduceError(
                f"{self.store.url}: pad id {int(flat[i]):,} does not fit this {name} live "
                f"dataset (ids up to {top:,})"
            )
        entry, part = self.record.locate(unit)
        where = f"{entry.path}" + ("" if part < 0 else f" (part {part})")
        raise ProduceError(
            f"{where}: id {int(flat[i]):,} does not fit this {name} live dataset (ids up to "
            f"{top:,}): token {column} of the row that starts at document {document} of unit "
            f"{unit}, token {token} (epoch {epoch})"
        )

    def _pieces(self, start: Cursor) -> Generator[_Piece, None, None]:
        """The share's documents from ``start`` on, as pieces of the row stream."""
        if self.tokens_files is not None:
            yield from self._record_pieces(start, self.tokens_files)
            return
        metas: deque[tuple[int, int, int, int]] = deque()
        texts = self._texts(start, metas)
        ids_stream = tokenize_documents(texts, self.given, self.workers, self.batch_docs)
        r = self.record
        assert r.bos_id is not None
        bos = np.array([r.bos_id], dtype=np.uint32)
        try:
            for ids in ids_stream:
                epoch, position, unit, document = metas.popleft()
                self.documents += 1
                self.tokens += ids.size
                if r.mode == "pack":
                    seq = np.concatenate([bos, ids.astype(np.uint32, copy=False)])
                else:
                    assert r.pad_id is not None
                    seq = np.full(r.seq_len, r.pad_id, dtype=np.uint32)
                    seq[0] = r.bos_id
                    kept = ids[: r.seq_len - 1]
                    seq[1 : 1 + kept.size] = kept
                yield _Piece(epoch, position, unit, document, 0, seq).skip(start)
        finally:
            ids_stream.close()

    def _texts(self, start: Cursor, metas: deque[tuple[int, int, int, int]]) -> Iterator[str]:
        """The share's documents from ``start``'s on, each one's place put in ``metas``."""
        r = self.record
        for epoch, position, unit, entry, part, skip in self._units(start):
            docs = unit_documents(entry.path, entry.format, part, r.text_field, per_line=r.per_line)
            for document, text in enumerate(docs):
                self.listed += 1
                if document >= skip:
                    metas.append((epoch, position, unit, document))
                    yield text

    def _record_pieces(self, start: Cursor, files: TokenFiles) -> Iterator[_Piece]:
        """Token files: each record of each unit is a piece of ``seq_len`` tokens."""
        for epoch, position, unit, entry, part, skip in self._units(start):
            document = 0
            for block in files.blocks(entry.path, part):
                for row in block:
                    self.listed += 1
                    if document >= skip:
                        self.documents += 1
                        self.tokens += row.size
                        yield _Piece(epoch, position, unit, document, 0, row).skip(start)
                    document += 1

    def _units(self, start: Cursor) -> Iterator[tuple[int, int, int, InputEntry, int, int]]:
        """``(epoch, position, unit, input, part, documents to skip)`` of every unit from
        ``start``'s on; an epoch of the share with no document at all is an error (a
        producer without ``epochs`` would otherwise loop forever)."""
        r = self.record
        epoch = start.epoch
        while self.epochs is None or epoch < self.epochs:
            order = r.order(epoch)
            first = start.position if epoch == start.epoch else 0
            before = self.listed
            for position in range(first, order.size):
                unit = int(order[position])
                entry, part = r.locate(unit)
                skip = start.document if (epoch, position) == (start.epoch, start.position) else 0
                yield epoch, position, unit, entry, part, skip
            whole = epoch != start.epoch or (start.position, start.document) == (0, 0)
            if whole and self.listed == before:
                raise ProduceError(
                    f"producer {r.producer}: epoch {epoch} of its share holds no document"
                )
            epoch += 1


def share_of(
    sources: Patterns, producers: int, *, text_field: str = "text", format: Format | None = None
) -> list[list[tuple[str, int]]]:
    """Each producer's units as ``(path, part)`` pairs: what ``produce`` would give each of
    ``producers`` producers of ``sources`` (``part`` a parquet row group, ``-1`` a whole file)."""
    n = int_arg("producers", producers, 1, None, IngestError)
    units, _ = plan_units(expand_paths(sources, "input"), text_field=text_field, format=format)
    return [[(u.path, u.part) for u in units[i::n]] for i in range(n)]


__all__: Sequence[str] = [
    "DEFAULT_OBJECT_BYTES",
    "ProduceError",
    "ProduceProgress",
    "ProduceSummary",
    "produce",
    "share_of",
]
