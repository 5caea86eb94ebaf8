"""Writers: records in, one atomically written, seed-permuted LLMBATCH file out.

Output record position ``p`` holds input record ``permute(p, total_records, seed)``
(``SPEC.md``, "Record permutation"); the last ``total_records % batch_size`` positions are the
dropped remainder. The output is produced in file order, a few MiB at a time, by gathering the
records each chunk needs, so memory is bounded by the chunk size and never by the dataset.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
from zerobatch_spec import (
    DOMAIN_RECORDS,
    HEADER_SIZE,
    Header,
    build_header,
    permute_array,
)
from zerobatch_spec.layout import U32_MAX

from .arguments import int_arg
from .errors import WriteError
from .pages import release_pages

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
        return rows.astype("<u4", copy=False)
    if rows.dtype.kind == "u" and rows.dtype.itemsize <= 4:
        return rows.astype("<u4")
    bad = (rows < 0) | (rows > U32_MAX)
    if bad.any():
        r, c = (int(x[0]) for x in np.nonzero(bad))
        raise WriteError(
            f"{what}: record {first_record + r}, token {c}: value {int(rows[r, c])} is outside "
            f"the uint32 range [0, 2**32 - 1]"
        )
    return rows.astype("<u4")


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


def _write_permuted(
    path: str, source: npt.NDArray[np.integer] | RecordFile, batch_size: int, seed: int, what: str
) -> int:
    """Write ``source`` ([N, T]) as an LLMBATCH file at ``path``; return the batch count."""
    total, seq_len = int(source.shape[0]), int(source.shape[1])
    if total > U32_MAX:
        raise WriteError(f"{what}: {total} records exceed the u32 total_records field")
    header = Header(
        batch_size=batch_size,
        seq_len=seq_len,
        num_batches=total // batch_size,
        seed=seed,
        total_records=total,
    )
    slot_words = header.padded_batch_bytes // 4
    batch_words = batch_size * seq_len
    per_chunk = max(1, CHUNK_BYTES // header.padded_batch_bytes)
    buf = np.zeros((min(per_chunk, max(header.num_batches, 1)), slot_words), dtype="<u4")
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
    if tokens.dtype == np.uint32 or (tokens.dtype.kind == "u" and tokens.dtype.itemsize < 4):
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


def _spill_records(
    f: BinaryIO, tokens_iter: Iterable[npt.ArrayLike], total_records: int | None, seq_len: int
) -> int:
    """Stream records (1-D rows or 2-D blocks of rows) to ``f`` as raw uint32; return the count.

    ``total_records=None`` accepts any count up to the u32 limit of the header field.
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
        f.write(np.ascontiguousarray(_to_u32(arr, "tokens_iter", count)).data)
        count += arr.shape[0]
    if total_records is not None and count != total_records:
        raise WriteError(f"tokens_iter yielded {count} records, but total_records={total_records}")
    return count


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
    (2-D ``[k, seq_len]``), ``total_records`` in all (``None``: as many as it yields; the
    count is then known only at the end, which the permutation needs). The stream is spilled
    to a temporary file beside the output and then written exactly as ``write_batch_file``
    would write the same records, so both give byte-identical files. Peak memory is a few
    chunks of ``CHUNK_BYTES``, whatever the dataset size; the temporary file needs
    ``total_records * seq_len * 4`` bytes.
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
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.TemporaryFile(dir=directory, prefix=".zerobatch-spill-") as spill:
        n = _spill_records(spill, tokens_iter, expected, t)
        spill.flush()
        records = RecordFile(spill.fileno(), 0, (n, t), np.dtype("<u4"))
        return _write_permuted(path, records, b, s, "tokens_iter")
