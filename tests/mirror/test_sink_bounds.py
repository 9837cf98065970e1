"""Issue 14, finding 4: the sinks' queues are bounded in bytes as well as records; SIGTERM loses
nothing; a SIGKILL's loss is bounded and counted by the next process (reason ``killed``)."""

from __future__ import annotations

import multiprocessing
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import numbered_exchange
from mirror_helpers import MODEL, post

from mirror.kafka_sink import LEDGER_FILE, KafkaSink, KafkaSinkConfig
from mirror.sinks import DIRECT_LEDGER
from mirror.spool import Spool
from shadow_ab.dev.processes import RunningSim, free_port, running_mirror
from storage.bounds import Ledger, approx_bytes
from storage.db import make_engine
from storage.sink import DirectSink

DEP = "sink-bounds"
BIG = "x" * 200_000


def test_approx_bytes_follows_the_json_size() -> None:
    for rec in (
        numbered_exchange(DEP, 1),
        numbered_exchange(DEP, 2, output_text=BIG),
        numbered_exchange(DEP, 3, request={"messages": [{"role": "user", "content": BIG}]}),
    ):
        real = len(rec.to_json())
        assert real / 2 <= approx_bytes(rec) <= real * 2, (real, approx_bytes(rec))


def test_the_kafka_sinks_queue_is_bounded_in_bytes(tmp_path: Path) -> None:
    release = threading.Event()

    def stuck_factory(_cfg: KafkaSinkConfig) -> Any:
        release.wait(30)  # the sink's thread is busy: nothing leaves the queue meanwhile
        raise ConnectionError("no broker here")

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=tmp_path / "spool", queue_max_bytes=1024**2),
        producer_factory=stuck_factory,
    )
    results = [sink.submit(numbered_exchange(DEP, i, output_text=BIG)) for i in range(10)]
    assert results == [True] * 5 + [False] * 5  # ~200 KB each: five fit in 1 MiB
    assert sink.stats().dropped == {"queue_full": 5}
    assert all(sink.submit(numbered_exchange(DEP, 100 + i)) for i in range(10))  # small fit
    release.set()
    assert sink.close(10)
    assert sink.stats().spooled == 15


def test_the_direct_sinks_queue_is_bounded_in_bytes(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    engine = make_engine(f"sqlite:///{db}")  # no tables: writes fail, counted store_error
    gate = threading.Lock()
    gate.acquire()  # the writer thread waits on the first batch until released

    sink = DirectSink(engine, batch_size=1, max_queue=1000, max_queue_bytes=1024**2)
    original = sink._write_batch

    def held(batch: Any) -> None:
        with gate:
            original(batch)

    sink._write_batch = held  # type: ignore[method-assign]
    results = [sink.submit(numbered_exchange(DEP, i, output_text=BIG)) for i in range(12)]
    assert results.count(False) >= 5  # one may be in the writer's hands, five in the queue
    assert sink.stats().dropped["queue_full"] == results.count(False)
    gate.release()
    sink.close(10)
    engine.dispose()


def _accept_and_die(path: Path, n: int, settled: int) -> None:
    ledger = Ledger(path)
    ledger.accept(n)
    ledger.settle(settled)
    signal.raise_signal(signal.SIGKILL)


def test_a_ledger_keeps_its_counts_through_a_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    child = multiprocessing.get_context("fork").Process(
        target=_accept_and_die, args=(path, 200, 37)
    )
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    ledger = Ledger(path)
    assert ledger.take_unsettled() == 163
    assert ledger.take_unsettled() == 0
    ledger.close()


def _ask(base_url: str, n: int) -> list[int]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count me"}], "stream": True}
    with httpx.Client(timeout=30.0) as client:
        return [post(client, base_url + "/v1/chat/completions", body)[0] for _ in range(n)]


def test_sigkill_of_a_mirror_is_counted_by_the_next_one(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    """The store is locked, so the mirror's records wait in its queue; a SIGKILL loses them.
    The next mirror on the same state folder writes that count to the drops table."""
    inc, cand = engines
    home = tmp_path / "home"
    db = tmp_path / "records.db"
    url = f"sqlite:///{db}"
    settings: dict[str, Any] = {
        "database_url": url,
        "env": {"SHADOW_AB_HOME": str(home)},
        "shadow": {"rate": 0.0},
        "health_enabled": False,
        "deployment": DEP,
    }
    n = 25
    with running_mirror(inc.base_url, cand.base_url, **settings) as first:
        lock = sqlite3.connect(db, timeout=30)
        lock.execute("BEGIN EXCLUSIVE")  # every write now waits, then fails: retried
        try:
            assert _ask(first.base_url, n) == [200] * n
            deadline = time.monotonic() + 30
            while first.metric("shadow_ab_sink_submitted_total", kind="exchange") < n:
                assert time.monotonic() < deadline, first.stderr()
                time.sleep(0.05)
            assert first.stop(sig=signal.SIGKILL) == -signal.SIGKILL
        finally:
            lock.rollback()
            lock.close()
    assert (home / DIRECT_LEDGER).exists()

    with running_mirror(inc.base_url, cand.base_url, **settings):
        engine = make_engine(url)
        try:
            deadline = time.monotonic() + 30
            killed = 0
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    killed = conn.exec_driver_sql(
                        "SELECT coalesce(sum(count), 0) FROM drops WHERE reason = 'killed'"
                    ).scalar_one()
                    stored = conn.exec_driver_sql("SELECT count(*) FROM exchanges").scalar_one()
                if killed:
                    break
                time.sleep(0.1)
            # Every record the killed mirror accepted is either in the store or counted.
            assert killed + stored == n, (killed, stored)
            assert killed > 0
        finally:
            engine.dispose()


def test_sigterm_of_a_mirror_spools_everything_it_accepted(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    """Kafka away: on SIGTERM every accepted record is in the spool, none left unsettled."""
    inc, cand = engines
    home = tmp_path / "home"
    n = 25
    with running_mirror(
        inc.base_url,
        cand.base_url,
        kafka=f"127.0.0.1:{free_port()}",
        env={"SHADOW_AB_HOME": str(home)},
        shadow={"rate": 0.0},
        health_enabled=False,
        deployment=DEP,
    ) as mirror:
        assert _ask(mirror.base_url, n) == [200] * n
        assert mirror.stop() == 0, mirror.stderr()
    spool_dir = home / "mirror-spool"
    with Spool(spool_dir, max_bytes=10**9, publish_metrics=False) as spool:
        assert len(spool) == n
    ledger = Ledger(spool_dir / LEDGER_FILE)
    assert ledger.take_unsettled() == 0
    ledger.close()


@pytest.mark.parametrize("n", [0, 3])
def test_a_kafka_sink_counts_what_its_killed_predecessor_left_unsettled(
    tmp_path: Path, n: int
) -> None:
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    child = multiprocessing.get_context("fork").Process(
        target=_accept_and_die, args=(spool_dir / LEDGER_FILE, 10, 10 - n)
    )
    child.start()
    child.join(30)

    def no_broker(_cfg: KafkaSinkConfig) -> Any:
        raise ConnectionError("no broker here")

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=spool_dir), producer_factory=no_broker
    )
    assert sink.stats().dropped.get("killed", 0) == n
    assert sink.close(5)
