"""Mutation testing of the modules in tests/mutation/config.toml with Cosmic Ray.

Usage (from the repository root, in an environment with the ``mutation`` extra)::

    python tests/mutation/run.py                       # every module, resuming earlier sessions
    python tests/mutation/run.py spec/layout.py        # one module
    python tests/mutation/run.py --jobs 2              # two modules at a time
    python tests/mutation/run.py --fresh               # discard earlier sessions
    python tests/mutation/run.py --survivors           # after adding tests: rerun survivors only
    python tests/mutation/run.py --report              # only print the figures of the sessions

Why it is built this way:

- Mutants are applied to a private copy of the working tree (``build/mutation/trees/<module>``),
  never to the checkout itself, so a run (or a killed run) cannot leave a mutated file where
  other work happens. The copy is imported through ``PYTHONPATH`` with the packages under their
  import names (``zerobatch_spec`` is ``spec/``, as in pyproject.toml's package-dir), which puts
  it ahead of any installed or editable copy of ZeroBatch.
- Each module runs only the tests that exercise it, with ``pytest -x``: a mutant is killed by
  its first failing test. The tests that execute the mutated line run first (a coverage map
  of the module, built once per session: ``write_coverage_map``, ``select_tests.py``), then,
  if they pass, the rest, so that a survivor has passed every listed test. Hypothesis replays
  fixed examples (``HYPOTHESIS_PROFILE=ci``), so a verdict does not depend
  on the examples a run happened to draw.
- Sessions are Cosmic Ray's SQLite files under ``build/mutation/sessions``: an interrupted run
  resumes where it stopped. A session is discarded when the module, its tests or this
  configuration change, since its mutants no longer describe the code.
- The score of a module is killed / all mutants run. Survivors that cannot be killed are listed
  in ``tests/mutation/equivalent.toml`` with the reason; they still count as not killed. The run
  fails when a module scores below the threshold or a survivor is not listed there.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONFIG = HERE / "config.toml"
EQUIVALENT = HERE / "equivalent.toml"
SKIP_FILES = {".git", ".venv", "build", "bench-output", "demo-output"}


@dataclass
class Mutant:
    """One mutant of a session: where, which operator, and how it ended."""

    module: str
    line: int
    col: int
    operator: str
    args: dict[str, Any]
    code: str
    outcome: str  # killed, survived, incompetent, pending
    mutant: str = ""  # the mutated line, from the session's diff (once the mutant has run)
    reason: str = ""  # why a survivor is equivalent, from equivalent.toml


@dataclass
class ModuleResult:
    """The mutants of one module and its score."""

    module: str
    mutants: list[Mutant] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(m.outcome == outcome for m in self.mutants)

    @property
    def score(self) -> float:
        return self.count("killed") / len(self.mutants) if self.mutants else 1.0


def load_config() -> dict[str, Any]:
    with CONFIG.open("rb") as f:
        return tomllib.load(f)


def session_key(module: str) -> str:
    return module.replace("/", "_").removesuffix(".py")


def package_aliases() -> dict[str, str]:
    """Top-level packages whose import name differs from their directory (pyproject.toml)."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: path for name, path in dirs.items() if "." not in name and name != path}


def project_files() -> list[str]:
    """Tracked and untracked, not ignored, files of the working tree."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [p for p in out.split("\0") if p and p.split("/")[0] not in SKIP_FILES]


def make_tree(tree: Path) -> None:
    """A fresh copy of the working tree, its packages importable under their import names."""
    if tree.exists():
        shutil.rmtree(tree)
    for rel in project_files():
        src = ROOT / rel
        if src.is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / rel)
    for name, path in package_aliases().items():
        (tree / name).symlink_to(path, target_is_directory=True)


def digest(paths: list[str], *extra: object) -> str:
    h = hashlib.sha256()
    for rel in paths:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes())
    h.update(json.dumps(extra).encode())
    return h.hexdigest()


def fingerprint(module: str, tests: list[str], cfg: dict[str, Any]) -> dict[str, str]:
    """What a session depends on: its mutants (the module, the operator set) and its verdicts
    (the tests and the settings they run with)."""
    return {
        "mutants": digest([module], cfg["exclude-operators"]),
        "tests": digest(
            [*tests, "tests/conftest.py", "tests/helpers.py"],
            tests,
            cfg["timeout_factor"],
            cfg["min_timeout"],
        ),
    }


def reset_results(db_path: Path, outcomes: set[str]) -> int:
    """Send back to pending the mutants whose verdict is one of ``outcomes`` (Cosmic Ray runs
    every mutant without a result)."""
    names = {"killed": "KILLED", "survived": "SURVIVED", "incompetent": "INCOMPETENT"}
    wanted = [names[o] for o in outcomes if o in names]
    with sqlite3.connect(db_path) as db:
        cur = db.execute(
            "DELETE FROM work_results WHERE worker_outcome != 'SKIPPED' AND "
            f"(test_outcome IS NULL OR test_outcome IN ({', '.join('?' * len(wanted))}))",
            wanted,
        )
        return cur.rowcount


def pytest_command(tests: list[str]) -> list[str]:
    return [
        sys.executable,
        *("-m", "pytest", "-x", "-q", "--no-header", "-p", "no:cacheprovider"),
        *tests,
    ]


def child_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env["HYPOTHESIS_PROFILE"] = "ci"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("ZEROBATCH_REQUIRE_FRAMEWORKS", None)
    return env


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(line, column) spans of the type annotations in ``source``, columns in characters."""
    lines = source.splitlines()

    def pos(line: int, byte_col: int) -> tuple[int, int]:
        return line, len(lines[line - 1].encode()[:byte_col].decode(errors="replace"))

    spans = []
    for node in ast.walk(ast.parse(source)):
        notes: list[ast.expr | None] = []
        if isinstance(node, ast.arg):
            notes.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            notes.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        for note in notes:
            if note is not None and note.end_lineno is not None and note.end_col_offset is not None:
                spans.append(
                    (pos(note.lineno, note.col_offset), pos(note.end_lineno, note.end_col_offset))
                )
    return spans


def filter_session(db_path: Path, tree: Path, module: str, exclude: list[str]) -> int:
    """Mark as skipped the mutants of excluded operators and those inside type annotations."""
    excluded = [re.compile(e) for e in exclude]
    spans = annotation_spans((tree / module).read_text())
    skipped = 0
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            m = item.mutations[0]
            why = None
            if any(e.match(m.operator_name) for e in excluded):
                why = "operator not in the configured set"
            elif any(a <= tuple(m.start_pos) and tuple(m.end_pos) <= b for a, b in spans):
                why = "inside a type annotation (never evaluated)"
            if why is not None:
                db.set_result(item.job_id, WorkResult(WorkerOutcome.SKIPPED, output=why))
                skipped += 1
    return skipped


def write_coverage_map(
    path: Path, tree: Path, module: str, tests: list[str], stamp: dict[str, str]
) -> None:
    """Which tests execute each line of ``module``: one run of its tests under coverage, each
    test's lines recorded under its node id (coverage_contexts.py). Written as
    ``{"stamp": ..., "lines": {line: [node ids, in the order of the test list]}}``."""
    import coverage

    data_file = path.with_suffix(".data")
    data_file.unlink(missing_ok=True)
    names = [
        module,
        *(
            name + module[len(p) :]
            for name, p in package_aliases().items()
            if module.startswith(p + "/")
        ),
    ]
    env = child_env(tree)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "tests" / "mutation")])
    subprocess.run(
        [
            sys.executable,
            "-m",
            "coverage",
            "run",
            f"--data-file={data_file}",
            f"--include={','.join(str(tree / n) for n in names)}",
            "-m",
            "pytest",
            "-q",
            "--no-header",
            "-p",
            "no:cacheprovider",
            "-p",
            "coverage_contexts",
            *tests,
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        check=False,
    )
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    target = os.path.realpath(tree / module)
    lines: dict[int, set[str]] = {}
    for measured in data.measured_files():
        if os.path.realpath(measured) == target:
            for line, contexts in data.contexts_by_lineno(measured).items():
                lines.setdefault(line, set()).update(contexts)
    rank = {t: i for i, t in enumerate(tests)}

    def order(nodeid: str) -> tuple[int, str]:
        return rank.get(nodeid.split("::")[0], len(tests)), nodeid

    path.write_text(
        json.dumps(
            {
                "stamp": stamp,
                "lines": {str(n): sorted(c, key=order) for n, c in sorted(lines.items())},
            }
        )
    )
    data_file.unlink(missing_ok=True)


def run_module(
    module: str, tests: list[str], cfg: dict[str, Any], work: Path, fresh: bool, survivors: bool
) -> str:
    """Run (or resume) the session of one module; return a one-line summary."""
    key = session_key(module)
    tree = work / "trees" / key
    sessions = work / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    db, stamp, cr_cfg = (sessions / f"{key}{ext}" for ext in (".sqlite", ".fingerprint", ".toml"))
    log = (work / "logs" / f"{key}.log").resolve()
    log.parent.mkdir(parents=True, exist_ok=True)

    make_tree(tree)
    env = child_env(tree)
    start = time.monotonic()
    base = subprocess.run(pytest_command(tests), cwd=tree, env=env, capture_output=True, text=True)
    baseline = time.monotonic() - start
    if base.returncode != 0:
        raise SystemExit(f"{module}: the tests fail without a mutant:\n{base.stdout[-3000:]}")
    timeout = max(cfg["min_timeout"], cfg["timeout_factor"] * baseline)

    stamp_now = fingerprint(module, tests, cfg)
    stamp_old = json.loads(stamp.read_text()) if stamp.exists() else {}
    pristine, coverage_map = sessions / f"{key}.py.orig", sessions / f"{key}.coverage.json"
    shutil.copyfile(tree / module, pristine)
    if not coverage_map.exists() or json.loads(coverage_map.read_text()).get("stamp") != stamp_now:
        write_coverage_map(coverage_map, tree, module, tests, stamp_now)
    select = [sys.executable, str(HERE / "select_tests.py"), module, str(pristine)]
    cr_cfg.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {timeout:.1f}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(shlex.join([*select, str(coverage_map), '--', *tests]))}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )
    if fresh or stamp_old.get("mutants") != stamp_now["mutants"]:
        db.unlink(missing_ok=True)
    cosmic_ray = [sys.executable, "-m", "cosmic_ray.cli"]
    with log.open("a") as out:
        if not db.exists():
            subprocess.run(
                [*cosmic_ray, "init", str(cr_cfg), str(db)], cwd=tree, env=env, check=True
            )
            skipped = filter_session(db, tree, module, cfg["exclude-operators"])
            out.write(f"{module}: {skipped} mutants outside the configured set\n")
        elif stamp_old.get("tests") != stamp_now["tests"]:
            # The tests changed, so the verdicts may have: every mutant runs again, or with
            # --survivors only those not killed (enough when tests were only added).
            again = {"survived", "incompetent"}
            if not survivors:
                again.add("killed")
            out.write(f"{module}: tests changed, {reset_results(db, again)} mutants run again\n")
        stamp.write_text(json.dumps(stamp_now))
        out.write(f"{module}: baseline {baseline:.1f}s, timeout {timeout:.0f}s\n")
        out.flush()
        subprocess.run(
            [*cosmic_ray, "exec", str(cr_cfg), str(db)],
            cwd=tree,
            env=env,
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    result = read_session(module, db, ROOT / module)
    summary = (
        f"{module}: {result.count('killed')}/{len(result.mutants)} killed "
        f"({result.score:.1%}), {result.count('survived')} survived, "
        f"{result.count('pending')} pending, in {time.monotonic() - start:.0f}s"
    )
    with log.open("a") as out:
        out.write(summary + "\n")
    return summary


def read_session(module: str, db_path: Path, source: Path) -> ModuleResult:
    """The mutants of a session that were run or are still to run (skipped ones left out)."""
    lines = source.read_text().splitlines()
    result = ModuleResult(module)
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        results = dict(db.results)
        for item in db.work_items:
            m = item.mutations[0]
            r = results.get(item.job_id)
            if r is not None and r.worker_outcome == "skipped":
                continue
            if r is None:
                outcome = "pending"
            elif r.test_outcome is None:
                outcome = "incompetent"
            else:
                outcome = str(r.test_outcome.value)
            line, col = m.start_pos
            result.mutants.append(
                Mutant(
                    module,
                    line,
                    col,
                    m.operator_name.removeprefix("core/"),
                    dict(m.operator_args),
                    lines[line - 1].strip(),
                    outcome,
                    mutated_line(r.diff if r is not None else None),
                )
            )
    result.mutants.sort(key=lambda m: (m.line, m.col, m.operator, m.mutant))
    return result


def mutated_line(diff: str | None) -> str:
    """The first added line of a mutant's diff, stripped (empty without a diff)."""
    for line in (diff or "").splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def load_equivalent() -> list[dict[str, Any]]:
    with EQUIVALENT.open("rb") as f:
        return list(tomllib.load(f).get("mutant", []))


def matches(entry: dict[str, Any], m: Mutant) -> bool:
    """An equivalent.toml entry names a mutant by module, operator, the line's code and, where
    one line has several mutants of one operator, the mutated line."""
    return (
        entry["module"] == m.module
        and entry["operator"] == m.operator
        and entry["code"] == m.code
        and entry.get("mutant", m.mutant) == m.mutant
    )


def explain(results: list[ModuleResult]) -> list[dict[str, Any]]:
    """Attach the reasons of equivalent.toml to survivors; return the entries that match none."""
    entries = load_equivalent()
    used = [False] * len(entries)
    for res in results:
        for m in res.mutants:
            if m.outcome != "survived":
                continue
            for i, e in enumerate(entries):
                if matches(e, m):
                    m.reason, used[i] = e["reason"], True
                    break
    modules = {r.module for r in results}
    return [e for e, u in zip(entries, used, strict=True) if not u and e["module"] in modules]


def report(results: list[ModuleResult], threshold: float) -> tuple[str, bool]:
    """A markdown report of the scores and survivors, and whether the run passes."""
    stale = explain(results)
    ok = not stale
    rows = [
        "| module | mutants | killed | survived (equivalent) | score |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    total = killed = 0
    for r in results:
        n, k = len(r.mutants), r.count("killed")
        total, killed = total + n, killed + k
        eq = sum(m.outcome == "survived" and bool(m.reason) for m in r.mutants)
        rows.append(f"| {r.module} | {n} | {k} | {r.count('survived')} ({eq}) | {r.score:.1%} |")
        ok = ok and r.score >= threshold and r.count("pending") == 0
    rows.append(f"| **all** | {total} | {killed} | | {killed / max(total, 1):.1%} |")
    lines = [*rows, ""]
    for r in results:
        for m in r.mutants:
            if m.outcome == "killed":
                continue
            where = (
                f"{m.module}:{m.line}:{m.col} {m.operator} {json.dumps(m.args) if m.args else ''}"
            )
            change = f"    `{m.code}`\n    `{m.mutant}`" if m.mutant else f"    `{m.code}`"
            if m.outcome == "survived" and m.reason:
                lines.append(f"- equivalent {where}\n{change}\n    {m.reason}")
            else:
                ok = False
                lines.append(f"- {m.outcome.upper()} {where}\n{change}")
    for e in stale:
        lines.append(f"- equivalent.toml entry matches no survivor: {e['module']} `{e['code']}`")
    return "\n".join(lines), ok


def sessions_of(modules: list[str], work: Path) -> Iterator[ModuleResult]:
    for module in modules:
        key = session_key(module)
        db = work / "sessions" / f"{key}.sqlite"
        if db.exists():
            yield read_session(module, db, ROOT / module)


def main(argv: list[str] | None = None) -> int:
    cfg = load_config()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: all configured)")
    parser.add_argument("--jobs", type=int, default=1, help="modules run at the same time")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "mutation")
    parser.add_argument("--fresh", action="store_true", help="discard earlier sessions")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="when a module's tests changed, run again only its mutants not yet killed",
    )
    parser.add_argument("--report", action="store_true", help="only report existing sessions")
    args = parser.parse_args(argv)
    modules = args.modules or list(cfg["modules"])
    unknown = [m for m in modules if m not in cfg["modules"]]
    if unknown:
        parser.error(f"not configured in {CONFIG.relative_to(ROOT)}: {', '.join(unknown)}")
    work = args.work.resolve()
    # A mutant can turn a probe into a real signal (os.kill(pid, 0) -> os.kill(pid, 1), sent to
    # the test's parent): the run and its test processes ignore hangups so that it goes on.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    if not args.report:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            runs = [
                pool.submit(
                    run_module,
                    *(m, cfg["modules"][m]["tests"], cfg, work, args.fresh, args.survivors),
                )
                for m in modules
            ]
            for run in runs:
                print(run.result(), flush=True)

    results = list(sessions_of(modules, work))
    if not results:
        print(f"no mutation session under {work}: run without --report first")
        return 1
    text, ok = report(results, cfg["threshold"])
    (work / "report.md").parent.mkdir(parents=True, exist_ok=True)
    (work / "report.md").write_text(text + "\n")
    print(text)
    print(f"\nreport: {work / 'report.md'}; {'pass' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
