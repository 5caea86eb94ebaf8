"""Run the conformance vectors against any implementation through ``PROTOCOL.md``'s contract.

The implementation is a command line with a ``{path}`` placeholder. For each vector the runner
substitutes the vector's input path, runs the command (no shell), parses the one JSON object it
prints, and compares it with the vector's expected answer. Valid-file vectors also pin block
orders and valid-dataset vectors dataset orders: for each, the runner writes a ``.query.json``
and asks the implementation for it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .generate import default_directory

DEFAULT_TIMEOUT_S = 120.0

KINDS = ("file", "dataset", "query", "live")
"""Kinds of vector, by input name: ``*.batch`` files, ``*.dataset`` directories, queries,
``*.live`` live-dataset manifests."""

DATASET_KEYS = (
    "batch_size",
    "seq_len",
    "dtype",
    "seed",
    "num_batches",
    "shard_batches",
    "manifest_sha256",
    "batch_sha256",
)
"""What a valid dataset's answer must state exactly (``PROTOCOL.md``)."""

LIVE_KEYS = ("version", "batches", "start", "segments", "entries", "producers")
"""What a valid live manifest's answer must state exactly (``PROTOCOL.md``)."""


def vector_kind(input_name: str) -> str:
    """``file``, ``dataset``, ``query`` or ``live``, from a vector's input name."""
    if input_name.endswith(".query.json"):
        return "query"
    if input_name.endswith(".dataset"):
        return "dataset"
    if input_name.endswith(".live"):
        return "live"
    return "file"


@dataclass(frozen=True)
class Outcome:
    """Result of one check: vector id (with a suffix for derived queries), pass/fail, reason."""

    id: str
    passed: bool
    reason: str = ""


Answer = Callable[[str], dict[str, Any]]


def command_answerer(template: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Answer:
    """An answerer that runs ``template`` with ``{path}`` replaced, per the protocol."""
    if "{path}" not in template:
        raise ValueError("--impl command must contain the {path} placeholder")
    parts = shlex.split(template)

    def run(path: str) -> dict[str, Any]:
        argv = [p.replace("{path}", path) for p in parts]
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"exit status {proc.returncode}: {proc.stderr.strip()[-500:]}")
        out = json.loads(proc.stdout)
        if not isinstance(out, dict):
            raise RuntimeError(f"expected a JSON object, got {proc.stdout[:200]!r}")
        return out

    return run


def _compare(expected: dict[str, Any], got: dict[str, Any]) -> str:
    """Empty string if ``got`` answers ``expected``, else what differs."""
    if got.get("unsupported"):
        return "implementation answered unsupported"
    if "result" in expected:
        if "result" not in got:
            return f"expected a result, got error {got.get('error')}"
        return "" if got["result"] == expected["result"] else "result differs"
    if "valid" not in expected:  # a query that must be refused (invalid_query, unreadable_path)
        if got.get("error") != expected["error"]:
            return f"expected error {expected['error']}, got {got.get('error') or 'a result'}"
        return ""
    if expected["valid"] is False:
        if got.get("valid") is not False:
            return f"expected error {expected['error']}, implementation accepted the input"
        if got.get("error") != expected["error"]:
            return f"expected error {expected['error']}, got {got.get('error')}"
        for key in ("where", "slot"):  # a dataset's failure names its field or shard, and slot
            if key in expected and got.get(key) != expected[key]:
                return (
                    f"error {expected['error']}: expected {key} {expected[key]!r}, "
                    f"got {got.get(key)!r:.200}"
                )
        return ""
    if got.get("valid") is not True:
        return f"expected a valid input, got error {got.get('error')}"
    file_keys = ("header", "padded_batch_bytes", "batch_sha256")
    keys = DATASET_KEYS if "shard_batches" in expected else file_keys
    for key in LIVE_KEYS if "entries" in expected else keys:
        if got.get(key) != expected[key]:
            return f"{key} differs: expected {expected[key]!r:.200}, got {got.get(key)!r:.200}"
    return ""


def derived_queries(
    vid: str, expected: dict[str, Any]
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """The orders a valid file or dataset vector pins, as ``(check id, query, expected)``."""
    out: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    if "entries" in expected:  # a live manifest pins no order of its own
        return out
    if "shard_batches" in expected:
        for case in expected["dataset_orders"]:
            suffix = "" if case["shuffle"] else "-unshuffled"
            qid = f"{vid}/order-b{case['block_size']}-s{case['seed']}-e{case['epoch']}{suffix}"
            query = {
                "op": "dataset_order",
                "shard_batches": expected["shard_batches"],
                **{k: case[k] for k in ("block_size", "seed", "epoch", "shuffle")},
            }
            out.append((qid, query, {"result": case["order"]}))
        return out
    for case in expected["block_orders"]:
        qid = f"{vid}/order-b{case['block_size']}-e{case['epoch']}"
        query = {
            "op": "block_order",
            "num_batches": expected["header"]["num_batches"],
            "block_size": case["block_size"],
            "seed": case["seed"],
            "epoch": case["epoch"],
        }
        out.append((qid, query, {"result": case["order"]}))
    return out


def run_vectors(
    answer: Answer, directory: str | None = None, kinds: frozenset[str] | None = None
) -> list[Outcome]:
    """Check every vector in ``directory`` (default: the shipped vectors), or those of
    ``kinds`` (among ``KINDS``); the orders a valid vector pins count as queries."""
    directory = directory or default_directory()
    with open(os.path.join(directory, "index.json"), encoding="utf-8") as f:
        index = json.load(f)["vectors"]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in index:
            if kinds is not None and vector_kind(entry["input"]) not in kinds:
                continue
            with open(
                os.path.join(directory, entry["id"] + ".expected.json"), encoding="utf-8"
            ) as f:
                expected = json.load(f)["expected"]
            checks = [(entry["id"], os.path.join(directory, entry["input"]), expected)]
            if expected.get("valid") and (kinds is None or "query" in kinds):
                for qid, query, want in derived_queries(entry["id"], expected):
                    qpath = os.path.join(tmp, qid.replace("/", "--") + ".query.json")
                    with open(qpath, "w", encoding="utf-8") as q:
                        json.dump(query, q)
                    checks.append((qid, qpath, want))
            for vid, path, exp in checks:
                try:
                    reason = _compare(exp, answer(path))
                except Exception as e:  # an implementation failure is this vector's failure
                    reason = f"{type(e).__name__}: {e}"
                outcomes.append(Outcome(vid, not reason, reason))
    return outcomes


def report(outcomes: list[Outcome], stream: Any = None, as_json: bool = False) -> int:
    """Print one line per check and a summary; return the exit status (0 all passed)."""
    stream = stream or sys.stdout
    failed = [o for o in outcomes if not o.passed]
    if as_json:
        json.dump(
            {
                "passed": len(outcomes) - len(failed),
                "failed": len(failed),
                "results": [o.__dict__ for o in outcomes],
            },
            stream,
            indent=1,
        )
        stream.write("\n")
    else:
        for o in outcomes:
            stream.write(
                f"{'PASS' if o.passed else 'FAIL'} {o.id}{'' if o.passed else ': ' + o.reason}\n"
            )
        stream.write(f"conformance: {len(outcomes) - len(failed)} passed, {len(failed)} failed\n")
    return 1 if failed or not outcomes else 0
