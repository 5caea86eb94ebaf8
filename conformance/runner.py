"""Run the conformance vectors against any implementation through ``PROTOCOL.md``'s contract.

The implementation is a command line with a ``{path}`` placeholder. For each vector the runner
substitutes the vector's input path, runs the command (no shell), parses the one JSON object it
prints, and compares it with the vector's expected answer. Valid-file vectors also pin block
orders: for each, the runner writes a ``.query.json`` and asks the implementation for it.
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
            return f"expected error {expected['error']}, implementation accepted the file"
        if got.get("error") != expected["error"]:
            return f"expected error {expected['error']}, got {got.get('error')}"
        return ""
    if got.get("valid") is not True:
        return f"expected a valid file, got error {got.get('error')}"
    for key in ("header", "padded_batch_bytes", "batch_sha256"):
        if got.get(key) != expected[key]:
            return f"{key} differs: expected {expected[key]!r:.200}, got {got.get(key)!r:.200}"
    return ""


def run_vectors(
    answer: Answer, directory: str | None = None, kinds: frozenset[str] | None = None
) -> list[Outcome]:
    """Check every vector in ``directory`` (default: the shipped vectors)."""
    directory = directory or default_directory()
    with open(os.path.join(directory, "index.json"), encoding="utf-8") as f:
        index = json.load(f)["vectors"]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in index:
            kind = "query" if entry["input"].endswith(".query.json") else "file"
            if kinds is not None and kind not in kinds:
                continue
            with open(
                os.path.join(directory, entry["id"] + ".expected.json"), encoding="utf-8"
            ) as f:
                expected = json.load(f)["expected"]
            checks = [(entry["id"], os.path.join(directory, entry["input"]), expected)]
            if expected.get("valid") and (kinds is None or "query" in kinds):
                num_batches = expected["header"]["num_batches"]
                for case in expected["block_orders"]:
                    qid = f"{entry['id']}/order-b{case['block_size']}-e{case['epoch']}"
                    qpath = os.path.join(tmp, qid.replace("/", "--") + ".query.json")
                    with open(qpath, "w", encoding="utf-8") as q:
                        json.dump(
                            {
                                "op": "block_order",
                                "num_batches": num_batches,
                                "block_size": case["block_size"],
                                "seed": case["seed"],
                                "epoch": case["epoch"],
                            },
                            q,
                        )
                    checks.append((qid, qpath, {"result": case["order"]}))
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
