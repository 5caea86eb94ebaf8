"""``convert``: any supported source into one LLMBATCH file, with progress and a summary.

Sources are recognised by their file names: nanoGPT ``.bin`` shards, NumPy ``.npy`` arrays, or
text (``.parquet``, ``.jsonl``/``.json``, ``.txt``) which is tokenized and packed. Records stream
through ``write_batch_dataset``, so memory stays bounded (see ``MEMORY_BOUND_BYTES``) and the
output is still globally shuffled by the spec's record permutation; the file appears atomically
at the end, so an interrupted conversion leaves nothing that looks valid, and a rerun simply
starts again (temporary files of a killed run are removed by the next write to the same path).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TextIO

from ..arguments import U32_MAX, int_arg
from ..errors import IngestError
from ..writer import CHUNK_BYTES, write_batch_dataset
from .arrays import ArraySource
from .nanogpt import Align, NanoGPTSource
from .packing import Mode
from .source import RecordSource, U32Block, default_chunk_records
from .text import TextSource

Kind = Literal["nanogpt", "npy", "text"]
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


@dataclass
class ConvertSummary:
    """What a conversion produced."""

    output: str
    kind: Kind
    records: int
    batches: int
    dropped_records: int
    tokens: int
    output_bytes: int
    seconds: float
    padding_fraction: float | None = None
    packing: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        """Tokens written per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "tokens_per_second": self.tokens_per_second}

    def lines(self) -> list[str]:
        """Human-readable summary lines."""
        out = [
            f"wrote {self.output}: {self.batches} batches, {self.records} records, "
            f"{self.tokens:,} tokens, {self.output_bytes / 2**20:.1f} MiB",
            f"  dropped remainder: {self.dropped_records} records "
            f"(not a multiple of the batch size)",
            f"  {self.tokens_per_second / 1e6:.1f}M tokens/s over {self.seconds:.1f} s",
        ]
        if self.padding_fraction is not None:
            out.append(f"  padding fraction: {self.padding_fraction:.4f}")
        return out


def detect_kind(paths: Sequence[str]) -> Kind:
    """The source kind all ``paths`` share (by suffix), or an error naming the odd one out."""
    kinds: set[Kind] = set()
    for p in paths:
        suffix = os.path.splitext(p)[1].lower()
        if suffix not in _SUFFIXES:
            raise IngestError(
                f"{p}: cannot tell the source kind from the suffix {suffix!r}; expected one of "
                f"{', '.join(sorted(_SUFFIXES))} (or pass kind=...)"
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
    align: Align = "contiguous",
    bos_token: int | None = None,
) -> RecordSource:
    """The ``RecordSource`` for ``sources`` (glob patterns allowed)."""
    if not sources:
        raise IngestError("no sources given")
    k = kind or detect_kind([os.fspath(s) for s in sources])
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


def convert(
    sources: Sequence[str],
    output: str,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    progress: Progress | None = None,
    **source_options: Any,
) -> ConvertSummary:
    """Convert ``sources`` to the LLMBATCH file ``output``; see ``open_source`` for options."""
    t = int_arg("seq_len", seq_len, 1, U32_MAX, IngestError)
    kind: Kind = source_options.pop("kind", None) or detect_kind([os.fspath(x) for x in sources])
    src = open_source(sources, t, kind=kind, **source_options)
    counted = _Counted(src.iter_blocks(), progress, src.num_records)
    batches = write_batch_dataset(output, counted, src.num_records, batch_size, t, seed)
    seconds = time.perf_counter() - counted.start
    stats = getattr(src, "stats", None)
    return ConvertSummary(
        output=output,
        kind=kind,
        records=counted.records,
        batches=batches,
        dropped_records=counted.records - batches * batch_size,
        tokens=batches * batch_size * t,
        output_bytes=os.path.getsize(output),
        seconds=seconds,
        padding_fraction=None if stats is None else float(stats.padding_fraction),
        packing={} if stats is None else stats.to_dict(),
    )


def default_block_records(seq_len: int) -> int:
    """Records per source block (re-exported for benchmarks)."""
    return default_chunk_records(seq_len)
