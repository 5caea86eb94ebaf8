"""Tokenizers: text to ``uint32`` token ids, one module per concern.

``protocol``
    The :class:`Tokenizer` protocol and spec strings (``byte``, ``hf:...``, ``tiktoken:...``).
``descriptions``
    The JSON descriptions (plain data) that every tokenizer gives of itself.
``byte``
    :class:`ByteTokenizer`, the built-in byte-level tokenizer (NumPy only).
``huggingface``
    :class:`HFTokenizer`, Hugging Face ``tokenizers`` models.
``tiktoken_files``
    :class:`TiktokenTokenizer`, ``tiktoken`` encodings from local rank files, and the tables of
    the standard encodings; named so as not to shadow the ``tiktoken`` library.
``resolve``
    :func:`load_tokenizer` (spec string) and :func:`tokenizer_from_json` (description).
``parallel``
    :func:`tokenize_documents`: a document stream tokenized in order, across ``spawn`` workers.

This is a package of its own, beside ``ingest`` rather than inside it, because tokenizers are
used outside ingestion too (``ByteTokenizer`` with :func:`~zerobatch_core.pack_documents` in the
training demo and tests); ``ingest.text`` uses it to tokenize documents, and packing token ids
into records stays in ``ingest.packing``. Importing this package imports neither
``tokenizers`` nor ``tiktoken``: they are loaded when a tokenizer of that kind is built.
"""

from .byte import ByteTokenizer
from .huggingface import HFTokenizer
from .parallel import DEFAULT_BATCH_DOCS, tokenize_documents
from .protocol import Tokenizer, import_optional, make_spec, parse_spec
from .resolve import load_tokenizer, tokenizer_from_json
from .tiktoken_files import TIKTOKEN_STANDARD, TiktokenStandard, TiktokenTokenizer

__all__ = [
    "DEFAULT_BATCH_DOCS",
    "TIKTOKEN_STANDARD",
    "ByteTokenizer",
    "HFTokenizer",
    "TiktokenStandard",
    "TiktokenTokenizer",
    "Tokenizer",
    "import_optional",
    "load_tokenizer",
    "make_spec",
    "parse_spec",
    "tokenize_documents",
    "tokenizer_from_json",
]
