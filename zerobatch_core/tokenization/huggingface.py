"""Hugging Face ``tokenizers`` models as ZeroBatch tokenizers (spec ``hf:PATH?bos=TOKEN``).

The model is a ``tokenizer.json``; BOS and EOS are named by their special-token strings. The
library is imported on first use (``pip install 'zerobatch[text]'``). The description of an
:class:`HFTokenizer` carries the model's own JSON (``Tokenizer.to_str()``) as a string, so a
worker process rebuilds the same model without reading the file again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import IngestError
from .descriptions import description_field, optional_field, write_description
from .protocol import U32Array, import_optional, make_spec


def _special_id(lookup: Any, token: str, role: str, where: str) -> int:
    tid = lookup(token)
    if tid is None:
        raise IngestError(f"{where}: {role} token {token!r} is not in the vocabulary")
    return int(tid)


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` with BOS/EOS given as special-token strings.

    Encoding adds no special tokens (the packer adds BOS) and treats special-token strings in
    the text as ordinary text (``encode_special_tokens``).
    """

    def __init__(
        self, tokenizer: Any, *, bos: str, eos: str | None = None, name: str = "hf"
    ) -> None:
        """Wrap a ``tokenizers.Tokenizer`` or its JSON text (``Tokenizer.to_str()``).

        The model is copied: the caller's object is not modified. JSON that is not a model
        raises ``IngestError`` naming ``name``; so does a BOS/EOS token the model lacks.
        """
        tk = import_optional("tokenizers", "a Hugging Face tokenizer")
        self._json: str = tokenizer if isinstance(tokenizer, str) else tokenizer.to_str()
        try:
            self._tok: Any = tk.Tokenizer.from_str(self._json)
        except Exception as e:  # the Rust library raises a bare Exception
            raise IngestError(f"{name}: not a tokenizers model: {e}") from e
        self._tok.encode_special_tokens = True
        self._bos, self._eos = bos, eos
        self.name = name
        lookup = self._tok.token_to_id
        self.bos_id: int = _special_id(lookup, bos, "BOS", name)
        self.eos_id: int | None = None if eos is None else _special_id(lookup, eos, "EOS", name)
        # One more than the largest id, added and special tokens included: a model's ids need
        # not be dense, so the count alone could understate it (``protocol.Tokenizer``).
        ids = self._tok.get_vocab(with_added_tokens=True).values()
        count = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.vocab_size: int = max(count, 1 + max(ids, default=-1))
        self._encode: Any = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, bos: str, eos: str | None = None, name: str = ""
    ) -> HFTokenizer:
        """Load ``tokenizer.json``; a missing or unreadable file raises ``IngestError``."""
        tk = import_optional("tokenizers", "a Hugging Face tokenizer")
        p = os.fspath(path)
        if not os.path.isfile(p):
            raise IngestError(f"{p}: tokenizer file does not exist")
        try:
            tok = tk.Tokenizer.from_file(p)
        except Exception as e:  # the Rust library raises a bare Exception
            raise IngestError(f"{p}: not a readable tokenizers model: {e}") from e
        return cls(tok, bos=bos, eos=eos, name=name or make_spec("hf", p, bos=bos, eos=eos))

    def encode_batch(self, texts: list[str]) -> list[U32Array]:
        """Ids of each text, no special tokens added."""
        encodings = self._encode(texts, add_special_tokens=False)
        return [np.array(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: npt.ArrayLike) -> str:
        """Text of ``ids`` with special tokens skipped."""
        return str(self._tok.decode(np.asarray(ids).tolist(), skip_special_tokens=True))

    def to_json(self) -> str:
        """``{"kind":"hf","name":…,"bos":…,"eos":…,"model":"<tokenizer.json text>"}``."""
        return write_description(
            "hf", name=self.name, bos=self._bos, eos=self._eos, model=self._json
        )

    @classmethod
    def from_description(cls, desc: Mapping[str, Any]) -> HFTokenizer:
        """The tokenizer an ``hf`` description (:meth:`to_json`, parsed) stands for."""
        return cls(
            description_field(desc, "model", str),
            bos=description_field(desc, "bos", str),
            eos=optional_field(desc, "eos", str),
            name=description_field(desc, "name", str),
        )

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, bos={self._bos!r}, eos={self._eos!r})"
