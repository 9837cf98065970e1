"""The Kafka sink: records to Kafka without ever blocking the mirror (first version).

Errors::

    KafkaSinkError              the sink could not be started (bad configuration)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mirror.metrics import RECORDS, RECORDS_DROPPED, SINK_ERRORS
from shadow_ab.records import TOPIC_EXCHANGES, TOPIC_HEALTH, ExchangeRecord, Record
from shadow_ab.settings import state_dir

log = logging.getLogger(__name__)


class KafkaSinkError(Exception):
    """The Kafka sink could not be started."""


def _default_spool_dir() -> Path:
    return state_dir() / "mirror-spool"


class KafkaSinkConfig(BaseModel):
    """Settings of the Kafka sink (``kafka:`` in the mirror's YAML)."""

    model_config = ConfigDict(extra="forbid")

    bootstrap: str = Field(min_length=1, description="Kafka bootstrap servers, HOST:PORT[,...]")
    topic_exchanges: str = Field(default=TOPIC_EXCHANGES, min_length=1)
    topic_health: str = Field(default=TOPIC_HEALTH, min_length=1)
    client_id: str = Field(default="shadow-ab-mirror", min_length=1)
    spool_dir: Path = Field(default_factory=_default_spool_dir)
    spool_max_bytes: int = Field(default=1024**3, ge=1024, description="on-disk spool bound")
    spool_segment_bytes: int = Field(default=16 * 1024**2, ge=1024)
    queue_max: int = Field(default=50_000, ge=1, description="records held in memory")
    linger_ms: int = Field(default=5, ge=0)
    batch_size: int = Field(default=256 * 1024, ge=1024, description="producer batch bytes")
    max_in_flight: int = Field(default=5_000, ge=1, description="records sent, not yet acked")
    request_timeout_ms: int = Field(default=5_000, ge=100)
    delivery_timeout_ms: int = Field(default=15_000, ge=1000)
    max_block_ms: int = Field(default=200, ge=1)
    retry_backoff_s: float = Field(default=1.0, gt=0, description="wait before re-trying Kafka")


class KafkaSink:
    """Records to Kafka from a background thread; ``submit`` never blocks."""

    def __init__(self, config: KafkaSinkConfig, *, producer: Any = None) -> None:
        self.config = config
        self._queue: queue.Queue[Record | None] = queue.Queue(maxsize=config.queue_max)
        self._producer = producer
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="shadow-ab-kafka-sink", daemon=True)
        self._thread.start()

    def submit(self, record: Record) -> bool:
        if self._closed:
            RECORDS_DROPPED.labels(reason="closed").inc()
            return False
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            RECORDS_DROPPED.labels(reason="queue_full").inc()
            return False
        RECORDS.labels(sink="kafka", kind=record.kind).inc()
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
        if self._producer is not None:
            self._producer.flush(max(0.0, end - time.monotonic()))
        return self._queue.unfinished_tasks == 0

    def close(self, timeout: float = 30.0) -> bool:
        ok = self.flush(timeout)
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        if self._producer is not None:
            self._producer.close(timeout=1)
        return ok

    def _run(self) -> None:
        from kafka import KafkaProducer

        while True:
            rec = self._queue.get()
            if rec is None:
                self._queue.task_done()
                return
            try:
                if self._producer is None:
                    self._producer = KafkaProducer(
                        bootstrap_servers=self.config.bootstrap,
                        client_id=self.config.client_id,
                        acks="all",
                        enable_idempotence=True,
                        linger_ms=self.config.linger_ms,
                    )
                if isinstance(rec, ExchangeRecord):
                    topic, key = self.config.topic_exchanges, str(rec.pair_id)
                else:
                    topic, key = self.config.topic_health, rec.engine
                self._producer.send(topic, key=key.encode(), value=rec.to_json())
            except Exception as exc:
                SINK_ERRORS.labels(sink="kafka", error=type(exc).__name__).inc()
                RECORDS_DROPPED.labels(reason="send_failed").inc()
                log.warning("kafka sink dropped a record: %s", exc)
            finally:
                self._queue.task_done()
