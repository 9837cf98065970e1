"""The native data plane (``data_plane: native``): the client's bytes in compiled code.

On the protocol plane (:mod:`mirror.wire`) the client's chunks are written from the same event
loop that runs the shadow side (candidate requests, SSE parsing, records, the sink): at load,
the client's first chunk queues behind that work (mirror/README.md, "The mirror's own
overload"). Here a compiled front (``shadow-ab-front``, Go, built from ``front/`` by ``make
front``) owns the client's connections and the incumbent's for the two generate routes, and
tells this process what happened over a Unix socket, the *tee* (frame format:
``front/README.md``). This process keeps everything else:

- :class:`Tee` turns the front's frames into the mirror's own steps (an ``edge`` frame, a
  connection or request the front's limits refused, is counted as the protocol plane counts
  it): a ``req`` frame is
  :meth:`mirror.app.Mirror._prepare` (the shadow decision, the candidate and replay requests,
  the incumbent's record stub, with the front's pair id and time); an ``end`` frame is
  :meth:`~mirror.app.Mirror._settle` (the stream parsed into the record, the guard fed, the
  record handed to the sink). A client that went away cancels the pair's shadow requests, as on
  the protocol plane.
- :class:`NativeServer` serves every other request (pass-through routes, 404/405, and any
  generate request the front hands on) on the protocol plane, on an internal port the front
  proxies to; it starts the front with the client socket it bound (so bind errors, port 0 and
  ``reuse_port`` stay the mirror's), starts it again when it dies, and on SIGTERM lets it drain
  first, then drains the shadow side.

Nothing the tee carries can slow the client: the front drops frames when this process does not
keep up, and says how many (``shadow_ab_mirror_front_frames_lost_total``).

Errors: :class:`FrontError` when the binary is missing or keeps failing at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from mirror import metrics as m
from mirror.app import ROUTES, SKIPPED_TOO_LARGE, Prepared
from mirror.limits import (
    BODY_TIMEOUT,
    CONNECTION_CAP,
    HEADER_TIMEOUT,
    HEADER_TOO_LARGE,
    IDLE_CLOSED,
)
from mirror.listen import bound_socket
from mirror.wire import WireServer
from shadow_ab.records import Role, Status

if TYPE_CHECKING:
    from mirror.app import Mirror
    from mirror.config import MirrorSettings

log = logging.getLogger("mirror.front")

BINARY = "shadow-ab-front"
BINARY_ENV = "SHADOW_AB_FRONT_BINARY"
FRAME_MAX = 256 * 1024 * 1024
"""A frame longer than this is not the front's: the connection is closed (it reconnects)."""
PENDING_MAX_AGE_S = 3600.0
"""An exchange whose ``end`` frame has not come after this long is settled as lost."""
QUICK_FAILURE_S = 30.0
QUICK_FAILURES = 3


class FrontError(Exception):
    """The native front cannot run; the text says why and what to do."""


class ReqFrame(msgspec.Struct, tag_field="k", tag="req"):
    id: int
    pair: str
    route: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    wall: float
    too_large: bool = False
    dropped: int = 0


class EndFrame(msgspec.Struct, tag_field="k", tag="end"):
    id: int
    status: str
    client_code: int
    http_status: int | None = None
    error: str | None = None
    sse: bool = False
    chunks: list[tuple[float, bytes]] | None = None
    parts: list[bytes] | None = None
    last_t: float | None = None
    added_s: float | None = None
    held_s: float | None = None
    gone: bool = False
    send_timeout: bool = False
    dropped: int = 0


class EdgeFrame(msgspec.Struct, tag_field="k", tag="edge"):
    reason: str
    dropped: int = 0


_DECODE = msgspec.json.Decoder(ReqFrame | EndFrame | EdgeFrame)
_EDGE_REASONS = frozenset(
    {CONNECTION_CAP, HEADER_TOO_LARGE, HEADER_TIMEOUT, BODY_TIMEOUT, IDLE_CLOSED}
)
_STATUSES = {s.value: s for s in Status}


def front_binary() -> Path:
    """The front's executable: ``$SHADOW_AB_FRONT_BINARY``, else ``shadow-ab-front`` beside
    the Python running the mirror (where ``make front`` puts it)."""
    env = os.environ.get(BINARY_ENV)
    path = Path(env) if env else Path(sys.executable).parent / BINARY
    if not os.access(path, os.X_OK):
        how = (
            f"${BINARY_ENV} names {path}, which is not an executable file"
            if env
            else f"{path} does not exist"
        )
        raise FrontError(
            f"data_plane: native needs the compiled front, and {how}: build it with `make front`"
            " (Go 1.22 or newer), or set data_plane: protocol"
        )
    return path


def front_config(
    settings: MirrorSettings, listen_fd: int, internal: str, tee: str
) -> dict[str, Any]:
    """The front's ``-config`` (``front/README.md``) from the mirror's settings."""
    lim = settings.limits
    inc = settings.incumbent
    return {
        "listen_fd": listen_fd,
        "incumbent": inc.url,
        "internal": internal,
        "tee": tee,
        "routes": {path: endpoint.value for path, endpoint in ROUTES.items()},
        "include_usage": inc.include_usage,
        "hide_response_headers": list(settings.hide_response_headers),
        "max_body_bytes": settings.max_body_bytes,
        "max_header_bytes": lim.max_header_bytes,
        "header_timeout_s": lim.header_timeout_s,
        "body_timeout_s": lim.body_timeout_s,
        "idle_timeout_s": lim.idle_timeout_s,
        "send_timeout_s": lim.send_timeout_s,
        "max_connections": lim.max_connections,
        "read_timeout_s": inc.read_timeout_s,
        "connect_timeout_s": inc.connect_timeout_s,
        # 0 is "no limit": no more than the client connections the front takes
        "incumbent_max_connections": inc.max_connections or lim.max_connections,
        "tee_queue": settings.front.tee_queue,
    }


class _Pending:
    __slots__ = ("p", "route", "since")

    def __init__(self, p: Prepared | None, route: str, since: float) -> None:
        self.p = p  # None: refused by the front (too large), nothing to settle
        self.route = route
        self.since = since


class Tee:
    """The mirror's side of the tee: frames in, the mirror's steps out (never raises)."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.pending: dict[int, _Pending] = {}
        self.connections = 0  # the front's open tee connections
        self._loop = asyncio.get_running_loop()
        self._malformed_logged = 0

    # -- frames -------------------------------------------------------------------------------

    def frame(self, raw: bytes) -> None:
        try:
            f = _DECODE.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._lost("malformed")
            if self._malformed_logged < 5:
                self._malformed_logged += 1
                log.error("a tee frame from the front could not be read (%s): skipped", exc)
            return
        if f.dropped:
            m.FRONT_FRAMES_LOST.labels(reason="front_queue").inc(f.dropped)
        try:
            if isinstance(f, ReqFrame):
                self._req(f)
            elif isinstance(f, EndFrame):
                self._end(f)
            elif f.reason in _EDGE_REASONS:
                m.EDGE_REJECTIONS.labels(reason=f.reason).inc()
            else:
                self._lost("malformed")
        except Exception:
            log.exception("a tee frame could not be handled: %r", f)
            self._lost("unhandled")

    def _lost(self, reason: str) -> None:
        m.FRONT_FRAMES_LOST.labels(reason=reason).inc()

    def _req(self, f: ReqFrame) -> None:
        mirror = self.mirror
        endpoint = ROUTES.get(f.route)
        if endpoint is None or f.id in self.pending:
            self._lost("malformed")
            return
        now = self._loop.time()
        if f.too_large:
            mirror._m_decision[SKIPPED_TOO_LARGE].inc()
            m.REQUESTS.labels(route=f.route, code="413").inc()
            self.pending[f.id] = _Pending(None, f.route, now)
            return
        _, _, qs = f.path.partition("?")
        scope = {
            "headers": [(n.encode(), v.encode()) for n, v in f.headers],
            "query_string": qs.encode(),
        }
        p = mirror._prepare(
            scope,
            f.body,
            endpoint,
            f.route,
            pair=uuid.UUID(f.pair),
            sent_at=datetime.fromtimestamp(f.wall, UTC),
        )
        mirror._inflight[Role.INCUMBENT] += 1
        mirror._m_inflight[Role.INCUMBENT].inc()
        self.pending[f.id] = _Pending(p, f.route, now)

    def _end(self, f: EndFrame) -> None:
        entry = self.pending.pop(f.id, None)
        if entry is None:
            self._lost("unmatched")
            return
        self._close(entry, f)

    def _close(self, entry: _Pending, f: EndFrame) -> None:
        """The end of an exchange (``f``: the front's, or one :meth:`abandon` makes)."""
        p = entry.p
        if f.send_timeout:
            m.SEND_TIMEOUTS.inc()
        if p is None:
            return
        if f.gone:
            for t in p.shadows:
                t.cancel()
        if f.added_s is not None:
            m.ADDED.observe(f.added_s)
        if f.held_s is not None:
            m.HELD.observe(f.held_s)
        self.mirror._settle(
            p.d,
            route=entry.route,
            client_code=f.client_code,
            status=_STATUSES.get(f.status, Status.CONNECTION_ERROR),
            http_status=f.http_status,
            error=f.error,
            stash=f.chunks if f.sse else None,
            parts=f.parts or [],
            chat=p.chat,
            t0=0.0,  # the front's times are seconds since it asked the incumbent
            last_t=f.last_t,
            shadow_active=p.shadow_active,
        )

    def abandon(self, why: str, older_than: float | None = None) -> int:
        """Settle the exchanges whose ``end`` will not come (the front exited, or the frame
        was lost) as connection errors, their shadow requests cancelled; those begun
        ``older_than`` seconds ago or more only."""
        now = self._loop.time()
        gone = [
            k for k, e in self.pending.items() if older_than is None or now - e.since >= older_than
        ]
        for k in gone:
            self._lost("abandoned")
            lost = EndFrame(
                id=k, status=Status.CONNECTION_ERROR.value, client_code=0, error=why, gone=True
            )
            self._close(self.pending.pop(k), lost)
        return len(gone)


class _TeeConnection(asyncio.Protocol):
    """One connection from the front: length-prefixed frames (4 bytes, big-endian)."""

    def __init__(self, tee: Tee) -> None:
        self.tee = tee
        self.buf = bytearray()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.tee.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.tee.connections -= 1

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        start = 0
        end = len(buf)
        while end - start >= 4:
            n = int.from_bytes(buf[start : start + 4], "big")
            if n > FRAME_MAX:
                log.error("a tee frame of %d bytes is not the front's: connection closed", n)
                self.tee._lost("malformed")
                buf.clear()
                if self.transport is not None:
                    self.transport.close()
                return
            if end - start - 4 < n:
                break
            self.tee.frame(bytes(buf[start + 4 : start + 4 + n]))
            start += 4 + n
        if start:
            del buf[:start]


def _in_child(base_nice: int) -> None:
    """In the front's child before exec: the niceness this process had before
    ``front.shadow_nice`` (lowering it back needs CAP_SYS_NICE: without it a restarted front
    keeps the shadow side's). The front itself asks for SIGTERM when this process dies
    (``front/parent_linux.go``)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, base_nice)


class FrontProcess:
    """The ``shadow-ab-front`` child: started with the client socket, started again when it
    dies (backoff 0.5 s to 30 s); :attr:`failed` after :data:`QUICK_FAILURES` exits within
    :data:`QUICK_FAILURE_S` of their start. With ``nice``, this process takes that niceness
    once the front has started (``front.shadow_nice``)."""

    def __init__(self, binary: Path, config: dict[str, Any], fd: int, nice: int = 0) -> None:
        self.binary = binary
        self.config = orjson.dumps(config).decode()
        self.fd = fd
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.failed: str | None = None
        self.nice = nice
        self.base_nice = os.getpriority(os.PRIO_PROCESS, 0)

    async def _spawn(self) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            str(self.binary),
            "-config",
            self.config,
            pass_fds=(self.fd,),
            stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=functools.partial(_in_child, self.base_nice),
        )

    async def run(self, tee: Tee, stop: asyncio.Event) -> None:
        """Keep the front running until :meth:`stop`; sets ``stop`` when it keeps failing."""
        loop = asyncio.get_running_loop()
        quick = 0
        backoff = 0.5
        while not self.stopping:
            started = loop.time()
            try:
                self.proc = await self._spawn()
            except OSError as exc:
                code: int | str = f"could not start: {exc}"
            else:
                if self.nice:
                    # after the front's first start, which keeps niceness 0 (a restart resets
                    # its own, where the process may: _in_child)
                    os.nice(self.nice)
                    self.nice = 0
                code = await self.proc.wait()
            if self.stopping:
                return
            n = tee.abandon(f"the native front exited ({code}) before the answer ended")
            m.FRONT_RESTARTS.inc()
            quick = quick + 1 if loop.time() - started < QUICK_FAILURE_S else 1
            if quick >= QUICK_FAILURES:
                self.failed = (
                    f"the native front ({self.binary}) failed {quick} times within"
                    f" {QUICK_FAILURE_S:.0f} s of its start (last: {code}): see its messages"
                    " above; data_plane: protocol serves without it"
                )
                log.error("%s", self.failed)
                stop.set()
                return
            log.error(
                "the native front exited (%s), %d exchanges in flight lost: starting it again"
                " in %.1f s (clients wait in the listen backlog meanwhile)",
                code,
                n,
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(30.0, backoff * 2) if quick > 1 else 0.5

    async def stop(self, timeout: float) -> None:
        """SIGTERM: the front stops accepting, lets its answers finish and flushes the tee."""
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            log.error("the native front did not stop within %.0f s: killed", timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


class NativeServer(WireServer):
    """The mirror with the native front on the client's port (see the module docstring)."""

    def __init__(self, mirror: Mirror) -> None:
        super().__init__(mirror)
        self.binary = front_binary()
        self.failed: str | None = None

    async def serve(self, sockets: list[Any]) -> None:
        client_sock: socket.socket = sockets[0]
        self._catch_signals()
        internal = bound_socket("127.0.0.1", 0, "the native front's internal port")
        tee_dir = tempfile.mkdtemp(prefix="shadow-ab-tee-")
        tee_path = os.path.join(tee_dir, "tee.sock")
        await self.mirror.startup()
        try:
            server = await self._listen(internal)
            tee = Tee(self.mirror)
            tee_server = await self.loop.create_unix_server(
                lambda: _TeeConnection(tee), path=tee_path
            )
            host, port = internal.getsockname()[:2]
            config = front_config(
                self.settings, client_sock.fileno(), f"http://{host}:{port}", tee_path
            )
            front = FrontProcess(
                self.binary, config, client_sock.fileno(), self.settings.front.shadow_nice
            )
            runner = asyncio.create_task(front.run(tee, self.should_exit), name="native-front")
            sweeper = asyncio.create_task(self._sweep(tee), name="native-front-sweep")
            log.info("serving clients through the native front (%s)", self.binary)
            await self.should_exit.wait()
            log.info("stopping: the native front drains the answers in flight")
            await front.stop(max(1.0, self.settings.drain_timeout_s) + 5.0)
            await runner
            sweeper.cancel()
            deadline = self.loop.time() + 5.0  # the front's last frames, already in the socket
            while tee.connections and self.loop.time() < deadline:
                await asyncio.sleep(0.01)
            tee_server.close()
            tee.abandon("the native front stopped before the answer ended")
            self.failed = front.failed
            await self._drain(server)
        finally:
            self.upstream.close()
            internal.close()
            shutil.rmtree(tee_dir, ignore_errors=True)
            await self.mirror.shutdown()

    async def _sweep(self, tee: Tee) -> None:
        while True:
            await asyncio.sleep(60.0)
            n = tee.abandon("the end of the exchange never came from the front", PENDING_MAX_AGE_S)
            if n:
                log.error("%d exchanges had no end from the native front within an hour", n)


__all__ = ["FrontError", "NativeServer", "Tee", "front_binary", "front_config"]
