"""Ingestion: turn external data (text corpora, token arrays) into LLMBATCH records.

Every source implements ``RecordSource`` (``source.py``). nanoGPT ``.bin`` shards are in
``nanogpt`` and ``.npy`` arrays in ``arrays``; each module has its own ``count_records`` and
``iter_records`` (same shape of API), so those are used through the module. Other systems'
token files (``megatron``, ``hf_datasets``, ``mds``, ``atlas``) are ``TokenFile``s cut into
records by ``token_files.TokenFileSource``; ``formats`` detects and opens them. ``dtypes``
decides the token dtype a conversion writes (uint16 or uint32) and says why. ``produce``
tokenizes a corpus into a live dataset, ``units`` names the pieces producers and Ray tasks share.
"""

from .arrays import ArrayFile, ArraySource, expand_arrays
from .nanogpt import BinShard, NanoGPTSource, expand_shards
from .source import RecordSource, U32Block

__all__ = [
    "ArrayFile",
    "ArraySource",
    "BinShard",
    "NanoGPTSource",
    "RecordSource",
    "U32Block",
    "expand_arrays",
    "expand_shards",
]
