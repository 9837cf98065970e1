"""Daily partitions ahead of time, and retention (PostgreSQL partitions, SQLite rows)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from factories import T0, exchanges, health_series
from sqlalchemy import Engine, text

from storage.errors import StoreError
from storage.partitions import (
    apply_retention,
    ensure_partitions,
    existing_partitions,
    parse_partition_name,
    partition_name,
    retention_cutoff,
)
from storage.write import write_drops, write_exchanges, write_health

DAY = T0.date()


def _partitions(engine: Engine) -> dict[str, set[date]]:
    with engine.connect() as conn:
        return existing_partitions(conn)


def test_partition_names_round_trip() -> None:
    assert partition_name("exchanges", date(2026, 3, 4)) == "exchanges_p20260304"
    assert parse_partition_name("exchanges_p20260304") == ("exchanges", date(2026, 3, 4))
    assert parse_partition_name("health_samples_p20261231") == (
        "health_samples",
        date(2026, 12, 31),
    )
    assert parse_partition_name("exchanges") is None
    assert parse_partition_name("reports_p20260304") is None


def test_ensure_partitions_is_idempotent(pg_engine: Engine) -> None:
    created = ensure_partitions(pg_engine, T0, days_ahead=3)
    assert len(created) == 8
    assert ensure_partitions(pg_engine, T0, days_ahead=3) == []
    days = {DAY + timedelta(days=i) for i in range(4)}
    assert _partitions(pg_engine) == {"exchanges": days, "health_samples": days}
    # extending the window only adds the new days
    assert ensure_partitions(pg_engine, DAY, days_ahead=4) == [
        partition_name("exchanges", DAY + timedelta(days=4)),
        partition_name("health_samples", DAY + timedelta(days=4)),
    ]


def test_ensure_partitions_is_a_no_op_on_sqlite(sqlite_engine: Engine) -> None:
    assert ensure_partitions(sqlite_engine, T0, days_ahead=3) == []


def test_partition_bounds_are_utc_days(pg_engine: Engine) -> None:
    ensure_partitions(pg_engine, T0, days_ahead=0)
    with pg_engine.connect() as conn:
        conn.execute(text("SET TIME ZONE 'America/New_York'"))
        bound = conn.execute(
            text("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = :n"),
            {"n": partition_name("exchanges", DAY)},
        ).scalar_one()
    # shown in the session's zone: 2026-11-30 00:00 UTC is 19:00 the day before in New York
    assert bound == ("FOR VALUES FROM ('2026-11-29 19:00:00-05') TO ('2026-11-30 19:00:00-05')")


def test_retention_cutoff() -> None:
    assert retention_cutoff(0, T0).isoformat() == "2026-11-30T00:00:00+00:00"
    assert retention_cutoff(3, T0).isoformat() == "2026-11-27T00:00:00+00:00"


def _fill(engine: Engine) -> None:
    # one exchange pair and one health sample on each of the 10 days before T0, and on T0
    for back in range(11):
        start = T0 - timedelta(days=back)
        assert write_exchanges(engine, exchanges(2, start=start, seed=back)) == 2
        assert write_health(engine, health_series(1, start=start)) == 1
        write_drops(engine, "direct_sink", "queue_full", 1, start)


def test_retention_drops_exactly_the_old_partitions(pg_engine: Engine) -> None:
    ensure_partitions(pg_engine, T0, days_ahead=2)
    _fill(pg_engine)
    before = _partitions(pg_engine)
    assert len(before["exchanges"]) == 13

    plan = apply_retention(pg_engine, keep_days=3, dry_run=True, now=T0)
    old_days = [DAY - timedelta(days=back) for back in range(10, 3, -1)]  # 7 days
    expected = [partition_name("exchanges", d) for d in old_days] + [
        partition_name("health_samples", d) for d in old_days
    ]
    assert plan.partitions == expected
    assert plan.rows == {"exchanges": 14, "health_samples": 7, "drops": 7}
    assert _partitions(pg_engine) == before  # dry run changed nothing

    plan = apply_retention(pg_engine, keep_days=3, now=T0)
    assert plan.partitions == expected
    after = _partitions(pg_engine)
    kept = {DAY + timedelta(days=i) for i in range(-3, 3)}
    assert after == {"exchanges": kept, "health_samples": kept}
    with pg_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM exchanges")).scalar_one() == 8
        assert conn.execute(text("SELECT count(*) FROM health_samples")).scalar_one() == 4
        assert conn.execute(text("SELECT count(*) FROM drops")).scalar_one() == 4
    assert apply_retention(pg_engine, keep_days=3, now=T0).partitions == []
    # the writers recreate a dropped day if a late record for it arrives
    assert write_exchanges(pg_engine, exchanges(2, start=T0 - timedelta(days=9), seed=99)) == 2


def test_retention_deletes_old_rows_on_sqlite(sqlite_engine: Engine) -> None:
    _fill(sqlite_engine)
    plan = apply_retention(sqlite_engine, keep_days=3, dry_run=True, now=T0)
    assert plan.partitions == []
    assert plan.rows == {"exchanges": 14, "health_samples": 7, "drops": 7}
    with sqlite_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM exchanges")).scalar_one() == 22

    plan = apply_retention(sqlite_engine, keep_days=3, now=T0)
    assert plan.rows == {"exchanges": 14, "health_samples": 7, "drops": 7}
    with sqlite_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM exchanges")).scalar_one() == 8
        assert conn.execute(text("SELECT count(*) FROM health_samples")).scalar_one() == 4
        oldest = conn.execute(text("SELECT min(sent_at) FROM exchanges")).scalar_one()
    assert oldest.startswith("2026-11-27 12:00:00")


def test_a_day_the_store_cannot_hold_is_a_store_error_not_an_overflow(pg_engine: Engine) -> None:
    """A record that got past validation (built without it) dated 9999-12-31 once raised
    OverflowError from the partition code; now it is a StoreError the writers' callers
    isolate to that record."""
    (rec,) = exchanges(1)
    late = rec.model_copy(update={"sent_at": datetime(9999, 12, 31, tzinfo=UTC)})
    with pytest.raises(StoreError, match="no partition can hold the day 9999-12-31"):
        write_exchanges(pg_engine, [late])
