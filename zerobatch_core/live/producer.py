"""``LiveProducer``: append global batches to a live dataset and commit them exactly once.

Many producers, on many machines, append to one live dataset (``SPEC.md`` sections 16-19) with
no coordinator and no messages between them: the store's conditional create is the only
shared primitive.

* ``append(batches)`` writes one immutable LLMBATCH object holding the next global batches of
  this producer's stream (``[batch_size, seq_len]`` each) under a name no other write uses.
  Nothing is visible yet.
* ``commit()`` publishes what was appended: it builds manifest version ``v + 1`` from the
  newest version ``v`` it knows (its entries appended, its offset advanced:
  ``zerobatch_spec.live.commit_entries``), and creates it only if no version ``v + 1`` exists.
  If another producer got there first, it reads the winner, rebases on it and tries again; a
  version that already holds some of its items (a restart, a zombie twin) makes it drop them.
  When to attempt a commit is the cadence's decision (``live/cadence.py``: adaptive by
  default); ``append`` commits by itself when the cadence says so (on a young dataset, once
  a listing of the batch objects has told it which other producers are preparing commits),
  and ``close`` commits the rest.
* Exactly once across restarts: the manifest records each producer's committed offset. A
  producer opened with the same ``producer_id`` starts at that offset (``offset``), so the
  caller resumes its stream there: items committed before a crash are never appended again,
  items appended but not committed are appended again under new names (the old objects are
  never referenced and retention deletes them).
* Only verified versions: a producer rebases only on a version that follows from the one it
  built on (``ManifestChain.follow``, ``SPEC.md`` section 18.4), and opens only on a newest
  version that follows from its predecessor. A crafted or mistaken version (a producer offset
  far ahead, a version numbered far ahead) makes ``commit`` raise ``ChainError`` at once: its
  pending objects stay pending and its offset unchanged, so nothing is dropped as "already
  committed" and nothing is committed on the broken version.

Before the first commit, the store is probed: a conditional create of a fresh key must succeed
and a second one of the same key must fail. A store that lets both succeed (some
S3-compatible services ignore ``If-None-Match``) would let two producers overwrite each
other's versions, so ``LiveProducer`` refuses it with ``ConditionalCreateUnsupportedError``.
"""

from __future__ import annotations

import errno
import secrets
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash
from zerobatch_spec import (
    DTYPE_NAMES,
    DTYPE_UINT32,
    HEADER_SIZE,
    U32_MAX,
    Header,
    build_header,
    slot_words,
    token_dtype,
    token_max,
)
from zerobatch_spec.live import (
    BATCHES_PREFIX,
    DEFAULT_SEGMENT_SIZE,
    DESCRIPTOR_NAME,
    MANIFESTS_PREFIX,
    CommitConflictError,
    Descriptor,
    Entry,
    LiveManifest,
    LiveViolation,
    batch_name,
    build_descriptor,
    build_live_manifest,
    check_producer_id,
    commit_entries,
    empty_manifest,
    manifest_name,
    parse_batch_name,
    parse_descriptor,
    seal,
)

from ..arguments import int_arg
from ..errors import ZeroBatchError
from ..files.writer import DtypeArg, token_dtype_code
from ..stores.resolve import open_store
from ..stores.store import Store, StoreError
from .cadence import Cadence, make_cadence
from .manifests import ChainError, LiveError, ManifestChain

PROBE_PREFIX = "probes/"
CONTENDERS_LISTED_BELOW = 64
"""Committed entries below which an attempt is preceded by a listing of the batch objects
(``LiveProducer._still_due``)."""


class ConditionalCreateUnsupportedError(ZeroBatchError, OSError):
    """The store let a second conditional create of the same key succeed."""


def probe_conditional_create(store: Store) -> None:
    """Check that ``store`` honours conditional creates, or raise
    ``ConditionalCreateUnsupportedError`` saying why live mode cannot use it."""
    key = f"{PROBE_PREFIX}{secrets.token_hex(16)}"
    try:
        first = store.create(key, b"first")
        second = store.create(key, b"second")
        kept = store.read(key) if first and not second else b""
    finally:
        store.delete(key)
    if not first or second or kept != b"first":
        raise ConditionalCreateUnsupportedError(
            errno.ENOTSUP,
            "the store does not honour conditional creates (a second create of the same key "
            f"{'succeeded' if second else 'did not behave as one'}): two producers could "
            "overwrite each other's manifest versions, so live datasets refuse this store "
            "(on S3-compatible services, PutObject must answer If-None-Match: * with 412)",
            store.url,
        )


def encode_batches(batches: npt.NDArray[Any], seed: int = 0, dtype: int = DTYPE_UINT32) -> bytes:
    """An LLMBATCH file holding ``batches`` (``[n, batch_size, seq_len]``, every token within
    the range of dtype code ``dtype``: uint32 by default, or uint16), as bytes."""
    n, b, t = batches.shape
    words = slot_words(b, t, dtype)
    body = np.zeros((n, words), dtype=token_dtype(dtype))
    body[:, : b * t] = batches.reshape(n, b * t)
    header = build_header(Header(b, t, n, seed, n * b, dtype=dtype))
    return header + body.tobytes()


@dataclass
class CommitStats:
    """What a producer's commits did: attempts, successes, conflicts and time in manifest I/O."""

    attempts: int = 0
    commits: int = 0
    conflicts: int = 0
    batches: int = 0
    manifest_seconds: float = 0.0
    windows: list[float] = field(default_factory=list)
    """Each attempt's time, from its first read to the end of its create (the catching up on
    newer versions included; ``manifest_seconds`` is their sum)."""


class LiveProducer:
    """One producer of a live dataset (see the module docstring).

    ``dataset`` is a URL, a path or a ``Store``. A dataset that does not exist yet is created
    with ``batch_size``, ``seq_len`` and ``seed`` (which must then be given); an existing one
    must have that shape if they are given. ``producer_id`` names this producer's stream
    (1-64 of ``A-Z a-z 0-9 _ -``): it must be stable across restarts and unique among the
    producers running at once. ``cadence`` is ``"adaptive"`` (DAC), ``k`` (commit every ``k``
    appends) or a ``live.cadence.Cadence``. ``probe=False`` skips the conditional-create
    probe (for stores already probed).

    ``dtype`` is the token dtype of every batch object (``live.json`` records it): ``"uint32"``
    or ``"uint16"`` (half the bytes; ids up to 65,535), or a dtype code. ``None`` (the default)
    takes the dataset's own, and ``"uint32"`` for a dataset it creates. Opening a dataset of
    another dtype than the one given is refused, naming both; so is appending a token the
    dtype cannot hold.

    >>> run = "s3://bucket/run"
    >>> with LiveProducer(run, "prep-0", batch_size=32, seq_len=512) as p:  # doctest: +SKIP
    ...     for batch in produce(start=p.offset):
    ...         p.append(batch)
    """

    def __init__(
        self,
        dataset: str | Store,
        producer_id: str,
        *,
        batch_size: int | None = None,
        seq_len: int | None = None,
        seed: int = 0,
        cadence: Cadence | int | str = "adaptive",
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        probe: bool = True,
        dtype: DtypeArg | None = None,
    ) -> None:
        self.producer_id = check_producer_id(producer_id)
        code = None if dtype is None else token_dtype_code(dtype)
        self.store = open_store(dataset)
        self.cadence = make_cadence(cadence)
        self.stats = CommitStats()
        if probe:
            probe_conditional_create(self.store)
        self.descriptor = open_or_create(
            self.store, batch_size, seq_len, seed, segment_size, producer_id, code
        )
        self.chain = ManifestChain(self.store, self.descriptor)
        opened = time.monotonic()
        self.base = self.chain.latest()
        now = time.monotonic()
        # What the cadence starts from: that read's time, and who committed the newest batches.
        tail = (e.producer for e in reversed(self.base.tail) if e.producer != producer_id)
        recent = list(dict.fromkeys(tail))[::-1]
        self.cadence.start(now - opened, recent, now)
        state = self.base.producers.get(self.producer_id)
        self.offset = state.offset if state else 0
        """The stream offset of the next item ``append`` takes: where a restart resumes."""
        self.committed = self.offset
        """The stream offset up to which this producer's items are committed."""
        self._pending: list[Entry] = []
        self._closed = False

    @property
    def batch_size(self) -> int:
        return self.descriptor.batch_size

    @property
    def seq_len(self) -> int:
        return self.descriptor.seq_len

    @property
    def dtype(self) -> int:
        """The dtype code of the dataset's tokens (0: uint32, 1: uint16)."""
        return self.descriptor.dtype

    @property
    def token_dtype(self) -> np.dtype[np.unsignedinteger]:
        """The NumPy dtype of the dataset's tokens."""
        return token_dtype(self.descriptor.dtype)

    @property
    def pending(self) -> int:
        """Objects appended and not yet committed."""
        return len(self._pending)

    def append(self, batches: npt.ArrayLike) -> None:
        """Append global batches (``[batch_size, seq_len]`` or ``[n, batch_size, seq_len]``,
        token ids the dataset's dtype holds) as one object, then commit if the cadence says
        so."""
        if self._closed:
            raise ValueError(f"{self.store.url}: producer {self.producer_id} is closed")
        array = np.asarray(batches)
        if array.ndim == 2:
            array = array[np.newaxis]
        b, t = self.batch_size, self.seq_len
        if array.ndim != 3 or array.shape[1:] != (b, t) or array.shape[0] < 1:
            raise ValueError(
                f"append takes [{b}, {t}] or [n, {b}, {t}] batches, got shape {array.shape}"
            )
        code = self.descriptor.dtype
        top = token_max(code)
        limit = "2**32 - 1" if code == DTYPE_UINT32 else f"{top}"
        if array.dtype.kind not in "ui":
            raise ValueError(f"tokens must be integers in [0, {limit}], got {array.dtype}")
        if array.size and (int(array.min()) < 0 or int(array.max()) > top):
            bad = int(array.min()) if int(array.min()) < 0 else int(array.max())
            where = [int(x[0]) for x in np.nonzero(array == bad)]
            raise ValueError(
                f"tokens must be integers in [0, {limit}] for this {DTYPE_NAMES[code]} live "
                f"dataset ({self.store.url}); got {bad} at [batch, row, position] {where}"
            )
        n = array.shape[0]
        data = encode_batches(array, dtype=code)
        key = batch_name(self.producer_id, self.offset, secrets.token_hex(8))
        self.store.write(key, data)
        slot = (len(data) - HEADER_SIZE) // n
        starts = [HEADER_SIZE + i * slot for i in range(n)]
        sums = tuple(_digest(data[s : s + slot]) for s in starts)
        entry = Entry(
            key,
            0,
            n,
            self.producer_id,
            self.offset,
            0,
            n * b,
            len(data),
            f"{xxhash.xxh3_64_intdigest(data[:HEADER_SIZE]):016x}",
            sums,
        )
        self._pending.append(entry)
        self.offset += n
        if self.cadence.due(len(self._pending), time.monotonic()) and self._still_due():
            self.commit(retry=False)

    def _still_due(self) -> bool:
        """Whether the attempt the cadence asks for is still due once it knows the producers
        preparing commits beside this one (``Cadence.contenders``).

        Producers that start together on a fresh dataset see nothing of each other in its
        versions until their commits land; their batch objects are in the store before that.
        So, while the newest version lists fewer than ``CONTENDERS_LISTED_BELOW`` entries and
        no sealed segment (the listing is then one short request), each attempt is preceded
        by a listing of ``batches/``: the producers with an object at or beyond their
        committed offset are preparing commits. A cadence that does not use them
        (``Cadence.uses_contenders``: a fixed one) costs no listing.
        """
        if (
            not self.cadence.uses_contenders
            or self.base.segments
            or len(self.base.tail) >= CONTENDERS_LISTED_BELOW
        ):
            return True
        committed = {name: state.offset for name, state in self.base.producers.items()}
        preparing = []
        for key in self.store.list_keys(BATCHES_PREFIX):
            parsed = parse_batch_name(key)
            if parsed is not None and parsed[0] != self.producer_id:
                producer, offset = parsed
                if offset >= committed.get(producer, 0):
                    preparing.append(producer)
        now = time.monotonic()
        self.cadence.contenders(list(dict.fromkeys(preparing)), now)
        return self.cadence.due(len(self._pending), now)

    def commit(self, *, retry: bool = True, timeout: float = 300.0) -> bool:
        """Publish the pending objects: ``True`` once a manifest version holds them all.

        With ``retry`` (the default), conflicts are rebased and retried until the commit lands
        (or ``timeout`` seconds pass: ``LiveError``); without it, one attempt is made and a
        conflict leaves the objects pending for the next (what ``append`` does).
        """
        deadline = time.monotonic() + timeout
        while self._pending:
            if self._attempt():
                return True
            if not retry:
                return False
            if time.monotonic() > deadline:
                raise LiveError(
                    f"{self.store.url}: producer {self.producer_id} could not commit in "
                    f"{timeout:g} s ({self.stats.conflicts} conflicts)"
                )
            time.sleep(min(0.5, getattr(self.cadence, "gap", 0.0)))
        return True

    def _attempt(self) -> bool:
        """One commit attempt: read the newest version, build the next on it and create it.

        The time from the read that finds no newer version to the end of the create is the
        fragile window the cadence measures: another commit landing inside it is a conflict,
        after which this producer rebases on the winner (its items already there are dropped)
        for its next attempt. The reads of the versions committed since the last attempt come
        before it and are not part of it (they are part of the attempt's time in ``stats``),
        and so do the segments this commit seals, followed by one more read of the next
        version. Every version read is checked to follow from the base before it becomes the
        base (``ChainError`` otherwise, with nothing pending dropped).
        """
        started = time.monotonic()
        newer = self.chain.follow(self.base, list_on_gap=False)
        read = time.monotonic()
        writers = self._rebase(newer)
        if not self._pending:  # a twin (or an earlier life) committed everything already
            return True
        # Only entries the base has committed are sealed: a segment's bytes are then the same
        # whoever writes it, and a commit that loses its race leaves no segment of its own.
        sealed, segments = seal(self.base, self.descriptor.segment_size, _digest)
        opened, reads = started, len(newer) + 1
        if segments:
            # A version landing while they are written cannot spoil them (the version after
            # the base seals the same entries into the same objects): write them before the
            # fragile window, which opens with one more read.
            for name, data in segments:
                self.store.write(name, data)
            opened = time.monotonic()
            again = self.chain.follow(self.base, list_on_gap=False)
            read = time.monotonic()
            reads = len(again) + 1
            segments = []
            if again:  # seal the newest instead (its base's segments are those written above)
                writers += self._rebase(again)
                if not self._pending:
                    return True
                sealed, segments = seal(self.base, self.descriptor.segment_size, _digest)
        try:
            candidate, _ = commit_entries(
                sealed, self.producer_id, self._pending, secrets.token_hex(8)
            )
        except CommitConflictError as e:
            raise LiveError(f"{self.store.url}: {e}") from None
        for name, data in segments:
            self.store.write(name, data)
        data = build_live_manifest(candidate)
        created = self.store.create(manifest_name(candidate.version), data)
        now = time.monotonic()
        if created and not self._on_the_chain(candidate, data):
            created = False  # the number was one retention had freed: try again on the newest
            writers += self._rebase([self.chain.latest()])
        if created:
            writers.append(self.producer_id)
            self.stats.commits += 1
            self.stats.batches += candidate.batches - self.base.batches
            self.base = candidate
            self._pending.clear()
            self.committed = self.offset
        else:
            self.stats.conflicts += 1
            writers += self._rebase(self.chain.follow(self.base))
        window = now - started
        self.stats.attempts += 1
        self.stats.manifest_seconds += window
        self.stats.windows.append(window)
        # The read that found no newer version is the last of the reads since ``opened``,
        # taken as long as their average: the fragile window opens when it starts.
        fragile = now - read + (read - opened) / reads
        self.cadence.observe(fragile, not created, writers, now)
        return created

    def _on_the_chain(self, candidate: LiveManifest, data: bytes) -> bool:
        """Whether the version just created continues the chain, after checking its bytes
        (``_check_created``); if not, it is deleted.

        A conditional create only fails on a key that exists: if retention deleted ``v + 1``
        (and, oldest first, ``v``) while this producer sat on ``v``, the create of ``v + 1``
        succeeds beside the newer versions. So ``v`` must still exist after the create (then
        ``v + 1`` was never deleted); where it does not, the versions after ``v + 1`` decide:
        none, or a ``v + 2`` that follows from this one, and the commit stands; any other means
        the number was reused, and the version, read by no one that follows the chain, is
        deleted (``SPEC.md`` section 18.3).
        """
        version = candidate.version
        self._check_created(candidate, data)
        if self.store.exists(manifest_name(version - 1)):
            return True
        if not [v for v in self.chain.versions() if v > version]:
            return True
        after = self.chain.read(version + 1)
        if after is not None:
            try:
                self.chain.check(candidate, after)
                return True
            except ChainError:
                pass
        self.store.delete(manifest_name(version))
        return False

    def _check_created(self, candidate: LiveManifest, data: bytes) -> None:
        """Read the version just created back: another writer's bytes there mean the store let
        two conditional creates of one key succeed, and this commit was overwritten."""
        found = self.store.read(manifest_name(candidate.version))
        if found != data:
            raise ConditionalCreateUnsupportedError(
                errno.ENOTSUP,
                f"manifest version {candidate.version} was overwritten after this producer "
                "created it: the store let two conditional creates of one key succeed (not "
                "atomic under concurrent requests), so live datasets cannot use it",
                self.store.url,
            )

    def _rebase(self, newer: list[LiveManifest]) -> list[str]:
        """Move the base to the newest of ``newer``, dropping pending items it already holds;
        the writers of the versions read."""
        if not newer:
            return []
        self.base = newer[-1]
        state = self.base.producers.get(self.producer_id)
        self.committed = state.offset if state else 0
        self._pending = [e for e in self._pending if e.offset + e.num_batches > self.committed]
        return [m.writer for m in newer]

    def close(self) -> None:
        """Commit what is pending, then stop.

        The commit waits until the cadence lets an attempt start (``Cadence.delay``: for the
        adaptive cadence, until its gap since the last attempt has passed), so that producers
        finishing together do not all attempt at once; ``commit()`` before ``close()`` commits
        at once instead."""
        if self._closed:
            return
        try:
            wait = self.cadence.delay(time.monotonic()) if self._pending else 0.0
            if wait > 0:
                time.sleep(wait)
            self.commit()
        finally:
            self._closed = True
            self.store.close()

    def __enter__(self) -> LiveProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # leave uncommitted objects uncommitted: a restart appends them again
            self._closed = True
            self.store.close()


def _digest(data: bytes) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def open_or_create(
    store: Store,
    batch_size: int | None,
    seq_len: int | None,
    seed: int,
    segment_size: int,
    writer: str,
    dtype: int | None = None,
) -> Descriptor:
    """The dataset's descriptor, creating the dataset (descriptor and version 0) if needed.

    ``dtype`` (a dtype code) is the new dataset's, uint32 when ``None``; an existing dataset
    of another dtype is refused, naming both.
    """
    try:
        data = store.read(DESCRIPTOR_NAME)
    except FileNotFoundError:
        if batch_size is None or seq_len is None:
            raise LiveError(
                f"{store.where(DESCRIPTOR_NAME)}: no live dataset here; give batch_size and "
                "seq_len to create one"
            ) from None
        created = Descriptor(
            int_arg("batch_size", batch_size, 1, U32_MAX),
            int_arg("seq_len", seq_len, 1, U32_MAX),
            int_arg("seed", seed, 0, 2**64 - 1),
            secrets.token_hex(16),
            int_arg("segment_size", segment_size, 1, 1 << 20),
            DTYPE_UINT32 if dtype is None else dtype,
        )
        if store.create(DESCRIPTOR_NAME, build_descriptor(created)):
            zero = empty_manifest(created, writer, secrets.token_hex(8))
            store.create(manifest_name(0), build_live_manifest(zero))
        data = store.read(DESCRIPTOR_NAME)  # ours, or the one a racing producer created
    found = parse_descriptor(data)
    if isinstance(found, LiveViolation):
        raise LiveError(
            f"{store.where(DESCRIPTOR_NAME)}: {found.code.value}: {found.where}: {found.detail}"
        )
    if not store.list_keys(MANIFESTS_PREFIX):  # its creator died before version 0
        zero = empty_manifest(found, writer, secrets.token_hex(8))
        store.create(manifest_name(0), build_live_manifest(zero))
    want = (batch_size, seq_len)
    if (want[0] is not None and want[0] != found.batch_size) or (
        want[1] is not None and want[1] != found.seq_len
    ):
        raise LiveError(
            f"{store.where(DESCRIPTOR_NAME)}: the live dataset holds [{found.batch_size}, "
            f"{found.seq_len}] batches, not {list(want)}"
        )
    if dtype is not None and dtype != found.dtype:
        raise LiveError(
            f"{store.where(DESCRIPTOR_NAME)}: the live dataset holds {DTYPE_NAMES[found.dtype]} "
            f"tokens, not {DTYPE_NAMES[dtype]}: every batch object of a live dataset has its "
            "dtype (open it without a dtype, or with its own)"
        )
    return found


__all__ = [
    "CommitStats",
    "ConditionalCreateUnsupportedError",
    "LiveProducer",
    "StoreError",
    "encode_batches",
    "probe_conditional_create",
]
