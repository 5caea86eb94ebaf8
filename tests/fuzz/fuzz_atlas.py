"""Long fuzz run of the Atlas reader: mutants of small valid Atlas datasets, each read every way.

Run from the repository root (``tests/fuzz/README.md`` describes the harness)::

    nice -n 19 .venv/bin/python -m tests.fuzz.fuzz_atlas --mutants 100000 --workers 1

Mutant ``i`` of a run is a pure function of ``(--seed, i)`` (``random_atlas_mutant``: a
``random.Random`` seeded from both): one of four small valid datasets, one per compression
strategy 0-3 (``atlas_bases``, written by ``tests/atlas_writer.py``: two shards, blocks of 2
examples with a short last block, examples as int lists, arrays of several dtypes and pickle
protocols, dicts, empty ones), with one to four mutations:

* ``mutants.py``'s byte mutations (``flip``, ``truncate``, ``append``) of any ``data.bin``,
  ``index.npy``, ``meta.json`` or ``zstd_dict.bin``, and its JSON-aware ones (``set`` a field
  to an extreme value or another type, ``drop``, ``dup``, ``swap``) of the ``meta.json`` files;
* ``("reindex", shard)``: the shard's ``index.npy`` refitted to its ``data.bin`` (last entry
  its size, entries beyond it clipped), so that a truncated or extended ``data.bin`` reaches
  block decoding;
* ``("block", shard, i, kind)``: block ``i`` replaced by a crafted pickle, encoded as the
  shard's strategy says (its dictionary included), with the index refitted: pickles that
  would run code (``os.system``, ``subprocess.Popen``, ``builtins.exec`` creating
  ``MARKER``), floats, negative or huge tokens, bools, object and 2-D arrays, a dict or tuple
  block, too few or too many examples, a persistent id, bytes after the pickle, an
  array of 256 Ki tokens that compresses to little (a bomb when the oracle's cap is small);
* ``mutants.py``'s ``remove``, ``fifo``, ``symlink`` and ``dir`` of one of the files.

The oracle (``check_atlas``) runs four entry points, each opening the dataset afresh
(``expand_atlas``, with a cap of 16 KiB on one mutant in three, else the default):

``open``      ``is_atlas`` of the root and every shard folder (a bool, never an exception) and
              ``expand_atlas``;
``read``      every shard's ``num_tokens`` and all its tokens at once, then again in random
              ascending windows after reopening: the same tokens both times;
``starts``    ``document_starts``: ``int64``, one per example, ascending, inside the stream;
``records``   ``TokenFileSource`` in both layouts at a ``seq_len`` of 1 to 5: exactly the
              records a plain NumPy cut of the streams and starts gives.

Each must work or raise a ZeroBatch error; ``MARKER`` must never exist. Anything else is a
finding of the campaign kinds (``harness.py``) (another exception, ``MemoryError`` under the 2 GiB
address-space limit, a disagreement, a signal, a hang past ``--hang-seconds``).
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import pickle
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.atlas_writer import index_dtype, write_dataset
from tests.fuzz.harness import Campaign, campaign_main, run_entries
from tests.fuzz.mutants import (
    Op,
    Tree,
    _byte_op,
    _json_op,
    _load_json,
    apply_tree,
    draw,
    read_tree,
)

MARKER = "/tmp/zerobatch-atlas-fuzz-marker"
"""The file a crafted pickle would create if it ran; the oracle checks it never exists."""

SMALL_CAP = 1 << 14
"""``max_block_bytes`` of one mutant in three: a ``bomb`` block is then a decompression bomb."""

BLOCK_KINDS = (
    "system",
    "popen",
    "exec",
    "float",
    "negative",
    "huge",
    "bool",
    "object-array",
    "2d-array",
    "float-array",
    "dict-block",
    "tuple-block",
    "few",
    "many",
    "persistent",
    "trailing",
    "bomb",
    "valid",
    "dict-missing-field",
    "nested",
)
"""What ``("block", ...)`` may plant."""

ENTRIES = ("open", "read", "starts", "records")


# -- the bases -------------------------------------------------------------------------------


def _examples(rng: np.random.Generator, n: int, salt: int) -> list[Any]:
    dtypes: tuple[Any, ...] = (np.uint8, np.uint16, ">u2", np.int32, np.int64, np.uint64)
    out: list[Any] = []
    for i in range(n):
        length = 0 if (i + salt) % 6 == 5 else int(rng.integers(1, 7))
        values = rng.integers(0, 200, length)
        kind = (i + salt) % 3
        if kind == 0:
            out.append([int(v) for v in values])
        elif kind == 1:
            out.append(values.astype(dtypes[(i + salt) % len(dtypes)]))
        else:
            out.append({"input_ids": [int(v) for v in values]})
    return out


@functools.cache
def atlas_bases() -> tuple[Tree, ...]:
    """One small valid dataset per strategy: shards of 15 (8 blocks of 2, the last of 1: a
    dictionary is trained) and 5 examples (3 blocks: strategy 3 falls back to 1); built once
    per process."""
    bases: list[Tree] = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in range(4):
            rng = np.random.default_rng(strategy)
            root = os.path.join(tmp, str(strategy))
            shards = [_examples(rng, 15, strategy), _examples(rng, 5, strategy + 1)]
            write_dataset(root, shards, 2, strategy, protocol=(2, 4, 5, 3)[strategy])
            bases.append((dict(sorted(read_tree(root).items())), {}))
    return tuple(bases)


# -- mutations -------------------------------------------------------------------------------


def _index(data: bytes) -> npt.NDArray[np.int64] | None:
    """A mutated ``index.npy`` as int64 offsets, or ``None`` when it is not one (test code: a
    ``.npy`` without pickles, read by NumPy)."""
    try:
        a = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception:
        return None
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "ui":
        return None
    return np.minimum(a.astype(np.float64), 2**62).astype(np.int64)


def _save_index(offsets: Sequence[int]) -> bytes:
    """``offsets`` as ``index.npy`` in the smallest dtype that holds them all (a mutated index
    need not end with its largest entry)."""
    values = [max(0, int(o)) for o in offsets]
    out = io.BytesIO()
    np.save(out, np.array(values, dtype=index_dtype(max(values))))
    return out.getvalue()


def _reindex(files: dict[str, bytes], shard: str) -> None:
    index = _index(files.get(f"{shard}/index.npy", b""))
    if index is None:
        return
    size = len(files.get(f"{shard}/data.bin", b""))
    index = np.minimum(index, size)
    index[-1] = size
    files[f"{shard}/index.npy"] = _save_index(index.tolist())


class _Evil:
    """A pickle that would create ``MARKER`` if it were loaded (it never is)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __reduce__(self) -> Any:
        if self.how == "system":
            return (os.system, (f"touch {MARKER}",))
        if self.how == "popen":
            return (subprocess.Popen, (["touch", MARKER],))
        return (exec, (f"open({MARKER!r}, 'w').close()",))


def crafted_pickle(kind: str, count: int) -> bytes:
    """A block's pickle of ``kind`` (``BLOCK_KINDS``) for a block that must hold ``count``
    examples."""
    fill: list[Any] = [[1, 2]] * max(count - 1, 0)
    protocol = 2 + len(kind) % 4
    if kind in ("system", "popen", "exec"):
        return pickle.dumps([_Evil(kind), *fill], protocol=protocol)
    one: dict[str, Any] = {
        "float": [1, 2.5],
        "negative": [3, -1],
        "huge": [2**40],
        "bool": [True],
        "object-array": np.array([1, "a"], dtype=object),
        "2d-array": np.zeros((2, 2), np.uint16),
        "float-array": np.ones(3, np.float32),
        "nested": [[1, [2]]],
        "dict-missing-field": {"ids": [1]},
        "valid": np.arange(5, dtype=np.uint32),
        "bomb": np.zeros(1 << 18, np.uint8),
    }
    if kind in one:
        return pickle.dumps([one[kind], *fill], protocol=protocol)
    if kind == "dict-block":
        return pickle.dumps({"examples": fill}, protocol=protocol)
    if kind == "tuple-block":
        return pickle.dumps(tuple(fill), protocol=protocol)
    if kind == "few":
        return pickle.dumps(fill[:-1], protocol=protocol)
    if kind == "many":
        return pickle.dumps([*fill, [9], [9]], protocol=protocol)
    if kind == "persistent":
        return b"\x80\x02]q\x00(P1\nq\x01e."
    return pickle.dumps([[5], *fill], protocol=protocol) + b"\x00"  # "trailing"


def _encode(files: dict[str, bytes], shard: str, block: bytes) -> bytes:
    """``block`` encoded as the shard's ``meta.json`` says (as is when it says nothing
    usable), with the dictionary the strategy names when there is one."""
    import zstandard

    meta = _load_json(files.get(f"{shard}/meta.json", b""))
    strategy = meta.get("compression_strategy") if isinstance(meta, dict) else 0
    if strategy not in (1, 2, 3):
        return block
    where = {2: "zstd_dict.bin", 3: f"{shard}/zstd_dict.bin"}.get(strategy)
    try:
        if where is not None and where in files:
            zdict = zstandard.ZstdCompressionDict(files[where])
            return bytes(zstandard.ZstdCompressor(dict_data=zdict).compress(block))
    except zstandard.ZstdError:
        pass
    return bytes(zstandard.ZstdCompressor().compress(block))


def _plant(files: dict[str, bytes], shard: str, i: int, kind: str) -> None:
    index = _index(files.get(f"{shard}/index.npy", b""))
    data = files.get(f"{shard}/data.bin", b"")
    if index is None or index.size < 2:
        return
    i %= index.size - 1
    lo, hi = sorted((int(index[i]), int(index[i + 1])))
    if hi > len(data):
        return
    meta = _load_json(files.get(f"{shard}/meta.json", b""))
    count = meta.get("block_size") if isinstance(meta, dict) else 2
    count = count if type(count) is int and 0 < count < 64 else 2
    new = _encode(files, shard, crafted_pickle(kind, count))
    files[f"{shard}/data.bin"] = data[:lo] + new + data[hi:]
    shift = len(new) - (hi - lo)
    index[i + 1 :] += shift
    files[f"{shard}/index.npy"] = _save_index(index.tolist())


def apply_atlas(tree: Tree, ops: Sequence[Op]) -> Tree:
    """The mutant: ``ops`` applied in order to a copy of ``tree``."""
    for op in ops:
        if op[0] in ("reindex", "block"):
            files = dict(tree[0])
            if op[0] == "reindex":
                _reindex(files, op[1])
            else:
                _plant(files, op[1], op[2], op[3])
            tree = (files, dict(tree[1]))
        else:
            tree = apply_tree(tree, [op])
    return tree


def _shards(tree: Tree) -> list[str]:
    return sorted({name.split("/")[0] for name in tree[0] if "/" in name}) or ["0"]


def random_atlas_op(rng: random.Random, tree: Tree) -> Op:
    """One mutation of an Atlas tree, weighted towards the data and the index."""
    files = tree[0]
    shard = rng.choice(_shards(tree))
    roll = rng.random()
    if roll < 0.45:
        weights = (("data.bin", 8), ("index.npy", 5), ("meta.json", 4), ("zstd_dict.bin", 1))
        name = rng.choices([n for n, _ in weights], [w for _, w in weights])[0]
        path = name if name == "zstd_dict.bin" and name in files else f"{shard}/{name}"
        if name == "meta.json" and rng.random() < 0.3:
            path = "meta.json"
        return _byte_op(rng, path, files.get(path, b""))
    if roll < 0.65:
        path = "meta.json" if rng.random() < 0.35 else f"{shard}/meta.json"
        obj = _load_json(files.get(path, b""))
        if isinstance(obj, dict):
            op = _json_op(rng, path, obj)
            if op is not None:
                return op
        return ("reindex", shard)
    if roll < 0.78:
        return ("reindex", shard)
    if roll < 0.94:
        return ("block", shard, rng.randrange(16), rng.choice(BLOCK_KINDS))
    name = rng.choice(sorted(files) or ["meta.json"])
    special = rng.random()
    if special < 0.35:
        return ("remove", name)
    if special < 0.6:
        return ("fifo", name)
    if special < 0.8:
        return ("symlink", name, rng.choice(("/dev/zero", "/dev/null", "..", "missing")))
    return ("dir", name)


def _reindex_last(rng: random.Random, ops: list[Op], tree: Tree) -> Op | None:
    """Let a changed ``data.bin`` reach block decoding: an index refitted, now and then."""
    if rng.random() < 0.25 and ops[-1][0] not in ("reindex", "block"):
        return ("reindex", rng.choice(_shards(tree)))
    return None


def random_atlas_mutant(seed: int, index: int) -> tuple[int, list[Op], Tree]:
    """Mutant ``index`` of run ``seed``: its base, its ops and its tree (deterministic)."""
    rng = random.Random((seed << 40) ^ index ^ 0xA7)
    return draw(rng, atlas_bases(), random_atlas_op, apply_atlas, last=_reindex_last)


# -- the oracle ------------------------------------------------------------------------------


def _cap(index: int) -> dict[str, Any]:
    from zerobatch_core.ingest.atlas import MAX_BLOCK_BYTES

    return {"max_block_bytes": SMALL_CAP if index % 3 == 0 else MAX_BLOCK_BYTES}


def _open(root: str, index: int) -> None:
    from zerobatch_core.ingest.atlas import expand_atlas, is_atlas

    for path in [root, *(os.path.join(root, n) for n in sorted(os.listdir(root)))]:
        answer = is_atlas(path)
        assert isinstance(answer, bool), f"is_atlas({path!r}) gave {answer!r}"
    for shard in expand_atlas(root, **_cap(index)):
        shard.close()


def _streams(root: str, index: int) -> list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]]:
    """Every shard's whole stream (one read) and document starts."""
    from zerobatch_core.ingest.atlas import expand_atlas

    out = []
    for shard in expand_atlas(root, **_cap(index)):
        n = shard.num_tokens
        tokens = shard.read_tokens(0, n)
        assert tokens.dtype == np.uint32 and tokens.shape == (n,), (tokens.dtype, tokens.shape)
        out.append((tokens, shard.document_starts()))
    return out


def _read(root: str, index: int) -> None:
    from zerobatch_core.ingest.atlas import expand_atlas

    whole = [tokens for tokens, _ in _streams(root, index)]
    rng = random.Random(index)
    for shard, tokens in zip(expand_atlas(root, **_cap(index)), whole, strict=True):
        n = shard.num_tokens
        assert n == tokens.size, f"{shard.path}: {n} tokens after reopening, {tokens.size} before"
        cuts = sorted({0, n, *(rng.randrange(n + 1) for _ in range(rng.randrange(6)))})
        for lo, hi in itertools.pairwise(cuts):
            got = shard.read_tokens(lo, hi)
            assert np.array_equal(got, tokens[lo:hi]), f"{shard.path}: tokens [{lo}, {hi}) differ"


def _starts(root: str, index: int) -> None:
    from zerobatch_core.ingest.atlas import expand_atlas

    for shard in expand_atlas(root, **_cap(index)):
        starts = shard.document_starts()
        n = shard.num_tokens
        assert starts.dtype == np.int64 and starts.shape == (shard.num_examples,), starts.shape
        if starts.size:
            assert starts[0] == 0 and int(starts[-1]) <= n, (starts[:3], starts[-3:], n)
            assert bool((np.diff(starts) >= 0).all()), "document starts not ascending"


def _cut(
    tokens: npt.NDArray[np.uint32], starts: npt.NDArray[np.int64], t: int, layout: str
) -> list[list[int]]:
    if layout == "contiguous":
        n = tokens.size // t
        return tokens[: n * t].reshape(n, t).tolist()
    out: list[list[int]] = []
    pos = 0
    for s in sorted({int(s) for s in starts}):
        if s < pos or s >= tokens.size:
            continue
        if s + t > tokens.size:
            break
        out.append(tokens[s : s + t].tolist())
        pos = s + t
    return out


def _records(root: str, index: int) -> None:
    from zerobatch_core.ingest.atlas import expand_atlas
    from zerobatch_core.ingest.token_files import LAYOUTS, TokenFileSource

    streams = _streams(root, index)
    t = 1 + index % 5
    # Small chunks cross blocks and shards often; a long stream (a planted 256 Ki-token block)
    # is read in at most about 256 chunks, so that the harness stays fast.
    chunk = max(2, sum(tokens.size for tokens, _ in streams) // (256 * t))
    for layout in LAYOUTS:
        src = TokenFileSource(expand_atlas(root, **_cap(index)), t, layout, chunk_records=chunk)
        got = [row.tolist() for block in src.iter_blocks() for row in block]
        want = [r for tokens, starts in streams for r in _cut(tokens, starts, t, layout)]
        assert got == want, f"{layout} records at seq_len {t} differ from a NumPy cut"
        assert src.num_records == len(want)
        src.close()


def _guarded(fn: Callable[[str, int], None], root: str, index: int) -> Callable[[], None]:
    def run() -> None:
        try:
            fn(root, index)
        finally:
            assert not os.path.exists(MARKER), f"{MARKER} exists: a crafted pickle ran"

    return run


def check_atlas(
    root: str, index: int, ops: list[Op], at: Callable[[int], None]
) -> list[tuple[str, str, str]]:
    """Every entry point on the mutant at ``root`` (module docstring)."""
    steps = (("open", _open), ("read", _read), ("starts", _starts), ("records", _records))
    return run_entries([(entry, _guarded(fn, root, index), ()) for entry, fn in steps], at)


ATLAS = Campaign(
    module="tests.fuzz.fuzz_atlas",
    mutant=random_atlas_mutant,
    bases=atlas_bases,
    apply=apply_atlas,
    entries=ENTRIES,
    check=check_atlas,
)


if __name__ == "__main__":
    if "--worker" not in sys.argv and os.path.exists(MARKER):
        raise SystemExit(f"{MARKER} exists before the run: remove it first")
    raise SystemExit(campaign_main(ATLAS))
