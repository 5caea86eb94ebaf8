"""Producers on a Ray cluster: ``zerobatch produce ... --engine ray``.

Importing this module imports Ray (``pip install 'zerobatch[ray]'``). :func:`produce_with_ray`
runs ``producers`` producers (``produce.py``) as Ray tasks, producer ``i`` under the id
``f"{producer_id}-{i}"`` with share ``i``. Nothing is coordinated beyond that: each task is an
ordinary producer appending to the live dataset, so every guarantee of one holds for each.

Failures and retries
    A task whose worker died (``os._exit``, a lost node) or that raised an ``OSError`` is
    retried by Ray up to ``max_retries`` times; the retry is a restart of the same producer
    (same id, same configuration), which resumes after its committed batches: nothing it
    committed is appended again, nothing it appended but did not commit is lost. Bad input
    (``IngestError``) fails the task, and the call, at once. The dataset must be reachable from
    every node (an object-store URL, or a directory on a shared mount), and so must the inputs.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from typing import Any

import ray

from ..errors import IngestError, ZeroBatchError
from ..stores.store import Store
from ..tokenization.resolve import load_tokenizer
from .produce import ProduceError, ProduceSummary, produce, share_of
from .source import Patterns

DEFAULT_MAX_RETRIES = 3
"""Retries of a producer task whose worker died or that raised an ``OSError``."""


def _run_producer(sources: list[str], dataset: str, options: dict[str, Any]) -> ProduceSummary:
    """One producer, in a Ray worker."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return produce(sources, dataset, **options)


def produce_with_ray(
    sources: Patterns,
    dataset: str | os.PathLike[str],
    *,
    producer_id: str,
    producers: int,
    address: str | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    cpus_per_producer: float = 1.0,
    **options: Any,
) -> list[ProduceSummary]:
    """Run ``producers`` producers of ``sources`` into ``dataset`` as Ray tasks and wait for
    them (see the module docstring); their summaries in producer order.

    ``options`` are ``produce``'s (``seq_len``, ``batch_size``, ``tokenizer``, ``epochs``,
    ...; a tokenizer is given as its spec string, which every worker loads). ``address`` is
    the cluster to join (``ray.init(address=...)``; default: ``RAY_ADDRESS`` or a new local
    cluster), left running if it was already initialised.
    """
    if isinstance(dataset, Store):
        raise IngestError("produce --engine ray takes the dataset as a URL or a path, not a Store")
    if not isinstance(options.get("tokenizer", "byte"), str):
        raise IngestError("produce --engine ray takes the tokenizer as a spec string")
    for key in ("index", "producer_id", "producers"):
        options.pop(key, None)
    n = int(producers)
    if n < 1:
        raise IngestError(f"producers must be at least 1, got {producers!r}")
    patterns = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    absolute = [_absolute(os.fspath(p)) for p in patterns]
    target = os.fspath(dataset)
    if "://" not in target:
        target = os.path.abspath(target)
    load_tokenizer(options.get("tokenizer", "byte"))  # a bad spec fails here, not in n tasks
    shares = share_of(
        absolute, n, text_field=options.get("text_field", "text"), format=options.get("format")
    )
    if not shares[-1]:
        raise ProduceError(
            f"{n} producers, but the inputs hold {sum(map(len, shares))} units (a parquet row "
            "group or a whole JSONL or text file each): run at most that many"
        )
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        task = ray.remote(_run_producer).options(
            max_retries=int(max_retries),
            retry_exceptions=[OSError],
            num_cpus=cpus_per_producer,
        )
        refs = [
            task.remote(
                absolute,
                target,
                {**options, "producer_id": f"{producer_id}-{i}", "producers": n, "index": i},
            )
            for i in range(n)
        ]
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, ZeroBatchError) else None
            if cause is not None:
                raise cause from None
            raise
    finally:
        if started:
            ray.shutdown()


def _absolute(pattern: str) -> str:
    """A path or glob pattern made absolute (workers may run elsewhere)."""
    if os.path.isabs(pattern):
        return pattern
    if glob.has_magic(pattern):
        return os.path.join(glob.escape(os.getcwd()), pattern)
    return os.path.abspath(pattern)


__all__: Sequence[str] = ["DEFAULT_MAX_RETRIES", "produce_with_ray"]
