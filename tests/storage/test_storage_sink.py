"""The direct sink: batching by size and by interval, close() flushes, a full queue counts drops."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from factories import exchanges, full_exchange, health_series
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from shadow_ab.dev.processes import free_port
from shadow_ab.records import ExchangeRecord, HealthSample
from storage.db import make_engine
from storage.sink import DirectSink


class FakeClock:
    """A clock that only moves when the test says so; counts how often it is read."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.reads += 1
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 20.0) -> None:
    """Poll until ``condition`` holds (an upper bound against hangs, not a timing assertion)."""
    end = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def count(engine: Engine, table: str = "exchanges") -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def dropped_metric(reason: str) -> float:
    return REGISTRY.get_sample_value("shadow_ab_sink_dropped_total", {"reason": reason}) or 0.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink_factory(clock: FakeClock) -> Iterator[Callable[..., DirectSink]]:
    sinks: list[DirectSink] = []

    def make(engine: Engine, **kw: object) -> DirectSink:
        kw.setdefault("clock", clock)
        sink = DirectSink(engine, **kw)  # type: ignore[arg-type]  # test pass-through
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.close(timeout=1.0)


def test_flushes_when_a_batch_is_full(
    sqlite_engine: Engine, sink_factory: Callable[..., DirectSink]
) -> None:
    sink = sink_factory(sqlite_engine, batch_size=10, flush_interval_s=3600, max_queue=100)
    for rec in exchanges(25):
        assert sink.submit(rec)
    wait_for(lambda: count(sqlite_engine) == 20, "two full batches")
    assert sink.stats().batches == 2
    assert sink.close()
    assert count(sqlite_engine) == 25


def test_flushes_when_the_interval_passes(
    sqlite_engine: Engine, clock: FakeClock, sink_factory: Callable[..., DirectSink]
) -> None:
    sink = sink_factory(sqlite_engine, batch_size=100, flush_interval_s=2.0)
    for rec in exchanges(3):
        assert sink.submit(rec)
    # let the writer look at the clock several times: the interval has not passed yet
    reads = clock.reads
    wait_for(lambda: clock.reads >= reads + 5, "the writer to poll")
    assert count(sqlite_engine) == 0
    clock.advance(1.9)
    reads = clock.reads
    wait_for(lambda: clock.reads >= reads + 5, "the writer to poll")
    assert count(sqlite_engine) == 0
    clock.advance(0.1)
    # the writer counts a batch after its commit: wait for the count, then the rows are there
    wait_for(lambda: sink.stats().batches == 1, "the interval flush")
    assert count(sqlite_engine) == 3


def test_close_flushes_everything(
    sqlite_engine: Engine, sink_factory: Callable[..., DirectSink]
) -> None:
    sink = sink_factory(sqlite_engine, batch_size=1000, flush_interval_s=3600)
    batch: list[ExchangeRecord | HealthSample] = [*exchanges(7), *health_series(4)]
    for rec in batch:
        assert sink.submit(rec)
    assert sink.close(timeout=10)
    assert count(sqlite_engine) == 7
    assert count(sqlite_engine, "health_samples") == 4
    stats = sink.stats()
    assert (stats.submitted, stats.written, stats.duplicates) == (11, 11, 0)
    # after close, records are refused and counted
    assert not sink.submit(exchanges(1)[0])
    assert sink.stats().dropped["closed"] == 1


def test_flush_and_duplicates(
    sqlite_engine: Engine, sink_factory: Callable[..., DirectSink]
) -> None:
    sink = sink_factory(sqlite_engine, batch_size=1000, flush_interval_s=3600)
    batch = exchanges(6)
    for rec in batch + batch:
        sink.submit(rec)
    assert sink.flush(timeout=10)
    assert count(sqlite_engine) == 6
    stats = sink.stats()
    assert (stats.written, stats.duplicates) == (6, 6)


def test_full_queue_drops_are_counted_and_stored(
    pg_engine: Engine, sink_factory: Callable[..., DirectSink]
) -> None:
    before = dropped_metric("queue_full")
    sink = sink_factory(pg_engine, batch_size=5, max_queue=5, flush_interval_s=3600)
    records = exchanges(17)
    with pg_engine.connect() as blocker:
        # hold the writer inside its first batch: it waits for this lock
        blocker.execute(text("LOCK TABLE deployments IN ACCESS EXCLUSIVE MODE"))
        for rec in records[:5]:
            assert sink.submit(rec)
        wait_for(lambda: sink.pending() == (0, 5), "the writer to take the first batch")
        for rec in records[5:10]:
            assert sink.submit(rec)  # fills the queue
        refused = [rec for rec in records[10:] if not sink.submit(rec)]
        assert len(refused) == 7
        assert sink.stats().dropped["queue_full"] == 7
        assert dropped_metric("queue_full") - before == 7
        blocker.rollback()
    assert sink.close(timeout=20) is True  # queue_full drops were counted, not lost silently
    assert count(pg_engine) == 10
    with pg_engine.connect() as conn:
        rows = conn.execute(text("SELECT source, reason, count FROM drops")).all()
    assert [tuple(r) for r in rows] == [("direct_sink", "queue_full", 7)]


def test_unavailable_store_is_retried_then_counted_at_close(
    sink_factory: Callable[..., DirectSink],
) -> None:
    engine = make_engine(f"postgresql+psycopg://shadow@127.0.0.1:{free_port()}/x")
    before = dropped_metric("store_unavailable")
    sink = sink_factory(
        engine, batch_size=2, max_queue=4, backoff_initial_s=0.01, backoff_max_s=0.02
    )
    accepted = sum(sink.submit(rec) for rec in exchanges(4))
    assert accepted == 4
    wait_for(lambda: sink.stats().retries >= 3, "retries")
    assert sink.close(timeout=0.2) is False
    stats = sink.stats()
    assert stats.written == 0
    assert stats.dropped["store_unavailable"] == 4
    assert dropped_metric("store_unavailable") - before == 4
    engine.dispose()


def test_bad_arguments(sqlite_engine: Engine) -> None:
    with pytest.raises(ValueError, match="max_queue"):
        DirectSink(sqlite_engine, batch_size=10, max_queue=5)
    with pytest.raises(ValueError, match="batch_size"):
        DirectSink(sqlite_engine, batch_size=0)
    sink = DirectSink(sqlite_engine)
    try:
        with pytest.raises(TypeError, match="ExchangeRecord or HealthSample"):
            sink.submit({"kind": "exchange"})  # type: ignore[arg-type]  # the point of the test
    finally:
        assert sink.close()


def test_a_refused_record_does_not_take_its_batch_with_it(
    pg_engine: Engine, sink_factory: Callable[..., DirectSink]
) -> None:
    records = exchanges(8)
    # Out of range for the column; records.py refuses it at parse time since counts and
    # statuses are bounded, so build it past validation (as code constructing records could).
    poison = full_exchange().model_copy(update={"http_status": 2**40})
    sink = sink_factory(pg_engine, batch_size=100, flush_interval_s=3600)
    for rec in [*records[:3], poison, *records[3:]]:
        assert sink.submit(rec)
    assert sink.close(timeout=20) is False  # one record was lost, and said so
    assert count(pg_engine) == 8
    assert sink.stats().dropped == {"store_error": 1}
    with pg_engine.connect() as conn:
        rows = conn.execute(text("SELECT source, reason, count FROM drops")).all()
    assert [tuple(r) for r in rows] == [("direct_sink", "store_error", 1)]
