"""The ingester against the real Kafka and PostgreSQL from `shadow-ab services up`.

The tests that exercise the Kafka client (group membership, commits, pause and resume, the
dead-letter producer, rebalances, shutdown) run with the ingester's confluent-kafka clients
(:mod:`ingester.clients`)."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from factories import numbered_exchange, numbered_health
from ingest_harness import (
    IngestProcess,
    Topics,
    committed_total,
    count_rows,
    produce,
    run_until_committed,
    settings_for,
    wait_for,
)
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from shadow_ab.records import Role

pytestmark = pytest.mark.slow


def _exchanges(deployment: str, start: int, stop: int) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(start, stop):
        rec = numbered_exchange(deployment, i, Role.INCUMBENT if i % 2 else Role.CANDIDATE)
        out.append((str(rec.pair_id).encode(), rec.to_json()))
    return out


def test_n_records_make_n_rows_and_a_replay_adds_none(
    kafka_bootstrap: str, ingest_db_url: str, ingest_engine: Engine, topics: Topics
) -> None:
    n, h = 500, 40
    produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, 0, n))
    # Health samples are keyed by (engine, ts) across deployments: this test's own seconds.
    first = int(topics.group[-6:], 16) * 100
    samples = [numbered_health(topics.deployment, first + i) for i in range(h)]
    produce(kafka_bootstrap, topics.health, [(b"vllm@incumbent", s.to_json()) for s in samples])
    settings = settings_for(topics, kafka_bootstrap, ingest_db_url, ingest_batch_size=128)
    run_until_committed(settings, n + h, "the first group to commit every offset")
    assert committed_total(kafka_bootstrap, topics.group) == n + h
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == n
    assert count_rows(ingest_engine, "health_samples", topics.deployment) == h
    # The lag gauge was set from the client's high-water mark: nothing left behind.
    for partition in range(3):
        labels = {"topic": topics.exchanges, "partition": str(partition)}
        assert REGISTRY.get_sample_value("shadow_ab_ingest_consumer_lag", labels) == 0

    replay_group = topics.group + "-replay"
    replay = settings_for(
        topics,
        kafka_bootstrap,
        ingest_db_url,
        group=replay_group,
        ingest_batch_size=1000,
    )
    run_until_committed(replay, n + h, "the replay group to commit every offset")
    assert committed_total(kafka_bootstrap, replay_group) == n + h
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == n
    assert count_rows(ingest_engine, "health_samples", topics.deployment) == h


def test_poison_goes_to_the_dlq_with_its_reason_and_the_rest_is_stored(
    kafka_bootstrap: str, ingest_db_url: str, ingest_engine: Engine, topics: Topics
) -> None:
    good = _exchanges(topics.deployment, 0, 30)
    wrong_shape = orjson.loads(good[0][1])
    del wrong_shape["pair_id"]
    future = orjson.loads(good[1][1])
    future["schema_version"] = 99
    poison = [
        (b"p1", b"this is not json {"),
        (b"p2", orjson.dumps(wrong_shape)),
        (b"p3", orjson.dumps(future)),
    ]
    # Poison in the middle of the good records, all on one partition (same key), so a
    # poison message blocking its partition would show as missing rows.
    messages = [(b"same-key", v) for _, v in good[:10]]
    messages += [(b"same-key", v) for _, v in poison]
    messages += [(b"same-key", v) for _, v in good[10:]]
    produce(kafka_bootstrap, topics.exchanges, messages)

    run_until_committed(
        settings_for(topics, kafka_bootstrap, ingest_db_url, ingest_batch_size=7),
        len(messages),
        "every offset, poison included, to be committed",
    )
    assert committed_total(kafka_bootstrap, topics.group) == len(messages)
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == len(good)

    letters = _read_all(kafka_bootstrap, topics.dlq, expected=3)
    by_value = {m.value: m for m in letters}
    assert set(by_value) == {v for _, v in poison}
    reasons = {}
    for value, m in by_value.items():
        headers = {k: v.decode() for k, v in m.headers}
        assert headers["source_topic"] == topics.exchanges
        assert int(headers["source_offset"]) in range(10, 13)
        assert headers["source_partition"].isdigit()
        assert m.key == b"same-key"
        reasons[value] = headers["reason"]
    assert reasons[poison[0][1]].startswith("not_json: ")
    assert reasons[poison[1][1]].startswith("invalid_record: ")
    assert "pair_id" in reasons[poison[1][1]]
    assert reasons[poison[2][1]].startswith("unsupported_schema_version: ")


def test_a_year_9999_record_is_dead_lettered_once_and_its_batch_is_written(
    kafka_bootstrap: str, ingest_db_url: str, ingest_engine: Engine, topics: Topics
) -> None:
    """Issue 14, finding 3: one schema-valid message dated 9999-12-31 crash-looped the
    ingester (OverflowError in the partition code), each restart re-sent the batch's dead
    letters and the rest of the batch was never written."""
    good = _exchanges(topics.deployment, 0, 20)
    late = orjson.loads(good[0][1])
    late["pair_id"] = "7f000000-0000-4000-8000-000000009999"
    late["sent_at"] = "9999-12-31T12:00:00Z"
    late_health = orjson.loads(numbered_health(topics.deployment, 0).to_json())
    late_health["ts"] = "9999-12-31T12:00:00Z"
    messages = [(b"same-key", v) for _, v in good[:10]]
    messages += [(b"same-key", orjson.dumps(late))]
    messages += [(b"same-key", v) for _, v in good[10:]]
    produce(kafka_bootstrap, topics.exchanges, messages)
    produce(kafka_bootstrap, topics.health, [(b"vllm@incumbent", orjson.dumps(late_health))])
    total = len(messages) + 1

    settings = settings_for(topics, kafka_bootstrap, ingest_db_url, ingest_batch_size=64)
    run_until_committed(settings, total, "every offset, the year-9999 ones included")
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == len(good)
    letters = _read_all(kafka_bootstrap, topics.dlq, expected=2)
    reasons = sorted(dict(m.headers)["reason"].decode() for m in letters)
    assert all(r.startswith("invalid_record: ") for r in reasons), reasons
    assert "sent_at 9999-12-31T12:00:00+00:00 is outside the range" in reasons[0] + reasons[1]
    assert "ts 9999-12-31T12:00:00+00:00 is outside the range" in reasons[0] + reasons[1]

    # A restart of the same group reads on from the committed offsets: the dead letters are
    # not sent again, and new records flow.
    more = _exchanges(topics.deployment, 20, 25)
    produce(kafka_bootstrap, topics.exchanges, [(b"same-key", v) for _, v in more])
    # (this run commits only the exchanges' partition the records share: its next offset)
    run_until_committed(settings, len(messages) + len(more), "the restarted ingester's new offsets")
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == len(good) + len(more)
    assert len(_read_all(kafka_bootstrap, topics.dlq, expected=2)) == 2


def _read_all(bootstrap: str, topic: str, expected: int) -> list[Any]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Any] = []

    def read_more() -> bool:
        got.extend(
            SimpleNamespace(key=m.key(), value=m.value(), headers=m.headers() or [])
            for m in consumer.consume(num_messages=100, timeout=0.5)
            if not m.error()
        )
        return len(got) >= expected

    try:
        wait_for(read_more, f"{expected} dead letters on {topic}")
        # Nothing beyond the expected ones.
        extra = [m for m in consumer.consume(num_messages=100, timeout=1.0) if not m.error()]
        assert extra == []
    finally:
        consumer.close()
    return got


def test_two_workers_share_the_partitions_and_n_records_make_exactly_n_rows(
    kafka_bootstrap: str, ingest_db_url: str, ingest_engine: Engine, topics: Topics, tmp_path: Path
) -> None:
    n = 600
    settings = settings_for(topics, kafka_bootstrap, ingest_db_url, ingest_batch_size=50)
    proc = IngestProcess(settings, tmp_path / "ingest.log", "--workers", "2")
    try:

        def both_assigned() -> bool:
            log = proc.log()
            return all(
                f"[worker {i}] ingester.processor: partitions assigned: [(" in log for i in (0, 1)
            )

        wait_for(both_assigned, "both workers to be assigned partitions", proc=proc)
        produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, 0, n))
        wait_for(
            lambda: committed_total(kafka_bootstrap, topics.group) == n,
            f"the workers to commit all {n} offsets",
            proc=proc,
        )
        written = [proc.metric("shadow_ab_ingest_rows_written_total", worker=i) for i in (0, 1)]
        proc.signal(signal.SIGTERM)
        code = proc.wait()
        assert code == 0, proc.log()
    finally:
        proc.stop()
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == n
    assert sum(written) == n  # every row written once, by one worker or the other
    assert all(w > 0 for w in written), f"one worker wrote nothing: {written}"
    assert committed_total(kafka_bootstrap, topics.group) == n
    assert "all 2 workers stopped cleanly" in proc.log()


def test_sigterm_with_a_pending_batch_writes_it_commits_and_exits_0(
    kafka_bootstrap: str,
    ingest_db_url: str,
    ingest_engine: Engine,
    topics: Topics,
    tmp_path: Path,
) -> None:
    n = 120
    settings = settings_for(
        topics,
        kafka_bootstrap,
        ingest_db_url,
        ingest_batch_size=100_000,
        ingest_batch_timeout_ms=600_000,  # the batch would wait 10 minutes on its own
    )
    proc = IngestProcess(settings, tmp_path / "ingest.log")
    try:
        produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, 0, n))
        wait_for(
            lambda: proc.metric("shadow_ab_ingest_pending_messages") == n,
            f"the ingester to take all {n} messages into its batch",
            proc=proc,
        )
        assert count_rows(ingest_engine, "exchanges", topics.deployment) == 0  # still pending
        assert committed_total(kafka_bootstrap, topics.group) == 0
        proc.signal(signal.SIGTERM)
        code = proc.wait()
        assert code == 0, proc.log()
    finally:
        proc.stop()
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == n
    assert committed_total(kafka_bootstrap, topics.group) == n


def test_kill_9_mid_stream_then_restart_gives_exactly_n_rows(
    kafka_bootstrap: str, ingest_db_url: str, ingest_engine: Engine, topics: Topics, tmp_path: Path
) -> None:
    first, second = 1500, 500
    settings = settings_for(
        topics, kafka_bootstrap, ingest_db_url, ingest_batch_size=50, ingest_batch_timeout_ms=200
    )
    produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, 0, first))
    proc = IngestProcess(settings, tmp_path / "ingest-1.log")
    try:
        wait_for(
            lambda: count_rows(ingest_engine, "exchanges", topics.deployment) >= 100,
            "the first ingester to write some rows",
            proc=proc,
        )
        proc.kill9()
    finally:
        proc.stop()
    at_kill = count_rows(ingest_engine, "exchanges", topics.deployment)
    assert at_kill < first + second  # the restart has work left to do
    produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, first, first + second))

    proc = IngestProcess(settings, tmp_path / "ingest-2.log")
    try:
        wait_for(
            lambda: committed_total(kafka_bootstrap, topics.group) == first + second,
            "the restarted ingester to commit every offset",
            proc=proc,
        )
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0, proc.log()
    finally:
        proc.stop()
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == first + second


def test_postgres_stopped_while_records_flow_loses_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, private_pg_root: Path
) -> None:
    """A private throwaway PostgreSQL cluster, so the shared server other tests use stays up."""
    from shadow_ab.dev.processes import free_port
    from shadow_ab.dev.services.base import ServicesSettings
    from shadow_ab.dev.services.postgres import LocalPostgres
    from storage.db import make_engine
    from storage.migrate import upgrade

    pg = LocalPostgres(ServicesSettings(root=private_pg_root, pg_port=free_port()))
    pg.up()
    engine = None
    proc = None
    try:
        upgrade(pg.url)
        engine = make_engine(pg.url)
        first, second = 600, 600
        settings = settings_for(
            topics, kafka_bootstrap, pg.url, ingest_batch_size=50, ingest_batch_timeout_ms=200
        )
        proc = IngestProcess(settings, tmp_path / "ingest.log")
        produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, 0, first))
        wait_for(
            lambda: count_rows(engine, "exchanges", topics.deployment) >= 100,
            "some rows before stopping PostgreSQL",
            proc=proc,
        )
        pg.down()
        produce(
            kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, first, first + second)
        )
        p = proc
        wait_for(
            lambda: p.metric("shadow_ab_ingest_store_retries_total") >= 3,
            "the ingester to retry while PostgreSQL is away",
            proc=p,
        )
        assert proc.metric("shadow_ab_ingest_paused") == 1
        assert proc.alive()
        assert committed_total(kafka_bootstrap, topics.group) < first + second
        pg.up()
        wait_for(
            lambda: committed_total(kafka_bootstrap, topics.group) == first + second,
            "every offset committed after PostgreSQL came back",
            proc=proc,
        )
        assert proc.metric("shadow_ab_ingest_paused") == 0
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0, proc.log()
        engine.dispose()
        assert count_rows(engine, "exchanges", topics.deployment) == first + second
    finally:
        if proc is not None:
            proc.stop()
        if engine is not None:
            engine.dispose()
        pg.down()


def test_a_rebalance_with_batches_in_flight_writes_every_record_once(
    kafka_bootstrap: str, ingest_db_url: str, ingest_engine: Engine, topics: Topics
) -> None:
    """A second ingester joins while the first has batches in flight (eager rebalance: the
    first's partitions are all revoked, then shared). The first's batches are still written,
    their offsets committed only for partitions it kept, the moved ones read again by the
    second from the committed offsets: every record stored once, every offset committed.

    Both run in this thread, stepped in turn (librdkafka's clients: two in one process do not
    disturb each other's group protocol)."""
    import time

    from ingester.app import build_processor
    from ingester.clients import make_consumer, make_producer
    from storage.db import make_engine

    n, more = 1200, 600
    produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, 0, n))
    settings = settings_for(
        topics,
        kafka_bootstrap,
        ingest_db_url,
        ingest_batch_size=50,
        ingest_inflight_batches=2,
    )
    consumers: list[Any] = []
    producers: list[Any] = []
    engines: list[Any] = []

    def start() -> Any:
        engines.append(make_engine(ingest_db_url))
        consumers.append(make_consumer(settings))
        producers.append(make_producer(settings))
        processor = build_processor(settings, consumers[-1], producers[-1], engines[-1])
        processor.subscribe()
        return processor

    def in_flight(processor: Any) -> int:
        return len(processor.held) + processor.steps.next_step.pending_messages

    def stored() -> int:
        return count_rows(ingest_engine, "exchanges", topics.deployment)

    try:
        first = start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            first.step()
            if sum(first.committed_offsets.values()) >= 200 and in_flight(first):
                break
        assert in_flight(first), "nothing in flight when the second ingester joins"
        second = start()
        while time.monotonic() < deadline and not second.consumer.assignment():
            first.step()
            second.step()
        # On a busy machine the first may have read everything before the group settled: more
        # records after the rebalance give the second's partitions something to take.
        produce(kafka_bootstrap, topics.exchanges, _exchanges(topics.deployment, n, n + more))
        while time.monotonic() < deadline:
            first.step()
            second.step()
            total = n + more
            if second.taken and not (in_flight(first) or in_flight(second)) and stored() == total:
                break
        assert first.shutdown(30) and second.shutdown(30)
    finally:
        for consumer in consumers:
            consumer.close()
        for producer in producers:
            producer.close(10)
        for engine in engines:
            engine.dispose()
    assert second.taken > 0, "the second ingester was given no partition"
    assert stored() == n + more
    assert committed_total(kafka_bootstrap, topics.group) == n + more
