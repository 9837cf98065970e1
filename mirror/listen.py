"""The mirror's listening sockets: the client port and the admin port (:mod:`mirror.cli`), and
the client port the workers' supervisor holds for its workers (:mod:`mirror.workers`).

Errors: :class:`ListenError`, whose text names the address, what it is for and what to do.
"""

from __future__ import annotations

import socket


class ListenError(Exception):
    """The socket could not be made or bound; the text says why and what to do."""


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
