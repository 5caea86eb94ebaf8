"""``produce``: tokens/s against the bare tokenizer, peak memory, and a trainer's first batch.

Three measurements of one producer (``zerobatch_core.ingest.produce.produce``, ``producers=1``,
``epochs=1``, ``workers=1``, ``[8, 1024]`` batches) tokenizing a synthetic parquet corpus
(``_common.documents``: Zipf-distributed pseudo-words in sentences and paragraphs, about 2 KB
per document, row groups of 1024 documents) into a fresh local live dataset. Two real BPE
tokenizers, both built here so nothing is downloaded: a byte-level BPE (vocab 8192) trained on
4 MiB of the corpus with Hugging Face ``tokenizers`` (``_common.train_bpe``, spec ``hf:...``),
and the same merges written as a tiktoken rank file with GPT-2's split pattern
(``r50k_base.tiktoken``, spec ``tiktoken:...``), which gives the same token counts.

1. **Tokens/s, producer against the bare tokenizer** (1x corpus, ``--trials`` trials
   interleaved, each run in a fresh child with the corpus and tokenizer files warm in the page
   cache and dirty pages flushed before it; the ratio is taken on the best of the trials, since
   other work on a shared 2-core machine only ever slows a run; medians are printed beside).
   ``bare``: the library call alone on every document already in memory as Python strings
   (read from the parquet file before the clock starts): ``tokenizers.Tokenizer.
   encode_batch_fast`` (what ZeroBatch's wrapper calls, with ``encode_special_tokens`` set as
   the wrapper sets it) or ``tiktoken.Encoding.encode_ordinary_batch`` with the wrapper's
   ``num_threads``; the tokens counted from the ids the library returns. Timed twice per child:
   in batches of ``DEFAULT_BATCH_DOCS`` (256, the producer's batch) and in one call over all
   documents; the faster is the reference. ``produce``: the ``produce(...)`` call with the
   same tokenizer loaded beforehand, from the parquet file to committed batches on disk. Both
   use the libraries' own thread settings (the Rust thread pool of ``tokenizers`` on every
   core; tiktoken's ``num_threads``): the same in both. Target: producer / bare >= 0.85. The
   ratio of tokens per CPU second (process and threads) is printed too: it tells extra work
   from work left unoverlapped.
2. **Peak RSS beyond the tokenizer** at 1x, 4x and 16x the corpus (each a prefix of the next),
   each in a fresh child: the baseline is ``VmRSS`` after importing NumPy, pyarrow, the
   tokenizer library and ZeroBatch, loading the tokenizer and encoding one warm-up batch of 256
   documents; the peak is ``VmHWM`` after ``produce`` (the Hugging Face tokenizer, passed as the
   loaded object so it is not loaded twice). It should stay flat as the corpus grows (reported
   as flat when the rises differ by less than ``FLAT_BYTES``). At every commit the child also
   asks glibc (``mallinfo2``) how much of its heap is in use and how much is free but kept, to
   tell memory the producer holds from memory the allocator has not returned.
3. **Time to a trainer's first batch**: a consumer child launches the producer as a fresh
   process (spec string: interpreter start, imports and tokenizer load count) over the 1x
   corpus into a fresh directory and polls it every 2 ms, opening a ``LiveSource`` once the
   descriptor exists and reading global batch 0 as soon as a version commits it; then it
   follows the dataset to the end, reading every batch. Reported: seconds from the launch to
   the first batch read, with the producer's own stamps (imports done, first commit), and the
   seconds of the whole production (launch to the producer's exit). Median over the trials.

::

    python benchmarks/produce_bench.py                  # 32 MiB corpus, RSS at 32/128/512 MiB
    python benchmarks/produce_bench.py --scale 0.25     # everything 4x smaller
    python benchmarks/produce_bench.py --quick          # 2 MiB, 1 trial: a smoke run (< 1 min)

Exit status 0 when the tokens/s target holds for both tokenizers and memory is flat, 1
otherwise. Generated files live in a temporary directory under ``bench-output/`` (gitignored)
and are removed at the end. The orchestrating process imports only the standard library (see
``_common``); every measurement runs in a child.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# ZeroBatch from this checkout, not an installed copy that may lack its newest modules (entries
# of PYTHONPATH still come first, so a run can point at another revision's tree).
sys.path.insert(
    1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    str(Path(__file__).resolve().parent.parent),
)

from _common import (
    MIB,
    RssSampler,
    documents,
    fit_to_disk,
    median,
    proc_status,
    run_child,
    scratch_dir,
    settle,
    take_bytes,
    train_bpe,
    vm_hwm_bytes,
    warm,
    write_text_corpora,
)

SCRIPT = Path(__file__).resolve()
SEQ_LEN = 1024
BATCH_SIZE = 8
SCALES = (1, 4, 16)
BASE_MB = 32.0
"""Text in the 1x corpus at ``--scale 1`` (MiB)."""
QUICK_MB = 2.0
TRAIN_MB = 4.0
"""Text the BPE is trained on (MiB); 1 MiB with ``--quick``."""
TARGET = 0.85
"""Producer tokens/s over the bare tokenizer's, at least."""
FLAT_BYTES = 16 * MIB
"""Largest difference between the rises above baseline at 1x, 4x and 16x called flat."""
POLL_S = 0.002
TOKENIZERS = ("hf", "tiktoken")
WARMUP_TEXT = "A warm-up document, with words and numbers 1234 in it. " * 36  # ~2 KB


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# --- the tokenizers ---------------------------------------------------------------------------


def _byte_decoder() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted: the byte each character of a byte-level BPE
    token stands for."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = {b: b for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def bpe_to_tiktoken(tokenizer_json: Path, path: Path) -> None:
    """Write the merges of a byte-level BPE ``tokenizer.json`` as a tiktoken rank file.

    Ranks 0-255 are the single bytes, then each merge's token in merge order: with GPT-2's
    split pattern (``r50k_base``, the pattern of ``tokenizers``' ``ByteLevel`` pre-tokenizer)
    tiktoken then applies the same merges, as GPT-2's own rank file does.
    """
    from zerobatch_core.tokenization.tiktoken_files import format_tiktoken_ranks

    decode = _byte_decoder()
    merges = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["merges"]
    ranks = {bytes([b]): b for b in range(256)}
    for merge in merges:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        ranks.setdefault(bytes(decode[c] for c in left + right), len(ranks))
    path.write_text(format_tiktoken_ranks(ranks), encoding="ascii")


def _mallinfo() -> Any:
    """A function returning glibc's heap bytes ``(in use, free but kept)`` for all arenas, or
    ``None`` where ``mallinfo2`` is unavailable (not glibc, or glibc before 2.33)."""
    import ctypes

    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in names.split()]

    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = MallInfo2

    def heap() -> tuple[int, int]:
        m = fn()
        return int(m.uordblks + m.hblkhd), int(m.fordblks)

    return heap


# --- children ---------------------------------------------------------------------------------


def _child_generate(payload: dict[str, Any]) -> dict[str, Any]:
    """Train the BPE, write its tiktoken twin and the corpora (prefixes of one another)."""
    workdir = Path(payload["workdir"])
    hf_spec = train_bpe(take_bytes(documents(), int(payload["train_bytes"])), workdir / "tok.json")
    rank_file = workdir / "r50k_base.tiktoken"  # the stem names the split pattern
    bpe_to_tiktoken(workdir / "tok.json", rank_file)
    paths = [Path(p) for p in payload["paths"]]
    corpora = write_text_corpora(paths, payload["sizes"], "parquet")
    return {
        "specs": {"hf": hf_spec, "tiktoken": f"tiktoken:{rank_file}"},
        "corpora": [{"text_bytes": c.text_bytes, "documents": c.documents} for c in corpora],
    }


def _child_bare(payload: dict[str, Any]) -> dict[str, Any]:
    """The library's batch encode over the documents in memory, in the producer's batches and
    in one call; tokens and seconds of each."""
    import pyarrow.parquet as pq

    from zerobatch_core.tokenization.parallel import DEFAULT_BATCH_DOCS

    texts: list[str] = pq.read_table(payload["corpus"], columns=["text"])["text"].to_pylist()
    if payload["tokenizer"] == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(payload["tokenizer_path"])
        tok.encode_special_tokens = True  # as ZeroBatch's wrapper sets it

        def encode(batch: list[str]) -> int:
            return sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False))

        setting = "tokenizers thread pool (default)"
    else:
        import tiktoken

        from zerobatch_core.tokenization import load_tokenizer
        from zerobatch_core.tokenization.tiktoken_files import (
            TIKTOKEN_STANDARD,
            TiktokenTokenizer,
            read_tiktoken_ranks,
        )

        wrapper = load_tokenizer(payload["spec"])
        assert isinstance(wrapper, TiktokenTokenizer)
        threads = wrapper.num_threads  # the wrapper's setting
        del wrapper
        std = TIKTOKEN_STANDARD["r50k_base"]
        enc = tiktoken.Encoding(
            "bench",
            pat_str=std.pat_str,
            mergeable_ranks=read_tiktoken_ranks(payload["tokenizer_path"]),
            special_tokens=dict(std.special_tokens),
        )

        def encode(batch: list[str]) -> int:
            return sum(len(ids) for ids in enc.encode_ordinary_batch(batch, num_threads=threads))

        setting = f"num_threads={threads}"
    out: dict[str, Any] = {"setting": setting, "documents": len(texts)}
    order = [DEFAULT_BATCH_DOCS, len(texts)]
    if payload["trial"] % 2:
        order.reverse()
    for step in order:
        start, cpu0 = time.perf_counter(), _cpu_seconds()
        tokens = sum(encode(texts[i : i + step]) for i in range(0, len(texts), step))
        key = "all" if step == len(texts) else "batched"
        out[key] = {
            "seconds": time.perf_counter() - start,
            "cpu_s": _cpu_seconds() - cpu0,
            "tokens": tokens,
            "batch": step,
        }
    return out


def _imports(kind: str) -> None:
    """What a producer imports before producing (so the clock or baseline excludes it)."""
    import numpy  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    if kind == "hf":
        import tokenizers  # noqa: F401
    else:
        import tiktoken  # noqa: F401


def _child_produce(payload: dict[str, Any]) -> dict[str, Any]:
    """One ``produce`` call, the tokenizer loaded beforehand."""
    _imports(payload["tokenizer"])
    from zerobatch_core.ingest.produce import produce
    from zerobatch_core.tokenization import load_tokenizer

    tok = load_tokenizer(payload["spec"])
    start, cpu0 = time.perf_counter(), _cpu_seconds()
    summary = produce(
        [payload["corpus"]],
        payload["output"],
        producer_id="bench",
        seq_len=SEQ_LEN,
        batch_size=BATCH_SIZE,
        tokenizer=tok,
        epochs=1,
    )
    return {
        "seconds": time.perf_counter() - start,
        "cpu_s": _cpu_seconds() - cpu0,
        "summary_seconds": summary.seconds,
        "tokens": summary.tokens,
        "documents": summary.documents,
        "committed": summary.committed,
        "commits": summary.commits,
    }


def _child_rss(payload: dict[str, Any]) -> dict[str, Any]:
    """Baseline after imports, tokenizer load and a warm-up batch; peak after ``produce``."""
    with RssSampler() as sampler:
        _imports("hf")
        from zerobatch_core.ingest.produce import DEFAULT_OBJECT_BYTES, produce
        from zerobatch_core.tokenization import load_tokenizer
        from zerobatch_core.tokenization.parallel import DEFAULT_BATCH_DOCS

        tok = load_tokenizer(payload["spec"])
        tok.encode_batch([WARMUP_TEXT] * DEFAULT_BATCH_DOCS)
        heap = _mallinfo()
        seen = {"used": 0, "free": 0}

        def on_commit(progress: Any) -> None:
            if heap is not None:
                used, free = heap()
                seen["used"], seen["free"] = max(seen["used"], used), max(seen["free"], free)

        before = proc_status()
        heap_before = heap() if heap is not None else (0, 0)
        start = time.perf_counter()
        summary = produce(
            [payload["corpus"]],
            payload["output"],
            producer_id="bench",
            seq_len=SEQ_LEN,
            batch_size=BATCH_SIZE,
            tokenizer=tok,
            epochs=1,
            on_commit=on_commit,
        )
        seconds = time.perf_counter() - start
        after = proc_status()
    return {
        "heap_before_used": heap_before[0],
        "heap_max_used_at_commits": seen["used"],
        "heap_max_free_at_commits": seen["free"],
        "baseline_rss": before.get("VmRSS", 0),
        "baseline_hwm": before.get("VmHWM", 0),
        "peak": vm_hwm_bytes(),
        "rss_after": after.get("VmRSS", 0),
        "sampled_peaks": sampler.peaks,
        "seconds": seconds,
        "tokens": summary.tokens,
        "committed": summary.committed,
        "batches_per_object": max(1, DEFAULT_OBJECT_BYTES // (4 * BATCH_SIZE * SEQ_LEN)),
    }


def _child_ttfb_producer(payload: dict[str, Any]) -> dict[str, Any]:
    """The producer the consumer launched: stamps on the shared monotonic clock."""
    _imports("hf")
    from zerobatch_core.ingest.produce import ProduceProgress, produce

    stamps: dict[str, float] = {"imported": time.monotonic()}

    def on_commit(progress: ProduceProgress) -> None:
        stamps.setdefault("first_commit", time.monotonic())

    summary = produce(
        [payload["corpus"]],
        payload["output"],
        producer_id="bench",
        seq_len=SEQ_LEN,
        batch_size=BATCH_SIZE,
        tokenizer=payload["spec"],
        epochs=1,
        on_commit=on_commit,
    )
    stamps["done"] = time.monotonic()
    return {
        "stamps": stamps,
        "seconds": summary.seconds,
        "tokens": summary.tokens,
        "committed": summary.committed,
        "commits": summary.commits,
    }


def _child_ttfb(payload: dict[str, Any]) -> dict[str, Any]:
    """Launch a producer, follow its dataset from the start: when batch 0 was read, and all."""
    import numpy as np

    from zerobatch_core.live.manifests import LiveError
    from zerobatch_core.live.source import LiveSource

    output = payload["output"]
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    child = {**payload, "role": "ttfb-producer"}
    launched = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--child", json.dumps(child)],
        stdout=subprocess.PIPE,
        env=env,
    )
    source = None
    while source is None:
        try:
            source = LiveSource(output)
        except (LiveError, OSError):
            if proc.poll() is not None:
                raise RuntimeError("the producer exited before creating the dataset") from None
            time.sleep(POLL_S)
    opened = time.monotonic()
    while source.committed == 0:
        if not source.refresh():
            time.sleep(POLL_S)
    first = source.read_batch(0)
    checksum = int(first.sum(dtype=np.uint64))  # read every byte of the batch
    first_read = time.monotonic()
    read = 1
    while True:
        exited = proc.poll() is not None
        source.refresh()
        while read < source.committed:
            checksum += int(source.read_batch(read).sum(dtype=np.uint64))
            read += 1
        if exited:
            break
        time.sleep(POLL_S)
    last_read = time.monotonic()
    assert proc.stdout is not None
    report = json.loads(proc.stdout.read().decode().strip().splitlines()[-1])
    proc.wait()
    exit_seen = time.monotonic()
    source.close()
    if proc.returncode != 0:
        raise RuntimeError(f"producer failed with exit code {proc.returncode}")
    stamps = report["stamps"]
    return {
        "imported_s": stamps["imported"] - launched,
        "first_commit_s": stamps["first_commit"] - launched,
        "opened_s": opened - launched,
        "first_batch_s": first_read - launched,
        "producer_done_s": stamps["done"] - launched,
        "last_batch_s": last_read - launched,
        "exit_s": exit_seen - launched,
        "produce_seconds": report["seconds"],
        "committed": report["committed"],
        "commits": report["commits"],
        "tokens": report["tokens"],
        "batches_read": read,
        "checksum": checksum,
    }


CHILDREN = {
    "generate": _child_generate,
    "bare": _child_bare,
    "produce": _child_produce,
    "rss": _child_rss,
    "ttfb": _child_ttfb,
    "ttfb-producer": _child_ttfb_producer,
}


def child(payload: dict[str, Any]) -> None:
    """Run one child role and print its JSON report on stdout."""
    print(json.dumps(CHILDREN[payload["role"]](payload)))


# --- the parent (standard library only) -------------------------------------------------------


def _fresh(path: Path) -> None:
    """Remove a produced dataset and flush, so that its writeback does not land in the next
    measurement."""
    shutil.rmtree(path, ignore_errors=True)
    settle()


def _throughput(
    trials: int, workdir: Path, corpus: Path, specs: dict[str, str]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    files = {"hf": workdir / "tok.json", "tiktoken": workdir / "r50k_base.tiktoken"}
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        k: {"bare": [], "produce": []} for k in TOKENIZERS
    }
    output = workdir / "live-tput"
    for trial in range(trials):
        for kind in TOKENIZERS:
            for role in ("bare", "produce"):
                payload = {
                    "role": role,
                    "tokenizer": kind,
                    "spec": specs[kind],
                    "tokenizer_path": str(files[kind]),
                    "corpus": str(corpus),
                    "output": str(output),
                    "trial": trial,
                }
                warm(corpus)
                warm(files[kind])
                _fresh(output)
                report = run_child(SCRIPT, payload).report
                samples[kind][role].append(report)
                if role == "bare":
                    took = f"{report['batched']['seconds']:.2f} / {report['all']['seconds']:.2f} s"
                else:
                    took = f"{report['seconds']:.2f} s"
                print(f"  trial {trial + 1}/{trials} {kind:<8} {role:<7} {took}", flush=True)
    _fresh(output)
    return samples


def _summarise_throughput(samples: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, roles in samples.items():
        rows: dict[str, Any] = {}
        for key in ("batched", "all"):
            runs = [s[key] for s in roles["bare"]]
            seconds = min(r["seconds"] for r in runs)
            per_call = "one call" if key == "all" else f"{runs[0]['batch']} per call"
            rows[f"bare-{key}"] = {
                "label": f"bare, {per_call}",
                "seconds_all": [r["seconds"] for r in runs],
                "seconds": seconds,
                "seconds_median": median([r["seconds"] for r in runs]),
                "cpu_s": min(r["cpu_s"] for r in runs),
                "tokens": runs[0]["tokens"],
                "tokens_per_s": runs[0]["tokens"] / seconds,
            }
        runs = roles["produce"]
        seconds = min(r["seconds"] for r in runs)
        rows["produce"] = {
            "label": "produce (parquet -> live)",
            "seconds_all": [r["seconds"] for r in runs],
            "seconds": seconds,
            "seconds_median": median([r["seconds"] for r in runs]),
            "cpu_s": min(r["cpu_s"] for r in runs),
            "tokens": runs[0]["tokens"],
            "tokens_per_s": runs[0]["tokens"] / seconds,
            "committed": runs[0]["committed"],
            "commits": runs[0]["commits"],
        }
        ref = max(("bare-batched", "bare-all"), key=lambda k: rows[k]["tokens_per_s"])
        ratio = rows["produce"]["tokens_per_s"] / rows[ref]["tokens_per_s"]
        ratio_median = rows[ref]["seconds_median"] / rows["produce"]["seconds_median"]
        for row in rows.values():
            row["tokens_per_cpu_s"] = row["tokens"] / row["cpu_s"]
        cpu_ratio = rows["produce"]["tokens_per_cpu_s"] / rows[ref]["tokens_per_cpu_s"]
        counts = {r["tokens"] for r in rows.values()}
        out[kind] = {
            "setting": roles["bare"][0]["setting"],
            "rows": rows,
            "reference": ref,
            "ratio": ratio,
            "ratio_median": ratio_median,
            "cpu_ratio": cpu_ratio,
            "same_tokens": len(counts) == 1,
            "pass": ratio >= TARGET,
        }
    return out


def _rss(workdir: Path, corpora: list[Path], spec: str) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    output = workdir / "live-rss"
    for scale, corpus in zip(SCALES, corpora, strict=True):
        warm(corpus)
        _fresh(output)
        payload = {"role": "rss", "spec": spec, "corpus": str(corpus), "output": str(output)}
        res = run_child(SCRIPT, payload)
        r = res.report
        output_bytes = sum(f.stat().st_size for f in output.rglob("*") if f.is_file())
        runs.append(
            {
                "scale": scale,
                "input_bytes": corpus.stat().st_size,
                "output_bytes": output_bytes,
                "tokens": r["tokens"],
                "committed": r["committed"],
                "batches_per_object": r["batches_per_object"],
                "seconds": r["seconds"],
                "baseline_rss_bytes": r["baseline_rss"],
                "peak_bytes": r["peak"],
                "rise_bytes": r["peak"] - r["baseline_rss"],
                "ru_maxrss_bytes": res.maxrss_bytes,
                "sampled_peak_anon_bytes": r["sampled_peaks"].get("RssAnon", 0),
                "sampled_peak_file_bytes": r["sampled_peaks"].get("RssFile", 0),
                "heap_before_used_bytes": r["heap_before_used"],
                "heap_max_used_at_commits_bytes": r["heap_max_used_at_commits"],
                "heap_max_free_at_commits_bytes": r["heap_max_free_at_commits"],
            }
        )
        print(f"  rss {scale}x: {r['seconds']:.2f} s", flush=True)
    _fresh(output)
    rises = [r["rise_bytes"] for r in runs]
    spread = max(rises) - min(rises)
    used = [r["heap_max_used_at_commits_bytes"] for r in runs]
    return {
        "runs": runs,
        "spread_bytes": spread,
        "heap_used_spread_bytes": max(used) - min(used),
        "if_linear_bytes": runs[-1]["output_bytes"] - runs[0]["output_bytes"],
        "flat": spread < FLAT_BYTES,
    }


def _ttfb(trials: int, workdir: Path, corpus: Path, spec: str) -> dict[str, Any]:
    output = workdir / "live-ttfb"
    runs: list[dict[str, Any]] = []
    for trial in range(trials):
        warm(corpus)
        _fresh(output)
        payload = {"role": "ttfb", "spec": spec, "corpus": str(corpus), "output": str(output)}
        r = run_child(SCRIPT, payload).report
        if r["batches_read"] != r["committed"]:
            raise RuntimeError(f"the consumer read {r['batches_read']} of {r['committed']}")
        runs.append(r)
        print(
            f"  trial {trial + 1}/{trials} first batch {r['first_batch_s']:.3f} s, "
            f"production {r['exit_s']:.2f} s",
            flush=True,
        )
    _fresh(output)
    keys = [k for k in runs[0] if k.endswith("_s") or k == "produce_seconds"]
    return {"runs": runs, "median": {k: median([r[k] for r in runs]) for k in keys}}


def _rate(tok_s: float) -> str:
    return f"{tok_s / 1e6:.3f}M"


def _print(
    corpus: dict[str, Any], tput: dict[str, Any], rss: dict[str, Any], ttfb: dict[str, Any]
) -> None:
    print(
        f"\n1. tokens/s, 1x corpus ({corpus['documents']:,} documents, "
        f"{corpus['text_bytes'] / MIB:.1f} MiB text), best of "
        f"{len(next(iter(tput.values()))['rows']['produce']['seconds_all'])} (median beside)"
    )
    print(
        f"{'tokenizer':<9} {'run':<26} {'tokens':>11} {'best s':>7} {'Mtok/s':>7} "
        f"{'vs bare':>8} {'median s':>8} {'vs bare':>7} {'CPU s':>6} {'per CPU-s':>9}  "
        "per trial (s)"
    )
    for kind, res in tput.items():
        reference = res["rows"][res["reference"]]
        for name, row in res["rows"].items():
            mark = "*" if name == res["reference"] else " "
            print(
                f"{kind:<9} {row['label']:<26} {row['tokens']:>11,} {row['seconds']:>7.2f} "
                f"{_rate(row['tokens_per_s']):>7} "
                f"{reference['seconds'] / row['seconds']:>7.2f}x{mark}"
                f"{row['seconds_median']:>8.2f} "
                f"{reference['seconds_median'] / row['seconds_median']:>7.2f}x "
                f"{row['cpu_s']:>6.2f} "
                f"{row['tokens_per_cpu_s'] / reference['tokens_per_cpu_s']:>8.2f}x  "
                + ", ".join(f"{s:.2f}" for s in row["seconds_all"])
            )
    print(
        "(vs bare: tokens per wall second over the reference's, best and median; CPU s: the\n"
        " least CPU time of the process and its threads over the trials; per CPU-s: tokens per\n"
        " CPU second over the reference's. * the reference: the faster bare run. Threads: "
        + "; ".join(f"{k} {r['setting']}" for k, r in tput.items())
        + ", the same in the producer)"
    )
    if not all(r["same_tokens"] for r in tput.values()):
        print("WARNING: the runs of a tokenizer counted different tokens")

    runs = rss["runs"]
    print(
        "\n2. peak RSS of a producer beyond its tokenizer (hf), baseline after imports, "
        "tokenizer load and a warm-up batch"
    )
    print(
        f"{'size':>5} {'text MiB':>9} {'output MiB':>11} {'tokens':>12} {'seconds':>8} "
        f"{'Mtok/s':>7} {'base MiB':>9} {'peak MiB':>9} {'rise MiB':>9} {'anon pk':>8} "
        f"{'file pk':>8} {'heap used':>9} {'heap free':>9}"
    )
    for r in runs:
        print(
            f"{str(r['scale']) + 'x':>5} {r['text_bytes'] / MIB:>9.1f} "
            f"{r['output_bytes'] / MIB:>11.1f} {r['tokens']:>12,} {r['seconds']:>8.2f} "
            f"{_rate(r['tokens'] / r['seconds']):>7} {r['baseline_rss_bytes'] / MIB:>9.1f} "
            f"{r['peak_bytes'] / MIB:>9.1f} {r['rise_bytes'] / MIB:>9.1f} "
            f"{r['sampled_peak_anon_bytes'] / MIB:>8.1f} "
            f"{r['sampled_peak_file_bytes'] / MIB:>8.1f} "
            f"{r['heap_max_used_at_commits_bytes'] / MIB:>9.1f} "
            f"{r['heap_max_free_at_commits_bytes'] / MIB:>9.1f}"
        )
    steady = 2 * runs[0]["batches_per_object"]
    if runs[0]["committed"] < steady:
        print(
            f"WARNING: the 1x corpus makes {runs[0]['committed']} batches: objects grow 1, 2, 4, "
            f"... up to {runs[0]['batches_per_object']} batches, reached after {steady}; a "
            "smaller corpus never reaches the steady state, so its peak is lower"
        )
    print(
        f"(memory that grew with the output would spread by ~{rss['if_linear_bytes'] / MIB:.0f} "
        "MiB; peak = VmHWM, anon/file pk = sampled RssAnon/RssFile peaks; heap used/free:\n"
        f" glibc heap in use / free but kept, largest at any commit; in use before producing "
        f"{runs[0]['heap_before_used_bytes'] / MIB:.1f} MiB)"
    )

    m = ttfb["median"]
    print(f"\n3. time to a trainer's first batch (1x corpus, hf, median of {len(ttfb['runs'])})")
    print(
        f"launch -> producer's imports done {m['imported_s']:.3f} s, "
        f"first commit {m['first_commit_s']:.3f} s, first batch read {m['first_batch_s']:.3f} s"
    )
    print(
        f"launch -> last batch read {m['last_batch_s']:.2f} s, producer exited "
        f"{m['exit_s']:.2f} s (produce() itself {m['produce_seconds']:.2f} s; "
        f"{ttfb['runs'][0]['committed']:,} batches in {ttfb['runs'][0]['commits']} commits, "
        "every one read)"
    )

    print("\nverdicts:")
    for kind, res in tput.items():
        rows = res["rows"]
        print(
            f"  tokens/s {kind}: producer {_rate(rows['produce']['tokens_per_s'])} / bare "
            f"{_rate(rows[res['reference']]['tokens_per_s'])} = {res['ratio']:.2f}x (best), "
            f"target >= {TARGET}x -> {'PASS' if res['pass'] else 'FAIL'} (median "
            f"{res['ratio_median']:.2f}x; per CPU second {res['cpu_ratio']:.2f}x)"
        )
    rises = ", ".join(f"{r['rise_bytes'] / MIB:.1f}" for r in runs)
    print(
        f"  peak RSS above baseline at {'/'.join(f'{s}x' for s in SCALES)}: {rises} MiB, "
        f"spread {rss['spread_bytes'] / MIB:.1f} MiB (flat: < {FLAT_BYTES / MIB:.0f} MiB) -> "
        f"{'FLAT' if rss['flat'] else 'NOT FLAT'}; heap in use at commits spread "
        f"{rss['heap_used_spread_bytes'] / MIB:.1f} MiB"
    )
    share = m["first_batch_s"] / m["exit_s"]
    print(
        f"  first batch {m['first_batch_s']:.2f} s after launch, {share:.1%} of the "
        f"{m['exit_s']:.1f} s production"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the three measurements, print the tables; 0 when both targets
    (tokens/s ratio for every tokenizer, flat memory) are met."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help=f"corpus sizes x this (1x = {BASE_MB:g} MiB)"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run: 1x = {QUICK_MB:g} MiB, 1 trial"
    )
    parser.add_argument("--trials", type=int, help="trials of 1. and 3. (default 3; 1 if quick)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return 0
    trials = args.trials or (1 if args.quick else 3)
    load_before = os.getloadavg()
    print(
        f"ZeroBatch produce benchmark: seq_len {SEQ_LEN}, batch_size {BATCH_SIZE}, 1 producer, "
        f"workers=1; {os.cpu_count()} CPUs; Python {platform.python_version()}; kernel "
        f"{platform.release()}; load average {load_before[0]:.2f}"
    )
    workdir = scratch_dir("produce-bench-")
    try:
        base = (QUICK_MB if args.quick else BASE_MB) * args.scale
        base = fit_to_disk(base, 21 + 2 * 16 * 1.5, workdir, "corpus")  # inputs + 16x output
        paths = [workdir / f"corpus-{s}x.parquet" for s in SCALES]
        sizes = [int(base * MIB) * s for s in SCALES]
        train = (1.0 if args.quick else TRAIN_MB) * MIB
        print(
            f"training a byte-level BPE (vocab 8192) on {train / MIB:g} MiB, writing its "
            f"tiktoken twin and parquet corpora of {', '.join(f'{b / MIB:g}' for b in sizes)} "
            "MiB of text"
        )
        gen = run_child(
            SCRIPT,
            {
                "role": "generate",
                "workdir": str(workdir),
                "train_bytes": int(train),
                "paths": [str(p) for p in paths],
                "sizes": sizes,
            },
        ).report
        specs = gen["specs"]
        print(f"1. tokens/s, {trials} trials")
        samples = _throughput(trials, workdir, paths[0], specs)
        tput = _summarise_throughput(samples)
        print("2. peak RSS")
        rss = _rss(workdir, paths, specs["hf"])
        for r, c in zip(rss["runs"], gen["corpora"], strict=True):
            r["text_bytes"] = c["text_bytes"]
        print(f"3. time to first batch, {trials} trials")
        ttfb = _ttfb(trials, workdir, paths[0], specs["hf"])
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    _print(gen["corpora"][0], tput, rss, ttfb)
    load_after = os.getloadavg()
    parent = vm_hwm_bytes()
    print(
        f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"orchestrator peak RSS {parent / MIB:.1f} MiB"
    )
    ok = all(r["pass"] for r in tput.values()) and rss["flat"]
    if args.json:
        doc = {
            "benchmark": "produce_bench",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "seq_len": SEQ_LEN,
            "batch_size": BATCH_SIZE,
            "trials": trials,
            "corpora": gen["corpora"],
            "throughput": tput,
            "rss": rss,
            "time_to_first_batch": ttfb,
            "pass": ok,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
