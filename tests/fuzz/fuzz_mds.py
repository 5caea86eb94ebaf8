"""Long fuzz run of the MDS reader: mutants of small MosaicML Streaming datasets.

Run from the repository root::

    nice -n 19 .venv/bin/python -m tests.fuzz.fuzz_mds --mutants 100000 --workers 1

Mutant ``i`` of a run is a pure function of ``(--seed, i)`` (``random_mds_mutant``, a seeded
``random.Random`` per index): one of five small valid MDS datasets written by
``tests/mds_writer.py`` (fixed-dtype, dtype-less, fixed-shape and ``bytes`` token columns;
empty samples; uncompressed, zstd and gzip shards; a merged index over sub-directories and
nested indexes without a root one) with one to four mutations:

* JSON-aware edits of an ``index.json`` (``mutants._json_op``: a value set to an extreme
  integer or another type, a key dropped or duplicated, list items swapped), and targeted
  ones: ``samples``, ``raw_data.bytes``, ``zip_data.bytes`` and ``column_sizes`` set to
  extremes, hostile encodings (``pkl``, floats, odd shapes), compressions and basenames;
* ``("word", file, offset, value)``: a little-endian uint32 of a shard set, at the fields that
  matter (``num_samples``, an offset, a sample's size prefixes, an array header) or anywhere,
  to an extreme value, its neighbour or another offset's value;
* byte flips, truncations and appended bytes (``mutants._byte_op``);
* ``("inner", file, op)``: a compressed shard decompressed, ``op`` (a word, flip, truncation or
  append) applied to the raw bytes, and compressed again, so that corrupt shards also reach
  the reader through a valid compressed stream;
* ``("fitsizes",)``: every ``raw_data.bytes`` and ``zip_data.bytes`` set to what the files
  hold, so that changed sizes reach the checks behind the size check;
* a shard or index replaced by a FIFO, a symbolic link, a directory, or removed.

Each mutant goes through three entry points, each of which must work or raise a
``ZeroBatchError``:

``detect``   ``is_mds`` returns a bool and never raises (``False`` counts as this entry's
             error);
``read``     ``expand_mds``, every token read whole and in random ascending ranges,
             ``document_starts``; whatever is accepted must equal what a reference decoder that
             decodes as Streaming's ``MDSReader`` does (``tests/mds_writer.read_reference``)
             reads from the same files;
``records``  ``TokenFileSource`` in both layouts, records equal to a plain NumPy cut.

Workers, limits (a 2 GiB address space, ``--hang-seconds`` per mutant), findings and replays
are ``harness.py``'s (its campaign front end).
"""

from __future__ import annotations

import bz2
import functools
import gzip
import itertools
import json
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.fuzz.harness import Campaign, Step, campaign_main, run_entries
from tests.fuzz.mutants import (
    HOSTILE_NAMES,
    JSON_INTS,
    LINK_TARGETS,
    U32_EXTREMES,
    Op,
    Tree,
    _byte_op,
    _json_op,
    _load_json,
    apply_tree,
    draw,
    read_tree,
)
from tests.mds_writer import compress, merge_index, read_shard_reference, write_mds

OPTIONS = "fuzz-options.json"
"""The file in each tree that names the token column and the ``dtype=`` option to read with
(never mutated)."""

ENCODINGS = (
    "pkl",
    "bytes",
    "str",
    "json",
    "int",
    "",
    "ndarray",
    "ndarray:",
    "ndarray:uint16",
    "ndarray:int64",
    "ndarray:uint8",
    "ndarray:float32",
    "ndarray:uint16:3",
    "ndarray:uint16:0",
    "ndarray:uint16:99999999999",
    "ndarray:uint16:2,2",
    "ndarray:int32:4",
    "ndarray::",
    "ndarray:a:b:c",
)
"""Token column encodings a mutant may declare."""

COMPRESSIONS: tuple[Any, ...] = (None, "zstd", "zstd:3", "gz", "bz2:9", "br", "snappy")
COMPRESSIONS += ("zstd:x", "lz4", 5, "")

SHARD_SUFFIXES = (".mds", ".mds.zstd", ".mds.gz")


# -- the bases --------------------------------------------------------------------------------


def _tokens(rng: np.random.Generator, dtype: str, n: int, lo: int = 1) -> list[npt.NDArray[Any]]:
    return [rng.integers(0, 500, int(rng.integers(lo, 12))).astype(dtype) for _ in range(n)]


@functools.cache
def mds_bases() -> tuple[Tree, ...]:
    """Five small valid MDS datasets, each with the options to read it with (built once per
    process)."""
    rng = np.random.default_rng(2024)
    bases: list[Tree] = []
    with tempfile.TemporaryDirectory() as tmp:

        def add(name: str, column: str, dtype: str | None, build: Callable[[str], None]) -> None:
            root = os.path.join(tmp, name)
            os.makedirs(root)
            build(root)
            with open(os.path.join(root, OPTIONS), "w", encoding="utf-8") as f:
                json.dump({"column": column, "dtype": dtype}, f)
            bases.append((read_tree(root), {}))

        def fixed(root: str) -> None:  # ndarray:uint16 between a str and an int column
            samples = [
                {"id": f"d{i}", "input_ids": t, "len": t.size}
                for i, t in enumerate(_tokens(rng, "uint16", 14))
            ]
            columns = {"id": "str", "input_ids": "ndarray:uint16", "len": "int"}
            write_mds(root, columns, samples, size_limit=420)

        def raw_bytes(root: str) -> None:  # bytes with a given dtype, empty samples
            toks = _tokens(rng, "uint32", 12, lo=0)
            samples = [{"tokens": t.tobytes(), "z": f"{i}"} for i, t in enumerate(toks)]
            write_mds(root, {"tokens": "bytes", "z": "str"}, samples, size_limit=400)

        def dtypeless(root: str) -> None:  # dtype-less ndarray, several dtypes, zstd
            toks = _tokens(rng, "uint16", 6) + _tokens(rng, "int32", 4) + _tokens(rng, "uint8", 4)
            toks = [toks[i] for i in rng.permutation(len(toks))]  # dtypes mixed in each shard
            toks[2] = toks[2][:4].reshape(2, 2) if toks[2].size >= 4 else toks[2]
            samples = [{"input_ids": t} for t in toks]
            write_mds(root, {"input_ids": "ndarray"}, samples, compression="zstd", size_limit=330)

        def merged(root: str) -> None:  # fixed shape, two parts, a merged root index
            for part in ("p0", "p1"):
                samples = [{"input_ids": rng.integers(0, 900, 4).astype("int32")} for _ in range(5)]
                sub = os.path.join(root, part)
                write_mds(sub, {"input_ids": "ndarray:int32:4"}, samples, size_limit=280)
            merge_index(root, ["p0", "p1"])

        def nested(root: str) -> None:  # no root index: two sub-directories with their own, gz
            for part in ("a", "b"):
                samples = [{"input_ids": t, "n": 7} for t in _tokens(rng, "int64", 6)]
                columns = {"input_ids": "ndarray:int64", "n": "uint8"}
                sub = os.path.join(root, part)
                write_mds(sub, columns, samples, compression="gz", size_limit=420)

        add("fixed", "input_ids", None, fixed)
        add("bytes", "tokens", "uint32", raw_bytes)
        add("dtypeless", "input_ids", None, dtypeless)
        add("merged", "input_ids", None, merged)
        add("nested", "input_ids", None, nested)
    return tuple(bases)


# -- mutations -----------------------------------------------------------------------------


def _indexes(files: dict[str, bytes]) -> list[str]:
    return sorted(k for k in files if k == "index.json" or k.endswith("/index.json"))


def _shards(files: dict[str, bytes]) -> list[str]:
    return sorted(k for k in files if k.endswith(SHARD_SUFFIXES))


def _decompress(name: str, data: bytes) -> bytes | None:
    """A compressed shard's bytes decompressed, or ``None`` when they do not decompress."""
    try:
        if name.endswith(".zstd"):
            import zstandard

            dobj = zstandard.ZstdDecompressor().decompressobj()
            out = dobj.decompress(data)
            return bytes(out) if len(out) < 1 << 22 else None
        if name.endswith(".gz"):
            return gzip.decompress(data)
        if name.endswith(".bz2"):
            return bz2.decompress(data)
    except Exception:
        return None
    return data


def _compress_like(name: str, raw: bytes) -> bytes:
    family = {".zstd": "zstd", ".gz": "gz", ".bz2": "bz2"}[os.path.splitext(name)[1]]
    return compress(family, raw)


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "little") if at + 4 <= len(data) else 0


def _word_op(rng: random.Random, name: str, raw: bytes) -> Op:
    """A uint32 of a raw shard set: at a field that matters, or anywhere."""
    n = _u32(raw, 0)
    offsets = [_u32(raw, 4 + 4 * k) for k in range(min(n + 1, (len(raw) - 4) // 4, 64))]
    roll = rng.random()
    if roll < 0.15 or not offsets:
        at = 0
    elif roll < 0.45:
        at = 4 + 4 * rng.randrange(len(offsets))
    elif roll < 0.8:
        at = rng.choice(offsets) + rng.choice((0, 0, 4, 8, 1, 2))
    else:
        at = rng.randrange(max(1, len(raw) - 3))
    current = _u32(raw, at)
    roll = rng.random()
    if roll < 0.5:
        value = rng.choice(U32_EXTREMES)
    elif roll < 0.75:
        value = (current + rng.choice((-4, -2, -1, 1, 2, 4))) % (1 << 32)
    elif roll < 0.9 and offsets:
        value = rng.choice(offsets) + rng.choice((-1, 0, 1))
    else:
        value = rng.getrandbits(32)
    return ("word", name, at, value % (1 << 32))


def _index_op(rng: random.Random, name: str, obj: Any) -> Op | None:
    """A targeted edit of an index entry: counts, sizes, encodings, compressions, names."""
    shards = obj.get("shards") if isinstance(obj, dict) else None
    if not isinstance(shards, list) or not shards:
        return None
    i = rng.randrange(len(shards))
    entry = shards[i] if isinstance(shards[i], dict) else {}
    names = entry.get("column_names")
    width = len(names) if isinstance(names, list) else 0
    roll = rng.random()
    value: Any
    if roll < 0.2:
        path: list[Any] = ["shards", i, "samples"]
        current = entry.get("samples")
        near = [current + d for d in (-1, 1, 2)] if isinstance(current, int) else []
        value = rng.choice([*JSON_INTS, *near, 0, 1])
    elif roll < 0.4:
        key = rng.choice(("raw_data", "raw_data", "zip_data"))
        path = ["shards", i, key, "bytes"]
        current = (entry.get(key) or {}).get("bytes") if isinstance(entry.get(key), dict) else None
        near = [current + d for d in (-8, -1, 1, 8)] if isinstance(current, int) else []
        value = rng.choice([*JSON_INTS, *near])
    elif roll < 0.55 and width:
        path = ["shards", i, "column_sizes", rng.randrange(width)]
        value = rng.choice((None, None, 0, 1, 2, 4, 8, 16, 2**32 - 1, 2**32, -1, "8"))
    elif roll < 0.75 and width:
        path = ["shards", i, "column_encodings", rng.randrange(width)]
        value = rng.choice(ENCODINGS)
    elif roll < 0.85:
        path = ["shards", i, "compression"]
        value = rng.choice(COMPRESSIONS)
    elif roll < 0.95:
        path = ["shards", i, rng.choice(("raw_data", "zip_data")), "basename"]
        value = rng.choice((*HOSTILE_NAMES, "shard.00000.mds", "shard.00001.mds.zstd", "p0"))
    else:
        path = ["shards", i, rng.choice(("format", "version", "column_names"))]
        value = rng.choice(("json", "mds", 1, 3, ["input_ids"], ["input_ids", "input_ids"], []))
    return ("set", name, path, value)


def random_mds_op(rng: random.Random, tree: Tree) -> Op:
    """One mutation of an MDS tree (module docstring)."""
    files, _ = tree
    indexes, shards = _indexes(files), _shards(files)
    roll = rng.random()
    if roll < 0.3 and indexes:
        name = rng.choice(indexes)
        obj = _load_json(files[name])
        op = _index_op(rng, name, obj) if rng.random() < 0.6 else _json_op(rng, name, obj)
        if op is not None:
            return op
    if roll < 0.55 and shards:
        name = rng.choice(shards)
        if name.endswith(".mds"):
            return _word_op(rng, name, files[name])
        raw = _decompress(name, files[name])
        if raw is not None:
            sub = _word_op(rng, name, raw) if rng.random() < 0.6 else _byte_op(rng, name, raw)
            return ("inner", name, list(sub))
    if roll < 0.62:
        return ("fitsizes",)
    if roll < 0.92 or not (shards or indexes):
        name = rng.choice(shards + indexes) if shards or indexes else "index.json"
        return _byte_op(rng, name, files.get(name, b""))
    name = rng.choice(shards + indexes)
    roll = rng.random()
    if roll < 0.3:
        return ("symlink", name, rng.choice((*LINK_TARGETS, "/dev/zero", "index.json")))
    if roll < 0.5:
        return ("fifo", name)
    if roll < 0.65:
        return ("dir", name)
    if roll < 0.85:
        return ("remove", name)
    return ("copy", rng.choice(shards + indexes), rng.choice(shards + indexes))


def _fit_sizes(files: dict[str, bytes]) -> None:
    """Every entry's ``raw_data.bytes`` and ``zip_data.bytes`` set to what its files hold."""
    for name in _indexes(files):
        obj = _load_json(files[name])
        if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
            continue
        root = os.path.dirname(name)
        for entry in obj["shards"]:
            if not isinstance(entry, dict):
                continue
            raw, packed = entry.get("raw_data"), entry.get("zip_data")
            for info in (raw, packed):
                if isinstance(info, dict) and isinstance(info.get("basename"), str):
                    key = os.path.normpath(os.path.join(root, info["basename"]))
                    if key in files:
                        info["bytes"] = len(files[key])
                        if info is packed and isinstance(raw, dict):
                            inner = _decompress(key, files[key])
                            if inner is not None:
                                raw["bytes"] = len(inner)
        files[name] = (json.dumps(obj) + "\n").encode()


def apply_mds(tree: Tree, ops: Sequence[Op]) -> Tree:
    """``ops`` applied in order to a copy of ``tree``: the MDS mutations here, the rest by
    ``mutants.apply_tree``."""
    files, special = dict(tree[0]), dict(tree[1])
    for op in ops:
        kind = op[0]
        if kind == "word":
            _, name, at, value = op
            if name in files and at + 4 <= len(files[name]):
                data = bytearray(files[name])
                data[at : at + 4] = int(value).to_bytes(4, "little")
                files[name] = bytes(data)
        elif kind == "inner":
            name, sub = op[1], tuple(op[2])
            raw = _decompress(name, files[name]) if name in files else None
            if raw is not None:
                inner = apply_mds(({name: raw}, {}), [sub])[0][name]
                files[name] = _compress_like(name, inner)
        elif kind == "fitsizes":
            _fit_sizes(files)
        else:
            files, special = apply_tree((files, special), [op])
    return files, special


def _fitsizes(rng: random.Random, ops: list[Op], tree: Tree) -> Op | None:
    """Let changed sizes reach the shards: the index's sizes refitted, now and then."""
    return ("fitsizes",) if rng.random() < 0.4 and ops[-1][0] != "fitsizes" else None


def random_mds_mutant(seed: int, index: int) -> tuple[int, list[Op], Tree]:
    """Mutant ``index`` of run ``seed``: its base, its ops and its tree (deterministic)."""
    rng = random.Random((seed << 40) ^ index ^ 0x4D4453)
    return draw(rng, mds_bases(), random_mds_op, apply_mds, last=_fitsizes)


# -- the oracle ------------------------------------------------------------------------------


def _options(root: str) -> tuple[str, str | None]:
    with open(os.path.join(root, OPTIONS), encoding="utf-8") as f:
        options = json.load(f)
    return options["column"], options["dtype"]


def _detect(root: str) -> None:
    from zerobatch_core.errors import IngestError
    from zerobatch_core.ingest.mds import is_mds

    try:
        found = is_mds(root)
    except BaseException as e:  # is_mds promises never to raise
        raise AssertionError(f"is_mds raised {type(e).__name__}: {e}") from e
    assert isinstance(found, bool)
    if not found:  # counted as this entry's "error": the mutant is no longer taken for MDS
        raise IngestError(f"{root}: not detected as an MDS dataset")


def _reference(shard: Any, column: str, dtype: str | None) -> npt.NDArray[Any]:
    """The shard's tokens as Streaming would decode them from the same files."""
    with open(shard.info.index_path, encoding="utf-8") as f:
        entry = json.load(f)["shards"][shard.info.number]
    root = os.path.dirname(shard.info.index_path)
    try:
        arrays = read_shard_reference(root, entry, column, dtype)
    except Exception as e:
        message = f"ZeroBatch accepted {shard.path}, Streaming's decoding fails: {e!r}"
        raise AssertionError(message) from e
    assert len(arrays) == shard.num_samples, (len(arrays), shard.num_samples)
    lengths = np.diff(np.append(shard.document_starts(), shard.num_tokens))
    assert lengths.tolist() == [a.size for a in arrays], "sample lengths differ from Streaming's"
    if not arrays:
        return np.zeros(0, np.int64)
    return np.concatenate([a.reshape(-1) for a in arrays])


def _read(root: str, index: int) -> None:
    from zerobatch_core.ingest.mds import expand_mds

    column, dtype = _options(root)
    rng = random.Random(index)
    shards = expand_mds(root, column=column, dtype=dtype)
    try:
        for shard in shards:
            n = shard.num_tokens
            whole = shard.read_tokens(0, n)
            assert whole.dtype == shard.dtype and whole.shape == (n,)
            starts = shard.document_starts()
            assert starts.dtype == np.int64 and starts.shape == (shard.num_samples,)
            assert not starts.size or (starts[0] == 0 and starts[-1] <= n)
            assert bool((np.diff(starts) >= 0).all())
            cuts = sorted(rng.randrange(n + 1) for _ in range(4))
            for a, b in itertools.pairwise(cuts):
                assert np.array_equal(shard.read_tokens(a, b), whole[a:b])
            assert np.array_equal(_reference(shard, column, dtype), whole), "tokens differ"
    finally:
        for shard in shards:
            shard.close()


def _numpy_records(whole: npt.NDArray[Any], starts: Any, t: int, layout: str) -> list[Any]:
    if layout == "contiguous":
        return [whole[i : i + t] for i in range(0, whole.size - t + 1, t)]
    rows, pos = [], 0
    for s in sorted(set(int(x) for x in starts)):
        if pos <= s < whole.size:
            if s + t > whole.size:
                break
            rows.append(whole[s : s + t])
            pos = s + t
    return rows


def _records(root: str, index: int) -> None:
    from zerobatch_core.ingest.mds import expand_mds
    from zerobatch_core.ingest.token_files import TokenFileSource

    column, dtype = _options(root)
    for layout in ("contiguous", "documents"):
        t = 1 + (index + len(layout)) % 5
        shards = expand_mds(root, column=column, dtype=dtype)
        src = TokenFileSource(shards, t, layout, 1 + index % 3)
        try:
            expected = []
            for shard in shards:
                whole = shard.read_tokens(0, shard.num_tokens).astype(np.int64)
                expected += _numpy_records(whole, shard.document_starts(), t, layout)
            got = [row for block in src.iter_blocks() for row in block.astype(np.int64)]
            assert len(got) == len(expected) == src.num_records, (len(got), len(expected))
            for a, b in zip(got, expected, strict=True):
                assert np.array_equal(a, b), "a record differs from the NumPy cut"
        finally:
            src.close()


def check_mds(
    root: str, index: int, ops: list[Op], at: Callable[[int], None]
) -> list[tuple[str, str, str]]:
    """Every entry point on the mutant at ``root``."""
    steps: list[Step] = [
        ("detect", lambda: _detect(root), ()),
        ("read", lambda: _read(root, index), ()),
        ("records", lambda: _records(root, index), ()),
    ]
    return run_entries(steps, at)


MDS = Campaign(
    module="tests.fuzz.fuzz_mds",
    mutant=random_mds_mutant,
    bases=mds_bases,
    apply=apply_mds,
    entries=("detect", "read", "records"),
    check=check_mds,
)


if __name__ == "__main__":
    raise SystemExit(campaign_main(MDS, mutants=100_000))
