"""Independent LLMBATCH reader/writer written only from the seed document.

Source: /work/shared/seeds/zerobatch-v2-format.txt ("ZeroBatch v2" description).
Deliberately self-contained: standard library + numpy only, no imports from
zerobatch_core / zerobatch_spec / zerobatch_conformance.

Layout per the seed document (little-endian throughout):

    Offset Size Type  Field
    0      8    bytes magic          "LLMBATCH" (no null terminator)
    8      4    u32   version        currently 1
    12     4    u32   batch_size
    16     4    u32   seq_len
    20     8    u64   num_batches
    28     4    u32   dtype          0 = uint32
    32     4    u32   seed
    36     4    u32   total_records
    40     4056 zeros reserved       padding to 4096

    raw_batch_bytes    = batch_size * seq_len * 4
    padded_batch_bytes = ceil(raw_batch_bytes / 4096) * 4096
    offset(i)          = 4096 + i * padded_batch_bytes
    file_size          = 4096 + num_batches * padded_batch_bytes

Datasets (``read_dataset_shards``): a directory of such files named by ``manifest.json``, as
ZeroBatch's first datasets wrote it (manifest version 1, every shard listed by name). This
reader knows that version alone and refuses any other by its version, as a reader written
before later versions existed would.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

MAGIC = b"LLMBATCH"
VERSION = 1
DTYPE_UINT32 = 0
HEADER_SIZE = 4096
PAGE_SIZE = 4096
TOKEN_BYTES = 4

# "<" = little-endian, standard sizes, no alignment padding (u64 sits at offset 20).
HEADER_STRUCT = struct.Struct("<8sIIIQIII")
assert HEADER_STRUCT.size == 40

_U32_MAX = 2**32 - 1


def padded_batch_bytes(batch_size: int, seq_len: int) -> int:
    raw = batch_size * seq_len * TOKEN_BYTES
    return -(-raw // PAGE_SIZE) * PAGE_SIZE


def pack_header(
    batch_size: int,
    seq_len: int,
    num_batches: int,
    seed: int,
    total_records: int,
    version: int = VERSION,
    dtype: int = DTYPE_UINT32,
) -> bytes:
    head = HEADER_STRUCT.pack(
        MAGIC, version, batch_size, seq_len, num_batches, dtype, seed, total_records
    )
    return head + b"\x00" * (HEADER_SIZE - len(head))


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    size = os.path.getsize(path)
    if size < HEADER_SIZE:
        raise ValueError(f"file too small for header: {size} < {HEADER_SIZE}")
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) != HEADER_SIZE:
        raise ValueError("short read of header")
    magic, version, batch_size, seq_len, num_batches, dtype, seed, total_records = (
        HEADER_STRUCT.unpack_from(raw, 0)
    )
    if magic != MAGIC:
        raise ValueError(f"bad magic: {magic!r}")
    if version != VERSION:
        raise ValueError(f"unsupported version: {version}")
    if dtype != DTYPE_UINT32:
        raise ValueError(f"unsupported dtype code: {dtype}")
    if any(raw[HEADER_STRUCT.size :]):
        raise ValueError("reserved header bytes 40..4095 are not all zero")
    pbb = padded_batch_bytes(batch_size, seq_len)
    expected = HEADER_SIZE + num_batches * pbb
    if size != expected:
        raise ValueError(f"file size {size} != expected {expected}")
    return {
        "magic": magic,
        "version": version,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "num_batches": num_batches,
        "dtype": dtype,
        "seed": seed,
        "total_records": total_records,
    }


def read_batches(path: str | os.PathLike[str]) -> list[np.ndarray]:
    """Read every batch with plain seek/read (no mmap); returns uint32 [B, S] copies."""
    hdr = read_header(path)
    bs, sl, n = hdr["batch_size"], hdr["seq_len"], hdr["num_batches"]
    raw_bytes = bs * sl * TOKEN_BYTES
    pbb = padded_batch_bytes(bs, sl)
    out: list[np.ndarray] = []
    with open(path, "rb") as f:
        for i in range(n):
            f.seek(HEADER_SIZE + i * pbb)
            data = f.read(raw_bytes)
            if len(data) != raw_bytes:
                raise ValueError(f"short read for batch {i}")
            arr = np.frombuffer(data, dtype="<u4").astype(np.uint32).reshape(bs, sl)
            out.append(arr)
    return out


def read_padding(path: str | os.PathLike[str]) -> list[bytes]:
    """Return the padding bytes that follow each batch (should be all zero)."""
    hdr = read_header(path)
    bs, sl, n = hdr["batch_size"], hdr["seq_len"], hdr["num_batches"]
    raw_bytes = bs * sl * TOKEN_BYTES
    pbb = padded_batch_bytes(bs, sl)
    pads: list[bytes] = []
    with open(path, "rb") as f:
        for i in range(n):
            f.seek(HEADER_SIZE + i * pbb + raw_bytes)
            pads.append(f.read(pbb - raw_bytes))
    return pads


def write_file(
    path: str | os.PathLike[str],
    batches: list[np.ndarray],
    seed: int,
    total_records: int,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
) -> int:
    """Write pre-formed batches in the given order. Returns the number of batches.

    batch_size/seq_len are taken from the first batch; they must be given explicitly
    when ``batches`` is empty.
    """
    if batches:
        first = np.asarray(batches[0])
        if first.ndim != 2:
            raise ValueError("each batch must be 2-D [batch_size, seq_len]")
        bs_in, sl_in = first.shape
        batch_size = bs_in if batch_size is None else batch_size
        seq_len = sl_in if seq_len is None else seq_len
    if batch_size is None or seq_len is None:
        raise ValueError("batch_size and seq_len required for an empty batch list")
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not 0 < v <= _U32_MAX:
            raise ValueError(f"{name} out of range: {v}")
    for name, v in (("seed", seed), ("total_records", total_records)):
        if not 0 <= v <= _U32_MAX:
            raise ValueError(f"{name} out of u32 range: {v}")

    raw_bytes = batch_size * seq_len * TOKEN_BYTES
    pad = b"\x00" * (padded_batch_bytes(batch_size, seq_len) - raw_bytes)
    with open(path, "wb") as f:
        f.write(pack_header(batch_size, seq_len, len(batches), seed, total_records))
        for i, b in enumerate(batches):
            arr = np.asarray(b)
            if arr.shape != (batch_size, seq_len):
                raise ValueError(f"batch {i} has shape {arr.shape}")
            if arr.size and (arr.min() < 0 or int(arr.max()) > _U32_MAX):
                raise ValueError(f"batch {i} has tokens outside uint32 range")
            f.write(np.ascontiguousarray(arr, dtype="<u4").tobytes())
            f.write(pad)
    return len(batches)


MANIFEST_FORMAT = "zerobatch.dataset"
MANIFEST_VERSION = 1


def read_dataset_shards(path: str | os.PathLike[str]) -> list[str]:
    """The shard file paths of the dataset directory ``path``, in manifest order; ``ValueError``
    naming ``manifest_unsupported_version`` for a manifest of any version but 1."""
    with open(os.path.join(path, "manifest.json"), "rb") as f:
        doc = json.loads(f.read().decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ValueError("manifest_bad_format: not a zerobatch.dataset manifest")
    version = doc.get("version")
    if type(version) is not int or version != MANIFEST_VERSION:
        raise ValueError(f"manifest_unsupported_version: version {version!r}")
    return [os.path.join(path, shard["name"]) for shard in doc["shards"]]
