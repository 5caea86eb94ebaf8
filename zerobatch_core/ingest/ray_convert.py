"""Text conversion on a Ray cluster: a Ray Data Datasink writes LLMBATCH output, committed once.

Importing this module imports Ray (``pip install 'zerobatch[ray]'``); nothing else in
``zerobatch_core`` does. :func:`convert_with_ray` (``zerobatch convert --engine ray``) runs the
local text pipeline (``ingest.text``: read, tokenize, pack) on a Ray cluster::

    units -> map_batches(TokenizeUnits) -> segments -> write_datasink(LLMBatchDatasink)

Units
    The input is cut into units fixed by the files alone: each parquet row group is one unit, and
    each JSONL or text file is one. Units are numbered in the local reading order (files in the
    order given, glob matches sorted, row groups in file order), so the unit number is each
    unit's place in the global document order, whatever the cluster.
Segments
    A worker actor (``TokenizeUnits``, one tokenizer per actor, rebuilt from its JSON
    description) reads one unit with the local readers, tokenizes it and lays it out as its
    part of the record stream: ``[bos, *doc0, bos, *doc1, ...]`` in ``pack`` mode (the packer's
    stream before it is cut into records), its padded records in ``pad`` mode. A row is a whole
    unit (``unit``: its number, ``tokens``: the segment as little-endian u32 bytes), so no
    block split can cut a unit.
The Datasink (:class:`LLMBatchDatasink`)
    ``write`` stores each segment atomically in a work directory (an object-store output: under
    a work prefix in the store) under a name made of the unit number, so a retried task
    rewrites the same file with the same bytes and nothing depends on which task wrote it.
    ``on_write_complete`` orders the units by number, places each segment in the global token
    stream (the sum of the lengths before it), cuts the stream into records of ``seq_len``
    tokens and the records into outputs by the local writer's rule (shard ``i`` holds records
    ``[i * shard_batches * batch_size, ...)``, permuted with ``shard_seed(seed, i)``), writes
    the outputs in parallel in Ray tasks (one per shard, each reading its token range from the
    segments), then writes ``checksums.xxh3`` and, last, ``manifest.json``, and removes the
    work directory. A job that fails removes the shards and segments it wrote, once every
    output task has ended (so that no put still in flight lands after the deletion), and never
    writes a manifest.

Determinism, and what is byte-identical to ``zerobatch convert``
    For the same input files (named in the same order), tokenizer, mode, ``pad_id``,
    ``seq_len``, ``batch_size``, ``shard_batches``, seed and ``dtype`` (``"auto"`` decides from
    the tokenizer as the local engine does: ``ingest.dtypes``), the output is byte-identical to the
    single-machine ``zerobatch convert``, whatever the number of Ray workers, the block sizes,
    the scheduling and the retries: every shard file (same records, same shard boundaries,
    same seeds, hence the same permutation), ``checksums.xxh3`` and ``manifest.json`` (the same
    sources with the same record ranges); without ``shard_batches``, the single LLMBATCH file.
    The segments depend only on the unit, and everything after them only on the segments in
    unit order. The same holds for an object-store output: its keys and their bytes are the
    local dataset directory's files. What differs: the run itself (time, memory, the temporary
    work directory ``.zerobatch-ray`` inside the output directory, or ``.NAME.zerobatch-ray``
    beside a single output file, or the work prefix ``.zerobatch-ray/`` below an object-store
    output, while the job runs), the summary's ``seconds``, failures (a lost worker or an
    ``OSError`` is retried; a ZeroBatch error raised in a task is re-raised as itself, others
    arrive wrapped by Ray), and the sources accepted (text only: ``.parquet``, ``.jsonl``,
    ``.json``, ``.txt``; nanoGPT shards and ``.npy`` arrays are tokens already).

Memory
    A tokenizer task holds one unit (a row group's documents and tokens, or one JSONL or text
    file: split very large JSONL files, or store them as parquet); a write task holds the
    segments Ray Data bundles for it (``WRITE_BUNDLE_BYTES``, 32 MiB, plus one unit); an output
    task holds the file writer's few ``CHUNK_BYTES`` (it knows its record count, so it never
    spills); the driver holds seven integers per unit and the checksums (8 bytes per batch).
    The disk holds the segments (4 bytes per token) until the commit, beside the output (an
    object-store output: the store holds them). An output task writing to an object store also
    holds its shard's bytes while it puts them, and its node's temporary directory
    (``TMPDIR``) holds the shard while it is written: size ``shard_batches`` accordingly.

Failures and retries
    Ray Data retries a task whose worker died (``os._exit``, a lost node) and, through
    :attr:`LLMBatchDatasink.remote_args`, one that raised an ``OSError`` (I/O errors are the
    transient kind), up to ``max_retries`` times; bad input data (``IngestError``) fails the job
    at once. Files appear only complete (``writer.py``): a task killed while writing a segment
    or a shard leaves nothing under the final name, and its retry writes it again. The output
    directory is checked before the job starts (``check_dataset_output``). Replacing a dataset
    (``overwrite``) is atomic, as in ``write_sharded_dataset``: the shards, checksums and
    manifest are written into a staging directory beside the old dataset, which is swapped
    with it in one step once committed, so the path holds the old dataset or the new one at
    every instant and a failed or killed job leaves the old one as it was. The inputs are read
    by path on the nodes: every node must see them at the same path (a shared mount, or a copy
    on each node); the tokenizer travels as its JSON description.

Object-store output
    ``output`` may be a URL that ``stores.resolve.open_store`` opens (``s3://bucket/prefix``,
    ``gs://``, ``az://``, ``http(s)://``; a ``file://`` URL is its local path): the dataset is
    written straight to the store, and no node needs a shared mount for it. It must be a
    dataset (``shard_batches``): a single LLMBATCH file would be put whole from one task's
    memory. The segments go into the store too, under the work prefix ``.zerobatch-ray/`` below
    the output (one object per unit, put atomically under its unit's key, so a retry behaves
    as locally), not into a local directory: the output task that reads a segment back may
    run on another node than the write task that stored it. An output task reads its token
    ranges with ranged GETs, writes its shard with the local file writer into a scratch
    directory on its node, puts the file's bytes under the shard's key (an atomic put: a task
    killed before its put completes leaves no object, and its retry puts the same bytes) and
    removes the scratch file. The driver then puts ``checksums.xxh3`` and, last,
    ``manifest.json``, their bytes built by ``commit_manifest`` exactly as for a local dataset,
    and deletes the work prefix. A job that fails deletes the shards and the checksums it put
    and the work prefix; a job whose driver is killed outright may leave shards and segments,
    never a manifest (the next job to the URL deletes the segments, and replaces the shards
    with ``overwrite``).

    A dataset already at the URL (it has a ``manifest.json``) is refused, with ``overwrite``
    too: an object store cannot replace many objects in one step, so a dataset replaced in
    place would let a reader that had read the old manifest fetch new shards under the old
    names, and a job failing halfway would leave neither dataset. Delete it first (its
    ``manifest.json`` first), or write to a new prefix. ``overwrite`` only replaces what an
    unfinished job left (shard objects without a manifest), which is refused otherwise. One job
    at a time may write to a URL, as to a directory. Every node opens the store from its own
    environment (credentials, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...): give each node the
    same, by its instance role or configuration, or with ``ray.init(runtime_env={"env_vars":
    {...}})`` where the cluster's runtime environment may hold them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import ray
import ray.data
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import WriteResult
from zerobatch_spec import DTYPE_NAMES, DTYPE_UINT32
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME, Manifest, Shard, Source
from zerobatch_spec.dataset import shard_seed as dataset_shard_seed
from zerobatch_spec.layout import TOKEN_BYTES, TOKEN_DTYPE

from ..arguments import U32_MAX, int_arg
from ..datasets.build import (
    SHARD_NAME,
    SHARD_PATTERN,
    check_dataset_output,
    commit_manifest,
    describe_shard,
    shard_file_names,
    sharded_writer_drops,
)
from ..datasets.dataset import slot_checksums
from ..datasets.replace import StagedReplacement, remove_stale_staging
from ..errors import IngestError, WriteError, ZeroBatchError
from ..files.reader import BatchFileReader
from ..files.writer import (
    CHUNK_BYTES,
    DtypeArg,
    check_output,
    token_dtype_code,
    write_batch_dataset,
    write_bytes_atomic,
)
from ..redaction import redact
from ..stores.resolve import open_store
from ..stores.store import Store, is_url, join_url
from ..tokenization import DEFAULT_BATCH_DOCS, import_optional, tokenize_documents
from ..tokenization.descriptions import read_description
from ..tokenization.resolve import tokenizer_from_json
from ..tokenization.tiktoken_files import TiktokenTokenizer
from .convert import ConvertSummary, conversion_drops, detect_kind, plural
from .dtypes import DtypePlan, plan_dtype
from .packing import Mode, PackingStats, pad_records
from .text import DEFAULT_BATCH_ROWS, TextSource
from .units import InputFile, Unit, plan_units, unit_documents

if TYPE_CHECKING:
    from ray.data._internal.execution.interfaces import TaskContext

WORK_DIR_NAME = ".zerobatch-ray"
"""The work directory inside a dataset output (``.NAME.zerobatch-ray`` beside a file output)."""

WORK_PREFIX = f"{WORK_DIR_NAME}/"
"""The work prefix below an object-store output: the segments' keys start with it."""

DELETE_THREADS = 16
"""Concurrent deletes when the work prefix of an object-store output is removed (one request
per object)."""

SEGMENTS_PER_DIRECTORY = 1000
"""Segments per subdirectory of the work directory: every atomic write lists its directory
(``writer.remove_stale_temporaries``), so no directory may grow with the corpus."""

WRITE_BUNDLE_BYTES = 4 * CHUNK_BYTES
"""Bytes of segments one write task stores at least (the last task of a job may store less)."""

DEFAULT_MAX_RETRIES = 3
"""Retries of a task that raised an ``OSError`` or whose worker died, before the job fails."""

_COUNT_COLUMNS = (
    "documents",
    "doc_tokens",
    "padding_tokens",
    "truncated_documents",
    "truncated_tokens",
)
"""Optional integer columns of a segment row, summed into the packing statistics."""

# --- tokenization -------------------------------------------------------------------------------


class TokenizeUnits:
    """A Ray Data ``map_batches`` class: unit rows in, one segment row per unit out.

    Each actor builds its tokenizer once from ``tokenizer``, the tokenizer's JSON description
    (``Tokenizer.to_json()``): plain data, never a serialized object. A batch of unit rows
    (``unit``, ``path``, ``format``, ``part``) becomes a pyarrow table with the columns
    :class:`LLMBatchDatasink` reads: ``unit``, ``tokens`` (the segment, little-endian u32
    bytes) and the counts of :data:`_COUNT_COLUMNS`.
    """

    def __init__(
        self,
        tokenizer: str,
        seq_len: int,
        *,
        mode: Mode = "pack",
        pad_id: int | None = None,
        text_field: str = "text",
        per_line: bool = False,
        batch_docs: int = DEFAULT_BATCH_DOCS,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one CPU per actor: actors scale
        self.tokenizer = tokenizer_from_json(tokenizer)
        if isinstance(self.tokenizer, TiktokenTokenizer):
            self.tokenizer.num_threads = 1
        if mode == "pad" and pad_id is None:
            raise IngestError("mode='pad' needs a pad_id")
        self.seq_len, self.mode, self.pad_id = seq_len, mode, pad_id
        self.text_field, self.per_line = text_field, per_line
        self.batch_docs, self.batch_rows = batch_docs, batch_rows

    def documents(self, path: str, format: str, part: int) -> Iterator[str]:
        """The documents of one unit, read by the local readers (same order, same errors)."""
        return unit_documents(
            path, format, part, self.text_field, per_line=self.per_line, batch_rows=self.batch_rows
        )

    def segment(self, docs: Iterable[str]) -> tuple[npt.NDArray[np.uint32], dict[str, int]]:
        """One unit's part of the record stream, and its counts."""
        tok = self.tokenizer
        ids = tokenize_documents(docs, tok, 1, self.batch_docs)
        counts = dict.fromkeys(_COUNT_COLUMNS, 0)
        if self.mode == "pad":
            assert self.pad_id is not None
            blocks = pad_records(ids, self.seq_len, tok.bos_id, self.pad_id)
            parts = [b.reshape(-1) for b in blocks]
            stats = blocks.stats
            counts.update(
                documents=stats.documents,
                doc_tokens=stats.tokens,
                padding_tokens=stats.padding_tokens,
                truncated_documents=stats.truncated_documents,
                truncated_tokens=stats.truncated_tokens,
            )
        else:
            bos = np.array([tok.bos_id], dtype=np.uint32)
            parts = []
            for doc in ids:
                parts += [bos, doc]
                counts["documents"] += 1
                counts["doc_tokens"] += int(doc.size)
        stream = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
        return stream.astype(TOKEN_DTYPE, copy=False), counts

    def __call__(self, batch: dict[str, npt.NDArray[Any]]) -> Any:
        pa = import_optional("pyarrow", "Ray Data blocks")
        units: list[int] = []
        segments: list[npt.NDArray[np.uint32]] = []
        counts: dict[str, list[int]] = {k: [] for k in _COUNT_COLUMNS}
        for unit, path, fmt, part in zip(
            batch["unit"], batch["path"], batch["format"], batch["part"], strict=True
        ):
            stream, c = self.segment(self.documents(str(path), str(fmt), int(part)))
            units.append(int(unit))
            segments.append(stream)
            for k in _COUNT_COLUMNS:
                counts[k].append(c[k])
        sizes = np.array([0] + [s.nbytes for s in segments], dtype=np.int64)
        data = np.concatenate(segments) if segments else np.empty(0, dtype=TOKEN_DTYPE)
        tokens = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(),
            len(segments),
            [None, pa.py_buffer(np.cumsum(sizes)), pa.py_buffer(data)],
        )
        columns = {"unit": pa.array(units, pa.int64()), "tokens": tokens}
        columns.update({k: pa.array(v, pa.int64()) for k, v in counts.items()})
        return pa.table(columns)


# --- the Datasink -------------------------------------------------------------------------------


@dataclass
class SinkResult:
    """What an :class:`LLMBatchDatasink` committed."""

    records: int
    """Records cut from the token stream (the output holds the whole batches of them)."""
    batches: int
    stream_tokens: int
    """Tokens of all segments (BOS and padding included)."""
    units: int
    counts: dict[str, int]
    """The sums of the segments' count columns."""
    output_bytes: int
    manifest: Manifest | None
    """The committed manifest; ``None`` for a single-file output."""


def _segment_name(unit: int) -> str:
    """A segment's name in the work directory, ``/``-separated (a key below the work prefix)."""
    return f"{unit // SEGMENTS_PER_DIRECTORY:07d}/{unit:010d}.u32"


def _local_path(output: str) -> str | None:
    """The local path ``output`` names (itself, or a ``file://`` URL's path); ``None`` for an
    object-store URL."""
    if not is_url(output):
        return output
    if output.lower().startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(output).path)
    return None


class LLMBatchDatasink(Datasink[str]):
    """Writes segment rows (``unit``, ``tokens``) as a dataset of LLMBATCH shards, or one file.

    Each row is one unit's part of the record stream: ``unit`` its place in the global order
    (distinct non-negative integers), ``tokens`` its tokens as little-endian u32 bytes (for
    packed text ``[bos, *doc0, bos, *doc1, ...]``, as :class:`TokenizeUnits` writes it; for
    records of ``seq_len`` tokens, the records one after another). The stream is the segments
    in unit order; record ``r`` is its tokens ``[r * seq_len, (r + 1) * seq_len)``; the final
    partial record is dropped. Rows may carry the integer columns of :data:`_COUNT_COLUMNS`,
    which are summed into :attr:`result`.

    With ``shard_batches`` the output ``path`` is a dataset directory written as
    ``write_sharded_dataset`` writes it, or an object-store URL (``s3://bucket/prefix``: the
    same objects, see the module docstring); without, the single LLMBATCH file ``path``. ``files``
    (each input file and its first unit) gives the manifest's sources, as the local
    conversion counts them (a record belongs to the file of its first token). With
    ``num_units``, the commit checks that units ``0 .. num_units - 1`` all arrived. Every
    output stores its tokens as ``dtype`` (``"uint32"`` or ``"uint16"``, or a dtype code),
    recorded in the manifest; a token it cannot hold fails the job, naming it.

    Use it with the retry arguments it needs::

        sink = LLMBatchDatasink("out/train", seq_len=2048, batch_size=16, shard_batches=1000)
        segments.write_datasink(sink, ray_remote_args=sink.remote_args)
        print(sink.result)

    See the module docstring for the commit protocol, determinism and memory.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        shard_batches: int | None = None,
        files: Sequence[InputFile] = (),
        num_units: int | None = None,
        overwrite: bool = False,
        allow_empty: bool = False,
        max_retries: int = DEFAULT_MAX_RETRIES,
        concurrency: int | None = None,
        inputs: Sequence[str] = (),
        dtype: DtypeArg = "uint32",
    ) -> None:
        text = os.fspath(path)
        if "://" in text and not is_url(text):
            open_store(text)  # raises: a URL scheme ZeroBatch does not open, named
        local = _local_path(text)
        self.url = None if local is not None else text.rstrip("/")
        """The object-store output's URL (``None``: a local output); ``path`` shows it."""
        self.path = os.path.abspath(local) if local is not None else redact(text.rstrip("/"))
        self._store: Store | None = None
        self.seq_len = int_arg("seq_len", seq_len, 1, U32_MAX, WriteError)
        self.batch_size = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
        self.seed = int_arg("seed", seed, 0, U32_MAX, WriteError)
        self.shard_batches = (
            None
            if shard_batches is None
            else int_arg("shard_batches", shard_batches, 1, U32_MAX // self.batch_size, WriteError)
        )
        self.files = tuple(files)
        self.num_units = None if num_units is None else int_arg("num_units", num_units, 0)
        self.overwrite, self.allow_empty = overwrite, allow_empty
        self.max_retries = int_arg("max_retries", max_retries, 0)
        self.concurrency = None if concurrency is None else int_arg("concurrency", concurrency, 1)
        self.inputs = tuple(os.fspath(p) for p in inputs)
        code = token_dtype_code(dtype)
        self.dtype: int = DTYPE_UINT32 if code is None else code
        """The dtype code of every output's tokens."""
        if self.url is not None:
            if self.shard_batches is None:
                raise WriteError(
                    f"{self.path}: an object-store output is a dataset: pass shard_batches "
                    "(--shard-size on the command line); a single LLMBATCH file is written to a "
                    "local path"
                )
            self.work_dir = join_url(self.path, WORK_DIR_NAME)
        elif self.shard_batches is None:
            head, name = os.path.split(self.path)
            self.work_dir = os.path.join(head, f".{name}{WORK_DIR_NAME}")
        else:
            self.work_dir = os.path.join(self.path, WORK_DIR_NAME)
        self.out_dir = self.path if self.shard_batches is not None else os.path.dirname(self.path)
        """Where the outputs are written: the dataset directory, or its staging directory while
        it replaces a dataset (``_commit``)."""
        self.result: SinkResult | None = None

    def __getstate__(self) -> dict[str, Any]:
        """The sink as it travels to Ray workers: without its open store (each process opens
        its own, from its own environment)."""
        return {**self.__dict__, "_store": None}

    @property
    def store(self) -> Store:
        """The object store of an object-store output, opened once per process."""
        if self._store is None:
            if self.url is None:
                raise WriteError(f"{self.path}: a local output has no object store")
            self._store = open_store(self.url)
        return self._store

    # -- the Ray Data protocol -------------------------------------------------------------------

    @property
    def remote_args(self) -> dict[str, Any]:
        """``ray_remote_args`` for ``write_datasink``. The write tasks only store segments (I/O),
        so they reserve no CPU: tokenizer actors holding every CPU never starve them. An
        ``OSError`` is retried like a lost worker, up to ``max_retries`` times."""
        return {"num_cpus": 0, **self._retry_args()}

    @property
    def min_bytes_per_write(self) -> int:
        """Segments gathered into one write task (Ray Data bundles blocks up to this size): a
        write task per unit would start a fresh worker process for most units, since the write
        tasks reserve no CPU and Ray stops their idle workers within a second."""
        return WRITE_BUNDLE_BYTES

    def _retry_args(self) -> dict[str, Any]:
        retried = [OSError, ray.exceptions.RaySystemError]
        return {"max_retries": self.max_retries, "retry_exceptions": retried}

    def check_target(self) -> None:
        """The output checks of the local conversion (``check_dataset_output`` or
        ``check_output``; an object-store output: ``check_store_target``), made before anything
        is written."""
        if self.url is not None:
            self.check_store_target()
        elif self.shard_batches is None:
            check_output(self.path, overwrite=self.overwrite, inputs=self.inputs)
        else:
            check_dataset_output(self.path, overwrite=self.overwrite, inputs=self.inputs)

    def check_store_target(self) -> None:
        """Refuse, with a ``WriteError`` naming the URL, a dataset at the object-store output
        (with ``overwrite`` too: the module docstring says why), and shard objects an
        unfinished job left there unless ``overwrite``."""
        if self.store.exists(MANIFEST_NAME):
            raise WriteError(
                f"{self.path}: already a dataset (it has a {MANIFEST_NAME}), and a dataset at a "
                "URL is never replaced, overwrite=True or not: an object store cannot replace "
                f"its objects in one step; delete it first ({MANIFEST_NAME} first), or write to "
                "a new prefix"
            )
        leftovers = self._shard_keys()
        if leftovers and not self.overwrite:
            raise WriteError(
                f"{self.path}: holds shard objects ({leftovers[0]}, ...) but no {MANIFEST_NAME}, "
                "left by an unfinished write; pass overwrite=True (--overwrite on the command "
                "line) to replace them"
            )

    def _shard_keys(self) -> list[str]:
        """The shard objects right below the object-store output named as
        ``write_sharded_dataset`` names shards, sorted (a store lists by key prefix only)."""
        return [k for k in self.store.list_keys() if SHARD_NAME.match(k)]

    def on_write_start(self, schema: Any = None) -> None:
        """Check the output and start an empty work directory (a dead job's is removed)."""
        self.check_target()
        if self.url is not None:
            self._remove_work()
            return
        if self.shard_batches is not None:
            os.makedirs(self.path, exist_ok=True)
        shutil.rmtree(self.work_dir, ignore_errors=True)
        os.makedirs(self.work_dir)

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> str:
        """Store every segment of ``blocks``; return their units, lengths and counts (JSON)."""
        entries: list[list[int]] = []
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            names = set(table.column_names)
            missing = {"unit", "tokens"} - names
            if missing:
                raise WriteError(
                    f"{self.path}: segment rows need the columns 'unit' and 'tokens'; "
                    f"missing {sorted(missing)} (columns: {sorted(names)})"
                )
            units = table.column("unit").to_pylist()
            tokens = table.column("tokens")
            counts = [
                table.column(k).to_pylist() if k in names else [0] * len(units)
                for k in _COUNT_COLUMNS
            ]
            for i, unit in enumerate(units):
                data = tokens[i].as_py()
                if not isinstance(unit, int) or unit < 0:
                    raise WriteError(f"{self.path}: unit must be a non-negative integer: {unit!r}")
                if not isinstance(data, bytes) or len(data) % TOKEN_BYTES:
                    raise WriteError(
                        f"{self.path}: unit {unit}: tokens must be little-endian u32 bytes, got "
                        f"{type(data).__name__} of {len(data) if data is not None else 0} bytes"
                    )
                self.store_segment(unit, data)
                entries.append([unit, len(data) // TOKEN_BYTES, *(int(c[i]) for c in counts)])
        return json.dumps(entries)

    def store_segment(self, unit: int, data: bytes) -> None:
        """Write one unit's segment, atomically, under the name its number gives."""
        if self.url is not None:
            self.store.write(WORK_PREFIX + _segment_name(unit), data)
            return
        path = os.path.join(self.work_dir, *_segment_name(unit).split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_bytes_atomic(path, data, overwrite=True)

    def _remove_work(self) -> None:
        """Remove the work directory, or the work prefix of an object-store output (a failure
        to is logged, never raised: it must not hide the job's own outcome)."""
        if self.url is None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            return
        try:
            keys = self.store.list_keys(WORK_PREFIX)
            with ThreadPoolExecutor(DELETE_THREADS) as pool:
                list(pool.map(self.store.delete, keys))
        except OSError as e:
            logging.getLogger(__name__).warning(
                "%s: the work prefix could not be removed (delete it by hand): %s",
                self.work_dir,
                e,
            )

    def on_write_complete(self, write_result: WriteResult[str]) -> None:
        """Cut the records, write every output, then commit (module docstring)."""
        try:
            self.result = self._commit([json.loads(r) for r in write_result.write_returns])
        except BaseException:
            self._discard()
            raise
        finally:
            self._remove_work()

    def on_write_failed(self, error: Exception) -> None:
        """Remove the segments, and any shard this job wrote (no manifest names them)."""
        self._discard()
        self._remove_work()

    # -- the commit ------------------------------------------------------------------------------

    def _units(self, returns: list[list[list[int]]]) -> npt.NDArray[np.int64]:
        """``[unit, tokens, *counts]`` per unit, sorted by unit; duplicates and gaps refused."""
        width = 2 + len(_COUNT_COLUMNS)
        rows = [e for r in returns for e in r]
        table = np.array(rows, dtype=np.int64).reshape(-1, width)
        table = table[np.argsort(table[:, 0], kind="stable")]
        repeated = table[1:, 0][table[1:, 0] == table[:-1, 0]]
        if repeated.size:
            raise WriteError(
                f"{self.path}: unit {int(repeated[0])} arrived in more than one row; every unit "
                "must be one row"
            )
        if self.num_units is not None and not np.array_equal(
            table[:, 0], np.arange(self.num_units)
        ):
            got = set(table[:, 0].tolist())
            lost = next((u for u in range(self.num_units) if u not in got), None)
            raise WriteError(
                f"{self.path}: expected units 0 to {self.num_units - 1}, got {len(got)} units"
                + (f" (unit {lost} is missing)" if lost is not None else " (unknown units)")
            )
        return table

    def _plans(self, units: npt.NDArray[np.int64], records: int) -> list[dict[str, Any]]:
        """One plan per output: its name, records, seed and the segment pieces it reads."""
        t = self.seq_len
        starts = np.concatenate([[0], np.cumsum(units[:, 1])]).astype(np.int64)
        if self.shard_batches is None:
            bounds = [(0, records, self.seed, os.path.basename(self.path))]
        else:
            per = self.shard_batches * self.batch_size
            bounds = [
                (
                    i * per,
                    min(per, records - i * per),
                    dataset_shard_seed(self.seed, i),
                    SHARD_PATTERN.format(i),
                )
                for i in range(-(-records // per))
            ]
        plans = []
        for index, (first, count, seed, name) in enumerate(bounds):
            lo, hi = first * t, (first + count) * t
            pieces = []
            u = int(np.searchsorted(starts, lo, side="right")) - 1
            while lo < hi:
                take = min(hi, int(starts[u + 1])) - lo
                if take > 0:
                    pieces.append([int(units[u, 0]), lo - int(starts[u]), take])
                lo += take
                u += 1
            plans.append(
                {
                    "index": index,
                    "name": name,
                    "first": first,
                    "records": count,
                    "seed": seed,
                    "pieces": pieces,
                }
            )
        return plans

    def _commit(self, returns: list[list[list[int]]]) -> SinkResult:
        units = self._units(returns)
        total = int(units[:, 1].sum())
        records = total // self.seq_len
        batches_possible = records // self.batch_size
        if batches_possible == 0 and not self.allow_empty:
            what = "dataset" if self.shard_batches is not None else "output"
            raise WriteError(
                f"{self.path}: the {what} would hold 0 batches: {plural(records, 'record')} of "
                f"{self.seq_len} tokens, fewer than batch_size={self.batch_size}; pass "
                "allow_empty=True (--allow-empty on the command line) to write it anyway"
            )
        self.check_target()
        if self.url is not None:
            return self._commit_outputs(units, records, total, None)
        stage: StagedReplacement | None = None
        if self.shard_batches is not None:
            os.makedirs(self.path, exist_ok=True)
            remove_stale_staging(self.path)
            if self.overwrite and os.path.lexists(os.path.join(self.path, MANIFEST_NAME)):
                stage = StagedReplacement(self.path, sharded_writer_drops(self.path))
                self.out_dir = stage.path
        try:
            return self._commit_outputs(units, records, total, stage)
        except BaseException:
            if stage is not None:  # the uncommitted outputs go with the staging directory
                stage.discard()
                self._planned: list[str] = []  # (the old dataset's files are not theirs)
            raise
        finally:
            if stage is not None:
                self.out_dir = self.path

    def _commit_outputs(
        self,
        units: npt.NDArray[np.int64],
        records: int,
        total: int,
        stage: StagedReplacement | None,
    ) -> SinkResult:
        """Write the outputs into ``self.out_dir``, then commit them (and swap in ``stage``)."""
        plans = self._plans(units, records)
        self._planned = [p["name"] for p in plans]
        written = self._write_outputs(plans)
        counts = {k: int(units[:, 2 + i].sum()) for i, k in enumerate(_COUNT_COLUMNS)}
        if self.shard_batches is None:
            batches = int(written[0]["batches"])
            return SinkResult(
                records, batches, total, len(units), counts, os.path.getsize(self.path), None
            )
        shards = [_shard_from_json(w["shard"]) for w in written]
        checksums = [np.frombuffer(w["checksums"], dtype="<u8") for w in written]
        if self.url is not None:
            manifest, size = self._commit_to_store(shards, checksums, self._sources(units, records))
            return SinkResult(
                records, manifest.num_batches, total, len(units), counts, size, manifest
            )
        manifest = commit_manifest(
            self.out_dir,
            shards,
            checksums,
            self.batch_size,
            self.seq_len,
            self.seed,
            self._sources(units, records),
            self.overwrite and stage is None,
            dtype=self.dtype,
        )
        if stage is not None:
            stage.commit()  # the new dataset replaces the old one in one step
        self._planned = []  # committed: the shards are the dataset's now
        if stage is None:
            kept = {s.name for s in shards}
            for name in shard_file_names(self.path):
                if name not in kept:  # shards an unfinished write left (there was no manifest)
                    os.unlink(os.path.join(self.path, name))
        size = sum(s.size for s in shards)
        size += sum(
            os.path.getsize(os.path.join(self.path, n)) for n in (MANIFEST_NAME, CHECKSUMS_NAME)
        )
        return SinkResult(records, manifest.num_batches, total, len(units), counts, size, manifest)

    def _commit_to_store(
        self, shards: list[Shard], checksums: list[npt.NDArray[np.uint64]], sources: list[Source]
    ) -> tuple[Manifest, int]:
        """Put the checksums, then the manifest (last), into the object store; remove the shard
        objects an unfinished job left that the new dataset does not hold. Returns the manifest
        and the dataset's bytes.

        ``commit_manifest`` builds both files in a local scratch directory, so their bytes are
        a local dataset's by construction.
        """
        with tempfile.TemporaryDirectory(prefix="zerobatch-ray-commit-") as scratch:
            manifest = commit_manifest(
                scratch,
                shards,
                checksums,
                self.batch_size,
                self.seq_len,
                self.seed,
                sources,
                False,
                dtype=self.dtype,
            )
            files = {}
            for name in (CHECKSUMS_NAME, MANIFEST_NAME):
                with open(os.path.join(scratch, name), "rb") as f:
                    files[name] = f.read()
        store = self.store
        if store.exists(MANIFEST_NAME):
            self._planned = []  # the shards now belong to whoever committed that manifest
            raise WriteError(
                f"{self.path}: a {MANIFEST_NAME} appeared while this job ran (another job writes "
                "to this URL?); nothing was committed"
            )
        self._planned.append(CHECKSUMS_NAME)
        store.write(CHECKSUMS_NAME, files[CHECKSUMS_NAME])
        try:
            store.write(MANIFEST_NAME, files[MANIFEST_NAME])
        except BaseException:
            committed = True  # unknown: keep the shards rather than break a committed dataset
            with contextlib.suppress(OSError):
                committed = store.exists(MANIFEST_NAME)  # a put that took, its answer lost
            if committed:
                self._planned = []
            raise
        self._planned = []  # committed: the shards are the dataset's now
        kept = {s.name for s in shards}
        for key in self._shard_keys():
            if key not in kept:  # shards an unfinished write left (there was no manifest)
                store.delete(key)
        return manifest, sum(s.size for s in shards) + sum(len(d) for d in files.values())

    def _sources(self, units: npt.NDArray[np.int64], records: int) -> list[Source]:
        """Each input file's range of records: those whose first token lies in its units."""
        if not self.files:
            return []
        starts = np.concatenate([[0], np.cumsum(units[:, 1])]).astype(np.int64)
        position = {int(u): i for i, u in enumerate(units[:, 0])}
        t = self.seq_len
        begins = []
        for f in self.files:
            i = position.get(f.first_unit, len(units))
            begins.append(min(-(-int(starts[i]) // t), records))
        ends = [*begins[1:], records]
        return [
            Source(os.path.abspath(f.path), (a, z))
            for f, a, z in zip(self.files, begins, ends, strict=True)
        ]

    def _write_outputs(self, plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Write every planned output in a Ray task of its own (at most ``concurrency`` at a
        time, the same retries as the segments' write tasks); the results in plan order.

        When one fails for good, every other task is let finish (its last retry included)
        before the error reaches the caller, who then deletes the outputs: a put still in flight
        would otherwise land after the deletion and leave a shard no manifest names.
        """
        if not plans:
            return []
        task = ray.remote(num_cpus=1, **self._retry_args())(_write_output)
        window = len(plans) if self.concurrency is None else min(self.concurrency, len(plans))
        pending: list[ray.ObjectRef[dict[str, Any]]] = []
        rows: list[dict[str, Any]] = []
        try:
            for plan in plans:
                if len(pending) >= max(1, window):
                    done, pending = ray.wait(pending, num_returns=1)
                    rows.extend(ray.get(done))
                pending.append(task.remote(self, plan))
            rows.extend(ray.get(pending))
            pending = []
        except BaseException as e:
            if not isinstance(e, Exception):  # interrupted: stop the tasks rather than wait
                for ref in pending:
                    ray.cancel(ref, force=True)
            if pending:
                ray.wait(pending, num_returns=len(pending))
            raise
        rows.sort(key=lambda r: int(r["index"]))
        if [int(r["index"]) for r in rows] != list(range(len(plans))):
            raise WriteError(
                f"{self.path}: the output tasks returned {len(rows)} results for "
                f"{len(plans)} outputs"
            )
        return rows

    def write_output(self, plan: dict[str, Any]) -> dict[str, Any]:
        """Write one planned output (a shard, or the single file) from the segments.

        Runs in a Ray task; returns plain data: the shard's manifest entry (JSON) and its
        slot checksums (bytes), or the file's batch count. A shard of an object-store output is
        written into a scratch directory on this node, then put into the store.
        """
        if self.url is None:
            return self._write_output_file(plan, os.path.join(self.out_dir, plan["name"]))
        with tempfile.TemporaryDirectory(prefix="zerobatch-ray-shard-") as scratch:
            target = os.path.join(scratch, plan["name"])
            result = self._write_output_file(plan, target)
            with open(target, "rb") as f:
                data = f.read()
        self.store.write(plan["name"], data)
        return result

    def _write_output_file(self, plan: dict[str, Any], target: str) -> dict[str, Any]:
        """Write one planned output as the LLMBATCH file ``target``; ``write_output``'s result."""
        count, first = int(plan["records"]), int(plan["first"])
        batches = write_batch_dataset(
            target,
            self.output_records(plan),
            count,
            self.batch_size,
            self.seq_len,
            int(plan["seed"]),
            overwrite=True,  # a retry replaces a file its dead attempt completed
            allow_empty=True,
            dtype=self.dtype,
        )
        if self.shard_batches is None:
            return {"index": plan["index"], "batches": batches, "shard": "", "checksums": b""}
        with BatchFileReader(target) as reader:
            shard = describe_shard(reader, plan["name"], (first, first + count))
            sums = slot_checksums(reader).astype("<u8").tobytes()
        return {
            "index": plan["index"],
            "batches": batches,
            "shard": _shard_json(shard),
            "checksums": sums,
        }

    def output_records(self, plan: dict[str, Any]) -> Iterator[npt.NDArray[np.uint32]]:
        """The records of one output as ``[k, seq_len]`` blocks of about ``CHUNK_BYTES``, read
        piece by piece from the segments with positioned reads."""
        t = self.seq_len
        per = max(1, CHUNK_BYTES // (t * TOKEN_BYTES)) * t  # tokens per block
        pending: list[npt.NDArray[np.uint32]] = []
        have = 0
        for unit, start, length in plan["pieces"]:
            with self._segment(int(unit)) as (path, read):
                for at in range(0, int(length), per):
                    n = min(per, int(length) - at)
                    data = read((int(start) + at) * TOKEN_BYTES, n * TOKEN_BYTES)
                    if len(data) != n * TOKEN_BYTES:
                        raise WriteError(
                            f"{path}: segment of unit {unit} is shorter than its write task "
                            f"reported (expected {n * TOKEN_BYTES:,} bytes at token "
                            f"{int(start) + at:,}, got {len(data):,}): the work directory was "
                            "changed during the job"
                        )
                    pending.append(np.frombuffer(data, dtype=TOKEN_DTYPE).astype(np.uint32))
                    have += n
                    if have >= per:
                        buf = np.concatenate(pending)
                        full = have // per * per
                        for r0 in range(0, full, per):
                            yield buf[r0 : r0 + per].reshape(-1, t)
                        pending, have = [buf[full:]], have - full
        if have:
            yield np.concatenate(pending).reshape(-1, t)

    @contextlib.contextmanager
    def _segment(self, unit: int) -> Iterator[tuple[str, Callable[[int, int], bytes]]]:
        """Where unit ``unit``'s segment lies (for messages), and a function reading ``size``
        bytes of it at ``offset``: positioned reads of its file, or ranged reads of its object
        in the store."""
        name = _segment_name(unit)
        if self.url is not None:
            store, key = self.store, WORK_PREFIX + name

            def read_range(offset: int, size: int) -> bytes:
                return store.read_ranges(key, [(offset, offset + size)])[0]

            yield store.where(key), read_range
            return
        path = os.path.join(self.work_dir, *name.split("/"))
        with open(path, "rb") as f:
            fd = f.fileno()
            yield path, lambda offset, size: os.pread(fd, size, offset)

    def _discard(self) -> None:
        """Remove the outputs this job wrote but did not commit (and, on an object store, the
        checksums it put)."""
        for name in getattr(self, "_planned", []):
            if self.url is not None:
                with contextlib.suppress(OSError):  # must not hide the job's own error
                    self.store.delete(name)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.out_dir, name))
        self._planned = []


def _write_output(sink: LLMBatchDatasink, plan: dict[str, Any]) -> dict[str, Any]:
    """The Ray task of one planned output: ``sink.write_output(plan)``."""
    return sink.write_output(plan)


def _shard_json(shard: Shard) -> str:
    return json.dumps(dataclasses.asdict(shard))


def _shard_from_json(text: str) -> Shard:
    d = json.loads(text)
    records = None if d["records"] is None else (int(d["records"][0]), int(d["records"][1]))
    return Shard(**{**d, "records": records})


# --- the pipeline -------------------------------------------------------------------------------


def segments_dataset(
    units: Sequence[Unit],
    tokenizer: str,
    seq_len: int,
    *,
    mode: Mode = "pack",
    pad_id: int | None = None,
    text_field: str = "text",
    per_line: bool = False,
    workers: int = 1,
    cpus_per_worker: float = 1.0,
) -> ray.data.Dataset:
    """The segment rows of ``units`` (lazy): one block per unit, read and tokenized by a pool of
    ``workers`` :class:`TokenizeUnits` actors of ``cpus_per_worker`` CPUs each, built from the
    tokenizer's JSON description ``tokenizer``. Write them with :class:`LLMBatchDatasink`."""
    ds_units = max(1, len(units))  # an actor per unit at most
    ds = ray.data.from_items([u.row() for u in units], override_num_blocks=ds_units)
    return ds.map_batches(
        TokenizeUnits,
        fn_constructor_args=(tokenizer, seq_len),
        fn_constructor_kwargs={
            "mode": mode,
            "pad_id": pad_id,
            "text_field": text_field,
            "per_line": per_line,
        },
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=min(int_arg("workers", workers, 1), ds_units)),
        num_cpus=cpus_per_worker,
    )


def _zerobatch_cause(error: BaseException) -> BaseException | None:
    """The ZeroBatch error a Ray task raised, found inside Ray's wrappers (``RayTaskError``
    keeps the task's exception as ``cause``), or ``None``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ray.exceptions.RayTaskError):
            todo.append(e.cause)  # itself an instance of the cause's class, with Ray's message
        elif isinstance(e, ZeroBatchError):
            return e
        todo += [e.__cause__, e.__context__]
    return None


def convert_with_ray(
    sources: Sequence[str],
    output: str,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    tokenizer: str = "byte",
    mode: Mode = "pack",
    pad_id: int | None = None,
    text_field: str = "text",
    per_line: bool = False,
    shard_batches: int | None = None,
    overwrite: bool = False,
    allow_empty: bool = False,
    workers: int | None = None,
    cpus_per_worker: float = 1.0,
    address: str | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    show_progress: bool = True,
    kind: str | None = None,
    dtype: str = "auto",
) -> ConvertSummary:
    """``convert`` of text sources on a Ray cluster: the same output, byte for byte.

    Arguments are ``convert``'s (``text_field``, ``per_line``, ``mode``, ``pad_id``,
    ``tokenizer``, ``shard_batches``, ...), plus:

    - ``output``: also, with ``shard_batches``, an object-store URL (``s3://bucket/prefix``,
      ``gs://``, ``az://``, ...), written straight to the store by the tasks that make it,
      byte for byte the local dataset; a dataset already there is refused, ``overwrite`` or
      not (module docstring, "Object-store output");
    - ``workers``: tokenizer actors (default: the cluster's CPUs divided by
      ``cpus_per_worker``, at least one), each reserving ``cpus_per_worker`` CPUs; also the
      most write and output tasks at a time;
    - ``address``: the cluster to join (``ray.init(address=...)``; default: the one this
      process is connected to, else ``RAY_ADDRESS``, else a new local cluster, shut down at
      the end);
    - ``max_retries``: per task; ``show_progress``: Ray Data's progress display;
    - ``dtype``: as ``convert`` takes it; ``"auto"`` decides from the tokenizer's ids before
      the job starts, as the local engine does, so the output is the same.

    Everything is checked before the cluster does any work: sources, tokenizer, options, the
    output, and the parquet files' columns.
    """
    t = int_arg("seq_len", seq_len, 1, U32_MAX, IngestError)
    b = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    paths = [os.fspath(s) for s in sources]
    found = kind or detect_kind(paths)
    if found != "text":
        raise IngestError(
            f"the Ray engine converts text (.parquet, .jsonl, .json, .txt), not {found} sources; "
            "nanoGPT shards and .npy arrays are tokens already: convert them with the local engine"
        )
    src = TextSource(
        paths, tokenizer, t, field=text_field, per_line=per_line, mode=mode, pad_id=pad_id
    )
    plan = plan_dtype(src, dtype)
    if mode == "pad" and pad_id is None:
        pad_id = src.tokenizer.eos_id
    description = src.tokenizer.to_json()
    read_description(description)  # a tokenizer that cannot describe itself fails here
    units, files = plan_units(src.files, text_field=text_field)
    sink = LLMBatchDatasink(
        output,
        seq_len=t,
        batch_size=b,
        seed=seed,
        shard_batches=shard_batches,
        files=files,
        num_units=len(units),
        overwrite=overwrite,
        allow_empty=allow_empty,
        max_retries=max_retries,
        inputs=src.files,
        dtype=DTYPE_UINT32 if plan.code is None else plan.code,
    )
    sink.check_target()
    started = not ray.is_initialized()
    if started:
        level = logging.INFO if show_progress else logging.ERROR
        ray.init(address=address, logging_level=level, log_to_driver=show_progress)
    context = ray.data.DataContext.get_current()
    logger = logging.getLogger("ray.data")
    saved = (context.enable_progress_bars, context.raise_original_map_exception, logger.level)
    try:
        context.enable_progress_bars = show_progress
        context.raise_original_map_exception = True  # an IngestError stays one
        if not show_progress:
            logger.setLevel(logging.ERROR)
        resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        cpus = float(resources.get("CPU", 1.0))
        n = workers or max(1, int(cpus / cpus_per_worker))
        sink.concurrency = n
        start = time.perf_counter()
        segments = segments_dataset(
            units,
            description,
            t,
            mode=mode,
            pad_id=pad_id,
            text_field=text_field,
            per_line=per_line,
            workers=n,
            cpus_per_worker=cpus_per_worker,
        )
        try:
            segments.write_datasink(
                sink, ray_remote_args=sink.remote_args, concurrency=min(n, max(1, len(units)))
            )
        except Exception as e:
            cause = _zerobatch_cause(e)
            if cause is None:
                raise
            raise cause from None
        seconds = time.perf_counter() - start
    finally:
        context.enable_progress_bars, context.raise_original_map_exception, level = saved
        logger.setLevel(level)
        if started:
            ray.shutdown()
    result = sink.result
    assert result is not None
    return _summary(src, output, mode, result, b, t, seconds, shard_batches is not None, plan)


def _summary(
    src: TextSource,
    output: str,
    mode: Mode,
    result: SinkResult,
    b: int,
    t: int,
    seconds: float,
    sharded: bool,
    plan: DtypePlan,
) -> ConvertSummary:
    """The local conversion's summary, from the sink's counts."""
    c = result.counts
    stats = PackingStats(
        mode=mode,
        seq_len=t,
        documents=c["documents"],
        tokens=c["doc_tokens"],
        records=result.records,
        padding_tokens=c["padding_tokens"],
        truncated_documents=c["truncated_documents"],
        truncated_tokens=c["truncated_tokens"],
        dropped_tail_tokens=result.stream_tokens - result.records * t,
    )
    src.stats = stats
    kept = result.batches * b
    source_tokens, drops = conversion_drops(src, result.records, kept, b, t)
    return ConvertSummary(
        output=output,
        kind="text",
        records=kept,
        batches=result.batches,
        dropped_records=result.records - kept,
        tokens=kept * t,
        output_bytes=result.output_bytes,
        seconds=seconds,
        records_read=result.records,
        source_tokens=source_tokens,
        dropped_tokens=sum(d.tokens for d in drops),
        drops=drops,
        padding_fraction=float(stats.padding_fraction),
        packing=stats.to_dict(),
        shards=len(result.manifest.shards) if sharded and result.manifest else None,
        dtype=DTYPE_NAMES[DTYPE_UINT32 if plan.code is None else plan.code],
        dtype_reason=plan.reason,
    )


__all__ = [
    "DEFAULT_MAX_RETRIES",
    "InputFile",
    "LLMBatchDatasink",
    "SinkResult",
    "TokenizeUnits",
    "Unit",
    "convert_with_ray",
    "plan_units",
    "segments_dataset",
]
