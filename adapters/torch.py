"""PyTorch adapter: LLMBATCH batches as tensors, an ``IterableDataset`` and a resumable loader.

Everything that decides *what* is served, and the cursor, comes from ``zerobatch_core``
(``BatchStream`` over ``BatchNativeLoader``); this module turns NumPy batches into tensors and
plugs them into PyTorch's ``DataLoader`` machinery, so every adapter serves the same batches.

Usage (``TorchBatchLoader`` keeps an exact, JSON-able cursor, workers or not)::

    from zerobatch_adapters.torch import TorchBatchLoader

    loader = TorchBatchLoader("train.batch", next_token=True, device="cuda")
    if os.path.exists("data.json"):  # resume: the next batch is the one after the checkpoint
        loader.load_state_dict(json.load(open("data.json")))
    for epoch in range(loader.epoch, num_epochs):  # resume the epoch loop at loader.epoch
        loader.set_epoch(epoch)  # a new block order every epoch
        for inputs, labels in loader:  # int32 inputs, int64 labels [B, T - 1], on the GPU
            train_step(inputs, labels)
            json.dump(loader.state_dict(), open("data.json", "w"))

``TorchBatchDataset`` is the building block for a plain ``DataLoader(ds, batch_size=None,
num_workers=k)`` or torchdata's ``StatefulDataLoader``; ``TorchBatchLoader`` wraps the same
stream for the common case, with an exact cursor, int64 conversions on a background thread and
an optional device stage that moves int32 (uint16 for a uint16 file: half the bytes again) and
widens on the device.

Token widths. A uint16 file (dtype 1) serves the same tensors as the uint32 file of the same
tokens: int32 by default, int64 on request, int64 labels. On the host the core's background stage
widens them (int32 tensors are then pooled copies, not views of the file); with ``device=`` the
stored uint16 tokens cross, and the device widens them.

Worker processes and tokens. Every batch is made from a file this process can map itself, so a
batch made in a ``DataLoader`` worker does not travel as data: what crosses the process boundary
is where it lies in which file (``Shipped``), and the parent makes the same view (int32 of a
uint32 file) or conversion (int64, or int32 of a uint16 file) from its own mapping. A batch that
a worker-side transform changed, or one that is not a single region of the file, travels as its
bytes through the worker's pipe. The one remaining cost per batch is the ``DataLoader``'s own
hand-over (tens of microseconds here): for batches that need no per-batch work,
``num_workers=0`` (or ``TorchBatchLoader``, which serves from this process whatever
``num_workers`` says) is the fast choice.

Packed rows (several documents per row, each starting with a BOS token): ``bos_id=...`` makes
every batch a dict of tensors that adds the core's document layout for variable-length
attention: ``segment_ids``, ``positions`` (int32, the inputs' shape) and ``cu_seqlens`` (int32,
one entry per document plus the total: ``flash_attn_varlen_func``'s ``cu_seqlens_q/k``).

Parallel coordinates, first found wins (``zerobatch_core.delivery.slicing``): explicit ``rank``/
``world_size`` and ``context_rank``/``context_size``; else a ``device_mesh`` (a
``torch.distributed`` ``DeviceMesh``), whose dimensions named in ``DATA_DIMS`` give the
data-parallel coordinate and those in ``CONTEXT_DIMS`` the context-parallel one, every other
dimension (``"tp"``, ``"pp"``, ...) receiving identical data; else the default process group
as data parallelism; else ``RANK``/``WORLD_SIZE``::

    mesh = init_device_mesh("cuda", (dp, cp, tp), mesh_dim_names=("dp", "cp", "tp"))
    loader = TorchBatchLoader("train.batch", next_token=True, zigzag=True, device_mesh=mesh)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import IterableDataset, get_worker_info
from zerobatch_spec import TOKEN_DTYPE, U32_MAX

from zerobatch_core import (
    BatchStream,
    OutputDType,
    Source,
    Stage,
    StreamOptions,
    int_arg,
)
from zerobatch_core.delivery.loader import LabelDType
from zerobatch_core.delivery.stream import NARROW_TOKEN_DTYPE

from .torch_transfer import READONLY_PROBE, StagingRing, ignore_readonly_warning, ship

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from typing_extensions import Unpack

__all__ = [
    "CONTEXT_DIMS",
    "DATA_DIMS",
    "DocumentBatch",
    "MeshCoordinates",
    "NextTokenBatch",
    "StagingRing",
    "TorchBatchDataset",
    "TorchBatchLoader",
    "mesh_coordinates",
]

DATA_DIMS = ("dp", "data", "dp_replicate", "dp_shard")
"""``DeviceMesh`` dimension names that are data parallel. Several of them (e.g. HSDP's
``"dp_replicate"`` and ``"dp_shard"``) multiply into one data-parallel coordinate, row-major in
the mesh's dimension order (the numbering of the same dimensions flattened into one)."""

CONTEXT_DIMS = ("cp", "context")
"""``DeviceMesh`` dimension names that are context parallel (several multiply, row-major)."""


class NextTokenBatch(NamedTuple):
    """``(inputs, labels)`` for next-token training: ``[B, T - 1]`` each, labels int64.

    A named tuple rather than a plain one because ``DataLoader``'s default conversion keeps
    named tuples as they are (plain tuples come out as lists) and ``pin_memory`` keeps them too.
    """

    inputs: torch.Tensor
    labels: torch.Tensor


DocumentBatch = dict[str, torch.Tensor]
"""A ``bos_id`` item: ``tokens`` (or ``inputs``/``labels``), ``segment_ids``, ``positions``,
``cu_seqlens``. A plain dict: ``DataLoader`` collation and ``pin_memory`` keep dicts."""

TorchItem = torch.Tensor | NextTokenBatch | DocumentBatch


_TORCH_DTYPES = {"int32": torch.int32, "int64": torch.int64}


class MeshCoordinates(NamedTuple):
    """This process's data- and context-parallel coordinates in a ``DeviceMesh``."""

    rank: int
    world_size: int
    context_rank: int
    context_size: int


def mesh_coordinates(mesh: DeviceMesh) -> MeshCoordinates:
    """This process's ``(rank, world_size, context_rank, context_size)`` in ``mesh``.

    Dimensions named in ``DATA_DIMS`` make the data-parallel coordinate, those in
    ``CONTEXT_DIMS`` the context-parallel one (several of either multiply, row-major in the
    mesh's order); any other dimension (tensor, pipeline, expert parallelism) holds replicas
    that receive identical data. A mesh with neither kind of dimension gives ``(0, 1, 0, 1)``:
    every rank reads the whole step. Pass the mesh that holds the data- and context-parallel
    dimensions (the world mesh, or a submesh of those): a submesh that leaves one out hides it.
    """
    names = getattr(mesh, "mesh_dim_names", None)
    get_coordinate = getattr(mesh, "get_coordinate", None)
    if get_coordinate is None:
        raise TypeError(
            f"device_mesh must be a torch.distributed DeviceMesh, got {type(mesh).__name__}"
        )
    if names is None:
        raise ValueError(
            "device_mesh has no dimension names: build it with mesh_dim_names (data-parallel "
            f"dimensions among {DATA_DIMS}, context-parallel among {CONTEXT_DIMS}) so that "
            "ZeroBatch knows which dimension splits the data"
        )
    coordinate = get_coordinate()
    if coordinate is None:
        raise ValueError(f"this process is not part of device_mesh {mesh}: it has no coordinates")
    shape = tuple(mesh.shape)

    def flat(dims: tuple[str, ...]) -> tuple[int, int]:
        rank, size = 0, 1
        for name, index, length in zip(names, coordinate, shape, strict=True):
            if name in dims:
                rank, size = rank * length + index, size * length
        return rank, size

    return MeshCoordinates(*flat(DATA_DIMS), *flat(CONTEXT_DIMS))


class _TorchStream(BatchStream[TorchItem]):
    """What both PyTorch classes share: tensors, coordinates from ``torch.distributed``.

    int32 tensors of a uint32 file are zero-copy views of the read-only mapped file (exact for
    ids below 2**31): **never modify them in place** (``t.add_(1)`` would crash the process
    with SIGSEGV); ``.clone()`` or ``.long()`` first. int64 tensors, and int32 tensors of a
    uint16 file, are copies; labels are always int64, as ``cross_entropy`` wants. PyTorch has
    no general uint32 support.

    ``device_mesh`` (a ``DeviceMesh`` with named dimensions) gives the data- and
    context-parallel coordinates wherever explicit ones are not given (``mesh_coordinates``);
    without it, data parallelism is the default process group's ranks, else ``RANK``/
    ``WORLD_SIZE``, and there is no context parallelism unless ``context_rank``/
    ``context_size`` are given.
    """

    dtypes = ("int32", "int64")
    _mesh: MeshCoordinates | None = None  # plain integers: copies sent to workers carry them

    def __init__(
        self,
        source: Source,
        *,
        device_mesh: DeviceMesh | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        self._mesh = None if device_mesh is None else mesh_coordinates(device_mesh)
        super().__init__(source, **options)

    def _detected_rank_world(self) -> tuple[int, int] | None:
        if self._mesh is not None:
            return self._mesh.rank, self._mesh.world_size
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return None

    def _detected_context(self) -> tuple[int, int] | None:
        if self._mesh is not None:
            return self._mesh.context_rank, self._mesh.context_size
        return None

    @property
    def token_dtype(self) -> np.dtype[Any]:
        """NumPy dtype of the source's stored tokens (what crosses to a device as it is)."""
        return self.loader.token_dtype

    def _converter(self, key: str) -> Callable[[Any], torch.Tensor]:
        served = self.loader.label_dtype if key == "labels" else self.loader.dtype
        if served in ("uint32", "native"):  # the stored tokens, widened where they arrive
            return _stored_tensor
        return torch.from_numpy

    def _pair(self, inputs: Any, labels: Any) -> NextTokenBatch:
        return NextTokenBatch(inputs, labels)

    def __iter__(self) -> Iterator[TorchItem]:
        ignore_readonly_warning()
        # PyTorch warns about a read-only array once per process: take that warning here,
        # where the filter above applies, so the per-batch conversions can stay bare calls.
        torch.from_numpy(READONLY_PROBE)
        return super().__iter__()


def _stored_tensor(array: npt.NDArray[Any]) -> torch.Tensor:
    """Stored tokens as a tensor, no copy: uint32 as their int32 bits, uint16 as they are."""
    if array.dtype.itemsize == TOKEN_DTYPE.itemsize:
        return torch.from_numpy(array.view(np.int32))
    return torch.from_numpy(array)


class TorchBatchDataset(_TorchStream, IterableDataset[TorchItem]):
    """Batches of one LLMBATCH file as tensors, for ``DataLoader(ds, batch_size=None)``.

    Each item is one step's batch, ``[B // world_size, T]`` (``T // context_size`` columns
    with context parallelism), a ``NextTokenBatch(inputs, labels)`` with ``next_token=True``,
    or a ``DocumentBatch`` dict with ``bos_id``. The arguments are
    ``zerobatch_core.BatchStream``'s and ``device_mesh``; coordinates come from the arguments,
    else ``device_mesh``, else an initialised ``torch.distributed`` group, else
    ``RANK``/``WORLD_SIZE`` (as ``torchrun`` sets them).

    With ``num_workers=k`` in the ``DataLoader``, worker ``w`` serves steps ``w, w + k, ...``
    from the dataset's cursor, the round-robin order the ``DataLoader`` collects them in, so
    the output equals the single-process order. Each worker iterates its own copy: the
    dataset in the main process does not advance, so call ``set_epoch(e)`` before each epoch
    (as with ``DistributedSampler``), or use ``TorchBatchLoader``, which handles this.
    ``state_dict``/``load_state_dict`` make it resumable under torchdata's
    ``StatefulDataLoader``, which calls them inside each worker. In a worker, batches are
    tensors as usual (a subclass that behaves as a plain tensor), so transforms made there
    apply; unchanged batches reach the main process as file coordinates (see the module
    docstring), changed ones as their bytes.
    """

    accepts_worker_states = True

    def _worker(self) -> tuple[int, int] | None:
        info = get_worker_info()
        return None if info is None else (info.id, info.num_workers)

    def __iter__(self) -> Iterator[TorchItem]:
        items = super().__iter__()
        return items if get_worker_info() is None else ship(self.loader, items, NextTokenBatch)


class TorchBatchLoader(_TorchStream):
    """A resumable loader of tensors, served from this process.

    The surface and the common arguments are ``zerobatch_core.BatchStream``'s: iterating
    serves the rest of the current epoch, the next ``iter`` the next epoch, and
    ``state_dict`` counts the batches the training loop received, so it is exact with
    read-ahead to a device.

    ``num_workers`` and ``multiprocessing_context`` are accepted for code written for a
    ``DataLoader``, and start no process: batches are views of the mapped file and int64
    conversions run on a background thread, so a worker process could only add a transfer
    per batch (measured in ``benchmarks/RESULTS.md``). ``device`` (e.g. ``"cuda"``) moves every
    batch there on a background thread, ``prefetch`` batches ahead: tokens and labels cross as
    int32 (half the bytes of int64) and are widened on the device where int64 is asked for
    (``dtype="int64"``, and labels), exactly for every uint32 id, so the host converts nothing.
    A uint16 file's tokens cross as uint16 (a quarter of int64's bytes) and the device widens
    them to ``dtype`` (and labels to int64): the same values as from a uint32 file.
    ``pin_memory=True`` copies each batch through a ring of
    reused pinned buffers first (no pinned allocation per batch), for asynchronous copies;
    without ``device`` it pins each host batch. ``device_mesh`` gives the parallel coordinates,
    as for ``TorchBatchDataset``.
    """

    def __init__(
        self,
        source: Source,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        device: torch.device | str | None = None,
        multiprocessing_context: str | None = None,
        device_mesh: DeviceMesh | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        self.num_workers = int_arg("num_workers", num_workers, 0)
        self.multiprocessing_context = multiprocessing_context
        self.device = None if device is None else torch.device(device)
        self.pin_memory = bool(pin_memory) and (_can_pin() or self.device is not None)
        super().__init__(source, device_mesh=device_mesh, **options)
        self.ring = (
            StagingRing(self.device, self.prefetch + 2, _can_pin(warn=False))
            if self.pin_memory and self.device is not None
            else None
        )
        self._widen = self._widened() if self.device is not None else {}

    def _widened(self) -> dict[str, torch.dtype]:
        """The fields the device widens, and to what: every token field of a uint16 file; int64
        tokens (``dtype="int64"``) and labels of a uint32 file, whose int32 bits cross."""
        out = _TORCH_DTYPES[self.dtype]
        if self.token_dtype == NARROW_TOKEN_DTYPE:
            return {"tokens": out, "inputs": out, "labels": torch.int64}
        wide = {"labels": torch.int64}
        if self.dtype == "int64":
            wide |= {"tokens": torch.int64, "inputs": torch.int64}
        return wide

    def _host_dtypes(
        self, dtype: OutputDType, token_dtype: np.dtype[Any] = TOKEN_DTYPE
    ) -> tuple[OutputDType, LabelDType]:
        """With a device, the stored tokens cross and the device widens: no conversion on the
        host (uint16 as they are; uint32 as int32 views, labels as the uint32 tokens)."""
        if self.device is None:
            return dtype, "int64"
        if np.dtype(token_dtype) == NARROW_TOKEN_DTYPE:
            return "native", "native"
        return "int32", "uint32"

    def _stage(self) -> Stage | None:
        return "thread" if self.device is not None or self.pin_memory else None

    def _transfer(self, item: TorchItem) -> TorchItem:
        if self.device is None:
            return _map_tensors(item, torch.Tensor.pin_memory)
        if isinstance(item, dict):
            return {key: self._send(key, t) for key, t in item.items()}
        if isinstance(item, NextTokenBatch):
            return NextTokenBatch(
                self._send("inputs", item.inputs), self._send("labels", item.labels)
            )
        return self._send("tokens", item)

    def _send(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """One field to the device (through the ring when pinning), widened there if it must."""
        device = self.device
        assert device is not None
        if self.ring is not None:
            moved = self.ring.send(key, tensor)
        else:
            moved = tensor.to(device, non_blocking=True)
        target = self._widen.get(key)
        if target is None or moved.dtype == target:
            return moved
        if moved.dtype == torch.int32:  # int32 bits of uint32 ids: zero-extend
            return moved.to(torch.int64).bitwise_and_(U32_MAX)
        return moved.to(target)  # uint16 ids: exact in int32 and int64


def _can_pin(warn: bool = True) -> bool:
    """Whether pinned memory exists here; without an accelerator, say so once, as PyTorch does."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return True
    if torch.cuda.is_available():
        return True
    if warn:
        warnings.warn(
            "pin_memory=True but no accelerator is found: batches are not pinned", stacklevel=3
        )
    return False


def _map_tensors(item: TorchItem, fn: Callable[[torch.Tensor], torch.Tensor]) -> TorchItem:
    """``fn`` applied to every tensor of an item, keeping its structure."""
    if isinstance(item, dict):
        return {key: fn(t) for key, t in item.items()}
    if isinstance(item, NextTokenBatch):
        return NextTokenBatch(fn(item.inputs), fn(item.labels))
    return fn(item)
