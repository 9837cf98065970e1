"""Several mirror processes on one port (``reuse_port``, ``--reuse-port``): the kernel spreads
new connections across them, each answers and records its own, and without the setting a
second process is refused the port with an error that says what to do."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
import pytest
from mirror_helpers import ask, rows, served

from mirror.cli import bind
from shadow_ab.dev.processes import RunningSim, free_port_run, running_mirror


def test_without_reuse_port_a_second_listener_is_refused_and_told_what_to_do() -> None:
    with contextlib.closing(bind("127.0.0.1", 0, "client port")) as first:
        port = first.getsockname()[1]
        with pytest.raises(click.ClickException, match="free the port or choose another"):
            bind("127.0.0.1", port, "client port")


def test_with_reuse_port_on_both_two_listeners_share_the_port() -> None:
    with contextlib.closing(bind("127.0.0.1", 0, "client port", reuse_port=True)) as first:
        port = first.getsockname()[1]
        with contextlib.closing(bind("127.0.0.1", port, "client port", reuse_port=True)) as other:
            assert other.getsockname()[1] == port


def test_two_mirrors_on_one_port_share_the_connections_and_record_each_request_once(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    inc, cand = engines
    port = free_port_run(1)  # below the ephemeral range: no other test is handed it
    dbs = [f"sqlite:///{tmp_path / f'records-{i}.db'}" for i in range(2)]
    common = {
        "port": port,
        "reuse_port": True,
        "health_enabled": False,
        "guard": {"enabled": False},
        "deployment": "reuse-port",
    }
    n = 40
    with (
        running_mirror(inc.base_url, cand.base_url, database_url=dbs[0], **common) as one,
        running_mirror(inc.base_url, cand.base_url, database_url=dbs[1], **common) as two,
    ):
        pair_ids = set(ask(port, n, "question"))
        counts = [served(one.admin_url), served(two.admin_url)]
        assert one.stop() == 0 and two.stop() == 0
    # Both served (all 40 on one listener has probability 2^-39), and together exactly n.
    assert min(counts) > 0 and sum(counts) == n
    recorded = [r for db in dbs for r in rows(db, "role = 'incumbent'")]
    assert len(recorded) == n and len(pair_ids) == n
    for db in dbs:  # each process recorded both sides of the pairs it served
        assert len(rows(db, "role = 'candidate'")) == len(rows(db, "role = 'incumbent'"))
