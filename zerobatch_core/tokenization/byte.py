"""The built-in byte-level tokenizer: UTF-8 bytes as ids 0..255, BOS 256, NumPy only.

A 257-token vocabulary that needs no files and no training, for demos, tests and byte-level
models. Its spec string is ``byte`` and its description ``{"kind":"byte"}``.

>>> tok = ByteTokenizer()
>>> tok.encode("héllo").tolist()
[104, 195, 169, 108, 108, 111]
>>> tok.decode(tok.encode("héllo", add_bos=True))
'héllo'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import IngestError
from .descriptions import write_description
from .protocol import U32Array

BYTE_VOCAB = 256
"""Ids 0..255 are the byte values themselves."""

BOS_ID = BYTE_VOCAB
"""The beginning-of-sequence id, the first id after the bytes."""


class ByteTokenizer:
    """UTF-8 bytes as token ids, plus a BOS token: ``vocab_size`` 257, ``bos_id`` 256, no EOS.

    Encoding is lossless for any ``str`` that UTF-8 can encode (lone surrogates cannot be);
    ``decode`` skips BOS and replaces byte sequences that are not valid UTF-8 (a multi-byte
    character cut by a record boundary, say) with U+FFFD rather than failing. It is a
    :class:`~zerobatch_core.tokenization.Tokenizer`; the attributes are set on the class, so
    ``ByteTokenizer.vocab_size`` needs no instance.
    """

    name: str = "byte"
    bos_id: int = BOS_ID
    eos_id: int | None = None
    vocab_size: int = BYTE_VOCAB + 1

    def encode(self, text: str, *, add_bos: bool = False) -> U32Array:
        """The UTF-8 bytes of ``text`` as uint32 ids, optionally preceded by ``bos_id``.

        A lone surrogate, which has no UTF-8 form, raises ``UnicodeEncodeError``.
        """
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        if not add_bos:
            return data.astype(np.uint32)
        out = np.empty(data.size + 1, dtype=np.uint32)
        out[0] = self.bos_id
        out[1:] = data
        return out

    def encode_batch(self, texts: list[str]) -> list[U32Array]:
        """:meth:`encode` of each text; a lone surrogate raises ``IngestError`` naming the text."""
        out: list[U32Array] = []
        for i, text in enumerate(texts):
            try:
                out.append(self.encode(text))
            except UnicodeEncodeError as e:
                raise IngestError(f"document {i} of the batch: not encodable as UTF-8: {e}") from e
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

    def to_json(self) -> str:
        """``{"kind":"byte"}``: the byte tokenizer has no parameters."""
        return write_description("byte")

    @classmethod
    def from_description(cls, desc: Mapping[str, Any]) -> ByteTokenizer:
        """The tokenizer a ``byte`` description (:meth:`to_json`, parsed) stands for."""
        return cls()

    def __repr__(self) -> str:
        return "ByteTokenizer()"
