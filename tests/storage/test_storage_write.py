"""Bulk idempotent writers on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from factories import T0, exchanges, full_exchange, full_health, health_series
from sqlalchemy import Engine, text

from shadow_ab.records import ExchangeRecord
from storage.db import make_engine
from storage.partitions import ensure_partitions, partition_name
from storage.write import (
    EXCHANGE_COLUMNS,
    WIRE,
    ExchangeRow,
    exchange_values,
    write_drops,
    write_exchanges,
    write_health,
    write_records,
)


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_exchanges_written_once(store: Engine) -> None:
    batch = exchanges(50)
    assert write_exchanges(store, batch) == 50
    assert _count(store, "SELECT count(*) FROM exchanges") == 50
    assert write_exchanges(store, batch) == 0
    assert _count(store, "SELECT count(*) FROM exchanges") == 50
    # a batch overlapping the stored rows only inserts the new ones
    assert write_exchanges(store, exchanges(60)) == 10
    assert _count(store, "SELECT count(*) FROM exchanges") == 60


def test_exchanges_duplicates_inside_the_batch(store: Engine) -> None:
    a = full_exchange(pair_id=uuid.UUID(int=1), role="incumbent")
    b = full_exchange(pair_id=uuid.UUID(int=1), role="candidate")
    a_again = full_exchange(pair_id=uuid.UUID(int=1), role="incumbent", output_text="other")
    assert write_exchanges(store, [a, b, a_again, b]) == 2
    with store.connect() as conn:
        texts = conn.execute(text("SELECT role, output_text FROM exchanges ORDER BY role")).all()
    # the first occurrence wins
    assert [tuple(t) for t in texts] == [("candidate", b.output_text), ("incumbent", a.output_text)]


def test_same_pair_and_role_at_another_time_is_another_row(store: Engine) -> None:
    a = full_exchange(pair_id=uuid.UUID(int=1))
    later = full_exchange(pair_id=uuid.UUID(int=1), sent_at=T0 + timedelta(seconds=1))
    assert write_exchanges(store, [a, later]) == 2


def test_exchange_round_trip(store: Engine) -> None:
    rec = full_exchange(
        seed=3,
        error="upstream said \\ no\n\ttab",
        output_text="tabs\tnewlines\nbackslash\\ quote' \"unicode ✓",
        logprobs=None,
    )
    assert write_exchanges(store, [rec]) == 1
    with store.connect() as conn:
        row = conn.execute(text("SELECT * FROM exchanges")).mappings().one()
    if store.dialect.name == "sqlite":
        assert row["pair_id"] == rec.pair_id.hex
        assert row["sent_at"].startswith("2026-11-30 12:00:00")
        import json

        loads: Any = json.loads
    else:
        assert row["pair_id"] == rec.pair_id
        assert row["sent_at"] == rec.sent_at
        assert row["ingested_at"].tzinfo is not None

        def loads(v: Any) -> Any:
            return v

    assert row["role"] == "incumbent"
    assert row["endpoint"] == "chat"
    assert row["status"] == "ok"
    assert bool(row["stream"]) is True
    assert row["output_text"] == rec.output_text
    assert row["error"] == rec.error
    assert row["ttft_s"] == rec.ttft_s
    assert row["completion_tokens"] == 64
    assert loads(row["itl_s"]) == rec.itl_s
    assert loads(row["request"]) == rec.request
    assert loads(row["guard"]) == rec.guard
    assert loads(row["rewrites"]) == []
    assert row["logprobs"] is None
    assert row["schema_version"] == 1


# Floats whose text forms are long or unusual: the binary float8[] must keep every bit.
ITL_EDGE_VALUES = [0.0, 5e-324, 2.2250738585072014e-308, 0.1, 1 / 3, 1.7976931348623157e308]


def _stored_itl(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT output_text, itl_s, pg_typeof(itl_s)::text AS type FROM exchanges")
        ).all()
    assert {r.type for r in rows} == {"double precision[]"}
    return {r.output_text: r.itl_s for r in rows}


def _itl_records(tag: str, first_seed: int) -> list[ExchangeRecord]:
    rng = random.Random(tag)
    lists = {
        "edges": list(ITL_EDGE_VALUES),  # inf is malformed at parse time (records.py)
        "empty": [],
        "one": [0.008123],
        "long": [rng.random() / 10 for _ in range(5000)],
    }
    return [
        full_exchange(seed=first_seed + i, output_text=f"{tag}-{name}", itl_s=values)
        for i, (name, values) in enumerate(lists.items())
    ]


def test_itl_round_trips_exactly_through_copy_and_replay(pg_engine: Engine) -> None:
    fresh = _itl_records("copy", 0)
    # fresh rows: the direct binary COPY into the table
    assert write_exchanges(pg_engine, fresh) == len(fresh)
    # a batch with a row already stored: the temp-table + ON CONFLICT path
    replayed = _itl_records("replay", 100)
    assert write_exchanges(pg_engine, [fresh[0], *replayed]) == len(replayed)
    stored = _stored_itl(pg_engine)
    assert len(stored) == len(fresh) + len(replayed)
    for rec in fresh + replayed:
        got = stored[rec.output_text or ""]
        assert all(isinstance(v, float) for v in got)
        assert [v.hex() for v in got] == [v.hex() for v in rec.itl_s]  # bit for bit
    with pg_engine.connect() as conn:
        sizes = conn.execute(
            text("SELECT cardinality(itl_s), array_ndims(itl_s) FROM exchanges ORDER BY 1")
        ).all()
    assert [tuple(s) for s in sizes] == [(0, None)] * 2 + [(1, 1)] * 2 + [
        (len(ITL_EDGE_VALUES), 1)
    ] * 2 + [(5000, 1)] * 2


def test_itl_with_text_to_scrub_round_trips(pg_engine: Engine) -> None:
    # NUL in the text sends the batch through the scrubbing retry, which re-encodes every row
    recs = [
        full_exchange(seed=1, output_text="nul\x00here", itl_s=ITL_EDGE_VALUES),
        full_exchange(seed=2, output_text="clean", itl_s=[]),
    ]
    assert write_exchanges(pg_engine, recs) == 2
    assert _stored_itl(pg_engine) == {"nul\ufffdhere": ITL_EDGE_VALUES, "clean": []}


def test_logprobs_stored_as_json(store: Engine) -> None:
    rec = full_exchange()
    write_exchanges(store, [rec])
    with store.connect() as conn:
        raw = conn.execute(text("SELECT logprobs FROM exchanges")).scalar_one()
    import json

    value = json.loads(raw) if isinstance(raw, str) else raw
    assert value == [
        {"token": "the", "logprob": -0.1, "top": {"the": -0.1, "a": -2.5}},
        {"token": " fox", "logprob": -0.3, "top": {" fox": -0.3}},
    ]


def test_deployments_created_on_first_sight(store: Engine) -> None:
    write_exchanges(store, exchanges(4, deployment="exp-1"))
    write_health(store, [full_health(deployment="exp-2")])
    write_exchanges(store, exchanges(4, deployment="exp-1", seed=9))
    with store.connect() as conn:
        names = conn.execute(text("SELECT name FROM deployments ORDER BY name")).scalars().all()
    assert names == ["exp-1", "exp-2"]


def test_health_written_once(store: Engine) -> None:
    samples = health_series(30)
    assert write_health(store, samples) == 30
    assert write_health(store, samples) == 0
    assert write_health(store, [*samples[:5], *samples[:5]]) == 0
    other_engine = health_series(5, engine="trtllm@candidate")
    assert write_health(store, other_engine + other_engine) == 5
    assert _count(store, "SELECT count(*) FROM health_samples") == 35


def test_mixed_batch(store: Engine) -> None:
    assert write_records(store, [*exchanges(6), *health_series(4)]) == 10
    assert write_records(store, [*exchanges(6), *health_series(4)]) == 0


def test_empty_batches(store: Engine) -> None:
    assert write_exchanges(store, []) == 0
    assert write_health(store, []) == 0


def test_wrong_record_type_is_refused(store: Engine) -> None:
    with pytest.raises(TypeError, match="parse_record"):
        write_exchanges(store, [full_health()])  # type: ignore[list-item]  # the point of the test
    with pytest.raises(TypeError, match="parse_record"):
        write_exchanges(store, [{"kind": "exchange"}])  # type: ignore[list-item]


def test_drops(store: Engine) -> None:
    ts = datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC)
    write_drops(store, "mirror", "queue_full", 17, ts)
    write_drops(store, "mirror", "queue_full", 0, ts)  # nothing to record
    write_drops(store, "direct_sink", "store_error", 3, ts)
    with store.connect() as conn:
        rows = conn.execute(text("SELECT source, reason, count FROM drops ORDER BY count")).all()
    assert [tuple(r) for r in rows] == [
        ("direct_sink", "store_error", 3),
        ("mirror", "queue_full", 17),
    ]
    with pytest.raises(ValueError, match="timezone"):
        write_drops(store, "mirror", "x", 1, datetime(2026, 1, 1))
    with pytest.raises(ValueError, match=">= 0"):
        write_drops(store, "mirror", "x", -1, ts)


def test_records_of_many_days_land_in_their_partitions(pg_engine: Engine) -> None:
    days = [T0 - timedelta(days=40), T0, T0 + timedelta(days=1), T0 + timedelta(days=400)]
    batch: list[ExchangeRecord] = []
    for i, day in enumerate(days):
        batch += exchanges(
            2 * (i + 1), start=day.replace(hour=23, minute=59), seed=i, step=timedelta(seconds=20)
        )
    # ~pairs cross midnight: count by day from the records themselves
    expected: dict[str, int] = {}
    for rec in batch:
        name = partition_name("exchanges", rec.sent_at.date())
        expected[name] = expected.get(name, 0) + 1
    assert write_exchanges(pg_engine, batch) == len(batch)
    for name, n in expected.items():
        assert _count(pg_engine, f"SELECT count(*) FROM {name}") == n
    week_ago = T0 - timedelta(days=7)
    assert write_health(pg_engine, health_series(3, start=week_ago)) == 3
    name = partition_name("health_samples", week_ago.date())
    assert _count(pg_engine, f"SELECT count(*) FROM {name}") == 3


def test_partition_dropped_behind_the_writers_back_is_recreated(pg_engine: Engine) -> None:
    assert write_exchanges(pg_engine, exchanges(2)) == 2  # the writer now caches today's partition
    with pg_engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {partition_name('exchanges', T0.date())}"))
    assert write_exchanges(pg_engine, exchanges(2)) == 2
    assert _count(pg_engine, "SELECT count(*) FROM exchanges") == 2


def test_ensure_partitions_then_write(pg_engine: Engine) -> None:
    ensure_partitions(pg_engine, T0, days_ahead=3)
    assert write_exchanges(pg_engine, exchanges(10, start=T0 + timedelta(days=3))) == 10


def test_write_after_the_server_dropped_our_connections(pg_engine: Engine, pg_url: str) -> None:
    assert write_exchanges(pg_engine, exchanges(2)) == 2  # a pooled connection now exists
    admin = make_engine(pg_url)
    try:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
    finally:
        admin.dispose()
    # the pool notices the dead connection and opens a new one: no error, no lost batch
    assert write_exchanges(pg_engine, exchanges(4)) == 2
    assert _count(pg_engine, "SELECT count(*) FROM exchanges") == 4


def test_concurrent_writers_of_overlapping_batches(pg_engine: Engine) -> None:
    import threading

    from storage.errors import StoreUnavailable

    records = exchanges(400)
    batches = [records[0:300], records[100:400], records[50:350], records[::-1]]
    inserted: list[int] = []
    failures: list[BaseException] = []

    def writer(batch: list[ExchangeRecord]) -> None:
        for _attempt in range(20):  # a deadlock is transient: retry the same batch
            try:
                inserted.append(write_exchanges(pg_engine, batch))
                return
            except StoreUnavailable:
                continue
            except BaseException as exc:
                failures.append(exc)
                return

    threads = [threading.Thread(target=writer, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(inserted) == 4
    assert sum(inserted) == 400
    assert _count(pg_engine, "SELECT count(*) FROM exchanges") == 400


def test_nul_characters(store: Engine) -> None:
    rec = full_exchange(
        output_text="a\x00b",
        request={"messages": [{"role": "user", "content": "nul\x00here"}], "k\x00": 1},
    )
    assert write_exchanges(store, [rec, full_exchange(seed=5)]) == 2
    with store.connect() as conn:
        texts = set(conn.execute(text("SELECT output_text FROM exchanges")).scalars())
    # SQLite keeps the NUL; PostgreSQL cannot store it and gets U+FFFD instead
    assert ("a\x00b" if store.dialect.name == "sqlite" else "a\ufffdb") in texts
    assert write_exchanges(store, [rec]) == 0


def test_integers_too_big_for_their_column_are_refused_not_wrapped(pg_engine: Engine) -> None:
    from storage.errors import StoreError

    # Parsing refuses these now (records.py bounds them); the store still must not wrap a
    # value that got past validation, so build them unvalidated.
    big = full_exchange().model_copy(update={"http_status": 2**40})
    with pytest.raises(StoreError, match="http_status=1099511627776 does not fit"):
        write_exchanges(pg_engine, [*exchanges(4), big])
    assert _count(pg_engine, "SELECT count(*) FROM exchanges") == 0  # all or nothing
    with pytest.raises(StoreError, match="num_running"):
        write_health(pg_engine, [full_health().model_copy(update={"num_running": 2**31})])
    assert write_health(pg_engine, [full_health(num_running=2**31 - 1)]) == 1


def test_lone_surrogates_are_replaced(store: Engine) -> None:
    rec = full_exchange(
        output_text="half a pair: \ud800!",
        request={"messages": [{"role": "user", "content": "x\udfffy"}]},
        error="e\x00\ud800",
    )
    assert write_exchanges(store, [rec]) == 1
    with store.connect() as conn:
        out, err = conn.execute(text("SELECT output_text, error FROM exchanges")).one()
    assert out == "half a pair: \ufffd\ufffd\ufffd!"  # one U+FFFD per byte of the surrogate
    assert err.startswith("e") and "\ud800" not in err
    assert write_exchanges(store, [rec]) == 0


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)  # SQLite: naive UTC


def test_rows_read_back_through_the_models(store: Engine) -> None:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from storage.models import Exchange, HealthSampleRow

    rec = full_exchange(seed=11)
    sample = full_health(ts=T0 + timedelta(microseconds=123))
    write_exchanges(store, [rec])
    write_health(store, [sample])
    with Session(store) as session:
        row = session.scalars(select(Exchange).where(Exchange.pair_id == rec.pair_id)).one()
        assert row.role == "incumbent"
        assert _aware(row.sent_at) == rec.sent_at
        assert row.request == rec.request
        assert row.itl_s == rec.itl_s
        assert row.logprobs is not None and row.logprobs[0]["top"] == {"the": -0.1, "a": -2.5}
        assert row.stream is True
        hrow = session.scalars(select(HealthSampleRow)).one()
        assert _aware(hrow.ts) == sample.ts
        assert hrow.metrics == sample.metrics
        assert hrow.up is True
        # the models' own filters match the stored timestamps
        assert (
            session.scalars(
                select(HealthSampleRow).where(HealthSampleRow.ts == sample.ts)
            ).one_or_none()
            is not None
        )


def _row(rec: ExchangeRecord) -> ExchangeRow:
    """The record as the ingester's rows decoder hands it over: its wire row and its JSON."""
    return ExchangeRow(exchange_values(rec, WIRE), rec.to_json())


def _stored(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    f"SELECT {', '.join(EXCHANGE_COLUMNS)} FROM exchanges"
                    " ORDER BY pair_id, role, sent_at"
                )
            ).all()
        ]


def test_exchange_rows_are_stored_as_their_records(store: Engine) -> None:
    """ExchangeRow items store exactly what their records store (SQLite, and the retry that
    scrubs a NUL in a record of the same batch, go through the record parsed again); a row and
    a record of the same exchange are one key, the first kept."""
    recs = [full_exchange(seed=i, pair_id=uuid.UUID(int=i + 1)) for i in range(6)]
    nul = full_exchange(seed=9, output_text="a\x00b", pair_id=uuid.UUID(int=99))
    assert write_exchanges(store, [*recs, nul]) == 7
    expected = _stored(store)
    with store.begin() as conn:
        conn.execute(text("DELETE FROM exchanges"))
    items: list[ExchangeRecord | ExchangeRow] = [_row(r) for r in recs[:3]]
    items += [recs[0], *recs[3:5], _row(recs[5]), nul]  # recs[0] again, as a record
    assert write_exchanges(store, items) == 7
    assert _stored(store) == expected
    assert write_exchanges(store, [_row(r) for r in recs]) == 0  # a replay
    with pytest.raises(TypeError, match="ExchangeRecord or ExchangeRow"):
        write_exchanges(store, [full_health()])  # type: ignore[list-item]


def test_a_deployment_is_remembered_only_once_its_row_is_committed(
    pg_engine: Engine, pg_url: str
) -> None:
    """The writers skip the deployments insert for names they have seen committed: a batch
    the store refused (rolled back with its deployment row) must not count as seen."""
    from storage.errors import StoreError

    good = exchanges(3, deployment="exp-new")
    # Too long for its column (the contract forbids it; built without validation here).
    bad = good[0].model_copy(update={"engine": "x" * 300})
    with pytest.raises(StoreError):
        write_exchanges(pg_engine, [bad])
    assert write_exchanges(pg_engine, good[:2]) == 2
    assert _count(pg_engine, "SELECT count(*) FROM deployments WHERE name = 'exp-new'") == 1
    # Another process replaying stored rows takes the conflict path in a second transaction.
    other = make_engine(pg_url)
    try:
        assert write_exchanges(other, good) == 1
    finally:
        other.dispose()
    assert _count(pg_engine, "SELECT count(*) FROM exchanges") == 3
