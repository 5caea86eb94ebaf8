"""``Mixture``: several sources blended by weight, with a schedule (``SPEC.md`` section 21).

A ``Mixture`` describes the blend: named components (any source a loader takes: a file, a
dataset directory, a URL, a live dataset, an open reader), each with a weight, and optional
phases that change the weights from given global steps on. It is accepted wherever a source
is (``BatchNativeLoader``, ``BatchStream``, every adapter) and has a JSON file form
(``load_mixture``) that the command line accepts.

**Serving.** Each global step serves one whole global batch of one component, the one
section 21.2 names; every data- and context-parallel rank of the step reads its own share of
that batch (``slicing.py``), so items stay views of the component's files where the step's rows
lie in one stored batch. Each component keeps its own cursor, ``(epoch, sample)``, and serves
exactly the sequence of global batches its own loader would (same ``block_size``, ``shuffle``
and global batch size; its own seed unless the loader is given one), over as many epochs as
the mixture reaches: a small component repeats, a large one is only partly read. As in its own
loader, the last samples of each epoch that do not fill a global batch are not served. A
mixture's epoch is ``steps`` global steps (by default practically endless: train by steps),
and its next epoch continues the blend.

**Token dtypes.** Components may store different token dtypes. A mixture's stored tokens
(``MixtureSource.token_dtype``, what the loader's ``"native"`` serves) are the widest of its
components': uint16 when every component stores uint16, else uint32, and then the steps of a
uint16 component are widened to uint32 (a copy of the rank's rows; a uint32 component's steps
stay views). Learning that opens every component, so a loader whose outputs are wider than
uint16 anyway (int32, int64, uint32: every output but ``"native"`` and ``"uint16"``) does not
ask: it has the mixture serve uint32 (``serve_as``) and components still open at their first
use. Either way every step's batch has the loader's one output dtype.

**Resuming** (``MixtureLoader``). A state holds the step, the history the schedule was
resumed into, and every component's name, source identity and position. Loaded into the same
mixture it continues exactly. Loaded into a mixture whose weights, schedule, components or
global batch size changed, it continues as if a phase started at the saved step (section 21.3):
the weights in force there, every remaining component from its own position, a new component
from its start; nothing is repeated or skipped. A component whose source has another identity
under the same name is refused with a ``StateError`` naming it.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from zerobatch_spec import TOKEN_DTYPES, U64_MAX
from zerobatch_spec.mixture import MixtureSpecError, Phase, phase_at, weight_units

from ..arguments import int_arg
from ..errors import ZeroBatchError
from ..order import BlockOrder, Order, Span
from .mixing import MixtureSchedule
from .sources import BatchSource, Region, open_reader, source_token_dtype

MIXTURE_FORMAT = "zerobatch.mixture"
MIXTURE_VERSION = 1
SNIFF_BYTES = 1 << 16
"""Bytes of a file without the ``.json`` suffix searched for the mixture format's name."""
ENDLESS_STEPS = 2**63 - 1
"""Steps of a mixture without ``steps``: more than any run takes, and still a valid ``len``."""
U32Array = npt.NDArray[np.uint32]


class MixtureError(ZeroBatchError, ValueError):
    """A mixture that cannot be served: its description, or a component that does not fit."""


@dataclass(frozen=True)
class Component:
    """One source of a mixture: its ``name`` (unique; states name components by it), the
    ``source`` (anything ``open_reader`` opens, or an open reader) and its ``weight``."""

    name: str
    source: Any
    weight: float | int | str = 1


@dataclass(frozen=True)
class Mixture:
    """A blend of ``components`` by weight (see the module docstring).

    ``schedule`` lists ``(start_step, {name: weight})`` phases after the first: from global step
    ``start_step`` on, the named components take those weights (components not named take 0).
    Weights are decimals with up to 9 fraction digits (section 21.1): ``0.5, 0.3, 0.2`` and
    ``5, 3, 2`` blend alike. ``global_batch_size`` defaults to the components' stored batch
    size (which must then be the same for all); ``steps`` bounds the mixture's one epoch.

    >>> mix = Mixture(  # doctest: +SKIP
    ...     [Component("web", "web/", 0.7), Component("code", "s3://b/code", 0.3)],
    ...     schedule=[(90_000, {"web": 0.4, "code": 0.6})],
    ... )
    >>> loader = BatchNativeLoader(mix, dtype="int64")  # doctest: +SKIP
    """

    components: tuple[Component, ...]
    schedule: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    global_batch_size: int | None = None
    steps: int | None = None
    phases: tuple[Phase, ...] = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        components: Sequence[Component | tuple[str, Any, Any]],
        *,
        schedule: Sequence[tuple[Any, Mapping[str, Any]]] = (),
        global_batch_size: int | None = None,
        steps: int | None = None,
    ) -> None:
        parts = tuple(c if isinstance(c, Component) else Component(*c) for c in components)
        if not parts:
            raise MixtureError("a mixture needs at least one component")
        names = [c.name for c in parts]
        for name in names:
            if not isinstance(name, str) or not name:
                raise MixtureError(f"component names are non-empty strings, got {name!r}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise MixtureError(f"component names must be unique: {', '.join(dup)} repeated")
        first = [_units(f"component {c.name!r}: weight", c.weight) for c in parts]
        phases = [Phase(0, tuple(first))]
        for k, entry in enumerate(schedule):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise MixtureError(f"schedule[{k}] must be (start_step, {{name: weight}})")
            start, weights = entry
            start = int_arg(f"schedule[{k}] start step", start, 1, U64_MAX, MixtureError)
            if not isinstance(weights, Mapping):
                raise MixtureError(f"schedule[{k}]: weights must map names to weights")
            unknown = sorted(set(weights) - set(names))
            if unknown:
                raise MixtureError(f"schedule[{k}]: no component named {unknown[0]!r}")
            units = tuple(
                _units(f"schedule[{k}] weight of {n!r}", weights.get(n, 0)) for n in names
            )
            phases.append(Phase(start, units))
        try:
            MixtureSchedule(phases)  # checks the schedule (section 21.1)
        except MixtureSpecError as e:
            raise MixtureError(str(e)) from None
        g = (
            None
            if global_batch_size is None
            else int_arg("global_batch_size", global_batch_size, 1)
        )
        n = None if steps is None else int_arg("steps", steps, 0, ENDLESS_STEPS, MixtureError)
        object.__setattr__(self, "components", parts)
        object.__setattr__(self, "schedule", tuple((s, dict(w)) for s, w in schedule))
        object.__setattr__(self, "global_batch_size", g)
        object.__setattr__(self, "steps", n)
        object.__setattr__(self, "phases", tuple(phases))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    def describe(self) -> dict[str, Any]:
        """The blend as plain values (what a state records to tell mixtures apart)."""
        return {
            "components": list(self.names),
            "phases": [{"start": p.start, "weights": list(p.weights)} for p in self.phases],
            "global_batch_size": self.global_batch_size,
            "steps": self.steps,
        }


def _units(where: str, value: Any) -> int:
    try:
        return weight_units(value, where)
    except MixtureSpecError as e:
        raise MixtureError(str(e)) from None


def load_mixture(path: str | os.PathLike[str]) -> Mixture:
    """The ``Mixture`` of a JSON mixture file (README, "Mixtures").

    ``{"format": "zerobatch.mixture", "version": 1, "components": [{"name", "source",
    "weight"}, ...], "schedule": [{"start", "weights": {name: weight}}], "global_batch_size",
    "steps"}``; ``schedule``, ``global_batch_size`` and ``steps`` are optional. A relative
    ``source`` path is relative to the file's directory. Weights keep their decimal text.
    """
    text = os.fspath(path)
    try:
        with open(text, "rb") as f:
            data = f.read(1 << 20)
    except OSError as e:
        raise MixtureError(f"{text}: cannot read the mixture file: {e.strerror or e}") from None
    try:
        doc = json.loads(data, parse_float=str, parse_int=int)
    except (ValueError, RecursionError) as e:
        raise MixtureError(f"{text}: not a UTF-8 JSON document: {e}") from None

    def fail(detail: str) -> MixtureError:
        return MixtureError(f"{text}: {detail}")

    if not isinstance(doc, dict):
        raise fail("a mixture file holds a JSON object")
    if doc.get("format") != MIXTURE_FORMAT:
        raise fail(f"format must be {MIXTURE_FORMAT!r}, got {doc.get('format')!r:.80}")
    if doc.get("version") != MIXTURE_VERSION or isinstance(doc.get("version"), bool):
        raise fail(f"version must be {MIXTURE_VERSION}, got {doc.get('version')!r:.80}")
    entries = doc.get("components")
    if not isinstance(entries, list) or not entries:
        raise fail("components must be a non-empty list")
    base = os.path.dirname(os.path.abspath(text))
    components = []
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise fail(f"components[{k}] must be an object")
        for key in ("name", "source"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise fail(f"components[{k}].{key} must be a non-empty string")
        source = entry["source"]
        if "://" not in source and not os.path.isabs(source):
            source = os.path.join(base, source)
        components.append(Component(entry["name"], source, entry.get("weight", 1)))
    schedule = []
    raw = doc.get("schedule", [])
    if not isinstance(raw, list):
        raise fail("schedule must be a list")
    for k, phase in enumerate(raw):
        if not isinstance(phase, dict) or not isinstance(phase.get("weights"), dict):
            raise fail(f"schedule[{k}] must be an object with start and weights")
        schedule.append((phase.get("start"), phase["weights"]))
    try:
        return Mixture(
            components,
            schedule=schedule,
            global_batch_size=doc.get("global_batch_size"),
            steps=doc.get("steps"),
        )
    except MixtureError as e:
        raise fail(str(e)) from None


def is_mixture_file(path: object) -> bool:
    """Whether ``path`` names a mixture file: a ``.json`` file (``load_mixture`` then says
    what is wrong with one that is not a mixture), or a JSON object that names the mixture
    format in its first ``SNIFF_BYTES``."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return False
    if os.fspath(path).endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head.lstrip()[:1] not in (b"{", b""):  # an LLMBATCH file starts with its magic
                return False
            head += f.read(SNIFF_BYTES - len(head))
    except OSError:
        return False
    return head.lstrip()[:1] == b"{" and MIXTURE_FORMAT.encode() in head


@dataclass(frozen=True)
class _StepOrder(BlockOrder):
    """A mixture's order: position ``q`` of epoch ``e`` is global step ``e * num_batches + q``
    (a mixture is one sequence of steps, which its epochs continue)."""

    def spans(self, epoch: int, start: int = 0) -> Iterator[Span]:
        base = epoch * self.num_batches
        for span in super().spans(epoch, start):
            yield Span(base + span.start, base + span.stop)


class _Cursor:
    """A component's stored-batch index at serving positions, read forward cheaply: the next
    position costs one step of the order's iterator, the same position again nothing."""

    def __init__(self, order: Order) -> None:
        self.order = order
        self.epoch = -1
        self.next = 0  # the position the iterator gives next
        self.last = -1  # the index at position next - 1
        self.indices: Iterator[int] = iter(())

    def index(self, epoch: int, position: int) -> int:
        if epoch == self.epoch:
            if position == self.next:
                self.last = next(self.indices)
                self.next = position + 1
                return self.last
            if position == self.next - 1:
                return self.last
        self.indices = self.order.indices(epoch, position)
        self.epoch = epoch
        self.last = next(self.indices)
        self.next = position + 1
        return self.last


class _Opened:
    """One component, opened: its reader, steps of the mixture's size, and its order cursor."""

    def __init__(self, name: str, reader: BatchSource, owned: bool, order: Order) -> None:
        self.name, self.reader, self.owned = name, reader, owned
        self.samples = reader.num_batches * reader.batch_size  # per epoch
        self.cursor = _Cursor(order)
        self.lock = threading.Lock()

    def advance(self, start: tuple[int, int], count: int, g: int) -> tuple[int, int]:
        """The position ``count`` global batches of ``g`` samples after ``start``: within an
        epoch while a whole batch fits, then from the next epoch's first sample."""
        epoch, offset = start
        if offset + g > self.samples:  # nothing whole left in this epoch
            epoch, offset = epoch + 1, 0
        first = (self.samples - offset) // g  # batches left in the start epoch
        if count < first:
            return epoch, offset + count * g
        more, left = divmod(count - first, self.samples // g)
        return epoch + 1 + more, left * g


PLAN_STEPS = 256
"""Global steps planned at once (``MixtureSource._block``)."""
PLANNED_BLOCKS = 4
"""Planned blocks kept: the loader's, its read-ahead's and a prefetching stage's."""


class _Block(NamedTuple):
    readers: list[BatchSource | None]
    indices: list[int]
    rows: list[int]
    views: list[U32Array | None]  # the stored batch itself, for a component of local files


Cursor = tuple[int, int]
"""A component's position: ``(its epoch, the sample of that epoch its next batch starts at)``."""


@dataclass
class _History:
    """Where the schedule was last re-phased (section 21.3): the step, and every component's
    cursor there. ``(0, all (0, 0))`` until a changed mixture is resumed."""

    step: int
    positions: list[Cursor]


class MixtureSource:
    """The ``BatchSource`` a loader serves a ``Mixture`` from: its slot ``k`` is global step
    ``k``, a whole global batch of the component section 21 names (opened at its first use).

    Its own order is the identity (a mixture is served step by step); the order parameters the
    loader gives (``order``) are its components'.
    """

    fetches = False

    def __init__(
        self,
        mixture: Mixture,
        *,
        global_batch_size: int | None = None,
        seed: int | None = None,
        verify: Any = None,
        **remote: Any,
    ) -> None:
        self.mixture = mixture
        self.path = f"mixture({', '.join(mixture.names)})"
        self.component_seed = seed
        self._verify, self._remote = verify, remote
        self._opened: dict[int, _Opened] = {}
        self._token_dtype: np.dtype[np.unsignedinteger] | None = None
        self._order_args = (1, True)
        self._closed = False
        self._lock = threading.Lock()
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._plan_lock = threading.Lock()
        self._last: tuple[int, _Block] = (-1, _Block([], [], [], []))  # the block read last
        g = global_batch_size or mixture.global_batch_size
        self.history = _History(0, [(0, 0)] * len(mixture.components))
        self.schedule = MixtureSchedule(mixture.phases)
        try:
            live = [i for i, w in enumerate(mixture.phases[0].weights) if w > 0]
            first = self._reader(live[0])
            self._seq_len = first.seq_len
            self._seed = first.seed
            if g is None:
                g = first.batch_size
                for i in range(len(mixture.components)):  # one shape, or a size must be given
                    other = self._reader(i)
                    if other.batch_size != g:
                        raise MixtureError(
                            f"component {mixture.names[i]!r} stores batches of "
                            f"{other.batch_size}, component {mixture.names[live[0]]!r} of {g}: "
                            "give the mixture a global_batch_size"
                        )
        except BaseException:
            self.close()
            raise
        self.global_batch_size = g
        self.steps = ENDLESS_STEPS if mixture.steps is None else mixture.steps

    # -- components -------------------------------------------------------------------------
    def _reader(self, i: int) -> BatchSource:
        """Component ``i``'s reader, opened (and its shape checked) at its first use."""
        opened = self._opened.get(i)
        if opened is not None:
            return opened.reader
        source = self.mixture.components[i].source
        owned = not isinstance(source, BatchSource)
        reader = open_reader(source, verify=self._verify, **self._remote) if owned else source
        return self._adopt(i, reader, owned)

    def _adopt(self, i: int, reader: BatchSource, owned: bool) -> BatchSource:
        name = self.mixture.names[i]
        try:
            if self._opened and reader.seq_len != self._seq_len:
                raise MixtureError(
                    f"component {name!r} ({reader.path}) has seq_len {reader.seq_len}; the "
                    f"mixture's components have {self._seq_len}"
                )
            if reader.num_batches * reader.batch_size == 0:
                raise MixtureError(f"component {name!r} ({reader.path}) holds no samples")
        except BaseException:
            if owned:
                reader.close()
            raise
        block_size, shuffle = self._order_args
        seed = reader.seed if self.component_seed is None else self.component_seed
        order = reader.order(block_size, seed, shuffle)
        self._opened[i] = _Opened(name, reader, owned, order)
        return reader

    def _component(self, i: int) -> _Opened:
        if i not in self._opened:
            with self._lock:
                if self._closed:
                    raise ValueError(f"{self.path}: reader is closed")
                self._reader(i)
        opened = self._opened[i]
        if opened.samples < self.global_batch_size:
            raise MixtureError(
                f"component {opened.name!r} ({opened.reader.path}) holds {opened.samples} "
                f"samples, fewer than one global batch of {self.global_batch_size}"
            )
        return opened

    # -- the schedule -----------------------------------------------------------------------
    def at(self, step: int) -> tuple[int, Cursor]:
        """``(component, its cursor)`` at global ``step``: the component serving the step and
        where in its own sequence the step's global batch starts."""
        h = self.history
        if step < h.step:
            raise IndexError(
                f"{self.path}: step {step} comes before step {h.step}, where this mixture "
                "was resumed with another blend"
            )
        i, count = self.schedule.at(step - h.step)
        return i, self._component(i).advance(h.positions[i], count, self.global_batch_size)

    def positions(self, step: int) -> list[Cursor]:
        """Every component's cursor at global ``step`` (opens every component served)."""
        h = self.history
        counts = self.schedule.positions(step - h.step)
        return [
            self._component(i).advance(p, c, self.global_batch_size) if c else p
            for i, (p, c) in enumerate(zip(h.positions, counts, strict=True))
        ]

    def rephase(self, step: int, positions: Sequence[Cursor]) -> None:
        """Continue from global ``step`` with every component at its cursor in ``positions``,
        the weights in force at ``step`` starting a phase there (section 21.3)."""
        phases = self.mixture.phases
        k = phase_at(phases, step)
        moved = [Phase(0, phases[k].weights)]
        moved += [Phase(p.start - step, p.weights) for p in phases[k + 1 :]]
        self.schedule = MixtureSchedule(moved)
        self.history = _History(step, [(int(e), int(o)) for e, o in positions])
        self._forget()

    def _forget(self) -> None:
        """Drop planned blocks (the schedule or the components' orders changed)."""
        with self._plan_lock:
            self._blocks.clear()
            self._last = (-1, _Block([], [], [], []))

    def component(self, i: int) -> BatchSource:
        """Component ``i``'s reader (opened at its first use)."""
        return self._component(i).reader

    def component_name(self, step: int) -> str:
        """The name of the component serving global ``step``."""
        return self.mixture.names[self.at(step)[0]]

    # -- BatchSource ------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.global_batch_size

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def num_batches(self) -> int:
        return self.steps

    @property
    def token_dtype(self) -> np.dtype[np.unsignedinteger]:
        """The dtype of the tokens this source serves: the one ``serve_as`` set, else the
        widest of the components' (opening every component): uint16 when all store uint16,
        else uint32. Steps of narrower components are widened to it."""
        if self._token_dtype is None:
            with self._lock:
                if self._closed:
                    raise ValueError(f"{self.path}: reader is closed")
                found = [
                    source_token_dtype(self._reader(i)) for i in range(len(self.mixture.components))
                ]
            self._token_dtype = max(found, key=lambda d: d.itemsize)
        return self._token_dtype

    @property
    def known_token_dtype(self) -> np.dtype[np.unsignedinteger] | None:
        """``token_dtype`` if it is known already (set, or learned), else ``None``: asking
        this opens no component."""
        return self._token_dtype

    def serve_as(self, dtype: np.dtype[np.unsignedinteger]) -> None:
        """Serve tokens of ``dtype`` (uint32), widening narrower components' steps, without
        opening the components to learn their dtypes; nothing changes once ``token_dtype`` is
        known (a loader over this source has read it)."""
        if self._token_dtype is None:
            self._token_dtype = dtype
            self._forget()

    def _widen(self, tokens: U32Array) -> U32Array:
        """A component's tokens in the mixture's ``token_dtype``: as they are, or widened."""
        wide = self.token_dtype
        return tokens if tokens.dtype == wide else tokens.astype(wide)

    @property
    def seed(self) -> int:
        """The seed of the first component served (a loader's default seed: unused, since
        components keep their own unless the loader is given one)."""
        return self._seed

    @property
    def closed(self) -> bool:
        return self._closed

    def order(self, block_size: int, seed: int, shuffle: bool) -> BlockOrder:
        """Global steps in order (epoch ``e`` serves steps ``e * steps`` on); ``block_size``
        and ``shuffle`` are the components' (orders already made are made again)."""
        if (block_size, shuffle) != self._order_args:
            self._order_args = (block_size, shuffle)
            for i, opened in list(self._opened.items()):
                r = opened.reader
                own = r.seed if self.component_seed is None else self.component_seed
                order = r.order(block_size, own, shuffle)
                self._opened[i] = _Opened(opened.name, r, opened.owned, order)
            self._forget()
        return _StepOrder(self.steps, max(1, block_size), 0, False)

    def identity(self) -> dict[str, Any]:
        """The blend and every component's identity (opens every component)."""
        return {
            "mixture": {
                **self.mixture.describe(),
                "global_batch_size": self.global_batch_size,
                "sources": {
                    name: self._reader(i).identity() for i, name in enumerate(self.mixture.names)
                },
            }
        }

    def _pieces(self, step: int, r0: int, r1: int) -> Iterator[tuple[_Opened, int, int, int]]:
        """``(component, stored index, first row, end row)`` holding rows ``r0..r1`` of
        global ``step``'s batch (a global batch never crosses its component's epoch)."""
        i, (epoch, first) = self.at(step)
        opened = self._component(i)
        b = opened.reader.batch_size
        sample, end = first + r0, first + r1
        while sample < end:
            position, row = divmod(sample, b)
            with opened.lock:
                index = opened.cursor.index(epoch, position)
            take = min(b - row, end - sample)
            yield opened, index, row, row + take
            sample += take

    def _block(self, number: int) -> _Block:
        """Steps ``number * PLAN_STEPS`` on, planned at once: each step's component reader,
        stored index and first row, where the step's global batch lies in one stored batch of
        a component already open (``None``: read it piece by piece, opening the component).
        A step then costs a lookup, not the schedule; components still open one by one."""
        with self._plan_lock:
            found = self._blocks.get(number)
            if found is not None:
                self._blocks.move_to_end(number)
                self._last = (number, found)
                return found
            h, g = self.history, self.global_batch_size
            first = max(number * PLAN_STEPS, h.step)
            stop = (number + 1) * PLAN_STEPS
            readers: list[BatchSource | None] = [None] * PLAN_STEPS
            views: list[U32Array | None] = [None] * PLAN_STEPS
            indices, rows = [0] * PLAN_STEPS, [0] * PLAN_STEPS
            served = self.schedule.between(first - h.step, stop - h.step)
            counts = self.schedule.positions(first - h.step)
            for i in np.unique(served).tolist():
                if i not in self._opened:
                    continue  # opened at its first step; planned from the next block on
                opened = self._component(i)
                reader, b, samples = opened.reader, opened.reader.batch_size, opened.samples
                # A component narrower than the mixture is read and widened, never viewed.
                narrow = None if source_token_dtype(reader) == self.token_dtype else reader
                epoch, offset = opened.advance(h.positions[i], counts[i], g)
                with opened.lock:
                    for j in (np.flatnonzero(served == i) + first - number * PLAN_STEPS).tolist():
                        if offset + g > samples:
                            epoch, offset = epoch + 1, 0
                        position, row = divmod(offset, b)
                        if row + g <= b:
                            readers[j] = reader
                            indices[j] = opened.cursor.index(epoch, position)
                            rows[j] = row
                            if not reader.fetches and narrow is None:
                                views[j] = _view(reader, indices[j])
                        offset += g
            block = _Block(readers, indices, rows, views)
            self._blocks[number] = block
            while len(self._blocks) > PLANNED_BLOCKS:
                self._blocks.popitem(last=False)
            self._last = (number, block)
            return block

    def _planned(self, step: int) -> tuple[BatchSource | None, int, int]:
        """``(reader, stored index, first row)`` of global ``step`` if its global batch lies
        in one stored batch, else ``(None, 0, 0)``."""
        number, j = divmod(step, PLAN_STEPS)
        last = self._last  # one read, no lock: a step of the block read last costs a lookup
        block = last[1] if last[0] == number else self._block(number)
        return block.readers[j], block.indices[j], block.rows[j]

    def read_region(self, index: int, r0: int, r1: int, lo: int, hi: int) -> U32Array:
        """Rows ``r0..r1``, columns ``lo..hi`` of global step ``index``'s batch: a view of the
        component's stored batch where the rows lie in one, else their concatenation."""
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        number, j = divmod(index, PLAN_STEPS)
        last = self._last
        block = last[1] if last[0] == number else self._block(number)
        view = block.views[j]
        if view is not None:  # a local stored batch: one slice of its view
            row = block.rows[j]
            return view[row + r0 : row + r1, lo:hi]
        reader = block.readers[j]
        if reader is not None:
            row = block.rows[j]
            return self._widen(reader.read_region(block.indices[j], row + r0, row + r1, lo, hi))
        parts = [
            o.reader.read_region(k, a, b, lo, hi) for o, k, a, b in self._pieces(index, r0, r1)
        ]
        return self._widen(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def read_batch(self, index: int) -> U32Array:
        return self.read_region(index, 0, self.global_batch_size, 0, self._seq_len)

    def view_batches(self, start: int, stop: int) -> None:
        """``None``: consecutive steps lie in different components and batches."""
        return None

    def slot_file(self, index: int) -> Any:
        """The component's file and slot when global step ``index`` is one whole stored batch
        of a component read from local files in the mixture's token dtype, else ``None``."""
        reader, k, row = self._planned(index)
        if reader is None or row != 0 or reader.batch_size != self.global_batch_size:
            return None
        if source_token_dtype(reader) != self.token_dtype:  # served widened, not as stored
            return None
        return reader.slot_file(k)

    def read_ahead(self, start: int, stop: int) -> None:
        """Have the stored batches of steps ``start..stop`` read in the background, one
        request per run of consecutive stored batches of a component."""
        runs: dict[int, list[list[Any]]] = {}
        step, stop = start, min(stop, self.steps)
        while step < stop:
            number, j = divmod(step, PLAN_STEPS)
            block = self._block(number)
            end = min(PLAN_STEPS, j + stop - step)
            for reader, k in zip(block.readers[j:end], block.indices[j:end], strict=True):
                if reader is None:
                    continue
                mine = runs.setdefault(id(reader), [])
                if mine and mine[-1][2] == k:
                    mine[-1][2] = k + 1
                elif not mine or mine[-1][2] - 1 != k:
                    mine.append([reader, k, k + 1])
            step += end - j
        for mine in runs.values():
            for reader, a, b in mine:
                reader.read_ahead(a, b)

    def check_size(self, index: int = 0) -> None:
        """The check of the component file holding global step ``index``'s batch."""
        reader, k, _ = self._planned(index)
        if reader is not None:
            reader.check_size(k)
            return
        for opened, k, _, _ in self._pieces(index, 0, self.global_batch_size):
            opened.reader.check_size(k)

    def ahead(
        self,
        steps: Iterator[Any],
        regions: Callable[[Any], Sequence[Region]],
        *,
        whole_rows: bool = False,
    ) -> Iterator[Any]:
        """``steps`` unchanged: components fetch their regions when they are read."""
        return steps

    def close(self) -> None:
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, {}
        for o in opened.values():
            if o.owned:
                o.reader.close()

    def __reduce__(self) -> tuple[Any, ...]:
        """Another process (a DataLoader worker) reopens the components it serves itself."""
        served = None if self._token_dtype is None else self._token_dtype.str
        state = (self.history.step, self.history.positions, self._order_args, served)
        args = (self.mixture, self.global_batch_size, self.component_seed, self._verify)
        return _reopen, (*args, self._remote, state)

    def __enter__(self) -> MixtureSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MixtureSource({self.path}, global_batch_size={self.global_batch_size})"


def _reopen(
    mixture: Mixture,
    global_batch_size: int,
    seed: int | None,
    verify: Any,
    remote: dict[str, Any],
    state: tuple[int, list[Cursor], tuple[int, bool], str | None],
) -> MixtureSource:
    source = MixtureSource(
        mixture, global_batch_size=global_batch_size, seed=seed, verify=verify, **remote
    )
    step, positions, (block_size, shuffle), served = state
    if served is not None:  # the parent's loader was built for tokens of this dtype
        source.serve_as(next(d for d in TOKEN_DTYPES.values() if d.str == served))
    source.order(block_size, 0, shuffle)
    if step or any(positions):
        source.rephase(step, positions)
    return source


def _view(reader: BatchSource, index: int) -> U32Array | None:
    """Stored batch ``index`` of a local component as its view, or ``None`` if reading it
    fails (its step then reads it through the reader, which raises at that step, not before)."""
    try:
        return reader.read_batch(index)
    except (ZeroBatchError, OSError, ValueError):
        return None
