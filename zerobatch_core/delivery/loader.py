"""``BatchNativeLoader``: the order, the cursor and the slicing of a file's or a dataset's batches.

An epoch walks every stored batch once: blocks of ``block_size`` consecutive batches in the
order ``SPEC.md`` pins (section 8 for a file, 14 for a dataset, where blocks never cross a
shard), and batches in storage order inside a block, so reads stay sequential for the kernel's
read-ahead while the block order changes every epoch. Training consumes that sequence of
samples one *step* (a global batch of ``global_batch_size`` samples, by default one stored
batch) at a time, and each reader serves only its slice of every step (``slicing.py``: data-
and context-parallel coordinates). The position is a cursor ``(epoch, step)``; ``state_dict``
saves it as plain integers with what it depends on, and ``load_state_dict`` resumes at exactly
the next step, in any process, with another number of ranks, or with a global batch size a
multiple or divisor of the saved one.

A *pass* is one ``iter()`` over the loader: it serves the rest of the cursor's epoch. After the
epoch's last step the cursor reads ``(epoch, steps)`` (epoch served, pass still open); it moves
to ``(epoch + 1, 0)`` when the pass ends, i.e. when the consumer asks for the item after the
last one. A loader restored from a state taken while a pass was open finishes that pass first
(with nothing left to serve) and then starts the next epoch, exactly as the uninterrupted run
would have: this is what lets a framework that restores its own pass (torchdata's
``StatefulDataLoader``) resume at the last batch of an epoch without replaying or skipping one.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple, TypeGuard, cast

import numpy as np
import numpy.typing as npt
from zerobatch_spec import TOKEN_DTYPE, U32_MAX, U64_MAX

from ..arguments import int_arg
from ..datasets.dataset import Verify
from ..datasets.remote import RemoteVerify
from ..errors import StateError
from ..order import Order
from .buffers import BufferPool, ChunkStage, convert_into
from .documents import document_layout
from .slicing import Slicing
from .sources import BatchSource, Region, open_reader, source_token_dtype

OutputDType = Literal["native", "uint16", "uint32", "int32", "int64"]
LabelDType = Literal["int64", "uint32", "uint16", "native"]
OUTPUT_DTYPES: tuple[OutputDType, ...] = ("native", "uint16", "uint32", "int32", "int64")
"""What ``dtype`` accepts: ``"native"`` (the stored tokens, uint32 or uint16) or a dtype name."""
LABEL_DTYPES: tuple[LabelDType, ...] = ("int64", "uint32", "uint16", "native")
"""What ``label_dtype`` accepts."""
STATE_FORMAT = "zerobatch.BatchNativeLoader"
STATE_VERSION = 1
U32Batch = npt.NDArray[np.uint32]
Item = Any  # one batch array, an (inputs, labels) pair of arrays, or a dict of arrays
DEFAULT_BLOCK_SIZE = 256
ORDER_KEYS = ("seed", "block_size", "shuffle", "num_batches", "batch_size", "seq_len", "file_seed")
"""State keys that must equal the loader's own for a state to load (``SPEC.md`` section 9)."""
CHUNK_STEPS = 8
"""Consecutive steps the conversion stage converts with one copy (``[8, 32, 512]``: 1 MiB of
int64, which stays in the caches; 64 steps per chunk measured 0.87x and 256 steps 0.66x of 8)."""
CHUNK_DEPTH = 3
"""Chunks the conversion stage keeps converted ahead of the caller."""
CHUNK_SPARE = 4
"""Chunk buffers pooled beyond ``CHUNK_DEPTH``: the one being filled, the caller's current
chunk, and chunks whose last items a caller or a device stage still holds."""
CALLER_CHUNK_BYTES = 2 << 20
"""Bytes of converted tokens per chunk when the caller's thread converts (a widening of uint16
tokens to a 4-byte dtype): a 2 MiB chunk stays in the core's L2 cache for the caller to read.
Measured on a 2-core machine (2 MiB of L2 a core), summing every token of ``[32, 512]`` int32
batches of a cached 102 MB uint16 file, against int32 views of the uint32 file of the same
tokens: 2 MiB chunks 0.95x, 4 MiB 0.94x, 1 MiB 0.92x (256 KiB 0.6x). Widening on another
thread measured 0.2-0.9x (a ring of chunk buffers, or each chunk split between two threads:
the hand-overs of the interpreter lock cost more than the widening), and 0.6x on the stage's
thread of the int64 path (``benchmarks/widening_designs.py``)."""
CALLER_CHUNK_STEPS = 32
"""Steps per chunk at most when the caller's thread converts (small steps: bounded latency)."""

Source = BatchSource
Piece = tuple[int, int, int]  # stored batch index, first row, end row
Part = tuple[np.dtype[Any], int, int]  # a converted field of a chunk: its dtype and columns


def resolve_dtype(name: str, token: np.dtype[Any], what: str, path: str) -> str:
    """The concrete dtype name that ``name`` (``"native"`` or a name) serves from tokens of
    dtype ``token``. Tokens are widened, never narrowed: ``"uint16"`` from uint32 tokens is a
    ``ValueError``, since ids above 65,535 would not survive it."""
    if name == "native":
        return token.name
    if np.dtype(name).itemsize < token.itemsize:
        raise ValueError(
            f"{path}: {what}={name!r} would narrow the stored {token.name} tokens; use "
            f"'native', 'uint32', 'int32' or 'int64'"
        )
    return name


def conversion(name: str, token: np.dtype[Any]) -> np.dtype[Any] | None:
    """The dtype tokens of dtype ``token`` are copied into to serve dtype ``name``, or
    ``None`` where they are served as views: the stored tokens themselves, or uint32 tokens
    read as int32 (the same bits)."""
    if name == token.name or (name == "int32" and token == TOKEN_DTYPE):
        return None
    return np.dtype(name)


class Position(NamedTuple):
    """A cursor value: the epoch of the next item and the steps of it already served.

    ``step >= steps per epoch`` means the epoch has been served and its pass is still open.
    """

    epoch: int
    step: int


_INFINITY = float("inf")
"""Sorts after every step number: ``(step, _INFINITY)`` follows every range that starts at
``step``, whatever its end."""

RESTART_GAP = 5000
"""Serving positions a pass walks through the order to reach its next step; a step further
ahead (a skipped range, a worker's share of a long split) starts the order anew there."""


def _u64(name: str, value: object) -> int:
    return int_arg(name, value, 0, U64_MAX)


def normalize_skips(skip_steps: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """``((first, end), ...)`` of global steps to skip, checked, sorted and merged."""
    ranges = []
    for item in skip_steps:
        if isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError(f"skip_steps entries must be (first, end) pairs, got {item!r}")
        a = int_arg("skip_steps first step", item[0], 0)
        b = int_arg("skip_steps end step", item[1], 0)
        if b <= a:
            raise ValueError(f"skip_steps range ({a}, {b}) is empty: its end must exceed its first")
        ranges.append((a, b))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return tuple(merged)


def source_identity(source: Source) -> dict[str, Any]:
    """What a state records about its source, so that it loads into that source only: its
    ``identity()`` (a dataset's manifest digest; a file's size, header digest and a sample of
    ``FINGERPRINT_SLOTS`` slots, ``files.reader.file_identity``)."""
    return source.identity()


LOADER_KINDS: list[tuple[Callable[[object], bool], type[BatchNativeLoader]]] = []
"""``(test, subclass)``: ``BatchNativeLoader(source, ...)`` builds the first ``subclass`` whose
``test(source)`` holds (``register_loader_kind``)."""


def register_loader_kind(test: Callable[[object], bool], kind: type[BatchNativeLoader]) -> None:
    """Have ``BatchNativeLoader(source, ...)`` build a ``kind`` for every source ``test``
    accepts: a subclass that serves a kind of source through the same protocol with resume
    rules of its own (``mixture_loader.MixtureLoader``), chosen where the user names only the
    core loader."""
    LOADER_KINDS.append((test, kind))


class BatchNativeLoader:
    """Iterate a file's or a dataset's batches in block-shuffled order, one epoch per pass.

    ``path`` is an LLMBATCH file, a dataset directory (``dataset.py``; ``verify`` sets its
    checksum checks), a URL or a live dataset (``sources.open_reader``: ``s3://``, ``gs://``,
    ``az://``, ``http(s)://``, ``file://``; read as byte ranges of this rank's share, see
    ``remote.py``) or an open reader of any of them. ``dtype`` picks the output:
    ``"native"`` (the default: zero-copy views of the stored tokens, uint32, or uint16 for a
    dtype 1 file or dataset; ``dtype`` then reads as that name), ``"uint32"``, ``"int32"``
    (exact for ids below 2**31), ``"int64"`` or ``"uint16"`` (uint16 sources only: tokens are
    widened, never narrowed). Views of the stored tokens cost nothing: the native dtype, and
    ``"int32"`` of uint32 tokens (the same bits). Every other output is a widened copy (uint16
    to uint32, int32 or int64; uint32 to int64) in an array reused only once nothing refers to
    the previous batch made in it. ``token_dtype`` is the source's stored dtype. ``seed``
    defaults to the file's (or the dataset's) seed. ``shuffle=False`` serves storage order.
    With ``next_token=True`` each item is ``(inputs, labels)``: the samples without their last
    token (in ``dtype``) and without their first (int64, as cross-entropy wants;
    ``label_dtype="native"``, or the stored dtype's name, serves them unconverted, views of the
    file where the step allows, for a caller that widens them elsewhere, e.g. on a device;
    ``"uint32"`` from uint16 tokens is a widened copy). ``label_dtype`` is resolved like
    ``dtype``.
    With ``bos_id`` set (packed rows whose documents
    start with that token), each item is a dict: ``tokens`` (or ``inputs`` and ``labels``)
    plus the document layout of the tokens (or inputs) as ``segment_ids``, ``positions`` and
    ``cu_seqlens`` (see ``documents.py``).

    Parallelism (``slicing.py``): every rank walks the same order. ``rank`` of ``world_size``
    (data parallel) gets its own ``global_batch_size // world_size`` samples of each step;
    ``context_rank`` of ``context_size`` (context parallel) gets token chunk ``context_rank``
    of them, or with ``zigzag`` chunks ``c`` and ``2C - 1 - c`` of ``2C``. One step of all
    ranks is exactly one global batch. ``global_batch_size`` (default: the stored batch size)
    may be a multiple of it (a step spans several stored batches; ``world_size *
    batch_size`` gives each rank whole stored batches) or a divisor (one stored batch serves
    several steps). ``skip_steps`` lists ``(first, end)`` ranges of global steps (``epoch *
    len(loader) + step``) that are not served; every other step is unchanged. Worker
    processes of one rank split the served steps instead (``split_workers``): worker ``w`` of
    ``k`` serves the ``w``-th, ``(w + k)``-th, ... from the cursor on, the round-robin order in
    which a PyTorch ``DataLoader`` collects them.

    The loader advances its cursor as it hands out items, and a pass that ends moves it to the
    next epoch, so a plain second ``for`` loop sees the next epoch's order. ``set_epoch(e)``
    moves to the start of epoch ``e`` (and keeps the position if ``e`` is already the current
    epoch, so the usual ``set_epoch`` loop resumes correctly). Moving the cursor from outside
    (``set_epoch``, ``load_state_dict``) ends a pass in progress.

    Conversions (widened batches, and the int64 labels of ``next_token``) are made in chunks:
    consecutive steps of a block are converted with one copy into a pooled chunk buffer, and
    items are views of that chunk (inputs and labels of one dtype both of one ``[rows, T]`` row
    block; of two dtypes, one chunk buffer each). Where a field widens to int64 (twice the
    bytes of a uint32 view), a background thread converts ``CHUNK_STEPS`` steps per chunk a few
    chunks ahead; where every conversion is a widening of uint16 tokens to a 4-byte dtype
    (int32, uint32: the bytes a uint32 view would have been read anyway), the caller's thread
    converts chunks of about ``CALLER_CHUNK_BYTES`` when it needs them, which measured faster
    than any hand-over between threads. Either way a uint16 source serves its int32 or int64
    batches about as fast as a uint32 source of the same tokens, from half the bytes of page
    cache, disk or network. A chunk buffer is reused only once no item
    made from it is alive, so batches a caller keeps are never overwritten (keeping one item
    keeps its whole chunk in memory). The cursor still counts only the items handed out; the
    thread stops when the pass ends or the cursor is moved. Steps made of several stored
    batches or column ranges convert on the caller's thread into pooled arrays.

    This is the core's low-level loader (NumPy arrays, explicit coordinates). Training loops
    normally use a ``BatchStream`` (``stream.py``) or a framework adapter built on it.

    >>> loader = BatchNativeLoader("train.batch", block_size=64)  # doctest: +SKIP
    >>> for epoch in range(3):  # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         train_step(batch)
    """

    def __new__(cls, path: object = None, *args: Any, **kwargs: Any) -> BatchNativeLoader:
        """A registered subclass for the sources it serves (``register_loader_kind``)."""
        if cls is BatchNativeLoader:
            for test, kind in LOADER_KINDS:
                if test(path):
                    return super().__new__(kind)
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike[str] | Source,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        dtype: OutputDType = "native",
        next_token: bool = False,
        rank: int = 0,
        world_size: int = 1,
        bos_id: int | None = None,
        context_rank: int = 0,
        context_size: int = 1,
        zigzag: bool = False,
        global_batch_size: int | None = None,
        skip_steps: Iterable[Sequence[int]] = (),
        slicing: Slicing | None = None,
        verify: Verify | RemoteVerify | None = None,
        label_dtype: LabelDType = "int64",
    ) -> None:
        if dtype not in OUTPUT_DTYPES:
            names = ", ".join(map(repr, OUTPUT_DTYPES))
            raise ValueError(f"dtype must be one of {names}, got {dtype!r}")
        if label_dtype not in LABEL_DTYPES:
            names = ", ".join(map(repr, LABEL_DTYPES))
            raise ValueError(f"label_dtype must be one of {names}, got {label_dtype!r}")
        block_size = int_arg("block_size", block_size, 1)
        seed = None if seed is None else _u64("seed", seed)
        epoch = _u64("epoch", epoch)
        bos_id = None if bos_id is None else int_arg("bos_id", bos_id, 0, U32_MAX)
        if slicing is None:
            slicing = Slicing(rank, world_size, context_rank, context_size, 1, bool(zigzag))
        self.skip_steps = normalize_skips(skip_steps)
        opened = not isinstance(path, BatchSource)
        source = path if isinstance(path, BatchSource) else open_reader(path, verify=verify)
        self.source = self.reader = source
        try:
            if next_token and source.seq_len < 2:
                raise ValueError(f"{source.path}: next_token needs seq_len >= 2")
            token = source_token_dtype(source)
            self.token_dtype: np.dtype[np.unsignedinteger] = token
            """NumPy dtype of the source's stored tokens (uint32 or uint16)."""
            resolved = resolve_dtype(dtype, token, "dtype", source.path)
            self.dtype: OutputDType = cast(OutputDType, resolved)
            self.next_token = bool(next_token)
            label = resolve_dtype(label_dtype, token, "label_dtype", source.path)
            self.label_dtype: LabelDType = cast(LabelDType, label)
            if bos_id is not None and bos_id > np.iinfo(token).max:
                raise ValueError(
                    f"{source.path}: bos_id {bos_id} cannot occur in {token.name} tokens "
                    f"(at most {np.iinfo(token).max})"
                )
            self.bos_id = bos_id
            self.width = source.seq_len - 1 if self.next_token else source.seq_len
            if bos_id is not None and not slicing.whole_rows:
                raise ValueError(
                    "bos_id needs whole rows in order: the document layout of a token chunk "
                    "depends on the tokens before it (use context_size=1 with bos_id)"
                )
            self.slicing = slicing
            self._set_global_batch(global_batch_size)
        except BaseException:
            if opened:
                source.close()
            raise
        self.rank, self.world_size = slicing.dp_rank, slicing.dp_size
        self.block_size = block_size
        self.shuffle = bool(shuffle)
        self.seed = source.seed if seed is None else seed
        self.order: Order = source.order(block_size, self.seed, self.shuffle)
        self._epoch, self._step = epoch, 0
        self._stride, self._phase, self._origin = 1, 0, Position(epoch, 0)
        self._serial = 0  # bumped by every new pass: an older pass still running ends
        self.bytes_read = 0
        """Token bytes this loader has read from its source (its share of each step)."""
        self._identity: dict[str, Any] | None = None

    def _set_global_batch(self, global_batch_size: int | None) -> None:
        b = self.source.batch_size
        g = b if global_batch_size is None else int_arg("global_batch_size", global_batch_size, 1)
        self.slicing.check(g, b, self.width)
        self.global_batch_size = g
        self.per_step = g // self.slicing.dp_size
        first = self.slicing.dp_rank * self.per_step
        self.rows = slice(first, first + self.per_step)  # of the step's samples
        self.columns = self.slicing.columns(self.width)
        # One stored batch per step and one column range: items are views of one batch.
        self._simple = g == b and len(self.columns) == 1
        extra = 1 if self.next_token else 0  # labels reach one token past each range
        read = sum(hi - lo + extra for lo, hi in self.columns)
        self.bytes_per_step = self.per_step * read * self.token_dtype.itemsize
        self.batch_shape = (self.per_step, sum(hi - lo for lo, hi in self.columns))
        shape = self.batch_shape
        # What each field is copied into (None: served as views of the stored tokens).
        self._inputs_to = conversion(self.dtype, self.token_dtype)
        self._labels_to = conversion(self.label_dtype, self.token_dtype) if extra else None
        self._inputs_pool = None if self._inputs_to is None else BufferPool(shape, self._inputs_to)
        self._labels_pool = None if self._labels_to is None else BufferPool(shape, self._labels_to)
        # Simple steps that convert are made in chunks (``_chunks``): the converted columns of a
        # step's rows: its region plus the labels' extra token when inputs and labels convert
        # to one dtype, else each converted field's own columns (labels start a token later).
        converts = self._inputs_to is not None or self._labels_to is not None
        self._chunked = self._simple and converts
        if self.source.fetches:  # fetches dominate: convert on the caller
            self._chunked = False
        lo, hi = self.columns[0]
        self._shared_chunk = self._inputs_to is not None and self._inputs_to == self._labels_to
        parts: list[Part] = []
        if self._shared_chunk:
            assert self._inputs_to is not None
            parts.append((self._inputs_to, lo, hi + 1))
        else:
            if self._inputs_to is not None:
                parts.append((self._inputs_to, lo, hi))
            if self._labels_to is not None:
                parts.append((self._labels_to, lo + 1, hi + 1))
        self._chunk_parts = parts
        # A second core pays off for int64 (twice the bytes of the stored uint32 tokens); a
        # widening of uint16 tokens to 4 bytes costs less than the hand-over between threads.
        self._background = any(to.itemsize > TOKEN_DTYPE.itemsize for to, _, _ in parts)
        if self._background:
            self._chunk_steps = CHUNK_STEPS
        else:
            step_bytes = sum(to.itemsize * (c1 - c0) for to, c0, c1 in parts) * self.per_step
            self._chunk_steps = max(
                1, min(CALLER_CHUNK_STEPS, CALLER_CHUNK_BYTES // max(1, step_bytes))
            )
        self._chunk_pools: tuple[int, list[BufferPool]] | None = None  # (pid, pools)
        self._stage: ChunkStage[Any] | None = None

    # -- order -----------------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        """Steps per epoch, over all workers: the epoch's samples over the global batch size
        (a Python integer: a live dataset's endless epoch has more than ``len`` can return)."""
        return self.source.num_batches * self.source.batch_size // self.global_batch_size

    def __len__(self) -> int:
        """``steps_per_epoch`` (``len`` raises ``OverflowError`` beyond ``sys.maxsize``)."""
        return self.steps_per_epoch

    @property
    def epoch(self) -> int:
        """Epoch of the next item (of the open pass, if its epoch has just been served)."""
        return self._epoch

    @property
    def step(self) -> int:
        """Serving position of the next item in the current epoch."""
        return self._step

    @property
    def position(self) -> Position:
        """The cursor, ``(epoch, step)``."""
        return Position(self._epoch, self._step)

    @property
    def num_workers(self) -> int:
        """Worker processes the steps are split over (1 unless ``split_workers`` was called)."""
        return self._stride

    @property
    def worker(self) -> int:
        """This copy's worker index among ``num_workers``."""
        return self._phase

    def global_step(self, position: Position | None = None) -> int:
        """``epoch * steps_per_epoch + step`` of ``position`` (default: the cursor)."""
        epoch, step = self.position if position is None else position
        return epoch * self.steps_per_epoch + step

    def _served_steps(
        self, epoch: int, start: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> Iterator[int]:
        """Steps of ``epoch`` from ``start`` on that ``skips`` (default: this loader's) do not
        skip, continuing past the end of the epoch (where nothing is skipped). A skipped range
        is jumped over, not walked: the cost of each step is one search of the ranges."""
        if not (self.skip_steps if skips is None else skips):
            yield from itertools.count(start)
            return
        step = start
        while True:
            step = self._nth_served(epoch, step, 0, skips)
            _, following = self._skip_at(epoch, step, skips)
            if following <= step:  # past the epoch's end: every step from here on
                yield from itertools.count(step)
                return
            yield from range(step, following)  # served up to the next skipped range
            step = following

    def _skip_at(
        self, epoch: int, step: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> tuple[int, int]:
        """``(end, next)``: where the skipped range holding ``step`` of ``epoch`` ends (``step``
        if none holds it) and where the next one begins (the epoch's end if none), both as
        steps of ``epoch`` and at most the epoch's end: past it nothing is skipped."""
        ranges = self.skip_steps if skips is None else skips
        n = self.steps_per_epoch
        if step >= n:
            return step, step
        base = epoch * n
        i = bisect.bisect_right(ranges, (base + step, _INFINITY)) - 1
        if i >= 0 and ranges[i][0] <= base + step < ranges[i][1]:
            return min(ranges[i][1] - base, n), step
        following = ranges[i + 1][0] - base if i + 1 < len(ranges) else n
        return step, min(following, n)

    def _nth_served(
        self, epoch: int, start: int, m: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> int:
        """The ``m``-th (from 0) served step of ``epoch`` at or after ``start``, in as many
        searches as skipped ranges it passes (never one per step)."""
        step = start
        while True:
            end, following = self._skip_at(epoch, step, skips)
            if end > step:  # inside a skipped range: jump past it
                step = end
                continue
            if following <= step or m < following - step:  # past the epoch, or before a range
                return step + m
            m -= following - step
            step = following

    def _count_served(
        self, epoch: int, lo: int, hi: int, skips: tuple[tuple[int, int], ...] | None = None
    ) -> int:
        """Served steps of ``epoch`` in ``[lo, hi)``: two searches of the skipped ranges."""
        ranges = self.skip_steps if skips is None else skips
        n = self.steps_per_epoch
        base = epoch * n
        below = _SkipTotals.of(ranges)
        a, b = base + min(lo, n), base + min(max(lo, hi), n)
        return max(0, hi - lo) - (below(b) - below(a))

    def _owned(self, epoch: int, start: int) -> Iterator[int]:
        """This copy's steps of ``epoch`` from ``start`` on (past the end: where its cursor
        would go next), the worker split counted over served steps from the split's origin.
        Computed, not walked: each step costs a search of the skipped ranges."""
        if self._stride == 1:
            return self._served_steps(epoch, start)
        return self._split_steps(epoch, start)

    def _split_steps(self, epoch: int, start: int) -> Iterator[int]:
        """This worker's steps from ``start`` on: its first, then every ``k``-th served one."""
        k = self._stride
        step = self._first_owned(epoch, start, k, self._phase)
        while True:
            yield step
            step = self._nth_served(epoch, step + 1, k - 1)

    def _first_owned(
        self,
        epoch: int,
        start: int,
        workers: int,
        worker: int,
        skips: tuple[tuple[int, int], ...] | None = None,
        origin: int | None = None,
    ) -> int:
        """The first step at or after ``start`` that worker ``worker`` of ``workers`` serves:
        the served steps from the split's origin are dealt out round-robin."""
        if origin is None:
            origin = self._origin.step if self._origin.epoch == epoch else 0
        start = max(start, origin)
        j = self._count_served(epoch, origin, start, skips)  # served steps before start
        return self._nth_served(epoch, start, (worker - j) % workers, skips)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is already the current epoch)."""
        e = _u64("epoch", epoch)
        if e != self._epoch:
            self._epoch, self._step = e, next(self._owned(e, 0))
            self._new_serial()

    def seek(self, position: Position) -> None:
        """Move the cursor to ``position`` (one of this copy's steps); ends a pass in progress."""
        self._epoch, self._step = position
        self._new_serial()

    def after(self, position: Position, steps: int = 1) -> Position:
        """The cursor after serving ``steps`` more items from ``position`` within its pass."""
        if self._stride == 1 and not self.skip_steps:
            return Position(position.epoch, position.step + steps)
        epoch, step = position
        if self._stride == 1:
            return Position(epoch, self._nth_served(epoch, step, steps))
        first = self._first_owned(epoch, step, self._stride, self._phase)
        return Position(epoch, self._nth_served(epoch, first, steps * self._stride))

    def next_pass(self, position: Position) -> Position:
        """Where a pass that ends at ``position`` leaves the cursor: the next epoch if served."""
        if next(self._owned(*position)) >= self.steps_per_epoch:
            e = _next_epoch(position.epoch)
            return Position(e, next(self._owned(e, 0)))
        return position

    def split_workers(self, worker: int, num_workers: int) -> None:
        """Serve only every ``num_workers``-th served step, from the ``worker``-th on.

        Called once in each worker process. A loader restored from a worker's own state keeps
        it; a state saved with a different worker layout cannot be split again.
        """
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} is outside num_workers {num_workers}")
        if (self._stride, self._phase) == (num_workers, worker):
            return
        if self._stride != 1:
            raise StateError(
                f"loader already split as worker {self._phase} of {self._stride}; cannot "
                f"become worker {worker} of {num_workers}"
            )
        self._stride, self._phase, self._origin = num_workers, worker, self.position
        self._step = next(self._owned(self._epoch, self._step))

    def epoch_order(self, epoch: int | None = None) -> npt.NDArray[np.int64]:
        """Stored batch indices of a whole epoch in serving order."""
        return self.order.epoch_order(self._epoch if epoch is None else _u64("epoch", epoch))

    def _indices(self, epoch: int, start: int) -> Iterator[int]:
        """Stored batch indices from position ``start`` on; each next block is read ahead and
        its file checked once (a file truncated since it was opened raises here)."""
        for block in self._blocks(epoch, start):
            yield from block

    def _blocks(self, epoch: int, start: int) -> Iterator[range]:
        """The stored indices of each block from position ``start`` on, the next block read
        ahead while one is served and each block's file checked before it is."""
        spans = self.order.spans(epoch, start)
        current = next(spans, None)
        if current is not None:
            self._check_size(current.start)
            self.source.read_ahead(current.start, current.stop)
        while current is not None:
            upcoming = next(spans, None)
            if upcoming is not None:  # read the next block while this one is served
                self.source.read_ahead(upcoming.start, upcoming.stop)
            yield range(current.start, current.stop)
            if upcoming is not None:
                self._check_size(upcoming.start)
            current = upcoming

    def _check_size(self, index: int) -> None:
        """Raise if the file holding stored batch ``index`` shrank since it was opened."""
        self.source.check_size(index)

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Item]:
        """Serve the rest of the current epoch, advancing the cursor with every item.

        The pass ends, and the cursor moves to the next epoch, when the epoch is exhausted.
        Moving the cursor from outside (``set_epoch``, ``load_state_dict``) ends the pass.
        """
        self._new_serial()
        return self._pass(self._serial, self._epoch, self._step)

    def _new_serial(self) -> None:
        """End the pass in progress (its generator sees a new serial) and its chunk stage."""
        self._serial += 1
        stage, self._stage = self._stage, None
        if stage is not None:
            stage.close()

    def _pass(self, serial: int, epoch: int, start: int) -> Iterator[Item]:
        n = self.steps_per_epoch
        owned = self._owned(epoch, start)
        step = next(owned)
        views = self._all_views() if step < n and not self._background else None
        every = self._stride == 1 and not self.skip_steps
        if views is not None and every and self._inputs_to is not None:
            yield from self._widened_pass(serial, epoch, step, views)
        elif step < n and self._chunked:
            yield from self._chunked_pass(serial, epoch, step, owned)
        elif views is not None and every:
            # Every step served, one view each: index the whole-file view block by block,
            # with no per-step generator work (the loop's cost is this loop's own).
            per_step = self.bytes_per_step
            for block in self._blocks(epoch, step):
                for index in block:
                    if self._serial != serial or self._epoch != epoch:
                        return
                    step += 1
                    self._step = step
                    self.bytes_read += per_step
                    yield views[index]
                    if self._serial != serial:
                        return
        elif step < n:
            for pieces, step_after in self._ahead(self._pieces(epoch, step, owned)):
                if self._serial != serial or self._epoch != epoch:
                    return
                if views is not None:
                    item = views[pieces[0][0]]
                    self.bytes_read += self.bytes_per_step
                else:
                    item = self._item(pieces)
                self._step = step_after
                yield item
                if self._serial != serial:
                    return
        if (self._epoch, self._serial) == (epoch, serial):  # not moved from outside
            e = _next_epoch(epoch)
            self._epoch, self._step = e, next(self._owned(e, 0))

    def _widened_pass(
        self, serial: int, epoch: int, step: int, views: npt.NDArray[Any]
    ) -> Iterator[Item]:
        """Every step served, each a plain batch of a single file widened on the caller's
        thread: a run of up to ``_chunk_steps`` batches of a block is widened with one copy into
        a pooled chunk buffer, and the items are its rows (``views``: the stored batches)."""
        (pool,) = self._pools()
        size, per_step = self._chunk_steps, self.bytes_per_step
        for block in self._blocks(epoch, step):
            for first in range(block.start, block.stop, size):
                last = min(first + size, block.stop)
                chunk = pool.take()[: last - first]
                np.copyto(chunk, views[first:last], casting="safe")
                for item in chunk:
                    if self._serial != serial or self._epoch != epoch:
                        return
                    step += 1
                    self._step = step
                    self.bytes_read += per_step
                    yield item
                    if self._serial != serial:
                        return
                del chunk, item  # the buffer is free once the caller lets go of the items too

    def _chunked_pass(
        self, serial: int, epoch: int, step: int, owned: Iterator[int]
    ) -> Iterator[Item]:
        """The items of a pass whose conversions are made in chunks: ahead of the caller by a
        ``ChunkStage`` (a field widened to int64), else on the caller's thread as needed."""
        chunks = self._chunks(epoch, step, owned)
        stage = ChunkStage(chunks, CHUNK_DEPTH) if self._background else None
        self._stage = stage
        try:
            for chunk in chunks if stage is None else stage:
                for item, step_after in chunk:
                    if self._serial != serial or self._epoch != epoch:
                        return
                    self.bytes_read += self.bytes_per_step
                    self._step = step_after
                    yield item
                    if self._serial != serial:
                        return
                del chunk, item  # the chunk's buffer is free once the caller lets go too
        finally:
            if stage is not None:
                stage.close()
                if self._stage is stage:
                    self._stage = None

    def _chunks(
        self, epoch: int, step: int, owned: Iterator[int]
    ) -> Iterator[list[tuple[Item, int]]]:
        """Lists of ``(item, step after it)`` (made on the stage's thread, or the caller's) for
        runs of at most ``_chunk_steps`` steps whose stored batches are evenly spaced
        (consecutive in a block, or a worker's share of it), each run converted with one copy."""
        size = self._chunk_steps
        if self._stride == 1 and not self.skip_steps:  # every step served: cut blocks in runs
            for block in self._blocks(epoch, step):
                for first in range(block.start, block.stop, size):
                    k = min(size, block.stop - first)
                    yield self._make_chunk([(first + j, step + j + 1) for j in range(k)])
                    step += k
            return
        run: list[tuple[int, int]] = []  # (stored index, step after it)
        for pieces, step_after in self._pieces(epoch, step, owned):
            index = pieces[0][0]
            if run and not _continues(run, index):
                yield self._make_chunk(run)
                run = []
            run.append((index, step_after))
            if len(run) == size:
                yield self._make_chunk(run)
                run = []
        if run:
            yield self._make_chunk(run)

    def _make_chunk(self, run: list[tuple[int, int]]) -> list[tuple[Item, int]]:
        """Convert one run of steps into pooled chunk buffers; the run's items as views."""
        source, rows = self.source, self.rows
        lo, hi = self.columns[0]
        end = hi + (1 if self.next_token else 0)
        first, k = run[0][0], len(run)
        gap = run[1][0] - first if k > 1 else 1
        regions: list[U32Batch] | None = None
        parts, pools = self._chunk_parts, self._pools()
        # The chunk buffers are taken once their slots have been read (a dataset's shards
        # opened and checked): their size comes from the manifest's shape until then.
        view = source.view_batches(first, first + gap * (k - 1) + 1)
        if view is not None:  # one strided view of the mapping, one copy per converted field
            block = view[::gap, rows]
            chunks = []
            for (_, c0, c1), pool in zip(parts, pools, strict=True):
                chunk = pool.take()[:k]
                np.copyto(chunk, block[:, :, c0:c1], casting="safe")
                chunks.append(chunk)
            viewed = self._inputs_to is None or (self.next_token and self._labels_to is None)
            if viewed or self.bos_id is not None:
                regions = list(block[:, :, lo:end])
        else:  # a dataset checks each slot as it reads it: one copy per step and field
            regions = [source.read_batch(i)[rows, lo:end] for i, _ in run]
            chunks = [pool.take()[:k] for pool in pools]
            for j, region in enumerate(regions):
                for (_, c0, c1), chunk in zip(parts, chunks, strict=True):
                    np.copyto(chunk[j], region[:, c0 - lo : c1 - lo], casting="safe")
        after = [step_after for _, step_after in run]
        if regions is None:  # every field converted: views made by NumPy in one go
            items: Iterable[Any]
            if self._shared_chunk:
                items = zip(chunks[0][:, :, :-1], chunks[0][:, :, 1:], strict=True)
            elif len(chunks) == 2:
                items = zip(chunks[0], chunks[1], strict=True)
            else:
                items = chunks[0]
            return list(zip(items, after, strict=True))
        return [
            (self._chunk_item(regions[j], [chunk[j] for chunk in chunks]), step_after)
            for j, step_after in enumerate(after)
        ]

    def _chunk_item(self, region: U32Batch, converted: list[npt.NDArray[Any]]) -> Item:
        """One step's item from its converted fields (``_chunk_parts``, in order) and its
        source region (for fields served as views, and for the document layout)."""
        inputs: npt.NDArray[Any]
        labels: npt.NDArray[Any] | None = None
        fields = iter(converted)
        if self._shared_chunk:  # inputs and labels of one dtype share the chunk's columns
            both = next(fields)
            inputs, labels = both[:, :-1], both[:, 1:]
        else:
            if self._inputs_to is not None:
                inputs = next(fields)
            else:
                inputs = self._convert(region[:, :-1] if self.next_token else region)
            if self.next_token:
                labels = next(fields) if self._labels_to is not None else region[:, 1:]
        if self.bos_id is None:
            return inputs if labels is None else (inputs, labels)
        layout = document_layout(region[:, :-1] if self.next_token else region, self.bos_id)
        item = {"tokens": inputs} if labels is None else {"inputs": inputs, "labels": labels}
        item["segment_ids"] = layout.segment_ids
        item["positions"] = layout.positions
        item["cu_seqlens"] = layout.cu_seqlens
        return item

    def _pools(self) -> list[BufferPool]:
        """This process's chunk buffers, one pool per converted field (a forked worker makes
        its own)."""
        pid = os.getpid()
        if self._chunk_pools is None or self._chunk_pools[0] != pid:
            pools = [
                BufferPool(
                    (self._chunk_steps, self.per_step, c1 - c0), to, CHUNK_DEPTH + CHUNK_SPARE
                )
                for to, c0, c1 in self._chunk_parts
            ]
            self._chunk_pools = (pid, pools)
        return self._chunk_pools[1]

    def __getstate__(self) -> dict[str, Any]:
        """Copies sent to other processes leave this process's chunk stage and buffers here."""
        state = self.__dict__.copy()
        state["_stage"] = state["_chunk_pools"] = None
        return state

    def _pieces(
        self, epoch: int, step: int, owned: Iterator[int]
    ) -> Iterator[tuple[list[Piece], int]]:
        """For each of this copy's steps from ``step`` on: its stored-batch pieces and the step
        after it. A piece is ``(stored index, first row, end row)`` of this rank's samples."""
        n, b, g, per = (
            self.steps_per_epoch,
            self.source.batch_size,
            self.global_batch_size,
            self.per_step,
        )
        first_sample = step * g + self.rows.start
        position = first_sample // b  # stored position of the next index the iterator gives
        indices = self._indices(epoch, position)
        if self._simple:  # one stored batch per step: its index, at position step
            while True:
                for index in indices:
                    if position == step:
                        nxt = next(owned)
                        yield [(index, self.rows.start, self.rows.stop)], nxt
                        if nxt >= n:
                            return
                        step = nxt
                        if step - position > RESTART_GAP:  # far ahead: start the order there
                            position, indices = step, self._indices(epoch, step)
                            break
                    position += 1
                else:
                    return
        current = -1
        index = 0
        while step < n:
            a = step * g + self.rows.start
            end = a + per
            pieces: list[Piece] = []
            while a < end:
                p = a // b
                if current >= 0 and p - current > RESTART_GAP:  # far ahead: start there
                    indices, current = self._indices(epoch, p), -1
                while current < p:  # positions only increase: walk the iterator to p
                    index = next(indices)
                    current = p if current < 0 else current + 1
                r0 = a - p * b
                r1 = min(b, r0 + end - a)
                pieces.append((index, r0, r1))
                a += r1 - r0
            nxt = next(owned)
            yield pieces, nxt
            step = nxt

    def _all_views(self) -> npt.NDArray[Any] | None:
        """Every batch's rows as one ``[num_batches, rows, seq_len]`` view, when items are plain
        batches of a single file: the items themselves, or what ``_widened_pass`` widens."""
        if not self._simple or self.bos_id is not None or self.next_token or self.source.fetches:
            return None
        if self.columns != [(0, self.source.seq_len)]:
            return None
        every = self.source.view_batches(0, self.source.num_batches)
        if every is None:
            return None
        every = every[:, self.rows]
        viewed = self.dtype == "int32" and self._inputs_to is None  # uint32 bits as int32
        return every.view(np.int32) if viewed else every

    def _regions(self, pieces: list[Piece]) -> list[U32Batch]:
        """This rank's samples of one step, one array per column range (labels' token too)."""
        extra = 1 if self.next_token else 0
        out = []
        for lo, hi in self.columns:
            parts = [self._read_region(i, r0, r1, lo, hi + extra) for i, r0, r1 in pieces]
            out.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
        self.bytes_read += self.bytes_per_step
        return out

    def _read_region(self, index: int, r0: int, r1: int, lo: int, hi: int) -> U32Batch:
        """Rows ``r0..r1``, columns ``lo..hi`` of stored batch ``index``: a view of a local
        source's batch; a remote source fetches just those bytes (``remote.py``)."""
        return self.source.read_region(index, r0, r1, lo, hi)

    def _ahead(self, steps: Iterator[tuple[list[Piece], int]]) -> Iterator[tuple[list[Piece], int]]:
        """The steps as they come, each step's regions announced to the source first, so a
        source that fetches (``RemoteSource.ahead``) fetches them ahead of the loop."""
        # A single rank with steps smaller than a slot reads every row of each slot over
        # consecutive steps: the source fetches (and checks) the slot once, whole. A worker
        # serving only some of the steps reads only their rows (as a worker process's reopened
        # source does): fetching whole slots would multiply its bytes.
        whole_rows = self.slicing.dp_size == 1 and self.slicing.whole_rows and self._stride == 1
        extra = 1 if self.next_token else 0

        def regions(step: tuple[list[Piece], int]) -> list[Region]:
            pieces = step[0]
            return [(i, r0, r1, lo, hi + extra) for lo, hi in self.columns for i, r0, r1 in pieces]

        return self.source.ahead(steps, regions, whole_rows=whole_rows)

    def _item(self, pieces: list[Piece]) -> Item:
        regions = self._regions(pieces)
        if self.next_token:
            inputs = _join([r[:, :-1] for r in regions])
            labels = _join([r[:, 1:] for r in regions])
        else:
            inputs, labels = _join(regions), None
        if self.bos_id is not None:
            layout = document_layout(inputs, self.bos_id)
            item: dict[str, npt.NDArray[Any]] = (
                {"tokens": self._convert(inputs)}
                if labels is None
                else {"inputs": self._convert(inputs), "labels": self._convert_labels(labels)}
            )
            item["segment_ids"] = layout.segment_ids
            item["positions"] = layout.positions
            item["cu_seqlens"] = layout.cu_seqlens
            return item
        if labels is None:
            return self._convert(inputs)
        return self._convert(inputs), self._convert_labels(labels)

    def _convert_labels(self, labels: U32Batch) -> npt.NDArray[Any]:
        """Labels in ``label_dtype``: a pooled widened copy, or the stored tokens as they are."""
        if self._labels_to is None:
            return labels
        return convert_into(self._labels_pool, labels, self._labels_to)

    def item(self, index: int) -> Item:
        """The item this loader serves from stored batch ``index`` (one-batch steps only)."""
        if self.global_batch_size != self.source.batch_size:
            raise ValueError("item(index) needs global_batch_size == batch_size")
        return self._item([(index, self.rows.start, self.rows.stop)])

    def _convert(self, batch: U32Batch) -> npt.NDArray[Any]:
        """Stored tokens in the output dtype: views for the stored dtype (and int32 of uint32
        tokens, the same bits), else a pooled widened copy."""
        if self._inputs_to is None:
            return batch.view(np.int32) if self.dtype == "int32" else batch
        return convert_into(self._inputs_pool, batch, self._inputs_to)

    def served(self, position: Position) -> int:
        """How many steps a single copy serves from ``position`` to the end of its epoch."""
        epoch, step = position
        n = self.steps_per_epoch
        if step >= n:
            return 0
        lo, hi = epoch * n + step, epoch * n + n
        skipped = sum(max(0, min(b, hi) - max(a, lo)) for a, b in self.skip_steps)
        return n - step - skipped

    def copy(self) -> BatchNativeLoader:
        """A loader over the same open source with the same parameters and cursor, whose
        iteration does not move this one's (the source stays this loader's to close)."""
        twin = BatchNativeLoader(
            self.source,
            block_size=self.block_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self._epoch,
            dtype=self.dtype,
            next_token=self.next_token,
            label_dtype=self.label_dtype,
            bos_id=self.bos_id,
            global_batch_size=self.global_batch_size,
            skip_steps=self.skip_steps,
            slicing=self.slicing,
        )
        twin._identity = self._identity
        twin.load_state_dict(self.state_dict())
        return twin

    # -- checkpointing ---------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """The source's identity recorded in states (computed once)."""
        if self._identity is None:
            self._identity = source_identity(self.source)
        return self._identity

    def state_dict(self, position: Position | None = None) -> dict[str, Any]:
        """The cursor (or ``position``) and what it depends on, as JSON-serialisable values."""
        src = self.source
        epoch, step = self.position if position is None else position
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": epoch,
            "step": step,
            "num_workers": self._stride,
            "worker": self._phase,
            "origin": self._origin.step if self._origin.epoch == epoch else 0,
            "seed": self.seed,
            "block_size": self.block_size,
            "shuffle": self.shuffle,
            "num_batches": src.num_batches,
            "batch_size": src.batch_size,
            "seq_len": src.seq_len,
            "file_seed": src.seed,
            "global_batch_size": self.global_batch_size,
            "samples": min(step, self.steps_per_epoch) * self.global_batch_size,
            "skip_steps": [list(r) for r in self.skip_steps],
            "source": self.identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the cursor saved by ``state_dict``; the order parameters must match.

        The rank and world size may differ from the saving run's (the cursor counts steps), and
        so may the global batch size, by an integer factor, if the saved position falls on a
        step of the new size. The state's ``skip_steps`` are added to this loader's.
        """
        e, step, workers, worker, origin, skips = self.check_state(state)
        self._epoch, self._step = e, step
        self._stride, self._phase, self._origin = workers, worker, Position(e, origin)
        self.skip_steps = normalize_skips([*self.skip_steps, *skips])
        self._new_serial()

    def check_state(self, state: object) -> tuple[int, int, int, int, int, list[list[int]]]:
        """``(epoch, step, num_workers, worker, origin, skip_steps)`` of a state that fits this
        loader, its step in this loader's global batch size. ``StateError`` names what does
        not fit."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError(f"not a {STATE_FORMAT} state: {state!r:.200}")
        if state.get("version") != STATE_VERSION:
            raise StateError(f"unsupported loader state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in ORDER_KEYS:
            if state.get(key) != mine[key]:
                raise StateError(
                    f"{self.source.path}: state has {key}={state.get(key)!r} but this loader "
                    f"has {key}={mine[key]!r}"
                )
        if "source" in state and state["source"] != mine["source"]:
            raise StateError(
                f"{self.source.path}: the state was saved for another file or dataset of the "
                f"same shape (state {state['source']!r:.200}, this one {mine['source']!r:.200})"
            )
        e, step = state.get("epoch"), state.get("step")
        workers, worker = state.get("num_workers", 1), state.get("worker", 0)
        origin, skips = state.get("origin", 0), state.get("skip_steps", [])
        g = state.get("global_batch_size", mine["batch_size"])
        if not _is_int(e) or not 0 <= e <= U64_MAX:
            raise StateError(f"state epoch {e!r} is not an integer in [0, 2**64 - 1]")
        if not _is_int(workers) or not 1 <= workers <= U64_MAX or not _is_int(worker):
            raise StateError(f"state num_workers={workers!r}, worker={worker!r} are invalid")
        if not 0 <= worker < workers:
            raise StateError(f"state worker {worker} is outside num_workers {workers}")
        if not _is_int(g) or g < 1:
            raise StateError(f"state global_batch_size {g!r} is invalid")
        if not isinstance(skips, list):
            raise StateError(f"state skip_steps {skips!r:.100} is not a list of pairs")
        try:
            normalize_skips(skips)
        except (TypeError, ValueError) as err:
            raise StateError(f"state skip_steps: {err}") from None
        steps = mine["num_batches"] * mine["batch_size"] // g
        # A worker's next step can lie past the end of the epoch (nothing left for it).
        if not _is_int(step) or not 0 <= step < steps + workers:
            raise StateError(f"state step {step!r} is outside [0, {steps}]")
        if not _is_int(origin) or not 0 <= origin <= step:
            raise StateError(f"state origin {origin!r} is outside [0, step]")
        if workers > 1 and not self._owns(e, origin, workers, worker, step, skips):
            raise StateError(f"state step {step} is not one of worker {worker}'s steps")
        if g != self.global_batch_size:
            if workers != 1:
                raise StateError("a worker's state cannot change the global batch size")
            samples = min(step, steps) * g
            if samples % self.global_batch_size:
                raise StateError(
                    f"the state is {samples} samples into epoch {e}, not a whole number of "
                    f"steps of the new global batch size {self.global_batch_size}: resume "
                    f"with global_batch_size {g}, or at a step where the sizes line up"
                )
            step = samples // self.global_batch_size if step < steps else self.steps_per_epoch
        return e, step, workers, worker, origin, skips

    def _owns(
        self, epoch: int, origin: int, workers: int, worker: int, step: int, skips: list[list[int]]
    ) -> bool:
        """Whether worker ``worker`` of ``workers``, split at ``origin``, serves ``step``
        (counted, not walked: a state's step may be far into a long epoch)."""
        merged = normalize_skips([*self.skip_steps, *skips])
        first = self._first_owned(epoch, step, workers, worker, merged, origin)
        return first == step


class _SkipTotals:
    """How many global steps a tuple of merged skipped ranges skips below a step, in one
    search: the ranges' first steps and the running total of their lengths (kept for the
    last tuple asked about, which is nearly always the loader's own)."""

    _last: tuple[tuple[tuple[int, int], ...], _SkipTotals] | None = None

    def __init__(self, ranges: tuple[tuple[int, int], ...]) -> None:
        self.firsts = [a for a, _ in ranges]
        self.ranges = ranges
        self.totals = [0]
        for a, b in ranges:
            self.totals.append(self.totals[-1] + b - a)

    @classmethod
    def of(cls, ranges: tuple[tuple[int, int], ...]) -> _SkipTotals:
        last = cls._last
        if last is not None and last[0] is ranges:
            return last[1]
        totals = cls(ranges)
        cls._last = (ranges, totals)
        return totals

    def __call__(self, step: int) -> int:
        """Global steps below ``step`` that the ranges skip."""
        i = bisect.bisect_right(self.firsts, step) - 1
        if i < 0:
            return 0
        a, b = self.ranges[i]
        return self.totals[i] + min(b, step) - a


def _continues(run: list[tuple[int, int]], index: int) -> bool:
    """Whether stored batch ``index`` extends ``run`` with the same positive spacing."""
    last = run[-1][0]
    return index > last and (len(run) == 1 or index - last == run[1][0] - run[0][0])


def _join(parts: list[U32Batch]) -> U32Batch:
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def _next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: epochs are u64 and wrap, so the cursor stays representable."""
    return (epoch + 1) & U64_MAX


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
