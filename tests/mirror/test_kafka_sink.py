"""The Kafka sink against the shared local broker (never stopped here: an unreachable broker is
a closed port; the real outage test is test_mirror_kafka_outage.py with a private broker), and
its settings (``kafka.client``: librdkafka properties over the sink's defaults)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from factories import numbered_exchange, numbered_health

from mirror.kafka_sink import (
    KafkaSink,
    KafkaSinkConfig,
    KafkaSinkError,
    decode_frame,
    encode_frame,
    fetch_topic_limit,
    make_producer,
)
from mirror.spool import Spool
from shadow_ab.dev.processes import free_port
from shadow_ab.records import (
    ExchangeRecord,
    parse_record,
)
from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics

DEP = "sink-test"


@dataclass(frozen=True)
class Message:
    partition: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class Topics:
    exchanges: str
    health: str


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[Topics]:
    tag = uuid.uuid4().hex[:10]
    t = Topics(f"mirror-sink-{tag}.exchanges", f"mirror-sink-{tag}.health")
    ensure_topics(kafka_bootstrap, [TopicSpec(t.exchanges, 3), TopicSpec(t.health, 1)])
    yield t
    delete_topics(kafka_bootstrap, [t.exchanges, t.health])


def config(bootstrap: str, topics: Topics, spool_dir: Path, **client: int | str) -> KafkaSinkConfig:
    return KafkaSinkConfig(
        bootstrap=bootstrap,
        topic_exchanges=topics.exchanges,
        topic_health=topics.health,
        spool_dir=spool_dir,
        client=client,
    )


FAST = {"retry_backoff_s": 0.2}
"""The sink's first retry sooner than RETRY_BACKOFF_S: Kafka back is used within the test."""


def consume(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0) -> list[Any]:
    """Every message of ``topic`` (from the start) once ``expected`` arrived, plus whatever
    follows within a short grace period (so duplicates would be seen)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"mirror-sink-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        grace_until: float | None = None
        while time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                assert m.error() is None, m.error()
                messages.append(Message(m.partition(), m.key(), m.value()))
            if len(messages) >= expected and grace_until is None:
                grace_until = time.monotonic() + 1.0
            if grace_until is not None and time.monotonic() >= grace_until:
                break
    finally:
        consumer.close()
    return messages


def closed_port() -> str:
    return f"127.0.0.1:{free_port()}"


def test_frame_round_trip() -> None:
    frame = encode_frame("shadow.exchanges", b"k\x00ey", b'{"a": 1}')
    assert decode_frame(frame) == ("shadow.exchanges", b"k\x00ey", b'{"a": 1}')
    with pytest.raises(ValueError):
        decode_frame(frame[:8])


def test_config_rejects_delivery_timeout_below_request_timeout(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"message.timeout.ms \(1000\) must be at least"):
        KafkaSinkConfig(
            bootstrap="x:1",
            spool_dir=tmp_path,
            client={"request.timeout.ms": 5000, "delivery.timeout.ms": 1000},  # an alias
        )


def test_unusable_spool_folder_fails_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(KafkaSinkError, match="spool_dir"):
        KafkaSink(KafkaSinkConfig(bootstrap="x:1", spool_dir=blocker / "spool"))


def test_records_reach_their_topics_with_their_keys(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    sink = KafkaSink(config(kafka_bootstrap, topics, tmp_path / "spool"), **FAST)
    records = [numbered_exchange(DEP, i) for i in range(200)]
    samples = [numbered_health(DEP, i, "candidate") for i in range(5)]
    for r in records:
        assert sink.submit(r)
    for h in samples:
        assert sink.submit(h)
    assert sink.flush(60)
    assert sink.close(10)
    stats = sink.stats()
    assert stats.sent == 205
    assert stats.dropped == {}

    got = consume(kafka_bootstrap, topics.exchanges, 200)
    assert sorted(m.key for m in got) == sorted(str(r.pair_id).encode() for r in records)
    assert sorted(m.value for m in got) == sorted(r.to_json() for r in records)
    got_h = consume(kafka_bootstrap, topics.health, 5)
    assert [m.key for m in got_h] == [b"trtllm@candidate"] * 5
    assert [parse_record(m.value) for m in got_h] == samples  # one partition: in order


def test_unreachable_broker_spools_then_next_process_drains(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    spool_dir = tmp_path / "spool"
    away = KafkaSink(config(closed_port(), topics, spool_dir), **FAST)
    records = [numbered_exchange(DEP, i) for i in range(300)]
    assert all(away.submit(r) for r in records)
    assert not away.flush(30.0)  # nothing can be acknowledged: returns once all is spooled
    assert away.close(10)  # ...but nothing is lost: it is all in the spool
    assert away.stats().spooled == 300
    assert away.stats().sent == 0

    # A new mirror process on the same spool folder, Kafka reachable: everything goes out,
    # spooled records first.
    back = KafkaSink(config(kafka_bootstrap, topics, spool_dir), **FAST)
    later = [numbered_exchange(DEP, i) for i in range(300, 350)]
    for r in later:
        back.submit(r)
    assert back.flush(60)
    assert back.close(10)
    assert back.stats().from_spool >= 300
    with Spool(spool_dir, max_bytes=10**9, publish_metrics=False) as left:
        assert len(left) == 0

    got = consume(kafka_bootstrap, topics.exchanges, 350)
    values = [parse_record(m.value) for m in got]
    assert len(values) == 350  # none lost, none doubled
    assert sorted(m.value for m in got) == sorted(r.to_json() for r in records + later)
    # Within a partition the spooled records come before the newer ones.
    by_partition: dict[int, list[int]] = {}
    for m, v in zip(got, values, strict=True):
        assert isinstance(v, ExchangeRecord) and v.output_text is not None
        by_partition.setdefault(m.partition, []).append(int(v.output_text.split()[1]))
    for seq in by_partition.values():
        first_new = next((k for k, i in enumerate(seq) if i >= 300), len(seq))
        assert all(i < 300 for i in seq[:first_new])
        assert all(i >= 300 for i in seq[first_new:])


def test_full_queue_drops_and_counts(tmp_path: Path) -> None:
    release = threading.Event()

    def stuck_factory(_cfg: KafkaSinkConfig) -> Any:
        release.wait(30)  # the sink's thread is busy: nothing leaves the queue meanwhile
        raise ConnectionError("no broker here")

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=tmp_path / "spool"),
        producer_factory=stuck_factory,
        queue_max=10,
    )
    results = [sink.submit(numbered_exchange(DEP, i)) for i in range(15)]
    assert results == [True] * 10 + [False] * 5
    assert sink.stats().dropped == {"queue_full": 5}
    release.set()
    assert sink.close(5)
    assert sink.stats().spooled == 10
    assert not sink.submit(numbered_exchange(DEP, 99))
    assert sink.stats().dropped["closed"] == 1


def test_full_spool_drops_counts_and_close_reports_it(tmp_path: Path) -> None:
    def no_broker(_cfg: KafkaSinkConfig) -> Any:
        raise ConnectionError("no broker here")

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=tmp_path / "spool", spool_max_bytes=4096),
        producer_factory=no_broker,
    )
    for i in range(40):  # ~640 bytes each
        assert sink.submit(numbered_exchange(DEP, i))
    assert not sink.close(5)
    stats = sink.stats()
    assert stats.spooled + stats.dropped["spool_full"] == 40
    assert stats.dropped["spool_full"] > 0
    with Spool(tmp_path / "spool", max_bytes=4096, publish_metrics=False) as left:
        assert left.size_bytes <= 4096


def test_the_producer_is_idempotent_acks_all(kafka_bootstrap: str, topics: Topics) -> None:
    cfg = KafkaSinkConfig(
        bootstrap=kafka_bootstrap,
        spool_dir=Path("unused"),
        topic_exchanges=topics.exchanges,
        topic_health=topics.health,
    )
    producer: Any = make_producer(cfg)
    try:
        assert type(producer).__name__ == "ConfluentProducer"
        assert producer.config["acks"] == "all"
        assert producer.config["enable.idempotence"] is True
        assert producer.config["message.timeout.ms"] == 15_000
        assert producer.partitions_for(topics.exchanges) == {0, 1, 2}
    finally:
        producer.close(timeout=5)


SMALL_TOPIC_BYTES = 64 * 1024


@pytest.fixture
def small_topics(kafka_bootstrap: str) -> Iterator[Topics]:
    """Topics whose max.message.bytes is 64 KiB, so a big record is cheap to make."""
    tag = uuid.uuid4().hex[:10]
    t = Topics(f"mirror-sink-small-{tag}.exchanges", f"mirror-sink-small-{tag}.health")
    limit = {"max.message.bytes": str(SMALL_TOPIC_BYTES)}
    ensure_topics(kafka_bootstrap, [TopicSpec(t.exchanges, 1, limit), TopicSpec(t.health, 1)])
    yield t
    delete_topics(kafka_bootstrap, [t.exchanges, t.health])


def _big(i: int) -> ExchangeRecord:
    return numbered_exchange(DEP, i, output_text="x" * (3 * SMALL_TOPIC_BYTES))


def _limit_after_start() -> Any:
    """The topics' limit unknown at the start (as if lowered later), read again afterwards."""
    calls = []

    def limit(cfg: KafkaSinkConfig) -> int | None:
        calls.append(1)
        return None if len(calls) == 1 else fetch_topic_limit(cfg)

    return limit


@pytest.mark.parametrize(
    ("max_request_size", "topic_limit"),
    [
        (SMALL_TOPIC_BYTES, None),
        (1024**2, None),
        (1024**2, _limit_after_start),
        (1024**2, lambda: lambda cfg: None),
    ],
    ids=[
        "max_request_size matches the topic: dropped before sending",
        "the sink reads the topic's lower limit: dropped before sending",
        "the topic's limit lowered after the start: the broker refuses, the sink learns",
        "Kafka will not say its limit: the broker refuses, that record is dropped",
    ],
)
def test_a_record_too_large_for_kafka_fails_alone(
    kafka_bootstrap: str,
    small_topics: Topics,
    tmp_path: Path,
    max_request_size: int,
    topic_limit: Any,
) -> None:
    """Issue 14, finding 1: one record over the topic's limit was taken for an outage, sat at
    the spool's head for ever with every later record behind it, and close() said True."""
    cfg = config(
        kafka_bootstrap, small_topics, tmp_path / "spool", **{"message.max.bytes": max_request_size}
    )
    sink = KafkaSink(cfg, topic_limit=topic_limit() if topic_limit else None, **FAST)
    before = [numbered_exchange(DEP, i) for i in range(20)]
    after = [numbered_exchange(DEP, i) for i in range(21, 60)]
    for r in [*before, _big(20), *after]:
        assert sink.submit(r)
    assert sink.flush(60), "records were left behind the big one"
    assert not sink.close(10), "close() must say a record it accepted was dropped"
    stats = sink.stats()
    assert stats.dropped == {"too_large": 1}
    got = consume(kafka_bootstrap, small_topics.exchanges, 59)
    assert sorted(m.value for m in got) == sorted(r.to_json() for r in before + after)
    with Spool(tmp_path / "spool", max_bytes=10**9, publish_metrics=False) as left:
        assert len(left) == 0


def test_a_too_large_record_at_the_spools_head_is_dropped_and_the_rest_drains(
    kafka_bootstrap: str, small_topics: Topics, tmp_path: Path
) -> None:
    """A spool left by a process whose records were too large (or spooled while Kafka was away
    before the limit was set) does not stay stuck: a restart drains it."""
    spool_dir = tmp_path / "spool"
    records = [numbered_exchange(DEP, i) for i in range(30)]
    with Spool(spool_dir, max_bytes=10**9, publish_metrics=False) as spool:
        for r in [_big(100), *records[:15], _big(101), *records[15:]]:
            spool.append(encode_frame(small_topics.exchanges, str(r.pair_id).encode(), r.to_json()))
    sink = KafkaSink(
        config(
            kafka_bootstrap, small_topics, spool_dir, **{"message.max.bytes": SMALL_TOPIC_BYTES}
        ),
        **FAST,
    )
    assert sink.flush(60)
    assert not sink.close(10)  # two records were dropped: close() says so
    assert sink.stats().dropped == {"too_large": 2}
    with Spool(spool_dir, max_bytes=10**9, publish_metrics=False) as left:
        assert len(left) == 0
    got = consume(kafka_bootstrap, small_topics.exchanges, 30)
    assert [m.value for m in got] == [r.to_json() for r in records]  # one partition: in order


def test_close_is_false_when_records_are_stuck_in_the_spool_while_kafka_answers(
    tmp_path: Path,
) -> None:
    """A broker that answers but never acknowledges: close() must not report success."""

    class Future:
        def add_callback(self, fn: Any) -> None:
            pass

        def add_errback(self, fn: Any) -> None:
            pass

    class Silent:
        config: dict[str, Any] = {}

        def send(self, topic: str, *, key: bytes | None, value: bytes) -> Future:
            return Future()

        def partitions_for(self, topic: str) -> set[int]:
            return {0}

        def close(self, timeout: float | None = None) -> None:
            pass

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=tmp_path / "spool"),
        producer_factory=lambda _cfg: Silent(),
    )
    for i in range(5):
        assert sink.submit(numbered_exchange(DEP, i))
    assert not sink.close(1.0)
    with Spool(tmp_path / "spool", max_bytes=10**9, publish_metrics=False) as left:
        assert len(left) == 5  # spooled at close: not lost, but not reported as delivered


URLS: dict[str, Any] = {
    "incumbent": {"url": "http://127.0.0.1:1"},
    "candidate": {"url": "http://127.0.0.1:2"},
}


def test_an_unknown_client_property_is_refused_with_the_closest_names() -> None:
    from mirror.config import load_settings
    from mirror.errors import MirrorConfigError

    with pytest.raises(MirrorConfigError) as caught:
        load_settings(None, **URLS, kafka={"bootstrap": "h:1", "client": {"linger_ms": 20}})
    assert "kafka.client: 'linger_ms' is not a librdkafka producer property" in str(caught.value)
    assert "did you mean 'linger.ms'" in str(caught.value)
    # A consumer's property is no producer's; the sink's own and the secrets are refused too.
    refused = {
        "group.id": "not a librdkafka producer property",
        "acks": "acks=all",
        "bootstrap.servers": "set kafka.bootstrap",
        "sasl.password": "SHADOW_AB_KAFKA_",
    }
    for key, why in refused.items():
        with pytest.raises(MirrorConfigError, match=why):
            load_settings(None, **URLS, kafka={"bootstrap": "h:1", "client": {key: "x"}})


def test_a_client_property_overrides_the_default_and_reaches_the_producer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``kafka.client`` from the environment (JSON), laid over the defaults, is what
    librdkafka's producer is built with; the defaults it does not name stay."""
    import confluent_kafka

    from mirror.config import load_settings
    from mirror.kafka_sink import PRODUCER_DEFAULTS

    built: list[dict[str, Any]] = []

    class Built(Exception):
        pass

    def producer(props: dict[str, Any]) -> Any:
        built.append(props)
        raise Built  # stop there: only what librdkafka is handed matters

    monkeypatch.setattr(confluent_kafka, "Producer", producer)
    monkeypatch.setattr("mirror.kafka_sink.any_reachable", lambda *_a: True)
    monkeypatch.setenv(
        "SHADOW_AB_MIRROR_KAFKA__CLIENT",
        '{"linger.ms": 20, "compression.type": "zstd", "delivery.timeout.ms": 30000}',
    )
    settings = load_settings(None, **URLS, kafka={"bootstrap": "h:1", "spool_dir": str(tmp_path)})
    assert settings.kafka is not None
    with pytest.raises(Built):
        make_producer(settings.kafka)
    (props,) = built
    assert props["linger.ms"] == 20 != PRODUCER_DEFAULTS["linger.ms"]
    assert props["compression.type"] == "zstd"
    assert props["delivery.timeout.ms"] == 30000
    assert "message.timeout.ms" not in props  # the default under the other name is replaced
    assert props["client.id"] == PRODUCER_DEFAULTS["client.id"]
    assert props["acks"] == "all" and props["enable.idempotence"] is True
    assert props["bootstrap.servers"] == settings.kafka.bootstrap
    assert settings.kafka.delivery_timeout_s == 30.0  # the sink's watchdog follows it
