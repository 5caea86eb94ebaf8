"""Tokens/s of text conversion against a plain ``tokenizers`` loop on the same corpus.

The corpus is a synthetic parquet file (``_common.documents``); the tokenizer a byte-level BPE
(vocab 8192) trained on 4 MiB of it here, so nothing is downloaded. Variants, each timed in a
fresh child process with the corpus and ``tokenizer.json`` read into the page cache beforehand
and dirty pages flushed (``os.sync``), trials interleaved, median reported:

``plain``        ``pq.read_table`` -> Python strings, ``tok.encode_batch_fast`` in batches of
                 1024, token count only (no ids kept, nothing written): the reference.
``plain-eb``     the same with ``tok.encode_batch`` (also computes offsets and strings).
``plain-256``    the reference loop in batches of 256, ZeroBatch's ``DEFAULT_BATCH_DOCS``.
``pack-w1``      ``TextSource(...).iter_blocks()`` drained: read, tokenize, pack into
                 ``seq_len`` records, no writing (isolates what the writer costs).
``ours-w1``      ``convert(..., workers=1)``: read, tokenize, pack, spill, then write the
                 shuffled LLMBATCH file (fsynced, atomic).
``ours-w2``      the same with ``workers=2`` tokenizer processes.
``byte-w1``      ``convert`` with the built-in byte-level tokenizer, for reference.

With ``workers=1`` (and in the plain loops) the Rust library tokenizes each batch on all cores
itself; worker processes run it single-threaded. Throughput counts document tokens (the ids the
tokenizer produced, BOS excluded) per second of wall time from loading the tokenizer to the
end; the ratio is ours over ``plain`` on text bytes per second, which for the BPE rows equals
the ratio of tokens/s (same corpus, same tokens)::

    python benchmarks/ingest_throughput.py                 # 8 MiB corpus, 3 trials
    python benchmarks/ingest_throughput.py --mb 32 --trials 5 --json tput.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    MIB,
    documents,
    fit_to_disk,
    median,
    run_child,
    scratch_dir,
    settle,
    take_bytes,
    train_bpe,
    warm,
    write_text_corpora,
)

SCRIPT = Path(__file__).resolve()
SEQ_LEN = 1024
BATCH_SIZE = 8
REFERENCE = "plain"

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"role": "plain", "method": "encode_batch_fast", "batch": 1024},
    "plain-eb": {"role": "plain", "method": "encode_batch", "batch": 1024},
    "plain-256": {"role": "plain", "method": "encode_batch_fast", "batch": 256},
    "pack-w1": {"role": "pack", "workers": 1, "tokenizer": "bpe"},
    "ours-w1": {"role": "ours", "workers": 1, "tokenizer": "bpe"},
    "ours-w2": {"role": "ours", "workers": 2, "tokenizer": "bpe"},
    "byte-w1": {"role": "ours", "workers": 1, "tokenizer": "byte"},
}


# --- children ---------------------------------------------------------------------------------


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _child_generate(payload: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(payload["workdir"])
    spec = train_bpe(take_bytes(documents(), 4 * MIB), workdir / "tokenizer.json")
    (corpus,) = write_text_corpora([Path(payload["corpus"])], [payload["bytes"]], "parquet")
    return {"tokenizer": spec, "documents": corpus.documents, "text_bytes": corpus.text_bytes}


def _child_plain(payload: dict[str, Any]) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    start, cpu0 = time.perf_counter(), _cpu_seconds()
    tok = Tokenizer.from_file(payload["tokenizer_path"])
    encode = getattr(tok, payload["method"])
    texts: list[str] = pq.read_table(payload["corpus"], columns=["text"])["text"].to_pylist()
    step = int(payload["batch"])
    tokens = 0
    for i in range(0, len(texts), step):
        tokens += sum(len(e) for e in encode(texts[i : i + step], add_special_tokens=False))
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu0
    return {"seconds": seconds, "cpu_s": cpu, "tokens": tokens}


def _child_pack(payload: dict[str, Any]) -> dict[str, Any]:
    import pyarrow.parquet  # noqa: F401  (imported before the clock starts, as in plain)
    import tokenizers  # noqa: F401

    from zerobatch_core.ingest.text import TextSource

    start, cpu0 = time.perf_counter(), _cpu_seconds()
    src = TextSource([payload["corpus"]], payload["spec"], SEQ_LEN, workers=payload["workers"])
    records = sum(block.shape[0] for block in src.iter_blocks())
    assert src.stats is not None
    return {
        "seconds": time.perf_counter() - start,
        "cpu_s": _cpu_seconds() - cpu0,
        "tokens": src.stats.tokens,
        "records": records,
    }


def _child_ours(payload: dict[str, Any]) -> dict[str, Any]:
    import pyarrow.parquet  # noqa: F401  (imported before the clock starts, as in plain)
    import tokenizers  # noqa: F401

    from zerobatch_core.ingest.convert import convert

    start, cpu0 = time.perf_counter(), _cpu_seconds()
    summary = convert(
        [payload["corpus"]],
        payload["output"],
        seq_len=SEQ_LEN,
        batch_size=BATCH_SIZE,
        kind="text",
        tokenizer=payload["spec"],
        workers=payload["workers"],
    )
    return {
        "seconds": time.perf_counter() - start,
        "cpu_s": _cpu_seconds() - cpu0,
        "tokens": int(summary.packing["tokens"]),
        "written_tokens": summary.tokens,
        "output_bytes": summary.output_bytes,
    }


def child(payload: dict[str, Any]) -> None:
    """Run one child role and print its JSON report on stdout."""
    role = payload["role"]
    if role == "generate":
        report = _child_generate(payload)
    elif role == "plain":
        report = _child_plain(payload)
    elif role == "pack":
        report = _child_pack(payload)
    else:
        report = _child_ours(payload)
    print(json.dumps(report))


# --- the parent -------------------------------------------------------------------------------


def _payload(name: str, workdir: Path, corpus: Path, spec: str) -> dict[str, Any]:
    v = VARIANTS[name]
    payload: dict[str, Any] = {"corpus": str(corpus), **v}
    if v["role"] == "plain":
        payload["tokenizer_path"] = str(workdir / "tokenizer.json")
    else:
        payload["spec"] = spec if v["tokenizer"] == "bpe" else "byte"
        if v["role"] == "ours":
            payload["output"] = str(workdir / f"{name}.batch")
    return payload


def _run(names: list[str], trials: int, workdir: Path, corpus: Path, spec: str) -> Any:
    samples: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for trial in range(trials):
        for name in names:
            payload = _payload(name, workdir, corpus, spec)
            warm(corpus)
            warm(workdir / "tokenizer.json")
            settle()
            res = run_child(SCRIPT, payload)
            if "output" in payload:
                Path(payload["output"]).unlink()
            samples[name].append(res.report)
            print(
                f"  trial {trial + 1}/{trials} {name:<10} {res.report['seconds']:7.2f} s",
                flush=True,
            )
    return samples


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the variants, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, default=8.0, help="MiB of text in the corpus")
    parser.add_argument("--trials", type=int, default=3, help="trials per variant (median)")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated subset of {', '.join(VARIANTS)} (plain is always run)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return 0
    load_before = os.getloadavg()
    names = [REFERENCE] + [n for n in args.variants.split(",") if n and n != REFERENCE]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")

    print(
        f"ZeroBatch ingest throughput benchmark: {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}; seq_len {SEQ_LEN}, batch_size {BATCH_SIZE}; "
        f"load average {load_before[0]:.2f}"
    )
    workdir = scratch_dir("ingest-throughput-")
    try:
        mb = fit_to_disk(args.mb, 12, workdir, "corpus")  # corpus + spill + output (bytes)
        corpus = workdir / "corpus.parquet"
        print(f"training a byte-level BPE (vocab 8192) and writing {mb:g} MiB of text as parquet")
        gen = run_child(
            SCRIPT,
            {
                "role": "generate",
                "workdir": str(workdir),
                "corpus": str(corpus),
                "bytes": int(mb * MIB),
            },
        ).report
        corpus_bytes = corpus.stat().st_size
        print(
            f"corpus: {gen['documents']:,} documents, {gen['text_bytes'] / MIB:.1f} MiB text, "
            f"{corpus_bytes / MIB:.1f} MiB parquet; {args.trials} trials each"
        )
        samples = _run(names, args.trials, workdir, corpus, gen["tokenizer"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    text_bytes = gen["text_bytes"]
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        seconds = median([s["seconds"] for s in samples[name]])
        cpu = median([s["cpu_s"] for s in samples[name]])
        tokens = samples[name][0]["tokens"]
        rows[name] = {
            **VARIANTS[name],
            "seconds_median": seconds,
            "seconds_all": [s["seconds"] for s in samples[name]],
            "cpu_s_median": cpu,
            "cpu_s_all": [s["cpu_s"] for s in samples[name]],
            "tokens": tokens,
            "tokens_per_s": tokens / seconds,
            "text_mb_per_s": text_bytes / seconds / 1e6,
            "text_mb_per_cpu_s": text_bytes / cpu / 1e6,
        }
    ref = rows[REFERENCE]
    print(
        f"\n{'variant':<10} {'tokens':>11} {'median s':>9} {'Mtok/s':>7} {'text MB/s':>9} "
        f"{'vs plain':>8} {'CPU s':>7} {'MB/CPU-s':>8} {'vs plain':>8}"
    )
    for name, r in rows.items():
        r["ratio_vs_plain"] = r["text_mb_per_s"] / ref["text_mb_per_s"]
        r["cpu_ratio_vs_plain"] = r["text_mb_per_cpu_s"] / ref["text_mb_per_cpu_s"]
        print(
            f"{name:<10} {r['tokens']:>11,} {r['seconds_median']:>9.2f} "
            f"{r['tokens_per_s'] / 1e6:>7.3f} {r['text_mb_per_s']:>9.2f} "
            f"{r['ratio_vs_plain']:>7.2f}x {r['cpu_s_median']:>7.2f} "
            f"{r['text_mb_per_cpu_s']:>8.2f} {r['cpu_ratio_vs_plain']:>7.2f}x"
        )
    print(
        "(vs plain: text bytes per wall second, then per CPU second, over plain's; for the BPE\n"
        " rows the same as the tokens/s ratio. CPU s counts the child and its worker processes.)"
    )
    bpe_counts = {r["tokens"] for n, r in rows.items() if n != "byte-w1"}
    if len(bpe_counts) != 1:
        print(f"WARNING: BPE variants counted different tokens: {sorted(bpe_counts)}")
    load_after = os.getloadavg()
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    for name in ("ours-w1", "ours-w2"):
        if name in rows:
            r = rows[name]
            print(
                f"{name} / plain: {r['ratio_vs_plain']:.2f}x tokens/s "
                f"({r['tokens_per_s'] / 1e6:.3f}M vs {ref['tokens_per_s'] / 1e6:.3f}M), "
                f"{r['cpu_ratio_vs_plain']:.2f}x tokens per CPU second"
            )
    if args.json:
        doc = {
            "benchmark": "ingest_throughput",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "corpus": {
                "documents": gen["documents"],
                "text_bytes": text_bytes,
                "parquet_bytes": corpus_bytes,
            },
            "seq_len": SEQ_LEN,
            "batch_size": BATCH_SIZE,
            "trials": args.trials,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "variants": rows,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
