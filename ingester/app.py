"""Wiring: settings in, a running ingester out. I/O is built here and handed to the steps."""

from __future__ import annotations

import logging
import random
from typing import Any

from sqlalchemy import Engine

from ingester import metrics
from ingester.backoff import Backoff
from ingester.batch import Message
from ingester.clients import Consumer, Producer
from ingester.clock import Clock, SystemClock
from ingester.deadletter import DeadLetters
from ingester.processor import StreamProcessor
from ingester.settings import IngestSettings
from ingester.sink import StoreSink
from ingester.steps import (
    Accumulate,
    CommitOffsets,
    Decode,
    Runner,
    Step,
    ThreadRunner,
    WriteBatch,
)
from shadow_ab.gc_tuning import tune_for_serving

log = logging.getLogger(__name__)


GC_THRESHOLD_GEN0 = 50_000
"""Allocations between young-generation collections (CPython's default is 700)."""


def tune_gc() -> None:
    """Make garbage collection cheap for the ingester's allocation pattern.

    Decoding allocates several container objects per record (the record, its request dict,
    lists), all freed together by reference counting once the batch is written; cycles are
    rare. With CPython's defaults the collector runs every 700 allocations and, as a batch of
    thousands of records is alive, keeps re-scanning it: measured, a third of decode time.
    Objects alive now (modules, clients) are frozen out of collection; young collections run
    every :data:`GC_THRESHOLD_GEN0` allocations. Cycles are still collected.
    """
    tune_for_serving(GC_THRESHOLD_GEN0)


def build_processor(
    settings: IngestSettings,
    consumer: Consumer,
    producer: Producer,
    engine: Engine,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    runner: Runner | None = None,
) -> StreamProcessor:
    """The processor with its steps, over an existing consumer, producer and store engine.

    ``runner`` is where batch writes run (default: ``settings.ingest_inflight_batches`` writer
    threads, or inline in the processor's thread when that is 1).
    """
    clock = clock or SystemClock()
    inflight = settings.ingest_inflight_batches
    if runner is None and inflight > 1:
        runner = ThreadRunner(inflight)
    sink = StoreSink(engine)
    dead_letters = DeadLetters(producer, settings.ingest_topic_dlq)
    expected = {
        settings.ingest_topic_exchanges: "exchange",
        settings.ingest_topic_health: "health",
    }

    def make_steps() -> Step[Message]:
        backoff = Backoff(
            initial_s=settings.ingest_retry_initial_ms / 1000,
            cap_s=settings.ingest_retry_max_ms / 1000,
            rng=rng or random.Random(),
        )
        commit = CommitOffsets(consumer, lambda offsets: processor.committed(offsets), clock)
        write = WriteBatch(sink, dead_letters, commit, clock, backoff, runner, inflight)
        accumulate = Accumulate(
            write,
            clock,
            max_size=settings.ingest_batch_size,
            max_wait_s=settings.ingest_batch_timeout_ms / 1000,
        )
        decoder = settings.ingest_decoder
        return Decode(accumulate, expected, fast=decoder != "pydantic", rows=decoder == "rows")

    processor = StreamProcessor(
        consumer,
        [settings.ingest_topic_exchanges, settings.ingest_topic_health],
        make_steps,
        clock,
        max_records=settings.ingest_batch_size,
        # An idle poll must not outlast a batch's timeout.
        poll_timeout_ms=min(settings.ingest_poll_timeout_ms, settings.ingest_batch_timeout_ms),
    )
    return processor


def ensure_ingest_topics(settings: IngestSettings) -> None:
    from shadow_ab.topics import default_topics, ensure_topics

    created = ensure_topics(
        settings.kafka_bootstrap or "",
        default_topics(
            settings.ingest_topic_exchanges,
            settings.ingest_topic_health,
            settings.ingest_topic_dlq,
        ),
    )
    if created:
        log.info("created topics %s", created)


def open_processor(settings: IngestSettings) -> tuple[StreamProcessor, list[Any]]:
    """Build the real Kafka clients and store engine; return the processor and what to close."""
    from ingester.clients import make_consumer, make_producer
    from storage.db import make_engine

    if settings.ingest_create_topics:
        ensure_ingest_topics(settings)
    engine = make_engine(settings.database_url)
    producer = make_producer(settings)
    consumer = make_consumer(settings)
    metrics.serve(settings.ingest_metrics_port, settings.ingest_metrics_host)
    processor = build_processor(settings, consumer, producer, engine)
    tune_gc()
    return processor, [consumer, producer, engine]


def close_all(resources: list[Any]) -> None:
    """Close what :func:`open_processor` opened: consumer, producer, engine."""
    consumer, producer, engine = resources
    try:
        consumer.close()
    finally:
        try:
            producer.close(timeout=10)
        finally:
            engine.dispose()
