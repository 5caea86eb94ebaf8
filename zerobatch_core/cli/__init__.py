"""The ``zerobatch`` command line: inspect, validate, write, convert, dataset, trace, demo, and
plugged-in commands. Every command that reads an LLMBATCH file also reads a dataset directory.

Every command ends with one of the exit statuses in ``EXIT_CODES`` (printed by
``zerobatch --help`` and listed in the README). Errors are one line on stderr, never a traceback,
unless ``--debug`` is given:

- ZeroBatch errors raised by the API are worded for the command line: Python parameter names
  (``pad_id``, ``mode='pad'``) become the flags that set them (``--pad-id``, ``--mode pad``), see
  ``flag_message``. Such an error, one that names a flag of the command, is a usage error; the
  others are about the data (an invalid file, a token out of range) and exit 1.
- ``OSError`` (a missing or unreadable path, a full disk) is a usage error naming the path.
- ``MissingDependencyError`` (an optional library not installed) exits 3 with the install command.
- Anything else is a bug: one line, exit 70 (``EX_SOFTWARE`` of ``sysexits.h``), and ``--debug``
  shows the traceback.

Nothing the command line prints carries credentials: ``main`` remembers the secrets of every URL
in its arguments and, while a command runs, passes everything written to stdout and stderr
(messages, reports, JSON, progress lines, ``--debug`` tracebacks) through
``redaction.scrub``, which drops URL user information and replaces those secrets.

The modules, one per command group, each with its ``cmd_*`` functions and a ``register(sub)``
that adds its parsers:

- ``inspect_validate``: ``inspect`` and ``validate`` of local files and dataset directories;
  ``inspect_validate_remote``: the same commands for URLs and live datasets.
- ``write_convert``: ``write`` and ``convert``, the commands that write LLMBATCH files.
- ``dataset_actions``: ``dataset create`` and ``dataset reclaim``.
- ``trace``: ``trace``; ``demo``: ``demo``.
- ``common``: what several commands share: exit statuses, ``UsageError``, path checks,
  argument types, the progress display.
- ``flags``: the help formatting (``Parser``, ``HelpFormatter``) and ``flag_message``.
- ``main``: ``build_parser`` (top-level options, each group's ``register`` in the order
  ``--help`` lists the commands, plugins) and ``main``, which runs a command under the rules above.

``conformance`` and ``probe`` are not here: ``zerobatch_conformance`` adds them through the
``COMMAND_PLUGINS`` entry point. Modules are named after their commands, never with a name the
core already uses for something else: ``dataset_actions`` is not the core's ``dataset``, nor
``inspect_validate_remote`` its ``remote``; ``common.check_output_argument`` wraps, and so is
not named like, ``writer.check_output``. A helper that one module uses has a leading underscore;
one that several use is a public name of its module, imported by that name, and is not
re-exported here. Everything users, tests and plugins import from ``zerobatch_core.cli`` is
re-exported here, so the ``zerobatch = "zerobatch_core.cli:main"`` script and those imports do
not change when a module does.
"""

from __future__ import annotations

from .common import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_MISSING_DEPENDENCY,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
)
from .flags import Flag, HelpFormatter, Parser, flag_message
from .inspect_validate import DTYPE_NAMES
from .main import COMMAND_PLUGINS, build_parser, main

__all__ = [
    "COMMAND_PLUGINS",
    "DTYPE_NAMES",
    "EXIT_CODES",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_MISSING_DEPENDENCY",
    "EXIT_OK",
    "EXIT_USAGE",
    "Flag",
    "HelpFormatter",
    "Parser",
    "UsageError",
    "build_parser",
    "flag_message",
    "main",
]
