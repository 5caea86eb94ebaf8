"""MosaicML Streaming MDS datasets for tests, written without Streaming (which cannot be
imported here), and a reference reader.

``write_mds`` lays shards and ``index.json`` out byte for byte as Streaming's ``MDSWriter``
(``streaming/base/format/mds/writer.py`` over ``base/writer.py``) does:

- columns are sorted by name; each has an encoding and a fixed encoded size or ``None``;
- a sample is the uint32 sizes of its variable-size columns, then every column's bytes;
- a shard is ``uint32 num_samples``, ``uint32 offsets[num_samples + 1]`` (absolute file
  offsets), the writer's configuration as sorted-key JSON, then the samples;
- a new shard starts when ``size_limit < shard bytes + sample bytes + 4`` (the shard's bytes
  counting 8 plus the configuration; a sample larger than the limit flushes the shard before
  it, even an empty one, as Streaming does);
- a compressed shard is written only compressed (``shard.00000.mds.zstd``), ``raw_data``
  still describing the raw file;
- ``index.json`` is ``{"version": 2, "shards": [...]}`` with sorted keys.

``read_reference`` decodes a dataset as Streaming's ``MDSReader`` does, sample by sample and
without any checks: the oracle that ZeroBatch's reader must agree with whenever it accepts.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import os
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

DTYPE_CODES = {
    "uint8": 8,
    "int8": 9,
    "uint16": 16,
    "int16": 17,
    "float16": 18,
    "uint32": 32,
    "int32": 33,
    "float32": 34,
    "uint64": 64,
    "int64": 65,
    "float64": 66,
}
"""Streaming's dtype codes for dtype-less ``ndarray`` columns."""
SCALARS: tuple[str, ...] = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32")
SCALARS += ("int64", "float16", "float32", "float64")
EXTENSIONS = {"zstd": "zstd", "gz": "gz", "bz2": "bz2", "br": "br", "snappy": "snappy"}


def _ndarray_args(encoding: str) -> tuple[str | None, tuple[int, ...] | None]:
    config = encoding.partition(":")[2]
    args = config.split(":") if config else []
    dtype = args[0] if args else None
    shape = tuple(int(d) for d in args[1].split(",")) if len(args) > 1 else None
    return dtype, shape


def encoded_size(encoding: str) -> int | None:
    """The fixed size of an encoding's values, ``None`` when it varies (Streaming's
    ``get_mds_encoded_size``)."""
    name = encoding.partition(":")[0]
    if name == "ndarray":
        dtype, shape = _ndarray_args(encoding)
        if dtype is None or shape is None:
            return None
        return int(np.prod(shape)) * np.dtype(dtype).itemsize
    if name == "int":
        return 8
    if name in SCALARS:
        return np.dtype(name).itemsize
    return None


def _shape_code(shape: tuple[int, ...]) -> tuple[int, str]:
    top = max(shape)
    for code, dt in enumerate(("uint8", "uint16", "uint32", "uint64")):
        if top < 1 << (8 << code):
            return code, dt
    raise ValueError(shape)


def encode_ndarray(encoding: str, arr: npt.NDArray[Any]) -> bytes:
    """``[dtype code] [ndim << 2 | shape code] [shape] values``, the dtype and the shape
    left out when the encoding fixes them (Streaming's ``NDArray.encode``)."""
    dtype, shape = _ndarray_args(encoding)
    parts = []
    if dtype is None:
        parts.append(bytes([DTYPE_CODES[arr.dtype.name]]))
    elif arr.dtype != np.dtype(dtype):
        raise ValueError(f"wrong dtype {arr.dtype}, expected {dtype}")
    if arr.size == 0:
        raise ValueError("Streaming refuses to encode an array with 0 elements")
    if shape is None:
        code, shape_dtype = _shape_code(arr.shape)
        parts.append(bytes([(arr.ndim << 2) | code]))
        parts.append(np.asarray(arr.shape, np.dtype(shape_dtype).newbyteorder("<")).tobytes())
    elif arr.shape != shape:
        raise ValueError(f"wrong shape {arr.shape}, expected {shape}")
    parts.append(arr.astype(arr.dtype.newbyteorder("<")).tobytes())
    return b"".join(parts)


def encode(encoding: str, value: Any) -> bytes:
    """One column value encoded (Streaming's ``mds_encode``; bytes pass through as is)."""
    if isinstance(value, bytes):
        return value
    name = encoding.partition(":")[0]
    if name == "ndarray":
        return encode_ndarray(encoding, np.asarray(value))
    if name in ("str", "str_int", "str_float", "str_decimal"):
        return str(value).encode("utf-8")
    if name == "json":
        return json.dumps(value).encode("utf-8")
    if name == "int":
        return np.int64(value).tobytes()
    if name in SCALARS:
        return bytes(np.asarray(value, np.dtype(name).newbyteorder("<")).tobytes())
    if name == "pkl":
        return pickle.dumps(value)
    raise ValueError(f"encoding {encoding!r} is not supported by this test writer")


def compress(compression: str, data: bytes) -> bytes:
    """``data`` compressed as Streaming's ``compress`` does (default levels: zstd 3, gz 9,
    bz2 9)."""
    family, _, level = compression.partition(":")
    if family == "zstd":
        import zstandard

        return bytes(zstandard.ZstdCompressor(level=int(level or 3)).compress(data))
    if family == "gz":
        return gzip.compress(data, int(level or 9), mtime=0)
    if family == "bz2":
        return bz2.compress(data, int(level or 9))
    raise ValueError(f"compression {compression!r} is not supported by this test writer")


def _file_info(data: bytes, basename: str, hashes: Iterable[str]) -> dict[str, Any]:
    return {
        "basename": basename,
        "bytes": len(data),
        "hashes": {algo: hashlib.new(algo, data).hexdigest() for algo in hashes},
    }


def write_mds(
    out: str | os.PathLike[str],
    columns: Mapping[str, str],
    samples: Iterable[Mapping[str, Any]],
    *,
    compression: str | None = None,
    hashes: Iterable[str] = (),
    size_limit: int | None = 1 << 26,
) -> dict[str, Any]:
    """Write an MDS dataset to directory ``out`` (created) and return its index."""
    root = os.fspath(out)
    os.makedirs(root, exist_ok=True)
    names = sorted(columns)
    encodings = [columns[n] for n in names]
    sizes = [encoded_size(e) for e in encodings]
    hashes = sorted(hashes)
    config = {
        "version": 2,
        "format": "mds",
        "compression": compression,
        "hashes": hashes,
        "size_limit": size_limit,
        "column_names": names,
        "column_encodings": encodings,
        "column_sizes": sizes,
    }
    config_data = json.dumps(config, sort_keys=True).encode("utf-8")
    shards: list[dict[str, Any]] = []
    pending: list[bytes] = []
    shard_bytes = 8 + len(config_data)

    def flush() -> None:
        n = len(pending)
        lengths = np.array([0] + [len(s) for s in pending], dtype=np.int64)
        offsets = lengths.cumsum() + 4 + 4 * (n + 1) + len(config_data)
        raw = (
            np.uint32(n).tobytes()
            + offsets.astype("<u4").tobytes()
            + config_data
            + b"".join(pending)
        )
        raw_name = f"shard.{len(shards):05}.mds"
        raw_info = _file_info(raw, raw_name, hashes)
        zip_info = None
        data, name = raw, raw_name
        if compression:
            zip_name = f"{raw_name}.{EXTENSIONS[compression.partition(':')[0]]}"
            data, name = compress(compression, raw), zip_name
            zip_info = _file_info(data, zip_name, hashes)
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        shards.append({"samples": n, "raw_data": raw_info, "zip_data": zip_info, **config})

    for sample in samples:
        head: list[int] = []
        body: list[bytes] = []
        for name, enc, size in zip(names, encodings, sizes, strict=True):
            datum = encode(enc, sample[name])
            if size is None:
                head.append(len(datum))
            elif size != len(datum):
                raise ValueError(f"column {name}: {len(datum)} bytes, encoding says {size}")
            body.append(datum)
        encoded = np.array(head, dtype="<u4").tobytes() + b"".join(body)
        if size_limit and size_limit < shard_bytes + len(encoded) + 4:
            flush()
            pending, shard_bytes = [], 8 + len(config_data)
        pending.append(encoded)
        shard_bytes += len(encoded) + 4
    if pending:
        flush()
    index = {"version": 2, "shards": shards}
    with open(os.path.join(root, "index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, sort_keys=True)
    return index


def merge_index(root: str | os.PathLike[str], subdirs: Iterable[str]) -> dict[str, Any]:
    """A root ``index.json`` listing the shards of ``subdirs`` (each an MDS dataset under
    ``root``) by ``subdir/basename``, as Streaming's ``merge_index`` writes it."""
    shards = []
    for sub in subdirs:
        with open(os.path.join(root, sub, "index.json"), encoding="utf-8") as f:
            for shard in json.load(f)["shards"]:
                for key in ("raw_data", "zip_data"):
                    if shard.get(key):
                        shard[key]["basename"] = f"{sub}/{shard[key]['basename']}"
                shards.append(shard)
    index = {"version": 2, "shards": shards}
    with open(os.path.join(root, "index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, sort_keys=True)
    return index


# -- the reference reader -----------------------------------------------------------------------


def _decompress(compression: str, data: bytes) -> bytes:
    family = compression.partition(":")[0]
    if family == "zstd":
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    if family == "gz":
        return gzip.decompress(data)
    if family == "bz2":
        return bz2.decompress(data)
    raise ValueError(compression)


def decode_ndarray(encoding: str, data: bytes) -> npt.NDArray[Any]:
    """Streaming's ``NDArray.decode``."""
    dtype, shape = _ndarray_args(encoding)
    i = 0
    if dtype is None:
        dtype = {v: k for k, v in DTYPE_CODES.items()}[data[i]]
        i += 1
    if shape is None:
        byte = data[i]
        i += 1
        ndim, width = byte >> 2, 1 << (byte & 3)
        shape = tuple(np.frombuffer(data[i : i + ndim * width], f"<u{width}").tolist())
        i += ndim * width
    return np.frombuffer(data[i:], np.dtype(dtype).newbyteorder("<")).reshape(shape)


def read_shard_reference(
    root: str, shard: Mapping[str, Any], column: str, dtype: Any = None
) -> list[npt.NDArray[Any]]:
    """The token arrays of one index entry's samples, flattened, decoded as Streaming's
    ``MDSReader.get_item`` does (the raw file when present, else the decompressed one)."""
    raw_path = os.path.join(root, shard["raw_data"]["basename"])
    if os.path.exists(raw_path) or not shard.get("zip_data"):
        with open(raw_path, "rb") as f:
            data = f.read()
    else:
        with open(os.path.join(root, shard["zip_data"]["basename"]), "rb") as f:
            data = _decompress(shard["compression"], f.read())
    names, encodings = shard["column_names"], shard["column_encodings"]
    sizes = shard["column_sizes"]
    out = []
    for idx in range(shard["samples"]):
        begin, end = np.frombuffer(data[4 + 4 * idx : 12 + 4 * idx], "<u4").tolist()
        sample = data[begin:end]
        col_sizes, at = [], 0
        for size in sizes:
            if size:
                col_sizes.append(size)
            else:
                col_sizes.append(int(np.frombuffer(sample[at : at + 4], "<u4")[0]))
                at += 4
        for name, enc, size in zip(names, encodings, col_sizes, strict=True):
            value = sample[at : at + size]
            at += size
            if name == column:
                if enc == "bytes":
                    out.append(np.frombuffer(value, np.dtype(dtype).newbyteorder("<")))
                else:
                    out.append(decode_ndarray(enc, value).reshape(-1))
    return out


def read_reference(
    index_path: str, column: str = "input_ids", dtype: Any = None
) -> list[list[npt.NDArray[Any]]]:
    """Every shard's samples' token arrays for the ``index.json`` at ``index_path``."""
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    root = os.path.dirname(index_path)
    return [read_shard_reference(root, s, column, dtype) for s in index["shards"]]
