"""The LLMBATCH file (wing 1): read, write and validate one file.

``reader.py`` maps a file and checks rules 1-8 of ``SPEC.md`` at open; ``writer.py`` writes
files atomically (temporary, fsync, rename); ``validation.py`` reports a file's first broken
rule, with the opt-in deep check of every slot's padding; ``pages.py`` gives the kernel
read-ahead hints. This wing knows nothing of datasets, stores or loaders: everything above is
built on it, so a reimplementation of the format can start here.
"""

from .reader import BatchFileReader
from .validation import ValidationReport, validate_file
from .writer import write_batch_dataset, write_batch_file

__all__ = [
    "BatchFileReader",
    "ValidationReport",
    "validate_file",
    "write_batch_dataset",
    "write_batch_file",
]
