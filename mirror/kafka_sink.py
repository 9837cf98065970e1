"""The Kafka sink: records to Kafka without ever blocking the mirror, spooled while Kafka is away.

:meth:`KafkaSink.submit` (called on the mirror's request path) only appends the record to a
bounded in-memory queue -- when the queue is full the record is dropped and counted. One
background thread does the rest, in rounds every ``poll_s`` (it is not woken per record):

- **direct**: while Kafka answers and the spool is empty, each record is encoded
  (``record.to_json()``; key = ``pair_id`` for exchanges, ``engine`` for health samples) and
  handed to the producer (:mod:`mirror.kafka_confluent`: confluent-kafka, librdkafka; its I/O
  in C threads, outside the GIL; acks=all, idempotent, ``linger.ms`` batching; its properties
  are :data:`PRODUCER_DEFAULTS` with ``kafka.client`` laid over them). Delivery reports are
  served by the sink's thread at each round and only queue the outcome for the thread; at
  most :data:`MAX_IN_FLIGHT` records are unacknowledged at once.
- **spooling**: when a send fails (the broker is unreachable, a delivery timed out, the producer
  cannot even be built), Kafka is marked away and every record -- the failed ones and all new
  ones -- goes to the on-disk spool (:mod:`mirror.spool`, bounded by bytes; a full spool, or a
  disk that will not take more, drops and counts ``spool_full``, and the spool takes records
  again once space comes back). New records keep going to the spool while it holds anything,
  so spooled records are sent before newer ones.
- **draining**: after ``RETRY_BACKOFF_S`` (doubling up to ``RETRY_BACKOFF_MAX_S`` while Kafka
  stays away) one spooled record is sent as a probe; once Kafka acknowledges it, the spool is
  drained in order with up to ``MAX_IN_FLIGHT`` records outstanding. A spooled record is deleted
  only after Kafka acknowledged it (and every record before it); on a failure the unacked ones
  are sent again. Delivery is at least once: the ingester is idempotent on (pair_id, role,
  sent_at) and on (engine, ts).
- a watchdog: a send the producer has not resolved ``STUCK_GRACE_S`` after the delivery
  timeout (kafka-python, the client before, was seen to keep such sends for ever after a
  broker restart) makes the
  sink abandon that producer, spool its unacknowledged records again and build a new one.
- a record too large for Kafka fails alone: one whose key and value exceed the producer's
  ``message.max.bytes`` (set it to the topics' ``max.message.bytes``) is dropped before it
  is sent, and one the producer or the broker refuses for its size
  (``MessageSizeTooLargeError``) is dropped when refused, from the spool too (its entry is
  acked, so the spool's head moves on); both are counted (reason ``too_large``) and logged
  with their key. Never an outage, never stuck.
- :meth:`KafkaSink.close` sends what is queued (to Kafka, or to the spool), waits for the
  producer's acknowledgements until its timeout, and closes the spool; records still spooled
  are sent by the next process started on the same ``spool_dir``. It returns False when a
  record it accepted was dropped, or when records are left in the spool although Kafka answers
  (stuck, not waiting for Kafka).

The mirror in Kafka mode cannot reach the store's ``drops`` table, so drops are counted in
``shadow_ab_mirror_records_dropped_total`` (reasons: ``queue_full``, ``closed``, ``spool_full``,
``encode_error``, ``spool_corrupt``, ``too_large``, ``sink_error``) and summarised in a warning
log at most every 10 s. The thread survives a failing round (``sink_error`` for a record it
could not route); after ``MAX_STEP_FAILURES`` rounds failing in a row it gives up, and
:meth:`KafkaSink.alive` (the mirror's ``/healthz``) says so.

Errors: :class:`~mirror.errors.KafkaSinkError` (a :class:`~mirror.errors.MirrorError`): the
sink cannot start (its spool folder is unusable).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mirror.errors import KafkaSinkError, SpoolError
from mirror.metrics import RECORDS, RECORDS_DROPPED, SINK_ERRORS
from mirror.spool import Spool
from shadow_ab.kafka_config import Value, client_config, lookup
from shadow_ab.records import ExchangeRecord, HealthSample, Record
from shadow_ab.settings import state_dir
from shadow_ab.topics import TOPIC_EXCHANGES, TOPIC_HEALTH
from storage.bounds import KILLED, approx_bytes, open_ledger

log = logging.getLogger(__name__)

SINK = "kafka"
# Drop reasons (label values of shadow_ab_mirror_records_dropped_total).
QUEUE_FULL = "queue_full"
CLOSED = "closed"
SPOOL_FULL = "spool_full"
ENCODE_ERROR = "encode_error"
SPOOL_CORRUPT = "spool_corrupt"
TOO_LARGE = "too_large"
LEDGER_FILE = "ledger"
SINK_ERROR = "sink_error"
MAX_STEP_FAILURES = 100
"""Rounds in a row the sink's thread may fail before it gives up (and liveness fails)."""
ROUND_RECORDS = 1000
"""Records the sink's thread takes from the queue in one round. The thread runs a round every
``poll_s`` (50 ms), not at each record or acknowledgement: waking it per record cost the
process ~0.1-0.2 ms of CPU per record in thread switches and GIL hand-offs (bench/shadow_cost.py);
a queue reaching this many records wakes it at once."""
RECORD_OVERHEAD_BYTES = 128
"""What Kafka adds to a record's key and value (batch and record headers), rounded up: a record
whose key and value exceed ``message.max.bytes`` minus this is dropped before it is sent."""
_TOO_LARGE_ERRORS = frozenset({"MessageSizeTooLargeError"})
"""The error for one record too large for the producer or the topic, never an outage
(:class:`mirror.kafka_confluent.MessageSizeTooLargeError`: refused by ``send``, or the refused
batch's record larger than the rest of it together)."""
DROP_LOG_INTERVAL_S = 10.0

_FRAME = struct.Struct("<HH")


def _default_spool_dir() -> Path:
    return state_dir() / "mirror-spool"


PRODUCER_DEFAULTS: dict[str, Value] = {
    # The mirror in the brokers' logs and quotas.
    "client.id": "shadow-ab-mirror",
    # Records wait up to this long to share a request: 5 ms sent about one record a request
    # and cost the mirror ~0.9 ms of CPU per shadowed request more than 100 ms
    # (bench/mirror_overhead.py --kafka); reviews read them through hourly rollups, so the delay
    # costs nothing downstream.
    "linger.ms": 100,
    # A batch's bytes: at 100 ms of linger, room for a few dozen ~5 KB records a partition
    # (capped at message.max.bytes, so a batch of records that each fit is never refused).
    "batch.size": 256 * 1024,
    # The largest record sent: the topics' max.message.bytes (k8s/base/kafka.yaml). A larger
    # record is dropped alone before it is sent (too_large); the sink lowers it to the topics'
    # limit when it reads a lower one.
    "message.max.bytes": 1024**2,
    # librdkafka's default, kept: gzip, lz4 or zstd trade the mirror's CPU for the network's
    # bytes, and that trade was not measured.
    "compression.type": "none",
    # A broker that does not answer a request within 5 s is taken as away soon enough for the
    # delivery timeout below to spool the record.
    "request.timeout.ms": 5_000,
    # A record not acknowledged by then fails and goes to the spool (and the sink's watchdog
    # replaces a producer that leaves sends unresolved STUCK_GRACE_S past it). At least
    # linger.ms + request.timeout.ms.
    "message.timeout.ms": 15_000,
    # A broker back from a restart is reached again within a second.
    "reconnect.backoff.max.ms": 1_000,
    # The key's partition as the Java clients pick it (librdkafka's own default hashes
    # differently): a pair's records stay on the partition they had before the switch.
    "partitioner": "murmur2_random",
}
"""The producer's librdkafka properties; ``kafka.client`` is laid over them. Also set, unless
``kafka.client`` sets them: ``queue.buffering.max.messages`` and ``queue.buffering.max.kbytes``
(from :data:`MAX_IN_FLIGHT` and ``message.max.bytes``; :func:`mirror.kafka_confluent.
producer_properties`)."""
OWNED_PROPERTIES = {
    "bootstrap.servers": "set kafka.bootstrap (or --kafka, SHADOW_AB_KAFKA_BOOTSTRAP)",
    "acks": "the spool deletes a record only once every in-sync replica has it (acks=all)",
    "enable.idempotence": "a record sent again after a failed request must not be written twice",
}
"""Producer properties the sink sets itself: ``kafka.client`` may not set them."""


SPOOL_SEGMENT_BYTES = 16 * 1024**2
"""A spool segment's size: a segment is deleted whole once every record in it is acknowledged,
so 16 MiB (a few thousand records) frees space soon after Kafka is back, in few files."""
SPOOL_FSYNC = False
"""The spool does not fsync each record: it keeps records across a process restart (the page
cache survives it); an fsync per record cost more than the send itself, and a node's crash
loses seconds of shadow records, which the evaluator tolerates."""
QUEUE_MAX = 50_000
"""Records held in memory at most (``queue_max_bytes`` bounds their bytes): seconds of the
highest traffic a mirror serves."""
MAX_IN_FLIGHT = 10_000
"""Records sent and not yet acknowledged, at most (direct sends, and as many from the spool)."""
RETRY_BACKOFF_S = 1.0
"""First wait before trying Kafka again after a failure (doubles each failure)."""
RETRY_BACKOFF_MAX_S = 10.0
"""Longest wait between tries: a broker back is used again within ten seconds."""


class KafkaSinkConfig(BaseModel):
    """Settings of the Kafka sink (``kafka:`` in the mirror's YAML)."""

    model_config = ConfigDict(extra="forbid")

    bootstrap: str = Field(min_length=1, description="Kafka bootstrap servers, HOST:PORT[,...]")
    topic_exchanges: str = Field(default=TOPIC_EXCHANGES, min_length=1)
    topic_health: str = Field(default=TOPIC_HEALTH, min_length=1)
    spool_dir: Path = Field(
        default_factory=_default_spool_dir,
        description="spool folder (one per mirror process; survives restarts)",
    )
    spool_max_bytes: int = Field(default=1024**3, ge=1024, description="on-disk spool bound")
    queue_max_bytes: int = Field(
        default=256 * 1024**2, ge=1024, description="bytes of records held in memory, at most"
    )
    client: dict[str, Value] = Field(
        default_factory=dict,
        description="librdkafka producer properties laid over the sink's defaults"
        " (mirror.kafka_sink.PRODUCER_DEFAULTS), e.g. {linger.ms: 20, compression.type: zstd}",
    )

    @field_validator("client")
    @classmethod
    def _known_properties(cls, client: dict[str, Value]) -> dict[str, Value]:
        client_config(client, defaults={}, client="producer", owned=OWNED_PROPERTIES)
        return client

    @model_validator(mode="after")
    def _timeouts(self) -> KafkaSinkConfig:
        props = self.producer_config()
        names = ("linger.ms", "request.timeout.ms", "message.timeout.ms")
        try:
            linger, request, delivery = (int(lookup(props, k) or 0) for k in names)
        except ValueError:
            return self  # not a number: librdkafka refuses it when the producer is built
        if delivery < linger + request:
            raise ValueError(
                f"kafka.client: message.timeout.ms ({delivery}) must be at least"
                f" linger.ms + request.timeout.ms ({linger + request})"
            )
        return self

    def producer_config(self) -> dict[str, Value]:
        """The producer's properties: :data:`PRODUCER_DEFAULTS`, ``client`` over them."""
        return client_config(
            self.client, defaults=PRODUCER_DEFAULTS, client="producer", owned=OWNED_PROPERTIES
        )

    @property
    def max_request_size(self) -> int:
        """The largest record sent, bytes (``message.max.bytes``)."""
        return int(lookup(self.producer_config(), "message.max.bytes") or 0)

    @property
    def delivery_timeout_s(self) -> float:
        """How long the producer may take to acknowledge a record (``message.timeout.ms``)."""
        return int(lookup(self.producer_config(), "message.timeout.ms") or 0) / 1000

    def with_max_request_size(self, limit: int) -> KafkaSinkConfig:
        """These settings with ``message.max.bytes`` lowered to ``limit``."""
        return self.model_copy(update={"client": {**self.client, "message.max.bytes": limit}})


@dataclass
class KafkaSinkStats:
    """Counts of one sink since it started."""

    submitted: int = 0
    sent: int = 0
    """Records Kafka acknowledged (direct or from the spool)."""
    spooled: int = 0
    """Records written to the spool (a record may be spooled once per failed send)."""
    from_spool: int = 0
    """Spooled records Kafka acknowledged."""
    errors: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


def encode_frame(topic: str, key: bytes, value: bytes) -> bytes:
    """A spool payload: topic and key lengths, then topic, key and value."""
    t = topic.encode()
    return _FRAME.pack(len(t), len(key)) + t + key + value


def decode_frame(payload: bytes) -> tuple[str, bytes, bytes]:
    tlen, klen = _FRAME.unpack_from(payload)
    start = _FRAME.size
    if start + tlen + klen > len(payload):
        raise ValueError("spool payload shorter than its header says")
    topic = payload[start : start + tlen].decode()
    key = payload[start + tlen : start + tlen + klen]
    return topic, key, payload[start + tlen + klen :]


def any_reachable(bootstrap: str, timeout_s: float) -> bool:
    """Whether any of the HOST:PORT bootstrap servers accepts a TCP connection."""
    for part in bootstrap.split(","):
        host, _, port = part.strip().rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


class SendFuture(Protocol):
    """A send's outcome: its callbacks run in the producer's ``poll``."""

    def add_callback(self, fn: Callable[[Any], Any]) -> Any: ...
    def add_errback(self, fn: Callable[[Exception], Any]) -> Any: ...


class Producer(Protocol):
    """What the sink uses of :class:`mirror.kafka_confluent.ConfluentProducer` (tests hand in
    fakes). A producer with a ``poll(timeout)`` method has its delivery reports served by the
    sink's thread calling it at each round."""

    def send(self, topic: str, *, key: bytes | None, value: bytes) -> SendFuture: ...
    def partitions_for(self, topic: str) -> set[int] | None: ...
    def close(self, timeout: float | None = None) -> None: ...


def make_producer(config: KafkaSinkConfig) -> Producer:
    """The confluent-kafka producer as the sink wants it (raises when Kafka is unreachable)."""
    from mirror.kafka_confluent import make_confluent_producer

    return make_confluent_producer(config)


def fetch_topic_limit(config: KafkaSinkConfig) -> int | None:
    """The smallest ``max.message.bytes`` set on the sink's topics, or None when none is set
    (or Kafka cannot say): records above it are refused by the broker."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    from shadow_ab.kafka_security import librdkafka_security

    try:
        admin = AdminClient(
            {
                "bootstrap.servers": config.bootstrap,
                "client.id": f"{lookup(config.producer_config(), 'client.id')}-limits",
                **librdkafka_security(),
            }
        )
        topics = (config.topic_exchanges, config.topic_health)
        futures = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics],
            request_timeout=BOOTSTRAP_TIMEOUT_S,
        )
        limits = []
        for future in futures.values():
            entry = future.result(timeout=BOOTSTRAP_TIMEOUT_S).get("max.message.bytes")
            if entry is not None and entry.value is not None:
                limits.append(int(entry.value))
        return min(limits) if limits else None
    except Exception as exc:
        log.info("cannot read the topics' max.message.bytes: %s", exc)
        return None


def _no_limit(config: KafkaSinkConfig) -> int | None:
    return None


# What _send did with a record.
SENT, REFUSED, DROPPED = object(), object(), object()

# What the producer's callbacks report to the thread:
# (what, producer generation, spool generation, number, error)
_Outcome = tuple[str, int, int, int, BaseException | None]
STUCK_GRACE_S = 5.0
"""A send not resolved this long after message.timeout.ms is taken as lost by the producer."""
BOOTSTRAP_TIMEOUT_S = 2.0
"""How long the producer's start may wait for a broker to accept a connection and for the
topics' metadata (then Kafka is taken as away, and the records are spooled)."""


class KafkaSink:
    """Records to Kafka from a background thread, through an on-disk spool while Kafka is away.

    ``producer_factory`` builds the producer (default :func:`make_producer`); it is called on
    the sink's thread, again after a failure to build one or after a producer was abandoned,
    with ``message.max.bytes`` lowered to the topics' limit once the sink knows it.
    """

    label = SINK

    def __init__(
        self,
        config: KafkaSinkConfig,
        *,
        producer_factory: Callable[[KafkaSinkConfig], Producer] | None = None,
        topic_limit: Callable[[KafkaSinkConfig], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.05,
        spool_segment_bytes: int = SPOOL_SEGMENT_BYTES,
        spool_fsync: bool = SPOOL_FSYNC,
        queue_max: int = QUEUE_MAX,
        max_in_flight: int = MAX_IN_FLIGHT,
        retry_backoff_s: float = RETRY_BACKOFF_S,
        retry_backoff_max_s: float = RETRY_BACKOFF_MAX_S,
    ) -> None:
        self.config = config
        self.queue_max = queue_max
        self.max_in_flight = max_in_flight
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        real = producer_factory is None or producer_factory is make_producer
        self._factory = make_producer if producer_factory is None else producer_factory
        if topic_limit is None:
            topic_limit = fetch_topic_limit if real else _no_limit
        self._topic_limit = topic_limit
        self._max_request_size = config.max_request_size
        self._limit = self._max_request_size
        """Largest record sent: message.max.bytes, or the topics' max.message.bytes if lower."""
        self._delivery_timeout_s = config.delivery_timeout_s
        self._clock = clock
        self._poll_s = poll_s
        try:
            self.spool = Spool(
                config.spool_dir,
                max_bytes=config.spool_max_bytes,
                segment_bytes=spool_segment_bytes,
                fsync=spool_fsync,
                clock=clock,
            )
        except (SpoolError, OSError) as exc:
            raise KafkaSinkError(
                f"cannot use the spool folder {config.spool_dir}: {exc}; set kafka.spool_dir"
                " to a writable folder"
            ) from exc

        self._records_metric = {
            k: RECORDS.labels(sink=SINK, kind=k) for k in ("exchange", "health")
        }
        self._cond = threading.Condition()
        self._queue: deque[tuple[Record, int]] = deque()  # (record, approx_bytes)
        self._queue_bytes = 0
        self._outcomes: deque[_Outcome] = deque()
        self._closing = False
        self._deadline = 0.0
        self._stats = KafkaSinkStats()
        # Records accepted and not yet acknowledged, spooled or counted: what a SIGKILL loses,
        # counted by the next process on this spool folder (storage/bounds.py).
        self._ledger = open_ledger(config.spool_dir / LEDGER_FILE)
        if self._ledger is not None:
            killed = self._ledger.take_unsettled()
            if killed:
                log.warning(
                    "the previous mirror process on %s ended with %d records accepted and not"
                    " sent or spooled (killed?): counted as dropped (killed)",
                    config.spool_dir,
                    killed,
                )
                self._drop(KILLED, killed)
        self._dropped_logged: Counter[str] = Counter()
        self._drops_logged_at = clock()
        # Owned by the thread (read elsewhere only as hints):
        self._producer: Producer | None = None
        self._kafka_ok = True
        self._retry_at = 0.0
        self._backoff = retry_backoff_s
        self._pgen = 0  # producer generation: bumped when a producer is abandoned
        self._gen = 0  # spool generation: bumped by every rewind
        # Sends of the current producer not yet resolved: direct ones by number (with the frame,
        # to spool it if it fails) and spooled ones by entry id; each with the time it was sent.
        self._direct_frames: dict[int, tuple[bytes, float]] = {}
        self._spool_sent: dict[int, float] = {}
        self._direct_seq = 0
        self._closed_ok = False
        self._crashed = False
        self._thread = threading.Thread(target=self._run, name="shadow-ab-kafka-sink", daemon=True)
        self._thread.start()

    # -- request path -------------------------------------------------------------------------

    def submit(self, record: Record) -> bool:
        """Queue ``record`` for Kafka; False (and counted) when it had to be dropped."""
        with self._cond:
            if self._closing:
                self._drop(CLOSED)
                return False
            size = approx_bytes(record)
            if (
                len(self._queue) >= self.queue_max
                or self._queue_bytes + size > self.config.queue_max_bytes
            ):
                self._drop(QUEUE_FULL)
                return False
            self._queue.append((record, size))
            self._queue_bytes += size
            if len(self._queue) == ROUND_RECORDS:  # a burst: no need to wait for the round
                self._cond.notify_all()
            if self._ledger is not None:
                self._ledger.accept()
            self._stats.submitted += 1
        self._records_metric[record.kind].inc()
        return True

    # -- control ------------------------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far was acknowledged by Kafka; False when records
        are still queued, in flight or spooled after ``timeout`` seconds -- or at once when
        Kafka is away and every record is safe in the spool (waiting would not help)."""
        end = time.monotonic() + timeout
        while True:
            if self._idle():
                return True
            if time.monotonic() >= end or not self._thread.is_alive():
                return False
            if not self._kafka_ok and self._all_spooled():
                return False
            with self._cond:
                self._cond.wait(self._poll_s)

    def close(self, timeout: float = 30.0) -> bool:
        """Stop accepting records, send what is queued (to Kafka or the spool), wait up to
        ``timeout`` seconds for Kafka's acknowledgements and close the spool. True when every
        accepted record is acknowledged, or safely in the spool while Kafka is away; False
        when one was dropped or records are left in the spool although Kafka answers."""
        with self._cond:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + timeout
            self._cond.notify_all()
        self._thread.join(timeout + 10.0)
        return not self._thread.is_alive() and self._closed_ok

    def stats(self) -> KafkaSinkStats:
        with self._cond:
            s = self._stats
            return KafkaSinkStats(
                submitted=s.submitted,
                sent=s.sent,
                spooled=s.spooled,
                from_spool=s.from_spool,
                errors=s.errors,
                dropped=Counter(s.dropped),
            )

    def __enter__(self) -> KafkaSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers shared with the thread -------------------------------------------------------

    def _idle(self) -> bool:
        with self._cond:
            busy = self._queue or self._outcomes or self._direct_frames or self._spool_sent
        return not busy and len(self.spool) == 0

    def _all_spooled(self) -> bool:
        with self._cond:
            return not (self._queue or self._outcomes or self._direct_frames)

    def _drop(self, reason: str, n: int = 1) -> None:
        """Count dropped records (caller holds the lock)."""
        self._stats.dropped[reason] += n
        RECORDS_DROPPED.labels(reason=reason).inc(n)

    def _count_drop(self, reason: str, n: int = 1) -> None:
        with self._cond:
            self._drop(reason, n)

    def _error(self, kind: str) -> None:
        with self._cond:
            self._stats.errors += 1
        SINK_ERRORS.labels(sink=SINK, error=kind).inc()

    def _report(self, outcome: _Outcome) -> None:
        """Called by the producer's I/O thread: hand the outcome to the sink's thread."""
        with self._cond:
            self._outcomes.append(outcome)  # handled at the thread's next round (poll_s)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        try:
            self._ensure_producer()
            while True:
                with self._cond:
                    if not (self._queue or self._outcomes or self._closing):
                        self._cond.wait(self._poll_s)
                self._poll_producer()
                with self._cond:
                    taken = [
                        self._queue.popleft() for _ in range(min(len(self._queue), ROUND_RECORDS))
                    ]
                    self._queue_bytes -= sum(size for _rec, size in taken)
                    records = [rec for rec, _size in taken]
                    outcomes = list(self._outcomes)
                    self._outcomes.clear()
                    closing = self._closing and not self._queue
                try:
                    self._step(outcomes, records)
                    failures = 0
                except Exception:
                    # Survive what one round trips over (the spool's disk, a bug): the thread
                    # is the only way out for records; it gives up only if it keeps failing.
                    failures += 1
                    self._error("thread_error")
                    if failures >= MAX_STEP_FAILURES:
                        raise
                    log.exception("the Kafka sink's thread hit an error (%d in a row)", failures)
                    time.sleep(min(1.0, self._poll_s * failures))
                if closing:
                    self._finish()
                    return
        except Exception:
            log.exception("the Kafka sink's thread failed; records are no longer sent")
            self._crashed = True
            self._finish_after_crash()

    def _step(self, outcomes: list[_Outcome], records: list[Record]) -> None:
        self._handle(outcomes)
        for rec in records:
            try:
                self._route(rec)
            except Exception:
                log.exception("the Kafka sink could not route a record; dropping it")
                self._count_drop(SINK_ERROR)
                self._settle()
        self._check_stuck()
        self._drain()
        self._log_drops()

    def _poll_producer(self) -> None:
        """Serve the producer's delivery reports, if it is one that needs it (confluent)."""
        poll = getattr(self._producer, "poll", None)
        if poll is not None:
            try:
                poll(0)
            except Exception:  # a delivery report's bug: the round goes on
                self._error("poll_error")
                log.exception("serving the Kafka producer's delivery reports failed")

    def alive(self) -> bool:
        """False when the sink's thread died (records would pile up unsent): liveness."""
        return not self._crashed and (self._thread.is_alive() or self._closing)

    def _ensure_producer(self) -> bool:
        if self._producer is not None:
            return True
        config = self.config
        if self._limit < self._max_request_size:  # batches must fit the topics' limit too
            config = config.with_max_request_size(self._limit)
        try:
            self._producer = self._factory(config)
        except Exception as exc:
            self._error("connect_failed")
            self._mark_down(f"cannot connect to Kafka at {self.config.bootstrap}: {exc}")
            return False
        self._learn_limit()
        return True

    def _learn_limit(self) -> bool:
        """Lower the size limit to the topics' max.message.bytes; True when it went down."""
        learned = self._topic_limit(self.config)
        if learned is None or learned >= self._limit:
            return False
        log.warning(
            "Kafka topics take records up to %d bytes (max.message.bytes), below"
            " the producer's message.max.bytes %d: larger records are dropped (too_large)",
            learned,
            self._max_request_size,
        )
        self._limit = learned
        return True

    def _mark_down(self, why: str, *, probe: bool = True) -> None:
        """Kafka is away: records go to the spool; try again after the backoff."""
        now = self._clock()
        if self._kafka_ok:
            log.warning("Kafka unreachable, spooling records to %s: %s", self.spool.directory, why)
            self._kafka_ok = False
            self._backoff = self.retry_backoff_s
            self._retry_at = now + self._backoff
        elif probe:
            self._backoff = min(self._backoff * 2, self.retry_backoff_max_s)
            self._retry_at = now + self._backoff

    def _mark_up(self) -> None:
        if not self._kafka_ok:
            log.warning("Kafka is back: sending %d spooled records", len(self.spool))
            self._kafka_ok = True
            self._backoff = self.retry_backoff_s

    def _encode(self, rec: Record) -> bytes | None:
        try:
            if isinstance(rec, ExchangeRecord):
                topic, key = self.config.topic_exchanges, str(rec.pair_id).encode()
            elif isinstance(rec, HealthSample):
                topic, key = self.config.topic_health, rec.engine.encode()
            else:
                raise TypeError(f"not a record: {type(rec).__name__}")
            return encode_frame(topic, key, rec.to_json())
        except Exception as exc:
            log.error("cannot encode a record, dropping it: %s", exc)
            self._count_drop(ENCODE_ERROR)
            self._settle()
            return None

    def _route(self, rec: Record) -> None:
        frame = self._encode(rec)
        if frame is None:
            return
        if self._oversized(frame):
            self._settle()
            return
        direct = (
            self._kafka_ok
            and self._producer is not None
            and len(self._direct_frames) < self.max_in_flight
            and len(self.spool) == 0
        )
        if direct:
            self._direct_seq += 1
            sent = self._send(frame, "direct", 0, self._direct_seq)
            if sent is SENT:
                self._direct_frames[self._direct_seq] = (frame, self._clock())
                return
            if sent is DROPPED:
                self._settle()
                return
        self._to_spool(frame)

    def _oversized(self, frame: bytes) -> bool:
        """Drop (counted, ``too_large``) a frame Kafka would refuse for its size: it must fail
        alone, never hold the spool's head or be taken for an outage."""
        topic, key, value = decode_frame(frame)
        size = len(key) + len(value) + RECORD_OVERHEAD_BYTES
        if size <= self._limit:
            return False
        self._drop_too_large(topic, key, f"{size} bytes, above the limit of {self._limit}")
        return True

    def _drop_too_large(self, topic: str, key: bytes, why: str) -> None:
        log.error(
            "dropping a record too large for Kafka (topic %s, key %s): %s; to keep such records"
            " raise the topics' max.message.bytes and kafka.client's message.max.bytes together",
            topic,
            key.decode(errors="replace"),
            why,
        )
        self._count_drop(TOO_LARGE)

    def _settle(self, n: int = 1) -> None:
        """An accepted record is acknowledged, spooled or counted: no longer at risk."""
        if self._ledger is not None:
            self._ledger.settle(n)

    def _to_spool(self, frame: bytes) -> None:
        """Spool a frame not yet settled (spooled, or dropped and counted: settled either way)."""
        self._settle()
        if self.spool.append(frame):
            with self._cond:
                self._stats.spooled += 1
        else:
            self._count_drop(SPOOL_FULL)

    def _send(self, frame: bytes, origin: str, gen: int, entry_id: int) -> object:
        """Hand one frame to the producer: SENT; REFUSED when the producer refused it
        synchronously (Kafka is taken as away); DROPPED when the record alone is too large
        (counted; a spooled one is acked so the spool moves on)."""
        topic, key, value = decode_frame(frame)
        try:
            if self._producer is None:  # the callers made one: lost meanwhile, a refused send
                raise ConnectionError("no Kafka producer")
            future = self._producer.send(topic, key=key, value=value)
        except Exception as exc:
            self._error(type(exc).__name__)
            if type(exc).__name__ in _TOO_LARGE_ERRORS:
                self._drop_too_large(topic, key, str(exc))
                if origin == "spool":
                    self.spool.ack(entry_id)
                return DROPPED
            self._mark_down(f"send failed: {exc}", probe=origin == "spool")
            if getattr(self._producer, "fatal", None):  # unusable for good: build a new one
                self._abandon_producer()
            return REFUSED
        if origin == "spool":
            self._spool_sent[entry_id] = self._clock()
        pgen = self._pgen
        future.add_callback(lambda _md: self._report((origin + "_ok", pgen, gen, entry_id, None)))
        future.add_errback(lambda exc: self._report((origin + "_fail", pgen, gen, entry_id, exc)))
        return SENT

    def _handle(self, outcomes: list[_Outcome]) -> None:
        for what, pgen, gen, entry_id, exc in outcomes:
            if pgen != self._pgen:
                continue  # from an abandoned producer: its sends were spooled again
            if what.endswith("_ok"):
                with self._cond:
                    self._stats.sent += 1
                    if what == "spool_ok":
                        self._stats.from_spool += 1
            if what == "direct_ok":
                if self._direct_frames.pop(entry_id, None) is not None:
                    self._settle()
                self._mark_up()
            elif what.endswith("_fail") and type(exc).__name__ in _TOO_LARGE_ERRORS:
                self._error(type(exc).__name__)
                self._settle_too_large(what, gen, entry_id, exc)
            elif what == "direct_fail":
                self._error(type(exc).__name__)
                self._mark_down(f"delivery failed: {exc}", probe=False)
                failed = self._direct_frames.pop(entry_id, None)
                if failed is not None:
                    self._to_spool(failed[0])
            elif what == "spool_ok":
                self._spool_sent.pop(entry_id, None)
                self._mark_up()
                if gen == self._gen:
                    self.spool.ack(entry_id)
            elif what == "spool_fail":
                self._spool_sent.pop(entry_id, None)
                if gen == self._gen:
                    self._error(type(exc).__name__)
                    self._mark_down(f"delivery from the spool failed: {exc}")
                    self._rewind()

    def _settle_too_large(
        self, what: str, gen: int, entry_id: int, exc: BaseException | None
    ) -> None:
        """The broker refused a record for its size: a topic's max.message.bytes is below
        the limit the sink knew. The idempotent producer fails every send it holds after such
        an error, so it is replaced (its sends spooled again, in order). With the topics' new
        limit read again, the oversized records are then dropped alone before they are sent;
        when Kafka will not say its limit, the refused record is dropped (counted)."""
        failed = self._direct_frames.pop(entry_id, None) if what == "direct_fail" else None
        if what == "spool_fail":
            self._spool_sent.pop(entry_id, None)
        learned = self._learn_limit()
        if not learned:
            if failed is not None:
                topic, key, _value = decode_frame(failed[0])
                self._drop_too_large(topic, key, f"the broker refused it: {exc}")
                self._settle()
            elif gen == self._gen:
                self.spool.ack(entry_id)
                self._drop_too_large("(from the spool)", b"", f"the broker refused it: {exc}")
        elif failed is not None:
            self._to_spool(failed[0])  # sent again, or dropped, once the new limit applies
        self._abandon_producer()

    def _check_stuck(self) -> None:
        """A send the producer never resolves (seen with kafka-python, before, when a restarted
        broker left partitions without a leader) would hold the sink up for ever: past the delivery
        timeout, abandon the producer, spool its direct sends again and build a new one."""
        limit = self._delivery_timeout_s + STUCK_GRACE_S
        now = self._clock()
        first_direct = next(iter(self._direct_frames.values()), None)
        first_spool = next(iter(self._spool_sent.values()), None)
        oldest = [
            t for t in (first_direct[1] if first_direct else None, first_spool) if t is not None
        ]
        if not oldest or now - min(oldest) < limit or self._producer is None:
            return
        log.warning(
            "Kafka producer left %d sends unresolved past the delivery timeout; replacing it",
            len(self._direct_frames) + len(self._spool_sent),
        )
        self._error("stuck_producer")
        self._abandon_producer()
        self._mark_down("sends unresolved past the delivery timeout")

    def _abandon_producer(self) -> None:
        producer, self._producer = self._producer, None
        self._pgen += 1
        frames = [f for f, _t in self._direct_frames.values()]
        self._direct_frames.clear()
        self._spool_sent.clear()
        self._rewind()
        for frame in frames:
            self._to_spool(frame)
        if producer is not None:  # closing may block: not on this thread
            threading.Thread(
                target=_close_producer, args=(producer, 0.0), name="kafka-close", daemon=True
            ).start()

    def _rewind(self) -> None:
        self.spool.rewind()
        self._gen += 1

    def _drain(self) -> None:
        if self.spool.unread() == 0:
            return
        if not self._kafka_ok:
            if self._clock() < self._retry_at or self._spool_sent:
                return
            if not self._ensure_producer():
                return
            limit = 1  # a probe: is Kafka back?
        else:
            if not self._ensure_producer():
                return
            limit = min(1000, self.max_in_flight - len(self._spool_sent))
        if limit <= 0:
            return
        for entry in self.spool.read(limit):
            try:
                decode_frame(entry.payload)
            except (ValueError, struct.error, UnicodeDecodeError):
                log.error("a spooled record is malformed; dropping it")
                self._count_drop(SPOOL_CORRUPT)
                self.spool.ack(entry.id)
                continue
            if self._oversized(entry.payload):  # spooled before the limit was lowered
                self.spool.ack(entry.id)
                continue
            if self._send(entry.payload, "spool", self._gen, entry.id) is REFUSED:
                self._rewind()
                return

    def _log_drops(self) -> None:
        now = self._clock()
        if now - self._drops_logged_at < DROP_LOG_INTERVAL_S:
            return
        self._drops_logged_at = now
        with self._cond:
            new = self._stats.dropped - self._dropped_logged
            self._dropped_logged = Counter(self._stats.dropped)
        if new:
            detail = ", ".join(f"{n} {reason}" for reason, n in sorted(new.items()))
            log.warning(
                "Kafka sink dropped records in the last %.0fs: %s", DROP_LOG_INTERVAL_S, detail
            )

    # -- shutting down ------------------------------------------------------------------------

    def _finish(self) -> None:
        """Everything queued is routed: while Kafka answers, wait for its acknowledgements and
        drain the spool, until the deadline; then close the producer and the spool."""
        while time.monotonic() < self._deadline:
            self._poll_producer()
            with self._cond:
                outcomes = list(self._outcomes)
                self._outcomes.clear()
            self._handle(outcomes)
            self._check_stuck()
            if not outcomes and (
                not self._kafka_ok
                or (not self._direct_frames and not self._spool_sent and len(self.spool) == 0)
            ):
                break
            self._drain()
            with self._cond:
                if not self._outcomes:
                    self._cond.wait(self._poll_s)
        # Direct sends still unacknowledged go to the spool: they may reach Kafka as well (at
        # least once), but are never lost.
        unacked = [f for f, _t in self._direct_frames.values()]
        self._direct_frames.clear()
        self._spool_sent.clear()
        for frame in unacked:
            self._to_spool(frame)
        if unacked:
            log.warning("Kafka sink closing: %d unacknowledged records spooled", len(unacked))
        if self._producer is not None:
            _close_producer(self._producer, max(0.0, self._deadline - time.monotonic()))
            self._producer = None
        with self._cond:
            lost = sum(
                self._stats.dropped[r]
                for r in (SPOOL_FULL, ENCODE_ERROR, SPOOL_CORRUPT, TOO_LARGE, SINK_ERROR)
            )
        self._log_drops_now()
        self.spool.close()
        if self._ledger is not None:
            self._ledger.close()
        left = len(self.spool)
        # Records left in the spool while Kafka answers are stuck, not merely waiting for it.
        self._closed_ok = lost == 0 and (left == 0 or not self._kafka_ok)
        if left:
            log.warning(
                "Kafka sink closed with %d records in the spool %s; the next mirror process on"
                " that folder sends them",
                left,
                self.spool.directory,
            )

    def _log_drops_now(self) -> None:
        self._drops_logged_at = -DROP_LOG_INTERVAL_S * 2
        self._log_drops()

    def _finish_after_crash(self) -> None:
        with self._cond:
            self._closing = True
            left = [rec for rec, _size in self._queue]
            self._queue.clear()
            self._queue_bytes = 0
        frames = [f for f, _t in self._direct_frames.values()]
        self._direct_frames.clear()
        frames += [f for f in map(self._encode, left) if f is not None]
        for frame in frames:
            self._to_spool(frame)
        self.spool.close()
        if self._ledger is not None:
            self._ledger.close()


def _close_producer(producer: Producer, timeout: float) -> None:
    """Close a producer within ``timeout`` even when sends are pending (their records were
    spooled by the caller; :meth:`mirror.kafka_confluent.ConfluentProducer.close` purges them)."""
    try:
        producer.close(timeout=min(timeout, 5.0))
    except Exception as exc:
        log.info("closing the Kafka producer failed: %s", exc)
