"""``tf.data`` input pipeline over an LLMBATCH file, read by TensorFlow's own file readers.

``tf_dataset`` returns a ``tf.data.Dataset`` whose elements are whole batches ``[B, T]`` (or one
rank's rows ``[B // world_size, T]``), in exactly the order ``BatchNativeLoader`` serves them.
Everything per batch runs inside the tf.data graph: each run of consecutive batches (a block,
or the cut first block of a resumed epoch) is one ``tf.data.FixedLengthRecordDataset`` whose
header and footer skip every other slot, decoded with ``tf.io.decode_raw``. The only Python in
the pipeline is one ``tf.numpy_function`` call per epoch that asks ``zerobatch_core``'s
``BlockOrder`` for that epoch's span list, so the block order is never re-implemented here
and no Python generator runs per element.

Usage::

    import tensorflow as tf
    from zerobatch_adapters.tensorflow import tf_dataset

    ds = tf_dataset("train.batch", block_size=64, num_epochs=3, next_token=True)
    model.fit(ds)  # elements: (int64 [B, T - 1] inputs, int64 [B, T - 1] labels)

    resumed = tf_dataset("train.batch", block_size=64, state=saved_loader_state)
    for batch in tf_dataset("train.batch", rank=0, world_size=2, dtype="int32"):
        ...  # int32 [B // 2, T]: rank 0's rows of each batch, same order on every rank

Packed rows (several documents per row, each starting with a BOS token): ``bos_id=...`` makes
every element a dict that adds the document layout of ``zerobatch_core.documents``, computed in
the graph with a few vectorised ops per batch::

    ds = tf_dataset("train.batch", next_token=True, bos_id=tok.bos_id)
    for b in ds:  # b["inputs"], b["labels"], b["segment_ids"], b["positions"]: [B, T - 1]
        ...  # b["cu_seqlens"]: int32 [documents + 1], FlashAttention's varlen layout

Token ids at or above 2**31 wrap to negative values with ``dtype="int32"`` (a bit-cast, exactly
like the core's int32 view); use ``"int64"`` (the default) for vocabularies that large.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import tensorflow as tf
from zerobatch_spec import HEADER_SIZE

from zerobatch_core import BatchFileReader, BatchNativeLoader, StateError
from zerobatch_core.distributed import resolve_rank_world
from zerobatch_core.loader import DEFAULT_BLOCK_SIZE

__all__ = ["tf_dataset"]

TFDType = Literal["int32", "int64"]
_TF_DTYPES: dict[str, Any] = {"int32": tf.int32, "int64": tf.int64}


def tf_dataset(
    path: str | os.PathLike[str],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    shuffle: bool = True,
    seed: int | None = None,
    epoch: int = 0,
    step: int = 0,
    state: Mapping[str, Any] | None = None,
    num_epochs: int | None = 1,
    dtype: TFDType = "int64",
    next_token: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    prefetch: bool = True,
    bos_id: int | None = None,
) -> Any:
    """A ``tf.data.Dataset`` of the file's batches in ``BatchNativeLoader`` order.

    The file is opened and validated with ``BatchFileReader`` first, so a broken file raises
    ``zerobatch_core.FormatError`` here, before any TensorFlow op runs. Arguments mean what
    they mean for ``BatchNativeLoader``:

    - ``block_size``, ``shuffle``, ``seed`` (default: the header's seed) fix the block order;
      epoch ``e`` uses the key ``seed ^ e`` (``SPEC.md`` section 8).
    - ``epoch`` and ``step`` are the resume cursor: the dataset starts with the batch served at
      position ``step`` of epoch ``epoch``. ``state`` (a ``BatchNativeLoader.state_dict()``)
      gives the cursor instead and is checked against the file and order parameters like
      ``load_state_dict`` does; a finished epoch (``step == num_batches``) resumes at the next.
    - ``num_epochs`` epochs are served, the first from the cursor on and the others whole;
      ``None`` repeats for ever. The dataset's cardinality is set accordingly, so ``len(ds)``
      and Keras progress bars work for a finite count.
    - ``dtype`` is ``"int64"`` (zero-extended) or ``"int32"`` (bit-cast: ids >= 2**31 wrap).
    - ``next_token=True`` yields ``(x[:, :-1], x[:, 1:])``: inputs in ``dtype``, labels always
      int64, as the core loader does (sparse cross-entropy wants integer labels; int64 is
      exact for every uint32 id).
    - ``rank``/``world_size`` (default: ``RANK``/``WORLD_SIZE`` from the environment, else
      0/1): every rank walks the same order and gets its contiguous ``B // world_size`` rows.
    - ``prefetch`` appends ``prefetch(tf.data.AUTOTUNE)``.
    - ``bos_id`` (packed rows whose documents start with that token) makes each element a dict:
      ``tokens`` (or ``inputs`` and ``labels`` with ``next_token``) plus the document layout of
      the tokens (or inputs), exactly the core loader's (``zerobatch_core.documents``):
      ``segment_ids`` and ``positions`` (int32, the tokens' shape: 1-based segment per row,
      position restarting at every BOS and row start) and ``cu_seqlens`` (int32, 1-D, shape
      ``[None]``: one entry per document plus the total, so its length varies per batch).
      The layout is computed in the graph, a few vectorised ops per batch. For Keras, ``map``
      the dict to the ``(x, y)`` structure the model takes.

    Element shapes are static (``[B // world_size, T]``, or ``T - 1`` columns with
    ``next_token``; ``cu_seqlens`` excepted), so Keras builds the model with fixed shapes.

    Iterating the returned dataset again starts again at the cursor: it is a description of
    the epochs ``epoch .. epoch + num_epochs - 1``, not a stateful loader. For Keras, either
    pass ``num_epochs=N`` and ``fit(ds, epochs=1)``, or ``num_epochs=None`` and
    ``fit(ds, epochs=N, steps_per_epoch=num_batches)`` so that each Keras epoch is the next
    data epoch (``fit(ds, epochs=N)`` on a one-epoch dataset would repeat epoch 0's order).
    """
    if dtype not in _TF_DTYPES:
        raise ValueError(f"dtype must be 'int32' or 'int64', got {dtype!r}")
    if num_epochs is not None and (
        isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 0
    ):
        raise ValueError(f"num_epochs must be a non-negative integer or None, got {num_epochs!r}")
    if state is not None and (epoch, step) != (0, 0):
        raise ValueError("give either state or epoch/step, not both")
    r, w = resolve_rank_world(rank, world_size)
    with BatchFileReader(path) as reader:
        # The core loader validates every argument and the resume cursor; only its order,
        # rows and cursor are kept, the mapping is closed when this block ends.
        loader = BatchNativeLoader(
            reader,
            block_size=block_size,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            dtype=dtype,
            rank=r,
            world_size=w,
            next_token=next_token,
            bos_id=bos_id,
        )
        cursor = dict(loader.state_dict() if state is None else state)
        if state is None:
            cursor["step"] = step
        loader.load_state_dict(cursor)
        if loader.state_dict()["num_workers"] != 1:
            raise StateError(
                f"{reader.path}: state was saved by one of several DataLoader workers; tf_dataset "
                "needs a single-worker state"
            )
        header = reader.header
        filename = os.path.abspath(reader.path)
        first_epoch, first_step = loader.epoch, loader.step
        bos = loader.bos_id  # validated by the core
        order, rows = loader.order, loader.rows

    num_batches, seq_len = header.num_batches, header.seq_len
    slot = header.padded_batch_bytes
    rows_per_rank = rows.stop - rows.start
    token_start, token_stop = rows.start * seq_len, rows.stop * seq_len
    out_dtype = _TF_DTYPES[dtype]

    def spans_of(index: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``[n_spans, 2]`` (start, stop) of epoch ``first_epoch + index``, in serving order.

        Epoch numbers are u64 and stay in Python: the graph only counts epochs from 0.
        """
        i = int(index)
        spans = order.spans(first_epoch + i, first_step if i == 0 else 0)
        flat = [bound for span in spans for bound in (span.start, span.stop)]
        return np.asarray(flat, dtype=np.int64).reshape(-1, 2)

    def epoch_spans(index: Any) -> Any:
        spans = tf.numpy_function(spans_of, [index], tf.int64, stateful=False)
        spans.set_shape([None, 2])
        return tf.data.Dataset.from_tensor_slices(spans)

    def read_span(span: Any) -> Any:
        """Slots ``span[0]..span[1]`` of the file, one record per slot, as raw bytes."""
        return tf.data.FixedLengthRecordDataset(
            filename,
            record_bytes=slot,
            header_bytes=HEADER_SIZE + span[0] * slot,
            footer_bytes=(num_batches - span[1]) * slot,
        )

    def decode(record: Any) -> Any:
        # decode_raw has no uint32: read the little-endian words as int32 (the same bits).
        words = tf.io.decode_raw(record, tf.int32, little_endian=True)
        mine = tf.reshape(words[token_start:token_stop], [rows_per_rank, seq_len])
        if bos is not None:
            return _documents(mine, bos, next_token, out_dtype)
        if not next_token:
            return _convert(mine, out_dtype)
        return _convert(mine[:, :-1], out_dtype), _convert(mine[:, 1:], tf.int64)

    if num_batches == 0:  # every epoch is empty: never loop over empty epochs for ever
        epochs, total = tf.data.Dataset.range(0), 0
    elif num_epochs is None:
        epochs, total = tf.data.Dataset.counter(), tf.data.INFINITE_CARDINALITY
    else:
        epochs = tf.data.Dataset.range(num_epochs)
        total = 0 if num_epochs == 0 else num_batches - first_step + (num_epochs - 1) * num_batches
    ds = (
        epochs.flat_map(epoch_spans)
        .flat_map(read_span)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .apply(tf.data.experimental.assert_cardinality(total))
    )
    if prefetch:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds


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
