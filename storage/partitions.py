"""Daily RANGE partitions of ``exchanges`` and ``health_samples`` on PostgreSQL, and retention.

Each partitioned table has one partition per UTC day, named ``<table>_pYYYYMMDD`` and holding
``[day 00:00 UTC, next day 00:00 UTC)``. There is no DEFAULT partition: a row for a day without a
partition would be rejected, so :func:`ensure_partitions` creates them ahead of time and the
writers create the partition of every day they see (:class:`PartitionCache` remembers which
exist, so that costs one query per new day, not per batch).

Retention drops whole partitions (instant, no vacuum); on SQLite, where nothing is partitioned,
it deletes rows. Both keep the day ``today - keep_days`` and everything after it.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Connection, Engine, delete, func, select, text

from shadow_ab.records import RECORD_TIME_MAX, RECORD_TIME_MIN
from shadow_ab.timestamps import as_utc
from storage.db import is_postgres
from storage.errors import StoreError, translate
from storage.models import DROPS, EXCHANGES, HEALTH_SAMPLES, PARTITIONED_TABLES

_NAME = re.compile(r"^(?P<table>[a-z_]+)_p(?P<day>\d{8})$")
# One advisory lock key for every DDL on partitions, so concurrent writers (direct sink,
# several ingesters) creating the same day's partition wait for each other instead of failing.
_LOCK_KEY = 0x5AB_0001


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def parse_partition_name(name: str) -> tuple[str, date] | None:
    """(table, day) for a partition name of ours, else None."""
    match = _NAME.match(name)
    if match is None or match["table"] not in PARTITIONED_TABLES:
        return None
    return match["table"], datetime.strptime(match["day"], "%Y%m%d").date()


def day_of(ts: datetime) -> date:
    """The UTC day a timestamp belongs to (naive timestamps are taken as UTC)."""
    return as_utc(ts).date()


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def next_day(day: date) -> date:
    """The day after ``day``; :class:`StoreError` for a day outside the range the store keeps
    (the records' own validation refuses those first: this guards any other way in)."""
    if not RECORD_TIME_MIN.date() <= day < RECORD_TIME_MAX.date():
        raise StoreError(
            f"no partition can hold the day {day.isoformat()}: the store keeps"
            f" {RECORD_TIME_MIN:%Y-%m-%d} to {RECORD_TIME_MAX:%Y-%m-%d} (exclusive)"
        )
    return day + timedelta(days=1)


def _create_sql(table: str, day: date) -> str:
    lo = day_start(day).strftime("%Y-%m-%d %H:%M:%S+00")
    hi = day_start(next_day(day)).strftime("%Y-%m-%d %H:%M:%S+00")
    return (
        f"CREATE TABLE IF NOT EXISTS {partition_name(table, day)} PARTITION OF {table}"
        f" FOR VALUES FROM ('{lo}') TO ('{hi}')"
    )


def existing_partitions(conn: Connection) -> dict[str, set[date]]:
    """The days that have a partition, per partitioned table (PostgreSQL only)."""
    rows = conn.execute(
        text(
            "SELECT parent.relname AS parent, child.relname AS child"
            " FROM pg_inherits"
            " JOIN pg_class parent ON parent.oid = pg_inherits.inhparent"
            " JOIN pg_class child ON child.oid = pg_inherits.inhrelid"
            " JOIN pg_namespace ns ON ns.oid = child.relnamespace"
            " WHERE ns.nspname = current_schema() AND parent.relname = ANY(:tables)"
        ),
        {"tables": list(PARTITIONED_TABLES)},
    )
    found: dict[str, set[date]] = {t: set() for t in PARTITIONED_TABLES}
    for parent, child in rows:
        parsed = parse_partition_name(child)
        if parsed is not None and parsed[0] == parent:
            found[parent].add(parsed[1])
    return found


def create_partitions(engine: Engine, wanted: dict[str, Iterable[date]]) -> list[str]:
    """Create the partitions in ``wanted`` that do not exist yet; return the names created.

    One short transaction of its own, serialized with other writers by an advisory lock.
    """
    created: list[str] = []
    with translate(), engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
        have = existing_partitions(conn)
        for table, days in wanted.items():
            for day in sorted(set(days) - have[table]):
                conn.execute(text(_create_sql(table, day)))
                created.append(partition_name(table, day))
    return created


def ensure_partitions(
    engine: Engine, start: date | datetime | None = None, days_ahead: int = 7
) -> list[str]:
    """Make sure both partitioned tables have a partition for ``start`` and the next
    ``days_ahead`` days (``start`` defaults to today, UTC). Idempotent; returns the names it
    created. A no-op on SQLite."""
    if days_ahead < 0:
        raise ValueError(f"days_ahead must be >= 0, got {days_ahead}")
    if not is_postgres(engine):
        return []
    if start is None:
        first = datetime.now(UTC).date()
    elif isinstance(start, datetime):
        first = day_of(start)
    else:
        first = start
    days = [first + timedelta(days=i) for i in range(days_ahead + 1)]
    created = create_partitions(engine, {table: days for table in PARTITIONED_TABLES})
    _caches.pop(engine, None)  # let the writers re-read what exists
    return created


@dataclass
class PartitionCache:
    """The days known to have a partition, per table, for one engine. Thread-safe."""

    known: dict[str, set[date]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure(self, engine: Engine, table: str, days: Iterable[date]) -> None:
        days = set(days)
        if days:
            # Also the day after the newest: creating a partition locks the parent table
            # exclusively, better done before midnight than while traffic waits for it.
            days.add(next_day(max(days)))
        missing = days - self.known.get(table, set())
        if not missing:
            return
        with self.lock:
            missing = days - self.known.get(table, set())
            if not missing:
                return
            create_partitions(engine, {table: missing})
            self.known.setdefault(table, set()).update(missing)

    def forget(self) -> None:
        with self.lock:
            self.known.clear()


_caches: weakref.WeakKeyDictionary[Engine, PartitionCache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def cache_for(engine: Engine) -> PartitionCache:
    with _caches_lock:
        cache = _caches.get(engine)
        if cache is None:
            cache = _caches[engine] = PartitionCache()
        return cache


@dataclass(frozen=True)
class RetentionPlan:
    """What retention removes: partitions to drop (PostgreSQL) or rows to delete (SQLite)."""

    cutoff: datetime
    """Everything strictly before this instant (a UTC midnight) goes."""
    partitions: list[str]
    rows: dict[str, int]
    """Rows older than the cutoff, per table (on PostgreSQL: in the partitions to drop)."""


def retention_cutoff(keep_days: int, now: datetime | None = None) -> datetime:
    if keep_days < 0:
        raise ValueError(f"--keep-days must be >= 0, got {keep_days}")
    today = day_of(now or datetime.now(UTC))
    return day_start(today - timedelta(days=keep_days))


def apply_retention(
    engine: Engine, keep_days: int, *, dry_run: bool = False, now: datetime | None = None
) -> RetentionPlan:
    """Remove exchanges and health samples (and drop counts) from before
    ``today - keep_days`` (UTC midnight). PostgreSQL drops whole daily partitions; SQLite
    deletes rows. ``dry_run`` computes the plan and changes nothing."""
    cutoff = retention_cutoff(keep_days, now)
    with translate():
        if is_postgres(engine):
            plan = _retention_postgres(engine, cutoff, dry_run)
        else:
            plan = _retention_rows(engine, cutoff, dry_run)
    return plan


def _retention_postgres(engine: Engine, cutoff: datetime, dry_run: bool) -> RetentionPlan:
    cutoff_day = cutoff.date()
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
        have = existing_partitions(conn)
        doomed = [
            (table, partition_name(table, day))
            for table in PARTITIONED_TABLES
            for day in sorted(have[table])
            if day < cutoff_day
        ]
        rows: dict[str, int] = {table: 0 for table in PARTITIONED_TABLES}
        for table, name in doomed:
            rows[table] += conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one()
        old_drops = DROPS.c.ts < cutoff
        rows["drops"] = conn.execute(
            select(func.count()).select_from(DROPS).where(old_drops)
        ).scalar_one()
        if not dry_run:
            for _table, name in doomed:
                conn.execute(text(f"DROP TABLE {name}"))
            conn.execute(delete(DROPS).where(old_drops))
    if not dry_run:
        _caches.pop(engine, None)
    return RetentionPlan(cutoff=cutoff, partitions=[name for _t, name in doomed], rows=rows)


def _retention_rows(engine: Engine, cutoff: datetime, dry_run: bool) -> RetentionPlan:
    # Through the models' column types, so the cutoff is rendered the way SQLite stores
    # timestamps (naive UTC text).
    rows: dict[str, int] = {}
    with engine.begin() as conn:
        for table, column in ((EXCHANGES, "sent_at"), (HEALTH_SAMPLES, "ts"), (DROPS, "ts")):
            name = table.name
            where = table.c[column] < cutoff
            count = conn.execute(select(func.count()).select_from(table).where(where)).scalar_one()
            rows[name] = int(count)
            if not dry_run and count:
                conn.execute(delete(table).where(where))
    return RetentionPlan(cutoff=cutoff, partitions=[], rows=rows)
