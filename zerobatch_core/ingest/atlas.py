"""Atlas datasets (``torch-atlas-ds``) of token examples, read as :class:`~.token_files.TokenFile`.

Layout (version 1)::

    dataset_root/
        meta.json       {"version": 1, "shard_sizes": [...], "compression_strategy": 0..3}
        zstd_dict.bin   the shared dictionary (strategy 2)
        00/ 01/ ...     shard folders, numbered from 0, zero-padded to one width
            meta.json   {"version": 1, "block_size": B, "stored_examples": N,
                         "compression_strategy": 0..3, "compression_level": ...,
                         "compression_dict_size": ...}
            data.bin    blocks, one after the other
            index.npy   N_blocks + 1 unsigned offsets into data.bin (the last: its size)
            zstd_dict.bin   the shard's own dictionary (strategy 3)

A block is a pickled Python ``list`` of up to ``block_size`` examples, stored as is (strategy
0) or as one zstd frame (1: no dictionary, 2: the dataset's shared ``zstd_dict.bin``, 3: the
shard's own). Every block but the last holds exactly ``block_size`` examples.

**What an example is.** Each example is one document. It is a token sequence (a ``list`` or
``tuple`` of Python ``int``, NumPy integer scalars included, or a 1-D NumPy array of any integer
dtype), or a ``dict`` whose ``field`` key (``input_ids`` unless ``field=`` names another) holds
one. With ``field=None`` dict examples are refused. Tokens must be integers in
``[0, 2**32 - 1]``: a float, a bool, a negative or too large value, a float or 2-D array, or
any other kind of example is an ``IngestError`` naming the block, the example and the token.
A shard's stream (one :class:`AtlasShard` per shard folder) is its examples' tokens
concatenated in order, as ``uint32``; an empty example starts where the next one does.

**Pickles are never trusted.** ``pickle.load`` is never called. A block's opcode stream is first
scanned (``scan_pickle``, linear): every opcode known, none that builds class instances, uses
persistent ids, extensions or out-of-band buffers, and no length prefix claiming more bytes than
remain, so the unpickler never allocates more than the block holds. It is then decoded by
:class:`RestrictedUnpickler`, whose ``find_class`` gives only stand-ins of its own for the
globals NumPy's pickles of integer arrays and scalars name (``numpy.dtype``, ``numpy.ndarray``,
``numpy[._]core.multiarray._reconstruct`` and ``.scalar``,
``numpy[._]core.numeric._frombuffer``, and ``_codecs.encode`` and ``bytes()`` for the bytes of
protocol 2 pickles; see ``ALLOWED_GLOBALS``). The stand-ins build integer dtypes and arrays from
the bytes given, nothing else; they are never NumPy's own functions. Any other global
(``os.system``, ``builtins.eval``, ``subprocess.Popen``, ``builtins.getattr``, ...) is refused
before it is looked up, so nothing the pickle names ever runs; ``persistent_load`` (``PERSID``)
is refused too. What the C unpickler builds without a global is plain data: lists, tuples,
dicts, sets, str, bytes, int, float, bool, None.

**Validation.** Opening a shard checks its ``meta.json`` (and the dataset's) field by field,
``index.npy`` (header parsed by ``numpy.lib.format`` with its header-size limit, never
``np.load`` and never pickles: an unsigned 1, 2, 4 or 8-byte dtype, 1-D, exactly
``ceil(stored_examples / block_size) + 1`` entries, the file exactly that long, starting at 0,
never decreasing, every block at most ``max_block_bytes``, the last entry the size of
``data.bin``), and that the dictionary the strategy needs exists. Every file is opened without
blocking and must be a regular file (a FIFO named ``data.bin`` is refused, not waited on).
Blocks are checked as they are decoded: one complete zstd frame and nothing after it, a pickle
and nothing after it, a ``list`` of exactly the number of examples the block must hold.

**Memory is bounded** whatever the dataset size. A block may take at most ``max_block_bytes``
(default 256 MiB) in ``data.bin`` and may decompress to at most as much: a frame header that
declares more, or a frame that produces more, is refused as a decompression bomb before more
than ``2 * max_block_bytes`` is held (frames are fed to zstd in slices small enough that one
slice cannot expand past the cap by more than the cap; zstd's own window limit, 128 MiB, also
holds). The decoded Python objects of one block (at most about 100 bytes per decompressed byte
for a hostile pickle, about 10 for lists of ints), its tokens, and one zstd dictionary are held
at a time: the shards of one ``expand_atlas`` call share a single decoded block and
decompressor (``BlockSlot``). Per shard the index (8 bytes per block), the stream offset of
each block (8 bytes per block) and, once counted, the document starts (8 bytes per example) are
kept. No descriptor stays open between reads. Known limit: the C unpickler builds dicts and
sets itself, so a hostile block of one dict with millions of colliding integer keys takes time
quadratic in its size (it is bounded by ``max_block_bytes``, not linear).

**Passes.** The format stores no token counts, so ``num_tokens`` and ``document_starts`` need
one pass over the shard, made on first use (each block decompressed and decoded once, the
starts cached); ``read_tokens`` then decodes a block at a time, keeping the last one, so
ascending ranges decode each block once. A block whose token count differs from the counting
pass (``data.bin`` rewritten meanwhile) is refused. ``zstandard`` (the ``formats`` extra) is
imported when a compressed shard is opened.
"""

from __future__ import annotations

import glob
import io
import itertools
import math
import os
import pickle
import pickletools
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec.dataset import loads_strict

from ..arguments import U32_MAX, int_arg
from ..closing import Closing
from ..errors import IngestError, MissingDependencyError, ZeroBatchIOError
from ..stores.regular_files import open_regular_file
from ..tokenization.protocol import import_optional
from .records import I64Array
from .source import PathLike, Patterns, SourceFile

META_NAME = "meta.json"
DATA_NAME = "data.bin"
INDEX_NAME = "index.npy"
DICT_NAME = "zstd_dict.bin"
VERSION = 1
"""The only Atlas format version there is."""
STRATEGIES: dict[int, str] = {
    0: "no compression",
    1: "zstd",
    2: "zstd with the dataset's shared dictionary",
    3: "zstd with the shard's own dictionary",
}
"""``compression_strategy`` values and what each means for reading a block."""
FALLBACKS: dict[int, tuple[int, ...]] = {0: (0,), 1: (1,), 2: (2, 1), 3: (3, 1)}
"""Shard strategies a dataset's strategy allows: the writer falls back to plain zstd (1) for a
shard of fewer than 7 blocks, too few to train a dictionary on."""
DEFAULT_FIELD = "input_ids"
MAX_BLOCK_BYTES = 256 * 2**20
"""Default cap on a block's size in ``data.bin`` and on what it decompresses to."""
MAX_META_BYTES = 2**20
"""A ``meta.json`` larger than this is refused unread."""
MAX_DICT_BYTES = 512 * 2**20
"""A ``zstd_dict.bin`` larger than this is refused unread."""
NPY_HEADER_LIMIT = 10_000
"""Longest ``index.npy`` header accepted (NumPy's own default limit)."""
ZSTD_MAX_RATIO = 2**15
"""The most a zstd frame expands per input byte (a 4-byte RLE block gives 128 KiB): frames are
fed in slices of ``room // ZSTD_MAX_RATIO`` bytes, so one slice cannot overshoot the cap."""
ZSTD_MIN_SLICE = 64

_INT_CODES = frozenset(f"{kind}{size}" for kind in "iu" for size in (1, 2, 4, 8))
_DIGITS = re.compile(r"[0-9]+")
_MAX_ARRAY_DIMS = 32

U32Array = npt.NDArray[np.uint32]
U64Array = npt.NDArray[np.uint64]


def _short(value: object, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters, for messages about hostile
    data (a huge integer is described by its size, a repr that fails by the type's name)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = ascii(value)
    except Exception:  # a repr too deep (RecursionError) or too long to build
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _name(text: str, limit: int = 100) -> str:
    """A name from a pickle (a global's module or name), printable and cut to ``limit``."""
    shown = ascii(text)[1:-1]
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _kind(value: object) -> str:
    """What ``value`` is, in words, for a message (never its contents)."""
    if isinstance(value, _Array):
        return "a NumPy array"
    if isinstance(value, _DType):
        return "a NumPy dtype"
    if isinstance(value, _Allowed):
        return f"the global {value.name}"
    if isinstance(value, bool):
        return "a bool"
    if value is None:
        return "None"
    name = type(value).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


# --- the restricted unpickler ------------------------------------------------------------------


class PickleRefusedError(Exception):
    """A block's pickle asks for something the restricted unpickler does not build."""


class _Allowed:
    """What ``find_class`` gives for an allowed global: a callable stand-in, never the real
    object, with no attributes a pickle could reach (``BUILD`` on it is refused)."""

    __slots__ = ("_build", "name")

    def __init__(self, name: str, build: Callable[..., Any] | None) -> None:
        self.name = name
        self._build = build

    def __call__(self, *args: Any) -> Any:
        if self._build is None:
            raise PickleRefusedError(f"{self.name} is only allowed as the type of an array")
        return self._build(*args)

    def __setstate__(self, state: object) -> None:
        raise PickleRefusedError(f"the pickle sets the state of {self.name}")


class _DType:
    """``numpy.dtype(code, align, copy)`` followed by its ``BUILD`` state: integer types only."""

    __slots__ = ("code", "order")

    def __init__(self, code: str) -> None:
        self.code = code
        self.order = "="

    def __setstate__(self, state: object) -> None:
        if not (
            isinstance(state, tuple)
            and len(state) in (8, 9)
            and type(state[0]) is int
            and state[0] in (3, 4)
            and state[1] in ("<", ">", "|", "=")
            and all(s is None for s in state[2:5])
            and all(type(s) is int for s in state[5:8])
            and (len(state) == 8 or state[8] is None)
        ):
            raise PickleRefusedError(f"NumPy dtype {self.code!r} with an unexpected state")
        self.order = state[1]

    def resolve(self) -> np.dtype[Any]:
        order = self.order if self.order in "<>" else ""
        return np.dtype(order + self.code)


class _Array:
    """An integer NumPy array a pickle describes: ``_reconstruct`` then ``BUILD`` (protocols
    0-4), or ``_frombuffer`` (protocol 5). ``array`` is built from the pickle's bytes only."""

    __slots__ = ("array",)

    def __init__(self, array: npt.NDArray[np.integer[Any]] | None = None) -> None:
        self.array = array

    def __setstate__(self, state: object) -> None:
        if self.array is not None:
            raise PickleRefusedError("the pickle sets the state of an array twice")
        if isinstance(state, tuple) and len(state) == 5 and state[0] == 1:
            state = state[1:]
        if not (isinstance(state, tuple) and len(state) == 4):
            raise PickleRefusedError("a NumPy array with an unexpected state")
        shape, dtype, fortran, raw = state
        if type(fortran) is not bool:
            raise PickleRefusedError("a NumPy array whose order flag is not a bool")
        self.array = _build_array(raw, dtype, shape, "F" if fortran else "C")


def _build_array(
    raw: object, dtype: object, shape: object, order: object
) -> npt.NDArray[np.integer[Any]]:
    if not isinstance(dtype, _DType):
        raise PickleRefusedError(
            f"a NumPy array whose dtype is {_kind(dtype)}, not an integer dtype"
        )
    if not (
        isinstance(shape, tuple)
        and len(shape) <= _MAX_ARRAY_DIMS
        and all(type(n) is int and 0 <= n < 2**63 for n in shape)
    ):
        raise PickleRefusedError(f"a NumPy array of shape {_short(shape)}")
    if not isinstance(raw, (bytes, bytearray)):
        raise PickleRefusedError(f"a NumPy array whose data is {_kind(raw)}, not bytes")
    if order not in ("C", "F"):
        raise PickleRefusedError(f"a NumPy array of order {_short(order)}")
    dt = dtype.resolve()
    if math.prod(shape) * dt.itemsize != len(raw):
        raise PickleRefusedError(
            f"a NumPy array of shape {shape} and dtype {dt} with {len(raw)} bytes of data"
        )
    array: npt.NDArray[np.integer[Any]] = np.frombuffer(raw, dtype=dt)
    return array.reshape(shape, order=order)


def _make_dtype(code: object, align: object = False, copy: object = False) -> _DType:
    if not isinstance(code, str) or code not in _INT_CODES:
        raise PickleRefusedError(f"NumPy dtype {_short(code)} (only integer dtypes are decoded)")
    return _DType(code)


def _reconstruct(subtype: object, shape: object, typecode: object) -> _Array:
    if subtype is not _NDARRAY or not isinstance(shape, tuple) or not isinstance(typecode, bytes):
        raise PickleRefusedError("numpy _reconstruct of something other than a plain ndarray")
    return _Array()


def _frombuffer(buf: object, dtype: object, shape: object, order: object) -> _Array:
    return _Array(_build_array(buf, dtype, shape, order))


def _scalar(dtype: object, data: object) -> int:
    if not isinstance(dtype, _DType):
        raise PickleRefusedError(f"a NumPy scalar whose dtype is {_kind(dtype)}")
    dt = dtype.resolve()
    if not isinstance(data, bytes) or len(data) != dt.itemsize:
        raise PickleRefusedError(f"a NumPy {dt} scalar whose data is not {dt.itemsize} bytes")
    return int(np.frombuffer(data, dtype=dt)[0])


def _empty_bytes(*args: object) -> bytes:
    if args:  # ``bytes(n)`` would allocate what the pickle asks for
        raise PickleRefusedError("builtins.bytes other than of no arguments")
    return b""


def _latin1(text: object, encoding: object = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise PickleRefusedError("_codecs.encode other than of a str to latin-1 bytes")
    return text.encode("latin-1")


_NDARRAY = _Allowed("numpy.ndarray", None)

ALLOWED_GLOBALS: dict[tuple[str, str], _Allowed] = {
    ("numpy", "dtype"): _Allowed("numpy.dtype", _make_dtype),
    ("numpy", "ndarray"): _NDARRAY,
    **{
        (module, name): _Allowed(f"{module}.{name}", build)
        for core in ("numpy.core", "numpy._core")
        for module, name, build in (
            (f"{core}.multiarray", "_reconstruct", _reconstruct),
            (f"{core}.multiarray", "scalar", _scalar),
            (f"{core}.numeric", "_frombuffer", _frombuffer),
        )
    },
    ("_codecs", "encode"): _Allowed("_codecs.encode", _latin1),
    **{
        (module, "bytes"): _Allowed(f"{module}.bytes", _empty_bytes)
        for module in ("builtins", "__builtin__")
    },
}
"""The only globals a block's pickle may name, and the stand-in each resolves to."""


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only ``ALLOWED_GLOBALS`` (to stand-ins, module
    docstring) and refuses persistent ids: every other global is a ``PickleRefusedError`` naming
    its module and name, raised before anything is imported or called."""

    def find_class(self, module_name: str, global_name: str, /) -> Any:
        found = ALLOWED_GLOBALS.get((module_name, global_name))
        if found is None:
            raise PickleRefusedError(
                f"the pickle references the global {_name(module_name)}.{_name(global_name)}, "
                "which is not allowed (only lists, tuples, dicts, numbers, strings, bytes and "
                "NumPy integer arrays are decoded)"
            )
        return found

    def persistent_load(self, pid: Any, /) -> Any:
        raise PickleRefusedError("the pickle uses a persistent id, which is not allowed")


_NO_ARG, _FIXED, _LINES, _COUNTED, _REFUSED = range(5)
_OPCODE_REFUSED = frozenset(
    {
        *("PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4"),
        *("INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "NEXT_BUFFER", "READONLY_BUFFER"),
    }
)
"""Opcodes no pickle of examples needs: persistent ids, the extension registry, building
instances of classes, out-of-band buffers. Refused by the scan before the unpickler runs."""


def _opcode_table() -> tuple[list[int | None], list[int], list[bool], list[str]]:
    """Per opcode byte: its kind (``None``: unknown), its argument's size (fixed size, lines,
    or the length prefix's size), whether the prefix is signed, and its name."""
    kinds: list[int | None] = [None] * 256
    sizes, signed, names = [0] * 256, [False] * 256, ["?"] * 256
    for op in pickletools.opcodes:
        code, arg = ord(op.code), op.arg
        names[code] = op.name
        if op.name in _OPCODE_REFUSED:
            kinds[code] = _REFUSED
        elif arg is None:
            kinds[code] = _NO_ARG
        elif arg.n >= 0:
            kinds[code], sizes[code] = _FIXED, arg.n
        elif arg.n == pickletools.UP_TO_NEWLINE:
            kinds[code], sizes[code] = _LINES, 2 if arg.name.endswith("_pair") else 1
        else:
            prefix = {
                pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
                pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
                pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
                pickletools.TAKEN_FROM_ARGUMENT8U: (8, False),
            }[arg.n]
            kinds[code], (sizes[code], signed[code]) = _COUNTED, prefix
    return kinds, sizes, signed, names


_KINDS, _SIZES, _SIGNED, _NAMES = _opcode_table()
_STOP = ord(pickle.STOP)
_INT_OPS = frozenset(pickle.BININT1 + pickle.BININT2 + pickle.BININT)
_INT_RUN = re.compile(rb"(?:K.|M..|J....){1,1000}", re.DOTALL)
"""A run of the small-int opcodes that lists of tokens are made of, skipped at C speed (at
most 1000 at a time, so that the regex's own state stays small)."""


def scan_pickle(data: bytes | bytearray) -> None:
    """Check the opcode stream of ``data`` up to its ``STOP`` before any of it is unpickled.

    Every opcode must be known and allowed (not ``_OPCODE_REFUSED``), and every argument must
    lie inside ``data``: a length prefix (``BINBYTES8``, ``BYTEARRAY8``, ``BINUNICODE``...) that
    claims more bytes than remain is refused here, so the unpickler never allocates more than
    the block holds. Linear in ``len(data)``: runs of small ints (lists of tokens) are skipped
    by a regex. Raises ``PickleRefusedError`` naming the opcode and its offset.
    """
    n, pos = len(data), 0
    run = _INT_RUN.match
    while pos < n:
        code = data[pos]
        if code in _INT_OPS:
            m = run(data, pos)
            if m is None:
                raise PickleRefusedError(f"{_NAMES[code]} at offset {pos} is cut short")
            pos = m.end()
            continue
        kind, at = _KINDS[code], pos
        pos += 1
        if kind == _NO_ARG:
            if code == _STOP:
                return
        elif kind == _FIXED:
            pos += _SIZES[code]
        elif kind == _COUNTED:
            width = _SIZES[code]
            length = int.from_bytes(data[pos : pos + width], "little", signed=_SIGNED[code])
            pos += width
            if pos > n or not 0 <= length <= n - pos:
                raise PickleRefusedError(
                    f"{_NAMES[code]} at offset {at} claims {length:,} bytes, but "
                    f"{max(n - pos, 0):,} remain"
                )
            pos += length
        elif kind == _LINES:
            for _ in range(_SIZES[code]):
                end = data.find(b"\n", pos)
                if end < 0:
                    raise PickleRefusedError(f"{_NAMES[code]} at offset {at} has no newline")
                pos = end + 1
        elif kind == _REFUSED:
            raise PickleRefusedError(f"opcode {_NAMES[code]} at offset {at} is not allowed")
        else:
            raise PickleRefusedError(f"unknown opcode 0x{code:02x} at offset {at}")
    raise PickleRefusedError(f"the pickle ends without STOP ({n:,} bytes)")


def restricted_loads(data: bytes | bytearray) -> object:
    """The object ``data`` pickles, decoded by :class:`RestrictedUnpickler`.

    The opcode stream is checked first (``scan_pickle``). Raises ``PickleRefusedError`` for a
    refused opcode or global, and whatever the unpickler raises for a malformed pickle; bytes
    after the pickle's ``STOP`` are refused too.
    """
    scan_pickle(data)
    f = io.BytesIO(data)
    obj = RestrictedUnpickler(f).load()
    left = len(data) - f.tell()
    if left:
        raise PickleRefusedError(f"{left} bytes follow the end of the pickle")
    return obj


# --- examples to tokens --------------------------------------------------------------------------


class _BadExampleError(Exception):
    """An example that is not a token sequence (the message says why)."""


def example_tokens(example: object, field: str | None) -> U32Array:
    """The tokens of one decoded example (module docstring), as a fresh ``uint32`` array."""
    value = example
    if isinstance(example, dict):
        if field is None:
            raise _BadExampleError("is a dict, and no field was given to take its tokens from")
        if field not in example:
            keys = list(itertools.islice((k for k in example if isinstance(k, str)), 8))
            raise _BadExampleError(
                f"is a dict without the token field {field!r} (keys: {_short(keys, 200)})"
            )
        value = example[field]
        where = f"field {field!r} "
    else:
        where = ""
    if isinstance(value, _Array):
        return _array_tokens(value, where)
    if isinstance(value, (list, tuple)):
        return _list_tokens(value, where)
    expected = "a list of ints or an integer NumPy array"
    if not where and field is not None:
        expected += f", or a dict with the field {field!r}"
    raise _BadExampleError(f"{where}is {_kind(value)}, expected {expected}")


def _array_tokens(value: _Array, where: str) -> U32Array:
    a = value.array
    if a is None:
        raise _BadExampleError(f"{where}is a NumPy array whose data the pickle never gives")
    if a.ndim != 1:
        raise _BadExampleError(
            f"{where}is a {a.ndim}-D NumPy array of shape {a.shape}, expected 1-D"
        )
    dt = a.dtype
    if a.size and not (dt.kind == "u" and dt.itemsize <= 4):
        bad = np.flatnonzero((a < 0) | (a > U32_MAX))
        if bad.size:
            j = int(bad[0])
            raise _BadExampleError(
                f"{where}token {j} is {int(a[j])}, outside [0, 2**32 - 1] ({dt} array)"
            )
    return a.astype(np.uint32)


def _list_tokens(value: list[Any] | tuple[Any, ...], where: str) -> U32Array:
    if not value:
        return np.zeros(0, dtype=np.uint32)
    if set(map(type, value)) != {int}:
        j, v = next((j, v) for j, v in enumerate(value) if type(v) is not int)
        shown = f" ({_short(v, 40)})" if isinstance(v, (float, bool)) else ""
        raise _BadExampleError(f"{where}token {j} is {_kind(v)}{shown}, expected an int")
    # Checked on the array NumPy makes of the ints (int64, uint64, or object for ints beyond
    # 64 bits): about half the time of Python's min and max over the list.
    arr = np.array(value)
    if arr.dtype.kind not in "iu" or int(arr.min()) < 0 or int(arr.max()) > U32_MAX:
        j, v = next((j, v) for j, v in enumerate(value) if not 0 <= v <= U32_MAX)
        raise _BadExampleError(f"{where}token {j} is {_short(v, 40)}, outside [0, 2**32 - 1]")
    return arr.astype(np.uint32)


# --- metadata -------------------------------------------------------------------------------------


def _open_regular(path: str, what: str) -> int:
    """A non-blocking descriptor of the regular file ``path``; ``IngestError`` if it is
    missing or not a regular file (a FIFO is refused, never waited on)."""
    try:
        return open_regular_file(path)
    except FileNotFoundError as e:
        raise IngestError(f"{path}: {what} is missing") from e
    except ZeroBatchIOError as e:  # only for a path that is not a regular file
        raise IngestError(f"{path}: {what} is {e.strerror}") from e
    except OSError as e:
        raise ZeroBatchIOError(e.errno or 0, f"cannot open {what}: {e.strerror or e}", path) from e


def _read_small(path: str, what: str, limit: int) -> bytes:
    """All of the regular file ``path`` (at most ``limit`` bytes, else an ``IngestError``)."""
    fd = _open_regular(path, what)
    with _Source(path, fd) as src:
        size = src.size()
        if size > limit:
            raise IngestError(f"{path}: {what} is {size:,} bytes, more than the {limit:,} allowed")
        buf = np.empty(size, dtype=np.uint8)
        src.read_into(0, buf)
        return buf.tobytes()


def read_meta(path: str, what: str) -> dict[str, Any]:
    """``path`` (a ``meta.json``) as a JSON object: UTF-8, strict (no ``NaN``, no key given
    twice), at most ``MAX_META_BYTES``; otherwise an ``IngestError`` naming it."""
    data = _read_small(path, what, MAX_META_BYTES)
    try:
        obj = loads_strict(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError included
        raise IngestError(f"{path}: {what} is not UTF-8 JSON: {_short(str(e), 200)}") from e
    if not isinstance(obj, dict):
        raise IngestError(f"{path}: {what} is {_kind(obj)}, expected a JSON object")
    return obj


def _meta_int(meta: dict[str, Any], path: str, field: str, low: int, high: int = 2**63 - 1) -> int:
    if field not in meta:
        raise IngestError(f"{path}: field {field}: missing")
    value = meta[field]
    if type(value) is not int:
        raise IngestError(f"{path}: field {field}: expected an integer, got {_short(value, 40)}")
    if not low <= value <= high:
        raise IngestError(f"{path}: field {field}: expected [{low}, {high}], got {value}")
    return value


def _check_version(meta: dict[str, Any], path: str) -> None:
    if "version" not in meta:
        raise IngestError(f"{path}: field version: missing")
    version = meta["version"]
    if type(version) is not int or version != VERSION:
        raise IngestError(
            f"{path}: field version: expected {VERSION} (the only Atlas version), got "
            f"{_short(version, 40)}"
        )


def _check_strategy(meta: dict[str, Any], path: str) -> int:
    value = meta.get("compression_strategy")
    if type(value) is not int or value not in STRATEGIES:
        shown = "missing" if "compression_strategy" not in meta else _short(value, 40)
        raise IngestError(
            f"{path}: field compression_strategy: expected 0, 1, 2 or 3 ("
            + ", ".join(f"{k}: {v}" for k, v in STRATEGIES.items())
            + f"), got {shown}"
        )
    return value


@dataclass(frozen=True)
class AtlasDatasetMeta:
    """A dataset root's ``meta.json``, checked: ``version`` 1, ``compression_strategy`` 0-3,
    ``shard_sizes`` (kept for reference; readers use each shard's own count) a list of
    non-negative integers."""

    root: str
    compression_strategy: int
    shard_sizes: tuple[int, ...]

    @classmethod
    def read(cls, root: str) -> AtlasDatasetMeta:
        path = os.path.join(root, META_NAME)
        meta = read_meta(path, "Atlas dataset meta.json")
        _check_version(meta, path)
        strategy = _check_strategy(meta, path)
        sizes = meta.get("shard_sizes")
        if not isinstance(sizes, list) or not all(type(n) is int and 0 <= n < 2**63 for n in sizes):
            shown = "missing" if "shard_sizes" not in meta else _short(sizes, 60)
            raise IngestError(
                f"{path}: field shard_sizes: expected a list of non-negative integers, got {shown}"
            )
        return cls(root, strategy, tuple(sizes))

    @property
    def shared_dict(self) -> str:
        """Where the shared dictionary of strategy 2 is."""
        return os.path.join(self.root, DICT_NAME)


@dataclass(frozen=True)
class AtlasShardMeta:
    """A shard folder's ``meta.json``, checked (``compression_level`` and
    ``compression_dict_size`` are for reference only; when present they must be numbers)."""

    version: int
    block_size: int
    stored_examples: int
    compression_strategy: int

    @classmethod
    def read(cls, path: str) -> AtlasShardMeta:
        meta = read_meta(path, "Atlas shard meta.json")
        _check_version(meta, path)
        block_size = _meta_int(meta, path, "block_size", 1)
        stored = _meta_int(meta, path, "stored_examples", 0)
        strategy = _check_strategy(meta, path)
        for field, types, kind in (
            ("compression_level", (int,), "an integer"),
            ("compression_dict_size", (int, float), "a number"),
        ):
            if field in meta and type(meta[field]) not in types:
                raise IngestError(
                    f"{path}: field {field}: expected {kind}, got {_short(meta[field], 40)}"
                )
        return cls(VERSION, block_size, stored, strategy)

    @property
    def num_blocks(self) -> int:
        return -(-self.stored_examples // self.block_size)


def read_index(path: str, entries: int) -> U64Array:
    """``index.npy`` as ``uint64``, after checking its header and size (module docstring):
    an unsigned 1, 2, 4 or 8-byte dtype, 1-D with ``entries`` entries, nothing after them.
    Offsets themselves are checked by the caller."""
    fd = _open_regular(path, "Atlas index.npy")
    with _Source(path, fd) as src:
        size = src.size()
        head = np.empty(min(size, NPY_HEADER_LIMIT + 16), dtype=np.uint8)
        src.read_into(0, head)
        f = io.BytesIO(head.tobytes())
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                reader = np.lib.format.read_array_header_1_0
            elif version == (2, 0):
                reader = np.lib.format.read_array_header_2_0
            else:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, _fortran, dtype = reader(f, max_header_size=NPY_HEADER_LIMIT)
        except Exception as e:  # a malformed header: ValueError, SyntaxError, TypeError...
            raise IngestError(
                f"{path}: not a NumPy .npy file: {type(e).__name__}: {_short(str(e), 200)}"
            ) from e
        if dtype.kind != "u" or dtype.itemsize not in (1, 2, 4, 8) or dtype.fields is not None:
            raise IngestError(
                f"{path}: dtype is {_short(dtype.str, 40)}, expected an unsigned integer of 1, 2, "
                "4 or 8 bytes"
            )
        if len(shape) != 1:
            raise IngestError(f"{path}: shape is {shape}, expected 1-D (block offsets)")
        if shape[0] != entries:
            raise IngestError(
                f"{path}: {shape[0]} entries, expected {entries} (one per block and data.bin's "
                "size, from meta.json's stored_examples and block_size)"
            )
        start = f.tell()
        expected = start + entries * dtype.itemsize
        if size != expected:
            state = "truncated" if size < expected else "trailing bytes"
            raise IngestError(
                f"{path}: {size:,} bytes, expected {expected:,} ({start} of header and {entries} "
                f"entries of {dtype.itemsize} bytes; {state})"
            )
        raw = np.empty(entries, dtype=dtype)
        src.read_into(start, raw)
    return raw.astype(np.uint64)


class _Source(SourceFile):
    """A ``SourceFile`` over a descriptor already opened (by ``open_regular_file``)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd


# --- decompression ------------------------------------------------------------------------------


def _zstd() -> Any:
    """The ``zstandard`` module (the ``formats`` extra), imported on first use."""
    what = "reading zstd-compressed Atlas shards"
    try:
        return import_optional("zstandard", what)
    except MissingDependencyError as e:
        raise MissingDependencyError("zstandard", "formats", what) from e.__cause__


def zstd_decompress(
    zstd: Any, dctx: Any, data: bytes | bytearray, cap: int, dict_id: int | None
) -> bytes:
    """The one zstd frame ``data`` holds, decompressed to at most ``cap`` bytes.

    Raises ``ValueError`` with what is wrong: a frame that declares or produces more than
    ``cap`` bytes (a decompression bomb), a frame cut short, bytes after the frame, a frame
    that needs another dictionary than ``dict_id`` (``None``: no dictionary), or zstd's error.
    Input is fed in slices of ``room // ZSTD_MAX_RATIO`` bytes, so that the output held never
    exceeds ``2 * cap`` plus one zstd block.
    """
    try:
        params = zstd.get_frame_parameters(data)
    except zstd.ZstdError as e:
        raise ValueError(f"not a zstd frame: {e}") from e
    if params.content_size != zstd.CONTENTSIZE_UNKNOWN and params.content_size > cap:
        raise ValueError(
            f"the zstd frame declares {params.content_size:,} bytes, more than the cap of "
            f"{cap:,} (max_block_bytes): refused as a decompression bomb"
        )
    if params.dict_id and params.dict_id != dict_id:
        have = "no dictionary" if dict_id is None else f"dictionary {dict_id}"
        raise ValueError(f"the zstd frame needs dictionary {params.dict_id}, the shard has {have}")
    view = memoryview(data)
    dobj = dctx.decompressobj()
    parts: list[bytes] = []
    produced = pos = 0
    try:
        while pos < len(view) and not dobj.eof:
            step = max(ZSTD_MIN_SLICE, (cap - produced) // ZSTD_MAX_RATIO)
            chunk = dobj.decompress(view[pos : pos + step])
            pos += step
            produced += len(chunk)
            if produced > cap:
                raise ValueError(
                    f"the zstd frame decompresses to more than the cap of {cap:,} bytes "
                    "(max_block_bytes): refused as a decompression bomb"
                )
            parts.append(chunk)
    except zstd.ZstdError as e:
        raise ValueError(f"corrupt zstd frame: {e}") from e
    if not dobj.eof:
        raise ValueError(
            f"the zstd frame is cut short: all {len(view):,} bytes read, the frame not ended"
        )
    left = len(dobj.unused_data) + max(0, len(view) - pos)
    if left:
        raise ValueError(f"{left:,} bytes follow the zstd frame")
    if params.content_size != zstd.CONTENTSIZE_UNKNOWN and produced != params.content_size:
        raise ValueError(
            f"the zstd frame declares {params.content_size:,} bytes and holds {produced:,}"
        )
    return b"".join(parts)


# --- the shared decoded block -----------------------------------------------------------------


class BlockSlot:
    """The one decoded block and zstd decompressor the shards of one ``expand_atlas`` call
    share (module docstring), with a lock so that threads reading shards take turns."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.owner: AtlasShard | None = None
        self.block = -1
        self.tokens: U32Array = np.zeros(0, dtype=np.uint32)
        self.lengths: I64Array = np.zeros(0, dtype=np.int64)
        self.dctx_owner: AtlasShard | None = None
        self.dctx: Any = None
        self.dict_id: int | None = None

    def release(self, shard: AtlasShard) -> None:
        """Drop what ``shard`` holds here."""
        with self.lock:
            if self.owner is shard:
                self.owner, self.block = None, -1
                self.tokens = np.zeros(0, dtype=np.uint32)
                self.lengths = np.zeros(0, dtype=np.int64)
            if self.dctx_owner is shard:
                self.dctx_owner, self.dctx, self.dict_id = None, None, None


# --- one shard ----------------------------------------------------------------------------------


class AtlasShard(Closing):
    """One Atlas shard folder as a ``TokenFile``: its examples' tokens as one ``uint32`` stream.

    Opening checks the metadata, the index and the files (module docstring) without reading a
    block; ``num_tokens`` and ``document_starts`` make one pass over the blocks on first use.
    ``dataset`` is the dataset the folder belongs to (``None``: a shard folder on its own,
    whose shared dictionary, if strategy 2 needs one, is the one in the folder above).
    ``slot`` is shared by the shards of one ``expand_atlas`` call.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        field: str | None = DEFAULT_FIELD,
        max_block_bytes: int = MAX_BLOCK_BYTES,
        dataset: AtlasDatasetMeta | None = None,
        slot: BlockSlot | None = None,
    ) -> None:
        self._path = os.fspath(path)
        if field is not None and not isinstance(field, str):
            raise IngestError(f"field must be a string or None, got {_kind(field)}")
        self.field = field
        self.max_block_bytes = int_arg("max_block_bytes", max_block_bytes, 1, 2**62, IngestError)
        self.dataset = dataset
        self._slot = slot or BlockSlot()
        self.meta_path = os.path.join(self._path, META_NAME)
        self.data_path = os.path.join(self._path, DATA_NAME)
        self.index_path = os.path.join(self._path, INDEX_NAME)
        if not os.path.isdir(self._path):
            state = "is not a directory" if os.path.lexists(self._path) else "does not exist"
            raise IngestError(f"{self._path}: Atlas shard folder {state}")
        self.meta = AtlasShardMeta.read(self.meta_path)
        self.strategy = self.meta.compression_strategy
        if dataset is not None and self.strategy not in FALLBACKS[dataset.compression_strategy]:
            allowed = " or ".join(map(str, FALLBACKS[dataset.compression_strategy]))
            raise IngestError(
                f"{self.meta_path}: field compression_strategy: {self.strategy} in a dataset "
                f"of strategy {dataset.compression_strategy} "
                f"({os.path.join(dataset.root, META_NAME)}); expected {allowed}"
            )
        self.dict_path: str | None = None
        if self.strategy == 2:
            above = os.path.dirname(os.path.abspath(self._path))
            root = dataset.root if dataset is not None else above
            self.dict_path = os.path.join(root, DICT_NAME)
        elif self.strategy == 3:
            self.dict_path = os.path.join(self._path, DICT_NAME)
        self._zstd: Any = _zstd() if self.strategy else None
        blocks = self.meta.num_blocks
        index = read_index(self.index_path, blocks + 1)
        self._check_index(index)
        self.offsets: I64Array = index.astype(np.int64)  # all <= data.bin's size, checked
        self.data_size = int(self.offsets[-1])
        if self.dict_path is not None:
            fd = _open_regular(self.dict_path, f"zstd dictionary (strategy {self.strategy})")
            try:
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if not 0 < size <= MAX_DICT_BYTES:
                raise IngestError(
                    f"{self.dict_path}: zstd dictionary is {size:,} bytes, expected 1 to "
                    f"{MAX_DICT_BYTES:,}"
                )
        self._block_starts: I64Array | None = None
        self._starts: I64Array | None = None

    # -- opening checks

    def _check_index(self, index: U64Array) -> None:
        where = self.index_path
        if int(index[0]) != 0:
            raise IngestError(f"{where}: entry 0 is {int(index[0])}, expected 0 (block 0's offset)")
        if index.size > 1:
            down = np.flatnonzero(index[1:] < index[:-1])
            if down.size:
                i = int(down[0]) + 1
                raise IngestError(
                    f"{where}: entry {i} is {int(index[i])}, less than entry {i - 1} "
                    f"({int(index[i - 1])}): block offsets must not decrease"
                )
            sizes = index[1:] - index[:-1]
            big = np.flatnonzero(sizes > self.max_block_bytes)
            if big.size:
                b = int(big[0])
                raise IngestError(
                    f"{where}: block {b} is {int(sizes[b]):,} bytes (entries {b} and {b + 1}), "
                    f"more than max_block_bytes ({self.max_block_bytes:,})"
                )
        last = int(index[-1])
        if last == 0 and index.size == 1 and not os.path.lexists(self.data_path):
            return  # an empty shard: the reference writer writes no data.bin
        fd = _open_regular(self.data_path, "Atlas data.bin")
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != last:
            state = "truncated data.bin" if size < last else "trailing bytes in data.bin"
            raise IngestError(
                f"{self.data_path}: {size:,} bytes, but the last entry of {where} (entry "
                f"{index.size - 1}) says {last:,} ({state})"
            )

    # -- TokenFile

    @property
    def path(self) -> str:
        """The shard folder (what errors, manifests and traces name)."""
        return self._path

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.uint32)

    @property
    def num_blocks(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def num_examples(self) -> int:
        """Examples (documents) in the shard, from ``meta.json``."""
        return self.meta.stored_examples

    @property
    def num_tokens(self) -> int:
        """Tokens in the shard's stream (one pass over the blocks on first use)."""
        return int(self._count()[-1])

    def document_starts(self) -> I64Array:
        """Stream position of each example's first token (one pass on first use, cached)."""
        self._count()
        assert self._starts is not None
        return self._starts

    def side_files(self) -> list[str]:
        """The files this shard reads besides the folder itself."""
        out = [self.meta_path, self.index_path, self.data_path]
        if self.dict_path is not None:
            out.append(self.dict_path)
        if self.dataset is not None:
            out.append(os.path.join(self.dataset.root, META_NAME))
        return out

    def read_tokens(self, start: int, stop: int) -> U32Array:
        """Tokens ``[start, stop)`` of the stream as a fresh ``uint32`` array.

        The block holding ``start`` is found from the counting pass; blocks are decoded in
        order and the last one is kept, so ascending ranges decode each block once.
        """
        bounds = self._count()
        n = int(bounds[-1])
        if not 0 <= start <= stop <= n:
            raise IngestError(f"{self._path}: tokens [{start}, {stop}) outside [0, {n})")
        out = np.empty(stop - start, dtype=np.uint32)
        if start == stop:
            return out
        b = int(np.searchsorted(bounds, start, side="right")) - 1
        pos = start
        while pos < stop:
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            if hi > pos:
                tokens = self._block_tokens(b, hi - lo)
                take = min(stop, hi) - pos
                out[pos - start : pos - start + take] = tokens[pos - lo : pos - lo + take]
                pos += take
            b += 1
        return out

    def close(self) -> None:
        """Drop the decoded block and the decompressor if this shard holds them (no
        descriptor stays open between reads)."""
        self._slot.release(self)

    def __repr__(self) -> str:
        return (
            f"AtlasShard({self._path!r}, blocks={self.num_blocks}, "
            f"examples={self.meta.stored_examples}, strategy={self.strategy})"
        )

    # -- passes

    def _count(self) -> I64Array:
        """The stream offset of each block (and the end), from one pass on first use; the
        document starts are kept from the same pass."""
        if self._block_starts is None:
            bounds = np.zeros(self.num_blocks + 1, dtype=np.int64)
            starts: list[I64Array] = [np.zeros(0, dtype=np.int64)]
            total = 0
            for b in range(self.num_blocks):
                lengths = self._decoded(b)[1]
                ends = np.cumsum(lengths)
                starts.append(total + ends - lengths)
                total += int(ends[-1]) if ends.size else 0
                bounds[b + 1] = total
            found = np.concatenate(starts)
            found.flags.writeable = False
            bounds.flags.writeable = False
            self._starts, self._block_starts = found, bounds
        return self._block_starts

    def _block_tokens(self, b: int, expected: int) -> U32Array:
        tokens = self._decoded(b)[0]
        if tokens.size != expected:
            raise IngestError(
                f"{self._where(b)}: {tokens.size} tokens now, {expected} when the shard was "
                "counted (data.bin changed while it was read)"
            )
        return tokens

    def _decoded(self, b: int) -> tuple[U32Array, I64Array]:
        """Block ``b``'s tokens and example lengths, from the slot or decoded into it."""
        slot = self._slot
        with slot.lock:
            if slot.owner is not self or slot.block != b:
                slot.owner, slot.block = None, -1
                slot.tokens = np.zeros(0, dtype=np.uint32)  # drop the old block first
                tokens, lengths = self._decode(b)
                slot.owner, slot.block, slot.tokens, slot.lengths = self, b, tokens, lengths
            return slot.tokens, slot.lengths

    # -- decoding one block

    def _where(self, b: int) -> str:
        lo, hi = int(self.offsets[b]), int(self.offsets[b + 1])
        return f"{self.data_path}: block {b} (bytes {lo:,} to {hi:,})"

    def _expected_examples(self, b: int) -> int:
        bs = self.meta.block_size
        return bs if b < self.num_blocks - 1 else self.meta.stored_examples - bs * b

    def _read_block(self, b: int) -> bytearray:
        lo, hi = int(self.offsets[b]), int(self.offsets[b + 1])
        fd = _open_regular(self.data_path, "Atlas data.bin")
        with _Source(self.data_path, fd) as src:
            size = src.size()
            if size != self.data_size:
                raise IngestError(
                    f"{self.data_path}: {size:,} bytes now, {self.data_size:,} when the shard "
                    "was opened (data.bin changed while it was read)"
                )
            raw = bytearray(hi - lo)
            src.read_into(lo, np.frombuffer(raw, dtype=np.uint8))
        return raw

    def _decompressor(self) -> tuple[Any, int | None]:
        slot = self._slot
        if slot.dctx_owner is not self:
            slot.dctx_owner, slot.dctx, slot.dict_id = None, None, None
            zstd = self._zstd
            if self.dict_path is None:
                dctx, dict_id = zstd.ZstdDecompressor(), None
            else:
                data = _read_small(self.dict_path, "zstd dictionary", MAX_DICT_BYTES)
                try:
                    zdict = zstd.ZstdCompressionDict(data)
                    dict_id = int(zdict.dict_id()) or None
                    dctx = zstd.ZstdDecompressor(dict_data=zdict)
                except zstd.ZstdError as e:
                    raise IngestError(f"{self.dict_path}: not a zstd dictionary: {e}") from e
            slot.dctx_owner, slot.dctx, slot.dict_id = self, dctx, dict_id
        return slot.dctx, slot.dict_id

    def _decode(self, b: int) -> tuple[U32Array, I64Array]:
        where = self._where(b)
        raw = self._read_block(b)
        data: bytes | bytearray = raw
        if self.strategy:
            dctx, dict_id = self._decompressor()
            try:
                data = zstd_decompress(self._zstd, dctx, raw, self.max_block_bytes, dict_id)
            except ValueError as e:
                raise IngestError(
                    f"{where}: {e} (compression_strategy {self.strategy}: "
                    f"{STRATEGIES[self.strategy]})"
                ) from e
            del raw
        try:
            examples = restricted_loads(data)
        except PickleRefusedError as e:
            raise IngestError(f"{where}: refused: {e}") from e
        except MemoryError as e:
            raise IngestError(
                f"{where}: the block's pickle asks for more memory than there is"
            ) from e
        except Exception as e:  # the unpickler's errors on a malformed pickle, of any type
            raise IngestError(
                f"{where}: not a valid pickle: {type(e).__name__}: {_short(str(e), 200)}"
            ) from e
        del data
        if type(examples) is not list:
            raise IngestError(f"{where}: decodes to {_kind(examples)}, expected a list of examples")
        want = self._expected_examples(b)
        if len(examples) != want:
            last = b == self.num_blocks - 1
            rule = (
                f"the last block holds stored_examples - {b} * block_size = {want}"
                if last
                else f"every block but the last holds block_size = {want}"
            )
            raise IngestError(
                f"{where}: holds {len(examples)} examples, expected {want} ({rule}; "
                f"{self.meta_path})"
            )
        parts: list[U32Array] = []
        first = b * self.meta.block_size
        for j in range(want):
            try:
                parts.append(example_tokens(examples[j], self.field))
            except _BadExampleError as e:
                raise IngestError(
                    f"{where}: example {j} (example {first + j} of the shard) {e}"
                ) from e
            examples[j] = None  # free the decoded objects as their tokens are taken
        lengths = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
        return tokens, lengths


# --- datasets -----------------------------------------------------------------------------------


def shard_folders(root: PathLike) -> list[str]:
    """The shard folders of the dataset at ``root``, in numeric order.

    Shards are the sub-directories named by digits (``0``, ``00``, ``17``...); gaps are allowed
    (a dataset may be partly present), two names of one number are not. Any other
    sub-directory is an error (it would be a shard to the reference reader); hidden entries
    and files are ignored.
    """
    r = os.fspath(root)
    found: dict[int, str] = {}
    for name in sorted(os.listdir(r)):
        full = os.path.join(r, name)
        if name.startswith(".") or not os.path.isdir(full):
            continue
        if not _DIGITS.fullmatch(name):
            raise IngestError(
                f"{full}: a folder in an Atlas dataset that is not a shard (shard folders are "
                "named by their number)"
            )
        number = int(name)
        if number in found:
            raise IngestError(
                f"{full}: shard {number} twice ({os.path.basename(found[number])} and {name})"
            )
        found[number] = full
    if not found:
        raise IngestError(f"{r}: an Atlas dataset without shard folders")
    return [found[k] for k in sorted(found)]


def _is_shard_folder(path: str) -> bool:
    return os.path.lexists(os.path.join(path, INDEX_NAME))


def expand_atlas(
    paths: Patterns,
    *,
    field: str | None = DEFAULT_FIELD,
    max_block_bytes: int = MAX_BLOCK_BYTES,
) -> list[AtlasShard]:
    """Every Atlas shard ``paths`` name, opened, in reading order.

    A path (or glob pattern, matches sorted) is a dataset root (``meta.json`` beside numbered
    shard folders: its shards in numeric order, after its ``meta.json`` is checked) or one shard
    folder (it has an ``index.npy``). Every shard is opened here, so metadata errors surface
    before any block is read. A shard listed twice is an error. The shards share one
    ``BlockSlot``.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise IngestError("no Atlas inputs given")
    slot = BlockSlot()
    shards: list[AtlasShard] = []
    seen: set[str] = set()
    try:
        for item in items:
            pattern = os.fspath(item)
            if glob.has_magic(pattern) and not os.path.exists(pattern):
                matches = sorted(glob.glob(pattern))
                if not matches:
                    raise IngestError(f"{pattern}: no Atlas input matches this pattern")
            else:
                matches = [pattern]
            for m in matches:
                if not os.path.isdir(m):
                    state = "is not a directory" if os.path.lexists(m) else "does not exist"
                    raise IngestError(f"{m}: Atlas input {state} (expected a dataset or shard)")
                if _is_shard_folder(m):
                    found: list[tuple[str, AtlasDatasetMeta | None]] = [(m, None)]
                else:
                    meta = AtlasDatasetMeta.read(m)
                    found = [(s, meta) for s in shard_folders(m)]
                for folder, meta_or_none in found:
                    key = os.path.realpath(folder)
                    if key in seen:
                        raise IngestError(f"{folder}: listed twice; it would be ingested twice")
                    seen.add(key)
                    shards.append(
                        AtlasShard(
                            folder,
                            field=field,
                            max_block_bytes=max_block_bytes,
                            dataset=meta_or_none,
                            slot=slot,
                        )
                    )
    except BaseException:
        for s in shards:
            s.close()
        raise
    return shards


def is_atlas(path: PathLike) -> bool:
    """Whether ``path`` is an Atlas dataset root or shard folder: a directory whose
    ``meta.json`` (a regular file of at most ``MAX_META_BYTES``) is a JSON object with
    ``version`` and ``compression_strategy`` and either ``shard_sizes`` (a dataset) or
    ``block_size`` (a shard). Never raises; reads nothing else."""
    p = os.fspath(path)
    meta_path = os.path.join(p, META_NAME)
    try:
        if not os.path.isdir(p) or not stat.S_ISREG(os.stat(meta_path).st_mode):
            return False
        meta = read_meta(meta_path, "meta.json")
    except (OSError, ValueError):  # IngestError and ZeroBatchIOError included
        return False
    keys = set(meta)
    return {"version", "compression_strategy"} <= keys and bool(
        keys & {"shard_sizes", "block_size"}
    )


__all__ = [
    "ALLOWED_GLOBALS",
    "DEFAULT_FIELD",
    "MAX_BLOCK_BYTES",
    "STRATEGIES",
    "AtlasDatasetMeta",
    "AtlasShard",
    "AtlasShardMeta",
    "BlockSlot",
    "PickleRefusedError",
    "RestrictedUnpickler",
    "example_tokens",
    "expand_atlas",
    "is_atlas",
    "read_index",
    "restricted_loads",
    "scan_pickle",
    "shard_folders",
]
