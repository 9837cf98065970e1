"""The steps with an exact clock and simple fakes of our own seams (the store's writer
functions, the dead-letter sender, the commit step); the real Kafka and PostgreSQL are in
test_ingest_services.py."""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
from factories import numbered_exchange, numbered_health

from ingester.backoff import Backoff
from ingester.batch import DeadLetter, Partition
from ingester.clock import ManualClock
from ingester.decode import PoisonReason
from ingester.errors import DeadLetterUnavailable, StoreRejected
from ingester.sink import StoreSink
from ingester.steps import Accumulate, Decode, MessageRejected, ThreadRunner, WriteBatch
from storage.errors import SchemaMissing, StoreError, StoreUnavailable

EX, HE = "t.exchanges", "t.health"


@dataclass
class Msg:
    """A message as the consumer hands it over (same attributes as kafka's ConsumerRecord)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


class Store:
    """Writer functions with the storage.write signatures, over a dict; can be 'down'."""

    def __init__(self) -> None:
        self.rows: dict[Any, Any] = {}
        self.down = False
        self.calls = 0
        self.refuse: set[str] = set()  # output_text values the 'database' refuses

    def write_exchanges(self, engine: Any, records: Sequence[Any]) -> int:
        return self._write(records, lambda r: (r.pair_id, r.role))

    def write_health(self, engine: Any, samples: Sequence[Any]) -> int:
        return self._write(samples, lambda s: (s.engine, s.ts))

    def _write(self, records: Sequence[Any], key: Any) -> int:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("connection refused")
        if any(getattr(r, "output_text", None) in self.refuse for r in records):
            raise StoreError("value too long for type character varying(200)")
        new = {key(r): r for r in records if key(r) not in self.rows}
        self.rows.update(new)
        return len(new)


class Letters:
    def __init__(self) -> None:
        self.sent: list[DeadLetter] = []
        self.down = False

    def send(self, letters: Sequence[DeadLetter]) -> None:
        pending = [x for x in letters if not x.acked]
        if pending and self.down:
            raise DeadLetterUnavailable("broker away")
        for x in pending:
            x.acked = True
            self.sent.append(x)


class Commits:
    def __init__(self) -> None:
        self.offsets: list[dict[Partition, int]] = []

    def submit(self, offsets: dict[Partition, int]) -> None:
        self.offsets.append(dict(offsets))

    def poll(self) -> None:
        pass

    def join(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


class Pipeline:
    def __init__(self, batch_size: int = 3, wait_s: float = 1.0) -> None:
        self.clock = ManualClock(100.0)
        self.store = Store()
        self.letters = Letters()
        self.commits = Commits()
        sink = StoreSink(None, self.store.write_exchanges, self.store.write_health)
        backoff = Backoff(initial_s=1.0, cap_s=8.0, rng=random.Random(1))
        self.write = WriteBatch(sink, self.letters, self.commits, self.clock, backoff)
        self.acc = Accumulate(self.write, self.clock, max_size=batch_size, max_wait_s=wait_s)
        self.decode = Decode(self.acc, {EX: "exchange", HE: "health"})
        self.offsets = {EX: 0, HE: 0}

    def msg(self, topic: str, value: bytes | None, partition: int = 0) -> Msg:
        off = self.offsets[topic]
        self.offsets[topic] += 1
        return Msg(topic, partition, off, value, key=b"k")

    def submit_exchange(self, i: int, partition: int = 0) -> None:
        self.decode.submit(self.msg(EX, numbered_exchange("dep", i).to_json(), partition))


def test_batch_flushes_at_size_and_commits_after_the_write() -> None:
    p = Pipeline(batch_size=3)
    p.submit_exchange(0)
    p.submit_exchange(1, partition=1)
    assert p.store.rows == {} and p.commits.offsets == []
    p.submit_exchange(2)
    assert len(p.store.rows) == 3
    assert p.commits.offsets == [{Partition(EX, 0): 3, Partition(EX, 1): 2}]


def test_batch_flushes_exactly_at_its_timeout() -> None:
    p = Pipeline(batch_size=100, wait_s=1.0)
    p.submit_exchange(0)
    p.clock.advance(0.5)
    p.submit_exchange(1)
    p.clock.advance(0.499)
    p.decode.poll()
    assert p.store.rows == {}
    p.clock.advance(0.001)  # the first message is now exactly 1.0 s old
    p.decode.poll()
    assert len(p.store.rows) == 2
    assert p.commits.offsets == [{Partition(EX, 0): 2}]


def test_mixed_kinds_and_poison_share_one_batch_and_one_commit() -> None:
    p = Pipeline(batch_size=4)
    p.submit_exchange(0)
    p.decode.submit(p.msg(HE, numbered_health("dep", 0).to_json()))
    p.decode.submit(p.msg(EX, b"\xff not json"))
    p.decode.submit(p.msg(EX, numbered_health("dep", 1).to_json()))  # wrong topic
    assert len(p.store.rows) == 2
    assert [x.poison.code for x in p.letters.sent] == [
        PoisonReason.NOT_JSON,
        PoisonReason.WRONG_TOPIC,
    ]
    assert p.letters.sent[0].message.value == b"\xff not json"
    assert p.commits.offsets == [{Partition(EX, 0): 3, Partition(HE, 0): 1}]


def test_store_down_keeps_the_batch_pushes_back_and_retries_with_backoff() -> None:
    p = Pipeline(batch_size=2)
    p.store.down = True
    p.submit_exchange(0)
    p.submit_exchange(1)  # full: write fails, batch kept by WriteBatch
    assert p.write.busy and p.commits.offsets == []
    first_retry = p.write.retry_at
    assert 100.5 <= first_retry <= 101.0  # attempt 1: jitter within [0.5, 1.0] s
    p.submit_exchange(2)
    p.submit_exchange(3)  # second batch full, but the writer is busy: waits in Accumulate
    assert p.acc.ready is not None and p.acc.ready.size == 2
    p.submit_exchange(4)
    p.submit_exchange(5)  # a third batch fills up behind it
    assert p.acc.current is not None and p.acc.current.size == 2
    assert p.acc.pending_messages == 6
    with pytest.raises(MessageRejected):
        p.submit_exchange(6)  # backpressure: the caller must pause
    calls = p.store.calls
    p.clock.now = first_retry - 0.001
    p.decode.poll()
    assert p.store.calls == calls  # not before the backoff has passed
    p.clock.now = first_retry
    p.decode.poll()
    assert p.store.calls == calls + 1 and p.write.attempts == 2
    second_retry = p.write.retry_at
    assert first_retry + 1.0 <= second_retry <= first_retry + 2.0  # attempt 2: [1, 2] s
    p.store.down = False
    p.clock.now = second_retry
    p.decode.poll()  # batch 1 written and committed, batch 2 handed on and written
    p.decode.poll()  # batch 3
    assert len(p.store.rows) == 6
    assert p.commits.offsets == [
        {Partition(EX, 0): 2},
        {Partition(EX, 0): 4},
        {Partition(EX, 0): 6},
    ]
    assert p.acc.pending_messages == 0
    p.decode.submit(p.msg(EX, numbered_exchange("dep", 6).to_json()))  # accepted again


def test_dead_letter_failure_blocks_the_commit_and_is_retried_without_duplicates() -> None:
    p = Pipeline(batch_size=2)
    p.letters.down = True
    p.submit_exchange(0)
    p.decode.submit(p.msg(EX, b"nope"))
    assert p.commits.offsets == [] and p.write.busy
    p.letters.down = False
    p.clock.now = p.write.retry_at
    p.decode.poll()
    assert len(p.letters.sent) == 1
    assert p.commits.offsets == [{Partition(EX, 0): 2}]


def test_join_writes_the_partial_batch_and_waits_out_a_short_outage() -> None:
    p = Pipeline(batch_size=100, wait_s=60)
    p.submit_exchange(0)
    p.store.down = True
    assert p.decode.join(0.2) is False  # store away, timeout shorter than the backoff
    p.store.down = False
    assert p.decode.join(30) is True
    assert len(p.store.rows) == 1 and p.commits.offsets == [{Partition(EX, 0): 1}]


def test_store_refusing_one_record_sends_just_that_one_to_the_dlq() -> None:
    p = Pipeline(batch_size=5)
    p.store.refuse = {"answer 3"}
    for i in range(5):
        p.submit_exchange(i)
    assert len(p.store.rows) == 4
    assert [x.poison.code for x in p.letters.sent] == [PoisonReason.STORE_REJECTED]
    assert p.letters.sent[0].message.offset == 3
    assert "value too long" in p.letters.sent[0].poison.detail
    assert p.commits.offsets == [{Partition(EX, 0): 5}]


def test_store_refusing_everything_stops_instead_of_dead_lettering_it_all() -> None:
    store = Store()
    store.refuse = {"answer 0", "answer 1"}
    sink = StoreSink(None, store.write_exchanges, store.write_health)
    with pytest.raises(StoreRejected, match="refused every one of 2"):
        sink.write_exchanges([numbered_exchange("d", 0), numbered_exchange("d", 1)])


def test_unmigrated_store_stops_at_once() -> None:
    calls = []

    def missing(engine: Any, records: Sequence[Any]) -> int:
        calls.append(len(records))
        raise SchemaMissing("relation exchanges does not exist: run `shadow-ab db upgrade`")

    sink = StoreSink(None, missing, missing)
    with pytest.raises(StoreRejected, match="db upgrade"):
        sink.write_exchanges([numbered_exchange("d", i) for i in range(64)])
    assert calls == [64]  # no bisecting a schema problem


@pytest.mark.parametrize(
    "failure",
    [OverflowError("date value out of range"), ValueError("bad"), RuntimeError("a bug")],
    ids=["overflow", "value", "runtime"],
)
def test_any_failure_one_record_trips_sends_just_that_one_to_the_dlq(
    failure: Exception,
) -> None:
    """Not only StoreError: whatever one record makes the writer raise is isolated to it."""
    p = Pipeline(batch_size=5)
    inner = p.store.write_exchanges

    def tripping(engine: Any, records: Sequence[Any]) -> int:
        if any(r.output_text == "answer 2" for r in records):
            raise failure
        return inner(engine, records)

    p.write.sink = StoreSink(None, tripping, p.store.write_health)
    for i in range(5):
        p.submit_exchange(i)
    assert len(p.store.rows) == 4
    assert [x.message.offset for x in p.letters.sent] == [2]
    assert p.letters.sent[0].poison.code == PoisonReason.STORE_REJECTED
    assert type(failure).__name__ in p.letters.sent[0].poison.detail
    assert p.commits.offsets == [{Partition(EX, 0): 5}]


def test_a_record_tripping_the_decoder_is_poison_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import ingester.steps as steps

    real = steps.decode

    def fragile(value: bytes | None, kind: str | None = None, **options: Any) -> Any:
        if value == b"trips":
            raise KeyError("boom")
        return real(value, kind, **options)

    monkeypatch.setattr(steps, "decode", fragile)
    p = Pipeline(batch_size=3)
    p.submit_exchange(0)
    p.decode.submit(p.msg(EX, b"trips"))
    p.submit_exchange(2)
    assert len(p.store.rows) == 2
    assert [(x.poison.code, x.message.offset) for x in p.letters.sent] == [
        (PoisonReason.DECODE_FAILED, 1)
    ]
    assert p.commits.offsets == [{Partition(EX, 0): 3}]


def test_dead_letters_wait_for_the_store_so_an_outage_never_sends_them() -> None:
    """The DLQ is written after the store and just before the commit: a store outage (or a
    restart during one) sends no dead letter, so nothing is sent twice."""
    p = Pipeline(batch_size=2)
    p.store.down = True
    p.submit_exchange(0)
    p.decode.submit(p.msg(EX, b"nope"))
    assert p.write.busy and p.letters.sent == []
    p.clock.now = p.write.retry_at
    p.decode.poll()
    assert p.letters.sent == []  # still down: still nothing
    p.store.down = False
    p.clock.now = p.write.retry_at
    p.decode.poll()
    assert len(p.letters.sent) == 1 and len(p.store.rows) == 1
    assert p.commits.offsets == [{Partition(EX, 0): 2}]


def test_a_store_refusing_everything_sends_no_dead_letters_before_stopping() -> None:
    p = Pipeline(batch_size=3)
    p.store.refuse = {"answer 0", "answer 2"}
    p.submit_exchange(0)
    p.decode.submit(p.msg(EX, b"nope"))
    with pytest.raises(StoreRejected):
        p.submit_exchange(2)
    assert p.letters.sent == [] and p.commits.offsets == []


class HeldRunner:
    """A runner whose writes run only when the test says (``run(i)``): writes that finish out
    of order, as on writer threads."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, Future[None]]] = []

    def submit(self, fn: Any) -> Future[None]:
        future: Future[None] = Future()
        self.jobs.append((fn, future))
        return future

    def run(self, i: int) -> None:
        fn, future = self.jobs[i]
        try:
            fn()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)


def _inflight_pipeline(max_inflight: int) -> tuple[Pipeline, HeldRunner]:
    p = Pipeline(batch_size=2)
    runner = HeldRunner()
    backoff = Backoff(initial_s=1.0, cap_s=8.0, rng=random.Random(1))
    sink = StoreSink(None, p.store.write_exchanges, p.store.write_health)
    p.write = WriteBatch(sink, p.letters, p.commits, p.clock, backoff, runner, max_inflight)
    p.acc = Accumulate(p.write, p.clock, max_size=2, max_wait_s=1.0)
    p.decode = Decode(p.acc, {EX: "exchange", HE: "health"})
    return p, runner


def test_batches_in_flight_commit_in_order_whatever_order_they_finish() -> None:
    p, runner = _inflight_pipeline(max_inflight=3)
    for i in range(6):
        p.submit_exchange(i)
    assert len(runner.jobs) == 3 and p.write.busy  # three batches handed to the writer
    for i in range(6, 10):  # a fourth waits in Accumulate, a fifth fills up behind it
        p.submit_exchange(i)
    with pytest.raises(MessageRejected):  # then the caller must pause
        p.submit_exchange(10)
    runner.run(2)
    runner.run(1)
    p.decode.poll()
    assert len(p.store.rows) == 4 and p.commits.offsets == []  # batch 1 not written yet
    runner.run(0)
    p.decode.poll()
    assert p.commits.offsets == [
        {Partition(EX, 0): 2},
        {Partition(EX, 0): 4},
        {Partition(EX, 0): 6},
    ]
    assert len(runner.jobs) == 5  # the waiting batches went to the writer at once


def test_a_failed_batch_in_flight_holds_back_later_commits_until_its_retry() -> None:
    p, runner = _inflight_pipeline(max_inflight=2)
    p.store.down = True
    for i in range(2):
        p.submit_exchange(i)
    runner.run(0)  # batch 1: store down
    p.store.down = False
    for i in range(2, 4):
        p.submit_exchange(i)
    runner.run(1)  # batch 2 written
    p.decode.poll()
    assert p.write.attempts == 1 and p.commits.offsets == []
    assert len(p.store.rows) == 2 and p.write.busy
    p.clock.now = p.write.retry_at
    p.decode.poll()
    assert len(runner.jobs) == 3  # batch 1 again
    runner.run(2)
    assert p.write.join(1.0)
    assert len(p.store.rows) == 4
    assert p.commits.offsets == [{Partition(EX, 0): 2}, {Partition(EX, 0): 4}]


def test_writer_threads_write_every_batch_and_commit_in_order() -> None:
    p = Pipeline(batch_size=5)
    backoff = Backoff(initial_s=1.0, cap_s=8.0, rng=random.Random(1))
    sink = StoreSink(None, p.store.write_exchanges, p.store.write_health)
    p.write = WriteBatch(sink, p.letters, p.commits, p.clock, backoff, ThreadRunner(3), 3)
    p.acc = Accumulate(p.write, p.clock, max_size=5, max_wait_s=1.0)
    p.decode = Decode(p.acc, {EX: "exchange", HE: "health"})
    sent = 0
    msg = p.msg(EX, numbered_exchange("dep", 0).to_json(), 0)
    while sent < 200:
        try:  # a rejected message is offered again, with its own offset (as Kafka would)
            p.decode.submit(msg)
            sent += 1
            msg = p.msg(EX, numbered_exchange("dep", sent).to_json(), sent % 2)
        except MessageRejected:
            p.decode.poll()
    assert p.acc.join(10.0)
    assert len(p.store.rows) == 200
    last = [max(c.get(Partition(EX, k), -1) for c in p.commits.offsets) for k in (0, 1)]
    assert last == [199, 200]  # offsets alternate between the partitions
    for k in (0, 1):
        seen = [c[Partition(EX, k)] for c in p.commits.offsets if Partition(EX, k) in c]
        assert seen == sorted(seen)


def test_metrics_move_once_a_batch_and_on_every_poll() -> None:
    """Messages consumed and pending: updated when a batch is handed on and on poll (the
    processor's every step), not once a message; nothing taken is left uncounted."""
    from prometheus_client import REGISTRY

    topic = f"t.metrics.{random.Random().getrandbits(32)}"
    p = Pipeline(batch_size=3)
    p.decode = Decode(p.acc, {topic: "exchange"})
    p.offsets[topic] = 0

    def consumed() -> float:
        value = REGISTRY.get_sample_value(
            "shadow_ab_ingest_messages_consumed_total", {"topic": topic}
        )
        return value or 0.0

    def pending() -> float | None:
        return REGISTRY.get_sample_value("shadow_ab_ingest_pending_messages")

    for i in range(2):
        p.decode.submit(p.msg(topic, numbered_exchange("dep", i).to_json()))
    assert consumed() == 0  # not yet: once a batch, or on poll
    p.decode.poll()
    assert (consumed(), pending()) == (2, 2)
    p.decode.submit(p.msg(topic, numbered_exchange("dep", 2).to_json()))  # the batch is full
    assert (consumed(), pending()) == (3, 0)
    p.decode.submit(p.msg(topic, numbered_exchange("dep", 3).to_json()))
    p.decode.poll()
    assert (consumed(), pending()) == (4, 1)


class PausingConsumer:
    """The consumer as the processor sees it: hands out the queued messages, none while
    paused; counts its pauses."""

    def __init__(self, messages: list[Msg]) -> None:
        self.queue = list(messages)
        self.paused_now: set[Partition] = set()
        self.pauses = 0

    def poll(self, timeout_ms: int, max_records: int | None = None) -> list[Msg]:
        if self.paused_now:
            return []
        out = self.queue[: max_records or 1]
        del self.queue[: len(out)]
        return out

    def assignment(self) -> set[Partition]:
        return {Partition(EX, 0)}

    def pause(self, *partitions: Partition) -> None:
        self.pauses += 1
        self.paused_now.update(partitions)

    def resume(self, *partitions: Partition) -> None:
        self.paused_now.difference_update(partitions)

    def paused(self) -> set[Partition]:
        return set(self.paused_now)


def _processor(p: Pipeline, runner: HeldRunner, consumer: PausingConsumer) -> Any:
    from ingester.processor import StreamProcessor

    backoff = Backoff(initial_s=1.0, cap_s=8.0, rng=random.Random(1))
    sink = StoreSink(None, p.store.write_exchanges, p.store.write_health)
    p.write = WriteBatch(sink, p.letters, p.commits, p.clock, backoff, runner, 1)
    p.acc = Accumulate(p.write, p.clock, max_size=2, max_wait_s=60.0)
    p.decode = Decode(p.acc, {EX: "exchange", HE: "health"})
    return StreamProcessor(
        consumer, [EX], lambda: p.decode, p.clock, max_records=2, poll_timeout_ms=1
    )


def _held_up(p: Pipeline, runner: HeldRunner) -> tuple[Any, PausingConsumer]:
    """A processor whose one batch in flight is not written yet, a second batch waiting for
    the writer and a third full: the next messages are held."""
    messages = [p.msg(EX, numbered_exchange("dep", i).to_json()) for i in range(10)]
    consumer = PausingConsumer(messages)
    proc = _processor(p, runner, consumer)
    while not proc.held:
        proc.step()
    assert len(runner.jobs) == 1 and consumer.pauses == 0
    return proc, consumer


def test_a_running_write_is_waited_for_and_the_prefetched_messages_kept() -> None:
    """librdkafka drops what it prefetched for a paused partition: while a write runs the
    processor waits for it instead of pausing, for WAIT_FOR_WRITER_S at most."""
    from ingester.processor import WAIT_FOR_WRITER_S

    p = Pipeline()
    runner = HeldRunner()
    proc, consumer = _held_up(p, runner)
    for _ in range(3):
        proc.step()  # waits (a millisecond: poll_timeout_ms) for the write
    assert consumer.pauses == 0 and not proc.paused and proc.held
    p.clock.advance(WAIT_FOR_WRITER_S)
    proc.step()  # the write has taken too long: pause, and poll on to keep the group
    assert consumer.pauses == 1 and proc.paused
    runner.run(0)
    _drain(proc, runner)
    assert not consumer.paused_now and consumer.pauses == 1
    assert p.commits.offsets[0] == {Partition(EX, 0): 2}


def _drain(proc: Any, runner: HeldRunner) -> None:
    """Step and write until nothing is held and the partitions are resumed."""
    while proc.held or proc.paused:
        proc.step()
        for i, (_, future) in enumerate(runner.jobs):
            if not future.done():
                runner.run(i)


def test_no_running_write_pauses_at_once() -> None:
    """A batch waiting out its retry (the store is away): nothing to wait for, so pause."""
    p = Pipeline()
    runner = HeldRunner()
    proc, consumer = _held_up(p, runner)
    p.store.down = True
    runner.run(0)
    proc.step()  # the write failed: a retry in a second, nothing running
    assert consumer.pauses == 1 and proc.paused and p.write.attempts == 1
    p.store.down = False
    p.clock.advance(p.write.retry_at - p.clock.monotonic())
    proc.step()  # the retry starts
    assert len(runner.jobs) == 2
    _drain(proc, runner)
    assert p.commits.offsets[0] == {Partition(EX, 0): 2}


def test_a_waiting_batch_goes_to_the_writer_on_the_next_message_once_there_is_room() -> None:
    """While the writer is full, messages do not knock on it one by one (each knock cost as
    much as decoding a message); once the oldest write is done the next message hands the
    waiting batch on, without waiting for a poll."""
    p, runner = _inflight_pipeline(max_inflight=1)
    for i in range(4):  # batch 1 to the writer, batch 2 waits
        p.submit_exchange(i)
    assert len(runner.jobs) == 1 and p.acc.ready is not None
    knocks = []
    submit = p.write.submit
    p.write.submit = lambda batch: (knocks.append(batch), submit(batch))[1]  # type: ignore[method-assign]
    p.submit_exchange(4)
    assert len(runner.jobs) == 1 and knocks == []  # no room: batch 2 waits, unoffered
    runner.run(0)
    p.submit_exchange(5)  # batch 2 to the writer; this message fills batch 3, which waits
    assert (
        len(runner.jobs) == 2
        and p.acc.ready is not None
        and p.acc.ready.offsets == {Partition(EX, 0): 6}
    )
    assert p.commits.offsets == [{Partition(EX, 0): 2}]
