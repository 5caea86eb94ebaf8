"""The ``zerobatch conformance`` and ``zerobatch probe`` commands, added to the core's CLI.

The core's command line does not import this package: it finds these commands through the
``zerobatch.commands`` entry point (``pyproject.toml``), so the dependency runs one way only,
from the conformance package to the core.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from .probe import probe
from .runner import DEFAULT_TIMEOUT_S, KINDS, command_answerer, report, run_vectors

EXIT_USAGE = 2


def cmd_conformance(args: argparse.Namespace) -> int:
    impl = args.impl or f"{shlex.quote(sys.executable)} -m zerobatch_conformance.probe {{path}}"
    try:
        answer = command_answerer(impl, timeout_s=args.timeout)
    except ValueError as e:
        print(f"zerobatch conformance: {e}", file=sys.stderr)
        return EXIT_USAGE
    kinds = frozenset(args.only.split(",")) if args.only else None
    unknown = sorted(kinds - set(KINDS)) if kinds else []
    if unknown:
        print(
            f"zerobatch conformance: --only {unknown[0]!r} is not a kind of vector; use "
            f"{', '.join(KINDS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    outcomes = run_vectors(answer, args.vectors, kinds)
    return report(outcomes, as_json=args.json)


def cmd_probe(args: argparse.Namespace) -> int:
    print(json.dumps(probe(args.path)))
    return 0


def register(commands: Any) -> None:
    """Add ``conformance`` and ``probe`` to the ``zerobatch`` subcommands (``commands`` is the
    ``argparse`` sub-parsers object)."""
    p = commands.add_parser(
        "conformance",
        help="run the conformance vectors against an implementation (PROTOCOL.md)",
        description="Run every conformance vector (valid and broken files and datasets, "
        "shuffle-order and key queries) against an implementation of LLMBATCH and report each "
        "check. The "
        "implementation is a command that answers one vector as JSON, as the protocol in "
        "conformance/PROTOCOL.md describes; by default ZeroBatch's own probe answers.\n\n"
        "exit status: 0 every check passed, 1 a check failed, 2 a bad --impl command.",
        epilog="examples:\n"
        "  zerobatch conformance\n"
        "  zerobatch conformance --impl './my_reader {path}' --only file\n"
        "  zerobatch conformance --json > report.json",
    )
    p.add_argument(
        "--impl",
        default=None,
        metavar="CMD",
        help="command run once per vector; {path} is replaced by the vector's path "
        "(default: ZeroBatch's own probe)",
    )
    p.add_argument(
        "--vectors",
        default=None,
        metavar="DIR",
        help="directory of vectors (default: the vectors shipped with ZeroBatch)",
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="KINDS",
        help="comma-separated kinds of vector to run, among file, dataset and query (default: all)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="time allowed to each run of the command (default: %(default)s)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (default: one line per check, then a summary)",
    )
    p.set_defaults(func=cmd_conformance)

    p = commands.add_parser(
        "probe",
        help="answer one conformance vector as JSON (PROTOCOL.md)",
        description="Print ZeroBatch's answer to one conformance vector as JSON, as "
        "conformance/PROTOCOL.md specifies: for a .batch file or a .dataset directory whether "
        "it is valid (with the error code if not) and what it holds; for a .query.json file "
        "the order or value asked for. "
        "This is the command 'zerobatch conformance' runs by default.",
        epilog="example:\n  zerobatch probe conformance/vectors/bad-magic-lowercase.batch",
    )
    p.add_argument(
        "path", metavar="PATH", help="a .batch vector, a .dataset directory or a .query.json file"
    )
    p.set_defaults(func=cmd_probe)
