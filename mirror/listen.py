"""The mirror's listening sockets: the client port and the admin port (:mod:`mirror.cli`), and
the client port the workers' supervisor holds for its workers (:mod:`mirror.workers`).

Errors: :class:`~mirror.errors.ListenError`, whose text names the address, what it is for and
what to do.
"""

from __future__ import annotations

import socket
from pathlib import Path

from mirror.errors import ListenError

MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")
"""Linux 5.14+: whether connections queued at a closing ``SO_REUSEPORT`` listener move to the
others of its group (1) or are reset (0, the default)."""


def bound_socket(
    host: str, port: int, what: str, *, reuse_port: bool = False, listen: bool = True
) -> socket.socket:
    """A TCP socket bound to ``host:port`` (a free port when 0), listening unless ``listen``
    is false, with ``SO_REUSEPORT`` when ``reuse_port`` (other processes may listen there too);
    ``what`` names the port in the error."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port} ({what}): {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        if listen:
            sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"the mirror cannot listen on {host}:{port} ({what}): {exc.strerror}; free the port"
            " or choose another"
        ) from None
    return sock


def reset_on_close_warning(path: Path = MIGRATE_REQ) -> str | None:
    """What to tell someone running several listeners on one port (``workers``) when the
    kernel resets the connections queued at one that closes (a worker that dies or restarts)
    instead of handing them to the others; None when it hands them over or cannot tell."""
    try:
        value = path.read_text().strip()
    except OSError:
        return None  # not Linux, or older than 5.14: nothing to set
    if value != "0":
        return None
    return (
        f"{path} is 0: clients whose connections wait in the queue of a worker that dies are"
        " reset, not served by the other workers; `sysctl -w net.ipv4.tcp_migrate_req=1` (on"
        " the host, or the pod's network namespace) hands them over (mirror/README.md, \"More"
        ' than one core")'
    )
