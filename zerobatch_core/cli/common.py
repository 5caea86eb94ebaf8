"""What several commands share: the exit statuses, ``UsageError``, the checks of the paths a
command is given, the argument types of its options and the progress display.

Kept apart from the command modules so that every command reports a missing file, a bad
number or an existing output in the same words, with the same exit status.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from zerobatch_spec import U32_MAX, U64_MAX
from zerobatch_spec.dataset import MANIFEST_NAME

from ..errors import WriteError
from ..redaction import redact
from ..stores.store import is_url
from .flags import flag_message

if TYPE_CHECKING:
    from ..ingest.convert import Progress

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_MISSING_DEPENDENCY = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success (validate: the file or dataset is valid)"),
    (EXIT_INVALID, "an invalid file, input data that cannot be converted, or a failed check"),
    (
        EXIT_USAGE,
        "a usage error: bad or conflicting options, a path that cannot be read or written, an "
        "output that exists (see --overwrite) or that would hold no batch (see --allow-empty)",
    ),
    (EXIT_MISSING_DEPENDENCY, "an optional dependency is missing; the message names the extra"),
    (EXIT_INTERNAL, "an internal error (a bug in ZeroBatch): run with --debug for the traceback"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)
"""Every exit status of ``zerobatch`` and what it means, in the order ``--help`` prints them."""


class UsageError(Exception):
    """The command cannot run as given (a path, an option value); exits ``EXIT_USAGE``."""


def plural(n: int, word: str, plural: str | None = None) -> str:
    """``"1 batch"``, ``"2 batches"``: ``n`` and the word in the right number."""
    many = plural or (word + "es" if word.endswith(("s", "sh", "ch", "x")) else word + "s")
    return f"{n:,} {word if n == 1 else many}"


# --- paths --------------------------------------------------------------------------------------


def shown(path: str) -> str:
    """``path`` as messages and reports show it: a URL without user information or query
    (``redaction.redact``), anything else as given."""
    return redact(path) if is_url(path) else path


def check_readable(path: str) -> None:
    """A ``UsageError`` unless ``path`` is a regular file this process can read."""
    if not os.path.exists(path):
        raise UsageError(f"{shown(path)}: no such file")
    if not os.path.isfile(path):
        raise UsageError(f"{shown(path)}: not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise UsageError(f"{shown(path)}: cannot be read: {e.strerror or e}") from e


def readable_inputs(patterns: Sequence[str], *, datasets: bool = False) -> list[str]:
    """The files named by ``patterns`` (paths or quoted glob patterns), each one checked to be a
    readable regular file; a ``UsageError`` names the first that is not. With ``datasets``,
    a directory (a Hugging Face, MDS or Atlas dataset) and a Megatron prefix (``PREFIX`` with
    ``PREFIX.idx`` beside it) are inputs too; the converter checks what they hold."""
    found: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern) and not os.path.exists(pattern):
            matches = sorted(
                p for p in glob.glob(pattern) if os.path.isfile(p) or (datasets and _dataset(p))
            )
            if not matches:
                raise UsageError(f"{shown(pattern)}: no file matches this pattern")
            found.extend(matches)
            continue
        if datasets and _dataset(pattern):
            found.append(pattern)
            continue
        check_readable(pattern)
        found.append(pattern)
    return found


def _dataset(path: str) -> bool:
    """A directory, or a Megatron prefix (its ``.idx`` exists)."""
    return os.path.isdir(path) or (not os.path.exists(path) and os.path.isfile(path + ".idx"))


def check_output_argument(args: argparse.Namespace, inputs: Sequence[str]) -> None:
    """The writers' own checks of ``args.output`` (``writer.check_output``: not a directory, in
    an existing directory, not one of ``inputs``, not an existing file unless ``--overwrite``;
    with ``--shard-size``, ``datasets.build.check_dataset_output``), made before anything is
    read, and reported as usage errors. A URL is refused: the writers write local paths, and
    ``https://host/x`` would become a local directory named ``https:``."""
    from ..datasets.build import check_dataset_output
    from ..files.writer import check_output

    if is_url(args.output):  # it would be written as a local path named "https:/..."
        raise UsageError(
            f"{shown(args.output)}: {args.command} writes local files and directories, not "
            "URLs; write locally, then copy the file or directory to the object store"
        )
    try:
        if args.shard_batches is None:
            check_output(args.output, overwrite=args.overwrite, inputs=inputs)
        else:
            check_dataset_output(args.output, overwrite=args.overwrite, inputs=inputs)
    except WriteError as e:
        raise UsageError(flag_message(str(e), args.option_flags)[0]) from e


def dataset_directory(path: str) -> None:
    """A ``UsageError`` unless the directory ``path`` holds a manifest (a regular file)."""
    manifest = os.path.join(path, MANIFEST_NAME)
    if os.path.lexists(manifest) and not os.path.isfile(manifest):
        raise UsageError(f"{manifest}: not a regular file; a dataset's manifest is a file")
    if not os.path.isfile(manifest):
        raise UsageError(
            f"{path}: a directory but not a dataset (it has no {MANIFEST_NAME}); describe the "
            f"LLMBATCH files in it with: zerobatch dataset create {path}"
        )


# --- argument types -----------------------------------------------------------------------------


def add_manifest_version(p: argparse.ArgumentParser) -> None:
    """``--manifest-version`` of the commands that write datasets."""
    p.add_argument(
        "--manifest-version",
        type=int,
        choices=[1, 2],
        default=1,
        help="the dataset's manifest version: 1 lists every shard in manifest.json; 2 lists "
        "them in a shard index (shards.zbi) that a reader reads a page at a time, so that "
        "opening costs the same for 100,000 shards as for ten (readers before version 2 "
        "refuse it) (default: 1)",
    )


def add_shard_prefixes(p: argparse.ArgumentParser) -> None:
    """``--shard-prefixes`` of the commands that write shards."""
    p.add_argument(
        "--shard-prefixes",
        dest="prefixes",
        type=positive,
        default=1,
        metavar="P",
        help="spread the shards' names over P key prefixes (shard i is named with i mod P in "
        "hexadecimal in front: 3-shard-00003.batch), recorded in the manifest, so that a job "
        "reading the dataset from an object store divides its request rate among P prefixes "
        "(stores limit requests per prefix); needs --manifest-version 2 (default: 1, no "
        "prefix)",
    )


def positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= v <= U32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, 2**32 - 1], got {v}")
    return v


def count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v <= U64_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64 - 1], got {v}")
    return v


def u64(text: str) -> int:
    try:
        return count(str(int(text, 0)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def u32(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v <= U32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**32 - 1], got {v}")
    return v


# --- progress -----------------------------------------------------------------------------------


class ProgressDisplay:
    """The progress display, drawn only on a terminal: a log file gets no carriage returns."""

    def __init__(self, args: argparse.Namespace, seq_len: int, stream: TextIO) -> None:
        from ..ingest.convert import progress_bar

        show = not (args.quiet or args.json) and stream.isatty()
        self.stream = stream
        self.progress: Progress | None = progress_bar(seq_len, stream) if show else None

    def __enter__(self) -> Progress | None:
        return self.progress

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:  # end the progress line, before any error message
            print(file=self.stream)


def report_invalid(
    command: str, path: str, error: Mapping[str, object], message: object, as_json: bool
) -> int:
    """A source that ``command`` could not open because it breaks the format: with ``--json``
    one object ``{"path", "valid": false, "error"}`` on stdout, the message on stderr always;
    returns the exit status for an invalid source."""
    if as_json:
        print(json.dumps({"path": path, "valid": False, "error": dict(error)}))
    print(f"zerobatch {command}: {message}", file=sys.stderr)
    return EXIT_INVALID


def print_table(info: Mapping[str, object]) -> None:
    """``key  value`` lines, keys padded to one width, floats to 4 decimals."""
    width = max(len(k) for k in info)
    for k, v in info.items():
        print(f"{k:<{width}}  {f'{v:.4f}' if isinstance(v, float) else v}")
