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
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TextIO, cast

import numpy as np
from zerobatch_spec import (
    DTYPE_UINT32,
    HEADER_SIZE,
    TOKEN_DTYPE,
    U32_MAX,
    U64_MAX,
    padded_batch_bytes,
)
from zerobatch_spec.dataset import (
    CHECKSUM_ALGORITHM,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
)

from . import __version__, cli_remote
from .dataset import DatasetError, DatasetReader
from .errors import FormatError, MissingDependencyError, WriteError, ZeroBatchError
from .loader import DEFAULT_BLOCK_SIZE
from .provenance import DEFAULT_MAX_ROWS
from .reader import BatchFileReader
from .redaction import remember, scrub
from .validation import DatasetReport, validate_dataset, validate_file

if TYPE_CHECKING:
    from .ingest.convert import ConvertSummary, Progress

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

DTYPE_NAMES: Mapping[int, str] = {DTYPE_UINT32: TOKEN_DTYPE.name}
"""The name of each token dtype code, shown by ``inspect`` beside the code."""


class UsageError(Exception):
    """The command cannot run as given (a path, an option value); exits ``EXIT_USAGE``."""


def _plural(n: int, word: str, plural: str | None = None) -> str:
    """``"1 batch"``, ``"2 batches"``: ``n`` and the word in the right number."""
    many = plural or (word + "es" if word.endswith(("s", "sh", "ch", "x")) else word + "s")
    return f"{n:,} {word if n == 1 else many}"


# --- paths --------------------------------------------------------------------------------------


def _shown(path: str) -> str:
    """``path`` as messages show it: an argument with a URL scheme without user information or
    query (``redaction.redact``), anything else as given."""
    return cli_remote.shown(path) if "://" in path else path


def _check_readable(path: str) -> None:
    """A ``UsageError`` unless ``path`` is a regular file this process can read."""
    if not os.path.exists(path):
        raise UsageError(f"{_shown(path)}: no such file")
    if not os.path.isfile(path):
        raise UsageError(f"{_shown(path)}: not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise UsageError(f"{_shown(path)}: cannot be read: {e.strerror or e}") from e


def _readable_inputs(patterns: Sequence[str]) -> list[str]:
    """The files named by ``patterns`` (paths or quoted glob patterns), each one checked to be a
    readable regular file; a ``UsageError`` names the first that is not."""
    found: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern) and not os.path.exists(pattern):
            matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            if not matches:
                raise UsageError(f"{_shown(pattern)}: no file matches this pattern")
            found.extend(matches)
            continue
        _check_readable(pattern)
        found.append(pattern)
    return found


def _check_output(args: argparse.Namespace, inputs: Sequence[str]) -> None:
    """The writers' own checks of ``args.output`` (``writer.check_output``: not a directory, in
    an existing directory, not one of ``inputs``, not an existing file unless ``--overwrite``;
    with ``--shard-size``, ``dataset_build.check_dataset_output``), made before anything is
    read, and reported as usage errors. A URL is refused: the writers write local paths, and
    ``https://host/x`` would become a local directory named ``https:``."""
    from .dataset_build import check_dataset_output
    from .storage import is_url
    from .writer import check_output

    if is_url(args.output):  # it would be written as a local path named "https:/..."
        raise UsageError(
            f"{_shown(args.output)}: {args.command} writes local files and directories, not "
            "URLs; write locally, then copy the file or directory to the object store"
        )
    try:
        if args.shard_batches is None:
            check_output(args.output, overwrite=args.overwrite, inputs=inputs)
        else:
            check_dataset_output(args.output, overwrite=args.overwrite, inputs=inputs)
    except WriteError as e:
        raise UsageError(flag_message(str(e), args.option_flags)[0]) from e


def _dataset_directory(path: str) -> None:
    """A ``UsageError`` unless the directory ``path`` holds a manifest (a regular file)."""
    manifest = os.path.join(path, MANIFEST_NAME)
    if os.path.lexists(manifest) and not os.path.isfile(manifest):
        raise UsageError(f"{manifest}: not a regular file; a dataset's manifest is a file")
    if not os.path.isfile(manifest):
        raise UsageError(
            f"{path}: a directory but not a dataset (it has no {MANIFEST_NAME}); describe the "
            f"LLMBATCH files in it with: zerobatch dataset create {path}"
        )


# --- commands -----------------------------------------------------------------------------------


def _print_table(info: Mapping[str, object]) -> None:
    """``key  value`` lines, keys padded to one width, floats to 4 decimals."""
    width = max(len(k) for k in info)
    for k, v in info.items():
        print(f"{k:<{width}}  {f'{v:.4f}' if isinstance(v, float) else v}")


def _inspect_dataset(args: argparse.Namespace) -> int:
    _dataset_directory(args.file)
    try:
        reader = DatasetReader(args.file, verify="off")
    except DatasetError as e:
        if args.json:
            error = {"code": e.code.value, "field": e.where, "detail": e.detail}
            print(json.dumps({"path": e.path, "valid": False, "error": error}))
        print(f"zerobatch inspect: {e}", file=sys.stderr)
        return EXIT_INVALID
    with reader:
        m = reader.manifest
        batches = [s.num_batches for s in m.shards]
        records = sum(s.total_records for s in m.shards)
        info: dict[str, Any] = {
            "path": reader.path,
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "shards": len(m.shards),
            "num_batches": m.num_batches,
            "batch_size": m.batch_size,
            "seq_len": m.seq_len,
            "seed": m.seed,
            "dtype": DTYPE_UINT32,
            "dtype_name": DTYPE_NAMES[DTYPE_UINT32],
            "padded_batch_bytes": padded_batch_bytes(m.batch_size, m.seq_len),
            "size": sum(s.size for s in m.shards),
            "tokens": m.num_batches * m.batch_size * m.seq_len,
            "total_records": records,
            "dropped_records": records - m.num_batches * m.batch_size,
            "shard_batches_min": min(batches, default=0),
            "shard_batches_max": max(batches, default=0),
            "checksum_algorithm": CHECKSUM_ALGORITHM,
            "checksums_xxh3": m.checksums_xxh3,
            "manifest_sha256": reader.manifest_sha256,
            "sources": len(m.sources),
        }
    if args.json:
        info["shard_list"] = [
            {
                "name": s.name,
                "num_batches": s.num_batches,
                "seed": s.seed,
                "total_records": s.total_records,
                "size": s.size,
                "records": None if s.records is None else list(s.records),
            }
            for s in m.shards
        ]
        info["source_list"] = [{"path": s.path, "records": list(s.records)} for s in m.sources]
        print(json.dumps(info))
        return EXIT_OK
    shown = {k: v for k, v in info.items() if k != "dtype_name"}
    shown["dtype"] = f"{DTYPE_UINT32} ({info['dtype_name']})"
    _print_table(shown)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    if cli_remote.handles(args.file):  # a URL, or a live dataset
        return cli_remote.inspect(args)
    if os.path.isdir(args.file):
        return _inspect_dataset(args)
    try:
        reader = BatchFileReader(args.file)
    except FormatError as e:
        if args.json:
            error = {"code": e.code.value, "field": e.field, "detail": e.detail}
            print(json.dumps({"path": e.path, "valid": False, "error": error}))
        print(f"zerobatch inspect: {e}", file=sys.stderr)
        return EXIT_INVALID
    with reader:
        h = reader.header
        info = {
            "path": reader.path,
            **h.as_dict(),
            "dtype_name": DTYPE_NAMES.get(h.dtype, "unknown"),
            "raw_batch_bytes": h.raw_batch_bytes,
            "padded_batch_bytes": h.padded_batch_bytes,
            "padding_fraction": 1 - h.raw_batch_bytes / h.padded_batch_bytes,
            "file_size": h.file_size,
            "tokens": h.num_batches * h.batch_size * h.seq_len,
            "dropped_records": h.total_records - h.num_batches * h.batch_size,
        }
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    shown = {k: v for k, v in info.items() if k != "dtype_name"}
    shown["dtype"] = f"{h.dtype} ({info['dtype_name']})"
    _print_table(shown)
    return EXIT_OK


def _print_dataset_report(report: DatasetReport) -> None:
    if report.valid:
        m = report.manifest
        assert m is not None
        mode = (
            "checked: manifest, shards, every slot's checksum and padding"
            if report.deep
            else "checked: manifest, checksums file, shard headers and sizes"
        )
        print(
            f"OK {report.path}: dataset of {_plural(len(m.shards), 'shard')}, "
            f"{_plural(m.num_batches, 'batch')} of [{m.batch_size}, {m.seq_len}] ({mode})"
        )
        return
    print(f"INVALID {report.path}: {_plural(len(report.failures), 'failure')}")
    for failure in report.failures:
        print(f"  {failure}")


def cmd_validate(args: argparse.Namespace) -> int:
    if cli_remote.handles(args.file):  # a URL, or a live dataset
        return cli_remote.validate(args)
    if os.path.isdir(args.file):
        _dataset_directory(args.file)
        dataset = validate_dataset(args.file, deep=args.deep)
        if args.json:
            print(json.dumps(dataset.as_dict()))
        else:
            _print_dataset_report(dataset)
        return EXIT_OK if dataset.valid else EXIT_INVALID
    report = validate_file(args.file, deep=args.deep)
    if args.json:
        print(json.dumps(report.as_dict()))
    elif report.valid:
        h = report.header
        assert h is not None
        mode = "header, size and padding" if report.deep else "header and size"
        print(
            f"OK {report.path}: {_plural(h.num_batches, 'batch')} of "
            f"[{h.batch_size}, {h.seq_len}] ({mode} checks)"
        )
    else:
        print(f"INVALID {report.path}: {report.code}: field {report.field}: {report.detail}")
    return EXIT_OK if report.valid else EXIT_INVALID


class _ProgressDisplay:
    """The progress display, drawn only on a terminal: a log file gets no carriage returns."""

    def __init__(self, args: argparse.Namespace, seq_len: int, stream: TextIO) -> None:
        from .ingest.convert import progress_bar

        show = not (args.quiet or args.json) and stream.isatty()
        self.stream = stream
        self.progress: Progress | None = progress_bar(seq_len, stream) if show else None

    def __enter__(self) -> Progress | None:
        return self.progress

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:  # end the progress line, before any error message
            print(file=self.stream)


def _print_summary(args: argparse.Namespace, summary: ConvertSummary) -> None:
    """The summary of ``write`` and ``convert``: JSON, text, or nothing (``--quiet``)."""
    if args.json:
        print(json.dumps(summary.as_dict()))
    elif not args.quiet:
        print("\n".join(summary.lines()))


def _npy_shape(path: str) -> list[int]:
    """The shape of the ``.npy`` array at ``path`` (mapped, not read; object arrays refused)."""
    _check_readable(path)
    try:
        loaded: Any = np.load(path, mmap_mode="r")
    except (ValueError, EOFError) as e:
        raise UsageError(f"{path}: not a readable .npy array: {e}") from e
    if not isinstance(loaded, np.ndarray):
        raise UsageError(f"{path}: expected one .npy array, got a {type(loaded).__name__}")
    return [int(d) for d in loaded.shape]


def cmd_write(args: argparse.Namespace) -> int:
    from .ingest.convert import convert

    shape = _npy_shape(args.input)
    if len(shape) == 1:
        raise UsageError(
            f"{args.input}: write needs a [records, seq_len] array, this one is flat "
            f"({shape[0]:,} tokens); cut it into records with: "
            f"zerobatch convert {args.input} {args.output} --seq-len T --batch-size "
            f"{args.batch_size}"
        )
    if len(shape) != 2:
        raise UsageError(f"{args.input}: write needs a [records, seq_len] array, got {shape}")
    width = shape[1]
    if args.seq_len is not None and args.seq_len != width:
        raise UsageError(
            f"--seq-len {args.seq_len}, but the records of {args.input} have {width} tokens "
            f"(shape {shape})"
        )
    if width == 0:
        raise UsageError(f"{args.input}: records have 0 tokens (shape {shape})")
    _check_output(args, [args.input])
    with _ProgressDisplay(args, width, sys.stderr) as progress:
        summary = convert(
            [glob.escape(args.input)],
            args.output,
            seq_len=width,
            batch_size=args.batch_size,
            seed=args.seed,
            progress=progress,
            kind="npy",
            overwrite=args.overwrite,
            allow_empty=args.allow_empty,
            shard_batches=args.shard_batches,
        )
    _print_summary(args, summary)
    return EXIT_OK


def cmd_convert(args: argparse.Namespace) -> int:
    from .ingest.convert import convert

    if args.address is not None and args.engine != "ray":
        raise UsageError("--address applies only to --engine ray")
    inputs = _readable_inputs(args.sources)
    _check_output(args, inputs)
    if args.engine == "ray":
        return _convert_with_ray(args, inputs)
    with _ProgressDisplay(args, args.seq_len, sys.stderr) as progress:
        summary = convert(
            args.sources,
            args.output,
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            seed=args.seed,
            progress=progress,
            kind=args.kind,
            tokenizer=args.tokenizer,
            mode=args.mode,
            pad_id=args.pad_id,
            text_field=args.text_field,
            per_line=args.per_line,
            workers=args.workers or 1,
            align=args.align,
            bos_token=args.bos_token,
            overwrite=args.overwrite,
            allow_empty=args.allow_empty,
            shard_batches=args.shard_batches,
        )
    _print_summary(args, summary)
    return EXIT_OK


def _convert_with_ray(args: argparse.Namespace, inputs: Sequence[str]) -> int:
    """``convert --engine ray``: the text pipeline on a Ray cluster, with Ray's progress display
    (``ray_convert``; the output is the local engine's, byte for byte)."""
    from .ingest.convert import detect_kind

    kind = args.kind or detect_kind(inputs)
    if kind != "text" or args.align != "contiguous" or args.bos_token is not None:
        raise UsageError(
            f"--engine ray converts text sources only, not {kind} (nor --align, --bos-token); "
            "convert nanoGPT shards and .npy arrays with the local engine"
        )
    try:
        from .ray_convert import convert_with_ray
    except ImportError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        raise MissingDependencyError("ray", "ray", "converting with --engine ray") from e
    summary = convert_with_ray(
        args.sources,
        args.output,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        seed=args.seed,
        tokenizer=args.tokenizer,
        mode=args.mode,
        pad_id=args.pad_id,
        text_field=args.text_field,
        per_line=args.per_line,
        shard_batches=args.shard_batches,
        overwrite=args.overwrite,
        allow_empty=args.allow_empty,
        workers=args.workers,
        address=args.address,
        show_progress=not (args.quiet or args.json),
        kind=args.kind,
    )
    _print_summary(args, summary)
    return EXIT_OK


def _shard_name(directory: str, path: str) -> str:
    """A ``FILE`` of ``dataset create`` as a name inside ``directory``: a bare name is one,
    a path must lie in the directory itself."""
    where, name = os.path.split(path)
    if where and os.path.realpath(where) != os.path.realpath(directory):
        raise UsageError(
            f"{path}: not in {directory}; a dataset's shards are files inside its directory "
            f"(move or link them there, or name them relative to it)"
        )
    return name


def cmd_dataset_create(args: argparse.Namespace) -> int:
    """``dataset create``: the names are checked against the manifest's name rule first (a
    usage error naming every bad one, nothing written), then ``create_dataset`` writes (and,
    with ``--overwrite``, swaps in) the manifest."""
    from .dataset_build import create_dataset, dataset_shard_names

    directory = args.directory
    if not os.path.isdir(directory):
        raise UsageError(f"{directory}: no such directory")
    try:
        names = dataset_shard_names(
            directory, [_shard_name(directory, f) for f in args.files] or None
        )
    except WriteError as e:
        raise UsageError(str(e)) from e
    manifest = create_dataset(directory, names, seed=args.seed, overwrite=args.overwrite)
    summary = {
        "path": os.path.join(directory, MANIFEST_NAME),
        "shards": len(manifest.shards),
        "num_batches": manifest.num_batches,
        "batch_size": manifest.batch_size,
        "seq_len": manifest.seq_len,
        "seed": manifest.seed,
        "size": sum(s.size for s in manifest.shards),
    }
    if args.json:
        print(json.dumps(summary))
    elif not args.quiet:
        print(
            f"wrote {summary['path']}: {_plural(len(manifest.shards), 'shard')}, "
            f"{_plural(manifest.num_batches, 'batch')} of [{manifest.batch_size}, "
            f"{manifest.seq_len}], seed {manifest.seed}"
        )
    return EXIT_OK


def cmd_trace(args: argparse.Namespace) -> int:
    from .provenance import trace_step

    if os.path.isdir(args.path):
        _dataset_directory(args.path)
    else:
        _check_readable(args.path)
    try:
        trace = trace_step(
            args.path,
            args.step,
            epoch=args.epoch,
            block_size=args.block_size,
            seed=args.seed,
            shuffle=not args.no_shuffle,
            global_batch_size=args.global_batch_size,
            rank=args.rank,
            world_size=args.world_size,
            context_rank=args.context_rank,
            context_size=args.context_size,
            zigzag=args.zigzag,
            next_token=args.next_token,
            max_rows=args.max_rows,
        )
    except (ValueError, IndexError) as e:
        if isinstance(e, ZeroBatchError):  # the data's fault: a broken manifest or file
            raise
        raise UsageError(flag_message(str(e), args.option_flags)[0]) from e
    if args.json:
        print(json.dumps(trace.as_dict()))
    else:
        print("\n".join(trace.lines()))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .speed_demo import run_speed_demo

    if args.records < args.batch_size:
        raise UsageError(
            f"--records {args.records} is fewer than --batch-size {args.batch_size}: the demo "
            f"file would hold no batch"
        )
    return run_speed_demo(
        args.out, records=args.records, seq_len=args.seq_len, batch_size=args.batch_size
    )


# --- argument types -----------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= v <= U32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, 2**32 - 1], got {v}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v <= U64_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64 - 1], got {v}")
    return v


def _u64(text: str) -> int:
    try:
        return _count(str(int(text, 0)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _u32(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v <= U32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**32 - 1], got {v}")
    return v


# --- flags in API messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """The command-line flag that sets one API parameter."""

    option: str
    """The flag, e.g. ``--pad-id``."""
    switch: bool
    """True for an on/off flag that takes no value (``--overwrite``)."""


_VERBATIM = re.compile(r"(\[[^\]]*\]|(?<![\w=])'[^']*')")
_ASSIGNMENT = re.compile(
    r"(?<![\w'\"/.-])([a-z][a-z0-9_]*)=(?:'([^']*)'|\"([^\"]*)\"|([^\s,;)\]]+))"
)
_NAME_MUST = re.compile(r"(?<![\w'\"/.-])([a-z][a-z0-9]*) must be\b")
_CLI_HINT = re.compile(r" \((--[a-z][a-z0-9-]*) on the command line\)")
_PHRASES: Mapping[str, str] = {"tokenizer spec": "tokenizer"}
"""Phrases of API messages that stand for a parameter: ``tokenizer spec 'x'`` is ``--tokenizer``."""
_SNAKE = re.compile(r"(?<![\w'\"/.-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![=\w/-]|\.\w)")


def flag_message(message: str, flags: Mapping[str, Flag]) -> tuple[str, bool]:
    """``message`` with the API parameter names in ``flags`` written as the command line's flags,
    and whether it names one of the flags.

    ``mode='pad'`` becomes ``--mode pad``, ``overwrite=True`` ``--overwrite``, ``pad_id``
    ``--pad-id``, ``seed must be`` ``--seed must be``, and ``tokenizer spec 'x'``
    ``--tokenizer 'x'`` (``_PHRASES``). A one-word name is translated only before ``=`` or
    ``must be``: ``seed`` and ``mode`` are plain English too. Nothing inside square brackets or
    quotes is touched: ``[num_records, seq_len]`` is a shape, ``'hf:t.json?bos=<s>'`` the
    user's own value. A hint for command-line users, ``(--overwrite on the command line)``, is
    dropped once the message names the flag itself.
    """

    def assignment(m: re.Match[str]) -> str:
        flag = flags.get(m.group(1))
        if flag is None:
            return m.group(0)
        value = next(g for g in (m.group(2), m.group(3), m.group(4)) if g is not None)
        if flag.switch:
            return flag.option if value == "True" else m.group(0)
        return f"{flag.option} {value}"

    def name(m: re.Match[str]) -> str:
        flag = flags.get(m.group(1))
        return m.group(0) if flag is None else m.group(0).replace(m.group(1), flag.option, 1)

    pieces = _VERBATIM.split(message)
    for i in range(0, len(pieces), 2):  # odd pieces: shapes in brackets, quoted values
        text = pieces[i]
        for phrase, dest in _PHRASES.items():
            if dest in flags:
                text = re.sub(rf"\b{phrase}\b", flags[dest].option, text)
        text = _ASSIGNMENT.sub(assignment, text)
        text = _NAME_MUST.sub(name, text)
        pieces[i] = _SNAKE.sub(name, text)
    text = "".join(pieces)
    text = _CLI_HINT.sub(lambda m: "" if text.count(m.group(1)) > 1 else m.group(0), text)
    named = any(
        re.search(rf"(?<![\w-]){re.escape(f.option)}(?![\w-])", text) for f in flags.values()
    )
    return text, named


def _option_flags(parser: argparse.ArgumentParser) -> dict[str, Flag]:
    """The long flag of each option of ``parser``, by the parameter name it stands for."""
    return {
        action.dest: Flag(action.option_strings[-1], action.nargs == 0)
        for action in parser._actions
        if action.option_strings
        and action.option_strings[-1].startswith("--")
        and action.dest not in ("help", "debug")
    }


# --- the parser ---------------------------------------------------------------------------------


class HelpFormatter(argparse.HelpFormatter):
    """Help as a newcomer needs it: every option with a default says it (unless its help
    already does), prose is wrapped to the terminal, and indented lines (examples, tables) are
    kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        trivial = action.default is None or action.default is False
        if (
            action.option_strings
            and not action.required
            and not trivial
            and action.default is not argparse.SUPPRESS
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                lines.extend(
                    textwrap.wrap(
                        " ".join(prose),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                        break_on_hyphens=False,
                    )
                )
                prose.clear()

        for line in text.splitlines():
            if not line.strip() or line[0].isspace():
                flush()
                lines.append(indent + line if line.strip() else "")
            else:
                prose.append(line.strip())
        flush()
        return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help uses ``HelpFormatter``; subcommand parsers, plugged-in
    ones included, are made of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _table(rows: Sequence[tuple[object, str]], width: int = 78) -> str:
    """Indented two-column rows, the second column wrapped under itself."""
    key_width = max(len(str(key)) for key, _ in rows)
    out = []
    for key, text in rows:
        head = f"  {key!s:>{key_width}}  "
        indent = " " * len(head)
        wrapped = textwrap.wrap(text, width - len(head), break_on_hyphens=False)
        out.append(head + f"\n{indent}".join(wrapped))
    return "\n".join(out)


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
    f"exit status:\n{_table(EXIT_CODES)}\n\n"
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


def _add_shape_options(p: argparse.ArgumentParser, seq_len_help: str, required: bool) -> None:
    """``--batch-size`` and ``--seq-len`` of ``write`` and ``convert``."""
    p.add_argument(
        "--batch-size",
        type=_positive,
        required=True,
        metavar="B",
        help="records per batch: the training batch size (required)",
    )
    p.add_argument("--seq-len", type=_positive, required=required, metavar="T", help=seq_len_help)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """The options ``write`` and ``convert`` share: the seed, what may be written, printing."""
    p.add_argument(
        "--seed",
        type=_u32,
        default=0,
        metavar="S",
        help="shuffle seed in [0, 2**32 - 1]; the same input and seed give the same file",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUTPUT if it exists (default: refuse); an input is never replaced",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="write a file of 0 batches when the input fills no batch (default: refuse)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing but errors: no progress display, no summary (default: progress "
        "on a terminal, then a summary)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object, also with --quiet (default: text)",
    )
    p.add_argument(
        "--shard-size",
        dest="shard_batches",
        type=_positive,
        default=None,
        metavar="N",
        help="write OUTPUT as a dataset directory of shards of N batches each, with a manifest "
        "naming the input file of every record range (default: one file)",
    )


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    """The order and slicing options of ``trace``: the loader's parameters and defaults."""
    p.add_argument(
        "--step",
        type=_count,
        required=True,
        metavar="N",
        help="the step within the epoch (required)",
    )
    p.add_argument("--epoch", type=_count, default=0, metavar="E", help="the epoch")
    p.add_argument("--rank", type=_count, default=0, metavar="R", help="data-parallel rank")
    p.add_argument(
        "--of",
        dest="world_size",
        type=_positive,
        default=1,
        metavar="D",
        help="data-parallel ranks (world size)",
    )
    p.add_argument(
        "--context-rank", type=_count, default=0, metavar="C", help="context-parallel rank"
    )
    p.add_argument(
        "--context-size", type=_positive, default=1, metavar="CS", help="context-parallel ranks"
    )
    p.add_argument(
        "--zigzag",
        action="store_true",
        help="context chunks c and 2C-1-c of 2C, the load-balanced split for causal attention "
        "(default: chunk c of C)",
    )
    p.add_argument(
        "--block-size",
        type=_positive,
        default=DEFAULT_BLOCK_SIZE,
        metavar="B",
        help="stored batches per shuffled block, as given to the loader",
    )
    p.add_argument(
        "--seed",
        type=_u64,
        default=None,
        metavar="S",
        help="order seed (default: the dataset's or file's seed, as the loader's)",
    )
    p.add_argument(
        "--no-shuffle", action="store_true", help="storage order (default: block-shuffled)"
    )
    p.add_argument(
        "--global-batch-size",
        type=_positive,
        default=None,
        metavar="G",
        help="samples per step over all ranks (default: the stored batch size)",
    )
    p.add_argument(
        "--next-token",
        action="store_true",
        help="columns of (inputs, labels) pairs: each range is read one token further "
        "(default: whole tokens)",
    )
    p.add_argument(
        "--max-rows",
        type=_positive,
        default=DEFAULT_MAX_ROWS,
        metavar="N",
        help="refuse a step of more than N rows for the rank, before tracing any (default: "
        "%(default)s)",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (default: text lines)"
    )


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
        command.set_defaults(option_flags=_option_flags(command))
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

    p = sub.add_parser(
        "inspect",
        help="print a file's header fields and sizes",
        description="Print the header fields of an LLMBATCH file and the sizes derived from "
        "them: bytes per batch slot, padding, file size, tokens, and the records the writer "
        "dropped. Only the header is read, so it is instant on any file. A file that fails "
        "the header or size checks is reported as invalid (exit 1).\n\n"
        "For a dataset directory, the manifest's summary: shards, slots, batch shape, seed, "
        "size and checksum algorithm (--json adds every shard and source); only the manifest "
        "is read.\n\n"
        "PATH may also be a URL (s3://, gs://, az://, http(s)://, file://) of a file or a "
        "dataset, or a live dataset (URL or directory).",
        epilog="examples:\n"
        "  zerobatch inspect train.batch\n"
        "  zerobatch inspect train.batch --json\n"
        "  zerobatch inspect data/train/\n"
        "  zerobatch inspect s3://bucket/data/train",
    )
    p.add_argument(
        "file", metavar="PATH", help="the .batch file, dataset directory or URL to describe"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (default: text)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "validate",
        help="check a file against the format specification",
        description="Check an LLMBATCH file against the specification (spec/SPEC.md): the "
        "header rules and the exact file size and, with --deep, that the padding bytes of "
        "every batch slot are zero (this reads the whole file). Prints OK, or INVALID with "
        "the error code, the field and what was found.\n\n"
        "For a dataset directory: the manifest, the checksums file, and every shard against "
        "the manifest (present, size, header, file rules) and, with --deep, every slot's "
        "checksum and padding; *.batch files the manifest does not list are extra_shard. "
        "Every failure is listed with its shard and slot.\n\n"
        "PATH may also be a URL (s3://, gs://, az://, http(s)://, file://) of a file or a "
        "dataset, or a live dataset: every object against the manifest and, with --deep, "
        "every slot's checksum.",
        epilog="examples:\n"
        "  zerobatch validate train.batch\n"
        "  zerobatch validate train.batch --deep --json\n"
        "  zerobatch validate --deep data/train/\n"
        "  zerobatch validate --deep s3://bucket/data/train\n\n"
        "exit status: 0 valid, 1 invalid, 2 the path cannot be read.",
    )
    p.add_argument(
        "file", metavar="PATH", help="the .batch file, dataset directory or URL to check"
    )
    p.add_argument(
        "--deep",
        action="store_true",
        help="also read every slot: its padding bytes, and in a dataset its checksum "
        "(default: the header and file size only)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON object, with the error code if invalid "
        "(default: one line of text)",
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "write",
        help="write a [records, seq_len] token array (.npy) as an LLMBATCH file",
        description="Shuffle the records (rows) of a 2-D integer .npy array with --seed, group "
        "them into batches of --batch-size records and write them as an LLMBATCH file. "
        "Records that do not fill a last batch are dropped; the summary says how many. With "
        "--shard-size, OUTPUT is a dataset directory of shards instead.\n\n"
        "For a flat 1-D token array, nanoGPT .bin shards or text, use 'zerobatch convert'.",
        epilog="examples:\n"
        "  zerobatch write tokens.npy train.batch --batch-size 32\n"
        "  zerobatch write tokens.npy train.batch --batch-size 32 --seed 7 --overwrite\n"
        "  zerobatch write tokens.npy data/train --batch-size 32 --shard-size 1000",
    )
    p.add_argument(
        "input",
        metavar="INPUT",
        help=".npy file of integer tokens in [0, 2**32 - 1], shape [records, seq_len]",
    )
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="the .batch file to write (with --shard-size, the dataset directory)",
    )
    _add_shape_options(
        p, "tokens per record, checked against the array (default: the array's width)", False
    )
    _add_output_options(p)
    p.set_defaults(func=cmd_write)

    p = sub.add_parser(
        "convert",
        help="convert nanoGPT shards, .npy token arrays or text to an LLMBATCH file",
        description="Convert nanoGPT .bin shards, .npy token arrays or text (.parquet, .jsonl, "
        ".json, .txt) into one shuffled LLMBATCH file. The kind of source comes from the "
        "file suffixes (or --kind). Token streams are cut into records of --seq-len tokens; "
        "text is first tokenized (--tokenizer) and packed into records (--mode). Memory stays "
        "bounded whatever the corpus size, and OUTPUT appears only once it is complete.\n\n"
        "With --shard-size N, OUTPUT is a dataset directory: shards of N batches and a "
        "manifest (written last) that records which input file gave which records; text "
        "packed across files counts a record as its first token's file.\n\n"
        "Parquet files and the hf: and tiktoken: tokenizers need the text extra:\n"
        "  pip install 'zerobatch[text]'",
        epilog="examples:\n"
        "  zerobatch convert 'data/fineweb_train_*.bin' train.batch --seq-len 1024 "
        "--batch-size 32\n"
        "  zerobatch convert tokens.npy train.batch --seq-len 512 --batch-size 16\n"
        "  zerobatch convert 'data/*.bin' data/train --seq-len 1024 --batch-size 32 "
        "--shard-size 1000\n"
        "  zerobatch convert 'corpus/*.parquet' train.batch --seq-len 2048 --batch-size 16 \\\n"
        "      --tokenizer 'hf:tokenizer.json?bos=<|endoftext|>' --workers 8\n"
        "  zerobatch convert notes.txt train.batch --seq-len 256 --batch-size 8 --per-line\n"
        "  zerobatch convert 'corpus/*.parquet' data/train --seq-len 2048 --batch-size 16 \\\n"
        "      --shard-size 1000 --engine ray --address auto\n\n"
        "tokenizer specs (--tokenizer):\n"
        "  byte                            UTF-8 bytes, BOS 256, no files needed\n"
        "  hf:PATH/tokenizer.json?bos=TOK  a Hugging Face tokenizers model (&eos=TOK too)\n"
        "  tiktoken:PATH/NAME.tiktoken     a local tiktoken rank file (?bos=TOK&eos=TOK)\n"
        "  tiktoken:NAME                   a standard encoding in tiktoken's local cache\n\n"
        "Quote glob patterns, so that the shell does not expand them.",
    )
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="input files or quoted glob patterns, all of one kind, read in the order given",
    )
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="the .batch file to write (with --shard-size, the dataset directory)",
    )
    _add_shape_options(p, "tokens per record: the training sequence length (required)", True)
    p.add_argument(
        "--kind",
        choices=["nanogpt", "npy", "text"],
        default=None,
        help="the kind of every source (default: from the file suffixes: .bin nanogpt, .npy "
        "npy, .parquet .jsonl .json .txt text)",
    )
    _add_output_options(p)
    text = p.add_argument_group("text sources")
    text.add_argument(
        "--tokenizer", default="byte", metavar="SPEC", help="see 'tokenizer specs' below"
    )
    text.add_argument(
        "--mode",
        choices=["pack", "pad"],
        default="pack",
        help="pack: documents, each starting with BOS, run on across records and nothing is "
        "padded; pad: one record per document, cut at --seq-len or filled up with --pad-id",
    )
    text.add_argument(
        "--pad-id",
        type=_u32,
        default=None,
        metavar="ID",
        help="--mode pad only: the padding token id (default: the tokenizer's EOS id)",
    )
    text.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="the parquet column or JSON field holding each document",
    )
    text.add_argument(
        "--per-line",
        action="store_true",
        help="plain text: one document per line (default: one document per file)",
    )
    text.add_argument(
        "--workers",
        type=_positive,
        default=None,
        metavar="N",
        help="tokenizer processes (default: 1), or with --engine ray tokenizer actors (default: "
        "one per CPU of the cluster); the output is the same for any N",
    )
    engine = p.add_argument_group("engine")
    engine.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: this machine; ray: text sources tokenized and written by Ray Data tasks "
        "across a Ray cluster (pip install 'zerobatch[ray]'), the same output byte for byte",
    )
    engine.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="--engine ray: the cluster to join, as ray.init(address=...) takes it: 'auto', "
        "HOST:PORT or ray://HOST:10001 (default: RAY_ADDRESS if set, else a new local cluster "
        "for this command)",
    )
    nanogpt = p.add_argument_group("nanoGPT sources")
    nanogpt.add_argument(
        "--align",
        choices=["contiguous", "bos"],
        default="contiguous",
        help="contiguous: cut records one after another; bos: start every record at a --bos-token",
    )
    nanogpt.add_argument(
        "--bos-token",
        type=_u32,
        default=None,
        metavar="ID",
        help="the token id that starts a document (default: none; --align bos needs one)",
    )
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser(
        "dataset",
        help="build dataset directories (manifests over LLMBATCH shards)",
        description="A dataset is a directory of LLMBATCH files (shards) of one batch size "
        "and sequence length, described by manifest.json (written last, atomically) and "
        "checksums.xxh3 (an XXH3-64 of every batch slot). 'zerobatch convert --shard-size' "
        "writes one; 'dataset create' describes files that already exist.",
        epilog="examples:\n  zerobatch dataset create data/train\n"
        "  zerobatch dataset create data/train part-0.batch part-1.batch --seed 7",
    )
    actions = p.add_subparsers(
        dest="action", required=True, metavar="ACTION", title="actions", parser_class=Parser
    )
    c = actions.add_parser(
        "create",
        help="write a manifest over LLMBATCH files in a directory",
        description="Describe LLMBATCH files inside DIR as a dataset: read every batch slot "
        "once to checksum it, then write checksums.xxh3 and manifest.json. The files must "
        "share batch_size and seq_len; their order is the dataset's.",
        epilog="examples:\n"
        "  zerobatch dataset create data/train\n"
        "  zerobatch dataset create data/train data/train/b.batch data/train/a.batch\n"
        "  zerobatch dataset create data/train --seed 7 --overwrite --json",
    )
    c.add_argument("directory", metavar="DIR", help="the directory holding the files")
    c.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="the shard files in dataset order, by name or as paths inside DIR "
        "(default: every *.batch file in DIR, sorted by name)",
    )
    c.add_argument(
        "--seed",
        type=_u64,
        default=None,
        metavar="S",
        help="the dataset's order seed, the loader's default (default: the first file's seed)",
    )
    c.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the manifest of a directory that is already a dataset (default: refuse)",
    )
    c.add_argument("--quiet", action="store_true", help="print nothing but errors")
    c.add_argument("--json", action="store_true", help="print one JSON object (default: text)")
    c.set_defaults(func=cmd_dataset_create)
    cli_remote.add_reclaim(actions, Parser)

    p = sub.add_parser(
        "trace",
        help="show what a step reads and which input records it came from",
        description="For one step of the loader (the same order and slicing parameters, with "
        "the same defaults), print the stored batches it reads, the rows and token columns "
        "this rank gets, and for every row where it came from: its record in the shard, "
        "through the writer's record permutation, its input record, and from the manifest's "
        "sources the input file and the record's index in it. Only the manifest (or a "
        "file's header) is read.",
        epilog="examples:\n"
        "  zerobatch trace data/train --step 1200\n"
        "  zerobatch trace data/train --step 1200 --epoch 2 --rank 3 --of 8 --json\n"
        "  zerobatch trace data/train --step 7 --context-rank 1 --context-size 2 --zigzag",
    )
    p.add_argument("path", metavar="DATASET", help="a dataset directory or an LLMBATCH file")
    _add_trace_options(p)
    p.set_defaults(func=cmd_trace)

    for register in _command_plugins():  # zerobatch conformance, zerobatch probe, ...
        register(sub)

    p = sub.add_parser(
        "demo",
        help="write a synthetic dataset and time the loader over it (tokens/s)",
        description="Write a synthetic LLMBATCH file of random tokens into --out (replacing the "
        "one a previous run left there), then time the core loader over it in each output "
        "dtype, yielding batches and consuming them. A speed check of this machine; the "
        "training demo lives in examples/.",
        epilog="examples:\n  zerobatch demo\n  zerobatch demo --records 100000 --seq-len 1024",
    )
    p.add_argument("--out", default="demo-output", metavar="DIR", help="directory for demo.batch")
    p.add_argument(
        "--records", type=_positive, default=20_000, metavar="N", help="records to write"
    )
    p.add_argument("--seq-len", type=_positive, default=512, metavar="T", help="tokens per record")
    p.add_argument(
        "--batch-size", type=_positive, default=32, metavar="B", help="records per batch"
    )
    p.set_defaults(func=cmd_demo)

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
    """A text stream that passes every write through ``redaction.scrub`` (the module docstring).

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
    ``argv`` and of URL user information (the module docstring).
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


if __name__ == "__main__":
    raise SystemExit(main())
