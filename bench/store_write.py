"""Throughput of storage.write.write_exchanges on PostgreSQL (and SQLite for comparison).

    eval "$(shadow-ab services env)"; python bench/store_write.py [--records N] [--sqlite]

Needs `shadow-ab services up`. Creates a throw-away database on the local PostgreSQL server,
migrates it, writes fresh exchange records in batches of 100 / 1000 / 5000 with about 1 KB and
4 KB of text per record (output text + prompt), then the same records again (all duplicates),
and prints records/s per case and its ratio to the pipeline target of 10,000 records/s.
Building the pydantic records happens before the clock starts; row conversion, COPY,
INSERT ... ON CONFLICT and COMMIT are inside it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "storage"))

from store_factories import T0, exchanges

from shadow_ab.settings import CommonSettings
from storage.db import make_engine
from storage.migrate import upgrade
from storage.write import write_exchanges

TARGET = 10_000


def run(url: str, n: int, batch: int, text_bytes: int, seed: int) -> tuple[float, float]:
    engine = make_engine(url)
    records = exchanges(n, start=T0 + timedelta(days=seed % 3), text_bytes=text_bytes, seed=seed)
    batches = [records[i : i + batch] for i in range(0, n, batch)]
    write_exchanges(engine, exchanges(2, seed=seed + 10_000, start=records[0].sent_at))  # warm
    rates = []
    for _pass in range(2):  # fresh, then replay (all duplicates)
        inserted = 0
        start = time.perf_counter()
        for chunk in batches:
            inserted += write_exchanges(engine, chunk)
        rates.append(n / (time.perf_counter() - start))
        assert inserted == (n if _pass == 0 else 0), inserted
    engine.dispose()
    return rates[0], rates[1]


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
        print("| store | text/record | batch | fresh rec/s | x target | replay rec/s |")
        print("|---|---|---|---|---|---|")
        seed = 1
        for store, target_url in targets:
            for text_bytes in (1000, 4000):
                for batch in (100, 1000, 5000):
                    seed += 1
                    # exchanges(text_bytes=B) makes B bytes of output and B/4 of prompt
                    size = int(text_bytes * 0.8)
                    fresh, replay = run(target_url, args.records, batch, size, seed)
                    print(
                        f"| {store} | ~{text_bytes // 1000} KB | {batch} | {fresh:,.0f}"
                        f" | {fresh / TARGET:.2f} | {replay:,.0f} |"
                    )
    finally:
        tmp.cleanup()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
