"""Datasets (wing 3): many LLMBATCH shards behind one manifest, local or remote.

``dataset.py`` reads and checks manifests and checksums files and serves a directory's shards
as one ``DatasetReader``; ``remote.py`` serves a file or a dataset from a ``Store`` by byte
ranges (``RemoteSource``); ``build.py`` writes sharded datasets and ``replace.py`` commits an
overwrite whole or not at all; ``validation.py`` reports every failure of a dataset by shard
and slot. Built on files and stores; knows nothing of loaders or live datasets.
"""

from .build import create_dataset, write_sharded_dataset
from .dataset import DatasetError, DatasetReader, is_dataset, open_source
from .remote import RemoteSource
from .validation import DatasetReport, validate_dataset

__all__ = [
    "DatasetError",
    "DatasetReader",
    "DatasetReport",
    "RemoteSource",
    "create_dataset",
    "is_dataset",
    "open_source",
    "validate_dataset",
    "write_sharded_dataset",
]
