"""Helpers for the ingester's service tests: produce, count, wait, run the ingester."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from ingester.app import build_processor
from ingester.clients import make_consumer, make_producer
from ingester.processor import StreamProcessor
from ingester.settings import IngestSettings
from shadow_ab.dev.processes import free_port_run

WAIT_S = 90.0
"""Upper bound for anything a test waits for; reaching it fails the test (never a speed check)."""


@dataclass(frozen=True)
class Topics:
    exchanges: str
    health: str
    dlq: str
    group: str
    deployment: str


def settings_for(
    topics: Topics, bootstrap: str, db_url: str, *, group: str | None = None, **extra: Any
) -> IngestSettings:
    return IngestSettings(
        kafka_bootstrap=bootstrap,
        database_url=db_url,
        ingest_group=group or topics.group,
        ingest_topic_exchanges=topics.exchanges,
        ingest_topic_health=topics.health,
        ingest_topic_dlq=topics.dlq,
        ingest_create_topics=False,
        **extra,
    )


def produce(bootstrap: str, topic: str, messages: Iterable[tuple[bytes | None, bytes]]) -> int:
    """Send (key, value) pairs with acks=all; return how many were sent."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors: list[Any] = []
    acked = 0

    def delivered(err: Any, _msg: Any) -> None:
        nonlocal acked
        if err is not None:
            errors.append(err)
        else:
            acked += 1

    sent = 0
    for k, v in messages:
        producer.produce(topic, key=k, value=v, on_delivery=delivered)
        producer.poll(0)
        sent += 1
    left = producer.flush(60)
    assert left == 0 and not errors, f"{left} messages unsent, errors: {errors[:3]}"
    assert acked == sent
    return acked


def count_rows(engine: Engine, table: str, deployment: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE deployment = :d"), {"d": deployment}
            ).scalar_one()
        )


def committed_total(bootstrap: str, group: str) -> int:
    """Sum of the group's committed offsets over all its partitions (0 if none yet; -1 while
    the broker's group coordinator is still loading, so callers just ask again)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    try:
        answer = futures[group].result(timeout=30)
    except KafkaException as exc:
        code = exc.args[0].code() if exc.args else None
        if code in (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR):
            return -1
        if code == KafkaError.GROUP_ID_NOT_FOUND:
            return 0
        raise
    return sum(max(0, tp.offset) for tp in answer.topic_partitions or [])


def wait_for(
    check: Callable[[], bool],
    what: str,
    timeout_s: float = WAIT_S,
    proc: IngestProcess | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            tail = ""
            if proc is not None:
                lines = [ln for ln in proc.log().splitlines() if " kafka." not in ln]
                tail = "\ningester log (kafka lines left out):\n" + "\n".join(lines[-40:])
            pytest.fail(f"gave up after {timeout_s:.0f}s waiting for {what}{tail}", pytrace=False)
        time.sleep(0.2)


def run_until_committed(
    settings: IngestSettings, total: int, what: str, timeout_s: float = WAIT_S
) -> None:
    """Run an in-process ingester over real Kafka and PostgreSQL until it has committed
    ``total`` offsets (summed over partitions of fresh topics), then stop it the way SIGTERM
    does (flush, commit, close).

    Progress is read from the processor itself: no other Kafka client runs in this process
    meanwhile (kafka-python 3 clients started and stopped next to a consumer in the same
    process were seen to stall its group rebalance)."""
    from storage.db import make_engine

    engine = make_engine(settings.database_url)
    consumer = make_consumer(settings)
    producer = make_producer(settings)
    processor: StreamProcessor = build_processor(settings, consumer, producer, engine)
    try:
        processor.subscribe()
        deadline = time.monotonic() + timeout_s
        while True:
            processor.step()
            if sum(processor.committed_offsets.values()) >= total:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"gave up after {timeout_s:.0f}s waiting for {what}", pytrace=False)
        assert processor.shutdown(30), "shutdown did not flush"
    finally:
        consumer.close()
        producer.close(timeout=10)
        engine.dispose()


class IngestProcess:
    """``shadow-ab ingest`` as a child process, logging to a file in the test's tmp_path."""

    def __init__(self, settings: IngestSettings, log_path: Path, *extra_args: str) -> None:
        workers = 1
        if "--workers" in extra_args:
            workers = int(extra_args[extra_args.index("--workers") + 1])
        self.metrics_port = free_port_run(workers)  # worker i serves its metrics on port + i
        args = [
            sys.executable,
            "-c",
            "from shadow_ab.cli import main; main()",
            "ingest",
            "--kafka",
            settings.kafka_bootstrap or "",
            "--database-url",
            settings.database_url,
            "--group",
            settings.ingest_group,
            "--batch-size",
            str(settings.ingest_batch_size),
            "--batch-timeout-ms",
            str(settings.ingest_batch_timeout_ms),
            "--exchanges-topic",
            settings.ingest_topic_exchanges,
            "--health-topic",
            settings.ingest_topic_health,
            "--dlq-topic",
            settings.ingest_topic_dlq,
            "--metrics-port",
            str(self.metrics_port),
            *extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHADOW_AB_")}
        env["SHADOW_AB_HOME"] = str(log_path.parent)  # no env file there: flags only
        env["SHADOW_AB_INGEST_RETRY_MAX_MS"] = "1000"
        # A killed ingester's partitions move to its successor after this long.
        env["SHADOW_AB_INGEST_KAFKA_CONSUMER"] = '{"session.timeout.ms": 6000}'
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def metric(self, name: str, worker: int = 0) -> float:
        """Sum of a metric's samples from the child's /metrics (0 if not there yet); with
        ``--workers``, from worker ``worker`` (it serves on the metrics port + its index)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port + worker}/metrics", timeout=2
            ) as resp:
                body = resp.read().decode()
        except OSError:
            return 0.0
        total = 0.0
        for line in body.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout_s: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Make sure the child is gone (used in ``finally``)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()
