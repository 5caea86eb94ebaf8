"""``convert`` from other systems' token formats: tokens/s against a bare NumPy read and write.

One synthetic corpus of pre-tokenized documents (fixed seed) is written once in each format
``convert`` reads besides nanoGPT/.npy/text, with the small writers the tests use (no Megatron,
Streaming or Atlas library needed):

``megatron``  ``PREFIX.bin`` + ``PREFIX.idx``, uint16 and int32, one sequence per document
              (``tests/fuzz/fuzz_megatron.write_dataset``, byte for byte what megatron-core's
              ``IndexedDatasetBuilder`` writes)
``hf``        ``Dataset.save_to_disk`` (Arrow stream files) and ``Dataset.to_parquet``, one
              ``input_ids`` column of ``list<int32>``, written by ``datasets`` itself with its
              default shard and batch sizes
``mds``       MosaicML MDS, one ``input_ids`` column ``ndarray:int32``, shards of at most 64 MiB
              (Streaming's default ``size_limit``), raw and ``zstd`` (level 3)
              (``tests/mds_writer.write_mds``)
``atlas``     Atlas datasets, strategy 0 (no compression) and 1 (zstd level 3), blocks of 100
              examples, shards of 10,000 examples; each example a NumPy uint32 array or a
              Python list of ints (``tests/atlas_writer.write_dataset``)

The corpus: ``--tokens`` tokens (50M at ``--scale 1``) in documents whose lengths are
log-normal (median 700 tokens, sigma 0.9, clipped to [16, 16384]; mean about 1,050), each
ending with an end-of-document id; token ids drawn with a Zipf-like frequency
(``1 / (rank + 2.7) ** 1.07``, ranks mapped to ids by a fixed permutation) from a GPT-2-sized
vocabulary of 50,257, so uint16 holds them and zstd compresses them about as much as real
tokens (about 2x from int32).

Every measurement runs in a fresh child process (``_common.run_child``), with the inputs it
reads warm in the page cache (each input file read once in 8 MiB reads just before the child
starts; ``fincore`` reports what is resident) and dirty pages flushed (``os.sync``); outputs are
deleted after each trial. The clock runs inside the child around the measured call only
(imports excluded). Trials are interleaved across variants; the best trial is reported (other
work on a shared 2-core machine only ever slows a run), the per-trial times beside it.

``convert(source, output, seq_len=1024, batch_size=8, align=LAYOUT)``: one LLMBATCH file
(read, cut into records, shuffled, written, fsynced, renamed into place), ``contiguous`` for
every format and ``documents`` for a few.

**The baseline** (``bare read+write``, the reference of the "vs bare" column): in one child,
``np.fromfile`` of the whole int32 Megatron ``.bin`` (every token of the corpus, 4 bytes each,
from the page cache), then ``ndarray.tofile`` of the first ``out_tokens`` of them (as many tokens
as a contiguous ``convert`` writes, so the same number of bytes as the LLMBATCH body) into a new
file beside the outputs, ``fsync``, ``close``. ``bare read`` (the ``np.fromfile`` alone) is
printed too. The ratio is tokens/s over the baseline's, with tokens = the corpus's tokens for
every row (a ``documents`` conversion writes fewer: records start at document starts).

The machine's memory bandwidth for scale: ``np.copyto`` between two 512 MiB arrays, best of 5,
in its own child (bytes copied per second; at 4 bytes a token, the tokens/s that copying alone
would allow).

Each conversion's output is checked on its first trial, after the clock stops: its records,
as a multiset (a 64-bit key per record: the record's tokens dotted with fixed random weights,
wrapping), must be ``kept = len(expected) // batch_size * batch_size`` of the expected records,
a plain NumPy cut of each input file's tokens (the file's documents as the writer split them
into shards/files; records never cross files): every ``seq_len`` tokens (``contiguous``) or one
record at each document start not inside the previous record (``documents``). A mismatch is
printed as a WARNING and the exit status is 1.

::

    python benchmarks/formats_bench.py                 # 50M tokens, 3 trials, ~3 min
    python benchmarks/formats_bench.py --quick         # 2M tokens, 1 trial: a smoke run (< 1 min)
    python benchmarks/formats_bench.py --scale 0.5     # 25M tokens
    python benchmarks/formats_bench.py --keep DIR      # keep (and reuse) the corpus in DIR

Generated files live in a temporary directory under ``bench-output/`` (gitignored) and are
removed at the end unless ``--keep`` names a directory. The orchestrating process imports only
the standard library (see ``_common``); the children import ZeroBatch from the working tree (the
repository root first on ``sys.path``), not from the editable install's link tree.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import MIB, REPO, fit_to_disk, median, run_child, scratch_dir, settle, warm

SCRIPT = Path(__file__).resolve()
SEQ_LEN = 1024
BATCH_SIZE = 8
BASE_TOKENS = 50_000_000
QUICK_TOKENS = 2_000_000
VOCAB = 50_257
EOD = VOCAB - 1
SEED = 2323
ATLAS_BLOCK = 100
ATLAS_SHARD = 10_000
MDS_SIZE_LIMIT = 1 << 26
COPY_BYTES = 512 * MIB
CORPUS_VERSION = 2
"""Bumped when the corpus or its writers change (``--keep`` regenerates a stale corpus)."""

# (name, format, variant, source relative to the work directory, layout)
VARIANTS: list[tuple[str, str, str, str, str]] = [
    ("megatron-u16", "megatron", "uint16", "megatron-u16/corpus", "contiguous"),
    ("megatron-u16-docs", "megatron", "uint16", "megatron-u16/corpus", "documents"),
    ("megatron-i32", "megatron", "int32", "megatron-i32/corpus", "contiguous"),
    ("hf-arrow", "hf", "save_to_disk (arrow)", "hf-arrow", "contiguous"),
    ("hf-arrow-docs", "hf", "save_to_disk (arrow)", "hf-arrow", "documents"),
    ("hf-parquet", "hf", "parquet", "hf-parquet/data.parquet", "contiguous"),
    ("mds-raw", "mds", "raw", "mds-raw", "contiguous"),
    ("mds-zstd", "mds", "zstd", "mds-zstd", "contiguous"),
    ("mds-zstd-docs", "mds", "zstd", "mds-zstd", "documents"),
    ("atlas-s0-np", "atlas", "s0, uint32 arrays", "atlas-s0-np", "contiguous"),
    ("atlas-s0-list", "atlas", "s0, lists", "atlas-s0-list", "contiguous"),
    ("atlas-s1-np", "atlas", "s1 zstd, uint32 arrays", "atlas-s1-np", "contiguous"),
    ("atlas-s1-list", "atlas", "s1 zstd, lists", "atlas-s1-list", "contiguous"),
    ("atlas-s1-list-docs", "atlas", "s1 zstd, lists", "atlas-s1-list", "documents"),
]
BASELINES: list[tuple[str, str, str]] = [
    ("bare-read", "numpy", "read (fromfile)"),
    ("bare-rw", "numpy", "read+write (reference)"),
]
REFERENCE = "bare-rw"


# --- the corpus (children) --------------------------------------------------------------------


def _corpus(tokens: int, seed: int = SEED) -> tuple[Any, Any]:
    """The corpus's tokens (int32) and document lengths (int64); the last document is cut."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(700), 0.9, size=tokens // 300 + 16), 16, 16384)
    lengths = lengths.astype(np.int64)
    ends = np.cumsum(lengths)
    n = int(np.searchsorted(ends, tokens)) + 1
    lengths = lengths[:n].copy()
    lengths[-1] -= int(ends[n - 1]) - tokens
    weights = 1.0 / (np.arange(VOCAB - 1) + 2.7) ** 1.07
    cdf = np.cumsum(weights / weights.sum())
    ids = rng.permutation(VOCAB - 1).astype(np.int32)  # rank -> id; EOD is VOCAB - 1
    out = np.empty(tokens, np.int32)
    step = 1 << 22
    for start in range(0, tokens, step):
        u = rng.random(min(step, tokens - start))
        out[start : start + u.size] = ids[np.minimum(np.searchsorted(cdf, u), VOCAB - 2)]
    out[np.cumsum(lengths) - 1] = EOD
    return out, lengths


class _Docs(Sequence[Any]):
    """The corpus's documents as a lazy sequence: NumPy uint32 arrays or Python lists."""

    def __init__(self, tokens: Any, starts: Any, as_list: bool) -> None:
        self.tokens, self.starts, self.as_list = tokens, starts, as_list

    def __len__(self) -> int:
        return len(self.starts) - 1

    def _one(self, i: int) -> Any:
        doc = self.tokens[self.starts[i] : self.starts[i + 1]]
        return doc.tolist() if self.as_list else doc.astype("uint32")

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._one(k) for k in range(*i.indices(len(self)))]
        return self._one(i)


def _fsync_tree(root: Path) -> None:
    for p in [root] if root.is_file() else sorted(root.rglob("*")):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _write_megatron(root: Path, tokens: Any, lengths: Any, code: int) -> None:
    from tests.fuzz.fuzz_megatron import write_dataset

    starts = [0, *lengths.cumsum().tolist()]
    sequences = [tokens[a:b] for a, b in itertools.pairwise(starts)]
    idx, data = write_dataset(sequences, list(range(len(sequences) + 1)), code)  # type: ignore[arg-type]
    root.mkdir()
    (root / "corpus.idx").write_bytes(idx)
    (root / "corpus.bin").write_bytes(data)


def _hf_dataset(tokens: Any, lengths: Any) -> Any:
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    offsets = np.concatenate([[0], lengths.cumsum()]).astype(np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))
    return Dataset(InMemoryTable(pa.table({"input_ids": column})))


def _write_mds(root: Path, tokens: Any, starts: Any, compression: str | None) -> None:
    from tests.mds_writer import write_mds

    samples = ({"input_ids": tokens[a:b]} for a, b in itertools.pairwise(starts))
    write_mds(
        root,
        {"input_ids": "ndarray:int32"},
        samples,
        compression=compression,
        size_limit=MDS_SIZE_LIMIT,
    )


def _write_atlas(root: Path, tokens: Any, starts: Any, strategy: int, as_list: bool) -> None:
    from tests.atlas_writer import write_dataset

    docs = _Docs(tokens, starts, as_list)
    shards = [
        _Docs(tokens, starts[i : i + ATLAS_SHARD + 1], as_list)
        for i in range(0, len(docs), ATLAS_SHARD)
    ]
    write_dataset(str(root), shards, block_size=ATLAS_BLOCK, strategy=strategy)


def _docs_per_file(path: Path, documents: int) -> list[int]:
    """The documents in each file of a written corpus, in the order the readers read them."""
    import pyarrow as pa

    if (path / "state.json").exists():  # save_to_disk
        state = json.loads((path / "state.json").read_text())
        counts = []
        for item in state["_data_files"]:
            with pa.OSFile(str(path / item["filename"])) as f:
                counts.append(pa.ipc.open_stream(f).read_all().num_rows)
        return counts
    if (path / "index.json").exists():  # MDS
        return [s["samples"] for s in json.loads((path / "index.json").read_text())["shards"]]
    if (path / "meta.json").exists():  # Atlas
        return list(json.loads((path / "meta.json").read_text())["shard_sizes"])
    return [documents]  # one Megatron or parquet file


def _child_generate(payload: dict[str, Any]) -> dict[str, Any]:
    import datasets
    import numpy as np

    datasets.disable_progress_bars()
    root = Path(payload["workdir"])
    t0 = time.perf_counter()
    tokens, lengths = _corpus(int(payload["tokens"]))
    starts = np.concatenate([[0], lengths.cumsum()])
    seconds = {"corpus": time.perf_counter() - t0}
    writers = {
        "megatron-u16": lambda p: _write_megatron(p, tokens, lengths, 8),
        "megatron-i32": lambda p: _write_megatron(p, tokens, lengths, 4),
        "hf-arrow": lambda p: _hf_dataset(tokens, lengths).save_to_disk(str(p)),
        "hf-parquet": lambda p: (
            p.mkdir(),
            _hf_dataset(tokens, lengths).to_parquet(str(p / "data.parquet")),
        ),
        "mds-raw": lambda p: _write_mds(p, tokens, starts, None),
        "mds-zstd": lambda p: _write_mds(p, tokens, starts, "zstd"),
        "atlas-s0-np": lambda p: _write_atlas(p, tokens, starts, 0, False),
        "atlas-s0-list": lambda p: _write_atlas(p, tokens, starts, 0, True),
        "atlas-s1-np": lambda p: _write_atlas(p, tokens, starts, 1, False),
        "atlas-s1-list": lambda p: _write_atlas(p, tokens, starts, 1, True),
    }
    sizes = {}
    for name, write in writers.items():
        t = time.perf_counter()
        write(root / name)
        _fsync_tree(root / name)
        seconds[name] = time.perf_counter() - t
        sizes[name] = sum(p.stat().st_size for p in (root / name).rglob("*") if p.is_file())
        print(
            f"  wrote {name:<14} {sizes[name] / MIB:8.1f} MiB in {seconds[name]:6.2f} s",
            file=sys.stderr,
            flush=True,
        )
    return {
        "version": CORPUS_VERSION,
        "files": {name: _docs_per_file(root / name, int(lengths.size)) for name in writers},
        "tokens": int(tokens.size),
        "documents": int(lengths.size),
        "doc_len_median": float(np.median(lengths)),
        "doc_len_mean": float(lengths.mean()),
        "doc_len_p10_p90": [float(x) for x in np.percentile(lengths, [10, 90])],
        "write_seconds": seconds,
        "bytes": sizes,
    }


# --- measurements (children) ------------------------------------------------------------------


def _child_copy(payload: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    n = int(payload["bytes"]) // 8
    src = np.arange(n, dtype=np.uint64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return {"seconds": best, "bytes": n * 8, "bytes_per_s": n * 8 / best}


def _child_bare(payload: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    t = time.perf_counter()
    arr = np.fromfile(payload["bin"], dtype=np.int32)
    read = time.perf_counter() - t
    total = arr.size
    if payload["write"]:
        with open(payload["output"], "wb") as f:
            arr[: payload["out_tokens"]].view(np.uint32).tofile(f)
            f.flush()
            os.fsync(f.fileno())
    seconds = time.perf_counter() - t
    written = int(payload["out_tokens"]) if payload["write"] else 0
    return {"seconds": seconds, "read_seconds": read, "tokens": int(total), "out_tokens": written}


def _expected_keys(payload: dict[str, Any], weights: Any) -> Any:
    """Keys of the records a plain cut of each input file gives (see the module docstring)."""
    import numpy as np

    tokens = np.fromfile(payload["corpus_bin"], dtype=np.int32).astype(np.uint32)
    with open(payload["corpus_idx"], "rb") as f:
        f.seek(18)
        count = int(np.frombuffer(f.read(8), "<u8")[0])
        f.seek(34)
        lengths = np.frombuffer(f.read(4 * count), "<i4").astype(np.int64)
    doc_ends = np.cumsum(lengths)
    keys, doc = [], 0
    for n_docs in payload["files"]:
        lo = int(doc_ends[doc - 1]) if doc else 0
        hi = int(doc_ends[doc + n_docs - 1]) if n_docs else lo
        file_tokens = tokens[lo:hi]
        if payload["layout"] == "contiguous":
            rows = file_tokens[: file_tokens.size // SEQ_LEN * SEQ_LEN].reshape(-1, SEQ_LEN)
        else:
            starts, at = [], 0
            for s in (np.concatenate([[lo], doc_ends[doc : doc + n_docs - 1]]) - lo).tolist():
                if s < at:
                    continue
                if s + SEQ_LEN > file_tokens.size:
                    break
                starts.append(s)
                at = s + SEQ_LEN
            index = np.asarray(starts, np.int64)[:, None] + np.arange(SEQ_LEN)
            rows = file_tokens[index] if starts else np.empty((0, SEQ_LEN), np.uint32)
        keys.append(rows.astype(np.uint64) @ weights)
        doc += n_docs
    return np.concatenate(keys)


def _check_records(payload: dict[str, Any]) -> dict[str, Any]:
    """Whether the output holds ``kept`` of the expected records (see the module docstring)."""
    from collections import Counter

    import numpy as np

    from zerobatch_core import BatchFileReader

    weights = np.random.default_rng(5).integers(1, 2**63, SEQ_LEN, dtype=np.uint64) | 1
    expected = Counter(_expected_keys(payload, weights).tolist())
    got: Counter[int] = Counter()
    with BatchFileReader(payload["output"]) as reader:
        for i in range(reader.num_batches):
            rows = np.asarray(reader.read_batch(i)).reshape(-1, SEQ_LEN)
            got.update((rows.astype(np.uint64) @ weights).tolist())
    n_expected = sum(expected.values())
    kept = n_expected // BATCH_SIZE * BATCH_SIZE
    unexpected = sum((got - expected).values())
    n_got = sum(got.values())
    return {
        "expected_records": n_expected,
        "records_found": n_got,
        "unexpected_records": unexpected,
        "records_ok": unexpected == 0 and n_got == kept,
    }


def _child_convert(payload: dict[str, Any]) -> dict[str, Any]:
    import pyarrow  # noqa: F401  (imported before the clock starts)
    import zstandard  # noqa: F401

    from zerobatch_core import convert

    t = time.perf_counter()
    summary = convert(
        [payload["source"]],
        payload["output"],
        seq_len=SEQ_LEN,
        batch_size=BATCH_SIZE,
        align=payload["layout"],
    )
    seconds = time.perf_counter() - t
    check = _check_records(payload) if payload["check"] else {}
    return {
        "seconds": seconds,
        "kind": summary.kind,
        "source_tokens": summary.source_tokens,
        "out_tokens": summary.tokens,
        "records": summary.records,
        "output_bytes": summary.output_bytes,
        **check,
    }


def child(payload: dict[str, Any]) -> None:
    """Run one child role and print its JSON report on stdout."""
    roles = {
        "generate": _child_generate,
        "copy": _child_copy,
        "bare": _child_bare,
        "convert": _child_convert,
    }
    print(json.dumps(roles[payload["role"]](payload)))


# --- the parent -------------------------------------------------------------------------------


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    if path.exists():
        return [path]
    return sorted(path.parent.glob(path.name + ".*"))  # a Megatron prefix


def _resident(files: Sequence[Path]) -> float | None:
    """The fraction of ``files``' bytes in the page cache (``fincore``), None if unknown."""
    if not shutil.which("fincore") or not files:
        return None
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    res = size = 0
    for line in out.stdout.split("\n"):
        parts = line.split()
        if len(parts) == 2:
            res, size = res + int(parts[0]), size + int(parts[1])
    return res / size if size else None


def _trial(
    name: str, workdir: Path, meta: dict[str, Any], first: bool
) -> tuple[dict[str, Any], float | None]:
    """Run one measurement of ``name`` in a child; its report and the inputs' cached fraction."""
    output = workdir / "out.batch"
    if name in ("bare-read", "bare-rw"):
        inputs = _files(workdir / "megatron-i32" / "corpus.bin")
        payload: dict[str, Any] = {
            "role": "bare",
            "bin": str(inputs[0]),
            "write": name == "bare-rw",
            "out_tokens": meta["out_tokens"],
            "output": str(output),
        }
    else:
        source = next(v[3] for v in VARIANTS if v[0] == name)
        layout = next(v[4] for v in VARIANTS if v[0] == name)
        inputs = _files(workdir / source)
        payload = {
            "role": "convert",
            "source": str(workdir / source),
            "output": str(output),
            "layout": layout,
            "check": first,
            "files": meta["files"][source.split("/")[0]],
            "corpus_bin": str(workdir / "megatron-i32" / "corpus.bin"),
            "corpus_idx": str(workdir / "megatron-i32" / "corpus.idx"),
        }
    for f in inputs:
        warm(f)
    settle()
    cached = _resident(inputs)
    report = run_child(SCRIPT, payload).report
    output.unlink(missing_ok=True)
    return report, cached


def _generate(workdir: Path, tokens: int) -> dict[str, Any]:
    meta_path = workdir / "corpus.json"
    if meta_path.exists():
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        if meta.get("tokens") == tokens and meta.get("version") == CORPUS_VERSION:
            print(f"reusing the corpus in {workdir}")
            return meta
        for p in workdir.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    print(f"writing {tokens:,} tokens in each format")
    meta = run_child(SCRIPT, {"role": "generate", "workdir": str(workdir), "tokens": tokens}).report
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _fmt_row(cols: Sequence[str]) -> str:
    widths = (8, 22, 10, 11, 9, 6, 7, 7, 8, 7)
    parts = [
        f"{c:<{w}}" if i < 3 else f"{c:>{w}}"
        for i, (c, w) in enumerate(zip(cols, widths, strict=False))
    ]
    return " ".join(parts) + ("  " + cols[-1] if len(cols) > len(widths) else "")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, generate the corpus, run the measurements, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="corpus size x this")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2M tokens, 1 trial")
    parser.add_argument("--tokens", type=int, help="corpus tokens (overrides --scale)")
    parser.add_argument("--trials", type=int, help="trials per variant (default 3; 1 if quick)")
    parser.add_argument(
        "--variants",
        default=",".join(v[0] for v in VARIANTS),
        help="comma-separated subset of the conversions (the baselines always run)",
    )
    parser.add_argument("--keep", type=Path, help="keep the corpus in this directory (reused)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        # The working tree's modules, not the editable install's link tree (which misses
        # modules added since it was built); the test writers live under tests/ too.
        sys.path.insert(0, str(REPO))
        child(json.loads(args.child))
        return 0
    trials = args.trials or (1 if args.quick else 3)
    tokens = args.tokens or int((QUICK_TOKENS if args.quick else BASE_TOKENS) * args.scale)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in {v[0] for v in VARIANTS}]
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(
        f"ZeroBatch convert from other formats: {os.cpu_count()} CPUs; Python "
        f"{platform.python_version()}; seq_len {SEQ_LEN}, batch_size {BATCH_SIZE}; "
        f"{trials} trial(s); load average {load_before[0]:.2f}; "
        f"{started.isoformat(timespec='seconds')}"
    )
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        workdir = args.keep.resolve()
    else:
        workdir = scratch_dir("formats-")
    try:
        # Inputs take about 24 bytes a token in all, the output and the baseline's 4 more.
        mtok = fit_to_disk(tokens / MIB, 28, workdir, "corpus (Mi tokens)")
        tokens = tokens if mtok == tokens / MIB else int(mtok * MIB)
        meta = _generate(workdir, tokens)
        records = meta["tokens"] // SEQ_LEN
        meta["out_tokens"] = records // BATCH_SIZE * BATCH_SIZE * SEQ_LEN
        copy = run_child(SCRIPT, {"role": "copy", "bytes": COPY_BYTES}).report
        print(
            f"corpus: {meta['tokens']:,} tokens in {meta['documents']:,} documents (length "
            f"median {meta['doc_len_median']:.0f}, mean {meta['doc_len_mean']:.0f}, p10-p90 "
            f"{meta['doc_len_p10_p90'][0]:.0f}-{meta['doc_len_p10_p90'][1]:.0f}), vocab "
            f"{VOCAB:,}; a contiguous conversion of one file writes {meta['out_tokens']:,}"
        )
        print(
            f"memory bandwidth: np.copyto of {copy['bytes'] / MIB:.0f} MiB, best of 5: "
            f"{copy['bytes_per_s'] / 1e9:.1f} GB/s copied (= {copy['bytes_per_s'] / 4e9:.2f}G "
            "uint32 tok/s)"
        )
        order = [b[0] for b in BASELINES] + names
        samples: dict[str, list[dict[str, Any]]] = {n: [] for n in order}
        cached: dict[str, list[float]] = {n: [] for n in order}
        for trial in range(trials):
            for name in order:
                report, frac = _trial(name, workdir, meta, trial == 0)
                samples[name].append(report)
                if frac is not None:
                    cached[name].append(frac)
                print(
                    f"  trial {trial + 1}/{trials} {name:<19} {report['seconds']:7.2f} s",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    total = meta["tokens"]
    rows: dict[str, dict[str, Any]] = {}
    labels = {b[0]: (b[1], b[2], "") for b in BASELINES}
    labels.update({v[0]: (v[1], v[2], v[4]) for v in VARIANTS})
    sizes = {v[0]: meta["bytes"][v[3].split("/")[0]] for v in VARIANTS}
    sizes["bare-read"] = sizes["bare-rw"] = meta["bytes"]["megatron-i32"]
    for name in order:
        secs = [s["seconds"] for s in samples[name]]
        rows[name] = {
            "format": labels[name][0],
            "variant": labels[name][1],
            "layout": labels[name][2],
            "input_bytes": sizes[name],
            "tokens": total,
            "seconds_best": min(secs),
            "seconds_median": median(secs),
            "seconds_all": secs,
            "tokens_per_s": total / min(secs),
            "cached_min": min(cached[name]) if cached[name] else None,
            **{
                k: samples[name][0].get(k)
                for k in ("out_tokens", "kind", "records_ok", "expected_records", "records_found")
            },
            "unexpected_records": samples[name][0].get("unexpected_records"),
        }
    ref = rows[REFERENCE]
    print()
    header = "format variant layout tokens out_tokens input best_s Mtok/s vs_bare median"
    header += " per_trial_(s)"
    print(_fmt_row([h.replace("_", " ") for h in header.split()]))
    for name, r in rows.items():
        r["ratio_vs_bare"] = r["tokens_per_s"] / ref["tokens_per_s"]
        r["ratio_vs_bare_median"] = ref["seconds_median"] / r["seconds_median"]
        r["ratio_vs_memcpy"] = r["tokens_per_s"] * 4 / copy["bytes_per_s"]
        star = "*" if name == REFERENCE else " "
        print(
            _fmt_row(
                [
                    r["format"],
                    r["variant"],
                    r["layout"] or "-",
                    f"{r['tokens']:,}",
                    f"{r['out_tokens']:,}",
                    f"{r['input_bytes'] / MIB:.0f}M",
                    f"{r['seconds_best']:.2f}",
                    f"{r['tokens_per_s'] / 1e6:.1f}",
                    f"{r['ratio_vs_bare']:.3f}x{star}",
                    f"{r['ratio_vs_bare_median']:.3f}x",
                    ", ".join(f"{s:.2f}" for s in r["seconds_all"]),
                ]
            )
        )
    print(
        "(tokens: the corpus's tokens, for every row; input: the format's bytes on disk (MiB);\n"
        " Mtok/s: tokens over the best trial; vs bare: tokens/s over the bare read+write's (*),\n"
        " best trials, then medians; memcpy for scale: "
        f"{copy['bytes_per_s'] / 4e6:,.0f} Mtok/s of uint32 copied, the reference is at "
        f"{ref['ratio_vs_memcpy']:.3f}x of it)"
    )
    low = [n for n in order if cached[n] and min(cached[n]) < 0.99]
    print(
        "page cache: warm; every input read once in 8 MiB reads before each trial, then os.sync; "
        + (
            f"fincore found less than 99% resident for {', '.join(low)}"
            if low
            else "fincore: 100% of every input resident before every trial"
        )
    )
    problems = _check(rows)
    for p in problems:
        print(f"WARNING: {p}")
    load_after = os.getloadavg()
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    if args.json:
        doc = {
            "benchmark": "formats_bench",
            "date": started.isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "corpus": meta,
            "seq_len": SEQ_LEN,
            "batch_size": BATCH_SIZE,
            "trials": trials,
            "memcpy": copy,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "rows": rows,
            "warnings": problems,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if problems else 0


def _check(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Each conversion's records, token count and detected kind."""
    problems = []
    for name, r in rows.items():
        if r["layout"] and not r["records_ok"]:
            problems.append(
                f"{name}: {r['records_found']:,} records written, "
                f"{r['unexpected_records']:,} of them not among the "
                f"{r['expected_records']:,} expected"
            )
        if r["layout"] and r["out_tokens"] != r["records_found"] * SEQ_LEN:
            problems.append(f"{name}: the summary says {r['out_tokens']:,} tokens written")
        kind = VARIANTS[[v[0] for v in VARIANTS].index(name)][1] if r["layout"] else None
        if kind is not None and r["kind"] != kind:
            problems.append(f"{name} was detected as {r['kind']!r}, not {kind!r}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
