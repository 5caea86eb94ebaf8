"""Shared helpers for the ingestion benchmarks: corpora, a BPE tokenizer, child processes.

Everything here is deterministic (fixed seeds) and offline: the text corpus is synthetic
(pseudo-words with a Zipf-like frequency, arranged in sentences and documents), the tokenizer
is a byte-level BPE trained on that corpus, and the nanoGPT shards hold random uint16 tokens.
Each benchmark measurement runs in a fresh child process (``run_child``) so that no thread,
allocator arena or import left by an earlier measurement skews a later one, and the child's
peak resident set comes back through ``os.wait4``.

The orchestrating parent must stay small: Linux carries the peak RSS of the memory image a
process replaces at ``execve`` into its ``ru_maxrss``, and ``subprocess`` starts children with
``vfork``, whose image before ``execve`` is the parent's. A child started by a parent that once
held 160 MiB reports at least 160 MiB. So this module imports only the standard library at the
top (NumPy and the rest inside the functions that need them), and the benchmarks generate
corpora and train tokenizers in children too.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

REPO = Path(__file__).resolve().parent.parent
BENCH_OUTPUT = REPO / "bench-output"
"""Scratch space for generated corpora and outputs (gitignored)."""

MIB = 2**20
BOS = "<|bos|>"

# --- scratch space ----------------------------------------------------------------------------


def scratch_dir(prefix: str) -> Path:
    """A fresh directory under ``bench-output/`` (the caller removes it with ``shutil``)."""
    BENCH_OUTPUT.mkdir(exist_ok=True)
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir=BENCH_OUTPUT))


def free_bytes(path: Path) -> int:
    """Free space on the file system holding ``path``."""
    return shutil.disk_usage(path).free


def fit_to_disk(base_mib: float, need_per_base_mib: float, path: Path, what: str) -> float:
    """``base_mib`` halved until ``need_per_base_mib * base`` MiB fits in 80% of the free space."""
    free_mib = free_bytes(path) / MIB
    base = base_mib
    while base * need_per_base_mib > 0.8 * free_mib and base > 0.25:
        base /= 2
    if base != base_mib:
        warnings.warn(
            f"{what}: only {free_mib:,.0f} MiB free under {path}; base size scaled down from "
            f"{base_mib:g} MiB to {base:g} MiB",
            stacklevel=2,
        )
    return base


# --- page cache -------------------------------------------------------------------------------


def warm(path: Path, chunk: int = 8 * MIB) -> None:
    """Read ``path`` once in large reads so that it sits in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(chunk):
            pass


def settle() -> None:
    """Flush dirty pages so that one measurement's writeback does not land in the next."""
    os.sync()


# --- text corpus ------------------------------------------------------------------------------

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st"]
_ONSETS += ["br", "ch", "cl", "dr", "gr", "pl", "pr", "sh", "sp", "th", "tr", "wh"]
_VOWELS = ["a", "e", "i", "o", "u", "ea", "ou", "ai", "ie", "oo", "y"]
_CODAS = ["", "", "n", "r", "s", "t", "d", "l", "m", "ng", "st", "ck", "nd", "rt", "ss"]


def _vocabulary(rng: np.random.Generator, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        syllables = int(rng.choice([1, 1, 2, 2, 2, 3, 3, 4]))
        word = "".join(
            _ONSETS[rng.integers(len(_ONSETS))]
            + _VOWELS[rng.integers(len(_VOWELS))]
            + _CODAS[rng.integers(len(_CODAS))]
            for _ in range(syllables)
        )
        words.add(word)
    return sorted(words, key=lambda w: (len(w), w))  # short words get the high frequencies


def _sentences(seed: int, count: int = 40_000, vocab: int = 20_000) -> list[str]:
    """A pool of sentences: Zipf-distributed pseudo-words, capitalised, with punctuation."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = _vocabulary(rng, vocab)
    weights = 1.0 / (np.arange(vocab) + 2.7) ** 1.07
    cdf = np.cumsum(weights / weights.sum())
    lengths = rng.integers(4, 28, size=count)
    picks = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), vocab - 1)
    commas = rng.random(int(lengths.sum())) < 0.06
    enders = [".", ".", ".", ".", "?", "!", ";"]
    out: list[str] = []
    pos = 0
    for n in lengths.tolist():
        parts = [
            words[i] + ("," if c else "")
            for i, c in zip(picks[pos : pos + n], commas[pos : pos + n], strict=True)
        ]
        parts[-1] = parts[-1].rstrip(",") + enders[pos % len(enders)]
        if pos % 11 == 0:
            parts.insert(int(rng.integers(n)), str(int(rng.integers(1, 3000))))
        out.append(" ".join(parts).capitalize())
        pos += n
    return out


def documents(seed: int = 1234) -> Iterator[str]:
    """An endless, deterministic stream of documents (about 2 KB each on average)."""
    import numpy as np

    pool = _sentences(seed)
    rng = np.random.default_rng(seed + 1)
    while True:
        counts = np.clip(rng.lognormal(3.0, 0.8, size=4096).astype(np.int64), 1, 400)
        picks = rng.integers(len(pool), size=int(counts.sum()))
        pos = 0
        for k in counts.tolist():
            sentences = [pool[i] for i in picks[pos : pos + k]]
            pos += k
            # Paragraph breaks every few sentences, as in real documents.
            yield "\n\n".join(" ".join(sentences[j : j + 5]) for j in range(0, k, 5))


@dataclass
class TextCorpus:
    """One generated text corpus file."""

    path: Path
    documents: int
    text_bytes: int

    @property
    def file_bytes(self) -> int:
        """Size of the file on disk."""
        return self.path.stat().st_size


def write_text_corpora(
    paths: Sequence[Path], text_bytes: Sequence[int], fmt: str, seed: int = 1234
) -> list[TextCorpus]:
    """Write prefixes of one document stream: ``paths[i]`` gets about ``text_bytes[i]`` bytes.

    Every corpus is a prefix of the largest one (the same documents in the same order).
    ``fmt`` is ``parquet`` (row groups of 1024 documents, about 2 MiB of text each, as a
    streaming writer would produce) or ``jsonl``.
    """
    writers = [_TextWriter(p, fmt) for p in paths]
    counts = [0] * len(paths)
    sizes = [0] * len(paths)
    open_ = set(range(len(paths)))
    for doc in documents(seed):
        n = len(doc.encode("utf-8"))
        for i in sorted(open_):
            writers[i].add(doc)
            counts[i] += 1
            sizes[i] += n
            if sizes[i] >= text_bytes[i]:
                writers[i].close()
                open_.discard(i)
        if not open_:
            break
    return [TextCorpus(p, c, s) for p, c, s in zip(paths, counts, sizes, strict=True)]


class _TextWriter:
    ROWS = 1024

    def __init__(self, path: Path, fmt: str) -> None:
        self.path, self.fmt = path, fmt
        self.pending: list[str] = []
        self.pq_writer: Any = None
        self.file: Any = None
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            self.pa = pa
            self.pq_writer = pq.ParquetWriter(path, pa.schema([("text", pa.string())]))
        elif fmt == "jsonl":
            self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115
        else:
            raise ValueError(f"unknown text format {fmt!r}")

    def add(self, doc: str) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"text": doc}) + "\n")
            return
        self.pending.append(doc)
        if len(self.pending) == self.ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            table = self.pa.table({"text": self.pa.array(self.pending, self.pa.string())})
            self.pq_writer.write_table(table, row_group_size=self.ROWS)
            self.pending = []

    def close(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
        else:
            self._flush()
            self.pq_writer.close()
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def train_bpe(texts: Iterator[str], path: Path, vocab_size: int = 8192) -> str:
    """Train a byte-level BPE on ``texts``, save it as ``tokenizer.json``; return its hf spec."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return f"hf:{path}?bos={BOS}"


def take_bytes(docs: Iterator[str], limit: int) -> Iterator[str]:
    """Documents from ``docs`` until about ``limit`` bytes of text have been produced."""
    total = 0
    for doc in docs:
        yield doc
        total += len(doc)
        if total >= limit:
            return


# --- nanoGPT shards ---------------------------------------------------------------------------

NANOGPT_MAGIC = 20240520  # legacy fineweb.py shards: uint16 tokens


def write_nanogpt_shards(
    paths: Sequence[Path], num_tokens: Sequence[int], seed: int = 99, vocab: int = 50_257
) -> None:
    """Write legacy nanoGPT ``.bin`` shards; each is a prefix of the largest one's tokens."""
    import numpy as np

    handles = []
    for p, n in zip(paths, num_tokens, strict=True):
        header = np.zeros(256, dtype="<i4")
        header[:3] = (NANOGPT_MAGIC, 1, n)
        f = open(p, "wb")  # noqa: SIM115
        f.write(header.tobytes())
        handles.append(f)
    rng = np.random.default_rng(seed)
    step = 4 * MIB
    for start in range(0, max(num_tokens), step):
        chunk = rng.integers(0, vocab, size=min(step, max(num_tokens) - start), dtype=np.uint16)
        for f, n in zip(handles, num_tokens, strict=True):
            if start < n:
                f.write(chunk[: n - start].astype("<u2").tobytes())
    for f in handles:
        f.flush()
        os.fsync(f.fileno())
        f.close()


# --- child processes --------------------------------------------------------------------------


@dataclass
class ChildResult:
    """What a child measurement returned."""

    report: dict[str, Any]
    wall_s: float
    maxrss_bytes: int


def run_child(script: Path, payload: dict[str, Any]) -> ChildResult:
    """Run ``script --child JSON`` in a fresh interpreter; its JSON report and peak RSS.

    The peak resident set is the child's ``ru_maxrss`` as ``os.wait4`` reports it (on Linux
    the maximum over the child and any children it waited for), in bytes.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(script), "--child", json.dumps(payload)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    if proc.returncode != 0:
        raise RuntimeError(f"child {payload} failed with exit code {proc.returncode}")
    lines = out.decode().strip().splitlines()
    return ChildResult(json.loads(lines[-1]), wall, int(usage.ru_maxrss) * 1024)


def vm_hwm_bytes() -> int:
    """This process's peak resident set so far (``VmHWM``), in bytes; 0 if unknown."""
    return proc_status(("VmHWM",)).get("VmHWM", 0)


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return float(statistics.median(values))


def proc_status(keys: Sequence[str] = ("VmRSS", "RssAnon", "RssFile", "VmHWM")) -> dict[str, int]:
    """Fields of ``/proc/self/status`` given in kB, as bytes (empty where unavailable)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in keys:
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


class RssSampler:
    """Poll this process's ``RssAnon`` and ``RssFile`` every ``interval_s`` and keep the peaks.

    The kernel keeps a high-water mark only for the total (``VmHWM``); sampling tells which
    part a peak was made of: anonymous memory (heap, buffers) or pages of mapped files.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            for key, value in proc_status(("RssAnon", "RssFile")).items():
                self.peaks[key] = max(self.peaks.get(key, 0), value)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
