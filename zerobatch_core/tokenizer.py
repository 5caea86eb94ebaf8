"""A built-in byte-level tokenizer and a streaming document packer, NumPy only.

``ByteTokenizer`` maps text to its UTF-8 bytes (ids 0..255) and reserves id 256 for BOS, a
257-token vocabulary that needs no files and no training. ``pack_documents`` turns a stream of
tokenized documents into the fixed-length records an LLMBATCH file holds: every document is
prefixed with BOS, the documents are concatenated, and the stream is cut into full rows (the
final partial row is dropped).

>>> tok = ByteTokenizer()
>>> tok.encode("héllo").tolist()
[104, 195, 169, 108, 108, 111]
>>> rows = list(pack_documents([tok.encode("abc"), tok.encode("de")], seq_len=3))
>>> [r.tolist() for r in rows]
[[256, 97, 98], [99, 256, 100]]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

BYTE_VOCAB = 256
"""Ids 0..255 are the byte values themselves."""

BOS_ID = BYTE_VOCAB
"""The beginning-of-sequence id, the first id after the bytes."""

_U32_MAX = 2**32 - 1


class ByteTokenizer:
    """UTF-8 bytes as token ids, plus a BOS token: ``vocab_size`` 257, ``bos_id`` 256.

    Encoding is lossless for any ``str`` that UTF-8 can encode (lone surrogates cannot be);
    ``decode`` skips BOS and replaces byte sequences that are not valid UTF-8 (a multi-byte
    character cut by a record boundary, say) with U+FFFD rather than failing.
    """

    bos_id: int = BOS_ID
    vocab_size: int = BYTE_VOCAB + 1

    def encode(self, text: str, *, add_bos: bool = False) -> npt.NDArray[np.uint32]:
        """The UTF-8 bytes of ``text`` as uint32 ids, optionally preceded by ``bos_id``."""
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        if not add_bos:
            return data.astype(np.uint32)
        out = np.empty(data.size + 1, dtype=np.uint32)
        out[0] = self.bos_id
        out[1:] = data
        return out

    def decode(self, ids: npt.ArrayLike) -> str:
        """Text for a 1-D sequence of ids; BOS is skipped, invalid UTF-8 becomes U+FFFD.

        Raises ``ValueError`` for ids outside ``[0, vocab_size)``.
        """
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ValueError(f"decode expects a 1-D sequence of ids, got shape {arr.shape}")
        if arr.size == 0:
            return ""
        if arr.dtype.kind not in "ui":
            raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
        if int(arr.min()) < 0 or int(arr.max()) >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size}); got {arr!r:.200}")
        data: bytes = arr[arr != self.bos_id].astype(np.uint8).tobytes()
        return data.decode("utf-8", errors="replace")


def _as_u32_doc(doc: npt.ArrayLike, index: int) -> npt.NDArray[np.uint32]:
    """One document as a 1-D uint32 array, rejecting non-integer or out-of-range ids."""
    arr = np.asarray(doc)
    if arr.ndim != 1:
        raise ValueError(f"document {index}: expected a 1-D array of ids, got shape {arr.shape}")
    if arr.dtype == np.uint32:
        return arr
    if arr.size == 0:
        return np.empty(0, dtype=np.uint32)
    if arr.dtype.kind not in "ui":
        raise ValueError(f"document {index}: ids must be integers, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > _U32_MAX:
        raise ValueError(f"document {index}: ids must fit in uint32")
    return arr.astype(np.uint32)


def pack_documents(
    docs: Iterable[npt.ArrayLike], seq_len: int, *, bos_id: int = BOS_ID
) -> Iterator[npt.NDArray[np.uint32]]:
    """Pack documents into ``[seq_len]`` uint32 rows, each document prefixed with ``bos_id``.

    The rows are the concatenation ``[bos, *doc0, bos, *doc1, ...]`` cut every ``seq_len``
    tokens; documents run across row boundaries and the final partial row is dropped. The
    input is consumed lazily and memory stays bounded by about ``2 * seq_len`` plus the
    largest document; the work is vectorised (one concatenation per flushed group of rows,
    amortised O(1) per token), never a Python loop over tokens. Rows are read-only views
    that stay valid after the iterator moves on.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)):
        raise TypeError(f"seq_len must be an integer, got {type(seq_len).__name__}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    if not 0 <= bos_id <= _U32_MAX:
        raise ValueError(f"bos_id must fit in uint32, got {bos_id}")
    n = int(seq_len)
    bos = np.array([bos_id], dtype=np.uint32)
    pending: list[npt.NDArray[np.uint32]] = []
    pending_len = 0
    for index, doc in enumerate(docs):
        arr = _as_u32_doc(doc, index)
        pending += [bos, arr]
        pending_len += 1 + arr.size
        if pending_len < n:
            continue
        buf = np.concatenate(pending)
        full = pending_len // n * n
        rows = buf[:full].reshape(-1, n)
        rows.flags.writeable = False
        tail = buf[full:].copy()  # don't keep the whole buffer alive for a short tail
        pending, pending_len = [tail], tail.size
        yield from rows
