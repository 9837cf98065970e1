"""Bulk, idempotent writers: the ONE way records get into the store.

Used by the direct sink (:mod:`storage.sink`) and by the Kafka ingester. Each call:

- is one transaction: every row of the batch is written, or none is;
- is idempotent: rows already stored (same key) are skipped, duplicates inside the batch too,
  and the return value counts only rows newly inserted -- so a caller that is unsure whether a
  batch landed simply writes it again;
- creates the ``deployments`` row of every deployment name it sees (name only) and, on
  PostgreSQL, the daily partition of every day in the batch;
- raises :class:`~storage.errors.StoreUnavailable` when the database cannot be reached (retry
  the same batch with backoff) and :class:`~storage.errors.StoreError` otherwise.

PostgreSQL: binary ``COPY`` straight into the table, ``json``, ``jsonb`` and ``float8[]``
values encoded here in their binary formats (:data:`WIRE`; a store not yet migrated to 0007,
whose ``request`` and ``logprobs`` are still ``jsonb``, gets them as ``jsonb``); when a row is
already there (a replayed batch), roll the transaction back and, in a new one, ``COPY`` into a
temporary table, then ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``. Rows go in key order, so
concurrent writers of overlapping batches take their locks in the same order (a deadlock would
be retried anyway).
SQLite: ``executemany`` of ``INSERT ... ON CONFLICT DO NOTHING``.
"""

from __future__ import annotations

import struct
import threading
import uuid
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg.types.string import BytesBinaryDumper
from pydantic import BaseModel
from sqlalchemy import Connection, Engine, Table, insert, text
from sqlalchemy.dialects import postgresql, sqlite

from shadow_ab.records import ExchangeRecord, HealthSample, Record
from shadow_ab.timestamps import aware_utc
from storage.db import is_postgres
from storage.errors import StoreError, translate
from storage.models import DEPLOYMENTS, DROPS, EXCHANGES, HEALTH_SAMPLES
from storage.partitions import cache_for, day_of

EXCHANGE_COLUMNS = (
    "pair_id",
    "role",
    "sent_at",
    "deployment",
    "schema_version",
    "engine",
    "endpoint",
    "stream",
    "model",
    "status",
    "http_status",
    "error",
    "ttft_s",
    "e2e_s",
    "tpot_s",
    "itl_s",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "request",
    "rewrites",
    "output_text",
    "logprobs",
    "inflight_incumbent",
    "inflight_candidate",
    "guard",
    "synthetic",
    "probe_id",
)
EXCHANGE_KEY = ("pair_id", "role", "sent_at")
# PostgreSQL types of EXCHANGE_COLUMNS, for binary COPY.
EXCHANGE_PG_TYPES = (
    "uuid",
    "text",
    "timestamptz",
    "text",
    "int2",
    "text",
    "text",
    "bool",
    "text",
    "text",
    "int4",
    "text",
    "float8",
    "float8",
    "float8",
    "float8[]",
    "int4",
    "int4",
    "text",
    "json",
    "jsonb",
    "text",
    "json",
    "int4",
    "int4",
    "jsonb",
    "text",
    "text",
)

HEALTH_COLUMNS = (
    "engine",
    "ts",
    "deployment",
    "schema_version",
    "role",
    "flavor",
    "up",
    "http_status",
    "latency_s",
    "error",
    "version",
    "process_start_time",
    "num_running",
    "num_waiting",
    "kv_cache_usage",
    "gpu_mem_bytes",
    "cpu_mem_bytes",
    "metrics",
)
HEALTH_KEY = ("engine", "ts")
HEALTH_PG_TYPES = (
    "text",
    "timestamptz",
    "text",
    "int2",
    "text",
    "text",
    "bool",
    "int4",
    "float8",
    "text",
    "text",
    "float8",
    "int4",
    "int4",
    "float8",
    "int8",
    "int8",
    "jsonb",
)

# PostgreSQL's "no partition of relation ... found for row": a partition we believed existed
# was dropped (retention in another process). Forget the cache, create it, retry once.
_NO_PARTITION = "23514"

R = TypeVar("R")


class ExchangeRow:
    """An exchange record as its row, already in :data:`WIRE` values (exactly
    ``exchange_values(record, WIRE)``), built straight from the record's JSON by a caller that
    validated it without making an :class:`~shadow_ab.records.ExchangeRecord`
    (``ingester.fastdecode.decode_exchange_row``: the ingester's fast path).
    :func:`write_exchanges` takes these as it takes records. Where another encoding is needed
    (SQLite, the retry that scrubs text the store refused) the record is parsed again from
    ``source``, its JSON, by the record contract (pydantic)."""

    __slots__ = ("deployment", "key", "row", "sent_at", "source")

    def __init__(self, row: tuple[Any, ...], source: bytes) -> None:
        self.row = row
        self.source = source
        self.sent_at: datetime = row[2]
        self.deployment: str = row[3]
        self.key = (row[0].int, row[1], row[2])

    def record(self) -> ExchangeRecord:
        return ExchangeRecord.model_validate_json(self.source)


def plain_json(value: Any) -> Any:
    """JSON column values as plain Python objects (SQLAlchemy's JSON type serializes them)."""
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return [item.model_dump() for item in value]
    return value


def _model_fields(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.__dict__  # pydantic v2 keeps the field values there
    raise TypeError(f"cannot store {type(obj).__name__} as JSON")


def jsonb_wire(value: Any) -> bytes | None:
    """A value in PostgreSQL's binary ``jsonb`` format (version byte 1, then the JSON text).
    Sent as if it were ``bytea``: binary COPY carries no per-field type, the column's own
    receive function reads it, and psycopg's JSON adapter (several Python calls a value) is
    skipped."""
    if value is None:
        return None
    return b"\x01" + orjson.dumps(value, default=_model_fields)


def json_wire(value: Any) -> bytes | None:
    """A value in PostgreSQL's binary ``json`` format: the JSON text (sent as ``bytea`` like
    :func:`jsonb_wire` values; ``json_recv`` checks that it is JSON)."""
    if value is None:
        return None
    return orjson.dumps(value, default=_model_fields)


# float8[] in PostgreSQL's binary array format: ndim, has-nulls flag, element type oid (701 is
# float8), then per dimension its length and lower bound, then per element its byte length (8)
# and the big-endian double. An empty array is ndim 0 with nothing after the element type.
_FLOAT8_OID = 701
_EMPTY_FLOAT8_ARRAY = struct.pack("!iiI", 0, 0, _FLOAT8_OID)


@lru_cache(maxsize=4096)
def _float8_array_struct(n: int) -> tuple[struct.Struct, bytes]:
    # "4x" leaves each element's length field zero; the caller writes the 8s in one slice.
    return struct.Struct("!iiIii" + "4xd" * n), b"\x08" * n


def float8_array_wire(values: Sequence[float]) -> bytes | bytearray:
    """A list of floats in PostgreSQL's binary ``float8[]`` format, sent as if it were
    ``bytea`` like :func:`jsonb_wire` values (the column's ``array_recv`` reads it): one
    ``struct`` call instead of psycopg's list adaptation, and the server parses no text."""
    n = len(values)
    if not n:
        return _EMPTY_FLOAT8_ARRAY
    layout, eights = _float8_array_struct(n)
    out = bytearray(layout.size)
    layout.pack_into(out, 0, 1, 0, _FLOAT8_OID, n, 1, *values)
    out[23::12] = eights  # the low byte of every element's length
    return out


@dataclass(frozen=True)
class Encoding:
    """How the writers convert the columns that are not plain scalars: the JSON columns
    (``jsonb`` on PostgreSQL; ``json_text``: the ``json`` ones) and the float lists
    (``float8[]`` on PostgreSQL)."""

    json: Callable[[Any], Any]
    floats: Callable[[list[float]], Any]
    json_text: Callable[[Any], Any] = plain_json


PLAIN = Encoding(json=plain_json, floats=plain_json)
"""Plain Python objects (SQLAlchemy, and the SQLite writer, which serializes them as JSON)."""
WIRE = Encoding(json=jsonb_wire, floats=float8_array_wire, json_text=json_wire)
"""PostgreSQL binary COPY: values already in the columns' binary formats."""


def exchange_values(rec: ExchangeRecord, enc: Encoding = PLAIN) -> tuple[Any, ...]:
    """The row of one exchange record, in :data:`EXCHANGE_COLUMNS` order; ``enc`` converts
    the JSON and float-list columns (:data:`PLAIN` or :data:`WIRE` for COPY)."""
    json, json_text = enc.json, enc.json_text
    return (
        rec.pair_id,
        rec.role.value,
        rec.sent_at,
        rec.deployment,
        rec.schema_version,
        rec.engine,
        rec.endpoint.value,
        rec.stream,
        rec.model,
        rec.status.value,
        rec.http_status,
        rec.error,
        rec.ttft_s,
        rec.e2e_s,
        rec.tpot_s,
        enc.floats(rec.itl_s),
        rec.prompt_tokens,
        rec.completion_tokens,
        rec.finish_reason,
        json_text(rec.request),
        json(rec.rewrites),
        rec.output_text,
        json_text(rec.logprobs),
        rec.inflight_incumbent,
        rec.inflight_candidate,
        json(rec.guard),
        rec.synthetic,
        rec.probe_id,
    )


def health_values(rec: HealthSample, enc: Encoding = PLAIN) -> tuple[Any, ...]:
    """The row of one health sample, in :data:`HEALTH_COLUMNS` order."""
    json = enc.json
    return (
        rec.engine,
        rec.ts,
        rec.deployment,
        rec.schema_version,
        rec.role.value,
        rec.flavor,
        rec.up,
        rec.http_status,
        rec.latency_s,
        rec.error,
        rec.version,
        rec.process_start_time,
        rec.num_running,
        rec.num_waiting,
        rec.kv_cache_usage,
        rec.gpu_mem_bytes,
        rec.cpu_mem_bytes,
        json(rec.metrics),
    )


def _exchange_key(rec: ExchangeRecord | ExchangeRow) -> Hashable:
    if type(rec) is ExchangeRow:
        return rec.key
    assert isinstance(rec, ExchangeRecord)
    # uuid.int hashes and compares in C; UUID objects do both in Python. (A Role is a str:
    # a record and an ExchangeRow of the same exchange have equal keys.)
    return (rec.pair_id.int, rec.role, rec.sent_at)


def _exchange_row(rec: ExchangeRecord | ExchangeRow, enc: Encoding) -> tuple[Any, ...]:
    if type(rec) is ExchangeRow:
        return rec.row if enc is WIRE else exchange_values(rec.record(), enc)
    assert isinstance(rec, ExchangeRecord)
    return exchange_values(rec, enc)


def _health_key(rec: HealthSample) -> Hashable:
    return (rec.engine, rec.ts)


def dedupe(records: Sequence[R], key: Callable[[R], Hashable]) -> list[R]:
    """The records with the first of each key kept, in their original order."""
    seen: dict[Hashable, R] = {}
    for rec in records:
        seen.setdefault(key(rec), rec)
    return list(seen.values())


def _clean_str(value: str) -> str:
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: not encodable, so not storable
        value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return value


def scrub_text(value: Any) -> Any:
    """``value`` with NUL characters and lone surrogates in its strings (nested in lists,
    tuples and dicts too) replaced by U+FFFD: PostgreSQL cannot store either, SQLite and JSON
    encoders refuse surrogates."""
    if isinstance(value, str):
        return _clean_str(value)
    if isinstance(value, tuple):
        return tuple(scrub_text(v) for v in value)
    if isinstance(value, list):
        return [scrub_text(v) for v in value]
    if isinstance(value, dict):
        return {scrub_text(k): scrub_text(v) for k, v in value.items()}
    return value


def _check_types(records: Sequence[Any], kind: type | tuple[type, ...]) -> None:
    for rec in records:
        if not isinstance(rec, kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise TypeError(
                f"expected {names} objects, got {type(rec).__name__}:"
                " parse payloads with shadow_ab.records.parse_record first"
            )


def write_exchanges(engine: Engine, records: Sequence[ExchangeRecord | ExchangeRow]) -> int:
    """Store exchange records (or their :class:`ExchangeRow`), skipping any already stored;
    return how many rows were new."""
    _check_types(records, (ExchangeRecord, ExchangeRow))
    unique = dedupe(records, _exchange_key)
    if not unique:
        return 0
    return _write(
        engine,
        _EXCHANGE_SPEC,
        lambda enc: [_exchange_row(r, enc) for r in unique],
        {r.deployment for r in unique},
        {day_of(r.sent_at) for r in unique},
    )


def write_health(engine: Engine, samples: Sequence[HealthSample]) -> int:
    """Store health samples, skipping any already stored; return how many rows were new."""
    _check_types(samples, HealthSample)
    unique = dedupe(samples, _health_key)
    if not unique:
        return 0
    return _write(
        engine,
        _HEALTH_SPEC,
        lambda enc: [health_values(r, enc) for r in unique],
        {r.deployment for r in unique},
        {day_of(r.ts) for r in unique},
    )


def write_records(engine: Engine, records: Sequence[Record]) -> int:
    """Store a mixed batch (exchanges and health samples): two transactions, one per kind."""
    exchanges = [r for r in records if isinstance(r, ExchangeRecord)]
    health = [r for r in records if isinstance(r, HealthSample)]
    if len(exchanges) + len(health) != len(records):
        _check_types([r for r in records if not isinstance(r, HealthSample)], ExchangeRecord)
    return write_exchanges(engine, exchanges) + write_health(engine, health)


def write_drops(engine: Engine, source: str, reason: str, count: int, ts: datetime) -> None:
    """Record that ``source`` dropped ``count`` records for ``reason`` (at ``ts``, UTC)."""
    if count < 0:
        raise ValueError(f"drop count must be >= 0, got {count}")
    ts = aware_utc(ts, "drop ts")
    if not source or not reason:
        raise ValueError("drops need a non-empty source and reason")
    if count == 0:
        return
    with translate(), engine.begin() as conn:
        conn.execute(insert(DROPS), {"ts": ts, "source": source, "reason": reason, "count": count})


@dataclass(frozen=True)
class _TableSpec:
    table: Table
    columns: tuple[str, ...]
    key: tuple[str, ...]
    pg_types: tuple[str, ...]

    @property
    def copy_types(self) -> list[str]:
        """Types announced to COPY: json, jsonb and float8[] values are already in their
        binary formats (:data:`WIRE`), sent as bytea."""
        return ["bytea" if t in _PREENCODED else t for t in self.pg_types]


_PREENCODED = ("json", "jsonb", "float8[]")


_INT_BOUNDS = {"int2": 2**15, "int4": 2**31, "int8": 2**63}


def check_int_ranges(spec: _TableSpec, rows: Sequence[tuple[Any, ...]]) -> None:
    """Refuse integers the columns cannot hold. Binary COPY would silently wrap them around
    (2**40 in an int4 column is stored as 0), so check before sending."""
    checks = [
        (i, name, _INT_BOUNDS[t])
        for i, (name, t) in enumerate(zip(spec.columns, spec.pg_types, strict=True))
        if t in _INT_BOUNDS
    ]
    for row in rows:
        for i, name, bound in checks:
            value = row[i]
            if value is not None and not -bound <= value < bound:
                key = ", ".join(str(v) for v in row[: len(spec.key)])
                raise StoreError(
                    f"{spec.table.name} record ({key}): {name}={value} does not fit the column"
                    f" (PostgreSQL {dict(zip(spec.columns, spec.pg_types, strict=True))[name]})"
                )


_EXCHANGE_SPEC = _TableSpec(EXCHANGES, EXCHANGE_COLUMNS, EXCHANGE_KEY, EXCHANGE_PG_TYPES)
_HEALTH_SPEC = _TableSpec(HEALTH_SAMPLES, HEALTH_COLUMNS, HEALTH_KEY, HEALTH_PG_TYPES)


RowBuilder = Callable[[Encoding], list[tuple[Any, ...]]]
"""Builds a batch's rows, given how to convert the JSON and float-list columns."""

# Text the store cannot take as is (NUL, lone surrogates): write it with U+FFFD instead.
_BAD_TEXT = (
    psycopg.errors.CharacterNotInRepertoire,
    psycopg.errors.UntranslatableCharacter,
    UnicodeEncodeError,
    orjson.JSONEncodeError,
)


def _scrubbed_rows(spec: _TableSpec, build: RowBuilder, enc: Encoding) -> list[Any]:
    rows = [scrub_text(row) for row in build(PLAIN)]
    if enc is PLAIN:
        return rows
    convert = {"jsonb": enc.json, "json": enc.json_text, "float8[]": enc.floats}
    wire = [(i, convert[t]) for i, t in enumerate(spec.pg_types) if t in convert]
    out = []
    for row in rows:
        cells = list(row)
        for i, to_wire in wire:
            cells[i] = to_wire(cells[i])
        out.append(tuple(cells))
    return out


def _write(
    engine: Engine,
    spec: _TableSpec,
    build: RowBuilder,
    deployments: set[str],
    days: set[Any],
) -> int:
    postgres = is_postgres(engine)
    enc = WIRE if postgres else PLAIN
    write = _write_postgres if postgres else _write_sqlite
    deployments = _new_deployments(engine, deployments)
    with translate():
        if postgres:
            cache_for(engine).ensure(engine, spec.table.name, days)
        try:
            try:
                written = write(engine, spec, build(enc), deployments)
            except _BAD_TEXT:
                # PostgreSQL text and jsonb cannot hold NUL characters, and nothing encodes
                # lone surrogates: store the records with U+FFFD there rather than lose them.
                written = write(engine, spec, _scrubbed_rows(spec, build, enc), deployments)
        except psycopg.errors.CheckViolation as exc:
            if exc.sqlstate != _NO_PARTITION or "no partition" not in str(exc):
                raise
            # A partition we believed existed was dropped (retention in another process).
            cache = cache_for(engine)
            cache.forget()
            cache.ensure(engine, spec.table.name, days)
            written = write(engine, spec, _scrubbed_rows(spec, build, enc), deployments)
    _known_deployments(engine).update(deployments)
    return written


_deployments: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()
_deployments_lock = threading.Lock()


def _known_deployments(engine: Engine) -> set[str]:
    """The deployment names this process has seen committed in ``engine``'s ``deployments``
    table (nothing deletes a row there): a batch of known deployments skips their insert."""
    with _deployments_lock:
        known = _deployments.get(engine)
        if known is None:
            known = _deployments[engine] = set()
        return known


def _new_deployments(engine: Engine, names: set[str]) -> set[str]:
    return names - _known_deployments(engine)


def _ensure_deployments(conn: Connection, names: set[str]) -> None:
    if not names:
        return
    rows = [{"name": n} for n in sorted(names)]
    if conn.dialect.name == "postgresql":
        conn.execute(postgresql.insert(DEPLOYMENTS).on_conflict_do_nothing(), rows)
    else:
        conn.execute(sqlite.insert(DEPLOYMENTS).on_conflict_do_nothing(), rows)


def _sqlite_datetime(value: datetime) -> str:
    # The text SQLAlchemy's DateTime stores on SQLite (UTC here: records are UTC).
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")


def _sqlite_json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


_SQLITE_CONVERT: dict[str, Callable[[Any], Any]] = {
    "uuid": lambda v: v.hex,  # SQLAlchemy's Uuid on SQLite: 32 hex digits
    "timestamptz": _sqlite_datetime,
    "jsonb": _sqlite_json,
    "json": _sqlite_json,
    "float8[]": _sqlite_json,
}


def _write_sqlite(
    engine: Engine, spec: _TableSpec, rows: list[tuple[Any, ...]], deployments: set[str]
) -> int:
    """executemany on the DBAPI cursor, values already in the forms SQLAlchemy's column types
    store on SQLite (5x less CPU than going through its bind processors)."""
    converters = [
        (i, _SQLITE_CONVERT[t]) for i, t in enumerate(spec.pg_types) if t in _SQLITE_CONVERT
    ]
    params = []
    for row in rows:
        cells = list(row)
        for i, convert in converters:
            if cells[i] is not None:
                cells[i] = convert(cells[i])
        params.append(tuple(cells))
    sql = (
        f"INSERT INTO {spec.table.name} ({', '.join(spec.columns)})"
        f" VALUES ({', '.join('?' * len(spec.columns))}) ON CONFLICT DO NOTHING"
    )
    with engine.begin() as conn:
        _ensure_deployments(conn, deployments)
        result = conn.exec_driver_sql(sql, params)
        return max(result.rowcount, 0)


def _sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    # PostgreSQL orders uuids by their bytes, i.e. like uuid.int (compared in C, not Python).
    first = row[0]
    return (first.int if isinstance(first, uuid.UUID) else first, row[1], row[2])


def _copy_rows(cur: psycopg.Cursor[Any], target: str, spec: _TableSpec, rows: list[Any]) -> None:
    # The values announced as bytea (WIRE's jsonb and float8[]) through psycopg's own bytes
    # dumper, compiled in C with psycopg[binary]: the one it would pick by the bytea oid is
    # the DBAPI Binary wrapper's, in Python (a quarter of the COPY's client CPU).
    cur.adapters.register_dumper(None, BytesBinaryDumper)
    with cur.copy(f"COPY {target} ({', '.join(spec.columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(spec.copy_types)
        for row in rows:
            copy.write_row(row)


def _write_postgres(
    engine: Engine, spec: _TableSpec, rows: list[tuple[Any, ...]], deployments: set[str]
) -> int:
    """:func:`_copy_or_insert` the rows with their JSON values in the table's own types
    (:func:`_json_conversions`); when the table refuses them, look its types up again (the
    store was migrated since) and write once more."""
    try:
        return _copy_or_insert(engine, spec, _as_stored(engine, spec, rows), deployments)
    except _JSON_REFUSED as exc:
        if "json" not in str(exc):
            raise
        _forget_stored_types(engine)
        return _copy_or_insert(engine, spec, _as_stored(engine, spec, rows), deployments)


# What json_recv says to a jsonb wire value (22P02: its version byte is no JSON) and jsonb_recv
# to a json one ("unsupported jsonb version number", an internal error).
_JSON_REFUSED = (psycopg.errors.InvalidTextRepresentation, psycopg.errors.InternalError_)
_JSON_TYPES = ("json", "jsonb")

_stored_types: weakref.WeakKeyDictionary[Engine, dict[str, tuple[tuple[int, str], ...]]] = (
    weakref.WeakKeyDictionary()
)
_stored_types_lock = threading.Lock()


def _json_conversions(engine: Engine, spec: _TableSpec) -> tuple[tuple[int, str], ...]:
    """(index, the store's type) of the JSON columns whose type in the store is not the one
    ``spec`` says: ``jsonb`` for ``json`` before migration 0007 (or after its downgrade).
    Looked up once per engine and table."""
    with _stored_types_lock:
        found = _stored_types.get(engine, {}).get(spec.table.name)
    if found is not None:
        return found
    with engine.connect() as conn:
        result = conn.execute(
            text(
                "SELECT attname, format_type(atttypid, NULL) FROM pg_attribute"
                " WHERE attrelid = CAST(:t AS regclass) AND attnum > 0 AND NOT attisdropped"
            ),
            {"t": spec.table.name},
        )
        types = {str(name): str(pg_type) for name, pg_type in result}
    found = tuple(
        (i, types[c])
        for i, (c, t) in enumerate(zip(spec.columns, spec.pg_types, strict=True))
        if t in _JSON_TYPES and types.get(c) in _JSON_TYPES and types[c] != t
    )
    with _stored_types_lock:
        _stored_types.setdefault(engine, {})[spec.table.name] = found
    return found


def _forget_stored_types(engine: Engine) -> None:
    with _stored_types_lock:
        _stored_types.pop(engine, None)


def _as_stored(engine: Engine, spec: _TableSpec, rows: list[Any]) -> list[Any]:
    """``rows`` (:data:`WIRE` values) with their JSON values in the table's own types: a
    ``json`` value is the JSON text, a ``jsonb`` one the same after a version byte."""
    conversions = _json_conversions(engine, spec)
    if not conversions:
        return rows
    out = []
    for row in rows:
        cells = list(row)
        for i, stored in conversions:
            value = cells[i]
            if value is not None:
                cells[i] = b"\x01" + bytes(value) if stored == "jsonb" else bytes(value)[1:]
        out.append(tuple(cells))
    return out


def _copy_or_insert(
    engine: Engine, spec: _TableSpec, rows: list[tuple[Any, ...]], deployments: set[str]
) -> int:
    """COPY the rows straight into the table; if any is already there (a replay), roll the
    transaction back and take the conflict-tolerant path in a new one: COPY into a temporary
    table, then ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``. Fresh batches, the common
    case, are written once, in three round trips (BEGIN, the COPY, COMMIT: no savepoint, whose
    two more round trips and subtransaction every batch would pay); replays cost the failed
    attempt."""
    name = spec.table.name
    check_int_ranges(spec, rows)
    # Key order (the key columns come first in every row): concurrent writers of overlapping
    # batches then take their locks in the same order.
    rows = sorted(rows, key=_sort_key)
    try:
        with engine.begin() as conn, _raw_cursor(conn) as cur:
            _ensure_deployments(conn, deployments)
            try:
                _copy_rows(cur, name, spec, rows)
            except psycopg.errors.UniqueViolation as exc:
                raise _Replayed() from exc  # rolls the transaction back
            return len(rows)
    except _Replayed:
        pass
    with engine.begin() as conn, _raw_cursor(conn) as cur:
        _ensure_deployments(conn, deployments)
        return _insert_new_rows(cur, spec, rows)


class _Replayed(Exception):
    """Some of the rows are stored already: write the batch again, skipping them."""


def _raw_cursor(conn: Connection) -> psycopg.Cursor[Any]:
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise StoreError(f"expected a psycopg 3 connection, got {type(raw).__name__}")
    return raw.cursor()


def _insert_new_rows(cur: psycopg.Cursor[Any], spec: _TableSpec, rows: list[Any]) -> int:
    name = spec.table.name
    stage = f"stage_{name}"
    cols = ", ".join(spec.columns)
    # Same column types and lz4 compression as the target, so the INSERT below copies the
    # compressed values as they are instead of compressing them a second time.
    cur.execute(
        f"CREATE TEMP TABLE {stage} (LIKE {name} INCLUDING DEFAULTS INCLUDING COMPRESSION)"
        " ON COMMIT DROP"
    )
    _copy_rows(cur, stage, spec, rows)
    # No ORDER BY: the stage is read in the order it was written; sorting wide rows spills.
    cur.execute(f"INSERT INTO {name} ({cols}) SELECT {cols} FROM {stage} ON CONFLICT DO NOTHING")
    return max(cur.rowcount, 0)


__all__ = [
    "ExchangeRow",
    "dedupe",
    "exchange_values",
    "health_values",
    "write_drops",
    "write_exchanges",
    "write_health",
    "write_records",
]
