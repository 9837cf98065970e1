"""Throughput of storage.write.write_exchanges on PostgreSQL (and SQLite for comparison).

    eval "$(shadow-ab services env)"; python bench/store_write.py [--records N] [--sqlite]

Needs `shadow-ab services up`. Creates a throw-away database on the local PostgreSQL server,
migrates it, writes fresh exchange records in batches of 100 / 1000 / 5000 with about 1 KB and
4 KB of text per record (output text + prompt), then the same records again (all duplicates),
and prints records/s per case and its ratio to the pipeline target of 10,000 records/s.
Building the pydantic records happens before the clock starts; row conversion, COPY,
INSERT ... ON CONFLICT and COMMIT are inside it.

The machine is shared, so wall-clock rates move with everyone else's load; the CPU columns do
not: CPU time of this process and of the PostgreSQL backends per record written (fresh pass).
"CPU ceiling" = 1e6 / max(client, server): the rate when client and server each get a core
(WAL writer and checkpointer not counted).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from shadow_ab.dev.synthetic import T0, exchanges
from shadow_ab.settings import CommonSettings
from storage.db import make_engine
from storage.migrate import upgrade
from storage.write import write_exchanges

TARGET = 10_000


def _backend_cpu_s(admin: Engine, database: str) -> dict[int, float]:
    """CPU seconds used so far by each server process connected to ``database``."""
    with admin.connect() as conn:
        pids = list(
            conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = :d"), {"d": database}
            ).scalars()
        )
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # not on this machine, or gone
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    # Backends that exited in between (a previous run's pool) are left out.
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _client_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Result:
    fresh: float
    replay: float
    client_us: float
    server_us: float


def run(url: str, admin: Engine | None, n: int, batch: int, text_bytes: int, seed: int) -> Result:
    engine = make_engine(url)
    database = make_url(url).database or ""
    records = exchanges(n, start=T0 + timedelta(days=seed % 3), text_bytes=text_bytes, seed=seed)
    batches = [records[i : i + batch] for i in range(0, n, batch)]
    write_exchanges(engine, exchanges(2, seed=seed + 10_000, start=records[0].sent_at))  # warm
    rates = []
    client0 = _client_cpu_s()
    server0 = _backend_cpu_s(admin, database) if admin else {}
    for _pass in range(2):  # fresh, then replay (all duplicates)
        inserted = 0
        start = time.perf_counter()
        for chunk in batches:
            inserted += write_exchanges(engine, chunk)
        rates.append(n / (time.perf_counter() - start))
        assert inserted == (n if _pass == 0 else 0), inserted
        if _pass == 0:
            client_us = (_client_cpu_s() - client0) / n * 1e6
            server_s = _cpu_delta(server0, _backend_cpu_s(admin, database)) if admin else 0.0
            server_us = server_s / n * 1e6
    engine.dispose()
    return Result(rates[0], rates[1], client_us, server_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--sqlite", action="store_true", help="also measure SQLite")
    args = parser.parse_args()

    server_url = CommonSettings().database_url
    if not server_url.startswith("postgresql"):
        sys.exit(
            "SHADOW_AB_DATABASE_URL is not PostgreSQL:"
            ' run `shadow-ab services up` and `eval "$(shadow-ab services env)"` first'
        )
    admin = make_engine(server_url, isolation_level="AUTOCOMMIT")
    name = f"shadow_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    tmp = tempfile.TemporaryDirectory()
    try:
        upgrade(url)
        targets = [("postgresql", url)]
        if args.sqlite:
            sqlite_url = f"sqlite:///{tmp.name}/bench.db"
            upgrade(sqlite_url)
            targets.append(("sqlite", sqlite_url))
        print(f"{args.records} exchange records per case; target {TARGET:,} records/s\n")
        print(
            "| store | text/record | batch | fresh rec/s | x target | replay rec/s"
            " | client CPU µs/rec | server CPU µs/rec | CPU ceiling rec/s |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        seed = 1
        for store, target_url in targets:
            for text_bytes in (1000, 4000):
                for batch in (100, 1000, 5000):
                    seed += 1
                    # exchanges(text_bytes=B) makes B bytes of output and B/4 of prompt
                    size = int(text_bytes * 0.8)
                    pg_admin = admin if store == "postgresql" else None
                    r = run(target_url, pg_admin, args.records, batch, size, seed)
                    ceiling = 1e6 / max(r.client_us, r.server_us)
                    print(
                        f"| {store} | ~{text_bytes // 1000} KB | {batch} | {r.fresh:,.0f}"
                        f" | {r.fresh / TARGET:.2f} | {r.replay:,.0f} | {r.client_us:.0f}"
                        f" | {r.server_us:.0f} | {ceiling:,.0f} |"
                    )
    finally:
        tmp.cleanup()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
