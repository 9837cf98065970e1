"""The Kafka -> store ingester: decode, batch, write, then commit offsets.

See :mod:`ingester.steps` for the pipeline and :mod:`ingester.errors` for the exception tree.
"""

from ingester.app import build_processor
from ingester.clock import Clock, ManualClock, SystemClock
from ingester.decode import Poison, PoisonReason, decode
from ingester.errors import (
    DeadLetterUnavailable,
    IngestError,
    SettingsError,
    StoreDown,
    StoreRejected,
    TransientError,
)
from ingester.processor import StreamProcessor
from ingester.settings import IngestSettings

__all__ = [
    "Clock",
    "DeadLetterUnavailable",
    "IngestError",
    "IngestSettings",
    "ManualClock",
    "Poison",
    "PoisonReason",
    "SettingsError",
    "StoreDown",
    "StoreRejected",
    "StreamProcessor",
    "SystemClock",
    "TransientError",
    "build_processor",
    "decode",
]
