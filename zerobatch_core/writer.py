"""Writers: records in, one atomically written, seed-permuted LLMBATCH file out.

Output record position ``p`` holds input record ``permute(p, total_records, seed)``
(``SPEC.md``, "Record permutation"); the last ``total_records % batch_size`` positions are the
dropped remainder. ``write_batch_file`` (an array, random access) produces the output in file
order, a few MiB at a time, by gathering the records each chunk needs; ``write_batch_dataset``
(a stream) sends each record towards its output window as it arrives and permutes each window
in memory at the end (``_WindowedOutput``). Either way memory is bounded by a few chunks and
windows, never by the dataset.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
from zerobatch_spec import (
    DOMAIN_RECORDS,
    HEADER_SIZE,
    TOKEN_BYTES,
    TOKEN_DTYPE,
    U32_MAX,
    Header,
    build_header,
    permute_array,
    unpermute_array,
)

from .arguments import int_arg
from .errors import WriteError
from .pages import discard, release_pages, start_writeback

CHUNK_BYTES = 8 * 2**20
"""Target size of one output write; large writes also leave the page cache fast to map."""

PathLike = str | os.PathLike[str]


def _check_destination(output_path: PathLike) -> str:
    path = os.fspath(output_path)
    if os.path.isdir(path):
        raise WriteError(f"{path}: output path is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise WriteError(f"{path}: output directory {parent} does not exist")
    return path


def _check_token_dtype(dtype: np.dtype[np.generic], what: str) -> None:
    if dtype.kind not in "ui":
        raise WriteError(f"{what}: tokens must be an integer dtype, got {dtype}")


def _to_u32(rows: npt.NDArray[np.integer], what: str, first_record: int) -> npt.NDArray[np.uint32]:
    """Rows as uint32, or a ``WriteError`` naming the first record with an out-of-range token."""
    if rows.dtype == np.uint32 or rows.size == 0:
        return rows.astype(TOKEN_DTYPE, copy=False)
    if rows.dtype.kind == "u" and rows.dtype.itemsize <= TOKEN_BYTES:
        return rows.astype(TOKEN_DTYPE)
    bad = (rows < 0) | (rows > U32_MAX)
    if bad.any():
        r, c = (int(x[0]) for x in np.nonzero(bad))
        raise WriteError(
            f"{what}: record {first_record + r}, token {c}: value {int(rows[r, c])} is outside "
            f"the uint32 range [0, 2**32 - 1]"
        )
    return rows.astype(TOKEN_DTYPE)


def _remove_stale_temporaries(directory: str, prefix: str) -> None:
    """Delete temp files a killed writer of the same output left (its pid no longer runs)."""
    for name in os.listdir(directory):
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix) :].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            with suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
        except PermissionError:
            pass  # alive, owned by someone else


@contextmanager
def _atomic_output(path: str) -> Iterator[BinaryIO]:
    """A temp file beside ``path`` that replaces it only if the block completes.

    The header is written last, so a temp file left by a crash has no magic and can never pass
    for a valid file; the rename happens after fsync, and the directory is fsynced after it.
    """
    directory = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}."
    _remove_stale_temporaries(directory, prefix)
    fd, tmp = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class RecordFile:
    """Records ``[n, seq_len]`` stored raw in a file, gathered with positioned reads.

    The writer reads each output chunk's records from all over its source. Through a memory map
    those reads would leave the whole file in the process's resident set (the kernel maps page
    cache in blocks of up to 2 MiB per touch); ``pread`` copies just the records and keeps the
    resident set at one chunk, whatever the file size.
    """

    def __init__(
        self, fd: int, offset: int, shape: tuple[int, int], dtype: np.dtype[np.integer]
    ) -> None:
        self.fd, self.offset, self.shape, self.dtype = fd, offset, shape, dtype
        self.row_bytes = shape[1] * dtype.itemsize

    def gather(self, indices: npt.NDArray[np.int64]) -> npt.NDArray[np.integer]:
        """Rows ``indices`` (ascending), reading each run of consecutive rows at once."""
        out = np.empty((indices.size, self.shape[1]), dtype=self.dtype)
        if indices.size == 0:
            return out
        breaks = np.flatnonzero(np.diff(indices) != 1) + 1
        starts = np.concatenate([[0], breaks]).tolist()
        ends = np.concatenate([breaks, [indices.size]]).tolist()
        first = indices[starts].tolist()
        for a, b, row in zip(starts, ends, first, strict=True):
            want = (b - a) * self.row_bytes
            got = os.preadv(self.fd, [out[a:b].data], self.offset + row * self.row_bytes)
            if got != want:
                raise WriteError(f"source file ended early: read {got} of {want} bytes")
        return out


def _as_record_file(source: npt.NDArray[np.integer]) -> RecordFile | None:
    """A ``RecordFile`` over an unsliced, C-ordered ``np.memmap``, else ``None``."""
    base: object = getattr(source, "base", None)  # the mmap itself only when not a view
    if not isinstance(source, np.memmap) or not isinstance(base, mmap.mmap):
        return None
    if not source.flags.c_contiguous or source.filename is None:
        return None
    fd = os.open(source.filename, os.O_RDONLY | os.O_CLOEXEC)
    shape = (int(source.shape[0]), int(source.shape[1]))
    return RecordFile(fd, int(source.offset), shape, source.dtype)


def _file_header(total: int, batch_size: int, seq_len: int, seed: int) -> Header:
    """The header of a file of ``total`` records: the remainder past whole batches is dropped."""
    return Header(
        batch_size=batch_size,
        seq_len=seq_len,
        num_batches=total // batch_size,
        seed=seed,
        total_records=total,
    )


def _write_permuted(
    path: str, source: npt.NDArray[np.integer] | RecordFile, batch_size: int, seed: int, what: str
) -> int:
    """Write ``source`` ([N, T]) as an LLMBATCH file at ``path``; return the batch count."""
    total, seq_len = int(source.shape[0]), int(source.shape[1])
    if total > U32_MAX:
        raise WriteError(f"{what}: {total} records exceed the u32 total_records field")
    header = _file_header(total, batch_size, seq_len, seed)
    batch_words = batch_size * seq_len
    per_chunk = max(1, CHUNK_BYTES // header.padded_batch_bytes)
    buf = np.zeros((min(per_chunk, max(header.num_batches, 1)), header.slot_words), TOKEN_DTYPE)
    with _atomic_output(path) as f:
        f.write(bytes(HEADER_SIZE))  # placeholder: no magic until the data is complete
        for b0 in range(0, header.num_batches, per_chunk):
            b1 = min(b0 + per_chunk, header.num_batches)
            m = b1 - b0
            positions = np.arange(b0 * batch_size, b1 * batch_size, dtype=np.uint64)
            wanted = permute_array(positions, total, seed, DOMAIN_RECORDS).astype(np.int64)
            order = np.argsort(wanted, kind="stable")  # read the source in ascending order
            ascending = wanted[order]
            picked = (
                source.gather(ascending)
                if isinstance(source, RecordFile)
                else np.asarray(source[ascending])
            )
            rows = _to_u32(picked, what, 0)
            # Scatter straight into the slots' token area (a [m, B, T] view of the buffer).
            slots = buf[:m, :batch_words].reshape(m, batch_size, seq_len)
            slots[order // batch_size, order % batch_size] = rows
            if not isinstance(source, RecordFile):
                release_pages(source)  # a mapped source must not pile up in the resident set
            f.write(buf[:m].data)
        f.seek(0)
        f.write(build_header(header))
    return header.num_batches


def _check_array(tokens: object, seq_len: int | None, what: str) -> npt.NDArray[np.integer]:
    if not isinstance(tokens, np.ndarray):
        raise WriteError(f"{what}: expected a numpy array, got {type(tokens).__name__}")
    _check_token_dtype(tokens.dtype, what)
    if tokens.ndim != 2:
        raise WriteError(f"{what}: expected shape [num_records, seq_len], got {tokens.shape}")
    if seq_len is not None and tokens.shape[1] != seq_len:
        raise WriteError(f"{what}: seq_len={seq_len} but records have {tokens.shape[1]} tokens")
    if tokens.shape[1] == 0:
        raise WriteError(f"{what}: records have 0 tokens; seq_len must be at least 1")
    return tokens


def _check_values(tokens: npt.NDArray[np.integer], what: str) -> None:
    """Reject out-of-range tokens anywhere in the input, including the dropped remainder."""
    if tokens.dtype.kind == "u" and tokens.dtype.itemsize <= TOKEN_BYTES:
        return
    step = max(1, CHUNK_BYTES // max(1, tokens.shape[1] * tokens.dtype.itemsize))
    for r0 in range(0, tokens.shape[0], step):
        _to_u32(np.asarray(tokens[r0 : r0 + step]), what, r0)


def write_batch_file(
    output_path: PathLike,
    tokens_array: npt.NDArray[np.integer],
    batch_size: int,
    seq_len: int | None = None,
    seed: int = 0,
) -> int:
    """Write a ``[num_records, seq_len]`` integer array as an LLMBATCH file; return num_batches.

    Records are permuted by ``seed`` (``SPEC.md``), grouped into batches of ``batch_size``, and
    the remainder is dropped. ``tokens_array`` may be a ``np.memmap``: it is read a chunk at a
    time. Tokens must fit in uint32. The file appears atomically, and the same input and seed
    always give the same bytes.

    >>> import numpy as np
    >>> write_batch_file("x.batch", np.arange(64, dtype=np.uint32).reshape(8, 8), 4, seed=1)
    ... # doctest: +SKIP
    2
    """
    path = _check_destination(output_path)
    b = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    s = int_arg("seed", seed, 0, U32_MAX, WriteError)
    if seq_len is not None:
        seq_len = int_arg("seq_len", seq_len, 1, U32_MAX, WriteError)
    tokens = _check_array(tokens_array, seq_len, "tokens_array")
    _check_values(tokens, "tokens_array")
    records = _as_record_file(tokens)
    if records is None:
        return _write_permuted(path, tokens, b, s, "tokens_array")
    try:
        return _write_permuted(path, records, b, s, "tokens_array")
    finally:
        os.close(records.fd)


def _record_blocks(
    tokens_iter: Iterable[npt.ArrayLike], total_records: int | None, seq_len: int
) -> Iterator[npt.NDArray[np.uint32]]:
    """Checked ``[k, seq_len]`` uint32 blocks of the stream (1-D items become one-row blocks).

    ``total_records=None`` accepts any count up to the u32 limit of the header field; otherwise
    the stream must yield exactly ``total_records`` records (checked when it ends).
    """
    limit = U32_MAX if total_records is None else total_records
    count = 0
    for item in tokens_iter:
        arr = np.asarray(item)
        what = f"tokens_iter item at record {count}"
        _check_token_dtype(arr.dtype, what)
        if arr.ndim == 1:
            arr = arr.reshape(1, -1)
        if arr.ndim != 2 or arr.shape[1] != seq_len:
            raise WriteError(
                f"{what}: expected shape ({seq_len},) or (k, {seq_len}), got {np.shape(item)}"
            )
        if count + arr.shape[0] > limit:
            raise WriteError(
                f"tokens_iter yields more than total_records={total_records} records"
                if total_records is not None
                else f"tokens_iter yields more than {U32_MAX} records, the u32 header limit"
            )
        yield np.ascontiguousarray(_to_u32(arr, "tokens_iter", count))
        count += arr.shape[0]
    if total_records is not None and count != total_records:
        raise WriteError(f"tokens_iter yielded {count} records, but total_records={total_records}")


WINDOW_BYTES = CHUNK_BYTES
"""Output bytes the streaming writer assembles in memory at once (one window of slots)."""

STAGE_BYTES = CHUNK_BYTES
"""Input bytes the streaming writer sorts by destination window before writing them out."""

STAGE_SHARE_DIRECT = 4
"""A block of at least ``1 / STAGE_SHARE_DIRECT`` of the stage is placed without staging."""


def _scatter_mapped(
    fd: int, offset: int, slots: npt.NDArray[np.uint32], order: npt.NDArray[np.intp]
) -> None:
    """``slots[order[i] // B, order[i] % B] = row i`` of the packed rows at ``offset`` in ``fd``.

    The rows are read through a temporary read-only mapping: one copy fewer than reading them
    into a buffer first, and the mapping leaves the resident set when it closes.
    """
    m, b, t = slots.shape
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    mm = mmap.mmap(fd, m * b * t * TOKEN_BYTES, flags=flags, prot=mmap.PROT_READ, offset=offset)
    try:
        packed = np.frombuffer(mm, dtype=TOKEN_DTYPE).reshape(m * b, t)
        slots[order // b, order % b] = packed
        del packed
    finally:
        mm.close()


def _write_all(fd: int, data: npt.NDArray[np.uint32], offset: int) -> None:
    """``data`` (C-contiguous) written at ``offset`` of ``fd``, however many calls it takes."""
    view = memoryview(data.reshape(-1).view(np.uint8).data)
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise WriteError(f"write of {len(view)} bytes at offset {offset} returned {n}")
        view, offset = view[n:], offset + n


POSITIONS_AHEAD = 1 << 16
"""Input records whose output positions are computed at once (few large NumPy calls)."""


class _AheadPermutation:
    """The record permutation (or its inverse) over consecutive indices, computed in bulk.

    Each NumPy evaluation of the Feistel network costs a few dozen array operations whatever
    the array's length, so indices are evaluated ``POSITIONS_AHEAD`` at a time and served from
    that window; memory stays a few such arrays.
    """

    def __init__(
        self,
        fn: Callable[[npt.ArrayLike, int, int, int], npt.NDArray[np.uint64]],
        header: Header,
        limit: int,
    ) -> None:
        self.fn, self.header, self.limit = fn, header, limit
        self.values, self.first = np.empty(0, dtype=np.uint64), 0

    def get(self, first: int, k: int) -> npt.NDArray[np.uint64]:
        """Images of indices ``first .. first + k`` (all below ``limit``)."""
        end = first + k
        if not (self.first <= first and end <= self.first + self.values.size):
            n = min(max(k, POSITIONS_AHEAD), self.limit - first)
            ids = np.arange(first, first + n, dtype=np.uint64)
            h = self.header
            self.values, self.first = self.fn(ids, h.total_records, h.seed, DOMAIN_RECORDS), first
        return self.values[first - self.first : end - self.first]


class _WindowedOutput:
    """Places a stream of records at their permuted positions with large writes only.

    A random permutation sends consecutive input records all over the output, so writing each
    record where it belongs costs one small positioned write per record (several microseconds
    each in the page cache). Instead the output is cut into windows of ``WINDOW_BYTES``: as
    the stream arrives, records are sorted by the window they belong to and appended, packed,
    at the start of that window's byte range in an unlinked sorting file beside the output (one
    write per window per input block); at the end each window is mapped, its records are put
    in their slots in memory, and the window is written to the output in one piece, in file
    order. The output thus gets only large sequential writes, which also leaves its page cache
    in large folios that are cheap to map for the reader that follows; the sorting file lives
    in the page cache and is dropped with its last reference. File reads and writes run on one
    I/O thread, in submission order, while this thread computes the next block's or window's
    placement; at most two pieces of work are in flight, so memory is a few stages and windows
    whatever the dataset size.
    """

    def __init__(self, out_fd: int, sort_fd: int, header: Header) -> None:
        self.out_fd, self.sort_fd, self.header = out_fd, sort_fd, header
        b, t = header.batch_size, header.seq_len
        self.row_bytes = t * TOKEN_BYTES
        self.kept = header.num_batches * b
        self.window_batches = max(1, WINDOW_BYTES // header.padded_batch_bytes)
        self.window_records = self.window_batches * b
        n_windows = -(-header.num_batches // self.window_batches)
        window_bytes = self.window_batches * header.padded_batch_bytes
        self.starts = HEADER_SIZE + np.arange(n_windows, dtype=np.int64) * window_bytes
        self.cursors = self.starts.copy()
        stage_rows = max(1, min(STAGE_BYTES // self.row_bytes, max(self.kept, 1)))
        self.stage = np.empty((stage_rows, t), dtype=TOKEN_DTYPE)
        self.staged = 0
        self.placed = 0  # input records placed so far (the stream index of stage row 0)
        # Input record -> output position (phase 1), output position -> input record (phase 2).
        self.positions = _AheadPermutation(unpermute_array, header, header.total_records)
        self.sources = _AheadPermutation(permute_array, header, self.kept)
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerobatch-writer")
        self.pending: deque[Future[None]] = deque()

    def close(self) -> None:
        """Wait for the I/O thread (also after an error: the file must not close under it)."""
        for job in self.pending:
            job.cancel()
        self.io.shutdown(wait=True)
        self.pending.clear()

    def _submit(self, fn: Callable[..., None], *args: object) -> None:
        while len(self.pending) >= 2:
            self.pending.popleft().result()  # bounds memory in flight; re-raises I/O errors
        self.pending.append(self.io.submit(fn, *args))

    def add(self, rows: npt.NDArray[np.uint32]) -> None:
        """Take the next input records, in stream order."""
        if rows.shape[0] >= self.stage.shape[0] // STAGE_SHARE_DIRECT:  # place without staging
            self._flush()
            self._place(rows)
            return
        done = 0
        while done < rows.shape[0]:
            take = min(rows.shape[0] - done, self.stage.shape[0] - self.staged)
            self.stage[self.staged : self.staged + take] = rows[done : done + take]
            self.staged += take
            done += take
            if self.staged == self.stage.shape[0]:
                self._flush()

    def _flush(self) -> None:
        if self.staged:
            self._place(self.stage[: self.staged])
        self.staged = 0

    def _place(self, rows: npt.NDArray[np.uint32]) -> None:
        """Append the next ``len(rows)`` input records to their windows' packed areas."""
        k = rows.shape[0]
        pos = self.positions.get(self.placed, k).astype(np.int64)
        window = pos // self.window_records
        window[pos >= self.kept] = -1  # the dropped remainder is never written
        order = np.argsort(window, kind="stable")  # stable: input order within each window
        order = order[window[order] >= 0]
        self.placed += k
        if order.size == 0:
            return
        w_sorted = window[order]
        cuts = np.flatnonzero(np.diff(w_sorted)) + 1
        firsts = np.concatenate([[0], cuts])
        counts = np.diff(np.concatenate([firsts, [order.size]]))
        ws = w_sorted[firsts]
        offsets = self.cursors[ws].copy()
        self.cursors[ws] += counts * self.row_bytes
        packed = rows[order]  # a copy: the caller may reuse ``rows`` once this returns
        self._submit(self._write_pieces, packed, firsts.tolist(), offsets.tolist())

    def _write_pieces(
        self, packed: npt.NDArray[np.uint32], firsts: list[int], offsets: list[int]
    ) -> None:
        ends = [*firsts[1:], packed.shape[0]]
        for a, e, off in zip(firsts, ends, offsets, strict=True):
            _write_all(self.sort_fd, packed[a:e], off)

    def _write_window(self, data: npt.NDArray[np.uint32], offset: int) -> None:
        _write_all(self.out_fd, data, offset)
        start_writeback(self.out_fd, offset, data.nbytes)  # final: let the disk start on them

    def finish(self) -> None:
        """Put every window's records in their slots and write the windows to the output."""
        self._flush()
        while self.pending:  # every packed record must be written before it is read back
            self.pending.popleft().result()
        h = self.header
        b, t = h.batch_size, h.seq_len
        self.stage = np.empty((0, t), dtype=TOKEN_DTYPE)  # its memory is not needed any more
        for w in range(len(self.starts)):
            if int(self.cursors[w] - self.starts[w]) != self._window_records(w) * self.row_bytes:
                raise WriteError(f"internal: window {w} received the wrong number of records")
        bufs = [np.zeros((self.window_batches, h.slot_words), dtype=TOKEN_DTYPE) for _ in range(2)]
        for w, start in enumerate(self.starts.tolist()):
            m = self._window_records(w) // b
            sources = self.sources.get(w * self.window_records, m * b)
            order = np.argsort(sources, kind="stable")  # packed rows are in source order
            buf = bufs[w % 2]
            while len(self.pending) > 1:  # the write that last used ``buf`` must be done
                self.pending.popleft().result()
            slots = buf[:m, : b * t].reshape(m, b, t)
            _scatter_mapped(self.sort_fd, start, slots, order)
            discard(self.sort_fd, start, m * b * self.row_bytes)  # used: never written back
            self._submit(self._write_window, buf[:m], start)
        while self.pending:
            self.pending.popleft().result()

    def _window_records(self, w: int) -> int:
        """Records in window ``w`` (whole batches; only the last window may be short)."""
        return min(self.window_records, self.kept - w * self.window_records)


def _write_stream(
    path: str,
    blocks: Iterable[npt.NDArray[np.uint32]],
    total: int,
    batch_size: int,
    seq_len: int,
    seed: int,
) -> int:
    """Write a stream of ``total`` records (known up front) as an LLMBATCH file at ``path``."""
    header = _file_header(total, batch_size, seq_len, seed)
    size = header.file_size
    directory = os.path.dirname(os.path.abspath(path))
    with (
        _atomic_output(path) as f,
        tempfile.TemporaryFile(dir=directory, prefix=".zerobatch-sort-") as sort,
    ):
        fd = f.fileno()
        os.ftruncate(fd, size)
        os.ftruncate(sort.fileno(), size)
        out = _WindowedOutput(fd, sort.fileno(), header)
        try:
            for rows in blocks:
                out.add(rows)
            out.finish()
        finally:
            out.close()
        os.pwrite(fd, build_header(header), 0)  # last: no magic until the data is complete
    return header.num_batches


def _spilled_blocks(spill: BinaryIO, n: int, seq_len: int) -> Iterator[npt.NDArray[np.uint32]]:
    """The spilled records read back in order, ``CHUNK_BYTES`` at a time."""
    records = RecordFile(spill.fileno(), 0, (n, seq_len), TOKEN_DTYPE)
    per_read = max(1, CHUNK_BYTES // records.row_bytes)
    for r0 in range(0, n, per_read):
        yield records.gather(np.arange(r0, min(r0 + per_read, n), dtype=np.int64)).view(np.uint32)


def write_batch_dataset(
    output_path: PathLike,
    tokens_iter: Iterable[npt.ArrayLike],
    total_records: int | None,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
) -> int:
    """Write a stream of records as an LLMBATCH file with bounded memory; return num_batches.

    ``tokens_iter`` yields records of ``seq_len`` tokens (1-D arrays) or blocks of records
    (2-D ``[k, seq_len]``), ``total_records`` in all. Records are sorted towards their output
    windows through an unlinked scratch file beside the output and each window is written
    once, permuted, in file order (``_WindowedOutput``), so the result is byte-identical to
    ``write_batch_file`` on the same records. ``total_records=None`` accepts a stream of
    unknown length: the permutation needs the count, so the stream is then first spilled to
    another temporary file (``total_records * seq_len * 4`` bytes) and read back in order.
    Peak memory is a block of the stream plus a few ``CHUNK_BYTES``,
    whatever the dataset size.
    """
    path = _check_destination(output_path)
    b = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    t = int_arg("seq_len", seq_len, 1, U32_MAX, WriteError)
    s = int_arg("seed", seed, 0, U32_MAX, WriteError)
    expected = (
        None
        if total_records is None
        else int_arg("total_records", total_records, 0, U32_MAX, WriteError)
    )
    if expected is not None:
        return _write_stream(path, _record_blocks(tokens_iter, expected, t), expected, b, t, s)
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.TemporaryFile(dir=directory, prefix=".zerobatch-spill-") as spill:
        n = 0
        for rows in _record_blocks(tokens_iter, None, t):
            spill.write(rows.data)
            n += rows.shape[0]
        spill.flush()
        return _write_stream(path, _spilled_blocks(spill, n, t), n, b, t, s)
