"""Peak memory of ``convert`` at 1x, 4x and 16x the corpus size, against the documented bound.

``zerobatch_core.ingest.convert.MEMORY_BOUND_BYTES`` bounds how much a conversion's peak RSS may
grow above the interpreter's and the tokenizer's own footprint, whatever the corpus size. This
generates one corpus at three sizes (each a prefix of the next), converts each in a fresh child
process, and takes that child's peak resident set from ``os.wait4`` (``ru_maxrss``). A baseline
child does everything a conversion child does before converting: imports ZeroBatch and NumPy
(for text also pyarrow and ``tokenizers``), loads the tokenizer and encodes one short batch, so
that its lazily built state counts as the tokenizer's own footprint. The bound holds when the
peaks differ by less than it (max - min) and every peak exceeds the baseline by less than it.

Each child also samples its ``RssAnon`` and ``RssFile`` every 5 ms, to tell whether a peak is
heap and buffers or pages of memory-mapped files. The orchestrating process imports only the
standard library and generates nothing itself: on Linux a child's ``ru_maxrss`` starts from the
peak of the parent image it was ``vfork``-ed from, so a heavy parent would hide the child's own
figure (its peak is printed as a check)::

    python benchmarks/ingest_memory.py                      # nanoGPT 32 MiB base + text 8 MiB
    python benchmarks/ingest_memory.py --kind nanogpt --base-mb 64 --json mem.json

Exit status 0 when the bound held for every kind measured, 1 otherwise. Generated files live in
a temporary directory under ``bench-output/`` (gitignored) and are removed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from _common import (
    MIB,
    RssSampler,
    documents,
    fit_to_disk,
    proc_status,
    run_child,
    scratch_dir,
    settle,
    take_bytes,
    train_bpe,
    vm_hwm_bytes,
    write_nanogpt_shards,
    write_text_corpora,
)

SCALES = (1, 4, 16)
SEQ_LEN = 1024
BATCH_SIZE = 8
SCRIPT = Path(__file__).resolve()


# --- children ---------------------------------------------------------------------------------


def _child_generate(payload: dict[str, Any]) -> dict[str, Any]:
    """Write the corpora (and train the tokenizer) that the measurements read."""
    paths = [Path(p) for p in payload["paths"]]
    if payload["kind"] == "nanogpt":
        write_nanogpt_shards(paths, payload["sizes"])
        return {}
    spec = "byte"
    if payload["tokenizer"] == "bpe":
        tok_path = Path(payload["workdir"]) / "tokenizer.json"
        spec = train_bpe(take_bytes(documents(), 4 * MIB), tok_path)
    corpora = write_text_corpora(paths, payload["sizes"], payload["format"])
    return {
        "tokenizer": spec,
        "corpora": [{"text_bytes": c.text_bytes, "documents": c.documents} for c in corpora],
    }


def _child_probe(payload: dict[str, Any]) -> dict[str, Any]:
    """How much of a page-cached file one read through a fresh memory map makes resident.

    Reading one token of each of 8 records 8 MiB apart, the ``RssFile`` growth per read: 4 KiB
    plus the kernel's fault-around (64 KiB by default), or a whole large folio (2 MiB) on
    kernels whose page cache holds the file in large folios.
    """
    import numpy as np

    path = Path(payload["path"])
    with open(path, "wb") as f:
        f.write(np.zeros(64 * MIB // 4, dtype="<u4").tobytes())
    mapped = np.memmap(path, dtype="<u4", mode="r")
    before = proc_status(("RssFile",))["RssFile"]
    reads = 8
    total = sum(int(mapped[i * 2 * MIB]) for i in range(reads))  # word i * 8 MiB
    grown = proc_status(("RssFile",))["RssFile"] - before
    del mapped
    path.unlink()
    return {"bytes_per_read": grown // reads, "checksum": total}


def _child_measure(payload: dict[str, Any]) -> dict[str, Any]:
    """Import, load the tokenizer, then convert (or not, for the baseline)."""
    with RssSampler() as sampler:
        import numpy  # noqa: F401  (part of the footprint either way)

        from zerobatch_core.ingest.convert import MEMORY_BOUND_BYTES, convert

        kind: str = payload["kind"]
        if kind == "text":
            import pyarrow.parquet  # noqa: F401
            import tokenizers  # noqa: F401

            from zerobatch_core.tokenization import load_tokenizer

            tok = load_tokenizer(payload["tokenizer"])
            tok.encode_batch(["A short warm-up document, 1234 tokens or so."] * 8)
            del tok
        report: dict[str, Any] = {"bound_bytes": MEMORY_BOUND_BYTES, "before": proc_status()}
        if payload["role"] == "convert":
            options: dict[str, Any] = {"kind": kind}
            if kind == "text":
                options.update(tokenizer=payload["tokenizer"], workers=payload["workers"])
            summary = convert(
                payload["sources"],
                payload["output"],
                seq_len=SEQ_LEN,
                batch_size=BATCH_SIZE,
                seed=0,
                **options,
            )
            report.update(
                tokens=summary.tokens,
                records=summary.records,
                output_bytes=summary.output_bytes,
                seconds=summary.seconds,
            )
    report["sampled_peaks"] = sampler.peaks
    report["vm_hwm"] = vm_hwm_bytes()
    return report


def child(payload: dict[str, Any]) -> None:
    """Run one child role and print its JSON report on stdout."""
    role = payload["role"]
    if role == "generate":
        report = _child_generate(payload)
    elif role == "probe":
        report = _child_probe(payload)
    else:
        report = _child_measure(payload)
    print(json.dumps(report))


# --- the parent (standard library only) -------------------------------------------------------


def _measure(
    kind: str,
    sources: list[Path],
    workdir: Path,
    options: dict[str, Any],
    notes: list[dict[str, int]] | None = None,
) -> dict[str, Any]:
    """Baseline plus one conversion per scale, each in a fresh child; the kind's results.

    ``options`` go to the children; ``notes`` (per scale) are copied into the result rows.
    """
    common = {"kind": kind, **options}
    settle()
    base = run_child(SCRIPT, {**common, "role": "baseline"})
    baseline = base.maxrss_bytes
    bound = int(base.report["bound_bytes"])
    runs: list[dict[str, Any]] = []
    for i, (scale, path) in enumerate(zip(SCALES, sources, strict=True)):
        output = workdir / f"{kind}-{scale}x.batch"
        settle()
        payload = {**common, "role": "convert", "sources": [str(path)], "output": str(output)}
        res = run_child(SCRIPT, payload)
        output.unlink()
        peaks = res.report["sampled_peaks"]
        runs.append(
            {
                "scale": scale,
                "input_bytes": path.stat().st_size,
                **(notes[i] if notes else {}),
                "output_bytes": res.report["output_bytes"],
                "tokens": res.report["tokens"],
                "seconds": res.report["seconds"],
                "peak_rss_bytes": res.maxrss_bytes,
                "vm_hwm_bytes": res.report["vm_hwm"],
                "above_baseline_bytes": res.maxrss_bytes - baseline,
                "sampled_peak_anon_bytes": peaks.get("RssAnon", 0),
                "sampled_peak_file_bytes": peaks.get("RssFile", 0),
            }
        )
    peaks_all = [r["peak_rss_bytes"] for r in runs]
    spread = max(peaks_all) - min(peaks_all)
    worst_above = max(r["above_baseline_bytes"] for r in runs)
    linear_spread = runs[-1]["output_bytes"] * (SCALES[-1] - SCALES[0]) / SCALES[-1]
    base_peaks = base.report["sampled_peaks"]
    return {
        "baseline_rss_bytes": baseline,
        "baseline_sampled_peak_anon_bytes": base_peaks.get("RssAnon", 0),
        "baseline_sampled_peak_file_bytes": base_peaks.get("RssFile", 0),
        "runs": runs,
        "spread_bytes": spread,
        "max_above_baseline_bytes": worst_above,
        "bound_bytes": bound,
        "spread_if_linear_bytes": int(linear_spread),
        "sensitive": linear_spread > bound,
        "pass": spread < bound and worst_above < bound,
    }


def _nanogpt(base_mb: float, workdir: Path) -> dict[str, Any]:
    base = fit_to_disk(base_mb, 90, workdir, "nanogpt")  # inputs 21x, output+spill 64x
    tokens = [int(base * MIB / 2) * s for s in SCALES]  # uint16 tokens
    paths = [workdir / f"shard-{s}x.bin" for s in SCALES]
    print(f"nanogpt: writing shards of {', '.join(f'{t:,}' for t in tokens)} uint16 tokens")
    gen = {"role": "generate", "kind": "nanogpt", "paths": [str(p) for p in paths]}
    run_child(SCRIPT, {**gen, "sizes": tokens})
    result = _measure("nanogpt", paths, workdir, {})
    for p in paths:
        p.unlink()
    return result


def _text(base_mb: float, workdir: Path, fmt: str, tokenizer: str, workers: int) -> dict[str, Any]:
    base = fit_to_disk(base_mb, 150, workdir, "text")  # inputs ~21x, byte tokens 128x
    paths = [workdir / f"corpus-{s}x.{fmt}" for s in SCALES]
    sizes = [int(base * MIB) * s for s in SCALES]
    what = "training a byte-level BPE (vocab 8192) on 4 MiB, " if tokenizer == "bpe" else ""
    print(f"text: {what}writing {fmt} corpora of {', '.join(f'{b / MIB:g}' for b in sizes)} MiB")
    gen = run_child(
        SCRIPT,
        {
            "role": "generate",
            "kind": "text",
            "paths": [str(p) for p in paths],
            "sizes": sizes,
            "format": fmt,
            "tokenizer": tokenizer,
            "workdir": str(workdir),
        },
    )
    options = {"tokenizer": gen.report["tokenizer"], "workers": workers}
    result = _measure("text", paths, workdir, options, gen.report["corpora"])
    result["tokenizer"] = "byte-level BPE, vocab 8192" if tokenizer == "bpe" else "byte"
    result["format"] = fmt
    result["workers"] = workers
    for p in paths:
        p.unlink()
    return result


def _print(kind: str, res: dict[str, Any]) -> None:
    mib = MIB
    bound = res["bound_bytes"]
    title = kind
    if kind == "text":
        title += f" ({res['format']}, {res['tokenizer']}, workers={res['workers']})"
    print(
        f"\n{title}: baseline peak RSS {res['baseline_rss_bytes'] / mib:.1f} MiB "
        f"(sampled anon {res['baseline_sampled_peak_anon_bytes'] / mib:.1f}, "
        f"file {res['baseline_sampled_peak_file_bytes'] / mib:.1f})"
    )
    print(
        f"{'size':>5} {'input MiB':>10} {'output MiB':>11} {'tokens':>12} {'seconds':>8} "
        f"{'peak RSS MiB':>13} {'above base':>11} {'anon pk':>8} {'file pk':>8}"
    )
    for r in res["runs"]:
        print(
            f"{str(r['scale']) + 'x':>5} {r['input_bytes'] / mib:>10.1f} "
            f"{r['output_bytes'] / mib:>11.1f} {r['tokens']:>12,} {r['seconds']:>8.2f} "
            f"{r['peak_rss_bytes'] / mib:>13.1f} {r['above_baseline_bytes'] / mib:>11.1f} "
            f"{r['sampled_peak_anon_bytes'] / mib:>8.1f} {r['sampled_peak_file_bytes'] / mib:>8.1f}"
        )
    print(
        f"spread of peaks (max - min): {res['spread_bytes'] / mib:.1f} MiB; "
        f"largest rise above baseline: {res['max_above_baseline_bytes'] / mib:.1f} MiB; "
        f"bound {bound / mib:.0f} MiB -> {'PASS' if res['pass'] else 'FAIL'}"
    )
    linear = res["spread_if_linear_bytes"] / mib
    note = "" if res["sensitive"] else "  WARNING: too small to tell; raise the base size"
    print(f"(memory that grew with the records would spread by ~{linear:.0f} MiB){note}")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the measurements, print the tables; 0 if the bound held."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kind", choices=["nanogpt", "text", "both"], default="both")
    parser.add_argument("--base-mb", type=float, default=32.0, help="nanoGPT tokens at 1x (MiB)")
    parser.add_argument("--text-base-mb", type=float, default=8.0, help="text at 1x (MiB)")
    parser.add_argument("--text-format", choices=["parquet", "jsonl"], default="parquet")
    parser.add_argument("--tokenizer", choices=["bpe", "byte"], default="bpe")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes (text)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return 0

    print(
        f"ZeroBatch ingest memory benchmark: seq_len {SEQ_LEN}, batch_size {BATCH_SIZE}; "
        f"{os.cpu_count()} CPUs; Python {platform.python_version()}; kernel {platform.release()}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    workdir = scratch_dir("ingest-memory-")
    results: dict[str, Any] = {}
    try:
        probe = run_child(SCRIPT, {"role": "probe", "path": str(workdir / "probe.bin")})
        per_read = int(probe.report["bytes_per_read"])
        print(
            f"one read through a fresh memory map of a page-cached file made "
            f"{per_read / 1024:.0f} KiB resident (RssFile)"
        )
        if args.kind in ("nanogpt", "both"):
            results["nanogpt"] = _nanogpt(args.base_mb, workdir)
            _print("nanogpt", results["nanogpt"])
        if args.kind in ("text", "both"):
            results["text"] = _text(
                args.text_base_mb, workdir, args.text_format, args.tokenizer, args.workers
            )
            _print("text", results["text"])
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    ok = all(r["pass"] for r in results.values())
    parent_hwm = vm_hwm_bytes()
    lowest = min(r["baseline_rss_bytes"] for r in results.values())
    check = "below" if parent_hwm < lowest else "NOT below (child peaks may be the parent's)"
    print(
        f"\norchestrator peak RSS {parent_hwm / MIB:.1f} MiB, {check} the lowest baseline "
        f"{lowest / MIB:.1f} MiB"
    )
    bound = next(iter(results.values()))["bound_bytes"]
    held = [k for k, r in results.items() if r["pass"]]
    failed = [k for k, r in results.items() if not r["pass"]]
    verdict = "; ".join(
        part
        for part in (
            f"held for {', '.join(held)}" if held else "",
            f"DID NOT hold for {', '.join(failed)}" if failed else "",
        )
        if part
    )
    print(f"MEMORY_BOUND_BYTES = {bound / MIB:.0f} MiB: {verdict}")
    if args.json:
        doc = {
            "benchmark": "ingest_memory",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "load_average_at_end": os.getloadavg(),
            "seq_len": SEQ_LEN,
            "batch_size": BATCH_SIZE,
            "bound_bytes": bound,
            "orchestrator_peak_rss_bytes": parent_hwm,
            "mapped_bytes_per_read": per_read,
            "results": results,
            "pass": ok,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
