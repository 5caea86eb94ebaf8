"""``BatchStream``: the delivery loop, written once, that every framework adapter is built on.

A framework adapter is a converter (NumPy arrays to its own arrays) plus one surface, shared by
all of them and defined here:

* the constructor ``(source, *, block_size, shuffle, seed, epoch, dtype, next_token, rank,
  world_size, bos_id, prefetch)``, everything past the source keyword-only, with the same
  defaults everywhere (framework-only options come after, also keyword-only);
* ``iter()`` serves the rest of the current epoch (one *pass*), and the next ``iter()`` the
  next epoch; ``len()`` is the steps per epoch;
* ``set_epoch``, ``state_dict``, ``load_state_dict`` (a state from any adapter loads into any
  other for the same file and order), ``close`` and the context-manager protocol.

What is served (order, epochs, rank rows, worker steps, next-token pairs, document layout) is
``BatchNativeLoader``'s. This module adds what happens between the loader and the training
loop: conversion, an optional stage that prepares ``prefetch`` items ahead (on a background
thread, or on the calling thread for frameworks whose transfers are already asynchronous),
items produced elsewhere (``DataLoader`` worker processes, a ``tf.data`` graph), and a cursor
that counts only what the loop received: ``state_dict`` never includes read-ahead, and
``set_epoch``, ``load_state_dict`` or a new ``iter()`` drop what was read ahead and continue
from the first undelivered item.

Subclasses override hooks, never the surface: ``_converter`` (one function per item field),
``_pair`` (the next-token pair type), ``_stage`` (whether and where to prepare items ahead),
``_transfer`` (a step run in that stage, e.g. a host-to-device copy), ``_host_dtypes`` (what
the core loader serves, given the source's stored token dtype, when the adapter widens
elsewhere: a device can take uint16 tokens as they are), ``_produce`` (an
external producer of converted items), ``_detected_rank_world``, ``_detected_context`` and
``_worker`` (what the framework knows about data- and context-parallel ranks and worker
processes), and ``_slicing`` (how the adapter's coordinates map to the core loader's slice).
"""

from __future__ import annotations

import collections
import inspect
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Generic, Literal, NamedTuple, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_UINT16, TOKEN_DTYPE, token_dtype

from ..arguments import int_arg
from ..closing import Closing
from ..datasets.dataset import Verify
from ..datasets.remote import RemoteVerify
from ..errors import StateError
from .buffers import stop_at_exit
from .distributed import resolve_rank_world
from .loader import (
    DEFAULT_BLOCK_SIZE,
    OUTPUT_DTYPES,
    BatchNativeLoader,
    Item,
    LabelDType,
    OutputDType,
    Position,
)
from .mixture import Mixture, MixtureSource
from .mixture_loader import MixtureLoader, is_mixture, open_mixture
from .slicing import Slicing
from .sources import BatchSource, open_reader, source_token_dtype

T = TypeVar("T")

NARROW_TOKEN_DTYPE = token_dtype(DTYPE_UINT16)
"""Stored tokens narrower than uint32 (dtype 1, uint16): what an adapter that widens on a
device takes from the host as they are (``_host_dtypes``), half the bytes of a uint32 view."""
Array = npt.NDArray[Any]
Converter = Callable[[Array], Any]
Stage = Literal["thread", "caller"]

DEFAULT_DTYPE: OutputDType = "int32"
"""The one default output dtype of every adapter (see the README's "Frameworks" section)."""

DEFAULT_PREFETCH = 2
"""Items prepared ahead of the training loop by default."""

LAYOUT_KEYS = ("segment_ids", "positions", "cu_seqlens")
"""Document-layout fields of a ``bos_id`` item, after its tokens (or inputs and labels)."""

Source = str | os.PathLike[str] | BatchSource | Mixture
"""What a stream (and ``BatchNativeLoader``) serves from: a path or URL, an open reader, or a
``Mixture`` (or a mixture file's path)."""


class Layout(NamedTuple):
    """The parallel coordinates given to a stream's constructor (``None``: not given)."""

    rank: int | None
    world_size: int | None
    context_rank: int | None
    context_size: int | None
    zigzag: bool


class StreamOptions(TypedDict, total=False):
    """The common constructor arguments, for adapters that add options of their own.

    Such an adapter declares ``__init__(self, source, *, <its options>, **options:
    Unpack[StreamOptions])`` and passes ``**options`` on; its signature, as ``help()`` and
    ``inspect`` show it, lists the common arguments first, exactly as ``BatchStream`` does.
    """

    block_size: int
    shuffle: bool
    seed: int | None
    epoch: int
    dtype: OutputDType
    next_token: bool
    rank: int | None
    world_size: int | None
    bos_id: int | None
    prefetch: int
    context_rank: int | None
    context_size: int | None
    zigzag: bool
    global_batch_size: int | None
    skip_steps: Iterable[Sequence[int]]
    verify: Verify | RemoteVerify | None


class BatchStream(Closing, Generic[T]):
    """A resumable stream of a file's or a dataset's batches, converted for a framework.

    Used directly it is the NumPy adapter: items are the core loader's arrays (views of the
    stored tokens for ``native``, their own dtype's name, and ``int32`` of uint32 tokens;
    pooled widened copies otherwise, e.g. ``int32`` of uint16 tokens or ``int64``). The default
    ``int32`` serves the same values from a uint16 file as from a uint32 file of the same
    tokens, so training code does not depend on how the tokens are stored. Framework adapters
    subclass it.

    ``source`` is an LLMBATCH file, a dataset directory, a URL (``s3://``, ``gs://``,
    ``az://``, ``http(s)://``, ``file://``) of either, a live dataset, or an open reader of any
    of them (left open by ``close``). ``rank`` and ``world_size`` (give both or neither) are
    this reader's data-parallel coordinates: by default they come from the framework (an
    initialised process group), else from ``RANK`` and ``WORLD_SIZE`` in the environment, else
    one rank.
    ``context_rank`` and ``context_size`` (context parallelism, with ``zigzag`` for the
    load-balanced causal split) likewise default to the framework's, else one. ``prefetch`` is
    how many items are prepared ahead of the loop where the adapter has work to do ahead
    (device copies); ``0`` prepares nothing ahead. ``global_batch_size``, ``skip_steps`` and
    ``verify`` (a dataset's checksum checks: ``"off"``, ``"first"``, ``"always"``, and for
    remote sources ``"whole"``, their default: see ``remote.py``), and the
    other arguments, are ``BatchNativeLoader``'s.
    """

    dtypes: ClassVar[tuple[OutputDType, ...]] = OUTPUT_DTYPES
    """Output dtypes this adapter serves."""

    accepts_worker_states: ClassVar[bool] = False
    """Whether a state saved by one of several worker processes may be loaded (it serves only
    that worker's steps afterwards)."""

    def __init__(
        self,
        source: Source,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shuffle: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        dtype: OutputDType = DEFAULT_DTYPE,
        next_token: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        bos_id: int | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        context_rank: int | None = None,
        context_size: int | None = None,
        zigzag: bool = False,
        global_batch_size: int | None = None,
        skip_steps: Iterable[Sequence[int]] = (),
        verify: Verify | RemoteVerify | None = None,
    ) -> None:
        if dtype not in self.dtypes:
            raise ValueError(
                f"dtype must be one of {', '.join(map(repr, self.dtypes))} for "
                f"{type(self).__name__}, got {dtype!r}"
            )
        self.prefetch = int_arg("prefetch", prefetch, 0)
        reader: BatchSource
        if isinstance(source, Mixture) or is_mixture(source):
            reader, owned = open_mixture(
                source, global_batch_size=global_batch_size, seed=seed, verify=verify
            )
        elif isinstance(source, BatchSource):
            reader, owned = source, False
        else:
            reader, owned = open_reader(source, verify=verify), True
        self._owns_reader = owned
        try:
            layout = Layout(rank, world_size, context_rank, context_size, bool(zigzag))
            host_dtype, label_dtype = self._host_dtypes(dtype, _stored_dtype(reader))
            self.loader = BatchNativeLoader(
                reader,
                block_size=block_size,
                shuffle=shuffle,
                seed=seed,
                epoch=epoch,
                dtype=host_dtype,
                label_dtype=label_dtype,
                next_token=next_token,
                bos_id=bos_id,
                global_batch_size=global_batch_size,
                skip_steps=skip_steps,
                slicing=self._slicing(reader, layout, next_token, global_batch_size),
            )
        except BaseException:
            if self._owns_reader:
                reader.close()
            raise
        # "native" reads as what it resolved to (the stored tokens' dtype name).
        self.dtype: OutputDType = self.loader.dtype if dtype == "native" else dtype
        self._pass: _Pass[T] | None = None
        self._served: Position | None = None  # the step of the last item delivered

    @classmethod
    def from_loader(cls: type[S], loader: BatchNativeLoader, *, prefetch: int = 0) -> S:
        """A stream over an existing core loader: it shares the loader's cursor and file.

        ``close`` leaves the file open (it belongs to whoever opened the loader). This is how
        a stream hands itself to worker processes without reopening anything here.
        """
        if loader.dtype not in cls.dtypes:
            raise ValueError(f"{cls.__name__} serves {cls.dtypes}, not {loader.dtype!r}")
        stream = cls.__new__(cls)
        stream.prefetch = int_arg("prefetch", prefetch, 0)
        stream.loader, stream.dtype = loader, loader.dtype
        stream._owns_reader, stream._pass, stream._served = False, None, None
        return stream

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Show an adapter's ``**options`` as the common arguments, in the contract's order."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        own = list(inspect.signature(init).parameters.values())
        if not own or own[-1].kind is not inspect.Parameter.VAR_KEYWORD:
            return
        common = list(inspect.signature(BatchStream.__init__).parameters.values())
        extra = [p for p in own[2:-1] if p.kind is inspect.Parameter.KEYWORD_ONLY]
        init.__signature__ = inspect.Signature([*common, *extra])

    # -- hooks -------------------------------------------------------------------------------
    def _detected_rank_world(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` of the framework's process group, if one is running."""
        return None

    def _detected_context(self) -> tuple[int, int] | None:
        """``(context_rank, context_size)`` from the framework's device mesh, if it has one."""
        return None

    def _slicing(
        self,
        reader: BatchSource,
        layout: Layout,
        next_token: bool,
        global_batch_size: int | None,
    ) -> Slicing:
        """The core loader's coordinates: the arguments given, else what the framework says."""
        r, w = resolve_rank_world(layout.rank, layout.world_size, self._detected_rank_world())
        c, size = resolve_rank_world(
            layout.context_rank,
            layout.context_size,
            self._detected_context(),
            names=("context_rank", "context_size"),
            environment=False,
        )
        return Slicing(r, w, c, size, 1, layout.zigzag)

    def _host_dtypes(
        self, dtype: OutputDType, token_dtype: np.dtype[Any] = TOKEN_DTYPE
    ) -> tuple[OutputDType, LabelDType]:
        """What the core loader serves for an adapter of ``dtype`` from a source whose stored
        tokens are ``token_dtype``: that dtype and int64 labels, unless the adapter widens them
        itself (on a device: see the PyTorch adapter)."""
        return dtype, "int64"

    def _worker(self) -> tuple[int, int] | None:
        """``(worker, num_workers)`` when iterated inside a worker process of the framework."""
        return None

    def _converter(self, key: str) -> Converter:
        """The function that turns one NumPy field of an item (``"tokens"``, ``"inputs"``,
        ``"labels"`` or a layout key) into the framework's array. NumPy: the array itself."""
        return _identity

    def _pair(self, inputs: Any, labels: Any) -> Any:
        """The framework's ``(inputs, labels)`` container."""
        return inputs, labels

    def _stage(self) -> Stage | None:
        """Where items are prepared ``prefetch`` ahead: ``None`` when there is nothing to gain."""
        return None

    def _transfer(self, item: T) -> T:
        """Work done on each converted item in the stage ahead of the loop (e.g. a device copy)."""
        return item

    def _produce(self, convert: Callable[[Item], T]) -> Iterator[T] | None:
        """Converted items of the pass from the cursor on, made elsewhere (worker processes,
        a graph), in the loader's order; ``None`` serves them from the loader in this process."""
        return None

    # -- the surface -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """Epoch of the next item the loop will receive."""
        return self.position.epoch

    @property
    def step(self) -> int:
        """Position of the next item in that epoch."""
        return self.position.step

    @property
    def position(self) -> Position:
        """The delivered cursor ``(epoch, step)``: read-ahead not included."""
        return self._pass.position if self._pass is not None else self.loader.position

    @property
    def rank(self) -> int:
        """This rank's index among ``world_size`` (of the core loader's rows)."""
        return self.loader.rank

    @property
    def world_size(self) -> int:
        """Number of ranks splitting each batch's rows."""
        return self.loader.world_size

    @property
    def next_token(self) -> bool:
        """Whether items are ``(inputs, labels)`` pairs shifted by one token."""
        return self.loader.next_token

    @property
    def bos_id(self) -> int | None:
        """The BOS id whose document layout items carry, if any."""
        return self.loader.bos_id

    def __len__(self) -> int:
        """Steps (stored batches) per epoch."""
        return len(self.loader)

    def __iter__(self) -> Iterator[T]:
        """Serve the rest of the current epoch; a pass still running ends here."""
        self._end_pass()
        if self.loader.reader.closed:
            raise ValueError(f"{self.loader.reader.path}: the stream is closed")
        worker = self._worker()
        if worker is not None:
            self.loader.split_workers(*worker)
        convert = self._item_converter()
        produced = self._produce(convert)
        stage = self._stage() if self.prefetch else None
        if produced is None and stage is None:
            # Nothing ahead of the loop: the loader's cursor is the delivered cursor.
            if isinstance(self.loader, MixtureLoader):
                return self._tracked(map(convert, self.loader))
            return map(convert, self.loader)
        if produced is None:
            produced = map(convert, self.loader)
        current = _Pass(self, produced, stage)
        self._pass = current
        return current.deliver()

    def _tracked(self, items: Iterator[T]) -> Iterator[T]:
        """``items`` as they come, each one's step noted for ``last_component``."""
        loader = self.loader
        while True:
            step = loader.after(loader.position, 0)
            item = next(items, _DONE)
            if item is _DONE:
                return
            self._served = step
            yield item  # type: ignore[misc]

    @property
    def last_component(self) -> str | None:
        """The name of the mixture component the last delivered item came from (``None`` for
        a source that is not a mixture, or before the first item): for a loss per source."""
        if self._served is None or not isinstance(self.loader, MixtureLoader):
            return None
        return self.loader.component_at(self._served)

    def component_at(self, epoch: int, step: int) -> str:
        """The name of the mixture component serving ``step`` of ``epoch`` (what a training
        loop fed by worker processes counts its way to); ``ValueError`` if not a mixture."""
        if not isinstance(self.loader, MixtureLoader):
            raise ValueError(f"{self.loader.source.path} is not a mixture")
        return self.loader.component_at(Position(epoch, step))

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op if it is the current epoch of delivered items)."""
        self._end_pass()
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The cursor after the last delivered item, as plain JSON-serialisable values."""
        return self.loader.state_dict(self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume right after the item ``state`` was saved at (by any adapter of this file)."""
        self._end_pass()
        workers, worker = self.loader.check_state(state)[2:4]
        if workers != 1 and not self.accepts_worker_states:
            raise StateError(
                f"state of worker {worker} of {workers} only; {type(self).__name__} resumes "
                "from a state of a whole stream (its own state_dict, or any adapter's)"
            )
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Stop any read-ahead and release the file; ``state_dict`` keeps working."""
        self._end_pass()
        self.loader.seek(self.loader.position)  # a pass the loader serves itself ends too
        if self._owns_reader and not self.loader.source.closed:
            self.loader.identity()  # the state names its source even after the file is gone
            self.loader.source.close()

    # -- internals ---------------------------------------------------------------------------
    def _end_pass(self) -> None:
        """End the pass in progress: drop its read-ahead, rewind to the delivered cursor."""
        current, self._pass = self._pass, None
        if current is not None:
            current.close()
            self.loader.seek(current.position)

    def _item_converter(self) -> Callable[[Item], T]:
        """One function per pass that converts a core item, field by field."""
        loader = self.loader
        if loader.bos_id is not None:
            keys = ("inputs", "labels") if loader.next_token else ("tokens",)
            fields = {key: self._converter(key) for key in keys + LAYOUT_KEYS}
            return lambda item: {key: fields[key](array) for key, array in item.items()}  # type: ignore[return-value]
        if loader.next_token:
            inputs, labels, pair = self._converter("inputs"), self._converter("labels"), self._pair
            return lambda item: pair(inputs(item[0]), labels(item[1]))
        return self._converter("tokens")


S = TypeVar("S", bound=BatchStream[Any])


def _identity(array: Array) -> Array:
    return array


def _stored_dtype(reader: BatchSource) -> np.dtype[Any]:
    """The stored token dtype ``_host_dtypes`` is told: the source's, or for a mixture whose
    dtype is not known yet, uint32 (what it serves to any output but ``"native"``), so that no
    component is opened to learn it."""
    if isinstance(reader, MixtureSource):
        known = reader.known_token_dtype
        return TOKEN_DTYPE if known is None else known
    return source_token_dtype(reader)


class _Pass(Generic[T]):
    """One pass whose items are prepared ahead of, or away from, the training loop.

    Every produced item travels with the cursor right after it (counted from the start of the
    pass, since producers serve the loader's order), so ``position`` follows delivery.
    """

    def __init__(self, stream: BatchStream[T], produced: Iterator[T], stage: Stage | None) -> None:
        self.stream = stream
        self.position = stream.loader.position
        counted = self._counted(produced, stream.loader, self.position)
        depth = stream.prefetch
        self._ahead: Iterator[tuple[T, Position, Position]]
        if stage == "thread":
            self._ahead = Prefetcher(counted, depth)
        elif stage == "caller":
            self._ahead = Lookahead(counted, depth)
        else:
            self._ahead = counted

    def _counted(
        self, produced: Iterator[T], loader: BatchNativeLoader, start: Position
    ) -> Iterator[tuple[T, Position, Position]]:
        transfer = self.stream._transfer
        position = start
        tracked = isinstance(loader, MixtureLoader)  # a mixture notes each item's step
        for item in produced:
            served = loader.after(position, 0) if tracked else position
            position = loader.after(position)
            yield transfer(item), position, served

    def deliver(self) -> Iterator[T]:
        stream = self.stream
        for item, position, served in self._ahead:
            if stream._pass is not self:
                return  # the cursor was moved from outside, or a new pass began
            self.position = position
            stream._served = served
            yield item
        if stream._pass is self:  # the pass ended: the cursor moves on to the next epoch
            stream._pass = None
            self.close()
            stream.loader.seek(stream.loader.next_pass(self.position))

    def close(self) -> None:
        closer = getattr(self._ahead, "close", None)
        if closer is not None:
            closer()


_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Iterator[T]):
    """Iterate ``source`` on a background thread, at most ``depth`` items ahead of the caller.

    Exceptions raised in the thread are re-raised in the caller. ``close`` stops the thread;
    it is also called when the source is exhausted.
    """

    def __init__(self, source: Iterator[T], depth: int) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(source,), name="zerobatch-prefetch", daemon=True
        )
        stop_at_exit(self)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[T]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failure(e))

    def __next__(self) -> T:
        if self._stop.is_set():
            raise StopIteration
        got = self._queue.get()
        if got is _DONE:
            self.close()
            raise StopIteration
        if isinstance(got, _Failure):
            self.close()
            raise got.error
        return got  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the background thread and drop anything read ahead."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def __del__(self) -> None:
        self._stop.set()


class Lookahead(Iterator[T]):
    """Iterate ``source`` on the calling thread, keeping ``depth`` items produced ahead.

    For frameworks whose transfers are already asynchronous (JAX dispatches a host-to-device
    copy and returns at once), producing the next items right after handing one out overlaps
    their copies with the caller's step without a second thread. That matters on XLA's CPU
    backend, where computations dispatched from two threads at once can starve a collective's
    rendezvous and abort the process.
    """

    def __init__(self, source: Iterator[T], depth: int) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._source, self._depth = source, depth
        self._queue: collections.deque[T] = collections.deque()
        self._done = False

    def _fill(self) -> None:
        while not self._done and len(self._queue) < self._depth:
            try:
                self._queue.append(next(self._source))
            except StopIteration:
                self._done = True

    def __next__(self) -> T:
        self._fill()
        if not self._queue:
            raise StopIteration
        value = self._queue.popleft()
        self._fill()  # dispatch the next transfers before the caller starts its step
        return value

    def close(self) -> None:
        """Drop what was produced ahead."""
        self._queue.clear()
        self._done = True
