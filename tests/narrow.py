"""uint16 (dtype 1) copies of uint32 files and datasets, built from the spec's functions only.

The reading side is tested on pairs: a uint32 file (or dataset) written by ZeroBatch's writer
and its uint16 twin made here, byte by byte from ``SPEC.md``'s layout (header with dtype 1,
slots of ``batch_size * seq_len`` little-endian uint16 tokens, zero padding to a multiple of
4096; a dataset's shard sizes, header digests and slot checksums recomputed over the new
bytes). The twin holds the same tokens in the same slots, so every reader and loader must serve
the same values from both, and this does not depend on the writer's own uint16 path.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import xxhash
from zerobatch_spec import (
    DTYPE_UINT16,
    HEADER_SIZE,
    SLOT_ALIGNMENT,
    TOKEN_DTYPES,
    build_header,
    padded_batch_bytes,
    token_max,
)
from zerobatch_spec.dataset import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    Manifest,
    build_manifest,
    bytes_xxh3,
    header_xxh3,
    parse_manifest,
)

from zerobatch_core import BatchFileReader

U16 = TOKEN_DTYPES[DTYPE_UINT16]


def narrow_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> list[int]:
    """Write ``dst``, the dtype 1 twin of the uint32 file ``src``; return each slot's XXH3-64."""
    with BatchFileReader(src) as reader:
        h = reader.header
        header = dataclasses.replace(h, dtype=DTYPE_UINT16)
        slot = padded_batch_bytes(h.batch_size, h.seq_len, DTYPE_UINT16)
        assert slot % SLOT_ALIGNMENT == 0
        sums = []
        with open(dst, "wb") as f:
            f.write(build_header(header))
            for i in range(h.num_batches):
                tokens = np.asarray(reader.read_batch(i))
                assert int(tokens.max(initial=0)) <= token_max(DTYPE_UINT16)
                data = tokens.astype(U16).tobytes()
                data += bytes(slot - len(data))
                sums.append(xxhash.xxh3_64_intdigest(data))
                f.write(data)
    return sums


def narrow_dataset(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Write the dataset directory ``dst``, the dtype 1 twin of the uint32 dataset ``src``."""
    out = Path(dst)
    out.mkdir(parents=True)
    manifest = parse_manifest((Path(src) / MANIFEST_NAME).read_bytes())
    assert isinstance(manifest, Manifest)
    shards, sums = [], []
    for shard in manifest.shards:
        sums += narrow_file(Path(src) / shard.name, out / shard.name)
        data = (out / shard.name).read_bytes()
        shards.append(
            dataclasses.replace(shard, size=len(data), header_xxh3=header_xxh3(data[:HEADER_SIZE]))
        )
    checksums = np.array(sums, dtype="<u8").tobytes()
    (out / CHECKSUMS_NAME).write_bytes(checksums)
    narrowed = dataclasses.replace(
        manifest,
        shards=tuple(shards),
        checksums_xxh3=bytes_xxh3(checksums),
        dtype=DTYPE_UINT16,
    )
    (out / MANIFEST_NAME).write_bytes(build_manifest(narrowed))
    return out
