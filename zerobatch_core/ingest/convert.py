"""``convert``: any supported source into one LLMBATCH file or a sharded dataset, with a summary.

Sources are recognised by their file names: nanoGPT ``.bin`` shards, NumPy ``.npy`` arrays, or
text (``.parquet``, ``.jsonl``/``.json``, ``.txt``) which is tokenized and packed. Records stream
through ``write_batch_dataset``, so memory stays bounded (see ``MEMORY_BOUND_BYTES``) and the
output is still globally shuffled by the spec's record permutation; the file appears atomically
at the end, so an interrupted conversion leaves nothing that looks valid, and a rerun simply
starts again (see ``zerobatch_core.files.writer`` for what a killed run can leave and how the next
write into the directory removes it).

Before anything is read or written, the output path is checked: it must not be one of the
sources (same device and inode, ``.bos.idx`` side files included), must not exist unless
``overwrite=True``, and, when the record count is known up front, must receive at least one
batch unless ``allow_empty=True``. Sources are read with positioned reads, so a source truncated
during the conversion raises an ``IngestError`` naming it, and no output or temporary file is
left behind.

With ``shard_batches=N`` the output is a dataset directory instead (``datasets/build.py``): the
record stream is cut into shards of ``N`` batches, each written by the same file writer, and the
manifest's ``sources`` record which input file gave which range ``[first, last)`` of the
conversion's input records (the records in the order the source yields them, before shuffling):

- nanoGPT shards and ``.npy`` arrays: exact. Records never span two files, so file ``i``'s range
  is its own records, counted from its header or shape (in BOS-aligned mode, from its BOS
  positions): record ``k`` of a contiguously cut shard is its tokens ``[k * T, (k + 1) * T)``.
- text, ``mode="pad"``: exact, one record per document, documents in file order.
- text, ``mode="pack"``: records run across documents and files, so a record belongs to the file
  of its first token (a document's BOS is its first token). File ``i``'s range is the records
  whose first token lies in its documents; a file whose tokens all lie inside a record begun by
  an earlier file gets an empty range. Ranges are consecutive and cover every record read.

Source paths are stored absolute, as the conversion named them (symbolic links not resolved).

Tokens are stored as uint16 or uint32 (``dtype``: ``"auto"`` by default, which writes uint16
whenever every token fits; ``ingest.dtypes`` says how it is decided and what it costs); the
summary says which dtype was written and why.
"""

from __future__ import annotations

import glob
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TextIO

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_NAMES, HEADER_SIZE, parse_header
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME, MANIFEST_VERSION, Source
from zerobatch_spec.index import INDEX_NAME

from ..arguments import U32_MAX, int_arg
from ..datasets.build import check_dataset_output, write_sharded_dataset
from ..errors import IngestError, WriteError
from ..files.writer import CHUNK_BYTES, check_output, write_batch_dataset
from ..tokenization.parallel import tokenize_documents
from .arrays import ArrayFile, ArraySource
from .dtypes import DtypePlan, TokenWatch, final_reason, plan_dtype
from .formats import (
    DEFAULT_COLUMN,
    TOKEN_FORMATS,
    FormatOptions,
    detect_format,
    open_token_files,
    side_files,
)
from .nanogpt import Align, BinShard, NanoGPTSource, bos_index_path
from .packing import Mode, PackingStats, make_records
from .source import CountsTokens, Drop, RecordSource, U32Block, default_chunk_records
from .text import TextSource, read_documents
from .token_files import Layout, TokenFileSource

Kind = Literal["nanogpt", "npy", "text", "megatron", "hf", "mds", "atlas"]
_SUFFIXES: dict[str, Kind] = {
    ".bin": "nanogpt",
    ".npy": "npy",
    ".parquet": "text",
    ".jsonl": "text",
    ".json": "text",
    ".txt": "text",
}

MEMORY_BOUND_BYTES = 4 * CHUNK_BYTES + 96 * 2**20
"""Documented bound on how much a conversion's peak RSS may grow above the footprint of the
interpreter with the source's libraries loaded (numpy, pyarrow, the tokenizer), whatever the
corpus size: the streaming writer's stage, window and in-flight buffers (a few
``CHUNK_BYTES`` each), one source block, the documents and token arrays of the tokenization
batches in flight, and the tokenizer's own working memory. Mapped inputs and the writer's
scratch files are read so that they never accumulate in the resident set (``pages.py``, one
window mapped at a time in ``writer.py``);
``benchmarks/ingest_memory.py`` measures it at 1x, 4x and 16x a corpus."""


LARGE_DROP_FRACTION = 0.10
"""A conversion that drops more than this share of the source's tokens says so in its summary."""


def plural(count: int, word: str, many: str | None = None) -> str:
    """``"1 record"``, ``"2 records"``, ``"1,024 batches"``: a count with its noun."""
    noun = word if count == 1 else (many or f"{word}s")
    return f"{count:,} {noun}"


@dataclass
class ConvertSummary:
    """What a conversion produced, and what it dropped.

    ``records``, ``batches`` and ``tokens`` count what the output holds. ``records_read`` is
    what the source yielded; the records past the last whole batch are ``dropped_records``.
    ``source_tokens`` is what the source files hold (for text: document tokens plus one BOS
    per document), where it is known, and ``dropped_tokens`` the source tokens that are not in
    the output; ``drops`` says where they went, one ``Drop`` per reason.
    """

    output: str
    kind: Kind
    records: int
    batches: int
    dropped_records: int
    tokens: int
    output_bytes: int
    seconds: float
    records_read: int = 0
    source_tokens: int | None = None
    dropped_tokens: int = 0
    drops: list[Drop] = field(default_factory=list)
    padding_fraction: float | None = None
    packing: dict[str, Any] = field(default_factory=dict)
    shards: int | None = None
    """Shards of a dataset output (``shard_batches``); ``None`` for a single file."""
    dtype: str = "uint32"
    """The token dtype written: ``uint16`` or ``uint32``."""
    dtype_reason: str = ""
    """Why that dtype (``ingest.dtypes``): the vocabulary, the inputs' dtype, the largest id."""

    @property
    def tokens_per_second(self) -> float:
        """Tokens written per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def dropped_fraction(self) -> float:
        """Share of the source's tokens (or, where unknown, of its records) not written."""
        if self.source_tokens:
            return self.dropped_tokens / self.source_tokens
        return self.dropped_records / self.records_read if self.records_read else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            **asdict(self),
            "tokens_per_second": self.tokens_per_second,
            "dropped_fraction": self.dropped_fraction,
        }

    def lines(self) -> list[str]:
        """Human-readable summary lines; a large drop (``LARGE_DROP_FRACTION``) is called out."""
        shards = "" if self.shards is None else f"{plural(self.shards, 'shard')}, "
        out = [
            f"wrote {self.output}: {shards}{plural(self.batches, 'batch', 'batches')}, "
            f"{plural(self.records, 'record')}, {plural(self.tokens, 'token')}, "
            f"{self.output_bytes / 2**20:.1f} MiB",
        ]
        read = f"  read {plural(self.records_read, 'record')}"
        if self.source_tokens is not None:
            read += f" from {plural(self.source_tokens, 'source token')}"
        out.append(read)
        if not self.drops:
            out.append("  dropped nothing")
        for d in self.drops:
            what = [plural(d.records, "record")] if d.records else []
            what.append(plural(d.tokens, "token"))
            out.append(f"  dropped {', '.join(what)}: {d.detail}")
        if self.dropped_fraction > LARGE_DROP_FRACTION and self.drops:
            worst = max(self.drops, key=lambda d: d.tokens)
            warning = (
                f"  warning: {self.dropped_fraction:.1%} of the input was dropped, most of it "
                f"as {worst.reason.replace('_', ' ')}"
            )
            advice = _DROP_ADVICE.get(worst.reason)
            out.append(f"{warning}; {advice}" if advice else warning)
        out.append(f"  {self.tokens_per_second / 1e6:.1f}M tokens/s over {self.seconds:.1f} s")
        if self.padding_fraction is not None:
            out.append(f"  padding fraction: {self.padding_fraction:.4f}")
        reason = f" ({self.dtype_reason})" if self.dtype_reason else ""
        out.append(f"  tokens stored as {self.dtype}{reason}")
        return out


_DROP_ADVICE = {
    "batch_remainder": "a smaller batch size keeps more records",
    "bos_alignment": (
        "records start only at BOS tokens, so documents longer than the sequence length lose "
        "their tail; a longer sequence length or contiguous alignment keeps more"
    ),
    "shard_tails": "a shorter sequence length keeps more of each shard",
    "array_tails": "a shorter sequence length keeps more of each array",
    "final_partial_record": "a shorter sequence length keeps more",
    "truncated_documents": (
        "documents longer than the sequence length are cut; packing, or a longer sequence "
        "length, keeps them whole"
    ),
}


def detect_kind(paths: Sequence[str], column: str = DEFAULT_COLUMN) -> Kind:
    """The source kind all ``paths`` share, or an error naming the odd one out.

    Other systems' token formats are recognised by their files (``formats.detect_format``:
    Megatron prefixes and ``.idx``, Hugging Face, MDS and Atlas directories, ``.arrow`` files,
    parquet files whose ``column`` holds token lists); everything else by its suffix.
    """
    kinds: set[Kind] = set()
    for p in paths:
        found = detect_format(p, column)
        if found is not None:
            kinds.add(found)
            continue
        suffix = os.path.splitext(p)[1].lower()
        if suffix not in _SUFFIXES:
            raise IngestError(
                f"{p}: cannot tell the source kind from the suffix {suffix!r}; expected one of "
                f"{', '.join(sorted(_SUFFIXES))}, a Megatron prefix, or a Hugging Face, MDS or "
                "Atlas directory (or pass kind=...)"
            )
        kinds.add(_SUFFIXES[suffix])
    if len(kinds) != 1:
        raise IngestError(f"sources mix kinds {sorted(kinds)}; convert one kind at a time")
    return kinds.pop()


def open_source(
    sources: Sequence[str],
    seq_len: int,
    *,
    kind: Kind | None = None,
    tokenizer: str = "byte",
    mode: Mode = "pack",
    pad_id: int | None = None,
    text_field: str = "text",
    per_line: bool = False,
    workers: int = 1,
    align: Align | Literal["documents"] = "contiguous",
    bos_token: int | None = None,
    column: str = DEFAULT_COLUMN,
    column_dtype: str | None = None,
) -> RecordSource:
    """The ``RecordSource`` for ``sources`` (glob patterns allowed).

    Other systems' token formats (``kind`` ``megatron``, ``hf``, ``mds``, ``atlas``) take
    ``align="contiguous"`` or ``"documents"`` (one record per document start), ``column``
    (the token column or field) and ``column_dtype`` (the dtype of an MDS ``bytes`` column).
    """
    if not sources:
        raise IngestError("no sources given")
    names = [os.fspath(s) for s in sources]
    k = kind or detect_kind(names, column)
    if k in TOKEN_FORMATS:
        if align == "bos" or bos_token is not None:
            raise IngestError(
                f"{k} inputs have documents: cut records at them with align='documents', "
                "not at a BOS token"
            )
        layout: Layout = "documents" if align == "documents" else "contiguous"
        files = open_token_files(k, names, FormatOptions(column, column_dtype))
        return TokenFileSource(files, seq_len, layout, kind=k)
    if align == "documents":
        raise IngestError(
            f"align='documents' is for inputs with documents (Megatron, Hugging Face, MDS, "
            f"Atlas); {k} inputs take 'contiguous'{' or bos' if k == 'nanogpt' else ''}"
        )
    if k == "nanogpt":
        return NanoGPTSource(list(sources), seq_len, align=align, bos_token=bos_token)
    if k == "npy":
        return ArraySource(list(sources), seq_len)
    return TextSource(
        list(sources),
        tokenizer,
        seq_len,
        field=text_field,
        per_line=per_line,
        mode=mode,
        pad_id=pad_id,
        workers=workers,
    )


Progress = Callable[[int, int | None, float], None]
"""Called as ``progress(records_so_far, total_or_None, seconds_elapsed)``."""


class _Counted:
    """Pass blocks through, counting records and reporting progress every ``every_s``."""

    def __init__(
        self,
        blocks: Iterator[U32Block],
        progress: Progress | None,
        total: int | None,
        every_s: float = 0.5,
    ) -> None:
        self.blocks, self.progress, self.total, self.every_s = blocks, progress, total, every_s
        self.records = 0
        self.start = time.perf_counter()

    def __iter__(self) -> Iterator[U32Block]:
        last = 0.0
        for block in self.blocks:
            self.records += block.shape[0]
            now = time.perf_counter() - self.start
            if self.progress is not None and now - last >= self.every_s:
                self.progress(self.records, self.total, now)
                last = now
            yield block
        if self.progress is not None:
            self.progress(self.records, self.total, time.perf_counter() - self.start)


def progress_bar(seq_len: int, stream: TextIO | None = None) -> Progress:
    """A one-line progress display: records, tokens/s and, when the total is known, ETA."""
    out = stream or sys.stderr

    def show(done: int, total: int | None, elapsed: float) -> None:
        rate = done * seq_len / elapsed if elapsed > 0 else 0.0
        if total:
            frac = min(1.0, done / total)
            eta = (elapsed / frac - elapsed) if frac > 0 else float("nan")
            bar = "#" * int(frac * 30)
            text = (
                f"\r[{bar:<30}] {done:,}/{total:,} records  {rate / 1e6:.1f}M tok/s  "
                f"ETA {eta:5.1f} s"
            )
        else:
            text = f"\r{done:,} records  {rate / 1e6:.1f}M tok/s  {elapsed:.1f} s"
        out.write(text)
        out.flush()

    return show


def source_files(src: RecordSource) -> list[str]:
    """Every file ``src`` reads: its sources and, for nanoGPT shards, their ``.bos.idx`` files."""
    if isinstance(src, NanoGPTSource):
        shards = src.shards
        return [*shards, *(i for i in map(bos_index_path, shards) if os.path.exists(i))]
    if isinstance(src, ArraySource):
        return src.paths
    if isinstance(src, TextSource):
        return src.files
    if isinstance(src, TokenFileSource):
        return side_files(src.files)
    return []


def conversion_drops(
    src: RecordSource, read: int, kept: int, batch_size: int, seq_len: int
) -> tuple[int | None, list[Drop]]:
    """The source's token count (where known) and every drop of the conversion, by reason."""
    drops: list[Drop] = []
    source_tokens: int | None = None
    stats: PackingStats | None = getattr(src, "stats", None)
    if isinstance(src, CountsTokens):
        source_tokens = src.source_tokens
        drops.extend(src.drops())
    elif stats is not None:
        source_tokens = stats.documents + stats.tokens
        if stats.truncated_tokens:
            detail = (
                f"the tails of {plural(stats.truncated_documents, 'document')} longer than a "
                f"record ({seq_len} tokens with the BOS)"
            )
            drops.append(Drop("truncated_documents", 0, stats.truncated_tokens, detail))
        if stats.dropped_tail_tokens:
            detail = f"the final partial record (fewer than {seq_len} tokens)"
            drops.append(Drop("final_partial_record", 0, stats.dropped_tail_tokens, detail))
    if read > kept:
        detail = (
            f"the records past the last whole batch of {batch_size} (the output is whole batches)"
        )
        drops.append(Drop("batch_remainder", read - kept, (read - kept) * seq_len, detail))
    return source_tokens, drops


def convert(
    sources: Sequence[str],
    output: str,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    progress: Progress | None = None,
    overwrite: bool = False,
    allow_empty: bool = False,
    shard_batches: int | None = None,
    dtype: str = "auto",
    manifest_version: int = MANIFEST_VERSION,
    prefixes: int = 1,
    **source_options: Any,
) -> ConvertSummary:
    """Convert ``sources`` to the LLMBATCH file ``output``; see ``open_source`` for options.

    ``dtype`` is the tokens' dtype: ``"auto"`` (uint16 when every token that can be written
    fits, else uint32), ``"uint16"`` or ``"uint32"``; ``ingest.dtypes`` says how ``"auto"``
    decides, and when a forced ``"uint16"`` is refused.

    Refused with a ``WriteError`` before any record is read: an ``output`` that is one of the
    source files (or a shard's ``.bos.idx``), always; an existing ``output`` unless
    ``overwrite=True``; and, when the source knows its record count up front (nanoGPT shards,
    ``.npy`` arrays), fewer records than ``batch_size`` unless ``allow_empty=True`` (text
    sources are checked once they have been read, before the output is created).

    With ``shard_batches`` the output is a dataset directory of shards of that many batches
    (see the module docstring; ``datasets.build.check_dataset_output`` says what is refused),
    described by a manifest of ``manifest_version`` (2: with a shard index, ``SPEC.md``
    section 23), the shards' names spread over ``prefixes`` key prefixes (version 2 only:
    ``write_sharded_dataset``).
    """
    t = int_arg("seq_len", seq_len, 1, U32_MAX, IngestError)
    b = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    kind: Kind = source_options.pop("kind", None) or detect_kind([os.fspath(x) for x in sources])
    src = open_source(sources, t, kind=kind, **source_options)
    plan = plan_dtype(src, dtype)
    if shard_batches is not None:
        n = int_arg("shard_batches", shard_batches, 1, U32_MAX // b, WriteError)
        return _convert_sharded(
            src,
            kind,
            output,
            t,
            b,
            n,
            seed,
            progress,
            overwrite,
            allow_empty,
            source_options,
            plan,
            manifest_version,
            prefixes,
        )
    if prefixes != 1:
        raise WriteError(
            f"{os.fspath(output)}: prefixes={prefixes!r} applies to datasets (pass "
            "shard_batches): a single LLMBATCH file has no shard names to spread"
        )
    check_output(output, overwrite=overwrite, inputs=source_files(src))
    total = src.num_records
    if total is not None and total < b and not allow_empty:
        raise _empty_error(output, total, t, b)
    watch = TokenWatch(src.iter_blocks(), src, plan)
    counted = _Counted(iter(watch), progress, total)
    batches = write_batch_dataset(
        output,
        counted,
        total,
        b,
        t,
        seed,
        overwrite=overwrite,
        allow_empty=allow_empty,
        dtype="auto" if plan.code is None else plan.code,
    )
    seconds = time.perf_counter() - counted.start
    written = _file_dtype(output)
    kept = batches * b
    source_tokens, drops = conversion_drops(src, counted.records, kept, b, t)
    stats = getattr(src, "stats", None)
    return ConvertSummary(
        output=output,
        kind=kind,
        records=kept,
        batches=batches,
        dropped_records=counted.records - kept,
        tokens=kept * t,
        output_bytes=os.path.getsize(output),
        seconds=seconds,
        records_read=counted.records,
        source_tokens=source_tokens,
        dropped_tokens=sum(d.tokens for d in drops),
        drops=drops,
        padding_fraction=None if stats is None else float(stats.padding_fraction),
        packing={} if stats is None else stats.to_dict(),
        dtype=DTYPE_NAMES[written],
        dtype_reason=final_reason(plan, written, watch.largest, src),
    )


def _file_dtype(path: str) -> int:
    """The dtype code in the header of the LLMBATCH file just written at ``path``."""
    with open(path, "rb") as f:
        return parse_header(f.read(HEADER_SIZE)).dtype


def _empty_error(output: str, total: int, t: int, b: int) -> WriteError:
    """The refusal of an output of 0 batches, when the record count is known up front."""
    return WriteError(
        f"{output}: the output would hold 0 batches: the sources give "
        f"{plural(total, 'record')} of {t} tokens, fewer than batch_size={b}; pass "
        f"allow_empty=True (--allow-empty on the command line) to write a file without "
        f"batches, or use a smaller batch size or sequence length"
    )


class _FileRanges:
    """Which input file gave which range of a conversion's input records (module docstring).

    ``blocks()`` is the source's record stream; ``sources()``, once it is exhausted, the
    manifest's ``Source`` list, one per input file in reading order.
    """

    def __init__(self, src: RecordSource, options: dict[str, Any]) -> None:
        self.src = src
        self.paths: list[str] = source_files(src)
        self.counts: list[int] | None = None  # records per file, where known up front
        self._starts: list[int] = []  # text: stream token offset where each file begins
        self._doc_files: list[int] = []  # text: document index where each file begins
        self._stream = 0  # text: tokens (pack) or record slots (pad) streamed so far
        if isinstance(src, NanoGPTSource):
            self.paths = src.shards
            align, bos = src.align, src.bos_token
            self.counts = [
                BinShard(p, use_bos_index=src.use_bos_index).count_records(src.seq_len, align, bos)
                for p in self.paths
            ]
        elif isinstance(src, ArraySource):
            self.counts = [ArrayFile(p).count_records(src.seq_len) for p in self.paths]
        elif isinstance(src, TokenFileSource):
            self.paths = src.paths
            self.counts = src.record_counts()
        elif isinstance(src, TextSource):
            self._options = options
        else:
            raise IngestError(f"sharded output does not know the files of {src!r}")

    @property
    def total(self) -> int | None:
        """Records the stream yields, when known before reading it."""
        return None if self.counts is None else sum(self.counts)

    def blocks(self) -> Iterator[U32Block]:
        """The source's records: ``src.iter_blocks()``, or for text the same pipeline
        (documents, tokenizer, packer) with each file's start noted on the way."""
        if not isinstance(self.src, TextSource):
            return self.src.iter_blocks()
        src, opts = self.src, self._options
        mode: Mode = opts.get("mode", "pack")
        pad_id = opts.get("pad_id")
        if mode == "pad" and pad_id is None:
            pad_id = src.tokenizer.eos_id  # TextSource checked that there is one
        docs = self._documents(opts.get("text_field", "text"), bool(opts.get("per_line", False)))
        ids = tokenize_documents(docs, src.tokenizer, int(opts.get("workers", 1)))
        blocks = make_records(
            self._tokens(ids, mode),
            src.seq_len,
            bos_id=src.tokenizer.bos_id,
            mode=mode,
            pad_id=pad_id,
        )
        src.stats = blocks.stats
        return blocks

    def _documents(self, text_field: str, per_line: bool) -> Iterator[str]:
        count = 0
        for path in self.paths:
            self._doc_files.append(count)
            for doc in read_documents(glob.escape(path), field=text_field, per_line=per_line):
                count += 1
                yield doc

    def _tokens(
        self, ids: Iterable[npt.NDArray[np.uint32]], mode: Mode
    ) -> Iterator[npt.NDArray[np.uint32]]:
        """The tokenized documents, passed through; each file's start (in stream tokens:
        BOS and ids in pack mode, ``seq_len`` per document in pad mode) noted as its first
        document comes by (documents are read ahead of their ids, so every file that starts
        at or before document ``d`` is known when ``d``'s ids arrive)."""
        per_record = mode == "pad"
        t = self.src.seq_len
        for d, doc in enumerate(ids):
            self._note_files(d)
            self._stream += t if per_record else 1 + int(doc.size)
            yield doc

    def _note_files(self, doc: int | None) -> None:
        """Note the stream offset as the start of every file whose first document is at or
        before document ``doc`` (``None``: every file left, at the end of the stream)."""
        files = self._doc_files
        while len(self._starts) < len(files) and (doc is None or files[len(self._starts)] <= doc):
            self._starts.append(self._stream)

    def sources(self, records: int) -> list[Source]:
        """Each input file and its range of the ``records`` input records the stream gave."""
        paths = [os.path.abspath(p) for p in self.paths]
        if self.counts is not None:
            if sum(self.counts) != records:
                raise IngestError(
                    f"the sources gave {plural(records, 'record')}, their headers and shapes "
                    f"promised {sum(self.counts):,}: a source changed during the conversion"
                )
            ends = np.cumsum([0, *self.counts]).tolist()
        else:
            self._note_files(None)  # the files with no document after the last one
            t = self.src.seq_len
            ends = [min(-(-start // t), records) for start in self._starts] + [records]
        return [
            Source(p, (int(a), int(z))) for p, a, z in zip(paths, ends[:-1], ends[1:], strict=True)
        ]


def _convert_sharded(
    src: RecordSource,
    kind: Kind,
    output: str,
    t: int,
    b: int,
    shard_batches: int,
    seed: int,
    progress: Progress | None,
    overwrite: bool,
    allow_empty: bool,
    options: dict[str, Any],
    plan: DtypePlan,
    manifest_version: int = MANIFEST_VERSION,
    prefixes: int = 1,
) -> ConvertSummary:
    """``convert`` into a dataset directory of shards of ``shard_batches`` batches."""
    inputs = source_files(src)
    check_dataset_output(output, overwrite=overwrite, inputs=inputs)
    files = _FileRanges(src, options)
    total = files.total
    if total is not None and total < b and not allow_empty:
        raise _empty_error(output, total, t, b)
    watch = TokenWatch(files.blocks(), src, plan)
    counted = _Counted(iter(watch), progress, total)
    manifest = write_sharded_dataset(
        output,
        counted,
        batch_size=b,
        seq_len=t,
        shard_batches=shard_batches,
        seed=seed,
        sources=lambda: files.sources(counted.records),
        overwrite=overwrite,
        allow_empty=allow_empty,
        inputs=inputs,
        dtype="auto" if plan.code is None else plan.code,
        manifest_version=manifest_version,
        prefixes=prefixes,
    )
    seconds = time.perf_counter() - counted.start
    kept = manifest.num_batches * b
    source_tokens, drops = conversion_drops(src, counted.records, kept, b, t)
    stats = getattr(src, "stats", None)
    size = sum(s.size for s in manifest.shards)
    metadata = [MANIFEST_NAME, CHECKSUMS_NAME, *([INDEX_NAME] if manifest.index else [])]
    size += sum(os.path.getsize(os.path.join(output, n)) for n in metadata)
    return ConvertSummary(
        output=output,
        kind=kind,
        records=kept,
        batches=manifest.num_batches,
        dropped_records=counted.records - kept,
        tokens=kept * t,
        output_bytes=size,
        seconds=seconds,
        records_read=counted.records,
        source_tokens=source_tokens,
        dropped_tokens=sum(d.tokens for d in drops),
        drops=drops,
        padding_fraction=None if stats is None else float(stats.padding_fraction),
        packing={} if stats is None else stats.to_dict(),
        shards=len(manifest.shards),
        dtype=DTYPE_NAMES[manifest.dtype],
        dtype_reason=final_reason(plan, manifest.dtype, watch.largest, src),
    )


def default_block_records(seq_len: int) -> int:
    """Records per source block (re-exported for benchmarks)."""
    return default_chunk_records(seq_len)
