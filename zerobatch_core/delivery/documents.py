"""Document structure of packed rows, recovered from the BOS token, one vectorised pass a batch.

Packing puts several documents in one row, each starting with BOS. Attention should not cross
document boundaries, and positions should restart with every document. This module derives the
three layouts kernels take, for a whole ``[rows, seq_len]`` batch at once:

* ``segment_ids``: per row, 1 for the first document (or the fragment the row starts with),
  2 for the next, ... (0 is left free for padding, as MaxText-style kernels expect);
* ``positions``: index of each token within its document, restarting at 0 at every BOS and at
  every row start;
* ``cu_seqlens``: cumulative sequence lengths over the flattened batch (``int32``, starting at 0
  and ending at ``rows * seq_len``): the layout of variable-length attention kernels such as
  FlashAttention's ``varlen`` functions. Its length varies from batch to batch.

A row always starts a new segment, since rows are independent sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class DocumentLayout:
    """Segment ids, in-document positions and ``cu_seqlens`` of one batch."""

    segment_ids: I32
    positions: I32
    cu_seqlens: I32


def document_starts(tokens: npt.NDArray[np.integer], bos_id: int) -> npt.NDArray[np.bool_]:
    """``True`` where a document starts: at every BOS token and at the start of every row."""
    if tokens.ndim != 2:
        raise ValueError(f"expected a [rows, seq_len] batch, got shape {tokens.shape}")
    starts: npt.NDArray[np.bool_] = np.equal(tokens, bos_id)
    if tokens.shape[1]:
        starts[:, 0] = True
    return starts


def document_layout(tokens: npt.NDArray[np.integer], bos_id: int) -> DocumentLayout:
    """The document layout of ``tokens`` (``[rows, seq_len]``) split at ``bos_id``."""
    starts = document_starts(tokens, bos_id)
    rows, seq_len = starts.shape
    segment_ids = np.cumsum(starts, axis=1, dtype=np.int32)
    index = np.broadcast_to(np.arange(seq_len, dtype=np.int32), starts.shape)
    last_start = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    positions = (index - last_start).astype(np.int32, copy=False)
    flat = np.flatnonzero(starts.reshape(-1)).astype(np.int32)
    cu_seqlens = np.concatenate([flat, np.array([rows * seq_len], dtype=np.int32)])
    return DocumentLayout(segment_ids, positions, cu_seqlens)
