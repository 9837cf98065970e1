"""Several mirror processes on one port (``reuse_port``, ``--reuse-port``): the kernel spreads
new connections across them, each answers and records its own, and without the setting a
second process is refused the port with an error that says what to do."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import click
import pytest
from mirror_helpers import ask, rows, served

from mirror.cli import bind
from mirror.listen import MIGRATE_REQ, reset_on_close_warning
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


def test_a_closing_listener_resets_the_connections_queued_at_it_unless_the_kernel_moves_them() -> (
    None
):
    """What the supervisor's warning says (net.ipv4.tcp_migrate_req), checked on this kernel:
    connections waiting in the queue of a listener that closes (a worker that died) are reset
    at 0, and accepted by another listener of the port at 1."""
    moves = MIGRATE_REQ.read_text().strip() != "0"
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(
            contextlib.closing(bind("127.0.0.1", 0, "client port", reuse_port=True))
        )
        port = a.getsockname()[1]
        b = stack.enter_context(
            contextlib.closing(bind("127.0.0.1", port, "client port", reuse_port=True))
        )
        clients = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            for _ in range(32)
        ]
        b.setblocking(False)
        at_b = set()
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, peer = b.accept()
                stack.enter_context(conn)
                at_b.add(peer)
        queued_at_a = [c for c in clients if c.getsockname() not in at_b]
        assert queued_at_a  # all 32 on b: probability 2^-32
        a.close()
        if moves:
            b.settimeout(5)
            moved = set()
            for _ in queued_at_a:
                conn, peer = b.accept()
                stack.enter_context(conn)
                moved.add(peer)
            assert moved == {c.getsockname() for c in queued_at_a}
        else:
            for c in queued_at_a:
                with pytest.raises(ConnectionResetError):
                    c.recv(1)


def test_the_warning_names_the_setting_only_when_connections_would_be_reset(
    tmp_path: Path,
) -> None:
    setting = tmp_path / "tcp_migrate_req"
    setting.write_text("0\n")
    warning = reset_on_close_warning(setting)
    assert warning is not None and "sysctl -w net.ipv4.tcp_migrate_req=1" in warning
    setting.write_text("1\n")
    assert reset_on_close_warning(setting) is None
    assert reset_on_close_warning(tmp_path / "absent") is None  # an older kernel: nothing to set


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
