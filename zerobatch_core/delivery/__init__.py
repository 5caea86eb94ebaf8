"""Delivery (wing 5): batches in training order, for each rank, into any framework.

``sources.py`` is the one place that turns a source (a path, a URL, a ``Store``, an open
reader, a live dataset) into a reader, and ``BatchSource`` there is the protocol the loader
serves from; ``slicing.py`` cuts a global batch for data- and context-parallel ranks;
``loader.py`` serves epochs of items in the seeded order with exact resume; ``stream.py`` is the
prefetching ``BatchStream`` every adapter builds on, with ``buffers.py``'s pooled arrays and
chunk stage; ``mixture.py`` blends several sources by weight (``mixing.py`` computes its
schedule, ``mixture_loader.py`` adds its resume rules to the loader); ``documents.py`` gives
document layouts and ``distributed.py`` finds the rank and world size; ``provenance.py`` traces
a step back to its files and slots (it needs the loader's order). The serving orders themselves
(``order.py``) sit at the bottom of the package, since datasets and live sources offer theirs.
"""

from .loader import DEFAULT_BLOCK_SIZE, BatchNativeLoader, Item, OutputDType, Position
from .mixture import Component, Mixture, MixtureError, load_mixture
from .mixture_loader import MixtureLoader
from .provenance import StepTrace, trace_step
from .slicing import Slicing
from .sources import BatchSource, open_reader
from .stream import BatchStream, StreamOptions

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "BatchNativeLoader",
    "BatchSource",
    "BatchStream",
    "Component",
    "Item",
    "Mixture",
    "MixtureError",
    "MixtureLoader",
    "OutputDType",
    "Position",
    "Slicing",
    "StepTrace",
    "StreamOptions",
    "load_mixture",
    "open_reader",
    "trace_step",
]
