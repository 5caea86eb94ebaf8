"""A tokenizer from its spec string or from its JSON description, whatever its kind.

The two entry points that know every kind: :func:`load_tokenizer` reads the files a spec string
names (``byte``, ``hf:...``, ``tiktoken:...``; see :mod:`.protocol`), :func:`tokenizer_from_json`
rebuilds a tokenizer from what its ``to_json()`` returned, dispatching on the ``"kind"`` field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import IngestError
from .byte import ByteTokenizer
from .descriptions import read_description
from .huggingface import HFTokenizer
from .protocol import Tokenizer, parse_spec
from .tiktoken_files import ENDOFTEXT, TIKTOKEN_STANDARD, TiktokenTokenizer

_FROM_DESCRIPTION: Mapping[str, Callable[[Mapping[str, Any]], Tokenizer]] = {
    "byte": ByteTokenizer.from_description,
    "hf": HFTokenizer.from_description,
    "tiktoken": TiktokenTokenizer.from_description,
}


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer a spec names: ``byte``, ``hf:...`` or ``tiktoken:...`` (see :mod:`.protocol`).

    Raises ``IngestError`` for a malformed spec, a missing file, or a BOS/EOS token the model
    lacks, and ``ImportError`` (with the install command) if the library is not installed.
    """
    kind, target, options = parse_spec(spec)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        if "bos" not in options:
            raise IngestError(
                f"tokenizer spec {spec!r}: a Hugging Face tokenizer needs its BOS token, "
                f"e.g. 'hf:{target}?bos=<|endoftext|>'"
            )
        return HFTokenizer.from_file(target, bos=options["bos"], eos=options.get("eos"), name=spec)
    bos, eos = options.get("bos", ENDOFTEXT), options.get("eos")
    if target in TIKTOKEN_STANDARD and not os.path.isfile(target):
        if "pattern" in options:
            raise IngestError(f"tokenizer spec {spec!r}: pattern applies only to a local file")
        return TiktokenTokenizer.from_cache(target, bos=bos, eos=eos, name=spec)
    return TiktokenTokenizer.from_file(
        target, pattern=options.get("pattern"), bos=bos, eos=eos, name=spec
    )


def tokenizer_from_json(text: str) -> Tokenizer:
    """The tokenizer a JSON description (``Tokenizer.to_json()``) stands for.

    A description that is not a JSON object, has an unknown ``"kind"`` or a missing or
    mistyped field raises ``IngestError`` naming the field.
    """
    desc = read_description(text)
    return _FROM_DESCRIPTION[desc["kind"]](desc)
