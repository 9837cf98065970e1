"""PostgreSQL's CPU and bytes per stored exchange row, for variants of the ``exchanges`` schema.

    eval "$(shadow-ab services env)"
    python bench/store_schema.py [--records 20000] [--rounds 3] [--variants jsonb,head,pglz,...]
                                 [--top-logprobs 0,5]

Needs PostgreSQL (``SHADOW_AB_DATABASE_URL``). The records are ``bench/ingest.py``'s
(``make_values``: 1-4 KB of text each, ~4.8 KB of JSON; for each ``--top-logprobs`` K but 0
the candidate's and the replay's also carry logprobs with K alternatives a token, as the
mirror asks for them: ~31.7 KB of JSON a record on average with 5), decoded by the
ingester's ``rows`` decoder into the row values the store writes. Each variant gets a fresh
database migrated to head, then its own changes (below); then, round after round, every
variant in turn: ``TRUNCATE exchanges`` and the same rows written by
``storage.write.write_exchanges`` in batches of 1,000 (binary COPY, as the ingester does).
Printed per variant: PostgreSQL's CPU per row (the writing backend's own process, from /proc:
best and median of the rounds), the client's CPU per row, the wall time per row, and the bytes
a row takes (``pg_total_relation_size`` of the partitions: table, TOAST and indexes; and the
table's own pages), each against the first variant. Variants alternate inside each round, so
the machine's load falls on all of them alike.

Variants (the schema after ``alembic upgrade head`` is ``head``):

- ``head``: as migrated.
- ``lz4``: the large columns compressed with lz4 (``request``, ``output_text``, ``logprobs``,
  ``itl_s``, ``error``), whatever head sets.
- ``pglz``: the same columns with PostgreSQL's default pglz.
- ``jsonb``: ``request`` and ``logprobs`` as ``jsonb`` (before migration 0007), lz4 as head.
- ``itl-external``: ``itl_s`` stored out of line without a compression attempt.
- ``ttt4080``: ``toast_tuple_target = 4080`` on the partitions.
- ``no-secondary``: the two secondary indexes of ``exchanges`` dropped (a reference: the
  readers need them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import make_values

from ingester.decode import decode
from shadow_ab.settings import CommonSettings
from storage.db import make_engine, normalize_url
from storage.migrate import upgrade
from storage.write import EXCHANGE_COLUMNS, ExchangeRow, write_exchanges

LARGE = ("request", "output_text", "logprobs", "itl_s", "error")


def _compression(method: str) -> list[str]:
    alters = ", ".join(f"ALTER COLUMN {c} SET COMPRESSION {method}" for c in LARGE)
    return [f"ALTER TABLE {{t}} {alters}"]


Variant = tuple[list[str], Callable[[tuple[Any, ...]], tuple[Any, ...]] | None]
"""SQL run on ``exchanges`` and on each of its partitions ({t} is the table), and how a row's
wire values change (None: as the store writes them)."""

_JSON_COLS = [EXCHANGE_COLUMNS.index(c) for c in ("request", "logprobs")]


def _as_jsonb(row: tuple[Any, ...]) -> tuple[Any, ...]:
    # jsonb's binary input is the JSON text after a version byte; json's is the text alone.
    cells = list(row)
    for i in _JSON_COLS:
        if cells[i] is not None:
            cells[i] = b"\x01" + bytes(cells[i])
    return tuple(cells)


VARIANTS: dict[str, Variant] = {
    "head": ([], None),
    "lz4": (_compression("lz4"), None),
    "pglz": (_compression("pglz"), None),
    "jsonb": (
        [
            "ALTER TABLE exchanges ALTER COLUMN request TYPE jsonb USING request::jsonb,"
            " ALTER COLUMN logprobs TYPE jsonb USING logprobs::jsonb",
            *_compression("lz4"),  # a type change resets the columns' compression
        ],
        _as_jsonb,
    ),
    "itl-external": (["ALTER TABLE {t} ALTER COLUMN itl_s SET STORAGE EXTERNAL"], None),
    "ttt4080": (["ALTER TABLE {t} SET (toast_tuple_target = 4080)"], None),
    "no-secondary": (
        [
            "DROP INDEX IF EXISTS ix_exchanges_deployment_sent_at",
            "DROP INDEX IF EXISTS ix_exchanges_deployment_role_sent_at",
        ],
        None,
    ),
}


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _apply(engine: Engine, sql: list[str]) -> None:
    with engine.begin() as conn:
        parts = conn.execute(
            text(
                "SELECT inhrelid::regclass::text FROM pg_inherits"
                " WHERE inhparent = 'exchanges'::regclass"
            )
        ).scalars()
        tables = ["exchanges", *parts]
        for stmt in sql:
            if "{t}" not in stmt:
                conn.execute(text(stmt))
                continue
            for t in tables:
                if "toast_tuple_target" in stmt and t == "exchanges":
                    continue  # a storage parameter of the partitions, not of the parent
                conn.execute(text(stmt.format(t=t)))


class Target:
    def __init__(self, name: str, url: str, rows: list[ExchangeRow]) -> None:
        sql, convert = VARIANTS[name]
        self.name = name
        self.engine = make_engine(url)
        write_exchanges(self.engine, rows[:1])  # the deployment and the partitions
        _apply(self.engine, sql)
        self.rows = (
            rows if convert is None else [ExchangeRow(convert(r.row), r.source) for r in rows]
        )
        self.pg: list[float] = []
        self.client: list[float] = []
        self.wall: list[float] = []
        self.bytes = (0.0, 0.0)

    def round(self) -> None:
        n = len(self.rows)
        with self.engine.begin() as conn:
            conn.execute(text("TRUNCATE exchanges"))
            backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        pg0, cpu0, wall0 = _proc_cpu(backend), time.process_time(), time.perf_counter()
        for i in range(0, n, 1000):
            write_exchanges(self.engine, self.rows[i : i + 1000])
        self.wall.append((time.perf_counter() - wall0) / n)
        self.client.append((time.process_time() - cpu0) / n)
        self.pg.append((_proc_cpu(backend) - pg0) / n)
        with self.engine.connect() as conn:
            stored = conn.execute(
                text(
                    "SELECT sum(pg_total_relation_size(inhrelid)),"
                    " sum(pg_relation_size(inhrelid))"
                    " FROM pg_inherits WHERE inhparent = 'exchanges'::regclass"
                )
            ).one()
        self.bytes = (stored[0] / n, stored[1] / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--top-logprobs",
        default="0",
        help="record shapes to run, e.g. 0,5: the candidate's and the replay's records carry"
        " logprobs with this many alternatives a token (0: none, as bench/ingest.py's default)",
    )
    parser.add_argument("--variants", default="jsonb,head")
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    server_url = normalize_url(CommonSettings().database_url)
    if not server_url.startswith("postgresql"):
        raise SystemExit("SHADOW_AB_DATABASE_URL is not PostgreSQL: set it (README, services)")
    admin = make_engine(server_url, isolation_level="AUTOCOMMIT")
    tag = uuid.uuid4().hex[:8]
    try:
        for top in (int(t) for t in args.top_logprobs.split(",")):
            _run_shape(admin, server_url, f"{tag}_{top}", names, args.records, args.rounds, top)
    finally:
        admin.dispose()


def _run_shape(
    admin: Engine, server_url: str, tag: str, names: list[str], n: int, rounds: int, top: int
) -> None:
    created: list[str] = []
    targets: list[Target] = []
    try:
        values = make_values(n, deployment=f"bench-{tag}", top_logprobs=top)
        rows = [decode(v, "exchange", fast=True, rows=True) for _, v in values]
        typed = [r for r in rows if isinstance(r, ExchangeRow)]
        assert len(typed) == n
        for name in names:
            db = f"bench_schema_{tag}_{len(created)}"
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{db}"'))
            created.append(db)
            url = make_url(server_url).set(database=db).render_as_string(hide_password=False)
            upgrade(url)
            targets.append(Target(name, url, typed))
        load = [os.getloadavg()[0]]
        for _ in range(rounds):
            for target in targets:
                target.round()
                load.append(os.getloadavg()[0])
        mean_json = sum(len(v) for _, v in values) / n
        shape = f"logprobs with {top} alternatives a token" if top else "no logprobs"
        print(
            f"\nrecords: {shape} (the candidate's and the replay's), mean {mean_json:,.0f} bytes"
            f" of JSON; {n:,} rows a round, {rounds} rounds, variants alternating;"
            f" load average {min(load):.1f}-{max(load):.1f}\n"
        )
        print(
            "| variant | PostgreSQL CPU µs/row, best / median | vs first | client CPU µs/row"
            " | wall µs/row | bytes/row, all (table's own pages) | vs first |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        first = targets[0]
        for t in targets:
            pg_best, pg_med = min(t.pg), statistics.median(t.pg)
            print(
                f"| {t.name} | {pg_best * 1e6:.1f} / {pg_med * 1e6:.1f}"
                f" | {pg_med / statistics.median(first.pg):.2f}"
                f" | {statistics.median(t.client) * 1e6:.1f}"
                f" | {statistics.median(t.wall) * 1e6:.1f}"
                f" | {t.bytes[0]:,.0f} ({t.bytes[1]:,.0f}) | {t.bytes[0] / first.bytes[0]:.2f} |",
                flush=True,
            )
    finally:
        for t in targets:
            t.engine.dispose()
        with admin.connect() as conn:
            for db in created:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
