"""ZeroBatch core: read, write, validate and iterate LLMBATCH files with NumPy only.

The public API is what ``__all__`` lists; everything else is internal.
"""

from zerobatch_spec import ErrorCode, Header

from .documents import DocumentLayout, document_layout
from .errors import FormatError, IngestError, StateError, WriteError, ZeroBatchError
from .ingest.convert import ConvertSummary, convert
from .ingest.packing import pack_documents
from .loader import BatchNativeLoader
from .reader import BatchFileReader
from .tokenization import ByteTokenizer
from .validation import ValidationReport, validate_file
from .writer import write_batch_dataset, write_batch_file

__version__ = "0.1.0"

__all__ = [
    "BatchFileReader",
    "BatchNativeLoader",
    "ByteTokenizer",
    "ConvertSummary",
    "DocumentLayout",
    "ErrorCode",
    "FormatError",
    "Header",
    "IngestError",
    "StateError",
    "ValidationReport",
    "WriteError",
    "ZeroBatchError",
    "__version__",
    "convert",
    "document_layout",
    "pack_documents",
    "validate_file",
    "write_batch_dataset",
    "write_batch_file",
]
