"""Which headers cross the mirror, in each direction (RFC 9110 section 7.6.1: hop-by-hop
headers belong to one connection and are not forwarded).

Pure functions on ASGI-style header lists (``[(lower-case name, value), ...]`` as bytes).
The client's headers are forwarded to the incumbent (it may check an API key), but never stored:
records keep only the JSON body (see :mod:`mirror.rewrite`). The candidate, often outside the
incumbent's trust boundary, gets only an allow-list of the client's headers
(:func:`candidate_headers`, never a credential) plus the headers configured for it (its own
credentials).

Errors: none.
"""

from __future__ import annotations

from collections.abc import Iterable

PAIR_HEADER = b"x-shadow-pair-id"

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"expect", PAIR_HEADER}
_SHADOW_DROP = _REQUEST_DROP | {b"accept-encoding"}
_RESPONSE_DROP = HOP_BY_HOP | {PAIR_HEADER}
HIDDEN_RESPONSE_HEADERS = frozenset({b"server", b"set-cookie"})
"""The incumbent's response headers the mirror never passes to a client, as nginx's
``proxy_hide_header`` (``hide_response_headers`` until issue 26: nobody set another list): the
engine's software and version, and cookies of an engine that should not set any."""
RESPONSE_DROP = _RESPONSE_DROP | HIDDEN_RESPONSE_HEADERS
"""Response headers never passed to the client: hop-by-hop ones, the pair header and
:data:`HIDDEN_RESPONSE_HEADERS`."""

Headers = list[tuple[bytes, bytes]]


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names listed in ``Connection`` (also hop-by-hop)."""
    out: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            out.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return out


def upstream_headers(client: Iterable[tuple[bytes, bytes]], pair_id: bytes) -> Headers:
    """The client's headers for the incumbent: end-to-end ones plus ``x-shadow-pair-id``."""
    client = list(client)
    extra = _connection_tokens(client)
    out = [(n, v) for n, v in client if n.lower() not in _REQUEST_DROP and n.lower() not in extra]
    out.append((PAIR_HEADER, pair_id))
    return out


def shadow_headers(upstream: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Headers for a shadow request: as the incumbent's, but asking for an uncompressed
    answer (the mirror reads it)."""
    return [(n, v) for n, v in upstream if n.lower() not in _SHADOW_DROP or n == PAIR_HEADER]


def client_headers(
    upstream: Iterable[tuple[bytes, bytes]],
    pair_id: bytes,
    *,
    rechunked: bool,
    drop: frozenset[bytes] = _RESPONSE_DROP,
) -> Headers:
    """The incumbent's response headers for the client, plus ``x-shadow-pair-id``.
    ``rechunked``: the mirror changes the body (a hidden usage chunk), so the length goes.
    ``drop``: lower-case names never passed on (hop-by-hop ones and the pair header by
    default; the mirror passes :data:`RESPONSE_DROP`, which also hides ``server`` and
    ``set-cookie``)."""
    upstream = list(upstream)
    extra = _connection_tokens(upstream)
    out = []
    for name, value in upstream:
        low = name.lower()
        if low in drop or low in extra or (rechunked and low == b"content-length"):
            continue
        out.append((low, value))
    out.append((PAIR_HEADER, pair_id))
    return out


def str_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """``headers`` as text (latin-1, as HTTP/1.1 carries them), for aiohttp and the shadow side."""
    return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers]


def header_value(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of ``name`` (lower-case) in an ASGI header list."""
    for n, v in headers:
        if n == name:
            return v
    return None


def override_headers(
    headers: list[tuple[str, str]], extra: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """``headers`` with the ``extra`` ones (lower-case names) replacing any of the same name."""
    if not extra:
        return headers
    names = {k for k, _ in extra}
    return [(k, v) for k, v in headers if k.lower() not in names] + extra


CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "api-key", "x-api-key"}
)
"""Client headers that carry credentials: never sent to the candidate, whatever is configured."""
CANDIDATE_FORWARD_DEFAULT = ("content-type", "accept", "user-agent")
"""The client headers the candidate gets by default (besides ``x-shadow-pair-id``)."""


def candidate_headers(
    shadow: list[tuple[str, str]], forward: frozenset[str], own: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The candidate's headers: of the shadow copy's (``shadow``, from :func:`shadow_headers`),
    only ``x-shadow-pair-id`` and the names in ``forward`` (lower-case; never a credential),
    then ``own``, the headers configured for the candidate (its own credentials), replacing any
    of the same name."""
    pair = PAIR_HEADER.decode()
    names = {k for k, _ in own}
    out = [
        (k, v)
        for k, v in shadow
        if (k.lower() == pair or k.lower() in forward)
        and k.lower() not in CREDENTIAL_HEADERS
        and k.lower() not in names
    ]
    return out + own
