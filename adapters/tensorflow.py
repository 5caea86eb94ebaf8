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
every element a dict that adds the document layout of ``zerobatch_core.documents``, computed in
the graph with a few vectorised ops per batch (``cu_seqlens`` has shape ``[None]``).

Token ids at or above 2**31 wrap to negative values with ``dtype="int32"`` (a bit-cast, exactly
like the core's int32 view); use ``"int64"`` for vocabularies that large.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import tensorflow as tf
from zerobatch_spec import U64_MAX, batch_offset

from zerobatch_core import BatchStream, Item, Source, int_arg

__all__ = ["TFBatchDataset", "tf_dataset"]

_TF_DTYPES: dict[str, Any] = {"int32": tf.int32, "int64": tf.int64}


class TFBatchDataset(BatchStream[Any]):
    """An LLMBATCH file as ``tf.data`` elements, in ``BatchNativeLoader``'s order.

    The arguments are ``zerobatch_core.BatchStream``'s (``prefetch``: any positive value adds
    a ``prefetch`` stage whose buffer tf.data tunes itself; ``0`` adds none). The file is opened and validated first, so a broken
    file raises ``zerobatch_core.FormatError`` before any TensorFlow op runs. Elements are the
    rank's rows ``[B // world_size, T]`` in ``dtype`` (int32 bit-cast, or int64
    zero-extended), ``(inputs, labels)`` with ``next_token`` (labels always int64, exact for
    every uint32 id), or a dict with ``bos_id``. Shapes are static (``cu_seqlens`` excepted).
    """

    dtypes = ("int32", "int64")

    def _produce(self, convert: Callable[[Item], Any]) -> Iterator[Any]:
        return iter(self._pipeline(1, finish_open_pass=True))

    def dataset(self, num_epochs: int | None = 1) -> Any:
        """A ``tf.data.Dataset`` of ``num_epochs`` epochs from the cursor (``None``: for ever).

        The first epoch starts at the cursor (a fully served epoch counts as done), the others
        are whole; the cardinality is set, so ``len(ds)`` and Keras progress bars work. The
        dataset is a description, not a cursor: iterating it again starts at the same place,
        and it does not move this object's cursor. For Keras, pass ``num_epochs=None`` and
        ``fit(ds, epochs=N, steps_per_epoch=len(data))`` so each Keras epoch is the next one.
        """
        count = None if num_epochs is None else int_arg("num_epochs", num_epochs, 0)
        return self._pipeline(count, finish_open_pass=False)

    def _pipeline(self, num_epochs: int | None, *, finish_open_pass: bool) -> Any:
        loader = self.loader
        position = self.position
        if not finish_open_pass:
            position = loader.next_pass(position)
        h = loader.reader.header
        first_epoch, first_step = position
        n, seq_len = h.num_batches, h.seq_len
        rows, order, bos = loader.rows, loader.order, loader.bos_id
        next_token, out_dtype = loader.next_token, _TF_DTYPES[self.dtype]
        filename = loader.reader.path

        def slot_ranges(index: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
            """``[spans, 2]``: the file bytes before and after each span of slots of epoch
            ``first_epoch + index``, in serving order. Epoch numbers are u64 and stay in
            Python: the graph only counts epochs from 0."""
            i = int(index)
            spans = order.spans((first_epoch + i) & U64_MAX, first_step if i == 0 else 0)
            b, t = h.batch_size, seq_len
            flat = [
                bound
                for s in spans
                for bound in (batch_offset(s.start, b, t), h.file_size - batch_offset(s.stop, b, t))
            ]
            return np.asarray(flat, dtype=np.int64).reshape(-1, 2)

        def epoch_spans(index: Any) -> Any:
            ranges = tf.numpy_function(slot_ranges, [index], tf.int64, stateful=False)
            ranges.set_shape([None, 2])
            return tf.data.Dataset.from_tensor_slices(ranges)

        def read_span(span: Any) -> Any:
            """The span's slots, one record per slot, as raw bytes."""
            return tf.data.FixedLengthRecordDataset(
                filename, h.padded_batch_bytes, header_bytes=span[0], footer_bytes=span[1]
            )

        def decode(record: Any) -> Any:
            # decode_raw has no uint32: read the little-endian words as int32 (the same bits).
            words = tf.io.decode_raw(record, tf.int32, little_endian=True)
            tokens = words[rows.start * seq_len : rows.stop * seq_len]
            mine = tf.reshape(tokens, [rows.stop - rows.start, seq_len])
            if bos is not None:
                return _documents(mine, bos, next_token, out_dtype)
            if not next_token:
                return _convert(mine, out_dtype)
            return _convert(mine[:, :-1], out_dtype), _convert(mine[:, 1:], tf.int64)

        if (finish_open_pass and first_step >= n) or n == 0:  # the rest of a served epoch: nothing
            epochs, total = tf.data.Dataset.range(0), 0
        elif num_epochs is None:
            epochs, total = tf.data.Dataset.counter(), tf.data.INFINITE_CARDINALITY
        else:
            epochs = tf.data.Dataset.range(num_epochs)
            total = 0 if num_epochs == 0 else n - first_step + (num_epochs - 1) * n
        ds = (
            epochs.flat_map(epoch_spans)
            .flat_map(read_span)
            .map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .apply(tf.data.experimental.assert_cardinality(total))
        )
        # tf.data tunes its own buffer (AUTOTUNE), which measured faster than a fixed depth.
        return ds.prefetch(tf.data.AUTOTUNE) if self.prefetch else ds


def tf_dataset(
    source: Source,
    *,
    num_epochs: int | None = 1,
    state: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """The ``tf.data.Dataset`` of ``TFBatchDataset(source, **options)`` from its cursor, or from
    ``state`` (any adapter's ``state_dict``): ``num_epochs`` epochs, ``None`` for ever."""
    with TFBatchDataset(source, **options) as data:
        if state is not None:
            data.load_state_dict(dict(state))
        return data.dataset(num_epochs)


def _convert(words: Any, out_dtype: Any) -> Any:
    """uint32 tokens held as int32 bits, as ``out_dtype``.

    int32 keeps the bits (ids >= 2**31 wrap, like the core's int32 view); int64 goes through
    uint32 so that it zero-extends, giving every uint32 id exactly.
    """
    if out_dtype == tf.int32:
        return words
    return tf.cast(tf.bitcast(words, tf.uint32), out_dtype)


def _documents(words: Any, bos_id: int, next_token: bool, out_dtype: Any) -> dict[str, Any]:
    """One element of a ``bos_id`` dataset: the tokens and their document layout, in the graph.

    The same layout as ``zerobatch_core.documents.document_layout``, vectorised over the batch:
    a document starts at every BOS and at every row start; ``segment_ids`` counts the starts
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
    bos = tf.constant(np.array(bos_id, dtype=np.uint32).view(np.int32))  # the id's int32 bits
    starts = tf.logical_or(tf.equal(tokens, bos), tf.equal(tf.range(width), 0)[tf.newaxis, :])
    flat = tf.reshape(starts, [-1])
    first = tf.cast(tf.where(flat)[:, 0], tf.int32)  # flat index of every document's start
    document = tf.cumsum(tf.cast(flat, tf.int32)) - 1  # document of every token, over the batch
    positions = tf.range(rows * width, dtype=tf.int32) - tf.gather(first, document)
    item["segment_ids"] = tf.cumsum(tf.cast(starts, tf.int32), axis=1)
    item["positions"] = tf.reshape(positions, [rows, width])
    item["cu_seqlens"] = tf.concat([first, tf.constant([rows * width], tf.int32)], axis=0)
    return item
