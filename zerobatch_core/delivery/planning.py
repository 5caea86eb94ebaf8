"""Request plans of a job reading a dataset from an object store (``zerobatch plan``).

A plan is not an estimate: the loader's own code (``RemoteSource`` under ``BatchNativeLoader``)
reads a *model* of the dataset for a few sample ranks and every request it makes is counted.
``ModelStore`` is that model: a store that holds the dataset's metadata (its manifest's and
index's entries, from the real store) and answers every read of a shard with bytes it makes up
on the spot (each shard's header from its entry, zero tokens), the checksums those zeros have,
and a manifest and index that describe exactly that, of the same sizes as the real ones. No
data moves; the requests and their sizes are the ones a rank makes against the real dataset.

``plan`` then scales the counts of one rank to the job: ``D x C`` ranks at one step every
``step_seconds``, and compares the request rates with what the stores document:

- Amazon S3: at least 5,500 GET/HEAD requests a second per partitioned key prefix (S3 User
  Guide, "Optimizing Amazon S3 performance"); S3 adds partitions under sustained load, over
  minutes, and answers 503 Slow Down meanwhile.
- Google Cloud Storage: about 5,000 object reads a second per bucket at first, more as the
  bucket's load ramps up ("Request rate and access distribution guidelines").
- Azure Blob Storage: 20,000 requests a second per storage account, 500 a second per blob
  ("Scalability and performance targets for Blob storage").
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import xxhash
from zerobatch_spec import HEADER_SIZE, Header, build_header, padded_batch_bytes
from zerobatch_spec.dataset import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    DatasetViolation,
    IndexRef,
    Manifest,
    Shard,
    build_manifest,
    key_prefix,
    parse_manifest,
)
from zerobatch_spec.index import IndexTop, build_index, iter_shards, parse_top

from ..datasets.remote import RemoteSource
from ..errors import DatasetError
from ..stores.resolve import open_store
from ..stores.store import Store
from .loader import DEFAULT_BLOCK_SIZE, BatchNativeLoader

LIMITS: dict[str, tuple[str, int]] = {
    "s3": ("per key prefix (Amazon S3)", 5500),
    "gs": ("per bucket at first (Google Cloud Storage)", 5000),
    "az": ("per storage account (Azure Blob Storage)", 20000),
}
"""GET requests a second a store documents, by URL scheme (see the module docstring)."""
HOT_OBJECT_LIMIT = 500
"""Requests a second to one object Azure documents for a blob; the strictest of the three."""

_PATTERN = 1 << 16
"""Checksums generated at once when the whole checksums file is hashed."""


def _kind(key: str, index: str | None) -> str:
    if key == MANIFEST_NAME:
        return "manifest"
    if key == CHECKSUMS_NAME:
        return "checksums"
    if index is not None and key == index:
        return "index"
    return "shards"


@dataclass
class Counts:
    """Requests and response bytes, by kind of object (manifest, index, checksums, shards)."""

    requests: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    keys: set[str] = field(default_factory=set)

    def add(self, kind: str, key: str, nbytes: int) -> None:
        self.requests[kind] += 1
        self.bytes[kind] += nbytes
        if kind == "shards":
            self.keys.add(key)

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


class ModelStore(Store):
    """A store holding a model of a dataset (see the module docstring): reads only, counted.

    ``manifest`` is the dataset's manifest and ``shards`` its entries in order; the model keeps
    their names, sizes and header fields and describes zero tokens with the manifest's version.
    """

    def __init__(self, url: str, manifest: Manifest, shards: Sequence[Shard]) -> None:
        super().__init__(url)
        self.shards = shards
        slot = padded_batch_bytes(manifest.batch_size, manifest.seq_len, manifest.dtype)
        self._slot_sum = xxhash.xxh3_64_intdigest(bytes(slot))
        self._sum_bytes = np.full(1, self._slot_sum, "<u8").tobytes()
        self._header = Header(manifest.batch_size, manifest.seq_len, 0, 0, 0, dtype=manifest.dtype)
        self._digests: dict[int, int] = {}
        counts = [s.num_batches for s in shards]
        total = sum(counts)
        self._total = total
        whole = self._whole_digest(total)
        model = replace(manifest, checksums_xxh3=whole, shards=tuple(shards))
        self._index: bytes | None = None
        self.index_name: str | None = None
        if manifest.index is not None:
            index = build_index(
                shards,
                b"",
                batch_size=manifest.batch_size,
                seq_len=manifest.seq_len,
                dtype=manifest.dtype,
                seed=manifest.seed,
                range_digests=[self._range_digest(n) for n in counts],
                prefixes=manifest.prefixes,
            )
            top = parse_top(index, len(index))
            assert isinstance(top, IndexTop)
            self._index, self.index_name = index, manifest.index.name
            model = replace(
                model, index=IndexRef(manifest.index.name, len(index), top.xxh3), shards=()
            )
        self._manifest = build_manifest(model)
        self._by_name = {s.name: i for i, s in enumerate(shards)}
        self._lock = threading.Lock()
        self.counts = Counts()

    def _whole_digest(self, total: int) -> str:
        state = xxhash.xxh3_64()
        block = self._sum_bytes * min(total, _PATTERN)
        left = total
        while left:
            n = min(left, _PATTERN)
            state.update(block[: n * 8])
            left -= n
        return f"{state.intdigest():016x}"

    def _range_digest(self, n: int) -> int:
        """Digest of ``n`` slots' checksums (a dataset has a few distinct slot counts)."""
        found = self._digests.get(n)
        if found is None:
            found = self._digests[n] = int(xxhash.xxh3_64_intdigest(self._sum_bytes * n))
        return found

    def reset(self) -> Counts:
        """The counts so far, and zero counts from now on."""
        with self._lock:
            counts, self.counts = self.counts, Counts()
        return counts

    def _count(self, key: str, nbytes: int) -> None:
        with self._lock:
            self.counts.add(_kind(key, self.index_name), key, nbytes)

    # -- the bytes of the model ---------------------------------------------------------------
    def _object(self, key: str) -> tuple[int, Any]:
        """``(size, bytes(start, end))`` of object ``key``."""
        if key == MANIFEST_NAME:
            data = self._manifest
            return len(data), lambda a, b: data[a:b]
        if key == CHECKSUMS_NAME:
            pattern = self._sum_bytes

            def sums(a: int, b: int) -> bytes:
                first, last = a // 8, (b + 7) // 8
                return (pattern * (last - first))[a - first * 8 : b - first * 8]

            return self._total * 8, sums
        if self._index is not None and key == self.index_name:
            index = self._index
            return len(index), lambda a, b: index[a:b]
        i = self._by_name.get(key)
        if i is None:
            raise FileNotFoundError(key)
        s = self.shards[i]
        header = build_header(
            replace(
                self._header,
                num_batches=s.num_batches,
                seed=s.seed,
                total_records=s.total_records,
            )
        )

        def shard_bytes(a: int, b: int) -> bytes:
            head = header[a:b] if a < HEADER_SIZE else b""
            return head + bytes(max(0, b - max(a, HEADER_SIZE)))

        return s.size, shard_bytes

    def _read(self, key: str) -> bytes:
        size, get = self._object(key)
        data: bytes = get(0, size)
        self._count(key, len(data))
        return data

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        size, get = self._object(key)
        out = []
        for a, b in ranges:
            part: bytes = get(a, min(b, size))
            self._count(key, len(part))
            out.append(part)
        return out

    def _read_head(self, key: str, length: int) -> tuple[bytes, int]:
        size, get = self._object(key)
        data: bytes = get(0, min(length, size))
        self._count(key, len(data))
        return data, size

    def _size(self, key: str) -> int:
        size, _ = self._object(key)
        self._count(key, 0)
        return size

    def _write(self, key: str, data: bytes) -> None:
        raise PermissionError(f"{self.where(key)}: a dataset's model is read only")

    def _create(self, key: str, data: bytes) -> bool:
        raise PermissionError(f"{self.where(key)}: a dataset's model is read only")

    def _delete(self, key: str) -> None:
        raise PermissionError(f"{self.where(key)}: a dataset's model is read only")

    def _list(self, prefix: str) -> list[str]:
        return []

    def _retry_reason(self, error: Exception) -> str | None:
        return None


def read_dataset_metadata(url: str) -> tuple[Manifest, list[Shard], dict[str, int]]:
    """A dataset's manifest, every shard entry (a version 2 index read whole) and the sizes of
    its metadata objects, from its store."""
    store = open_store(url)
    try:
        data = store.read(MANIFEST_NAME)
        parsed = parse_manifest(data)
        if isinstance(parsed, DatasetViolation):
            raise DatasetError(store.where(MANIFEST_NAME), parsed)
        sizes = {"manifest": len(data), "checksums": store.size(CHECKSUMS_NAME)}
        if parsed.index is None:
            return parsed, list(parsed.shards), sizes
        raw = store.read(parsed.index.name)
        sizes["index"] = len(raw)
        top = parse_top(raw, len(raw))
        if isinstance(top, DatasetViolation):
            raise DatasetError(store.where(parsed.index.name), top)
        shards = []
        for entry in iter_shards(top, raw):
            if isinstance(entry, DatasetViolation):
                raise DatasetError(store.where(parsed.index.name), entry)
            shards.append(entry.shard)
        return parsed, shards, sizes
    finally:
        store.close()


@dataclass(frozen=True)
class RankCounts:
    """What one rank fetched: before its first batch, and over ``steps`` steps after it."""

    rank: int
    context_rank: int
    startup: Counts
    steady: Counts
    steps: int


def simulate_rank(
    store: ModelStore,
    *,
    rank: int,
    world_size: int,
    context_rank: int = 0,
    context_size: int = 1,
    steps: int = 32,
    global_batch_size: int | None = None,
    verify: str | None = None,
    block_size: int | None = None,
    seed: int | None = None,
) -> RankCounts:
    """Run one rank's loader over the model: the requests until its first batch (what it
    needs, and its first step fetched ahead), then over ``steps`` more steps."""
    store.reset()
    store.exists(MANIFEST_NAME)  # what a source opened by URL asks first: is it a dataset
    source = RemoteSource((store, ""), verify=verify, prefetch_bytes=0)  # type: ignore[arg-type]
    try:
        loader = BatchNativeLoader(
            source,
            block_size=block_size or DEFAULT_BLOCK_SIZE,
            seed=seed,
            dtype="native",
            rank=rank,
            world_size=world_size,
            context_rank=context_rank,
            context_size=context_size,
            global_batch_size=global_batch_size,
        )
        items = iter(loader)
        served = 0
        if next(items, None) is not None:
            served = 1
        startup = store.reset()
        for _ in range(steps):
            if next(items, None) is None:
                break
            served += 1
        steady = store.reset()
    finally:
        source.close()
    return RankCounts(rank, context_rank, startup, steady, max(0, served - 1))


@dataclass(frozen=True)
class Plan:
    """What ``plan`` found: the dataset, one rank's requests (the most of the sample ranks),
    and the job's totals and rates, with the warnings they call for."""

    url: str
    ranks: int
    context: int
    step_seconds: float
    version: int
    shards: int
    num_batches: int
    metadata_bytes: dict[str, int]
    startup: Counts
    steady: Counts
    steps: int
    prefixes: tuple[str, ...]
    warnings: tuple[str, ...]
    busiest_share: float = 1.0
    """The largest share of the dataset's slots under one key prefix (``1 / P`` for equal
    shards over ``P`` prefixes; 1 without prefixes): the share of the job's shard reads that
    prefix takes over an epoch."""

    @property
    def job_ranks(self) -> int:
        return self.ranks * self.context

    @property
    def step_requests(self) -> float:
        """Requests of one rank per step, steady state (mean over the steps simulated)."""
        return self.steady.total_requests / max(1, self.steps)

    @property
    def step_bytes(self) -> float:
        return self.steady.total_bytes / max(1, self.steps)

    @property
    def job_rate(self) -> float:
        """GET requests a second of the whole job in steady state."""
        return self.job_ranks * self.step_requests / self.step_seconds

    @property
    def prefix_rate(self) -> float:
        """GET requests a second on the busiest key prefix in steady state: its share of the
        shard reads, plus every read of the dataset's own metadata (at its root)."""
        shards = self.steady.requests["shards"] / max(1, self.steps)
        other = self.step_requests - shards
        per_rank = shards * (self.busiest_share if self.prefixes else 0.0) + other
        return self.job_ranks * per_rank / self.step_seconds

    def as_dict(self) -> dict[str, Any]:
        def kinds(c: Counts, per: float = 1.0) -> dict[str, dict[str, float]]:
            return {
                k: {"requests": c.requests[k] / per, "bytes": c.bytes[k] / per}
                for k in sorted(c.requests)
            }

        return {
            "dataset": self.url,
            "manifest_version": self.version,
            "shards": self.shards,
            "num_batches": self.num_batches,
            "metadata_bytes": self.metadata_bytes,
            "ranks": self.ranks,
            "context": self.context,
            "step_seconds": self.step_seconds,
            "per_rank": {
                "startup": {
                    "requests": self.startup.total_requests,
                    "bytes": self.startup.total_bytes,
                    "by_object": kinds(self.startup),
                },
                "per_step": {
                    "requests": self.step_requests,
                    "bytes": self.step_bytes,
                    "by_object": kinds(self.steady, max(1, self.steps)),
                    "steps_simulated": self.steps,
                },
            },
            "job": {
                "startup_requests": self.job_ranks * self.startup.total_requests,
                "startup_bytes": self.job_ranks * self.startup.total_bytes,
                "requests_per_second": self.job_rate,
                "bytes_per_second": self.job_ranks * self.step_bytes / self.step_seconds,
                "key_prefixes": list(self.prefixes),
                "requests_per_second_busiest_prefix": self.prefix_rate,
                # the same figure under its earlier name: with one prefix, its whole rate
                "requests_per_second_per_prefix": self.prefix_rate,
            },
            "warnings": list(self.warnings),
        }


def _worst(a: Counts, b: Counts) -> Counts:
    return a if (a.total_requests, a.total_bytes) >= (b.total_requests, b.total_bytes) else b


def plan(
    url: str,
    *,
    ranks: int,
    context: int = 1,
    step_seconds: float = 1.0,
    global_batch_size: int | None = None,
    verify: str | None = None,
    steps: int = 64,
    block_size: int | None = None,
    seed: int | None = None,
) -> Plan:
    """The requests a job of ``ranks`` data-parallel x ``context`` context-parallel ranks
    makes reading the dataset at ``url`` (a URL or a path), at one step every
    ``step_seconds``: the loader runs over a model of the dataset (``ModelStore``) for a few
    sample ranks (the first, the middle and the last), ``steps`` steps each."""
    manifest, shards, sizes = read_dataset_metadata(url)
    store = ModelStore(url, manifest, shards)
    samples = sorted({(0, 0), (ranks // 2, context // 2), (ranks - 1, context - 1)})
    startup, steady, done = Counts(), Counts(), steps
    for rank, context_rank in samples:
        found = simulate_rank(
            store,
            rank=rank,
            world_size=ranks,
            context_rank=context_rank,
            context_size=context,
            steps=steps,
            global_batch_size=global_batch_size,
            verify=verify,
            block_size=block_size,
            seed=seed,
        )
        startup, steady = _worst(startup, found.startup), _worst(steady, found.steady)
        done = min(done, found.steps)
    root = url.rstrip("/") + "/"
    used = steady.keys or startup.keys
    if manifest.prefixes > 1:
        prefixes = tuple(sorted({root + key_prefix(s.name, manifest.prefixes) for s in shards}))
    else:
        prefixes = (root,) if used else ()
    result = Plan(
        url,
        ranks,
        context,
        step_seconds,
        manifest.version,
        len(shards),
        sum(s.num_batches for s in shards),
        sizes,
        startup,
        steady,
        done,
        prefixes,
        (),
        _busiest_share(shards, manifest.prefixes),
    )
    return replace(result, warnings=tuple(_warnings(result)))


def _busiest_share(shards: Sequence[Shard], prefixes: int) -> float:
    """The largest fraction of the slots of ``shards`` under one of ``prefixes`` prefixes."""
    total = sum(s.num_batches for s in shards)
    if prefixes <= 1 or not total:
        return 1.0
    per: Counter[str] = Counter()
    for s in shards:
        per[key_prefix(s.name, prefixes)] += s.num_batches
    return max(per.values()) / total


def _warnings(p: Plan) -> list[str]:
    out = []
    n = p.job_ranks
    scheme = p.url.split("://", 1)[0].lower() if "://" in p.url else ""
    per_rank = p.startup.total_bytes
    if per_rank > 1 << 20:
        hint = " (write it with --manifest-version 2)" if p.version == 1 else ""
        out.append(
            f"every rank reads {per_rank:,} bytes before its first batch, {n * per_rank:,} "
            f"for the job{hint}"
        )
    limit = LIMITS.get(scheme)
    if limit is not None:
        where, rate = limit
        per_prefix = p.prefix_rate
        if per_prefix > rate:
            spread = (
                f"; spreading the shards over more key prefixes (--shard-prefixes, now "
                f"{len(p.prefixes)}) divides it"
                if p.version == 2
                else "; a version 2 dataset can spread its shards over key prefixes "
                "(--manifest-version 2 --shard-prefixes P)"
            )
            out.append(
                f"the job's {per_prefix:,.0f} GET/s on one key prefix crosses the documented "
                f"{rate:,} GET/s {where}: expect throttling (503 Slow Down) until the store "
                "scales; fewer, larger requests per step (whole stored batches per rank) or a "
                f"longer step lower it{spread}"
            )
        burst = n * p.startup.total_requests
        if burst > rate:
            out.append(
                f"the job's ranks make {burst:,} requests before their first batches: started "
                f"within one second they cross the documented {rate:,} GET/s {where}; stagger "
                "the ranks' starts or expect retries"
            )
    if n > HOT_OBJECT_LIMIT and scheme == "az":
        out.append(
            f"every one of the {n:,} ranks reads manifest.json at start: Azure documents "
            f"{HOT_OBJECT_LIMIT} requests a second per blob"
        )
    return out
