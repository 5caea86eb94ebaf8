"""The ``zerobatch`` parser and the running of a command: ``build_parser`` assembles the top-level
options, each command group's parsers (its module's ``register``) and the plugged-in commands;
``main`` runs the parsed command with its output scrubbed of secrets and turns any error into
one line and an exit status (the package docstring).

Kept apart from the commands so that the exit-status and redaction rules live in one place,
and a command module holds only what its commands do.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, TextIO, cast

from zerobatch_spec import HEADER_SIZE, TOKEN_DTYPE

from ..errors import MissingDependencyError, ZeroBatchError
from ..redaction import remember, scrub
from ..version import __version__
from . import dataset_actions, demo, inspect_validate, plan, produce, trace, write_convert
from .common import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_MISSING_DEPENDENCY,
    EXIT_USAGE,
    UsageError,
)
from .flags import Flag, Parser, flag_message, option_flags, table

DESCRIPTION = (
    "ZeroBatch reads, writes and checks LLMBATCH files: pre-tokenized LLM training data stored "
    f"as page-aligned [batch_size, seq_len] {TOKEN_DTYPE.name} batches behind a {HEADER_SIZE}-byte "
    "header, read by a training loop with no per-sample work. A dataset is a directory of "
    "such files with a manifest; every command that reads a file reads a dataset too.\n\n"
    "Run 'zerobatch COMMAND --help' for a command's options and examples."
)

EPILOG = (
    "examples:\n"
    "  zerobatch convert 'data/*.bin' train.batch --seq-len 1024 --batch-size 32\n"
    "  zerobatch validate train.batch --deep\n"
    "  zerobatch inspect train.batch\n"
    "  zerobatch convert 'data/*.bin' data/train --seq-len 1024 --batch-size 32 "
    "--shard-size 1000\n"
    "  zerobatch trace data/train --step 1200 --rank 3 --of 8\n\n"
    f"exit status:\n{table(EXIT_CODES)}\n\n"
    "Errors are one line on stderr; --debug, before or after the command, adds the Python "
    "traceback."
)

COMMAND_PLUGINS = "zerobatch.commands"
"""Entry-point group of packages that add subcommands (``zerobatch_conformance`` adds
``conformance`` and ``probe``): the core finds them by name and never imports them itself."""


def _command_plugins() -> list[Callable[[Any], None]]:
    """The ``register(subparsers)`` functions of the installed command plugins."""
    found = []
    for entry in sorted(entry_points(group=COMMAND_PLUGINS), key=lambda e: e.name):
        try:
            found.append(entry.load())
        except ImportError as e:  # a broken plugin must not take the core's commands down
            print(f"zerobatch: command plugin {entry.name!r} not loaded: {e}", file=sys.stderr)
    return found


def _finish_commands(sub: Any) -> None:
    """Give every command (and every action of a command with actions) ``--debug`` and the
    flag names its API errors are translated to."""
    for command in sub.choices.values():
        if "--debug" not in command._option_string_actions:
            command.add_argument(
                "--debug",
                action="store_true",
                default=argparse.SUPPRESS,  # keeps a --debug given before the command
                help="on an error, also print the Python traceback",
            )
        command.set_defaults(option_flags=option_flags(command))
        if command._subparsers is not None:
            for action in command._subparsers._group_actions:
                if isinstance(action, argparse._SubParsersAction):
                    _finish_commands(action)


def build_parser() -> argparse.ArgumentParser:
    """The ``zerobatch`` parser: the core's commands and those of installed plugins."""
    parser = Parser(prog="zerobatch", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"zerobatch {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="on an error, also print the Python traceback"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")

    for group in (inspect_validate, write_convert, produce, dataset_actions, trace, plan):
        group.register(sub)
    for register in _command_plugins():  # zerobatch conformance, zerobatch probe, ...
        register(sub)
    demo.register(sub)

    _finish_commands(sub)
    return parser


# --- running a command --------------------------------------------------------------------------


def _os_message(e: OSError) -> str:
    """An ``OSError`` as ``path: reason``."""
    text = e.strerror or str(e)
    if e.filename is not None and not text.startswith(os.fspath(e.filename)):
        text = f"{os.fspath(e.filename)}: {text}"
    return text


def _classify(e: Exception, flags: Mapping[str, Flag]) -> tuple[int, str]:
    """The exit status for ``e`` and the one-line message that explains it."""
    if isinstance(e, MissingDependencyError):
        return EXIT_MISSING_DEPENDENCY, str(e)
    if isinstance(e, UsageError):
        return EXIT_USAGE, str(e)
    if isinstance(e, OSError):
        return EXIT_USAGE, _os_message(e)
    if isinstance(e, ZeroBatchError):
        message, named_flag = flag_message(str(e), flags)
        return (EXIT_USAGE if named_flag else EXIT_INVALID), message
    return EXIT_INTERNAL, f"internal error: {type(e).__name__}: {e}"


class _ScrubbedStream:
    """A text stream that passes every write through ``redaction.scrub`` (the package docstring).

    Everything else (``isatty``, ``flush``, ``encoding``, ...) is the wrapped stream's.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zerobatch`` with ``argv`` (default: ``sys.argv[1:]``) and return the exit status.

    While the command runs, stdout and stderr are scrubbed of the secrets of every URL in
    ``argv`` and of URL user information (the package docstring).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    for argument in arguments:
        remember(os.fspath(argument))
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, _ScrubbedStream(stdout))
    sys.stderr = cast(TextIO, _ScrubbedStream(stderr))
    try:
        return _run(arguments)
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _run(argv: Sequence[str]) -> int:
    """``main`` after its streams are scrubbed: parse, run, and classify any error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = " ".join(["zerobatch", args.command, *filter(None, [getattr(args, "action", None)])])
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        status, message = _classify(e, getattr(args, "option_flags", {}))
        if args.debug:
            traceback.print_exc()
        elif status == EXIT_INTERNAL:
            message += "; run with --debug for the traceback"
        print(f"{prog}: error: {scrub(' '.join(message.split()))}", file=sys.stderr)
        return status
    return status
