"""JAX adapter: LLMBATCH batches as sharded ``jax.Array``s, prefetched onto the devices.

``JaxBatchIterator`` serves ``BatchNativeLoader``'s batches as global ``jax.Array``s laid out
by a ``jax.sharding.Sharding`` (default: the batch axis split over every device). Each process
reads from the file only the rows its own devices hold, and
``jax.make_array_from_process_local_data`` copies each device's rows from the host straight
to that device, once: no device ever holds, or gathers, the whole batch. The core's look-ahead
keeps the next ``prefetch`` batches in flight while the training step runs, and ``state_dict``
counts only the batches the loop received (``zerobatch_core.BatchStream``). A uint16 file's
tokens (dtype 1) cross as they are stored, half the bytes of int32, and the devices widen them
to ``dtype``: the batches equal those of the uint32 file of the same tokens.

Usage::

    from zerobatch_adapters.jax import JaxBatchIterator

    it = JaxBatchIterator("train.batch", block_size=64, next_token=True, prefetch=2)
    for epoch in range(3):
        it.set_epoch(epoch)
        for inputs, labels in it:  # int32 [B, T - 1] jax.Arrays, rows split over devices
            params, loss = train_step(params, inputs, labels)  # a jax.jit step
        save_json(it.state_dict())  # plain ints; resume with it.load_state_dict(...)
    it.close()

Packed rows (several documents per row, each starting with a BOS token): with ``bos_id=...``
every batch is a dict (``DocumentBatch``) that adds the core's document layout::

    it = JaxBatchIterator("train.batch", next_token=True, bos_id=tok.bos_id)
    for b in it:  # b["inputs"], b["labels"], b["segment_ids"], b["positions"]: sharded [B, T - 1]
        cu_seqlens = b.pop("cu_seqlens")  # host NumPy int32 of varying length: not for jit
        params, loss = train_step(params, b)  # segment ids: e.g. splash attention's mask

Context parallelism: a ``NamedSharding`` over a 2-D ``("data", "context")`` mesh with
``PartitionSpec("data", "context")`` (``data_context_sharding``) splits the rows over
``"data"`` and the token columns over ``"context"``; each process reads only its devices'
block of rows and columns::

    sharding = data_context_sharding(context_size=2)  # e.g. 4 x 2 devices
    it = JaxBatchIterator("train.batch", sharding=sharding, next_token=True, zigzag=True)

With ``zigzag=True`` the global array's columns are in zig-zag order: with ``C`` devices on
the context axis and the width cut into ``2C`` chunks, device ``c`` holds chunks ``c`` and
``2C - 1 - c`` (the load-balanced split for causal attention), so the plain contiguous split
of the context axis gives every device its balanced chunks. Position-dependent code (RoPE,
causal masks) must use the same order; a chunk's labels are its tokens one position later.

Multi-host: call ``jax.distributed.initialize()`` first, then build the same iterator (same
file, same sharding over the global mesh) in every process. Block order, rank slicing,
next-token pairs and the checkpoint cursor all come from ``zerobatch_core``; this module only
maps the sharding to the core's ``Slicing`` (``process_block``) and moves arrays to devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import jax
import numpy as np
from jax.sharding import Sharding
from zerobatch_spec import TOKEN_DTYPE

from zerobatch_core import (
    BatchSource,
    BatchStream,
    Layout,
    OutputDType,
    Slicing,
    Source,
    Stage,
    StreamOptions,
    resolve_rank_world,
)
from zerobatch_core.delivery.loader import LabelDType
from zerobatch_core.delivery.stream import NARROW_TOKEN_DTYPE

from .jax_sharding import (
    CONTEXT_AXIS,
    DATA_AXIS,
    ProcessBlock,
    ProcessRows,
    data_context_sharding,
    default_sharding,
    process_block,
    process_rows,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CONTEXT_AXIS",
    "DATA_AXIS",
    "DocumentBatch",
    "JaxBatchIterator",
    "ProcessBlock",
    "ProcessRows",
    "data_context_sharding",
    "default_sharding",
    "process_block",
    "process_rows",
]


class DocumentBatch(TypedDict, total=False):
    """A ``bos_id`` batch: the tokens (or next-token pair) and their document layout.

    ``tokens`` without ``next_token``, else ``inputs`` and ``labels``; ``segment_ids`` and
    ``positions`` are those of the tokens (or inputs). Every ``jax.Array`` is int32 with the
    tokens' shape and sharding. ``cu_seqlens`` is a host NumPy array (see ``JaxBatchIterator``).
    """

    tokens: jax.Array
    inputs: jax.Array
    labels: jax.Array
    segment_ids: jax.Array
    positions: jax.Array
    cu_seqlens: np.ndarray[Any, np.dtype[np.int32]]


# Typed name for a JAX entry point that is unannotated in JAX itself.
_make_array: Callable[[Sharding, np.ndarray[Any, Any], tuple[int, ...]], jax.Array] = (
    jax.make_array_from_process_local_data
)


class JaxBatchIterator(BatchStream[Any]):
    """Iterate an LLMBATCH file as sharded ``jax.Array`` batches, prefetched to the devices.

    Each item is a global ``jax.Array`` ``[rows, seq_len]`` placed with ``sharding`` (default
    ``default_sharding()``), or with ``next_token=True`` a pair ``(inputs, labels)`` of
    ``[rows, seq_len - 1]`` arrays with the same sharding, where ``rows`` is the batch size
    (or, with ``rank``/``world_size``, that rank's share: ``rows // world_size``). Inputs and
    labels share one dtype, ``dtype`` (int32 by default, JAX's own integer width: the core's
    zero-copy view; ids of 2**31 and above wrap to negative numbers. ``"int64"`` needs
    ``jax.config.update("jax_enable_x64", True)``); ``optax``/``jax.nn`` cross-entropy takes
    int32 labels. From a uint16 file the devices receive the stored uint16 tokens (half the
    bytes of each host-to-device copy) and widen them to ``dtype`` with one compiled
    conversion per array shape: exactly the values of the same tokens stored as uint32.

    ``bos_id`` (packed rows whose documents start with that token) makes each item a
    ``DocumentBatch`` dict: ``tokens`` (or ``inputs`` and ``labels``) plus the core's document
    layout of the tokens (or inputs), ``segment_ids`` and ``positions``, int32 ``jax.Array``s
    with the tokens' shape and sharding (e.g. splash attention's segment ids, RoPE positions).
    ``cu_seqlens`` (FlashAttention's varlen layout) is served as a **host NumPy** int32 array:
    its length (documents + 1) varies from batch to batch, so it can neither be split by rows
    over the devices nor passed to ``jax.jit`` without a recompile per length. It covers this
    process's rows only, flattened in order (exact, since segments restart at every row).

    Ranks: by default the whole step is the global array and the sharding alone says which
    process reads which block of it (``rank``/``world_size`` are not read from the
    environment: under ``jax.distributed`` the processes are the sharding's). Rows split over
    the mesh are data parallelism; columns split over a mesh axis (``PartitionSpec("data",
    "context")``, see ``data_context_sharding``) are context parallelism: each process's
    devices must hold one contiguous run of rows and one contiguous run of columns
    (``process_block``), and the process reads only that block. With ``zigzag=True`` and the
    columns split over ``C`` devices, the global array's columns are in zig-zag order (device
    ``c`` holds token chunks ``c`` and ``2C - 1 - c`` of ``2C``), so each device's contiguous
    block is its load-balanced share; with ``next_token`` the labels follow the same order.
    Explicit ``rank``/``world_size`` (and ``context_rank``/``context_size``) serve that rank's
    share of every step as the global array, for several independent JAX programs splitting
    one dataset; the sharding then splits that share.

    Prefetch: right after handing out a batch, the copies of the next ``prefetch`` batches are
    dispatched (JAX copies asynchronously), so they overlap the caller's step. This happens on
    the caller's thread on purpose: on XLA's CPU backend, work dispatched from a second thread
    while a step runs collectives can starve the collective's rendezvous and abort. The rest
    of the surface (epochs, ``state_dict`` of delivered batches, ``close``) is ``BatchStream``'s.
    """

    dtypes = ("int32", "int64")

    def __init__(
        self,
        source: Source,
        *,
        sharding: Sharding | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        if options.get("dtype") == "int64" and jax.dtypes.canonicalize_dtype(np.int64) != np.int64:
            raise ValueError(
                "dtype='int64' needs 64-bit JAX: jax.config.update('jax_enable_x64', True) "
                "first, or use dtype='int32'"
            )
        self.sharding: Sharding = default_sharding() if sharding is None else sharding
        super().__init__(source, **options)
        self._widen: Callable[[jax.Array], jax.Array] | None = None

    def _widener(self) -> Callable[[jax.Array], jax.Array]:
        """uint16 tokens to ``dtype`` where they lie, each device its own part: one function
        for the iterator, compiled once per array shape (jit's cache) and reused by every
        batch and epoch."""
        if self._widen is None:
            dtype = np.dtype(self.dtype)
            self._widen = jax.jit(lambda tokens: tokens.astype(dtype), out_shardings=self.sharding)
        return self._widen

    def _host_dtypes(
        self, dtype: OutputDType, token_dtype: np.dtype[Any] = TOKEN_DTYPE
    ) -> tuple[OutputDType, LabelDType]:
        """uint16 tokens and labels as stored (the devices widen them); otherwise ``dtype``
        and int64 labels, converted on the host."""
        if np.dtype(token_dtype) == NARROW_TOKEN_DTYPE:
            return "native", "native"
        return dtype, "int64"

    def _slicing(
        self,
        reader: BatchSource,
        layout: Layout,
        next_token: bool,
        global_batch_size: int | None,
    ) -> Slicing:
        """The rank's share of the step, then this process's block of it by the sharding.

        Rows of the global array are data-parallel ranks, columns context-parallel ranks: a
        process holding rows ``[a, b)`` and the context devices ``c0 .. c0 + k - 1`` of ``C``
        reads with the core's ``Slicing(dp, D, c0, C, k, zigzag)``. Explicit coordinates pick
        the share first; the sharding then splits that share.
        """
        r, w = resolve_rank_world(layout.rank, layout.world_size, (0, 1), environment=False)
        c, size = resolve_rank_world(
            layout.context_rank,
            layout.context_size,
            (0, 1),
            names=("context_rank", "context_size"),
            environment=False,
        )
        g = reader.batch_size if global_batch_size is None else global_batch_size
        share = Slicing(r, w, c, size, 1, layout.zigzag)
        width = reader.seq_len - 1 if next_token else reader.seq_len
        share.check(g, reader.batch_size, width)
        columns = sum(hi - lo for lo, hi in share.columns(width))
        # The shape of every served array (inputs and labels alike with next_token).
        self.global_shape: tuple[int, int] = (share.samples_per_step(g), columns)
        try:
            indices = self.sharding.addressable_devices_indices_map(self.global_shape)
        except ValueError as e:
            raise ValueError(
                f"{reader.path}: the sharding cannot split a {self.global_shape} batch (its "
                f"{self.global_shape[0]} rows and {columns} columns must divide evenly over "
                f"its mesh axes): {e}"
            ) from e
        block = process_block(indices, self.global_shape)
        self.rows: slice = block.rows  # the rows of the global array this process reads
        self.columns: slice = block.columns  # and its columns
        dp = (r * block.world_size + block.rank, w * block.world_size)
        if block.context_size == 1:  # the share's columns are not split: all of them
            return Slicing(*dp, c, size, 1, share.zigzag)
        if share.zigzag and size > 1:
            raise ValueError(
                f"{reader.path}: zigzag with an explicit context_size {size} and a sharding "
                f"that splits the columns over {block.context_size} devices: give one of them "
                "(the sharding's context axis alone sets the zig-zag chunks)"
            )
        if share.zigzag and columns % (2 * block.context_size):
            raise ValueError(
                f"{reader.path}: zigzag over the sharding's {block.context_size} context "
                f"devices cuts the width {columns} into {2 * block.context_size} chunks, which "
                f"does not divide it (use a context axis whose size times 2 divides {columns})"
            )
        return Slicing(
            *dp,
            c * block.context_size + block.context_rank,
            size * block.context_size,
            block.context_count,
            share.zigzag,
        )

    def _converter(self, key: str) -> Callable[[np.ndarray[Any, Any]], Any]:
        if key == "cu_seqlens":
            return _host
        dtype = np.dtype(self.dtype)
        sharding, shape = self.sharding, self.global_shape
        widen = self._widener() if self.loader.token_dtype == NARROW_TOKEN_DTYPE else None

        def to_devices(local_block: np.ndarray[Any, Any]) -> jax.Array:
            # One global array from this process's block: each device gets its part, once.
            if widen is not None and local_block.dtype == NARROW_TOKEN_DTYPE:  # crosses as stored
                return widen(_make_array(sharding, local_block, shape))
            return _make_array(sharding, local_block.astype(dtype, copy=False), shape)

        return to_devices

    def _stage(self) -> Stage | None:
        return "caller"


def _host(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return array
