"""The client port against hostile clients (issue 14, findings 6 and 11), on a real
``shadow-ab mirror`` process: header floods, slow and idle connections, a connection flood,
aliases of the generate paths, paths and methods that are not the OpenAI API's, the engine's
Set-Cookie and Server headers, and the admin endpoints on their own port.

Assertions are on what the mirror answers and reads, never on how long it took: the limits are
set low (1-5 s deadlines) so each attack ends quickly, and sockets wait far longer than that.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from mirror_helpers import (
    MODEL,
    StandInEngine,
    chat_answer,
    pair_key,
    post,
    wait_rows,
)

from mirror.config import load_settings
from mirror.errors import MirrorConfigError
from shadow_ab.dev.processes import RunningMirror, RunningSim, free_port, http_get, running_mirror

MAX_HEADER = 16 * 1024
LIMITS = {
    "max_header_bytes": MAX_HEADER,
    "header_timeout_s": 3.0,
    "idle_timeout_s": 2.0,
    "body_timeout_s": 3.0,
    "send_timeout_s": 2.0,
    "max_connections": 24,
}
WAIT = 60.0  # socket timeouts: far beyond every limit above


@pytest.fixture(scope="module")
def edge(
    engines: tuple[RunningSim, RunningSim],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[RunningMirror]:
    """The mirror with tight limits (mirror/limits.py, enforced by mirror/server.py)."""
    db = tmp_path_factory.mktemp("mirror-edge") / "records.db"
    with running_mirror(
        engines[0].base_url,
        engines[1].base_url,
        database_url=f"sqlite:///{db}",
        deployment="edge-test",
        health_enabled=False,
        limits=LIMITS,
    ) as mirror:
        yield mirror


def connect(mirror: RunningMirror) -> socket.socket:
    return socket.create_connection((mirror.host, mirror.port), timeout=WAIT)


def read_all(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    """Everything the server sends until it closes (or ``limit`` bytes)."""
    out = b""
    while len(out) < limit:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def flood_headers(mirror: RunningMirror, total: int) -> tuple[int, bytes]:
    """Send a request head of ``total`` bytes (one endless header) until the mirror answers
    or closes: (bytes sent, the answer)."""
    sock = connect(mirror)
    sock.setblocking(False)
    sent = 0
    answer = b""
    chunk = b"a" * 65536
    try:
        sock.sendall  # noqa: B018 (the socket is usable)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nX-Big: "
        pending = head
        deadline = time.monotonic() + WAIT
        while sent < total and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                break
            if writable:
                try:
                    n = sock.send(pending or chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += n
                pending = (pending or chunk)[n:] if pending else b""
        sock.setblocking(True)
        sock.settimeout(WAIT)
        answer = read_all(sock)
    finally:
        sock.close()
    return sent, answer


# -- finding 6: the connection limits ---------------------------------------------------------


def test_200_mb_of_headers_get_431_after_the_limit_and_memory_stays_bounded(
    edge: RunningMirror,
) -> None:
    before = rss_bytes(edge.pid)
    refused = edge.metric("shadow_ab_mirror_edge_rejections_total", reason="header_too_large")
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(flood_headers(edge, 200 * 1024 * 1024)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert len(results) == 4
    for sent, answer in results:
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b"application/problem+json" in answer and b"max_header_bytes" in answer
        # What the client could push before the answer: the limit plus socket buffers, a
        # small fraction of the 200 MB it meant to send.
        assert sent < 20 * 1024 * 1024, sent
    grown = rss_bytes(edge.pid) - before
    assert grown < 48 * 1024 * 1024, f"the mirror grew {grown / 1e6:.0f} MB"
    after = edge.metric("shadow_ab_mirror_edge_rejections_total", reason="header_too_large")
    assert after == refused + 4
    assert edge.healthy()


def test_headers_just_under_the_limit_are_served_and_just_over_are_431(
    edge: RunningMirror,
) -> None:
    with httpx.Client(timeout=WAIT) as http:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        # Several headers of 4000 bytes (the simulator, aiohttp, takes at most 8190 per field).
        under = {f"x-pad-{i}": "p" * 4000 for i in range(3)}  # 12 kB of 16
        ok = post(http, edge.base_url + "/v1/completions", body, **under)
        assert ok[0] == 200
        over = {f"x-pad-{i}": "p" * 4000 for i in range(5)}  # 20 kB of 16
        big = post(http, edge.base_url + "/v1/completions", body, **over)
        assert big[0] == 431 and b"max_header_bytes" in big[2]


def test_slow_headers_get_408_and_are_closed_and_silent_ones_are_closed(
    edge: RunningMirror,
) -> None:
    slow = [connect(edge) for _ in range(8)]
    silent = [connect(edge) for _ in range(8)]
    for s in slow:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nX-Slow: ")
    try:
        for s in slow:
            answer = read_all(s)  # returns when the mirror closes the connection
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"header_timeout_s" in answer
        for s in silent:
            assert read_all(s) == b""  # closed without an answer, as nginx does
    finally:
        for s in slow + silent:
            s.close()
    assert edge.metric("shadow_ab_mirror_edge_rejections_total", reason="header_timeout") >= 8
    assert edge.metric("shadow_ab_mirror_edge_rejections_total", reason="header_timeout_idle") >= 8


def test_idle_keep_alive_connections_are_closed(edge: RunningMirror) -> None:
    s = connect(edge)
    try:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: m\r\n\r\n")
        answer = read_all(s)  # the answer, then the mirror closes the idle connection
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 ") == 1


def test_a_trickled_body_gets_408_and_is_closed(edge: RunningMirror) -> None:
    """Headers whole, then a tenth of the body the Content-Length promised, then nothing: the
    body deadline answers 408 (nginx's ``client_body_timeout``), so a slow-body client holds no
    connection (or engine request) for ever."""
    before = edge.metric("shadow_ab_mirror_edge_rejections_total", reason="body_timeout")
    s = connect(edge)
    try:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b"{" * 10
        )
        answer = read_all(s)  # returns when the mirror closes the connection
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"body_timeout_s" in answer
    after = edge.metric("shadow_ab_mirror_edge_rejections_total", reason="body_timeout")
    assert after == before + 1


class FloodEngine(StandInEngine):
    """Streams 16 KiB SSE events as fast as its client takes them (up to 256 MiB), and notes
    whether its client (the mirror) cut the stream, and how many bytes it had written."""

    EVENT = (
        b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"' + b"x" * 16384 + b'"},"finish_reason":null}]}'
        b"\n\n"
    )

    def __init__(self) -> None:
        super().__init__()
        self.cut = threading.Event()
        self.written = 0

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while self.written < 256 << 20:
                await resp.write(self.EVENT)
                self.written += len(self.EVENT)
        except Exception:  # the mirror closed the connection: the engine stops generating
            self.cut.set()
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._stream)


def test_a_client_that_stops_reading_is_dropped_and_the_engine_request_cancelled(
    tmp_path: Path,
) -> None:
    """A client that takes none of its answer (back-pressure pauses the engine's stream) is
    dropped after ``send_timeout_s`` (nginx's ``send_timeout``), and the engine's request
    closed, so it holds no engine slot for ever; the record says why."""
    db = tmp_path / "records.db"
    with (
        FloodEngine() as inc,
        FloodEngine() as cand,
        running_mirror(
            inc.url,
            cand.url,
            database_url=f"sqlite:///{db}",
            deployment="send-timeout",
            health_enabled=False,
            limits=LIMITS,
            shadow={"rate": 0.0},
        ) as mirror,
    ):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a tiny window
        s.settimeout(WAIT)
        s.connect((mirror.host, mirror.port))
        try:
            body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\n"
                b"Content-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            assert inc.cut.wait(WAIT), f"the engine wrote {inc.written} bytes, never cut"
            assert inc.written < 256 << 20
        finally:
            s.close()
        (row,) = wait_rows(mirror.database_url, 1, "role = 'incumbent'", timeout=WAIT)
        assert mirror.metric("shadow_ab_mirror_send_timeouts_total") == 1
        assert row["status"] == "cancelled"
        assert "send_timeout_s" in row["error"]


@pytest.fixture(scope="module")
def capped(
    engines: tuple[RunningSim, RunningSim],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[RunningMirror]:
    """A mirror whose deadlines are long, so held connections stay until the test lets go."""
    db = tmp_path_factory.mktemp("mirror-cap") / "records.db"
    with running_mirror(
        engines[0].base_url,
        engines[1].base_url,
        database_url=f"sqlite:///{db}",
        health_enabled=False,
        limits={**LIMITS, "header_timeout_s": 600.0, "idle_timeout_s": 600.0},
    ) as mirror:
        yield mirror


def test_the_connection_cap_holds_and_frees_up(capped: RunningMirror) -> None:
    edge = capped
    held = [connect(edge) for _ in range(LIMITS["max_connections"])]
    try:
        # Each held connection is known to the server once it answered one request.
        for s in held:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: m\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        refused = []
        for _ in range(5):
            extra = connect(edge)
            try:
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: m\r\n\r\n")
                refused.append(read_all(extra))
            finally:
                extra.close()
        for answer in refused:
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
            assert b"max_connections" in answer and b"retry-after: 1" in answer.lower()
        assert edge.healthy()  # the admin port is not behind the client port's cap
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and http_get(edge.base_url + "/health")[0] != 200:
        time.sleep(0.05)
    assert http_get(edge.base_url + "/health")[0] == 200


BUDGET = 2 * 1024 * 1024
BODY = 900_000


def chat_head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


def chat_body(length: int) -> bytes:
    """A valid chat body of exactly ``length`` bytes (a long user message)."""
    start = (
        b'{"model":"' + MODEL.encode() + b'","max_tokens":2,"messages":[{"role":"user","content":"'
    )
    end = b'"}]}'
    return start + b"x" * (length - len(start) - len(end)) + end


def test_request_bodies_held_across_connections_are_bounded(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    """Many connections each sending most of a large body and then waiting hold at most
    ``limits.max_body_buffer_bytes`` of the mirror's memory between them (issue 26): a body
    that would pass it gets 503 (before it is read, when its Content-Length says so), and the
    budget frees up as requests are answered."""
    with running_mirror(
        engines[0].base_url,
        engines[1].base_url,
        database_url=f"sqlite:///{tmp_path / 'records.db'}",
        health_enabled=False,
        max_body_bytes=1_000_000,
        limits={**LIMITS, "max_body_buffer_bytes": BUDGET, "body_timeout_s": 60.0},
    ) as mirror:
        before = mirror.metric("shadow_ab_mirror_edge_rejections_total", reason="body_budget")
        body = chat_body(BODY)
        a, b = connect(mirror), connect(mirror)
        try:
            for s in (a, b):  # 1.8 MB held, the rest of each body not sent yet
                s.sendall(chat_head(BODY) + body[:-100])
            time.sleep(0.5)
            c = connect(mirror)
            try:
                c.sendall(chat_head(BODY))
                refused = read_all(c)
            finally:
                c.close()
            assert refused.startswith(b"HTTP/1.1 503 "), refused[:200]
            assert b"max_body_buffer_bytes" in refused and b"retry-after: 1" in refused.lower()
            a.sendall(body[-100:])  # a's request completes and is answered: its bytes go
            assert a.recv(65536).startswith(b"HTTP/1.1 200 ")
            d = connect(mirror)
            try:
                d.sendall(chat_head(BODY) + body)
                assert d.recv(65536).startswith(b"HTTP/1.1 200 ")
            finally:
                d.close()
        finally:
            a.close()
            b.close()
        after = mirror.metric("shadow_ab_mirror_edge_rejections_total", reason="body_budget")
        assert after == before + 1


def test_a_body_budget_below_the_largest_body_is_refused_at_start() -> None:
    with pytest.raises(MirrorConfigError, match="max_body_buffer_bytes"):
        load_settings(
            None,
            incumbent={"url": "http://127.0.0.1:9"},
            candidate={"url": "http://127.0.0.1:10"},
            limits={"max_body_buffer_bytes": 1024 * 1024},
        )


def test_malformed_requests_get_400(edge: RunningMirror) -> None:
    for raw in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: m\r\nBad Header: x\r\n\r\n"):
        s = connect(edge)
        try:
            s.sendall(raw)
            assert read_all(s).startswith(b"HTTP/1.1 400 ")
        finally:
            s.close()


# -- finding 11: routes, aliases, headers, the admin port --------------------------------------


class RecordingEngine(StandInEngine):
    """An engine stand-in that answers every method on every path with a small chat answer,
    a Set-Cookie and a Server header, and keeps what it was asked (method, path)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    async def _answer(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.raw_path))
        body = chat_answer("hi")
        headers = {"Set-Cookie": "session=engine-secret", "Server": "engine/1.0"}
        return web.json_response(body, headers=headers)

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._answer)


@contextlib.contextmanager
def recording_mirror(db: Path, **settings: Any) -> Iterator[tuple[Any, Any, Any]]:
    """A mirror between two :class:`RecordingEngine` s: (mirror, incumbent, candidate)."""
    with (
        RecordingEngine() as inc,
        RecordingEngine() as cand,
        running_mirror(
            inc.url, cand.url, database_url=f"sqlite:///{db}", health_enabled=False, **settings
        ) as mirror,
    ):
        yield mirror, inc, cand


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Any]]:
    db = tmp_path_factory.mktemp("mirror-routes") / "records.db"
    with recording_mirror(db, deployment="routes-test") as found:
        yield found


def raw_request(mirror: RunningMirror, method: str, target: str, body: bytes = b"") -> bytes:
    """One request with the target exactly as given (no client-side normalisation)."""
    s = connect(mirror)
    try:
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        s.sendall(head.encode() + body)
        return read_all(s)
    finally:
        s.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def header(answer: bytes, name: str) -> str | None:
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    for line in head.split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def test_aliases_of_the_chat_path_are_shadowed_and_recorded_as_the_canonical_path(
    recorded: tuple[RunningMirror, RecordingEngine, RecordingEngine],
) -> None:
    mirror, inc, _cand = recorded
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    aliases = [
        "/v1/chat/./completions",
        "//v1/chat/completions",
        "/v1/chat/%2e/completions",
        "/v1/chat/%2E%2E/chat/completions",
        "/v1/%63hat/completions",
        "/v1/chat/completions/",
        "/v1/chat%2Fcompletions",
    ]
    pairs = []
    for alias in aliases:
        inc.seen.clear()
        answer = raw_request(mirror, "POST", alias, body)
        assert status_of(answer) == 200, (alias, answer[:300])
        assert inc.seen == [("POST", "/v1/chat/completions")], alias  # never the alias
        pair = header(answer, "x-shadow-pair-id")
        assert pair, alias
        pairs.append(pair)
    assert mirror.database_url is not None
    for pair in pairs:
        key = pair_key(pair, mirror.database_url)
        found = wait_rows(mirror.database_url, 2, "pair_id = :p", timeout=WAIT, p=key)
        assert {r["role"] for r in found} == {"incumbent", "candidate"}
        assert {r["endpoint"] for r in found} == {"chat"}


def test_paths_and_methods_off_the_allow_list_never_reach_the_engine(
    recorded: tuple[RunningMirror, RecordingEngine, RecordingEngine],
) -> None:
    mirror, inc, _cand = recorded
    inc.seen.clear()
    refused = {
        ("TRACE", "/v1/models"): 405,
        ("TRACE", "/"): 404,
        ("TRACE", "/v1/chat/completions"): 405,
        ("GET", "/v1/chat/completions"): 405,
        ("DELETE", "/v1/models"): 405,
        ("POST", "/sleep"): 404,
        ("POST", "/reset_prefix_cache"): 404,
        ("POST", "/v1/load_lora_adapter"): 404,
        ("GET", "/metrics"): 404,
        ("GET", "/healthz"): 404,
        ("GET", "/mirror/docs"): 404,
        ("GET", "/v1/../metrics"): 404,
        ("GET", "/v1/%2e%2e/metrics"): 404,
        ("OPTIONS", "*"): 404,
    }
    for (method, path), want in refused.items():
        answer = raw_request(mirror, method, path)
        assert status_of(answer) == want, (method, path, answer[:300])
        assert header(answer, "content-type") == "application/problem+json"
        problem = answer.split(b"\r\n\r\n", 1)[1]
        assert b'"status":' + str(want).encode() in problem and b'"detail":' in problem
        if want == 405:
            assert header(answer, "allow")
    assert inc.seen == []
    assert status_of(raw_request(mirror, "GET", "/v1/%00")) == 400
    assert inc.seen == []
    # The allow-list itself passes, canonical path forwarded.
    assert status_of(raw_request(mirror, "GET", "//v1/./models")) == 200
    assert status_of(raw_request(mirror, "GET", "/v1/models/some-model")) == 200
    assert inc.seen == [("GET", "/v1/models"), ("GET", "/v1/models/some-model")]


def test_engine_set_cookie_and_server_do_not_reach_clients(
    recorded: tuple[RunningMirror, RecordingEngine, RecordingEngine],
) -> None:
    mirror, _, _ = recorded
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    for method, path, data in (("POST", "/v1/chat/completions", body), ("GET", "/v1/models", b"")):
        answer = raw_request(mirror, method, path, data)
        assert status_of(answer) == 200
        assert header(answer, "set-cookie") is None, path
        assert header(answer, "server") is None, path


def test_the_passthrough_routes_are_a_setting(tmp_path: Path) -> None:
    with recording_mirror(tmp_path / "r.db", routes=["GET /v1/models", "POST /tokenize"]) as (
        mirror,
        inc,
        _,
    ):
        answer = raw_request(mirror, "GET", "/v1/models")
        assert header(answer, "set-cookie") is None  # hidden whatever the routes
        assert header(answer, "server") is None
        assert status_of(raw_request(mirror, "POST", "/tokenize", b"{}")) == 200
        assert status_of(raw_request(mirror, "GET", "/health")) == 404  # not in this list
        assert ("POST", "/tokenize") in inc.seen and ("GET", "/health") not in inc.seen


def test_admin_endpoints_are_on_the_admin_port_only(edge: RunningMirror) -> None:
    assert edge.admin_port != edge.port
    for path in ("/metrics", "/healthz", "/mirror/docs"):
        assert http_get(edge.admin_url + path)[0] == 200, path
        assert http_get(edge.base_url + path)[0] == 404, path
    assert http_get(edge.admin_url + "/v1/models")[0] == 404  # and no client path there


def test_admin_port_taken_is_a_clear_error(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                *(sys.executable, "-m", "shadow_ab", "mirror"),
                *("--incumbent", engines[0].base_url, "--candidate", engines[1].base_url),
                *("--port", str(free_port()), "--admin-port", str(port)),
                *("--database-url", f"sqlite:///{tmp_path / 'r.db'}"),
            ],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port} (admin port)" in done.stderr
    assert "Address already in use" in done.stderr
