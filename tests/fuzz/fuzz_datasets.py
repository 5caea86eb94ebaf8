"""Long fuzz run of dataset metadata: mutants of manifests, checksums files and shard names.

Run from the repository root (``tests/fuzz/README.md`` has the figures of the last run)::

    nice -n 10 .venv/bin/python -m tests.fuzz.fuzz_datasets --mutants 100000 --workers 2

Mutant ``i`` of a run is a pure function of ``(--seed, i)`` (``mutants.random_dataset_mutant``):
one of two small valid dataset directories written by ZeroBatch's own writers, with one to
five JSON-aware or byte-level mutations (``mutants.py`` lists them). Each mutant is written to
a scratch directory (on ``/dev/shm`` when there is one), beside a valid LLMBATCH file
``outside.batch`` that traversal names and links point at, and goes through every entry point
that reads a dataset: the loader (a few items, then hostile states: a huge step, ``num_workers``
or ``skip_steps``), ``zerobatch validate --deep --json``, ``zerobatch inspect --json`` and
``zerobatch trace`` of two steps, each command run by its own function as ``main`` runs it.

Each worker process runs under a 2 GiB address-space limit (``RLIMIT_AS``). An entry point
may end in exactly two ways: it works, or it raises one of ZeroBatch's own errors (or, for a
command, the command line's usage error). Anything else is a *finding*: another exception, a
``MemoryError``, a worker killed by a signal, or a mutant that makes no progress for
``--hang-seconds`` (10 s). Findings are counted, saved (the mutant's files and a command that
replays it) and listed in the findings file, once per (entry point, exception type, top
frame). The run exits 1 if there was any finding.

The workers, limits, findings files and replays are ``harness.py``'s campaign front end, which
``fuzz_live.py``, ``fuzz_mds.py`` and ``fuzz_atlas.py`` share.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

from tests.fuzz.harness import Campaign, Step, campaign_main, run_entries
from tests.fuzz.mutants import Op, apply_tree, dataset_bases, random_dataset_mutant

HOSTILE_STATES: tuple[dict[str, Any], ...] = (
    {"step": 2**62},
    {"num_workers": 2**40, "worker": 2**40 - 1},
    {"num_workers": 2**62, "worker": 3, "step": 2**61},
    {"skip_steps": [[0, 2**41]]},
    {"skip_steps": [[1, 2**63]], "num_workers": 2, "worker": 1, "step": 3},
    {"skip_steps": [[i, i + 1] for i in range(0, 20_000, 2)]},
    {"epoch": 2**64 - 1},
    {"global_batch_size": 1, "step": 2**40},
    {"global_batch_size": 2**32 - 1},
    {"origin": 2**62, "step": 2**62},
)
"""Keys a hostile state changes in a state the loader saved itself."""


# -- the dataset checks -----------------------------------------------------------------------


def run_command(argv: list[str]) -> None:
    """Run a ``zerobatch`` command's function as ``main`` does, output discarded, exceptions
    raised (``main`` would turn them into an exit status and a message)."""
    from zerobatch_core.cli import build_parser

    args = build_parser().parse_args(argv)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        args.func(args)


def _loader(root: str, index: int) -> None:
    """The loader over the mutant, a few items, then hostile states. Whatever the output dtype,
    the tokens it stores are the manifest's dtype (every shard's), and a native item has it."""
    from zerobatch_spec import TOKEN_DTYPES

    from zerobatch_core import BatchNativeLoader, DatasetReader, OutputDType

    dtype: OutputDType = ("native", "int64", "uint32", "int32")[index % 4]
    loader = BatchNativeLoader(root, dtype=dtype, block_size=1 + index % 3)
    try:
        assert isinstance(loader.source, DatasetReader), type(loader.source)
        stored = TOKEN_DTYPES[loader.source.manifest.dtype]
        assert loader.token_dtype == stored, f"{loader.token_dtype} from a {stored} manifest"
        items = iter(loader)
        for _ in range(3):
            item = next(items, None)
            if item is not None and dtype == "native":
                assert item.dtype == stored, f"a native item of {item.dtype}, not {stored}"
        saved = loader.state_dict()
        for k in (index % len(HOSTILE_STATES), (index // 7) % len(HOSTILE_STATES)):
            state = {**saved, **HOSTILE_STATES[k]}
            with contextlib.suppress(_zerobatch_errors()):
                loader.load_state_dict(state)
                items = iter(loader)
                for _ in range(2):
                    next(items, None)
    finally:
        loader.source.close()


def _zerobatch_errors() -> type[BaseException]:
    from zerobatch_core import ZeroBatchError

    return ZeroBatchError


def _skipping_loader(root: str, index: int) -> None:
    """A loader told to skip a range of 2^40+ steps, with another global batch size."""
    from zerobatch_core import BatchNativeLoader, DatasetReader

    with DatasetReader(root) as source:
        g = (source.batch_size * 2, 1, None)[index % 3]  # a multiple, a divisor, the same
        loader = BatchNativeLoader(source, global_batch_size=g, skip_steps=[(1, 2**41 + 1)])
        items = iter(loader)
        for _ in range(2):
            next(items, None)


def check_dataset(
    root: str, index: int, ops: list[Op], at: Callable[[int], None]
) -> list[tuple[str, str, str]]:
    """Every dataset entry point on the mutant at ``root`` (``index`` varies the loader's
    settings and the hostile states)."""
    from zerobatch_core.cli import UsageError

    usage = (UsageError,)
    steps: list[Step] = [
        ("loader", lambda: _loader(root, index), ()),
        ("loader-skip", lambda: _skipping_loader(root, index), ()),
        ("validate", lambda: run_command(["validate", "--deep", "--json", root]), usage),
        ("inspect", lambda: run_command(["inspect", "--json", root]), usage),
        ("trace", lambda: run_command(["trace", root, "--step", "1", "--json"]), usage),
        (
            "trace-rank",
            lambda: run_command(
                ["trace", root, "--step", "0", "--rank", "1", "--of", "2", "--epoch", "3"]
            ),
            usage,
        ),
    ]
    return run_entries(steps, at)


DATASETS = Campaign(
    module="tests.fuzz.fuzz_datasets",
    mutant=random_dataset_mutant,
    bases=dataset_bases,
    apply=apply_tree,
    entries=("loader", "loader-skip", "validate", "inspect", "trace", "trace-rank"),
    check=check_dataset,
)


if __name__ == "__main__":
    raise SystemExit(campaign_main(DATASETS))
