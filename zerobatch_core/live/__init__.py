"""Live datasets (wing 4): datasets that grow while they are trained on (``SPEC.md`` 16-20).

``producer.py`` appends global batches and commits them with the store's conditional create
(``LiveProducer``); ``manifests.py`` reads the chain of manifest versions; ``source.py`` follows
it as a reader (``LiveSource``); ``cadence.py`` decides when a producer commits;
``retention.py`` records consumers' watermarks and reclaims what every consumer has passed,
trusting only a verified chain. Built on stores and datasets; the loader reads a live dataset
through ``LiveSource`` like any other source.

``from zerobatch_core.live import LiveProducer`` names the producer as it always has.
"""

from .cadence import AdaptiveCadence, Cadence, FixedCadence
from .manifests import ChainError, LiveError, LiveTimeoutError, ManifestChain
from .producer import (
    PROBE_PREFIX,
    CommitStats,
    ConditionalCreateUnsupportedError,
    LiveProducer,
    encode_batches,
    open_or_create,
    probe_conditional_create,
)
from .retention import (
    LiveNotFoundError,
    ReclaimReport,
    WatermarkError,
    reclaim,
    record_watermark,
    release_watermark,
    storage_bytes,
    watermark,
    watermarks,
)
from .source import LiveSource

__all__ = [
    "PROBE_PREFIX",
    "AdaptiveCadence",
    "Cadence",
    "ChainError",
    "CommitStats",
    "ConditionalCreateUnsupportedError",
    "FixedCadence",
    "LiveError",
    "LiveNotFoundError",
    "LiveProducer",
    "LiveSource",
    "LiveTimeoutError",
    "ManifestChain",
    "ReclaimReport",
    "WatermarkError",
    "encode_batches",
    "open_or_create",
    "probe_conditional_create",
    "reclaim",
    "record_watermark",
    "release_watermark",
    "storage_bytes",
    "watermark",
    "watermarks",
]
