"""TensorFlow adapter: a ``tf.data`` pipeline over an LLMBATCH file, read by TensorFlow's readers.

``TFBatchDataset`` has the surface every ZeroBatch adapter has (``zerobatch_core.BatchStream``:
epochs, ``len``, ``state_dict``/``load_state_dict`` of the batches the loop received, ``close``)
and serves each pass through a native ``tf.data`` pipeline. ``dataset(num_epochs)`` returns that
pipeline from the current cursor for Keras' ``fit``. Everything per batch runs inside the
graph: each run of consecutive batches (a block, or the cut first block of a resumed epoch) is
one ``tf.data.FixedLengthRecordDataset`` whose header and footer skip every other slot, decoded
with ``tf.io.decode_raw``. The only Python in the pipeline is one ``tf.numpy_function`` call per
epoch that asks the core's ``BlockOrder`` for that epoch's spans, so the order is never
re-implemented here and no Python generator runs per element.

Usage::

    from zerobatch_adapters.tensorflow import TFBatchDataset, tf_dataset

    with TFBatchDataset("train.batch", block_size=64, next_token=True) as data:
        for epoch in range(data.epoch, 3):
            data.set_epoch(epoch)
            for inputs, labels in data:  # int32 [B, T - 1] inputs, int64 labels
                train_step(inputs, labels)
                save(data.state_dict())

    model.fit(tf_dataset("train.batch", num_epochs=None), epochs=3, steps_per_epoch=n)

Packed rows (several documents per row, each starting with a BOS token): ``bos_id=...`` makes
every element a dict that adds the document layout of ``zerobatch_core.document_layout``,
computed in the graph with a few vectorised ops per batch (``cu_seqlens`` has shape ``[None]``).

Token ids at or above 2**31 wrap to negative values with ``dtype="int32"`` (a bit-cast, exactly
like the core's int32 view); use ``"int64"`` for vocabularies that large. A uint16 file (dtype 1)
is read as ``tf.uint16`` records, half the bytes, and cast to ``dtype`` in the graph: the same
elements as the uint32 file of the same tokens.

``tf.distribute``: pass the ``tf.distribute.InputContext`` that
``strategy.distribute_datasets_from_function`` hands its function as ``input_context=``; input
pipeline ``input_pipeline_id`` of ``num_input_pipelines`` reads its data-parallel share of
every global batch::

    def dataset_fn(ctx):
        return TFBatchDataset("train.batch", next_token=True, input_context=ctx).dataset()

    batches = strategy.distribute_datasets_from_function(dataset_fn)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import tensorflow as tf
from zerobatch_spec import (
    U64_MAX,
    batch_offset,
    dtype_code,
    padded_batch_bytes,
)

from zerobatch_core import (
    BatchFileReader,
    BatchStream,
    DatasetReader,
    Item,
    Position,
    Source,
    StreamOptions,
    int_arg,
)
from zerobatch_core.delivery.stream import NARROW_TOKEN_DTYPE

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["TFBatchDataset", "tf_dataset"]

_TF_DTYPES: dict[str, Any] = {"int32": tf.int32, "int64": tf.int64}


class TFBatchDataset(BatchStream[Any]):
    """A file's or a dataset's batches as ``tf.data`` elements, in ``BatchNativeLoader``'s order.

    The arguments are ``zerobatch_core.BatchStream``'s (``prefetch``: any positive value adds a
    ``prefetch`` stage whose buffer tf.data tunes itself; ``0`` adds none). The source is
    opened and validated first, so a broken file raises ``zerobatch_core.FormatError`` before
    any TensorFlow op runs. Elements are the rank's share ``[G // world_size, width]`` in
    ``dtype`` (int32 bit-cast, or int64 zero-extended), ``(inputs, labels)`` with
    ``next_token`` (labels always int64, exact for every uint32 id), or a dict with
    ``bos_id``. Shapes are static (``cu_seqlens`` excepted). A uint16 file gives the same
    elements: its records are decoded as ``tf.uint16`` and cast in the graph (and on the
    ``from_generator`` path the core loader widens them).

    The pipeline reads with TensorFlow's own record reader when each step is one stored batch
    and one contiguous token range, with nothing skipped and no checksum to check (a file, or a
    dataset with ``verify="off"``); otherwise (several stored batches per step, zig-zag chunks,
    ``skip_steps``, checksum verification) elements come from the core loader through
    ``tf.data.Dataset.from_generator``: the same elements, with Python in the loop.

    Data-parallel coordinates: explicit ``rank``/``world_size``; else ``input_context`` (a
    ``tf.distribute.InputContext``), following ``tf.distribute``'s convention that each input
    pipeline reads its own part of the data: pipeline ``input_pipeline_id`` of
    ``num_input_pipelines`` is rank ``input_pipeline_id`` of ``num_input_pipelines``; else
    ``RANK``/``WORLD_SIZE``. Each element is then the pipeline's share of the global batch,
    ``G // num_input_pipelines`` rows. ``tf.distribute`` hands each replica of a pipeline one
    element per step, so with several replicas per pipeline split the share into per-replica
    batches (``ds.rebatch(ctx.get_per_replica_batch_size(G))``: consecutive rows go to the
    pipeline's replicas in order, the rows of data-parallel replica ``pipeline * k + j``).
    """

    dtypes = ("int32", "int64")
    _pipeline_rank: tuple[int, int] | None = None  # (input_pipeline_id, num_input_pipelines)

    def __init__(
        self,
        source: Source,
        *,
        input_context: tf.distribute.InputContext | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        if input_context is None:
            self._pipeline_rank = None
        elif isinstance(input_context, tf.distribute.InputContext):
            self._pipeline_rank = (
                input_context.input_pipeline_id,
                input_context.num_input_pipelines,
            )
        else:
            raise TypeError(
                "input_context must be a tf.distribute.InputContext, got "
                f"{type(input_context).__name__}"
            )
        super().__init__(source, **options)

    def _detected_rank_world(self) -> tuple[int, int] | None:
        return self._pipeline_rank

    def _native(self) -> bool:
        loader = self.loader
        if not isinstance(loader.source, (BatchFileReader, DatasetReader)):
            return False  # remote and live sources: the core loader's range reads
        verified = isinstance(loader.source, DatasetReader) and loader.source.verify != "off"
        simple = loader.global_batch_size == loader.source.batch_size
        return simple and len(loader.columns) == 1 and not loader.skip_steps and not verified

    def _produce(self, convert: Callable[[Item], Any]) -> Iterator[Any] | None:
        return iter(self._pipeline(1, finish_open_pass=True)) if self._native() else None

    def _converter(self, key: str) -> Callable[[Any], Any]:
        return _tensor

    def dataset(self, num_epochs: int | None = 1) -> Any:
        """A ``tf.data.Dataset`` of ``num_epochs`` epochs from the cursor (``None``: for ever).

        The first epoch starts at the cursor (a fully served epoch counts as done), the others
        are whole; the cardinality is set, so ``len(ds)`` and Keras progress bars work. The
        dataset is a description, not a cursor: iterating it again starts at the same place,
        and it does not move this object's cursor. For Keras, pass ``num_epochs=None`` and
        ``fit(ds, epochs=N, steps_per_epoch=len(data))`` so each Keras epoch is the next one.
        """
        count = None if num_epochs is None else int_arg("num_epochs", num_epochs, 0)
        if self._native():
            return self._pipeline(count, finish_open_pass=False)
        return self._generated(count)

    def _epochs(self, num_epochs: int | None, first_step: int, steps: int) -> tuple[Any, Any]:
        """The epoch counter dataset and the cardinality of ``num_epochs`` epochs."""
        if steps == 0 or num_epochs == 0:
            return tf.data.Dataset.range(0), 0
        if num_epochs is None:
            return tf.data.Dataset.counter(), tf.data.INFINITE_CARDINALITY
        return tf.data.Dataset.range(num_epochs), steps - first_step + (num_epochs - 1) * steps

    def _generated(self, num_epochs: int | None) -> Any:
        """The core loader's items through ``from_generator`` (any layout, checksums checked)."""
        start = self.loader.copy()
        start.seek(start.next_pass(self.position))
        convert = self._item_converter()

        def items() -> Iterator[Any]:
            loader = start.copy()
            for _ in itertools.count() if num_epochs is None else range(num_epochs):
                yield from map(convert, loader)

        example = next(iter(start.copy()), None) if len(start) else None
        if example is None:
            return tf.data.Dataset.range(0)
        spec = tf.nest.map_structure(_spec, convert(example))
        if num_epochs is None:
            total = tf.data.INFINITE_CARDINALITY
        else:
            e, first = start.position
            total = sum(
                start.served(Position((e + k) & U64_MAX, first if k == 0 else 0))
                for k in range(num_epochs)
            )
        ds = tf.data.Dataset.from_generator(items, output_signature=spec)
        ds = ds.apply(tf.data.experimental.assert_cardinality(total))
        return ds.prefetch(tf.data.AUTOTUNE) if self.prefetch else ds

    def _pipeline(self, num_epochs: int | None, *, finish_open_pass: bool) -> Any:
        loader = self.loader
        position = self.position
        if not finish_open_pass:
            position = loader.next_pass(position)
        source = loader.source
        assert isinstance(source, (BatchFileReader, DatasetReader))  # _native: local files
        first_epoch, first_step = position
        n, batch_size, seq_len = source.num_batches, source.batch_size, source.seq_len
        rows, order, bos = loader.rows, loader.order, loader.bos_id
        lo, hi = loader.columns[0]
        next_token, out_dtype = loader.next_token, _TF_DTYPES[self.dtype]
        files, slot_bytes, locate = _slot_locator(source)
        # decode_raw has no uint32: uint32 tokens are read as int32 (the same bits).
        stored = tf.uint16 if source.token_dtype == NARROW_TOKEN_DTYPE else tf.int32

        def slot_ranges(index: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
            """``[spans, 3]``: the file, and its bytes before and after, of each span of slots
            of epoch ``first_epoch + index``, in serving order (a span never crosses a shard).
            Epoch numbers are u64 and stay in Python: the graph only counts epochs from 0."""
            i = int(index)
            spans = order.spans((first_epoch + i) & U64_MAX, first_step if i == 0 else 0)
            flat = [bound for s in spans for bound in locate(s.start, s.stop)]
            return np.asarray(flat, dtype=np.int64).reshape(-1, 3)

        def epoch_spans(index: Any) -> Any:
            ranges = tf.numpy_function(slot_ranges, [index], tf.int64, stateful=False)
            ranges.set_shape([None, 3])
            return tf.data.Dataset.from_tensor_slices(ranges)

        def read_span(span: Any) -> Any:
            """The span's slots, one record per slot, as raw bytes."""
            return tf.data.FixedLengthRecordDataset(
                tf.gather(files, span[0]), slot_bytes, header_bytes=span[1], footer_bytes=span[2]
            )

        extra = 1 if next_token else 0

        def decode(record: Any) -> Any:
            words = tf.io.decode_raw(record, stored, little_endian=True)
            tokens = words[rows.start * seq_len : rows.stop * seq_len]
            mine = tf.reshape(tokens, [rows.stop - rows.start, seq_len])[:, lo : hi + extra]
            if bos is not None:
                return _documents(mine, bos, next_token, out_dtype)
            if not next_token:
                return _convert(mine, out_dtype)
            return _convert(mine[:, :-1], out_dtype), _convert(mine[:, 1:], tf.int64)

        steps = n if batch_size else 0
        if finish_open_pass and first_step >= n:  # the rest of a served epoch: nothing
            epochs, total = tf.data.Dataset.range(0), 0
        else:
            epochs, total = self._epochs(num_epochs, first_step, steps)
        ds = (
            epochs.flat_map(epoch_spans)
            .flat_map(read_span)
            .map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .apply(tf.data.experimental.assert_cardinality(total))
        )
        # tf.data tunes its own buffer (AUTOTUNE), which measured faster than a fixed depth.
        return ds.prefetch(tf.data.AUTOTUNE) if self.prefetch else ds


def _slot_locator(
    source: BatchFileReader | DatasetReader,
) -> tuple[Any, int, Callable[[int, int], tuple[int, int, int]]]:
    """The source's file names (a string tensor), its slot size, and a function giving, for a
    run of slots ``[start, stop)`` inside one file, ``(file, bytes before, bytes after)``."""
    b, t = source.batch_size, source.seq_len
    code = dtype_code(source.token_dtype.name)
    if isinstance(source, BatchFileReader):
        size = source.file_size

        def in_file(start: int, stop: int) -> tuple[int, int, int]:
            return 0, batch_offset(start, b, t, code), size - batch_offset(stop, b, t, code)

        return tf.constant([source.path]), padded_batch_bytes(b, t, code), in_file
    names = [source.shard_path(i) for i in range(len(source.shards))]
    sizes = [shard.size for shard in source.shards]

    def in_shard(start: int, stop: int) -> tuple[int, int, int]:
        shard, local = source.locate(start)
        end = local + stop - start
        return shard, batch_offset(local, b, t, code), sizes[shard] - batch_offset(end, b, t, code)

    return tf.constant(names), padded_batch_bytes(b, t, code), in_shard


def _tensor(array: Any) -> Any:
    return tf.convert_to_tensor(array)


def _spec(value: Any) -> Any:
    """A ``tf.TensorSpec`` for one element field (``cu_seqlens`` varies in length)."""
    shape = list(value.shape)
    return tf.TensorSpec([None] * len(shape) if len(shape) == 1 else shape, value.dtype)


def tf_dataset(
    source: Source,
    *,
    num_epochs: int | None = 1,
    state: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """The ``tf.data.Dataset`` of ``TFBatchDataset(source, **options)`` from its cursor, or from
    ``state`` (any adapter's ``state_dict``): ``num_epochs`` epochs, ``None`` for ever.

    A pipeline of TensorFlow's record reader needs nothing open here; one served through
    ``from_generator`` (see ``TFBatchDataset``) keeps the source open for as long as the
    dataset exists, since its generator reads through it.
    """
    data = TFBatchDataset(source, **options)
    try:
        if state is not None:
            data.load_state_dict(dict(state))
        dataset = data.dataset(num_epochs)
    except BaseException:
        data.close()
        raise
    if data._native():
        data.close()
    return dataset


def _convert(words: Any, out_dtype: Any) -> Any:
    """Stored tokens (uint16, or uint32 held as int32 bits) as ``out_dtype``.

    uint16 casts exactly to either. For uint32, int32 keeps the bits (ids >= 2**31 wrap, like
    the core's int32 view); int64 goes through uint32 so that it zero-extends, giving every
    uint32 id exactly.
    """
    if words.dtype == tf.uint16:
        return tf.cast(words, out_dtype)
    if out_dtype == tf.int32:
        return words
    return tf.cast(tf.bitcast(words, tf.uint32), out_dtype)


def _is_bos(tokens: Any, bos_id: int) -> Any:
    """Where ``tokens`` (uint16, or uint32 held as int32 bits) equal ``bos_id``."""
    if tokens.dtype == tf.uint16:  # the core loader refuses an id no uint16 token can be
        return tf.equal(tokens, tf.constant(bos_id, tf.uint16))
    bos = tf.constant(np.array(bos_id, dtype=np.uint32).view(np.int32))  # the id's int32 bits
    return tf.equal(tokens, bos)


def _documents(words: Any, bos_id: int, next_token: bool, out_dtype: Any) -> dict[str, Any]:
    """One element of a ``bos_id`` dataset: the tokens and their document layout, in the graph.

    The same layout as ``zerobatch_core.document_layout``, vectorised over the batch: a document
    starts at every BOS and at every row start; ``segment_ids`` counts the starts
    along each row. Since every row starts a document, numbering the starts over the flattened
    batch gives each token its document, whose start is an entry of ``cu_seqlens``: the
    position is the token's flat index minus that entry (no cumulative max needed).
    """
    if next_token:
        item = {
            "inputs": _convert(words[:, :-1], out_dtype),
            "labels": _convert(words[:, 1:], tf.int64),
        }
        tokens = words[:, :-1]
    else:
        item = {"tokens": _convert(words, out_dtype)}
        tokens = words
    rows, width = tokens.shape  # static
    starts = tf.logical_or(_is_bos(tokens, bos_id), tf.equal(tf.range(width), 0)[tf.newaxis, :])
    flat = tf.reshape(starts, [-1])
    first = tf.cast(tf.where(flat)[:, 0], tf.int32)  # flat index of every document's start
    document = tf.cumsum(tf.cast(flat, tf.int32)) - 1  # document of every token, over the batch
    positions = tf.range(rows * width, dtype=tf.int32) - tf.gather(first, document)
    item["segment_ids"] = tf.cumsum(tf.cast(starts, tf.int32), axis=1)
    item["positions"] = tf.reshape(positions, [rows, width])
    item["cu_seqlens"] = tf.concat([first, tf.constant([rows * width], tf.int32)], axis=0)
    return item
