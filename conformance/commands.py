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
from .runner import DEFAULT_TIMEOUT_S, command_answerer, report, run_vectors

EXIT_USAGE = 2


def cmd_conformance(args: argparse.Namespace) -> int:
    impl = args.impl or f"{shlex.quote(sys.executable)} -m zerobatch_conformance.probe {{path}}"
    try:
        answer = command_answerer(impl, timeout_s=args.timeout)
    except ValueError as e:
        print(f"zerobatch conformance: {e}", file=sys.stderr)
        return EXIT_USAGE
    kinds = frozenset(args.only.split(",")) if args.only else None
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
        description="Run every conformance vector against an implementation and report each "
        "check; exit 0 when all pass, 1 otherwise.",
    )
    p.add_argument(
        "--impl",
        default=None,
        help="command to run per vector, with a {path} placeholder "
        "(default: ZeroBatch's own probe)",
    )
    p.add_argument(
        "--vectors", default=None, help="vector directory (default: the shipped vectors)"
    )
    p.add_argument("--only", default=None, help="comma-separated kinds to run: file,query")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds allowed per invocation (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_conformance)

    p = commands.add_parser(
        "probe",
        help="answer one conformance vector as JSON (PROTOCOL.md)",
        description="Print ZeroBatch's answer to one conformance vector as JSON.",
    )
    p.add_argument("path", help="a .batch vector or a .query.json file")
    p.set_defaults(func=cmd_probe)
