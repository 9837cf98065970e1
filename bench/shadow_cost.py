"""The mirror's CPU per shadow request: the candidate and replay requests, the record, the sink.

    python bench/shadow_cost.py [--requests 400] [--concurrency 8] [--tokens 20] [--rounds 3]
        [--sink-rate 300] [--sink-seconds 4]

A fake engine in another process streams a chat completion of ``--tokens`` SSE events (one
token each, then the usage event and ``[DONE]``), as vLLM does. In this process a real
:class:`mirror.app.Mirror` (in-process, no client port) fires shadow requests at it through
``Shadows.fire``, exactly as the client path does, ``--concurrency`` at a time; its sink only
counts. CPU is this process's CPU time (``time.process_time``: every thread), so the fake
engine's work is not in it.

The first table is each shadow request whole (send, read the stream to the end with arrival
times, parse, build the record, privacy, hand to the sink), for the candidate and the replay
(``replay_delay_s`` 0), each through the shadow side's raw connection pools
(:mod:`mirror.shadow_client`), in rounds (``--rounds``; the median is shown, every round
too). The aiohttp sessions the shadow side used before are gone (issue 26: one client).
The second splits one request into its parts, each timed alone on the same data many times
(the rest of the whole is the connection's request and stream handling and the event loop):
rewriting the candidate's body, the stored request, the trace of the kept chunks, building the
record, privacy, the sink hand-off (``KafkaSink.submit``), and the sink thread's encoding of the
record (``to_json``, before and after the change to encode it straight from its fields).

With ``SHADOW_AB_KAFKA_BOOTSTRAP`` set, the Kafka sink is also measured whole: a real
:class:`~mirror.kafka_sink.KafkaSink` with its defaults (``linger.ms`` 100, acks=all,
idempotent) takes the record at ``--sink-rate`` records a second for ``--sink-seconds`` (the
pace of a mirror at a few dozen streams), then flushes; CPU per record of this process (the
submit, the sink's thread, librdkafka's C threads; the pacing loop's own CPU, measured alone,
taken off), over ``--rounds``. (kafka-python, the client before, took about twice as much:
bench/results/2026-12-03-kafka-clients.md.) Then what the sink leaves a busy Python thread
beside it (a stand-in for the mirror's event loop: pure-Python work that submits the records at
the same rate), as a share of that thread's work just before with the sink idle: the GIL and
the CPU the sink's threads take from the loop.

The last table states each piece of the shadow side once, from the figures above: the
candidate request and the replay request (whole, raw pools), the record building (trace,
``build_record``, privacy) and the sink hand-off (``KafkaSink.submit`` on the request path, and
the sink's whole per-record cost).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WHOLE = {
    "candidate, raw": "candidate, raw pool (mirror/shadow_client.py, now)",
    "replay, raw": "replay, raw pool (now)",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _chunks(tokens: int) -> list[bytes]:
    out = []
    for i in range(tokens):
        last = i == tokens - 1
        event = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1764460800,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": f"tok{i} "},
                    "logprobs": None,
                    "finish_reason": "stop" if last else None,
                }
            ],
        }
        out.append(b"data: " + orjson.dumps(event) + b"\n\n")
    usage = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1764460800,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 40, "completion_tokens": tokens, "total_tokens": 40 + tokens},
    }
    out.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def _engine(port: int, tokens: int) -> None:
    from aiohttp import web

    chunks = _chunks(tokens)

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class CountingSink:
    label = "kafka"  # counts its own records: the mirror does not count them for it

    def __init__(self) -> None:
        self.records: list[Any] = []

    def submit(self, record: Any) -> bool:
        if len(self.records) < 16:
            self.records.append(record)
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        return True

    def close(self, timeout: float = 30.0) -> bool:
        return True


def _body(i: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"question {i}: " + "tell me about kv caches " * 8},
        ],
        "max_tokens": 64,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _approx_before(value: Any, depth: int = 0) -> int:
    """``storage.bounds._approx`` as it was (generators, ``isinstance(v, list | tuple)``)."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        if depth > 8:
            return 64 * len(value)
        return 2 + sum(len(str(k)) + 4 + _approx_before(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        if depth > 8:
            return 16 * len(value)
        return 2 + sum(_approx_before(v, depth + 1) + 1 for v in value)
    return 16


def _per_call(fn: Callable[[], Any], n: int) -> float:
    """CPU seconds per call of ``fn``, the best of 5 rounds of ``n`` calls."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, time.process_time() - start)
    return best / n


async def _whole(mirror: Any, role: Any, n: int, concurrency: int) -> float:
    """CPU seconds per shadow request of ``role``, fired as the client path fires them."""
    from mirror.rewrite import candidate_request
    from shadow_ab.records import Endpoint

    async def one(i: int) -> None:
        body, rewrites = candidate_request(
            _body(i), chat=True, rewrite=mirror.settings.candidate.rewrite
        )
        common = {
            "pair_id": uuid.uuid4(),
            "endpoint": Endpoint.CHAT,
            "stream": True,
            "inflight_incumbent": 3,
            "inflight_candidate": 1,
            "guard": {"state": "open", "rate": 1.0, "decision": "sampled"},
            "capture": "full",
        }
        await mirror.shadows.fire(role, "/v1/chat/completions", body, rewrites, [], common)

    for i in range(concurrency):  # warm the connection pool
        await one(i)
    start = time.process_time()
    for base in range(0, n, concurrency):
        await asyncio.gather(*(one(base + k) for k in range(concurrency)))
    return (time.process_time() - start) / n


async def _stash(url: str) -> tuple[list[tuple[float, bytes]], float]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", data=orjson.dumps(_body(0))) as resp,
    ):
        t0 = time.monotonic()
        stash = [(time.monotonic(), chunk) async for chunk in resp.content.iter_any()]
    return stash, t0


def _paced(fn: Callable[[], Any], rate: float, total: int) -> float:
    """Call ``fn`` ``total`` times at ``rate`` a second (in 10 ms ticks); the CPU seconds spent."""
    tick = 0.01
    start = time.process_time()
    t_next, done, owed = time.monotonic(), 0, 0.0
    while done < total:
        owed += rate * tick
        while owed >= 1 and done < total:
            fn()
            done += 1
            owed -= 1
        t_next += tick
        time.sleep(max(0.0, t_next - time.monotonic()))
    return time.process_time() - start


def _busy(fn: Callable[[], Any], rate: float, seconds: float) -> float:
    """A stand-in for a busy event loop: pure-Python work in this thread for ``seconds``,
    calling ``fn`` ``rate`` times a second on the way; the work done a second (what threads
    taking the GIL beside it leave it)."""
    end = time.monotonic() + seconds
    due, done = time.monotonic(), 0
    while (now := time.monotonic()) < end:
        x = 0
        for i in range(200):
            x += i
        done += 1
        while now >= due:
            fn()
            due += 1 / rate
    return done / seconds


def _sink_cost(
    bootstrap: str, record: Any, rate: float, seconds: float
) -> tuple[float, int, float]:
    """CPU seconds per record of a real Kafka sink fed ``rate`` records a second for
    ``seconds`` (submit to acknowledgement, every thread of this process), and the records
    Kafka acknowledged, and the work a busy thread beside it does (:func:`_busy`), as a share of
    what it does with the sink idle, measured just before."""
    from mirror.kafka_sink import KafkaSink, KafkaSinkConfig
    from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics

    run = f"bench-shadow-sink-{uuid.uuid4().hex[:8]}"
    topics = (f"{run}.exchanges", f"{run}.health")
    ensure_topics(bootstrap, [TopicSpec(topics[0], 6), TopicSpec(topics[1], 1)])
    spool = tempfile.mkdtemp(prefix="shadow-cost-sink-")
    try:
        config = KafkaSinkConfig(
            bootstrap=bootstrap,
            topic_exchanges=topics[0],
            topic_health=topics[1],
            spool_dir=Path(spool),
        )
        sink = KafkaSink(config)
        for _ in range(50):  # connections, metadata
            sink.submit(record)
        if not sink.flush(30):
            raise SystemExit(f"the sink did not deliver to Kafka at {bootstrap}")
        sent0 = sink.stats().sent
        total = int(rate * seconds)
        pacing = _paced(lambda: None, rate, total)  # the pacing loop's own CPU, taken off
        start = time.process_time()
        _paced(lambda: sink.submit(record), rate, total)
        ok = sink.flush(60)
        spent = time.process_time() - start - pacing
        sent = sink.stats().sent - sent0
        alone = _busy(lambda: None, rate, seconds)  # just before, for the drift in the load
        busy = _busy(lambda: sink.submit(record), rate, seconds) / alone
        sink.close(10)
        if not ok or sent < total:
            raise SystemExit(f"the sink acknowledged {sent} of {total} records")
        return spent / total, sent, busy
    finally:
        delete_topics(bootstrap, list(topics))
        shutil.rmtree(spool, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sink-rate", type=float, default=300.0, help="records/s to the sink")
    parser.add_argument("--sink-seconds", type=float, default=4.0)
    args = parser.parse_args()

    from mirror.app import Mirror
    from mirror.config import load_settings
    from mirror.kafka_sink import KafkaSink, KafkaSinkConfig, encode_frame
    from mirror.recording import Dispatch, build_record
    from mirror.rewrite import candidate_request, stored_request
    from mirror.trace import stream_trace
    from shadow_ab.records import Endpoint, Role, Status
    from storage.bounds import _approx

    ctx = mp.get_context("spawn")
    ports = [_free_port(), _free_port()]  # incumbent, candidate
    engines = [ctx.Process(target=_engine, args=(port, args.tokens), daemon=True) for port in ports]
    for engine in engines:
        engine.start()
    for port in ports:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
    url = f"http://127.0.0.1:{ports[1]}"
    try:
        settings = load_settings(
            None,
            incumbent={"url": f"http://127.0.0.1:{ports[0]}"},
            candidate={"url": url},
            health_enabled=False,
            database_url="sqlite:///unused.db",
            shadow={"replay_delay_s": 0, "replay_rate": 1.0},
        )
        sink = CountingSink()
        mirror = Mirror(settings, sink=sink)

        async def run() -> tuple[dict[str, list[float]], list[tuple[float, bytes]], float]:
            await mirror.startup()
            got: dict[str, list[float]] = {k: [] for k in WHOLE}
            try:
                for _ in range(args.rounds):
                    for role in (Role.CANDIDATE, Role.REPLAY):
                        cpu = await _whole(mirror, role, args.requests, args.concurrency)
                        got[f"{role.value}, raw"].append(cpu)
                stash, t0 = await _stash(url)
            finally:
                await mirror.shutdown()
            return got, stash, t0

        whole, stash, t0 = asyncio.run(run())
        whole_s = {k: statistics.median(v) for k, v in whole.items()}
        cand_s = whole_s["candidate, raw"]
        record = sink.records[-1]
        assert record.status is Status.OK and record.completion_tokens == args.tokens, record

        n = 2000
        body = _body(1)
        rewrite = settings.candidate.rewrite
        cand_body, rewrites = candidate_request(body, chat=True, rewrite=rewrite)
        outcome = stream_trace(stash, t0, chat=True).outcome()
        d = Dispatch(
            pair_id=uuid.uuid4(),
            role=Role.CANDIDATE,
            engine="trtllm@candidate",
            endpoint=Endpoint.CHAT,
            stream=True,
            sent_at=record.sent_at,
            request=stored_request(cand_body),
            rewrites=rewrites,
            inflight_incumbent=3,
            inflight_candidate=1,
            guard={"state": "open", "rate": 1.0, "decision": "sampled"},
        )
        rec = build_record("dep", d, status=Status.OK, outcome=outcome, http_status=200)
        spool_dir = tempfile.mkdtemp(prefix="shadow-cost-")
        kafka = KafkaSink(
            KafkaSinkConfig(bootstrap="127.0.0.1:1", spool_dir=Path(spool_dir)),
            producer_factory=lambda c: (_ for _ in ()).throw(ConnectionError("bench: no Kafka")),
        )

        def submit() -> None:
            kafka.submit(rec)
            kafka._queue.clear()
            kafka._queue_bytes = 0

        parts: list[tuple[str, float]] = [
            (
                "candidate body rewrite + JSON (candidate_request, orjson.dumps)",
                _per_call(
                    lambda: orjson.dumps(candidate_request(body, chat=True, rewrite=rewrite)[0]), n
                ),
            ),
            (
                "stored request (stored_request: credentials out)",
                _per_call(lambda: stored_request(cand_body), n),
            ),
            (
                f"trace of the kept chunks ({len(stash)} reads, {args.tokens} events)",
                _per_call(lambda: stream_trace(stash, t0, chat=True).outcome(), n),
            ),
            (
                "build the record (build_record)",
                _per_call(
                    lambda: build_record(
                        "dep", d, status=Status.OK, outcome=outcome, http_status=200
                    ),
                    n,
                ),
            ),
            (
                "privacy (capture full)",
                _per_call(lambda: mirror.recorder.privacy.apply(rec, "full"), n),
            ),
            ("sink hand-off (KafkaSink.submit: size estimate, queue)", _per_call(submit, n)),
            (
                "size estimate of the stored request, before (generators)",
                _per_call(lambda: _approx_before(rec.request), n),
            ),
            (
                "size estimate of the stored request, now (storage.bounds._approx)",
                _per_call(lambda: _approx(rec.request), n),
            ),
            (
                "sink thread: encode, before (pydantic model_dump + orjson)",
                _per_call(rec.to_json_slow, n),
            ),
            (
                "sink thread: encode, now (to_json: orjson from the fields)",
                _per_call(rec.to_json, n),
            ),
            (
                "sink thread: spool frame (encode_frame)",
                _per_call(lambda: encode_frame("t", b"k" * 36, rec.to_json()), n),
            ),
        ]
        kafka.close(1)
        shutil.rmtree(spool_dir, ignore_errors=True)
        bootstrap = os.environ.get("SHADOW_AB_KAFKA_BOOTSTRAP")
        sink_rounds: list[float] = []
        loop_rounds: list[float] = []
        for _ in range(args.rounds if bootstrap else 0):
            cost, _sent, busy = _sink_cost(bootstrap or "", rec, args.sink_rate, args.sink_seconds)
            sink_rounds.append(cost)
            loop_rounds.append(busy)

        print(
            f"{args.requests} shadow requests per role, {args.concurrency} at a time, streamed chat"
            f" of {args.tokens} tokens; record JSON {len(rec.to_json()):,} bytes;"
            f" load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        print()
        print(
            "| shadow request, whole (send, stream, trace, record, privacy, hand-off)"
            f" | CPU us/request (median of {args.rounds}) | rounds |"
        )
        print("|---|---:|---|")
        for key, label in WHOLE.items():
            rounds = ", ".join(f"{v * 1e6:,.0f}" for v in whole[key])
            print(f"| {label} | {whole_s[key] * 1e6:,.0f} | {rounds} |")
        print()
        print("| part (alone, same data) | CPU us/request | share of a candidate request |")
        print("|---|---:|---:|")
        for name, sec in parts:
            print(f"| {name} | {sec * 1e6:,.1f} | {sec / cand_s:.1%} |")
        part = dict(parts)
        slow = part["sink thread: encode, before (pydantic model_dump + orjson)"]
        fast = part["sink thread: encode, now (to_json: orjson from the fields)"]
        print(f"| encode: before / now | {slow / fast:.1f}x | |")
        slow = part["size estimate of the stored request, before (generators)"]
        fast = part["size estimate of the stored request, now (storage.bounds._approx)"]
        print(f"| size estimate: before / now | {slow / fast:.1f}x | |")

        building = sum(
            part[k]
            for k in part
            if k.startswith(("trace of", "build the record", "privacy", "stored request"))
        )
        handoff = part["sink hand-off (KafkaSink.submit: size estimate, queue)"]
        pieces: list[tuple[str, float, str]] = [
            ("candidate request (whole, raw pool)", whole_s["candidate, raw"], ""),
            ("replay request (whole, raw pool)", whole_s["replay, raw"], ""),
            (
                "record building (stored request, trace, build_record, privacy)",
                building,
                "inside each request above",
            ),
            ("sink hand-off on the request path (KafkaSink.submit)", handoff, "inside each"),
        ]
        if sink_rounds:
            pieces.append(
                (
                    "Kafka sink, whole, per record",
                    statistics.median(sink_rounds),
                    "rounds " + ", ".join(f"{c * 1e6:,.0f}" for c in sink_rounds),
                )
            )
        print()
        if sink_rounds:
            print(
                f"Kafka sink at {args.sink_rate:g} records/s for {args.sink_seconds:g} s per"
                f" round (submit, sink thread, librdkafka's threads; acks=all, linger.ms 100)."
            )
            print()
        else:
            print("(Kafka sink whole: set SHADOW_AB_KAFKA_BOOTSTRAP to measure it)")
            print()
        print("| shadow-side piece | CPU us/request | note |")
        print("|---|---:|---|")
        for name, sec, note in pieces:
            print(f"| {name} | {sec * 1e6:,.1f} | {note} |")
        if loop_rounds:
            rounds = ", ".join(f"{x:.2f}" for x in loop_rounds)
            print(
                "| a busy Python thread's work beside the sink (1.00: sink idle)"
                f" | {statistics.median(loop_rounds):.2f}x | rounds {rounds} |"
            )
    finally:
        for engine in engines:
            engine.terminate()
            engine.join(10)


if __name__ == "__main__":
    main()
