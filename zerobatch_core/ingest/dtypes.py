"""Which token dtype a conversion writes (``convert(dtype=...)``, ``--dtype``), and why.

``"uint16"`` (dtype code 1) halves a dataset on disk, in the page cache, over the network and
in host-to-device copies, and holds ids up to 65,535: every vocabulary of at most 65,536 ids,
GPT-2's 50,257 among them. ``"uint32"`` (code 0) holds any id. ``"auto"``, the default, writes
uint16 exactly when every token that can be written fits it:

text inputs
    when the tokenizer's ids fit: ids ``0 .. vocab_size - 1`` (``Tokenizer.vocab_size`` is one
    more than the largest id it can emit, special and added tokens included), its BOS id and,
    in ``pad`` mode, the pad id. Known before anything is read. A tokenizer that does not say
    its vocabulary size gets uint32.
token inputs (nanoGPT shards, ``.npy`` arrays, Megatron, Hugging Face, MDS, Atlas)
    when every input file stores tokens of 16 bits or fewer, known from the files' headers
    before anything is read (modded-nanogpt's shards, Megatron's small-vocabulary files);
    else when the largest token of the records written is at most 65,535. That is learnt by
    the streaming writer while the records pass on their way to its scratch file
    (``files.writer``, ``dtype="auto"``), never by a second read of the inputs: what it costs
    is a scratch file of uint32 records instead of uint16 ones (page cache, dropped as the
    output is written) and one maximum per block of a few MiB. Measured on a 60M-token int64
    ``.npy`` array (page cache warm, three runs each): 0.36-1.04 s with ``"auto"``, 0.47-0.69 s
    forced to uint16, 0.66-1.32 s as uint32, i.e. within run-to-run noise of the forced write.
    The output is the file that the chosen dtype, given up front, would have written. (A
    sharded output learns it shard by shard: the first shard that needs uint32 makes the
    shards before it be rewritten from their own bytes.)

``"uint32"`` always works. ``"uint16"`` is refused before anything is written when the
tokenizer's ids do not fit (its vocabulary size, BOS or pad id named); for inputs whose dtype
is wider, during the write, at the first token that does not fit, naming its value, its input
file and its position there, and no output is left behind.

The choice depends on the inputs and options alone (never on ``workers``), and the Ray engine,
text only, makes it from the tokenizer exactly as here: outputs stay byte-identical between
them. The summary says which dtype was written and why (``DtypePlan.reason``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_NAMES, DTYPE_UINT16, DTYPE_UINT32, token_max

from ..errors import IngestError
from .source import RecordSource, TokenInputs, U32Block
from .text import TextSource

DTYPE_OPTIONS = ("auto", "uint16", "uint32")
"""What ``convert`` and ``produce`` take as ``dtype`` (``--dtype``)."""

UINT16_MAX = token_max(DTYPE_UINT16)
"""The largest id a uint16 token holds."""


def check_dtype_option(dtype: object) -> str:
    """``dtype`` if it is one of ``DTYPE_OPTIONS``, else an ``IngestError`` naming them."""
    if dtype not in DTYPE_OPTIONS:
        names = ", ".join(repr(d) for d in DTYPE_OPTIONS)
        raise IngestError(f"dtype must be one of {names}, got {dtype!r}")
    return str(dtype)


@dataclass(frozen=True)
class DtypePlan:
    """What a conversion writes, decided before it reads anything.

    ``code`` is the dtype code to write, or ``None`` when the writer decides from the largest
    token (``"auto"`` over inputs of a wider dtype); ``reason`` says why (``final_reason``
    completes it for ``None``). ``limit`` is the largest id the inputs may hold, checked as
    the records stream by (``TokenWatch``), or ``None`` when nothing needs checking.
    """

    code: int | None
    reason: str
    limit: int | None = None


@dataclass(frozen=True)
class TokenizerIds:
    """The ids a tokenized text conversion can write, as far as the tokenizer says."""

    vocab_size: int | None
    bos_id: int
    pad_id: int | None

    @property
    def largest(self) -> int | None:
        """The largest id that can be written, or ``None`` if the vocabulary is unknown."""
        if self.vocab_size is None:
            return None
        return max(self.vocab_size - 1, self.bos_id, -1 if self.pad_id is None else self.pad_id)

    def describe(self) -> str:
        """The vocabulary (and a BOS or pad id outside it) in words."""
        assert self.vocab_size is not None
        out = f"vocabulary {self.vocab_size:,} ids"
        if self.bos_id >= self.vocab_size:
            out += f", BOS id {self.bos_id:,}"
        if self.pad_id is not None and self.pad_id >= self.vocab_size:
            out += f", pad id {self.pad_id:,}"
        return out


def tokenizer_ids(tokenizer: Any, pad_id: int | None) -> TokenizerIds:
    """The ids of ``tokenizer`` (a ``Tokenizer``; ``vocab_size`` is optional for third-party
    ones) plus ``pad_id``."""
    size = getattr(tokenizer, "vocab_size", None)
    vocab = (
        int(size) if isinstance(size, (int, np.integer)) and not isinstance(size, bool) else None
    )
    return TokenizerIds(vocab, int(tokenizer.bos_id), pad_id)


def plan_text_dtype(ids: TokenizerIds, dtype: str, name: str) -> DtypePlan:
    """The dtype of a text conversion (or a producer) whose tokenizer ``name`` has ``ids``."""
    want = check_dtype_option(dtype)
    largest = ids.largest
    if want == "uint32":
        return DtypePlan(DTYPE_UINT32, "asked for")
    if want == "uint16":
        if largest is not None and largest > UINT16_MAX:
            raise IngestError(
                f"dtype='uint16' cannot hold every id of tokenizer {name!r}: "
                f"{ids.describe()}, and uint16 holds ids up to {UINT16_MAX:,}; write "
                "dtype='uint32', or 'auto'"
            )
        return DtypePlan(DTYPE_UINT16, "asked for", None if largest is not None else UINT16_MAX)
    if largest is None:
        return DtypePlan(DTYPE_UINT32, f"tokenizer {name!r} does not say its vocabulary size")
    if largest <= UINT16_MAX:
        return DtypePlan(DTYPE_UINT16, ids.describe())
    return DtypePlan(DTYPE_UINT32, f"{ids.describe()}, more than uint16's {UINT16_MAX + 1:,}")


def _input_names(dtypes: list[np.dtype[Any]]) -> str:
    return "/".join(sorted({np.dtype(d).name for d in dtypes}))


def plan_dtype(src: RecordSource, dtype: str = "auto") -> DtypePlan:
    """The dtype a conversion of ``src`` writes for ``dtype`` (module docstring)."""
    want = check_dtype_option(dtype)
    if isinstance(src, TextSource):
        ids = tokenizer_ids(src.tokenizer, src.pad_id)
        return plan_text_dtype(ids, want, src.tokenizer.name)
    if want == "uint32":
        return DtypePlan(DTYPE_UINT32, "asked for")
    dtypes = src.input_dtypes() if isinstance(src, TokenInputs) else None
    narrow = dtypes is not None and all(np.dtype(d).itemsize <= 2 for d in dtypes)
    if want == "uint16":
        return DtypePlan(DTYPE_UINT16, "asked for", None if narrow else UINT16_MAX)
    if narrow:
        assert dtypes is not None
        return DtypePlan(DTYPE_UINT16, f"{_input_names(dtypes)} inputs")
    return DtypePlan(None, "")


def final_reason(plan: DtypePlan, written: int, largest: int, src: RecordSource) -> str:
    """``plan.reason``, or for a dtype the writer chose, the largest id and the inputs."""
    if plan.code is not None:
        return plan.reason
    dtypes = src.input_dtypes() if isinstance(src, TokenInputs) else []
    of = f" of the {_input_names(dtypes)} inputs" if dtypes else ""
    if largest < 0:
        return "no token written"
    if written == DTYPE_UINT16:
        return f"largest id {largest:,}{of} fits"
    return f"largest id {largest:,}{of} is above {UINT16_MAX:,}"


class TokenWatch:
    """Passes record blocks through, noting the largest token (for ``plan``'s ``reason``, when
    the writer chooses) and, with ``plan.limit``, refusing the first token above it with an
    ``IngestError`` naming its value and where it lies (``src.locate``: the input file and
    position). Otherwise it looks at nothing."""

    def __init__(self, blocks: Iterable[U32Block], src: RecordSource, plan: DtypePlan) -> None:
        self.blocks, self.src, self.limit = blocks, src, plan.limit
        self.looks = plan.limit is not None or plan.code is None
        self.largest = -1
        self.records = 0

    def __iter__(self) -> Iterator[U32Block]:
        for block in self.blocks:
            if self.looks and block.size:
                top = int(block.max())
                if self.limit is not None and top > self.limit:
                    self._refuse(block)
                self.largest = max(self.largest, top)
            self.records += block.shape[0]
            yield block

    def _refuse(self, block: npt.NDArray[np.integer]) -> None:
        assert self.limit is not None
        r, c = (int(x[0]) for x in np.nonzero(block > self.limit))
        record = self.records + r
        where = (
            self.src.locate(record, c)
            if isinstance(self.src, TokenInputs)
            else f"record {record:,} of the input, token {c}"
        )
        raise IngestError(
            f"{where}: id {int(block[r, c]):,} does not fit uint16 (ids up to "
            f"{self.limit:,}); write dtype='uint32', or 'auto' (nothing was written)"
        )


def dtype_name(code: int) -> str:
    """``"uint16"`` or ``"uint32"``."""
    return DTYPE_NAMES[code]


__all__ = [
    "DTYPE_OPTIONS",
    "UINT16_MAX",
    "DtypePlan",
    "TokenWatch",
    "TokenizerIds",
    "check_dtype_option",
    "dtype_name",
    "final_reason",
    "plan_dtype",
    "plan_text_dtype",
    "tokenizer_ids",
]
