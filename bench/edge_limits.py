"""The client port's connection limits: what hostile clients cost uvicorn's plain httptools
protocol and the mirror's limited one (``mirror/protocol.py``), and what the limits cost a
well-behaved client, side by side.

    python bench/edge_limits.py [--flood-mb 200] [--slow 200] [--idle 1000] [--duration 5]
        [--rounds 3]

Two servers run as subprocesses on 127.0.0.1, each uvicorn (uvloop, httptools) serving the same
raw ASGI app (a 2-byte answer): ``plain`` with uvicorn's defaults (the mirror before issue 14)
and ``limited`` with :func:`mirror.protocol.uvicorn_limits` (64 KiB headers, 2 s header and
idle timeouts for the bench, 500 connections). Attacks, each against a fresh pair of servers:

- header flood: one connection sends a request head of ``--flood-mb`` MB (one endless header),
  for at most ``--flood-seconds``; bytes the server took before it answered or closed (or the
  time ran out), its answer, its RSS growth;
- slow headers: ``--slow`` connections send half a request head, then nothing;
- idle: ``--idle`` connections send nothing;
- connection flood: as many connections as the slow and idle ones together, each with half a
  request head: how many the server held (to the header deadline: 408) and how many it refused
  at once (503) past the cap.

"open after" counts the attack's connections still open 4 s after the limits' deadlines
(probed with a non-blocking read: closed means EOF or reset).

Cost: ``--rounds`` alternating rounds of ``--duration`` s of 8 keep-alive connections each
sending requests back to back, per server; requests per second and the ratio limited/plain.
The box is shared (2 cores): compare the ratio, not the absolute rates. Then the protocol
alone, without the network: the CPU time per request of one protocol object fed a typical
OpenAI SDK request on a null transport (six alternating runs of ``--micro-requests``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HEADER_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 500


def serve(kind: str, port: int) -> None:
    """The server subprocess: uvicorn on ``port`` with the plain or the limited protocol."""
    import uvicorn

    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        if scope["type"] != "http":
            return
        await send(  # type: ignore[operator]
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    extra: dict[str, object] = {"http": "httptools"}
    if kind == "limited":
        from mirror.limits import ServerLimits
        from mirror.protocol import uvicorn_limits

        extra = uvicorn_limits(
            ServerLimits(
                header_timeout_s=HEADER_TIMEOUT_S,
                idle_timeout_s=HEADER_TIMEOUT_S,
                max_connections=MAX_CONNECTIONS,
            )
        )
    uvicorn.run(
        app,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        lifespan="off",
        log_level="error",
        access_log=False,
        **extra,  # type: ignore[arg-type]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def server(kind: str) -> Iterator[tuple[int, int]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        yield port, proc.pid
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def is_open(s: socket.socket) -> bool:
    try:
        s.setblocking(False)
        data = s.recv(65536, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return bool(data) and not data.startswith(b"HTTP/1.1 4") and not data.startswith(b"HTTP/1.1 5")


def peek(s: socket.socket) -> str:
    """What the server did with a connection: its answer's status, 'open' or 'closed'."""
    try:
        s.setblocking(False)
        data = s.recv(64, socket.MSG_PEEK)
    except BlockingIOError:
        return "open"
    except OSError:
        return "closed"
    return data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "closed"


def flood(port: int, total: int, seconds: float) -> tuple[int, str]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setblocking(False)
    sent, answer = 0, ""
    pending = b"GET / HTTP/1.1\r\nHost: b\r\nX-Big: "
    chunk = b"a" * 65536
    deadline = time.monotonic() + seconds
    try:
        while sent < total and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 5.0)
            if readable:
                break
            if not writable:
                break  # the server stopped reading and did not answer
            try:
                n = sock.send(pending or chunk)
            except OSError:
                break
            sent += n
            pending = pending[n:] if pending else b""
        sock.setblocking(True)
        sock.settimeout(5)
        with contextlib.suppress(OSError):
            answer = sock.recv(200).split(b"\r\n", 1)[0].decode(errors="replace")
    finally:
        sock.close()
    return sent, answer or "(none)"


def hold(port: int, n: int, first: bytes) -> list[socket.socket]:
    out = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if first:
                s.sendall(first)
        except OSError:
            continue
        out.append(s)
    return out


def attack_rows(kind: str, args: argparse.Namespace) -> list[tuple[str, str, str, str, str]]:
    rows = []
    with server(kind) as (port, pid):
        base = rss_mb(pid)
        sent, answer = flood(port, args.flood_mb * 1024 * 1024, args.flood_seconds)
        rows.append(
            (
                "header flood",
                f"{sent / 1e6:.1f} MB taken",
                answer,
                "-",
                f"{rss_mb(pid) - base:+.0f}",
            )
        )
    with server(kind) as (port, pid):
        base = rss_mb(pid)
        slow = hold(port, args.slow, b"GET / HTTP/1.1\r\nHost: b\r\nX-Slow: ")
        idle = hold(port, args.idle, b"")
        time.sleep(HEADER_TIMEOUT_S + 4)
        grown = rss_mb(pid) - base
        open_slow = sum(is_open(s) for s in slow)
        open_idle = sum(is_open(s) for s in idle)
        rows.append(
            ("slow headers", f"{len(slow)} connected", "-", f"{open_slow}", f"{grown:+.0f}")
        )
        rows.append(("idle", f"{len(idle)} connected", "-", f"{open_idle}", f"{grown:+.0f}"))
        for s in slow + idle:
            s.close()
    with server(kind) as (port, pid):
        base = rss_mb(pid)
        many = hold(port, args.slow + args.idle, b"GET / HTTP/1.1\r\nHost: b\r\nX-Slow: ")
        time.sleep(HEADER_TIMEOUT_S + 4)
        seen = [peek(s) for s in many]
        cap = MAX_CONNECTIONS if kind == "limited" else "none"
        rows.append(
            (
                "connection flood (half heads)",
                f"{len(many)} connected",
                f"{seen.count('408')} x 408 (held to the deadline), {seen.count('503')} x 503",
                f"{seen.count('open')} (cap {cap})",
                f"{rss_mb(pid) - base:+.0f}",
            )
        )
        for s in many:
            s.close()
    return rows


class _NullTransport(asyncio.Transport):
    """Accepts everything, sends nothing: the protocol's own CPU, without the network."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True


MICRO_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: mirror:8080\r\n"
    b"User-Agent: OpenAI/Python 1.50.0\r\nAccept: application/json\r\n"
    b"Content-Type: application/json\r\nAuthorization: Bearer sk-0123456789abcdef\r\n"
    b"X-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.50.0\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)


def micro_us(kind: str, n: int) -> float:
    """CPU microseconds per request of one protocol object fed a typical OpenAI SDK request
    (and running the no-op app's task), on a null transport."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from mirror.limits import ServerLimits
    from mirror.protocol import limited_protocol

    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        await send(  # type: ignore[operator]
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    cls: type[asyncio.Protocol] = (
        limited_protocol(ServerLimits()) if kind == "limited" else HttpToolsProtocol
    )
    loop = asyncio.new_event_loop()
    config = Config(app, lifespan="off", http=cls, access_log=False, log_level="warning")  # type: ignore[arg-type]
    config.load()
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)  # type: ignore[call-arg]
    proto.connection_made(_NullTransport())
    t0 = time.process_time()
    for _ in range(n):
        proto.data_received(MICRO_REQUEST)  # type: ignore[attr-defined]
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))
    spent = time.process_time() - t0
    loop.close()
    return spent / n * 1e6


async def _client(port: int, until: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    request = b"GET / HTTP/1.1\r\nHost: b\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
    while time.monotonic() < until:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        done += 1
    writer.close()
    return done


def rate(port: int, duration: float) -> float:
    async def run() -> int:
        until = time.monotonic() + duration
        counts = await asyncio.gather(*(_client(port, until) for _ in range(8)))
        return sum(counts)

    return asyncio.run(run()) / duration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--flood-mb", type=int, default=200)
    parser.add_argument("--flood-seconds", type=float, default=60.0)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-requests", type=int, default=20000)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("\n| server | attack | client side | server's answer | open after | RSS growth MB |")
    print("|---|---|---|---|---|---|")
    for kind in ("plain", "limited"):
        for attack, side, answer, still, grown in attack_rows(kind, args):
            print(f"| {kind} | {attack} | {side} | {answer} | {still} | {grown} |")
    rates: dict[str, list[float]] = {"plain": [], "limited": []}
    with server("plain") as (plain, _), server("limited") as (limited, _):
        for r in range(args.rounds):
            order = [("plain", plain), ("limited", limited)]
            for kind, port in order if r % 2 == 0 else order[::-1]:
                rates[kind].append(rate(port, args.duration))
    print("\n| round | plain req/s | limited req/s | limited / plain |")
    print("|---|---|---|---|")
    for r, (p, lim) in enumerate(zip(rates["plain"], rates["limited"], strict=True)):
        print(f"| {r + 1} | {p:.0f} | {lim:.0f} | {lim / p:.3f} |")
    total = sum(rates["limited"]) / sum(rates["plain"])
    print(
        f"| all | {sum(rates['plain']) / args.rounds:.0f} |"
        f" {sum(rates['limited']) / args.rounds:.0f} | {total:.3f} |"
    )
    micro: dict[str, list[float]] = {"plain": [], "limited": []}
    for r in range(6):
        for kind in ("plain", "limited") if r % 2 == 0 else ("limited", "plain"):
            micro[kind].append(micro_us(kind, args.micro_requests))
    print("\n| protocol CPU per request (us, null transport) | runs | median |")
    print("|---|---|---|")
    for kind, runs in micro.items():
        print(f"| {kind} | {' '.join(f'{x:.0f}' for x in runs)} | {statistics.median(runs):.0f} |")
    ratio = statistics.median(micro["limited"]) / statistics.median(micro["plain"])
    print(f"| limited / plain | | {ratio:.3f} |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
