"""The store's tables as SQLAlchemy 2.0 typed models on one :class:`Base`.

The same models serve PostgreSQL (where ``exchanges`` and ``health_samples`` are partitioned by
RANGE per UTC day, see :mod:`storage.partitions`) and SQLite (plain tables). The schema itself
is created by the Alembic migrations in ``alembic/versions``; a test checks that these models
and the migrated schema agree. The README's section "The store" documents every column for
SQL users.

The natural keys double as the idempotency keys of the bulk writers:

- ``exchanges``: (pair_id, role, sent_at) -- a replayed record has the same sent_at, and the
  partition key must be part of every unique key on PostgreSQL;
- ``health_samples``: (engine, ts);
- ``incidents``: (deployment, engine, kind, started_at).
"""

from __future__ import annotations

import functools
import uuid
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Date,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    FromClause,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shadow_ab.timestamps import as_utc, aware_utc

# JSONB on PostgreSQL (indexable, compact), JSON text on SQLite; Python None is SQL NULL.
JsonDoc = JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
# json on PostgreSQL (the text, checked to be JSON: no binary tree to build on insert; ->, ->>
# and #>> work, @> and GIN indexes need a cast to jsonb), JSON text on SQLite: the large
# documents read whole or by a few keys (exchanges.request, exchanges.logprobs; migration 0007).
JsonText = JSON(none_as_null=True).with_variant(postgresql.JSON(none_as_null=True), "postgresql")
# float8[] on PostgreSQL (8 bytes a value, no text parsing on insert), a JSON array on SQLite.
FloatList = JSON(none_as_null=True).with_variant(
    postgresql.ARRAY(postgresql.DOUBLE_PRECISION()), "postgresql"
)
# 64-bit ids on PostgreSQL; SQLite only autoincrements a column typed exactly INTEGER.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """The store's timestamps: ``timestamptz`` on PostgreSQL, text on SQLite (which keeps no
    zone). Aware UTC datetimes come out of both (SQLite's text is UTC: this type wrote it);
    a datetime going in must carry a zone and is written in UTC (``ValueError`` otherwise).

    Only SQL that knows the column's type converts: Core and ORM statements over these models'
    tables (:data:`EXCHANGES`, ...), and ``text()`` given its types (``bindparams``,
    ``columns``)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return (
            aware_utc(value, "a timestamp sent to the store")
            if isinstance(value, datetime)
            else value
        )

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return _naive_as_utc(value) if value.tzinfo is None else as_utc(value)


@functools.lru_cache(maxsize=4096)
def _naive_as_utc(value: datetime) -> datetime:
    # SQLite's values repeat (a month of hourly rollups is ~100 k rows over 720 hours), and
    # datetime.replace costs microseconds: each distinct one is converted once.
    return as_utc(value)


Timestamp = UTCDateTime()

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Deployment(Base):
    """One named shadow experiment. Writers create a bare row (name only) on first sight."""

    __tablename__ = "deployments"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    incumbent_engine: Mapped[str | None] = mapped_column(Text)
    incumbent_version: Mapped[str | None] = mapped_column(Text)
    candidate_engine: Mapped[str | None] = mapped_column(Text)
    candidate_version: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str | None] = mapped_column(Text)
    hardware: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp)
    ended_at: Mapped[datetime | None] = mapped_column(Timestamp)
    policy: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    created_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )


class Exchange(Base):
    """One engine's answer within a pair: one row per :class:`shadow_ab.records.ExchangeRecord`."""

    __tablename__ = "exchanges"
    __table_args__ = (
        Index(None, "deployment", "sent_at"),
        Index(None, "deployment", "role", "sent_at"),
        # the mirror's probes (issue 12), few among client traffic: migration 0006
        Index(
            "ix_exchanges_synthetic_deployment_sent_at",
            "deployment",
            "sent_at",
            postgresql_where=text("synthetic IS NOT NULL"),
            sqlite_where=text("synthetic IS NOT NULL"),
        ),
        {"postgresql_partition_by": "RANGE (sent_at)"},
    )

    pair_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    role: Mapped[str] = mapped_column(String(16), primary_key=True)
    sent_at: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), nullable=False)
    """No foreign key (bulk insert speed): the writers create the deployments row."""
    schema_version: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    engine: Mapped[str] = mapped_column(String(200), nullable=False)
    endpoint: Mapped[str] = mapped_column(String(16), nullable=False)
    stream: Mapped[bool] = mapped_column(Boolean, nullable=False)
    model: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(32), nullable=False)
    http_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    tpot_s: Mapped[float | None] = mapped_column(Float)
    itl_s: Mapped[list[float]] = mapped_column(FloatList, nullable=False)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(Text)
    request: Mapped[dict[str, Any]] = mapped_column(JsonText, nullable=False)
    rewrites: Mapped[list[str]] = mapped_column(JsonDoc, nullable=False)
    output_text: Mapped[str | None] = mapped_column(Text)
    logprobs: Mapped[list[dict[str, Any]] | None] = mapped_column(JsonText)
    inflight_incumbent: Mapped[int | None] = mapped_column(Integer)
    inflight_candidate: Mapped[int | None] = mapped_column(Integer)
    guard: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
    ingested_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )
    synthetic: Mapped[str | None] = mapped_column(String(16))
    """``probe`` for the mirror's probes (never a client's request), else NULL."""
    probe_id: Mapped[str | None] = mapped_column(String(200))


class HealthSampleRow(Base):
    """One scrape of one engine: one row per :class:`shadow_ab.records.HealthSample`."""

    __tablename__ = "health_samples"
    __table_args__ = (
        Index(None, "deployment", "engine", "ts"),
        {"postgresql_partition_by": "RANGE (ts)"},
    )

    engine: Mapped[str] = mapped_column(String(200), primary_key=True)
    ts: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), nullable=False)
    """No foreign key (bulk insert speed): the writers create the deployments row."""
    schema_version: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    flavor: Mapped[str] = mapped_column(String(16), nullable=False)
    up: Mapped[bool] = mapped_column(Boolean, nullable=False)
    http_status: Mapped[int | None] = mapped_column(Integer)
    latency_s: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    version: Mapped[str | None] = mapped_column(Text)
    process_start_time: Mapped[float | None] = mapped_column(Float)
    num_running: Mapped[int | None] = mapped_column(Integer)
    num_waiting: Mapped[int | None] = mapped_column(Integer)
    kv_cache_usage: Mapped[float | None] = mapped_column(Float)
    gpu_mem_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cpu_mem_bytes: Mapped[int | None] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, float]] = mapped_column(JsonDoc, nullable=False)
    ingested_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )


class Incident(Base):
    """A crash/restart, leak, error burst or hang found in the data by the evaluator."""

    __tablename__ = "incidents"
    __table_args__ = (UniqueConstraint("deployment", "engine", "kind", "started_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    deployment: Mapped[str] = mapped_column(
        String(200), ForeignKey("deployments.name"), nullable=False
    )
    engine: Mapped[str] = mapped_column(String(200), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    started_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(Timestamp)
    evidence: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
    detected_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )


class Report(Base):
    """One evaluation report over a time window, with its verdict."""

    __tablename__ = "reports"
    __table_args__ = (Index(None, "deployment", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    deployment: Mapped[str] = mapped_column(
        String(200), ForeignKey("deployments.name"), nullable=False
    )
    created_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )
    window_from: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    window_to: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    verdict: Mapped[str] = mapped_column(String(16), nullable=False)
    body: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
    html: Mapped[str | None] = mapped_column(Text)


class Drop(Base):
    """Records a sink or the mirror had to drop, counted (docs/architecture.md, promise 4)."""

    __tablename__ = "drops"
    __table_args__ = (Index(None, "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    source: Mapped[str] = mapped_column(String(100), nullable=False)
    reason: Mapped[str] = mapped_column(String(200), nullable=False)
    count: Mapped[int] = mapped_column(BigInteger, nullable=False)


PARTITIONED_TABLES: dict[str, str] = {"exchanges": "sent_at", "health_samples": "ts"}
"""Tables partitioned by RANGE per UTC day on PostgreSQL, with their partition column."""


# --- Latency rollups (evaluator/rollups.py; migration 0003) -----------------------------------


class LatencyRollup(Base):
    """One hour of one role's values of one latency metric, as a mergeable log-bucketed sketch
    (:class:`evaluator.sketch.LogSketch`): value ``x > 0`` falls in bucket
    ``floor(ln(x) / ln(gamma))``; ``keys``/``counts`` are the non-empty buckets (sparse, same
    order); ``zero_count`` counts values <= 0. ``slice`` is ``all`` or a breakdown bucket
    (``load:2``, ``prompt:0``, ``output:3``, see :mod:`evaluator.rollups`)."""

    __tablename__ = "latency_rollups"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    role: Mapped[str] = mapped_column(String(16), primary_key=True)
    metric: Mapped[str] = mapped_column(String(16), primary_key=True)
    slice: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    zero_count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    sum: Mapped[float] = mapped_column(Float, nullable=False)
    min: Mapped[float | None] = mapped_column(Float)
    max: Mapped[float | None] = mapped_column(Float)
    keys: Mapped[list[int]] = mapped_column(JsonDoc, nullable=False)
    counts: Mapped[list[int]] = mapped_column(JsonDoc, nullable=False)


class LatencyRollupHour(Base):
    """Which hours of a deployment are rolled up; an hour not yet ``closed`` (still open, or
    closed less than the grace period ago) is recomputed on the next refresh."""

    __tablename__ = "latency_rollup_hours"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    n_pairs: Mapped[int] = mapped_column(BigInteger, nullable=False)
    """Incumbent exchanges sent in this hour (any status): the pairs the mirror saw."""
    n_sampled: Mapped[int] = mapped_column(Integer, nullable=False)
    closed: Mapped[bool] = mapped_column(Boolean, nullable=False)
    computed_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )


class LatencySample(Base):
    """A bounded random sample of the hour's pairs (incumbent and candidate side by side), in a
    random order ``rank`` so a report takes each hour's first k: the paired statistics
    (deltas, rank test, bootstrap intervals, goodput) read these, not the raw rows."""

    __tablename__ = "latency_samples"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_id: Mapped[uuid.UUID] = mapped_column(Uuid, nullable=False)
    sent_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    """The incumbent's sent_at."""
    inflight_incumbent: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    incumbent_status: Mapped[str] = mapped_column(String(32), nullable=False)
    candidate_status: Mapped[str] = mapped_column(String(32), nullable=False)
    incumbent_ttft_s: Mapped[float | None] = mapped_column(Float)
    candidate_ttft_s: Mapped[float | None] = mapped_column(Float)
    incumbent_tpot_s: Mapped[float | None] = mapped_column(Float)
    candidate_tpot_s: Mapped[float | None] = mapped_column(Float)
    incumbent_e2e_s: Mapped[float | None] = mapped_column(Float)
    candidate_e2e_s: Mapped[float | None] = mapped_column(Float)
    incumbent_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    candidate_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    incumbent_itl_mean_s: Mapped[float | None] = mapped_column(Float)
    candidate_itl_mean_s: Mapped[float | None] = mapped_column(Float)
    incumbent_completion_tokens: Mapped[int | None] = mapped_column(Integer)
    candidate_completion_tokens: Mapped[int | None] = mapped_column(Integer)


# --- Semantic similarity scores (evaluator/semantic.py; migration 0005) -----------------------


class SemanticScore(Base):
    """One triad's two cosine similarities to the incumbent's answer, as one embedding model
    scored them (answers cut to ``max_chars``): a review reads these for its sample and embeds
    only the triads not scored yet (:func:`evaluator.semantic.analyze_semantic`). Answers do
    not change once stored, so a score never goes stale; another model or cut is another row."""

    __tablename__ = "semantic_scores"
    __table_args__ = (Index(None, "deployment", "day"),)

    pair_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    """The embedder's ``name``."""
    max_chars: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), nullable=False)
    day: Mapped[date] = mapped_column(Date, nullable=False)
    """The UTC day of the replay (the day whose sample drew the triad)."""
    candidate: Mapped[float] = mapped_column(Float, nullable=False)
    """cos(candidate, incumbent)."""
    floor: Mapped[float] = mapped_column(Float, nullable=False)
    """cos(replay, incumbent)."""
    scored_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )


# Table handles for Core statements: the only ones (a table defined again elsewhere, or a
# lightweight ``table()``, would read timestamps without :class:`UTCDateTime`).
DEPLOYMENTS: Table = Base.metadata.tables["deployments"]
EXCHANGES: Table = Base.metadata.tables["exchanges"]
HEALTH_SAMPLES: Table = Base.metadata.tables["health_samples"]
INCIDENTS: Table = Base.metadata.tables["incidents"]
REPORTS: Table = Base.metadata.tables["reports"]
DROPS: Table = Base.metadata.tables["drops"]
LATENCY_ROLLUPS: Table = Base.metadata.tables["latency_rollups"]
LATENCY_ROLLUP_HOURS: Table = Base.metadata.tables["latency_rollup_hours"]
LATENCY_SAMPLES: Table = Base.metadata.tables["latency_samples"]


CLIENT_TRAFFIC_SQL = "synthetic IS NULL"
"""The rows of ``exchanges`` that are client traffic, in SQL text: the mirror's probes
(``synthetic`` set, mirror/probes.py) are not. Every reader of ``exchanges`` outside the
quality analysis filters with this or :func:`client_traffic`, never by hand."""


def client_traffic(table: FromClause = EXCHANGES) -> ColumnElement[bool]:
    """:data:`CLIENT_TRAFFIC_SQL` for a Core statement on ``exchanges`` (or an alias of it)."""
    return table.c.synthetic.is_(None)


# --- Exchange rollups (evaluator/exchange_rollups.py; migration 0004) ---------------


class ExchangeCount(Base):
    """Exchanges of one role sent in one UTC minute: how many, how many failed (``status`` in
    ``evaluator.incidents.model.FAILED_STATUSES``), the first and last ``sent_at``. Incident
    detection's sent counts, the data extent and the divergence day table read these instead of
    counting the raw rows."""

    __tablename__ = "exchange_counts"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    minute: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    role: Mapped[str] = mapped_column(String(16), primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger, nullable=False)
    n_failed: Mapped[int] = mapped_column(BigInteger, nullable=False)
    first_sent: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    last_sent: Mapped[datetime] = mapped_column(Timestamp, nullable=False)


class ExchangeNotable(Base):
    """An exchange incident detection may need: not ``ok``, or slow past the hour's floors
    (TTFT or one inter-token gap of at least ``stall_floor_s``, E2E of at least
    ``e2e_floor_s``), with the columns detection reads (``max_itl_s``: the longest gap)."""

    __tablename__ = "exchange_notables"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    sent_at: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    pair_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    role: Mapped[str] = mapped_column(String(16), primary_key=True)
    engine: Mapped[str] = mapped_column(String(200), nullable=False)
    status: Mapped[str] = mapped_column(String(32), nullable=False)
    http_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    max_itl_s: Mapped[float | None] = mapped_column(Float)


class ExchangeRollupHour(Base):
    """Which hours of a deployment have their exchange counts and notables rolled up, with the
    floors the notables were kept at; an hour not yet ``closed`` is recomputed by the next
    refresh and read raw until then."""

    __tablename__ = "exchange_rollup_hours"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    n_exchanges: Mapped[int] = mapped_column(BigInteger, nullable=False)
    n_notable: Mapped[int] = mapped_column(BigInteger, nullable=False)
    stall_floor_s: Mapped[float] = mapped_column(Float, nullable=False)
    e2e_floor_s: Mapped[float] = mapped_column(Float, nullable=False)
    closed: Mapped[bool] = mapped_column(Boolean, nullable=False)
    computed_at: Mapped[datetime] = mapped_column(
        Timestamp, nullable=False, server_default=func.now()
    )


class ExchangeParity(Base):
    """The candidate's exchanges of one hour by load bucket (``kind`` ``load``, ``key`` the
    bucket index of ``inflight_incumbent``: count and the sums of both in-flight counts) and by
    the guard's state (``kind`` ``guard``, ``key`` the state or ``none``: count): the load
    parity table (``evaluator.parity``) without a pass over the rows."""

    __tablename__ = "exchange_parity"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger, nullable=False)
    sum_incumbent: Mapped[float] = mapped_column(Float, nullable=False)
    sum_candidate: Mapped[float] = mapped_column(Float, nullable=False)


EXCHANGE_COUNTS: Table = Base.metadata.tables["exchange_counts"]
EXCHANGE_PARITY: Table = Base.metadata.tables["exchange_parity"]
EXCHANGE_NOTABLES: Table = Base.metadata.tables["exchange_notables"]
EXCHANGE_ROLLUP_HOURS: Table = Base.metadata.tables["exchange_rollup_hours"]
SEMANTIC_SCORES: Table = Base.metadata.tables["semantic_scores"]
