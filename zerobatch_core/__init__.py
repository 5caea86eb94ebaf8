"""ZeroBatch core: read, write, validate and iterate LLMBATCH files with NumPy only.

The public API is what ``__all__`` lists; everything else is internal.
"""

from zerobatch_spec import ErrorCode, Header

from .arguments import int_arg
from .dataset import DatasetError, DatasetReader, is_dataset, open_source
from .dataset_build import create_dataset, write_sharded_dataset
from .distributed import rank_rows, resolve_rank_world
from .documents import DocumentLayout, document_layout
from .errors import (
    FormatError,
    IngestError,
    MissingDependencyError,
    StateError,
    WriteError,
    ZeroBatchError,
    ZeroBatchIOError,
)
from .ingest.convert import ConvertSummary, convert
from .ingest.packing import pack_documents
from .loader import DEFAULT_BLOCK_SIZE, BatchNativeLoader, Item, OutputDType, Position
from .provenance import StepTrace, trace_step
from .reader import BatchFileReader
from .slicing import Slicing
from .stream import (
    DEFAULT_DTYPE,
    DEFAULT_PREFETCH,
    BatchStream,
    Layout,
    Source,
    Stage,
    StreamOptions,
)
from .tokenization import ByteTokenizer
from .validation import DatasetReport, ValidationReport, validate_dataset, validate_file
from .writer import write_batch_dataset, write_batch_file

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_DTYPE",
    "DEFAULT_PREFETCH",
    "BatchFileReader",
    "BatchNativeLoader",
    "BatchStream",
    "ByteTokenizer",
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
