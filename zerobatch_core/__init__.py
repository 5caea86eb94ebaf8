"""ZeroBatch core: read, write, validate and iterate LLMBATCH files with NumPy only.

The public API is what ``__all__`` lists; everything else is internal. The package is laid out
in wings, each importing only the wings below it (checked by ``tests/unit/test_layers.py``):

1. ``files``: the LLMBATCH file (reader, writer, validation, page hints).
2. ``stores``: byte stores (local, object storage, retries, the range cache).
3. ``datasets``: manifests, checksums, local and remote dataset readers, building datasets.
4. ``live``: live datasets (producers, the manifest chain, the live source, retention).
5. ``delivery``: sources, slicing, the loader, the stream the adapters build on, provenance.
6. ``tokenization`` and ``ingest``: tokenizers, and conversion of corpora (Ray included).
7. ``cli``: the ``zerobatch`` command, one module per command group.

Below them all sit the leaves every wing may use: ``errors``, ``redaction``, ``arguments``,
``closing`` and ``order`` (the serving orders of ``SPEC.md`` sections 8 and 14). The module
paths from before the wings stay importable as aliases (``_moved.py``).
"""

from zerobatch_spec import ErrorCode, Header

from ._moved import install as _install_moved
from .arguments import int_arg
from .datasets.build import create_dataset, write_sharded_dataset
from .datasets.dataset import DatasetError, DatasetReader, is_dataset, open_source
from .datasets.validation import DatasetReport, validate_dataset
from .delivery.distributed import rank_rows, resolve_rank_world
from .delivery.documents import DocumentLayout, document_layout
from .delivery.loader import DEFAULT_BLOCK_SIZE, BatchNativeLoader, Item, OutputDType, Position
from .delivery.mixture import Component, Mixture, MixtureError, load_mixture
from .delivery.mixture_loader import MixtureLoader
from .delivery.provenance import StepTrace, trace_step
from .delivery.slicing import Slicing
from .delivery.sources import BatchSource
from .delivery.stream import (
    DEFAULT_DTYPE,
    DEFAULT_PREFETCH,
    BatchStream,
    Layout,
    Source,
    Stage,
    StreamOptions,
)
from .errors import (
    FormatError,
    IngestError,
    MissingDependencyError,
    StateError,
    WriteError,
    ZeroBatchError,
    ZeroBatchIOError,
)
from .files.reader import BatchFileReader
from .files.validation import ValidationReport, validate_file
from .files.writer import write_batch_dataset, write_batch_file
from .ingest.convert import ConvertSummary, convert
from .ingest.packing import pack_documents
from .tokenization import ByteTokenizer
from .version import __version__

_install_moved()


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_DTYPE",
    "DEFAULT_PREFETCH",
    "BatchFileReader",
    "BatchNativeLoader",
    "BatchSource",
    "BatchStream",
    "ByteTokenizer",
    "Component",
    "ConvertSummary",
    "DatasetError",
    "DatasetReader",
    "DatasetReport",
    "DocumentLayout",
    "ErrorCode",
    "FormatError",
    "Header",
    "IngestError",
    "Item",
    "Layout",
    "MissingDependencyError",
    "Mixture",
    "MixtureError",
    "MixtureLoader",
    "OutputDType",
    "Position",
    "Slicing",
    "Source",
    "Stage",
    "StateError",
    "StepTrace",
    "StreamOptions",
    "ValidationReport",
    "WriteError",
    "ZeroBatchError",
    "ZeroBatchIOError",
    "__version__",
    "convert",
    "create_dataset",
    "document_layout",
    "int_arg",
    "is_dataset",
    "load_mixture",
    "open_source",
    "pack_documents",
    "rank_rows",
    "resolve_rank_world",
    "trace_step",
    "validate_dataset",
    "validate_file",
    "write_batch_dataset",
    "write_batch_file",
    "write_sharded_dataset",
]
