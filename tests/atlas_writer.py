"""A writer of Atlas datasets for the tests, following the format's description
(``/work/shared/seeds/atlas-dataset-format.txt``) and the reference writer's choices.

* A block is ``pickle.dumps(list_of_examples)`` (``protocol`` chosen by the caller), stored as
  is (strategy 0) or as one zstd frame (``zstandard``; strategy 1 without a dictionary, 2 with
  the dataset's shared ``zstd_dict.bin``, 3 with the shard's own).
* Dictionaries are trained with ``zstandard.train_dictionary`` on the pickled blocks (of the
  first shard for strategy 2), of ``max(1024, dict_size * uncompressed bytes + 1)`` bytes. As
  in the reference writer, a shard of fewer than 7 blocks cannot train one and falls back to
  strategy 1 (for strategy 2, the whole dataset does, when its first shard is that small).
* ``index.npy`` holds each block's offset and then ``data.bin``'s size, saved with
  ``np.save(..., allow_pickle=False)`` in the smallest unsigned dtype that holds the last
  entry (8, 16, 32 or 64 bits).
* Shard folders are numbered from 0 and zero-padded to one width (``pad=False`` keeps the
  plain numbers the reference writer starts with). An empty shard has no ``data.bin``.

This module writes test data only; it never reads a pickle.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import zstandard

MIN_DICT_BLOCKS = 7
"""Fewest blocks ``zstandard.train_dictionary`` is given (the reference writer's rule)."""


def index_dtype(last: int) -> type[np.unsignedinteger[Any]]:
    """The smallest unsigned dtype that holds ``last`` (the reference writer's choice)."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if last <= np.iinfo(dtype).max:
            return dtype
    raise ValueError(f"{last} does not fit 64 bits")


def pickled_blocks(
    examples: Sequence[Any], block_size: int, protocol: int = pickle.DEFAULT_PROTOCOL
) -> list[bytes]:
    """The examples cut into blocks of ``block_size`` (the last may be shorter), pickled."""
    return [
        pickle.dumps(list(examples[i : i + block_size]), protocol=protocol)
        for i in range(0, len(examples), block_size)
    ]


def train_dict(blocks: Sequence[bytes], dict_size: float, level: int) -> bytes:
    """A zstd dictionary trained on ``blocks``, of the reference writer's size."""
    size = max(1024, int(dict_size * sum(len(b) for b in blocks)) + 1)
    return bytes(zstandard.train_dictionary(size, list(blocks), level=level).as_bytes())


def write_index(path: str, offsets: Sequence[int], dtype: Any = None) -> None:
    """``index.npy`` of ``offsets`` (block offsets then the data size)."""
    chosen = dtype if dtype is not None else index_dtype(int(offsets[-1]))
    np.save(path, np.array(offsets, dtype=chosen), allow_pickle=False)


def write_shard(
    path: str,
    examples: Sequence[Any],
    block_size: int,
    strategy: int,
    *,
    level: int = 3,
    dict_size: float = 0.01,
    shared_dict: bytes | None = None,
    protocol: int = pickle.DEFAULT_PROTOCOL,
) -> int:
    """Write one shard folder at ``path``; returns the strategy it was written with (3 falls
    back to 1 for fewer than 7 blocks). Strategy 2 needs ``shared_dict``."""
    os.makedirs(path)
    blocks = pickled_blocks(examples, block_size, protocol)
    used = strategy
    if strategy == 3 and len(blocks) < MIN_DICT_BLOCKS:
        used = 1
    if used == 0:
        stored = blocks
    else:
        zdict: zstandard.ZstdCompressionDict | None = None
        if used == 2:
            if shared_dict is None:
                raise ValueError("strategy 2 needs the dataset's shared dictionary")
            zdict = zstandard.ZstdCompressionDict(shared_dict)
        elif used == 3:
            own = train_dict(blocks, dict_size, level)
            with open(os.path.join(path, "zstd_dict.bin"), "wb") as f:
                f.write(own)
            zdict = zstandard.ZstdCompressionDict(own)
        cctx = (
            zstandard.ZstdCompressor(level=level)
            if zdict is None
            else zstandard.ZstdCompressor(level=level, dict_data=zdict)
        )
        stored = [cctx.compress(b) for b in blocks]
    offsets = [0]
    for b in stored:
        offsets.append(offsets[-1] + len(b))
    if stored:
        with open(os.path.join(path, "data.bin"), "wb") as f:
            for b in stored:
                f.write(b)
    write_index(os.path.join(path, "index.npy"), offsets)
    meta = {
        "version": 1,
        "block_size": block_size,
        "stored_examples": len(examples),
        "compression_strategy": used,
        "compression_level": level,
        "compression_dict_size": dict_size,
    }
    with open(os.path.join(path, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=4)
    return used


def write_dataset(
    root: str,
    shards: Sequence[Sequence[Any]],
    block_size: int,
    strategy: int,
    *,
    level: int = 3,
    dict_size: float = 0.01,
    pad: bool = True,
    protocol: int = pickle.DEFAULT_PROTOCOL,
) -> list[str]:
    """Write an Atlas dataset of ``shards`` (each a sequence of examples) at ``root``; returns
    the shard folders in order."""
    os.makedirs(root)
    shared: bytes | None = None
    dataset_strategy = strategy
    if strategy == 2:
        first = pickled_blocks(shards[0], block_size, protocol) if shards else []
        if len(first) < MIN_DICT_BLOCKS:
            dataset_strategy = 1
        else:
            shared = train_dict(first, dict_size, level)
            with open(os.path.join(root, "zstd_dict.bin"), "wb") as f:
                f.write(shared)
    width = len(str(max(len(shards) - 1, 0))) if pad else 0
    folders = []
    for i, examples in enumerate(shards):
        folder = os.path.join(root, str(i).zfill(width))
        write_shard(
            folder,
            examples,
            block_size,
            dataset_strategy,
            level=level,
            dict_size=dict_size,
            shared_dict=shared,
            protocol=protocol,
        )
        folders.append(folder)
    meta = {
        "version": 1,
        "shard_sizes": [len(s) for s in shards],
        "compression_strategy": dataset_strategy,
    }
    with open(os.path.join(root, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=4)
    return folders


def rewrite_blocks(folder: str, blocks: Sequence[bytes]) -> None:
    """Replace a shard's ``data.bin`` with ``blocks`` (already encoded as its strategy wants)
    and rewrite ``index.npy`` to match: how the tests plant a crafted block."""
    offsets = [0]
    for b in blocks:
        offsets.append(offsets[-1] + len(b))
    with open(os.path.join(folder, "data.bin"), "wb") as f:
        for b in blocks:
            f.write(b)
    write_index(os.path.join(folder, "index.npy"), offsets)


def stored_blocks(folder: str) -> list[bytes]:
    """The stored (possibly compressed) blocks of a shard written by this module."""
    offsets = np.load(os.path.join(folder, "index.npy"), allow_pickle=False).astype(np.int64)
    path = os.path.join(folder, "data.bin")
    data = b""
    if os.path.exists(path):
        with open(path, "rb") as f:
            data = f.read()
    return [data[offsets[i] : offsets[i + 1]] for i in range(offsets.size - 1)]


def compressor(folder: str, strategy: int, level: int = 3) -> zstandard.ZstdCompressor | None:
    """A compressor that encodes blocks as ``folder``'s strategy does (``None`` for 0)."""
    if strategy == 0:
        return None
    if strategy == 1:
        return zstandard.ZstdCompressor(level=level)
    where = folder if strategy == 3 else os.path.dirname(folder)
    with open(os.path.join(where, "zstd_dict.bin"), "rb") as f:
        zdict = zstandard.ZstdCompressionDict(f.read())
    return zstandard.ZstdCompressor(level=level, dict_data=zdict)
