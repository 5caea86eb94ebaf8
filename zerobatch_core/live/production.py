"""Production records: how a producer that tokenizes a corpus (``zerobatch produce``) resumes
exactly once, and where every row it committed came from (``SPEC.md`` section 22).

A live dataset's manifest records each producer's committed offset, a count of global batches
(sections 16-18). A producer that tokenizes a corpus must turn that count back into a place in
its input after a restart, and a trace must turn a global batch back into documents. Both are
answered by two kinds of small JSON objects beside the batches, under
``production/<producer>/``:

``producer.json``
    The producer's configuration, created once with a conditional create: the inputs (path,
    format, size, unit count), the tokenizer's JSON description, packing mode and ids, shape,
    seed, the share (``producers``, ``index``), the object sizes and the token dtype
    (``"dtype"``: ``"uint16"`` or ``"uint32"``; a record written before dtypes existed has
    none, and stands for the dtype of its dataset). A restart under the same id with anything
    else is refused, naming what differs, before anything is appended.
``<end>.json`` (20 digits)
    One per batch object, written before the object is appended: the object's stream offsets
    ``[first, end)``, the origin of each of its rows (epoch, unit, document within the unit,
    token offset within the document's ``[bos, *doc]`` sequence; ``-1`` for a padding row) and
    the cursor after it. A producer is deterministic (the stream of batches is a function of
    its configuration alone), so the record for ``end`` holds the same bytes whichever life of
    the producer wrote it, and a restart at committed offset ``end`` reads its cursor here.

Units are the input pieces ``ingest.units`` defines (a parquet row group, a JSONL or text
file), numbered in reading order. Producer ``index`` of ``producers`` owns units ``index,
index + producers, ...``; epoch ``e`` serves them in the order ``permute(k, n, seed XOR e,
DOMAIN_UNITS)`` (section 6's bijection over the share).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from zerobatch_spec import DTYPE_NAMES
from zerobatch_spec.live import check_producer_id
from zerobatch_spec.shuffle import epoch_key, permute_array

from ..stores.store import Store
from .manifests import LiveError

PRODUCTION_PREFIX: Final = "production/"
RECORD_FORMAT: Final = "zerobatch.produce"
BATCHES_FORMAT: Final = "zerobatch.produce.batches"
RECORD_VERSION: Final = 1
DOMAIN_UNITS: Final = 4
"""Domain tag of a producer's unit order (section 6)."""

WHOLE_FILE_FORMATS: Final = ("jsonl", "text")
"""Input formats read whole as one unit; a parquet file's units are its row groups, a token
file's (``nanogpt``, ``npy``) its ranges of ``unit_records`` records."""

ORIGIN_FIELDS: Final = 4
"""Integers per row in an object record: epoch, unit, document, token."""

PADDING: Final = -1
"""The epoch, unit, document and token of a row that holds padding only."""

MAX_RECORD_BYTES: Final = 64 * 2**20
"""The largest production record read: a crafted size is refused before it is parsed."""


class ProductionError(LiveError):
    """A production record that is missing, malformed, or says another configuration."""


def record_key(producer: str) -> str:
    """The key of a producer's configuration record."""
    return f"{PRODUCTION_PREFIX}{check_producer_id(producer)}/producer.json"


def batches_key(producer: str, end: int) -> str:
    """The key of the record of the producer's batch object that ends at stream offset ``end``."""
    return f"{PRODUCTION_PREFIX}{check_producer_id(producer)}/{end:020d}.json"


def parse_batches_key(key: str) -> tuple[str, int] | None:
    """``(producer, end)`` of an object record's key, or ``None`` for any other key."""
    parts = key.split("/")
    if len(parts) != 3 or f"{parts[0]}/" != PRODUCTION_PREFIX or not parts[2].endswith(".json"):
        return None
    digits = parts[2][: -len(".json")]
    if len(digits) != 20 or not digits.isdigit():
        return None
    try:
        producer = check_producer_id(parts[1])
    except ValueError:
        return None
    return producer, int(digits)


@dataclass(frozen=True)
class InputEntry:
    """One input file of a producer: its path, format, size in bytes and units."""

    path: str
    format: str
    bytes: int
    units: int


@dataclass(frozen=True)
class Cursor:
    """A place in a producer's stream of documents: unit ``position`` of epoch ``epoch``'s
    order, document ``document`` of that unit, token ``token`` of that document's sequence.

    A cursor may sit at the end of a document (``token`` its length) or past a unit's last
    document: resuming there re-reads that document or unit and takes nothing from it.
    """

    epoch: int
    position: int
    document: int
    token: int

    def as_list(self) -> list[int]:
        return [self.epoch, self.position, self.document, self.token]


START: Final = Cursor(0, 0, 0, 0)


@dataclass(frozen=True)
class ProducerRecord:
    """What a producer was started with (``producer.json``); see the module docstring."""

    producer: str
    producers: int
    index: int
    inputs: tuple[InputEntry, ...]
    tokenizer: str
    """The tokenizer's name (``Tokenizer.name``)."""
    tokenizer_xxh3: str
    """XXH3-64 of the tokenizer's JSON description (``Tokenizer.to_json()``): two tokenizers
    with the same name and other vocabularies differ here."""
    mode: str
    bos_id: int | None
    """The BOS id each document starts with (``None`` for token files: records are cut from
    their tokens as they are)."""
    pad_id: int | None
    text_field: str
    per_line: bool
    align: str
    """Token files: ``contiguous`` or ``bos`` (records start at a ``bos_token``)."""
    bos_token: int | None
    unit_records: int
    """Token files: records per unit (0 for text inputs)."""
    seq_len: int
    batch_size: int
    seed: int
    batches_per_object: int
    dtype: str | None = None
    """The token dtype of the batches, ``"uint16"`` or ``"uint32"`` (``None``: a record
    written before dtypes were recorded, which ``produce`` reads as its dataset's dtype)."""

    @property
    def units(self) -> int:
        """Units of the whole corpus."""
        return sum(i.units for i in self.inputs)

    def share(self) -> npt.NDArray[np.int64]:
        """This producer's units (global unit numbers), ascending."""
        return np.arange(self.index, self.units, self.producers, dtype=np.int64)

    def order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The units of this producer's share in the order epoch ``epoch`` serves them."""
        share = self.share()
        n = share.size
        if n == 0:
            return share
        key = epoch_key(self.seed, epoch)
        return share[permute_array(np.arange(n, dtype=np.uint64), n, key, DOMAIN_UNITS)]

    def locate(self, unit: int) -> tuple[InputEntry, int]:
        """The input file holding global unit ``unit`` and the unit's part of it (a parquet row
        group; ``-1`` for a file read whole)."""
        first = 0
        for entry in self.inputs:
            if unit < first + entry.units:
                return entry, -1 if entry.format in WHOLE_FILE_FORMATS else unit - first
            first += entry.units
        raise ProductionError(f"unit {unit} is not one of the {self.units} units of the inputs")

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "producer": self.producer,
            "producers": self.producers,
            "index": self.index,
            "inputs": [
                {"path": i.path, "format": i.format, "bytes": i.bytes, "units": i.units}
                for i in self.inputs
            ],
            "tokenizer": self.tokenizer,
            "tokenizer_xxh3": self.tokenizer_xxh3,
            "mode": self.mode,
            "bos_id": self.bos_id,
            "pad_id": self.pad_id,
            "text_field": self.text_field,
            "per_line": self.per_line,
            "align": self.align,
            "bos_token": self.bos_token,
            "unit_records": self.unit_records,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "batches_per_object": self.batches_per_object,
        }
        if self.dtype is not None:
            doc["dtype"] = self.dtype
        return (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ProducerRecord:
        doc = _object(data, where, RECORD_FORMAT)
        f = _Fields(doc, where)
        inputs = []
        for k, item in enumerate(f.get("inputs", list)):
            g = _Fields(item, f"{where}: inputs[{k}]") if isinstance(item, dict) else None
            if g is None:
                raise ProductionError(f"{where}: inputs[{k}] is not an object")
            inputs.append(
                InputEntry(
                    g.get("path", str), g.get("format", str), g.integer("bytes"), g.integer("units")
                )
            )
        record = cls(
            producer=f.get("producer", str),
            producers=f.integer("producers", 1),
            index=f.integer("index"),
            inputs=tuple(inputs),
            tokenizer=f.get("tokenizer", str),
            tokenizer_xxh3=f.get("tokenizer_xxh3", str),
            mode=f.get("mode", str),
            bos_id=f.optional_int("bos_id"),
            pad_id=f.optional_int("pad_id"),
            text_field=f.get("text_field", str),
            per_line=f.get("per_line", bool),
            align=f.get("align", str),
            bos_token=f.optional_int("bos_token"),
            unit_records=f.integer("unit_records"),
            seq_len=f.integer("seq_len", 1),
            batch_size=f.integer("batch_size", 1),
            seed=f.integer("seed"),
            batches_per_object=f.integer("batches_per_object", 1),
            dtype=f.optional_choice("dtype", DTYPE_NAMES.values()),
        )
        if record.index >= record.producers:
            raise ProductionError(
                f"{where}: field 'index' is {record.index}, not below 'producers' "
                f"({record.producers})"
            )
        return record

    def differences(self, other: ProducerRecord) -> list[str]:
        """What ``other`` (a restart's configuration) changes, one phrase per field."""
        out = []
        for name in self.__dataclass_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine == theirs:
                continue
            if name == "inputs":
                out.append(_input_differences(self.inputs, other.inputs))
            elif name == "tokenizer_xxh3":
                if self.tokenizer == other.tokenizer:
                    out.append(f"tokenizer {self.tokenizer!r} (now another tokenizer of that name)")
            else:  # ``name=value``: the command line shows it as its flag (``--seed 0``)
                out.append(f"{name}={mine!r} (now {theirs!r})")
        return out


def _input_differences(mine: tuple[InputEntry, ...], theirs: tuple[InputEntry, ...]) -> str:
    if len(mine) != len(theirs):
        return f"inputs: {len(mine)} files (now {len(theirs)})"
    for a, b in zip(mine, theirs, strict=True):
        if a != b:
            return f"inputs: {a.path} ({a.bytes:,} bytes, {a.units} units) (now {b.path}, " + (
                f"{b.bytes:,} bytes, {b.units} units)"
            )
    return "inputs"


@dataclass(frozen=True)
class BatchesRecord:
    """The record of one batch object (``<end>.json``); see the module docstring.

    ``rows`` is ``int64 [(end - first) * batch_size, 4]``: per row, the epoch, unit, document
    and token its first token comes from (all ``PADDING`` for a row of padding only).
    """

    producer: str
    first: int
    end: int
    next: Cursor
    rows: npt.NDArray[np.int64]

    def to_json(self) -> bytes:
        doc = {
            "format": BATCHES_FORMAT,
            "version": RECORD_VERSION,
            "producer": self.producer,
            "first": self.first,
            "end": self.end,
            "next": self.next.as_list(),
            "rows": self.rows.reshape(-1).tolist(),
        }
        return (json.dumps(doc, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str, batch_size: int) -> BatchesRecord:
        doc = _object(data, where, BATCHES_FORMAT)
        f = _Fields(doc, where)
        first, end = f.integer("first"), f.integer("end")
        if end <= first:
            raise ProductionError(f"{where}: 'end' ({end}) is not after 'first' ({first})")
        cursor = f.get("next", list)
        if len(cursor) != 4 or not all(_is_int(v) and v >= 0 for v in cursor):
            raise ProductionError(f"{where}: field 'next' is not four integers >= 0")
        flat = f.get("rows", list)
        want = (end - first) * batch_size * ORIGIN_FIELDS
        if len(flat) != want:
            raise ProductionError(
                f"{where}: field 'rows' holds {len(flat)} integers, expected {want} (4 per row "
                f"of {end - first} batches of {batch_size} rows)"
            )
        if not all(_is_int(v) and v >= PADDING for v in flat):
            raise ProductionError(
                f"{where}: field 'rows' holds a value that is not an integer >= -1"
            )
        rows = np.array(flat, dtype=np.int64).reshape(-1, ORIGIN_FIELDS)
        return cls(f.get("producer", str), first, end, Cursor(*map(int, cursor)), rows)


def read_record(store: Store, producer: str) -> ProducerRecord | None:
    """The producer's configuration record, or ``None`` if it has none."""
    key = record_key(producer)
    data = _read(store, key)
    if data is None:
        return None
    record = ProducerRecord.from_json(data, store.where(key))
    if record.producer != producer:
        raise ProductionError(
            f"{store.where(key)}: field 'producer' is {record.producer!r}, not {producer!r}"
        )
    return record


def create_record(store: Store, record: ProducerRecord) -> ProducerRecord:
    """Create ``record`` if the producer has none (conditional create), and return the record
    that is there now: ours, or the one an earlier life (or a racing twin) created."""
    store.create(record_key(record.producer), record.to_json())
    found = read_record(store, record.producer)
    if found is None:  # deleted between the create and the read
        raise ProductionError(f"{store.where(record_key(record.producer))}: vanished after create")
    return found


def write_batches(store: Store, record: BatchesRecord) -> None:
    """Store ``record`` (before its batch object is appended)."""
    store.write(batches_key(record.producer, record.end), record.to_json())


def read_batches(store: Store, producer: str, end: int, batch_size: int) -> BatchesRecord | None:
    """The record of the producer's object ending at ``end``, or ``None`` if there is none."""
    key = batches_key(producer, end)
    data = _read(store, key)
    if data is None:
        return None
    found = BatchesRecord.from_json(data, store.where(key), batch_size)
    if found.producer != producer or found.end != end:
        raise ProductionError(
            f"{store.where(key)}: the record is of producer {found.producer!r} up to offset "
            f"{found.end}, not {producer!r} up to {end}"
        )
    return found


def _read(store: Store, key: str) -> bytes | None:
    try:
        size = store.size(key)
    except FileNotFoundError:
        return None
    if size > MAX_RECORD_BYTES:
        raise ProductionError(
            f"{store.where(key)}: {size:,} bytes, more than the {MAX_RECORD_BYTES:,} a "
            "production record may hold"
        )
    try:
        return store.read(key)
    except FileNotFoundError:
        return None


def _object(data: bytes, where: str, format: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:  # not UTF-8, or not JSON
        raise ProductionError(f"{where}: not JSON: {e}") from None
    except RecursionError:
        raise ProductionError(f"{where}: not JSON: nested too deeply to read") from None
    if not isinstance(doc, dict):
        raise ProductionError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != format:
        raise ProductionError(f"{where}: field 'format' is {doc.get('format')!r}, not {format!r}")
    if doc.get("version") != RECORD_VERSION:
        raise ProductionError(
            f"{where}: field 'version' is {doc.get('version')!r}; this reader knows version "
            f"{RECORD_VERSION}"
        )
    return doc


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Fields:
    """Typed access to a record's fields, each failure naming the record and the field."""

    def __init__(self, doc: dict[str, Any], where: str) -> None:
        self.doc, self.where = doc, where

    def get(self, key: str, kind: type[Any]) -> Any:
        if key not in self.doc:
            raise ProductionError(f"{self.where}: field {key!r} is missing")
        value = self.doc[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ProductionError(
                f"{self.where}: field {key!r} is {type(value).__name__}, expected {kind.__name__}"
            )
        return value

    def integer(self, key: str, low: int = 0) -> int:
        value = self.get(key, int)
        if not low <= value < 2**64:
            raise ProductionError(f"{self.where}: field {key!r} is {value}, not in [{low}, 2**64)")
        return int(value)

    def optional_choice(self, key: str, choices: Iterable[str]) -> str | None:
        """An optional string field that must be one of ``choices`` (``None`` when absent)."""
        if key not in self.doc:
            return None
        value = self.get(key, str)
        allowed = list(choices)
        if value not in allowed:
            raise ProductionError(
                f"{self.where}: field {key!r} is {value!r}, not one of "
                f"{', '.join(map(repr, allowed))}"
            )
        return str(value)

    def optional_int(self, key: str) -> int | None:
        if self.doc.get(key, 0) is None:
            return None
        return self.integer(key)


__all__ = [
    "BATCHES_FORMAT",
    "DOMAIN_UNITS",
    "ORIGIN_FIELDS",
    "PADDING",
    "PRODUCTION_PREFIX",
    "RECORD_FORMAT",
    "START",
    "BatchesRecord",
    "Cursor",
    "InputEntry",
    "ProducerRecord",
    "ProductionError",
    "batches_key",
    "create_record",
    "parse_batches_key",
    "read_batches",
    "read_record",
    "record_key",
    "write_batches",
]
