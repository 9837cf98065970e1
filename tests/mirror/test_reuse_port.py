"""Several listeners on one port (``SO_REUSEPORT``, what each worker of ``workers: N`` binds
with; the ``reuse_port`` setting until issue 26): the kernel spreads new connections across
them, and without it a second process is refused the port with an error that says what to do.
Two mirror processes sharing the port and recording each request once: tests/mirror/
test_workers.py."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import click
import pytest

from mirror.cli import bind
from mirror.listen import MIGRATE_REQ, reset_on_close_warning


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
