"""Kafka stopped during traffic, then started: every record reaches PostgreSQL exactly once.

Real pieces end to end: simulator engines, ``shadow-ab mirror`` (a subprocess, Kafka sink with
its on-disk spool), a PRIVATE Kafka broker (the shared one is never stopped) and the real
``shadow-ab ingest`` writing a throw-away PostgreSQL database.

1. traffic through the mirror while the broker is up;
2. the broker is stopped; traffic goes on (the mirror spools the records);
3. the broker is started again; a little more traffic; the mirror drains its spool;
4. the mirror is stopped (SIGTERM flushes), the ingester consumes everything into PostgreSQL.

Checked: the client always got its answers; the records the mirror accepted are exactly the
rows in PostgreSQL (one incumbent row per client request, with the client's pair id; one row per
accepted record in all), none dropped; at least one record went through the spool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from kafka_throwaway import PrivateKafka, private_kafka
from mirror_helpers import MODEL
from sqlalchemy import text

from shadow_ab.dev.processes import RunningSim
from shadow_ab.topics import TopicSpec, ensure_topics
from storage.db import make_engine

WAIT_S = 120.0


@pytest.fixture
def throwaway_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateKafka]:
    with private_kafka(tmp_path_factory.mktemp("private-kafka")) as broker:
        yield broker


def wait_until(check: object, what: str, timeout_s: float = WAIT_S) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout_s:.0f}s waiting for {what}", pytrace=False)
        time.sleep(0.25)


class Traffic:
    """Sequential client requests through the mirror from a thread, until stopped."""

    def __init__(self, base_v1: str) -> None:
        self.base_v1 = base_v1
        self.pair_ids: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def wait_for(self, n: int) -> None:
        target = len(self.pair_ids) + n
        wait_until(lambda: len(self.pair_ids) >= target or self.failures, f"{n} requests")

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                i += 1
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "max_tokens": 8,
                    "temperature": 0,
                    "stream": i % 2 == 0,
                }
                try:
                    resp = client.post(self.base_v1 + "/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    return
                if resp.status_code != 200:
                    self.failures.append(f"{resp.status_code}: {resp.text[:200]}")
                    return
                self.pair_ids.append(resp.headers["x-shadow-pair-id"])
                time.sleep(0.01)


def pg_rows(url: str, deployment: str) -> list[tuple[str, str]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT pair_id::text, role FROM exchanges WHERE deployment = :d"),
                {"d": deployment},
            ).all()
    finally:
        engine.dispose()
    return [(str(r[0]), str(r[1])) for r in rows]


@pytest.mark.slow
@pytest.mark.timeout(900)  # two broker starts: ~30 s each on a quiet machine, minutes on a busy one
def test_kafka_outage_loses_and_doubles_nothing(
    throwaway_kafka: PrivateKafka,
    engines: tuple[RunningSim, RunningSim],
    pg_url: str,
    tmp_path: Path,
) -> None:
    from shadow_ab.dev.processes import running_mirror

    tag = uuid.uuid4().hex[:8]
    deployment = f"outage-{tag}"
    exchanges, health, dlq = f"x-{tag}", f"h-{tag}", f"dlq-{tag}"
    ensure_topics(
        throwaway_kafka.bootstrap,
        [TopicSpec(exchanges, 3), TopicSpec(health, 1), TopicSpec(dlq, 1)],
    )
    inc, cand = engines
    spool_dir = tmp_path / "spool"
    env = {
        "SHADOW_AB_MIRROR_KAFKA__BOOTSTRAP": throwaway_kafka.bootstrap,
        "SHADOW_AB_MIRROR_KAFKA__TOPIC_EXCHANGES": exchanges,
        "SHADOW_AB_MIRROR_KAFKA__TOPIC_HEALTH": health,
        "SHADOW_AB_MIRROR_KAFKA__SPOOL_DIR": str(spool_dir),
        # Notice the outage quickly and probe often, so the test is short.
        "SHADOW_AB_MIRROR_KAFKA__CLIENT": orjson.dumps(
            {"request.timeout.ms": 1500, "message.timeout.ms": 3000}
        ).decode(),
    }
    with running_mirror(
        inc.base_url,
        cand.base_url,
        env=env,
        deployment=deployment,
        health_enabled=False,  # exchange records only: their number is known exactly
        shadow={"rate": 1.0},
    ) as mirror:
        with Traffic(mirror.v1) as traffic:
            traffic.wait_for(20)
            wait_until(lambda: mirror.metric("shadow_ab_mirror_records_total") >= 20, "records")
            throwaway_kafka.stop()
            traffic.wait_for(40)
            wait_until(
                lambda: mirror.metric("shadow_ab_mirror_spool_records") > 0,
                "records in the mirror's spool during the outage",
            )
            spooled_during_outage = mirror.metric("shadow_ab_mirror_spool_records")
            throwaway_kafka.start()
            traffic.wait_for(20)
        assert not traffic.failures, traffic.failures
        # Every shadow request finished, every record handed to the sink, the spool drained.
        wait_until(
            lambda: (
                mirror.metric("shadow_ab_mirror_inflight_requests") == 0
                and mirror.metric("shadow_ab_mirror_spool_records") == 0
            ),
            "the mirror to drain its spool into the restarted broker",
        )
        accepted = mirror.metric("shadow_ab_mirror_records_total", sink="kafka", kind="exchange")
        dropped = mirror.metric("shadow_ab_mirror_records_dropped_total")
        sink_errors = mirror.metric("shadow_ab_mirror_sink_errors_total", sink="kafka")
    assert dropped == 0
    assert sink_errors > 0  # the outage was seen
    assert spooled_during_outage > 0
    client_pairs = traffic.pair_ids
    assert accepted >= len(client_pairs)  # an incumbent record per request, plus shadows

    log_path = tmp_path / "ingest.log"
    with log_path.open("wb") as log:
        env_i = {k: v for k, v in os.environ.items() if not k.startswith("SHADOW_AB_")}
        env_i["SHADOW_AB_HOME"] = str(tmp_path / "ingest-home")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shadow_ab",
                "ingest",
                "--kafka",
                throwaway_kafka.bootstrap,
                "--database-url",
                pg_url,
                "--group",
                f"outage-{tag}",
                "--exchanges-topic",
                exchanges,
                "--health-topic",
                health,
                "--dlq-topic",
                dlq,
                "--batch-timeout-ms",
                "200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env_i,
        )
    try:
        try:
            wait_until(
                lambda: len(pg_rows(pg_url, deployment)) >= accepted,
                f"{accepted:.0f} exchange rows in PostgreSQL",
            )
        except BaseException:
            print(log_path.read_text()[-4000:])
            raise
        time.sleep(2.0)  # anything more arriving would be a double
        rows = pg_rows(pg_url, deployment)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    assert len(rows) == accepted  # none lost, none doubled
    assert len(set(rows)) == len(rows)
    incumbent = sorted(p for p, role in rows if role == "incumbent")
    assert incumbent == sorted(client_pairs)  # one incumbent record per client request
    assert any(role == "candidate" for _, role in rows)
