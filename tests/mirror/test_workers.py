"""``workers: N`` (mirror/workers.py): N mirror processes on one port, supervised. Each worker
gets its own admin port and spool and only worker 0 runs probes and health; the connections are
spread, each request is answered and recorded once, a killed worker is started again, a worker
that cannot start stops the mirror, and SIGTERM drains them all."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from mirror_helpers import ask, rows, served, wait_rows
from worker_mains import exits_at_once

from mirror.config import MirrorConfigError, MirrorSettings, load_settings
from mirror.listen import reset_on_close_warning
from mirror.workers import supervise, worker_settings
from shadow_ab.dev.processes import RunningSim, running_mirror


def base(**extra: object) -> MirrorSettings:
    return load_settings(
        None,
        incumbent={"url": "http://127.0.0.1:1"},
        candidate={"url": "http://127.0.0.1:2"},
        **extra,
    )


def test_each_worker_gets_its_admin_port_and_spool_and_only_worker_0_probes_and_samples(
    tmp_path: Path,
) -> None:
    s = base(
        workers=3,
        admin_port=9100,
        probes={"per_minute": 2},
        kafka={"bootstrap": "127.0.0.1:9092", "spool_dir": str(tmp_path / "spool")},
    )
    w = [worker_settings(s, i, 8123) for i in range(3)]
    assert [x.admin_port for x in w] == [9100, 9101, 9102]
    assert all(x.port == 8123 and x.workers == 1 for x in w)
    assert [x.probes.per_minute for x in w] == [2, 0, 0]
    assert [x.health_enabled for x in w] == [True, False, False]
    spools = [Path(x.kafka.spool_dir) for x in w if x.kafka is not None]
    assert spools == [tmp_path / "spool", tmp_path / "spool.worker-1", tmp_path / "spool.worker-2"]
    # admin_port 0: each worker takes a free one.
    assert worker_settings(base(workers=2, admin_port=0), 1, 8123).admin_port == 0
    with pytest.raises(MirrorConfigError, match="choose a lower admin_port"):
        worker_settings(base(workers=4, admin_port=65534), 3, 8123)
    with pytest.raises(MirrorConfigError, match="is the client port 8124"):
        worker_settings(base(workers=2, admin_port=8123), 1, 8124)


def test_a_worker_that_keeps_failing_at_start_stops_the_mirror_with_status_1(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = base(workers=2, port=0, admin_port=0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mirror.workers"):
        assert supervise(s, exits_at_once, False) == 1
    assert time.monotonic() - started < 120  # three quick failures, 1 s and 2 s apart
    # the start warns when this kernel would reset a dead worker's queued connections
    warned = "sysctl -w net.ipv4.tcp_migrate_req=1" in caplog.text
    assert warned == (reset_on_close_warning() is not None)


def worker_pids(supervisor: int) -> set[int]:
    """The supervisor's worker processes (multiprocessing's spawned children)."""
    found = set()
    for task in os.listdir(f"/proc/{supervisor}/task"):
        with open(f"/proc/{supervisor}/task/{task}/children") as f:
            for pid in f.read().split():
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    if b"spawn_main" in c.read():
                        found.add(int(pid))
    return found


def test_two_workers_share_the_port_survive_a_kill_and_drain_on_sigterm(
    engines: tuple[RunningSim, RunningSim], pg_url: str
) -> None:
    inc, cand = engines
    with running_mirror(
        inc.base_url,
        cand.base_url,
        database_url=pg_url,
        workers=2,
        health_enabled=False,
        guard={"enabled": False},
        deployment="workers",
    ) as mirror:
        admins = [f"http://127.0.0.1:{mirror.admin_port + i}" for i in range(2)]
        pairs = ask(mirror.port, 40, "first")
        counts = [served(a) for a in admins]
        assert min(counts) > 0 and sum(counts) == 40  # both served (all on one: 2^-39)

        wait_rows(pg_url, 80)  # both sides of the 40 stored before a worker is killed
        before = worker_pids(mirror.pid)
        assert len(before) == 2
        victim = max(before)
        os.kill(victim, signal.SIGKILL)
        pairs += ask(mirror.port, 10, "while one is down")  # the other serves the port
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = worker_pids(mirror.pid)
            if len(now) == 2 and victim not in now:
                try:
                    if all(
                        httpx.get(a + "/healthz", timeout=2.0).status_code == 200 for a in admins
                    ):
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        else:
            pytest.fail(
                f"the killed worker was not started again: workers {worker_pids(mirror.pid)}"
            )
        pairs += ask(mirror.port, 10, "after the restart")
        assert mirror.stop() == 0  # SIGTERM: every worker drained
    incs = rows(pg_url, "role = 'incumbent'")
    cands = rows(pg_url, "role = 'candidate'")
    assert len(set(pairs)) == 60
    assert len(incs) == 60 and len(cands) == 60  # each answered and recorded once


def test_health_only_with_workers_is_a_usage_error() -> None:
    from click.testing import CliRunner

    from mirror.cli import mirror

    args = ["--incumbent", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:2"]
    result = CliRunner().invoke(mirror, [*args, "--health-only", "--workers", "2"])
    assert result.exit_code == 2
    assert "leave --workers at 1" in result.output
