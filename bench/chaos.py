"""Issue 14's proof: each fault or attack against the real running parts, one table.

    python bench/chaos.py [--quick] [--only NAME ...] [--list]

Every scenario runs a real ``shadow-ab mirror`` subprocess (:func:`running_mirror`) in front of
real simulators (:func:`running_pair`), with the real Kafka (``SHADOW_AB_KAFKA_BOOTSTRAP``) where
it needs one, a real tmpfs for the full disk (mounting needs root), real SIGKILL and SIGTERM.
Columns:

- requests: what the scenario sent (attack connections + well-behaved requests);
- client-visible errors: answers other than 200 that a well-behaved client saw (for the 502
  row every answer is the expected 502: the incumbent is down);
- records lost: records the mirror accepted that are neither delivered (Kafka topic, store,
  spool) nor counted as dropped -- the target is 0 in every row;
- records counted as dropped: the ones counted (metric or the store's ``drops`` table);
- recovered by itself: the part served, delivered or counted again with no hand;
- peak RSS MB: the mirror's high-water mark (``VmHWM``) while attacked -- bounded by design;
- notes: what was measured beyond the counts (a leaked secret, the server's answer ...).

The poison record goes through a real ``shadow-ab ingest`` and the API's hostile queries through
a real ``shadow-ab api`` (peak RSS: theirs).
No figure is asserted here; ``tests/chaos`` runs the scenarios in quick mode and asserts the
targets (0 lost uncounted, recovered).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sink_bounds import _record

from mirror.kafka_sink import LEDGER_FILE
from mirror.spool import Spool
from shadow_ab.dev.processes import (
    RunningMirror,
    RunningSim,
    free_port,
    running_mirror,
    running_pair,
)
from storage.bounds import Ledger

MODEL = "sim-llama-3-8b-instruct"
DEP = "chaos"
SECRET = "sk-chaos-client-secret-0123456789"
URL_PASSWORD = "chaos-url-PASSWORD-42"


# -- raw sockets against the client port's limits --------------------------------------------


def is_open(s: socket.socket) -> bool:
    try:
        s.setblocking(False)
        data = s.recv(65536, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return bool(data) and not data.startswith(b"HTTP/1.1 4") and not data.startswith(b"HTTP/1.1 5")


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


@dataclass
class Row:
    name: str
    requests: str
    errors: int
    lost: int
    dropped: int
    recovered: bool
    peak_rss_mb: float
    notes: str = ""


@dataclass
class Ctx:
    inc: RunningSim
    cand: RunningSim
    quick: bool
    kafka: str | None
    tmp: Path

    def n(self, quick: int, full: int) -> int:
        return quick if self.quick else full


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (``VmHWM``) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def chat(content: str = "hello chaos", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def ask(base_url: str, n: int, body: dict[str, Any] | None = None, **headers: str) -> list[int]:
    """``n`` chat requests through the mirror, one after the other: their statuses."""
    with httpx.Client(timeout=30.0) as client:
        out = []
        for _ in range(n):
            try:
                r = client.post(
                    base_url + "/v1/chat/completions", json=body or chat(), headers=headers
                )
                out.append(r.status_code)
            except httpx.HTTPError:
                out.append(0)
        return out


def errors(statuses: list[int]) -> int:
    return sum(s != 200 for s in statuses)


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def dropped_total(mirror: RunningMirror) -> int:
    return int(mirror.metric("shadow_ab_mirror_records_dropped_total"))


def handed(mirror: RunningMirror, sink: str) -> int:
    return int(mirror.metric("shadow_ab_mirror_records_total", sink=sink))


QUIET: dict[str, Any] = {"shadow": {"rate": 0.0}, "health_enabled": False, "deployment": DEP}


# -- data stuck or lost (findings 1-5) -------------------------------------------------------


@contextlib.contextmanager
def kafka_mirror(ctx: Ctx, bootstrap: str, home: Path, **kafka: Any) -> Iterator[RunningMirror]:
    """A mirror whose Kafka sink has the settings ``kafka`` (``SHADOW_AB_MIRROR_KAFKA``: the
    launcher's ``kafka`` argument is the bootstrap) and whose state folder is ``home``."""
    env = {
        "SHADOW_AB_HOME": str(home),
        "SHADOW_AB_MIRROR_KAFKA": json.dumps({"bootstrap": bootstrap, **kafka}),
    }
    with running_mirror(
        ctx.inc.base_url, ctx.cand.base_url, kafka=bootstrap, env=env, **QUIET
    ) as m:
        yield m


def _from_the_start(bootstrap: str, topic: str) -> Any:
    """A confluent-kafka consumer of ``topic`` from its start (a group of its own, no commits)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    return consumer


def _poll(consumer: Any, timeout_s: float) -> list[Any]:
    """The messages that came within ``timeout_s`` (errors such as end of partition left out)."""
    return [m for m in consumer.consume(num_messages=1000, timeout=timeout_s) if m.error() is None]


def too_large(ctx: Ctx) -> Row:
    """Finding 1: one record over the topic's max.message.bytes between small ones."""
    from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics

    assert ctx.kafka, "too_large needs SHADOW_AB_KAFKA_BOOTSTRAP (the running Kafka)"
    limit = 64 * 1024
    tag = uuid.uuid4().hex[:10]
    exchanges, health = f"chaos-{tag}.exchanges", f"chaos-{tag}.health"
    ensure_topics(
        ctx.kafka,
        [TopicSpec(exchanges, 1, {"max.message.bytes": str(limit)}), TopicSpec(health, 1)],
    )
    n = ctx.n(20, 200)
    topics = {
        "topic_exchanges": exchanges,
        "topic_health": health,
        "client": {"message.max.bytes": limit},
    }
    got: list[Any] = []
    try:
        with kafka_mirror(ctx, ctx.kafka, ctx.tmp / f"home-{tag}", **topics) as m:
            statuses = ask(m.base_url, n // 2)
            statuses += ask(m.base_url, 1, chat("x" * (3 * limit)))
            statuses += ask(m.base_url, n - n // 2)
            total = len(statuses)
            wait_for(lambda: handed(m, "kafka") >= total and dropped_total(m) >= 1)
            dropped, rss, healthy = dropped_total(m), peak_rss_mb(m.pid), m.healthy()
        consumer = _from_the_start(ctx.kafka, exchanges)

        def read_more() -> bool:
            got.extend(_poll(consumer, 0.5))
            return len(got) + dropped >= total

        wait_for(read_more, 60)
        consumer.close()
    finally:
        delete_topics(ctx.kafka, [exchanges, health])
    lost = total - len(got) - dropped
    return Row(
        "oversized record for Kafka",
        f"{total}",
        errors(statuses),
        lost,
        dropped,
        healthy and lost == 0 and len(got) == total - 1,
        rss,
        f"{len(got)}/{total - 1} records around it delivered; /healthz 200",
    )


def spooled(m: RunningMirror) -> int:
    return int(m.metric("shadow_ab_mirror_spool_records"))


def disk_full(ctx: Ctx) -> Row:
    """Finding 2: Kafka away, the spool on a 64 KiB tmpfs that fills; then the disk grows."""
    if os.geteuid() != 0:
        raise SystemExit("disk_full mounts a tmpfs: run as root, or leave it out (--only)")
    disk = ctx.tmp / "small-disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    n = ctx.n(40, 200)
    body = chat("y" * 2000)
    try:
        settings = {"spool_dir": str(disk / "spool")}
        with kafka_mirror(ctx, f"127.0.0.1:{free_port()}", ctx.tmp / "home-disk", **settings) as m:
            statuses = ask(m.base_url, n, body)
            settled = lambda: spooled(m) + dropped_total(m) >= handed(m, "kafka")  # noqa: E731
            wait_for(settled)
            full = int(m.metric("shadow_ab_mirror_records_dropped_total", reason="spool_full"))
            before = spooled(m)
            subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
            more = ctx.n(10, 50)
            statuses += ask(m.base_url, more, body)
            wait_for(lambda: settled() and spooled(m) >= before + more)
            lost = handed(m, "kafka") - spooled(m) - dropped_total(m)
            back = spooled(m) - before
            dropped, rss, healthy = dropped_total(m), peak_rss_mb(m.pid), m.healthy()
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    return Row(
        "disk full (spool on a 64 KiB tmpfs)",
        f"{n + more}",
        errors(statuses),
        lost,
        dropped,
        healthy and back >= more,
        rss,
        f"{full} spool_full; after the disk grew {back}/{more} spooled; /healthz 200",
    )


def sigkill(ctx: Ctx) -> Row:
    """Finding 4: the store locked, records wait in the queue; SIGKILL; the next mirror counts."""
    home, db = ctx.tmp / "home-kill", ctx.tmp / "kill.db"
    url = f"sqlite:///{db}"
    env = {"SHADOW_AB_HOME": str(home)}
    n = ctx.n(25, 200)
    inc, cand = ctx.inc.base_url, ctx.cand.base_url
    with running_mirror(inc, cand, database_url=url, env=env, **QUIET) as first:
        lock = sqlite3.connect(db, timeout=30)
        lock.execute("BEGIN EXCLUSIVE")  # every write waits, then fails and is retried
        try:
            statuses = ask(first.base_url, n)
            wait_for(lambda: first.metric("shadow_ab_sink_submitted_total", kind="exchange") >= n)
            rss = peak_rss_mb(first.pid)
            first.stop(sig=signal.SIGKILL)
        finally:
            lock.rollback()
            lock.close()
    counts = {"killed": 0, "stored": 0}
    with running_mirror(inc, cand, database_url=url, env=env, **QUIET):
        conn = sqlite3.connect(db, timeout=30)

        def counted() -> bool:
            counts["killed"] = conn.execute(
                "SELECT coalesce(sum(count), 0) FROM drops WHERE reason = 'killed'"
            ).fetchone()[0]
            counts["stored"] = conn.execute("SELECT count(*) FROM exchanges").fetchone()[0]
            return counts["killed"] + counts["stored"] >= n

        wait_for(counted)
        conn.close()
    lost = n - counts["killed"] - counts["stored"]
    return Row(
        "SIGKILL of the mirror, records queued",
        f"{n}",
        errors(statuses),
        lost,
        counts["killed"],
        lost == 0,
        rss,
        f"{counts['stored']} stored, {counts['killed']} counted 'killed' by the next mirror",
    )


def sigterm(ctx: Ctx) -> Row:
    """Finding 4: Kafka away, SIGTERM: every accepted record is in the spool."""
    home = ctx.tmp / "home-term"
    n = ctx.n(25, 200)
    with kafka_mirror(ctx, f"127.0.0.1:{free_port()}", home) as m:
        statuses = ask(m.base_url, n)
        wait_for(lambda: handed(m, "kafka") >= n)
        rss = peak_rss_mb(m.pid)
        code = m.stop()
    spool_dir = home / "mirror-spool"
    with Spool(spool_dir, max_bytes=10**9, publish_metrics=False) as spool:
        kept = len(spool)
    ledger = Ledger(spool_dir / LEDGER_FILE)
    unsettled = ledger.take_unsettled()
    ledger.close()
    return Row(
        "SIGTERM with Kafka away",
        f"{n}",
        errors(statuses),
        n - kept,
        unsettled,
        code == 0 and kept == n,
        rss,
        f"exit {code}; {kept}/{n} in the spool for the next start",
    )


def poison(ctx: Ctx) -> Row:
    """Finding 3: one schema-valid record dated 9999-12-31 among good ones, through a real
    ``shadow-ab ingest`` (real Kafka, a migrated SQLite store)."""
    from ingester.clients import make_producer
    from ingester.settings import IngestSettings
    from shadow_ab.dev.processes import ManagedProcess
    from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics
    from storage.migrate import upgrade

    assert ctx.kafka, "poison needs SHADOW_AB_KAFKA_BOOTSTRAP (the running Kafka)"
    tag = uuid.uuid4().hex[:10]
    names = [f"chaos-{tag}.{t}" for t in ("exchanges", "health", "dlq")]
    ensure_topics(ctx.kafka, [TopicSpec(name, 1) for name in names])
    url = f"sqlite:///{ctx.tmp / f'ingest-{tag}.db'}"
    upgrade(url)
    n = ctx.n(20, 200)
    good = [_record("hello", "world", 10).to_json() for _ in range(n)]
    late = json.loads(good[0])
    late["pair_id"], late["sent_at"] = str(uuid.uuid4()), "9999-12-31T12:00:00Z"
    values = [*good[: n // 2], json.dumps(late).encode(), *good[n // 2 :]]
    settings = IngestSettings(kafka_bootstrap=ctx.kafka, database_url=url)
    producer = make_producer(settings)
    for value in values:
        producer.send(names[0], key=b"same-key", value=value)
    producer.flush(60)
    producer.close(10)
    cmd = [sys.executable, "-m", "shadow_ab", "ingest", "--kafka", ctx.kafka]
    cmd += ["--database-url", url, "--group", f"chaos-{tag}", "--metrics-port", "0"]
    cmd += ["--exchanges-topic", names[0], "--health-topic", names[1], "--dlq-topic", names[2]]
    proc = ManagedProcess(cmd, ctx.tmp / f"ingest-{tag}.log", merge_stdout=True)
    store = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
    letters: list[Any] = []
    consumer = _from_the_start(ctx.kafka, names[2])
    try:

        def stored() -> int:
            return int(store.execute("SELECT count(*) FROM exchanges").fetchone()[0])

        def done() -> bool:
            letters.extend(_poll(consumer, 0.2))
            return stored() >= n and len(letters) >= 1

        wait_for(done, 120)
        time.sleep(3)  # a crash-looping ingester would re-send its dead letters meanwhile
        done()
        alive = proc.process.poll() is None
        rss = peak_rss_mb(proc.pid) if alive else float("nan")
        rows = stored()
    finally:
        consumer.close()
        store.close()
        proc.stop()
        delete_topics(ctx.kafka, names)
    lost = len(values) - rows - len(letters)
    return Row(
        "poison record at the ingester (year 9999)",
        f"{len(values)}",
        0,
        lost,
        len(letters),
        alive and lost == 0,
        rss,
        f"{rows}/{n} good records stored; {len(letters)} dead letter(s); ingester still up",
    )


def api_range(ctx: Ctx) -> Row:
    """Finding 7: a 300-year compare by day, a time at the calendar's start and a crafted
    cursor against a real ``shadow-ab api`` (a migrated SQLite store, a ``read`` token)."""
    from shadow_ab.dev.processes import ServingProcess, http_get
    from storage.migrate import upgrade

    db = ctx.tmp / "api.db"
    url = f"sqlite:///{db}"
    upgrade(url)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("INSERT INTO deployments (name) VALUES (?)", (DEP,))
    token = "chaos-read-token-" + uuid.uuid4().hex
    port = free_port()
    cmd = [sys.executable, "-m", "shadow_ab", "api", "--port", str(port), "--database-url", url]
    env = {**os.environ, "SHADOW_AB_API_TOKENS": json.dumps({token: ["read"]})}
    api = ServingProcess(cmd, ctx.tmp / "api.log", "127.0.0.1", port, env=env)
    base = f"{api.base_url}/v1/deployments/{DEP}"
    attacks = [
        (
            "/incidents/compare",
            {"since": "1990-01-01T00:00:00Z", "until": "2290-01-01T00:00:00Z", "by": "day"},
        ),
        ("/incidents", {"since": "0001-01-01T00:00:00Z"}),
        ("/pairs/divergent", {"cursor": "AAAAAAAAAAAAAAAAAAAA"}),
    ]
    n = ctx.n(3, 30)
    try:
        api.wait_until(lambda: http_get(api.base_url + "/healthz")[0] == 200, "up", 60)
        answers = []
        with httpx.Client(timeout=60.0, headers={"authorization": f"Bearer {token}"}) as client:
            for _ in range(n):
                answers += [client.get(base + path, params=q) for path, q in attacks]
            after = [client.get(base + "/incidents").status_code for _ in range(5)]
        rss = peak_rss_mb(api.pid)
    finally:
        api.stop()
    statuses = sorted({r.status_code for r in answers})
    problems = sum(r.headers.get("content-type") == "application/problem+json" for r in answers)
    largest = max(len(r.content) for r in answers)
    return Row(
        "300-year API range, calendar-edge time, crafted cursor",
        f"{len(answers)} + 5",
        errors(after),
        0,
        0,
        errors(after) == 0 and statuses == [422],
        rss,
        f"answers {statuses}, {problems}/{len(answers)} problem+json, largest {largest} bytes",
    )


# -- exhaustion (finding 6) -------------------------------------------------------------------

EDGE: dict[str, Any] = {"limits": {"header_timeout_s": 2.0, "idle_timeout_s": 2.0}}


def _edge_row(name: str, ctx: Ctx, attack: Callable[[RunningMirror], tuple[int, str]]) -> Row:
    """Run ``attack`` (its connections, notes) on a mirror; well-behaved requests after it."""
    with running_mirror(ctx.inc.base_url, ctx.cand.base_url, **QUIET, **EDGE) as m:
        conns, notes = attack(m)
        statuses = ask(m.base_url, 10)
        rss = peak_rss_mb(m.pid)
        healthy = m.healthy()
        records = handed(m, "direct")
    return Row(
        name,
        f"{conns} + 10",
        errors(statuses),
        10 - records,
        0,
        healthy and errors(statuses) == 0,
        rss,
        notes,
    )


def header_flood(ctx: Ctx) -> Row:
    """Finding 6: one connection sends 200 MB of request head."""
    mb = ctx.n(20, 200)

    def attack(m: RunningMirror) -> tuple[int, str]:
        sent, answer = flood(m.port, mb * 1024 * 1024, 60.0)
        return 1, f"{mb} MB sent at it: {sent / 1e6:.2f} MB taken, then '{answer}'"

    return _edge_row(f"{mb} MB header flood", ctx, attack)


def _held(ctx: Ctx, n: int, first: bytes) -> Callable[[RunningMirror], tuple[int, str]]:
    def attack(m: RunningMirror) -> tuple[int, str]:
        socks = hold(m.port, n, first)
        time.sleep(2.0 + 4)
        still = sum(is_open(s) for s in socks)
        for s in socks:
            s.close()
        return len(socks), f"{still}/{len(socks)} still open 6 s later (2 s timeouts)"

    return attack


def slow_headers(ctx: Ctx) -> Row:
    n = ctx.n(50, 200)
    half = b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nX-Slow: "
    return _edge_row(f"{n} slow-header clients", ctx, _held(ctx, n, half))


def idle(ctx: Ctx) -> Row:
    n = ctx.n(200, 1000)
    return _edge_row(f"{n} idle connections", ctx, _held(ctx, n, b""))


# -- secrets (findings 8, 9) ----------------------------------------------------------------


CANDIDATE_ANSWER = json.dumps(
    {
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }
).encode()


class _Recorder(BaseHTTPRequestHandler):
    """A candidate that keeps every request's head and body and answers a chat completion."""

    seen: list[bytes] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).seen.append(str(self.headers).encode() + body)
        answer = CANDIDATE_ANSWER
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


def credentials(ctx: Ctx) -> Row:
    """Finding 8: a client's Authorization, Cookie, api-key, x-api-key and body api_key."""
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    n = ctx.n(10, 100)
    try:
        cand = f"http://127.0.0.1:{server.server_address[1]}"
        settings = {**QUIET, "shadow": {"rate": 1.0}}
        with running_mirror(ctx.inc.base_url, cand, **settings) as m:
            statuses = ask(
                m.base_url,
                n,
                chat(api_key=SECRET),
                authorization=f"Bearer {SECRET}",
                cookie=f"session={SECRET}",
                **{"api-key": SECRET, "x-api-key": SECRET},
            )
            wait_for(lambda: len(_Recorder.seen) >= n and handed(m, "direct") >= 2 * n)
            records, rss = handed(m, "direct"), peak_rss_mb(m.pid)
    finally:
        server.shutdown()
        server.server_close()
    leaked = sum(SECRET.encode() in seen for seen in _Recorder.seen)
    return Row(
        "credentials sent by a client",
        f"{n}",
        errors(statuses),
        2 * n - records,
        0,
        leaked == 0,
        rss,
        f"reached the candidate: {'y' if leaked else 'n'} ({leaked} of {len(_Recorder.seen)})",
    )


def url_password(ctx: Ctx) -> Row:
    """Finding 9: the incumbent's URL has a password and is down: the 502 and the log."""
    n = ctx.n(5, 50)
    down = f"http://user:{URL_PASSWORD}@127.0.0.1:{free_port()}"
    with running_mirror(down, ctx.cand.base_url, **QUIET) as m:
        with httpx.Client(timeout=30.0) as client:
            answers = [
                client.post(m.base_url + "/v1/chat/completions", json=chat()) for _ in range(n)
            ]
            answers.append(client.options(m.base_url + "/v1/models"))
        rss = peak_rss_mb(m.pid)
        log = m.stderr()
    in_answers = sum(URL_PASSWORD in r.text or URL_PASSWORD in str(r.headers) for r in answers)
    in_log = URL_PASSWORD in log
    return Row(
        "URL password in a 502",
        f"{len(answers)}",
        errors([r.status_code for r in answers]),
        0,
        0,
        not in_answers and not in_log,
        rss,
        f"answers {sorted({r.status_code for r in answers})}; password in answers: {in_answers},"
        f" in the log: {'y' if in_log else 'n'}",
    )


SCENARIOS: dict[str, Callable[[Ctx], Row]] = {
    "too_large": too_large,
    "disk_full": disk_full,
    "poison": poison,
    "api_range": api_range,
    "sigkill": sigkill,
    "sigterm": sigterm,
    "header_flood": header_flood,
    "slow_headers": slow_headers,
    "idle": idle,
    "credentials": credentials,
    "url_password": url_password,
}


@contextlib.contextmanager
def engines() -> Iterator[tuple[RunningSim, RunningSim]]:
    fast = {"latency": {"prefill_base_ms": 1, "decode_ms": 0.5}}
    with running_pair(("vllm", "clean"), ("trtllm", "clean"), overrides=fast, ledger=False) as pair:
        yield pair


def run(names: list[str], quick: bool) -> list[Row]:
    """Run the named scenarios against one pair of simulators: their rows."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    with engines() as (inc, cand), tempfile.TemporaryDirectory(prefix="shadow-ab-chaos-") as tmp:
        ctx = Ctx(inc, cand, quick, os.environ.get("SHADOW_AB_KAFKA_BOOTSTRAP"), Path(tmp))
        return [SCENARIOS[name](ctx) for name in names]


HEADER = (
    "| fault or attack | requests | client-visible errors | records lost | records counted as"
    " dropped | recovered by itself | peak RSS MB | notes |\n|---|---|---|---|---|---|---|---|"
)


def table(rows: list[Row]) -> str:
    lines = [HEADER]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.requests} | {r.errors} | {r.lost} | {r.dropped} |"
            f" {'y' if r.recovered else 'n'} | {r.peak_rss_mb:.0f} | {r.notes} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and connections")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), metavar="NAME")
    parser.add_argument("--list", action="store_true", help="the scenarios' names")
    args = parser.parse_args()
    if args.list:
        print("\n".join(SCENARIOS))
        return
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print(table(run(args.only or list(SCENARIOS), args.quick)))


if __name__ == "__main__":
    main()
